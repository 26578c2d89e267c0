//! Tensors larger than one message: a transfer to the device in chunks (`{:upload, ...}`), a
//! read in chunks (`{:read, buffer, [chunk_bytes: n]}`), and frees of many buffers at once that
//! need no answer (`GenServer.cast(xla, {:free, refs})`, served by `buffers.rs`).
//!
//! A node drops a connection whose peer sends one message over `--max-message-bytes`, and with it
//! every buffer that peer's processes hold: clients move larger tensors in chunks, each its own
//! message. An upload is a resource of its caller like a buffer: when the caller exits before
//! `{:upload_done, upload}`, what it sent is dropped with it. Chunks are kept as they arrive
//! (their bytes are the decoded message's, not copied on the server's task) and put together on
//! an executor thread at the end.

use super::error::RequestError;
use super::parse::{argument, keywords, placement_options, reference, Elements};
use super::resources::Resource;
use super::state::State;
use crate::node::gen::Caller;
use crate::node::term::{atom, int, ok, tuple};
use crate::tensor_term::{data_bits, data_term, parse_shape, shape_term};
use crate::xla::{HostTensor, TensorSpec};
use eetf::{Reference, Term};
use std::sync::{Arc, Mutex};

/// A tensor arriving in chunks.
pub struct Upload {
    spec: TensorSpec,
    /// Where the tensor goes: an index into `:info`'s `devices`.
    device: usize,
    /// Bytes the whole tensor takes (its bits rounded up).
    total: usize,
    parts: Mutex<Parts>,
}

#[derive(Default)]
struct Parts {
    chunks: Vec<Vec<u8>>,
    received: usize,
    /// The first thing wrong with a chunk sent without an answer, reported by `upload_done`.
    error: Option<String>,
}

impl Upload {
    fn add(&self, chunk: Vec<u8>) -> Result<(), String> {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(error) = &parts.error {
            return Err(error.clone());
        }
        if parts.received + chunk.len() > self.total {
            let error = format!(
                "the upload of {} takes {} bytes, and {} more arrived after {}",
                self.spec,
                self.total,
                chunk.len(),
                parts.received
            );
            // Nothing more is kept: the upload can only fail now.
            parts.chunks = Vec::new();
            parts.error = Some(error.clone());
            return Err(error);
        }
        parts.received += chunk.len();
        parts.chunks.push(chunk);
        Ok(())
    }

    /// The whole tensor, or what is wrong.
    fn assemble(&self) -> Result<HostTensor, String> {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(error) = &parts.error {
            return Err(error.clone());
        }
        if parts.received != self.total {
            return Err(format!(
                "the upload of {} takes {} bytes, {} arrived",
                self.spec, self.total, parts.received
            ));
        }
        let chunks = std::mem::take(&mut parts.chunks);
        let data = if chunks.len() == 1 {
            chunks.into_iter().next().expect("one chunk")
        } else {
            let mut data = Vec::with_capacity(self.total);
            for chunk in chunks {
                data.extend_from_slice(&chunk);
            }
            data
        };
        Ok(HostTensor::new(
            self.spec.dtype,
            self.spec.dims.clone(),
            data,
        ))
    }
}

/// `{:upload, {type, dims}}` / `{:upload, {type, dims}, [device: n]}`, parsed: a tensor that
/// will come in chunks.
#[derive(Debug)]
pub struct UploadRequest {
    spec: TensorSpec,
    options: Option<Term>,
}

impl UploadRequest {
    pub fn parse(elements: &mut Elements) -> Result<UploadRequest, RequestError> {
        let (dtype, dims) = parse_shape(&elements.required()).map_err(RequestError::Argument)?;
        Ok(UploadRequest {
            spec: TensorSpec::new(dtype, dims),
            options: elements.optional(),
        })
    }

    /// Replies `{:ok, upload}`, to which chunks are then sent; refused now rather than after
    /// the bytes came when the tensor cannot fit under `--max-device-bytes` at all.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let device = match placement_options(self.options, state.client().device_count()) {
            Ok(device) => device,
            Err(e) => return state.reply_error(&from, &e),
        };
        let total = self.spec.bit_size().div_ceil(8);
        // The reservation itself is taken again when the tensor is placed.
        let begun = state
            .reserve_device("the upload", total as u64)
            .map(|fits| {
                drop(fits);
                let upload = Upload {
                    spec: self.spec,
                    device,
                    total,
                    parts: Mutex::default(),
                };
                Term::from(state.register(Resource::Upload(Arc::new(upload)), &from.pid))
            });
        state.reply_result(&from, begun);
    }
}

