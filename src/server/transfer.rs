//! Tensors larger than one message: a transfer to the device in chunks (`{:upload, ...}`), a
//! read in chunks (`{:read, buffer, [chunk_bytes: n]}`), and frees of many buffers at once that
//! need no answer (`GenServer.cast(xla, {:free, refs})`).
//!
//! A node drops a connection whose peer sends one message over `--max-message-bytes`, and with it
//! every buffer that peer's processes hold: clients move larger tensors in chunks, each its own
//! message. An upload is a resource of its caller like a buffer: when the caller exits before
//! `{:upload_done, upload}`, what it sent is dropped with it. Chunks are kept as they arrive
//! (their bytes are the decoded message's, not copied on the server's task) and put together on
//! an executor thread at the end.

use super::error::RequestError;
use super::parse::{argument, keywords, reference};
use super::resources::Resource;
use super::state::State;
use crate::node::gen::From;
use crate::node::term::{as_list, atom, int, tuple};
use crate::node::Dest;
use crate::tensor_term::{data_bits, data_term, parse_shape, shape_term};
use crate::xla::{HostTensor, TensorSpec};
use eetf::{Reference, Term};
use std::sync::{Arc, Mutex};

/// A tensor arriving in chunks.
pub struct Upload {
    spec: TensorSpec,
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

/// `{:upload, {type, dims}}`: replies `{:ok, upload}`, to which chunks are then sent.
pub fn begin(state: &Arc<State>, from: From, shape: Term) {
    let begun = parse_shape(&shape)
        .map_err(RequestError::Argument)
        .and_then(|(dtype, dims)| {
            let spec = TensorSpec::new(dtype, dims);
            let total = spec.bit_size().div_ceil(8);
            // Refused now rather than after the bytes came: a tensor that cannot fit at all.
            // The reservation itself is taken again when the tensor is placed.
            drop(
                state
                    .device_budget
                    .reserve(&state.resources, "the upload", total as u64)?,
            );
            let upload = Upload {
                spec,
                total,
                parts: Mutex::default(),
            };
            Ok(Term::from(
                state.register(Resource::Upload(Arc::new(upload)), &from.pid),
            ))
        });
    state.reply_result(&from, begun);
}

/// `{:upload, upload, chunk}`, as a cast or a call: the next bytes of the tensor.
pub fn chunk(state: &State, upload: &Reference, chunk: Term) -> Result<(), RequestError> {
    let upload = lookup_upload(state, upload)?;
    let (bytes, bits) = data_bits(chunk)
        .map_err(|other| argument(format!("a chunk must be a binary, got {other}")))?;
    if bits % 8 != 0 {
        // Only the whole tensor's last bits may be partial; a sub-byte tensor whose size is
        // not a whole number of bytes is sent with one to_device.
        return Err(argument("a chunk must be a whole number of bytes"));
    }
    upload.add(bytes).map_err(RequestError::Argument)
}

/// `{:upload_done, upload}`: replies `{:ok, buffer}`, the tensor on the device; the upload is
/// gone either way.
pub fn done(state: &Arc<State>, from: From, upload_ref: Reference) {
    let upload = match lookup_upload(state, &upload_ref) {
        Ok(upload) => upload,
        Err(e) => return state.reply_error(&from, &e),
    };
    state.resources.free(&upload_ref);
    state.spawn(move |state| {
        let uploaded = upload
            .assemble()
            .map_err(RequestError::Argument)
            .and_then(|tensor| super::buffers::place(state, &from, tensor));
        state.reply_result(&from, uploaded);
    });
}

fn lookup_upload(state: &State, reference: &Reference) -> Result<Arc<Upload>, RequestError> {
    match state.lookup(reference)? {
        Resource::Upload(upload) => Ok(upload),
        _ => Err(argument(format!(
            "{} is not an upload",
            Term::from(reference.clone())
        ))),
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
pub fn send_chunked(state: &State, from: &From, tensor: HostTensor, chunk_bytes: usize) {
    let bits = tensor.spec().bit_size();
    let stream = state.node.make_ref();
    let count = tensor.data.len().div_ceil(chunk_bytes).max(1);
    state.reply(
        from,
        crate::node::term::ok(tuple(vec![
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
        state
            .node
            .send(&state.server, Dest::Pid(from.pid.clone()), message);
    }
}

/// The references of `{:free, refs}` (a list): those unknown or freed already are skipped.
pub fn parse_free_list(term: &Term) -> Option<Result<Vec<Reference>, RequestError>> {
    let items = as_list(term)?;
    Some(items.iter().map(|item| reference(item.clone())).collect())
}

/// Frees every resource of `refs` the node still has; unknown ones are ignored, as a cast
/// cannot answer and a scope's buffers may be freed already.
pub fn free_all(state: &State, refs: &[Reference]) {
    let freed: Vec<Resource> = refs
        .iter()
        .filter_map(|r| state.resources.free(r))
        .collect();
    state.release(freed);
}
