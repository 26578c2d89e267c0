//! `{:to_device, tensor}`, `{:read, buffer}` and `{:free, exe_or_buffer}`: device buffers the
//! caller owns, and freeing what it owns.
//!
//! Copies to and from the device call XLA, so they run on an executor thread, which replies.
//! A copy to the device first reserves its bytes under `--max-device-bytes` (`device_budget.rs`).
//! Freeing only takes the resource out of the table here; dropping it (a PJRT call) happens on
//! an executor thread too, after any run still using it is done (see `resources.rs`).

use super::error::RequestError;
use super::parse::{self, Elements};
use super::state::{unknown_reference, State};
use crate::node::gen::Caller;
use crate::node::term::atom;
use crate::tensor_term::host_tensor_term;
use crate::xla::HostTensor;
use eetf::{Reference, Term};
use std::sync::Arc;

/// `{:to_device, tensor}`, parsed.
#[derive(Debug)]
pub struct ToDeviceRequest {
    tensor: HostTensor,
}

impl ToDeviceRequest {
    pub fn parse(elements: &mut Elements) -> Result<ToDeviceRequest, RequestError> {
        let tensor = parse::tensor(elements.required())?;
        Ok(ToDeviceRequest { tensor })
    }

    /// Copies the tensor to the device on an executor thread, which replies `{:ok, buffer}`.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        state.spawn(move |state| {
            let uploaded = state.upload(&self.tensor, &from.pid).map(Term::from);
            state.reply_result(&from, uploaded);
        });
    }
}

/// `{:read, buffer}`, parsed.
#[derive(Debug)]
pub struct ReadRequest {
    buffer: Reference,
}

impl ReadRequest {
    pub fn parse(elements: &mut Elements) -> Result<ReadRequest, RequestError> {
        let buffer = parse::reference(elements.required())?;
        Ok(ReadRequest { buffer })
    }

    /// Looks the buffer up here, copies it to the host on an executor thread, which replies
    /// `{:ok, tensor}`.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let buffer = match state.lookup_buffer(&self.buffer) {
            Ok(b) => b,
            Err(e) => return state.reply_error(&from, &e),
        };
        state.spawn(move |state| {
            let read = buffer.to_host_tensor().map(host_tensor_term);
            state.reply_result(&from, read.map_err(RequestError::from));
        });
    }
}

/// `{:free, reference}`, parsed.
#[derive(Debug)]
pub struct FreeRequest {
    reference: Reference,
}

impl FreeRequest {
    /// Anything but a reference names nothing the caller could free.
    pub fn parse(elements: &mut Elements) -> Result<FreeRequest, RequestError> {
        match elements.required() {
            Term::Reference(r) => Ok(FreeRequest { reference: *r }),
            other => Err(unknown_reference(other)),
        }
    }

    /// Frees the resource and replies `:ok`, here on the server's task.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        match state.free(&self.reference) {
            Ok(()) => state.reply(&from, atom("ok")),
            Err(e) => state.reply_error(&from, &e),
        }
    }
}