/// `{:upload, upload, chunk}`, parsed: the next bytes of the tensor, as a cast or a call.
#[derive(Debug)]
pub struct UploadChunkRequest {
    upload: Reference,
    chunk: Term,
}

impl UploadChunkRequest {
    pub fn parse(elements: &mut Elements) -> Result<UploadChunkRequest, RequestError> {
        let upload = reference(elements.required())?;
        Ok(UploadChunkRequest {
            upload,
            chunk: elements.required(),
        })
    }

    /// Keeps the chunk (its bytes as decoded, not copied); the error, if any.
    fn add(self, state: &State) -> Result<(), RequestError> {
        let upload = state.lookup_upload(&self.upload)?;
        let (bytes, bits) = data_bits(self.chunk)
            .map_err(|other| argument(format!("a chunk must be a binary, got {other}")))?;
        if bits % 8 != 0 {
            // A 2- or 4-bit tensor whose bits are not whole bytes goes with its last byte's
            // unused bits zero.
            return Err(argument("a chunk must be a whole number of bytes"));
        }
        upload.add(bytes).map_err(RequestError::Argument)
    }

    /// As a call: replies `:ok` or the error.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        match self.add(state) {
            Ok(()) => state.reply(&from, atom("ok")),
            Err(e) => state.reply_error(&from, &e),
        }
    }

    /// As a cast: a chunk that fails marks nothing the caller sees now; the upload's
    /// `{:upload_done, upload}` says what went wrong (an unknown upload has no one to tell).
    pub fn apply_cast(self, state: &State) {
        if let Err(e) = self.add(state) {
            tracing::debug!("xla: upload chunk cast: {e}");
        }
    }
}

/// `{:upload_done, upload}`, parsed.
#[derive(Debug)]
pub struct UploadDoneRequest {
    upload: Reference,
}

impl UploadDoneRequest {
    pub fn parse(elements: &mut Elements) -> Result<UploadDoneRequest, RequestError> {
        Ok(UploadDoneRequest {
            upload: reference(elements.required())?,
        })
    }

    /// Replies `{:ok, buffer}`, the tensor on the device; the upload is gone either way.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let upload = match state.take_upload(&self.upload) {
            Ok(upload) => upload,
            Err(e) => return state.reply_error(&from, &e),
        };
        state.spawn(move |state| {
            let uploaded = upload
                .assemble()
                .map_err(RequestError::Argument)
                .and_then(|tensor| state.upload(&tensor, upload.device, &from.pid))
                .map(Term::from);
            state.reply_result(&from, uploaded);
        });
    }
}

/// The options of `{:read, buffer, opts}`: the largest chunk the caller takes in one message.
pub fn parse_read_options(opts: &Term) -> Result<Option<usize>, RequestError> {
    let mut chunk_bytes = None;
    for (key, value) in keywords(opts)? {
        match (key.as_str(), &value) {
            ("chunk_bytes", Term::FixInteger(n)) if n.value > 0 => {
                chunk_bytes = Some(n.value as usize)
            }
            ("chunk_bytes", Term::BigInteger(n)) if n.value > 0.into() => {
                chunk_bytes = usize::try_from(&n.value).ok()
            }
            ("chunk_bytes", other) => {
                return Err(argument(format!(
                    "chunk_bytes must be a positive integer, got {other}"
                )))
            }
            (other, _) => return Err(argument(format!("unknown read option {other}"))),
        }
    }
    Ok(chunk_bytes)
}

/// A read whose data takes more than `chunk_bytes`: replies `{:ok, {:chunks, {type, dims},
/// count, stream}}`, then sends the caller `count` messages `{:xla_chunk, stream, index, data}`
/// in order (the last one's data a bitstring when the tensor's bits are not whole bytes).
pub fn send_chunked(state: &State, from: &Caller, tensor: HostTensor, chunk_bytes: usize) {
    let bits = tensor.spec().bit_size();
    let stream = state.node().make_ref();
    let count = tensor.data.len().div_ceil(chunk_bytes).max(1);
    state.reply(
        from,
        ok(tuple(vec![
            atom("chunks"),
            shape_term(tensor.dtype, &tensor.dims),
            int(count as i64),
            Term::from(stream.clone()),
        ])),
    );
    for (index, chunk) in tensor.data.chunks(chunk_bytes.max(1)).enumerate() {
        let last = index + 1 == count;
        let chunk_bits = if last {
            bits - index * chunk_bytes * 8
        } else {
            chunk.len() * 8
        };
        let message = tuple(vec![
            atom("xla_chunk"),
            Term::from(stream.clone()),
            int(index as i64),
            data_term(chunk.to_vec(), chunk_bits),
        ]);
        state.send(&from.pid, message);
    }
}
