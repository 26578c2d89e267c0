//! `{:compile, mlir}` / `{:compile, mlir, opts}`: a StableHLO module (MLIR text or bytecode)
//! compiled into an executable that the caller owns. `devices: [i, j, ...]` compiles it as one
//! SPMD program over those devices (indices into `:info`'s `devices`), one partition each, split
//! as its sharding annotations say; without it a program runs on any one device.
//!
//! Compiling calls XLA, so it runs on an executor thread, which replies `{:ok, exe}` (a
//! reference; see `resources.rs` for ownership) or the compile error. It goes through the
//! executor's cache: the same module compiled twice is one executable.

use super::error::RequestError;
use super::parse::{argument, device, keywords, Elements};
use super::state::State;
use crate::dispatch;
use crate::node::gen::Caller;
use crate::xla::{Client, CompileOptions, XlaError};
use eetf::{FixInteger, Term};
use std::sync::Arc;

/// `{:compile, mlir, opts}`, parsed.
#[derive(Debug)]
pub struct CompileRequest {
    program: Vec<u8>,
    /// `devices: [...]` as given, checked against the node's devices when applied.
    devices: Option<Term>,
}

impl CompileRequest {
    /// Reads `mlir` and the options (`devices:`).
    pub fn parse(elements: &mut Elements) -> Result<CompileRequest, RequestError> {
        let program = match elements.required() {
            Term::Binary(b) => b.bytes,
            other => {
                return Err(argument(format!(
                    "the program must be a binary (MLIR text or bytecode), got {other}"
                )))
            }
        };
        let mut devices = None;
        if let Some(opts) = elements.optional() {
            for (key, value) in keywords(&opts)? {
                match key.as_str() {
                    "devices" => devices = Some(value),
                    other => {
                        return Err(argument(format!(
                            "unknown compile option {other} (supported: devices)"
                        )))
                    }
                }
            }
        }
        Ok(CompileRequest { program, devices })
    }

    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let program = self.program;
        let options = match self.devices.map(|d| partitioned(&d, state.client())) {
            None => CompileOptions::default(),
            Some(Ok(options)) => options,
            Some(Err(e)) => return state.reply_error(&from, &e),
        };
        state.spawn(move |state| {
            let compiled = state.compile(program, &options, &from.pid).map(Term::from);
            let explained = compiled.map_err(|e| explain_missing_handler(e, state).into());
            state.reply_result(&from, explained);
        });
    }
}

/// The options of an SPMD program over `devices`: a list of distinct device indices.
fn partitioned(devices: &Term, client: &Client) -> Result<CompileOptions, RequestError> {
    let count = client.device_count();
    let items = match devices {
        Term::List(l) => l.elements.clone(),
        Term::ByteList(b) => b
            .bytes
            .iter()
            .map(|&n| Term::from(FixInteger::from(n as i32)))
            .collect(),
        other => {
            return Err(argument(format!(
                "devices must be a list of device indices, got {other}"
            )))
        }
    };
    let indices = items
        .iter()
        .map(|n| device("devices", n, count))
        .collect::<Result<Vec<_>, _>>()?;
    if indices.is_empty() {
        return Err(argument("devices must name at least one device"));
    }
    if let Some(twice) = indices
        .iter()
        .enumerate()
        .find_map(|(i, d)| indices[..i].contains(d).then_some(*d))
    {
        return Err(argument(format!("devices names device {twice} twice")));
    }
    let ids = indices
        .into_iter()
        .map(|i| client.device_id(i))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(CompileOptions::partitioned(ids))
}

/// A compile error about a custom-call target XLA has no handler for says why: for a callback
/// target on a node whose platform runs no host callbacks, that reason; otherwise the kernels
/// that are loaded (the usual cause is a kernel that was never loaded, or loaded under another
/// name).
fn explain_missing_handler(error: XlaError, state: &State) -> XlaError {
    const MISSING: &str = "No FFI handler registered for ";
    let XlaError::Compile(message) = error else {
        return error;
    };
    let Some(at) = message.find(MISSING) else {
        return XlaError::Compile(message);
    };
    let target = message[at + MISSING.len()..]
        .split_whitespace()
        .next()
        .unwrap_or_default();
    let why = match state.host_callbacks() {
        Err(reason) if dispatch::CALLBACK_TARGETS.contains(&target) => format!(
            "This node runs no host callbacks ({reason}): split the program at its callbacks \
             (XlaNode.Compiler does when :info says host_callbacks: false)."
        ),
        _ => crate::xla::describe_loaded_kernels(),
    };
    XlaError::Compile(format!("{message}. {why}"))
}
