//! `{:to_device, tensor}`, `{:read, buffer}` and `{:free, exe_or_buffer}`: device buffers the
//! caller owns, and freeing what it owns.
//!
//! Copies to and from the device call XLA, so they run on an executor thread, which replies.
//! A copy to the device first reserves its bytes under `--max-device-bytes` (`device_budget.rs`).
//! Freeing only takes the resource out of the table here; dropping it (a PJRT call) happens on
//! an executor thread too, after any run still using it is done (see `resources.rs`).

use super::error::RequestError;
use super::parse::argument;
use super::resources::Resource;
use super::state::State;
use crate::node::gen::From;
use crate::node::term::atom;
use crate::tensor_term::host_tensor_term;
use crate::xla::HostTensor;
use eetf::{Reference, Term};
use std::sync::Arc;

/// `{:to_device, tensor}`: replies `{:ok, buffer}`.
pub fn to_device(state: &Arc<State>, from: From, tensor: HostTensor) {
    state.spawn(move |state| {
        let uploaded = place(state, &from, tensor);
        state.reply_result(&from, uploaded);
    });
}

/// Copies `tensor` to the device within `--max-device-bytes` and registers the buffer for the
/// caller: the reference, or why not. On an executor thread.
pub fn place(state: &State, from: &From, tensor: HostTensor) -> Result<Term, RequestError> {
    let bytes = tensor.data.len() as u64;
    let _reserved = state
        .device_budget
        .reserve(&state.resources, "the to_device", bytes)?;
    let buffer =
        state
            .executor
            .client()
            .buffer_from_host(&tensor.data, tensor.dtype, &tensor.dims)?;
    Ok(Term::from(
        state.register(Resource::Buffer(Arc::new(buffer)), &from.pid),
    ))
}

/// `{:read, buffer}` and `{:read, buffer, opts}`: replies `{:ok, tensor}`, or, when the data
/// takes more than the caller's `chunk_bytes`, sends it in chunks (`transfer.rs`).
pub fn read(state: &Arc<State>, from: From, buffer: Reference, chunk_bytes: Option<usize>) {
    let buffer = match state.lookup_buffer(&buffer) {
        Ok(b) => b,
        Err(e) => return state.reply_error(&from, &e),
    };
    state.spawn(move |state| match buffer.to_host_tensor() {
        Ok(tensor) => match chunk_bytes {
            Some(chunk) if tensor.data.len() > chunk => {
                super::transfer::send_chunked(state, &from, tensor, chunk)
            }
            _ => state.reply_result(&from, Ok(host_tensor_term(tensor))),
        },
        Err(e) => state.reply_error(&from, &RequestError::from(e)),
    });
}

/// The reference of `{:free, reference}`.
pub fn parse_free(term: Term) -> Result<Reference, RequestError> {
    match term {
        Term::Reference(r) => Ok(*r),
        other => Err(argument(format!("unknown or freed reference {other}"))),
    }
}

/// `{:free, reference}`: the reply, `:ok`, or the error.
pub fn free(state: &State, reference: &Reference) -> Result<Term, RequestError> {
    match state.resources.free(reference) {
        Some(resource) => {
            state.release(vec![resource]);
            Ok(atom("ok"))
        }
        None => Err(argument(format!(
            "unknown or freed reference {}",
            Term::from(reference.clone())
        ))),
    }
}
