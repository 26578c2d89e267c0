//! Tensors larger than one message: a transfer to the device in chunks (`{:upload, ...}`), a
//! read in chunks (`{:read, buffer, [chunk_bytes: n]}`), and frees of many buffers at once that
//! need no answer (`GenServer.cast(xla, {:free, refs})`, served by `buffers.rs`).
//!
//! A node drops a connection whose peer sends one message over `--max-message-bytes`, and with it
//! every buffer that peer's processes hold: clients move larger tensors in chunks, each its own
//! message. An upload is a resource of its caller like a buffer: when the caller exits before
//! `{:upload_done, upload}`, what it sent is dropped with it; the buffer it makes is held by the
//! upload's `owner:`, or by the caller of `upload_done`. Each chunk is kept as it arrives
//! (its bytes are the decoded message's, not copied on the server's task) and written to the
//! device by an executor thread while the next ones arrive ([`DeviceUpload`]); 2- and 4-bit
//! tensors, whose device layout is not their packed bytes, are put together and placed whole.

use super::error::RequestError;
use super::parse::{argument, keywords, placement_options, reference, Elements, Placement};
use super::resources::Resource;
use super::state::State;
use crate::node::gen::Caller;
use crate::node::term::{as_i64, atom, int, ok, tuple};
use crate::tensor_term::{data_bits, data_term, parse_shape, shape_term};
use crate::xla::{DeviceUpload, HostTensor, TensorSpec};
use eetf::{Pid, Reference, Term};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// A tensor arriving in chunks.
pub struct Upload {
    spec: TensorSpec,
    /// Where the tensor goes: an index into `:info`'s `devices`.
    device: usize,
    /// Who holds the buffer once it is done (`owner:`); `None`: the caller of `upload_done`.
    owner: Option<Pid>,
    /// Bytes the whole tensor takes (its bits rounded up).
    total: usize,
    /// Whether chunks are written to the device as they arrive ([`DeviceUpload`]): every type
    /// of a byte or more per element; 2- and 4-bit tensors are put together and placed whole.
    in_pieces: bool,
    parts: Mutex<Parts>,
}

#[derive(Default)]
struct Parts {
    /// Chunks received and not yet written to the device (all of them, for a tensor placed
    /// whole).
    pending: VecDeque<Vec<u8>>,
    received: usize,
    /// A job is writing `pending` to the device.
    writing: bool,
    /// The device buffer being written, once the first chunk made it.
    device: Option<DeviceUpload>,
    /// The first thing wrong (a chunk too many, a failed write), reported by `upload_done`.
    error: Option<String>,
    /// Who sent `{:upload_done, upload}` while a write was still going: the writer answers.
    done: Option<Caller>,
}

