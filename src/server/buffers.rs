//! `{:to_device, tensor}` (or `{:to_device, tensor, [device: n, owner: pid]}`), `{:read, buffer}`
//! and `{:free, exe_or_buffer}` (or a list of them): device buffers the caller (or `owner:`)
//! holds, and freeing them whoever holds them.
//!
//! Copies to and from the device call XLA, so they run on an executor thread, which replies.
//! A copy to the device first reserves its bytes under `--max-device-bytes` (`device_budget.rs`).
//! Freeing only takes the resource out of the table here; dropping it (a PJRT call) happens on
//! an executor thread too, after any run still using it is done (see `resources.rs`).

use super::error::RequestError;
use super::parse::{self, Elements};
use super::state::{unknown_reference, State};
use super::transfer;
use crate::node::gen::Caller;
use crate::node::term::atom;
use crate::tensor_term::host_tensor_term;
use crate::xla::HostTensor;
use eetf::{Reference, Term};
use std::sync::Arc;

/// `{:to_device, tensor}` / `{:to_device, tensor, [device: n]}`, parsed.
#[derive(Debug)]
pub struct ToDeviceRequest {
    tensor: HostTensor,
    options: Option<Term>,
}

impl ToDeviceRequest {
    pub fn parse(elements: &mut Elements) -> Result<ToDeviceRequest, RequestError> {
        let tensor = parse::tensor(elements.required())?;
        Ok(ToDeviceRequest {
            tensor,
            options: elements.optional(),
        })
    }

    /// Copies the tensor to its device on an executor thread, which replies `{:ok, buffer}`.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let placement = match parse::placement_options(self.options, state.client().device_count())
        {
            Ok(placement) => placement,
            Err(e) => return state.reply_error(&from, &e),
        };
        state.spawn(move |state| {
            let owner = placement.owner.as_ref().unwrap_or(&from.pid);
            let uploaded = state
                .upload(&self.tensor, placement.device, owner)
                .map(Term::from);
            state.reply_result(&from, uploaded);
        });
    }
}

/// `{:read, buffer}` / `{:read, buffer, [chunk_bytes: n]}`, parsed.
#[derive(Debug)]
pub struct ReadRequest {
    buffer: Reference,
    /// The largest chunk the caller takes in one message (`None`: the whole tensor).
    chunk_bytes: Option<usize>,
}

impl ReadRequest {
    pub fn parse(elements: &mut Elements) -> Result<ReadRequest, RequestError> {
        let buffer = parse::reference(elements.required())?;
        let chunk_bytes = match elements.optional() {
            Some(opts) => transfer::parse_read_options(&opts)?,
            None => None,
        };
        Ok(ReadRequest {
            buffer,
            chunk_bytes,
        })
    }

    /// Looks the buffer up here, copies it to the host on an executor thread, which replies
    /// `{:ok, tensor}`, or sends it in chunks when it takes more than `chunk_bytes`
    /// (`transfer.rs`).
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let buffer = match state.lookup_buffer(&self.buffer) {
            Ok(b) => b,
            Err(e) => return state.reply_error(&from, &e),
        };
        state.spawn(move |state| match buffer.to_host_tensor() {
            Ok(tensor) => match self.chunk_bytes {
                Some(chunk) if tensor.data.len() > chunk => {
                    transfer::send_chunked(state, &from, tensor, chunk)
                }
                _ => state.reply_result(&from, Ok(host_tensor_term(tensor))),
            },
            Err(e) => state.reply_error(&from, &RequestError::from(e)),
        });
    }
}

/// `{:free, reference}` or `{:free, [reference, ...]}`, parsed.
#[derive(Debug)]
pub enum FreeRequest {
    /// One reference, which must name something.
    One(Reference),
    /// Many; those that name nothing are skipped.
    All(Vec<Reference>),
}

impl FreeRequest {
    /// Anything but a reference or a list of them names nothing the caller could free.
    pub fn parse(elements: &mut Elements) -> Result<FreeRequest, RequestError> {
        match elements.required() {
            Term::Reference(r) => Ok(FreeRequest::One(*r)),
            Term::List(list) => list
                .elements
                .into_iter()
                .map(parse::reference)
                .collect::<Result<_, _>>()
                .map(FreeRequest::All),
            Term::ByteList(b) if b.bytes.is_empty() => Ok(FreeRequest::All(Vec::new())),
            other => Err(unknown_reference(other)),
        }
    }

    /// Frees and replies `:ok`, here on the server's task.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        match self {
            FreeRequest::One(reference) => match state.free(&reference) {
                Ok(()) => state.reply(&from, atom("ok")),
                Err(e) => state.reply_error(&from, &e),
            },
            FreeRequest::All(references) => {
                state.free_all(&references);
                state.reply(&from, atom("ok"))
            }
        }
    }

    /// As a cast: frees what the node has of it, answers nothing.
    pub fn apply_cast(self, state: &State) {
        match self {
            FreeRequest::One(reference) => state.free_all(&[reference]),
            FreeRequest::All(references) => state.free_all(&references),
        }
    }
}