impl Upload {
    fn new(spec: TensorSpec, placement: Placement) -> Upload {
        let total = spec.bit_size().div_ceil(8);
        Upload {
            in_pieces: !spec.dtype.is_sub_byte() && total > 0,
            total,
            spec,
            device: placement.device,
            owner: placement.owner,
            parts: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Parts> {
        self.parts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a chunk (on the server's task: no copy, no XLA); `true` when a job must be started
    /// to write it to the device.
    fn add(&self, chunk: Vec<u8>) -> Result<bool, String> {
        let mut parts = self.lock();
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
            parts.pending.clear();
            parts.error = Some(error.clone());
            return Err(error);
        }
        parts.received += chunk.len();
        parts.pending.push_back(chunk);
        let start_writer = self.in_pieces && !parts.writing;
        parts.writing |= start_writer;
        Ok(start_writer)
    }

    /// Writes the pending chunks to the device in order, on an executor thread, until none is
    /// left; then answers an `upload_done` that came meanwhile.
    fn write_pending(&self, state: &State) {
        loop {
            let (chunk, device) = {
                let mut parts = self.lock();
                match parts.pending.pop_front() {
                    Some(chunk) if parts.error.is_none() => (chunk, parts.device.take()),
                    Some(_) => continue,
                    None => {
                        parts.writing = false;
                        let done = parts.done.take();
                        drop(parts);
                        if let Some(caller) = done {
                            self.finish(state, &caller);
                        }
                        return;
                    }
                }
            };
            let written = match device {
                Some(device) => Ok(device),
                None => DeviceUpload::new(
                    state.client(),
                    self.spec.dtype,
                    &self.spec.dims,
                    self.device,
                ),
            }
            .and_then(|mut device| device.write(&chunk).map(|()| device));
            let mut parts = self.lock();
            match written {
                Ok(device) => parts.device = Some(device),
                Err(e) => {
                    parts.error.get_or_insert_with(|| e.message().to_string());
                }
            }
        }
    }

    /// Answers `{:upload_done, upload}` now, or hands it to the write still going.
    fn done(self: Arc<Self>, state: &Arc<State>, caller: Caller) {
        let mut parts = self.lock();
        if parts.writing {
            parts.done = Some(caller);
            return;
        }
        drop(parts);
        state.spawn(move |state| self.finish(state, &caller));
    }

    /// Answers `caller` with the buffer, or what is wrong; on an executor thread.
    fn finish(&self, state: &State, caller: &Caller) {
        let owner = self.owner.as_ref().unwrap_or(&caller.pid);
        let placed = self.take_whole().and_then(|whole| match whole {
            Whole::Written(device) => {
                let buffer = device.finish()?;
                Ok(state.register(Resource::Buffer(Arc::new(buffer)), owner))
            }
            Whole::Host(tensor) => state.upload(&tensor, self.device, owner),
        });
        state.reply_result(caller, placed.map(Term::from));
    }

    /// The tensor once every chunk is in: written to the device, or put together.
    fn take_whole(&self) -> Result<Whole, RequestError> {
        let mut parts = self.lock();
        if let Some(error) = &parts.error {
            return Err(argument(error.clone()));
        }
        if parts.received != self.total {
            return Err(argument(format!(
                "the upload of {} takes {} bytes, {} arrived",
                self.spec, self.total, parts.received
            )));
        }
        if self.in_pieces {
            let device = parts.device.take().ok_or_else(|| {
                argument(format!("the upload of {} was written already", self.spec))
            })?;
            return Ok(Whole::Written(device));
        }
        let mut data = Vec::with_capacity(self.total);
        for chunk in std::mem::take(&mut parts.pending) {
            data.extend_from_slice(&chunk);
        }
        Ok(Whole::Host(HostTensor::new(
            self.spec.dtype,
            self.spec.dims.clone(),
            data,
        )))
    }
}

/// An upload's tensor once all of it arrived.
enum Whole {
    Written(DeviceUpload),
    Host(HostTensor),
}

/// `{:upload, {type, dims}}` / `{:upload, {type, dims}, [device: n, owner: pid]}`, parsed: a
/// tensor that will come in chunks.
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
        let placement = match placement_options(self.options, state.client().device_count()) {
            Ok(placement) => placement,
            Err(e) => return state.reply_error(&from, &e),
        };
        let upload = Upload::new(self.spec, placement);
        // Only a check: the buffer's bytes count as held once it is made.
        let begun = state
            .reserve_device("the upload", upload.total as u64, &from.pid)
            .map(|fits| {
                drop(fits);
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

    /// Keeps the chunk (its bytes as decoded, not copied) and has it written to the device on
    /// an executor thread; the error, if any.
    fn add(self, state: &Arc<State>) -> Result<(), RequestError> {
        let upload = state.lookup_upload(&self.upload)?;
        let (bytes, bits) = data_bits(self.chunk)
            .map_err(|other| argument(format!("a chunk must be a binary, got {other}")))?;
        if bits % 8 != 0 {
            // A 2- or 4-bit tensor whose bits are not whole bytes goes with its last byte's
            // unused bits zero.
            return Err(argument("a chunk must be a whole number of bytes"));
        }
        if upload.add(bytes).map_err(RequestError::Argument)? {
            state.spawn(move |state| upload.write_pending(state));
        }
        Ok(())
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
    pub fn apply_cast(self, state: &Arc<State>) {
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

    /// Replies `{:ok, buffer}`, the tensor on the device, once its last chunk is written; the
    /// upload is gone either way.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        match state.take_upload(&self.upload) {
            Ok(upload) => upload.done(state, from),
            Err(e) => state.reply_error(&from, &e),
        }
    }
}

/// The options of `{:read, buffer, opts}`: the largest chunk the caller takes in one message.
pub fn parse_read_options(opts: &Term) -> Result<Option<usize>, RequestError> {
    let mut chunk_bytes = None;
    for (key, value) in keywords(opts)? {
        match key.as_str() {
            "chunk_bytes" => match as_i64(&value) {
                Some(n) if n > 0 => chunk_bytes = Some(n as usize),
                _ => {
                    return Err(argument(format!(
                        "chunk_bytes must be a positive integer, got {value}"
                    )))
                }
            },
            other => return Err(argument(format!("unknown read option {other}"))),
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
