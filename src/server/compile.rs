//! `{:compile, mlir}` / `{:compile, mlir, opts}`: a StableHLO module (MLIR text or bytecode)
//! compiled into an executable that the caller owns.
//!
//! Compiling calls XLA, so it runs on an executor thread, which replies `{:ok, exe}` (a
//! reference; see `resources.rs` for ownership) or the compile error. It goes through the
//! executor's cache: the same module compiled twice is one executable.

use super::error::RequestError;
use super::parse::{argument, keywords, Elements};
use super::state::State;
use crate::dispatch;
use crate::node::gen::Caller;
use crate::xla::XlaError;
use eetf::Term;
use std::sync::Arc;

/// `{:compile, mlir, opts}`, parsed.
#[derive(Debug)]
pub struct CompileRequest {
    program: Vec<u8>,
}

impl CompileRequest {
    /// Reads `mlir` and the options (none are supported yet, so any is an error).
    pub fn parse(elements: &mut Elements) -> Result<CompileRequest, RequestError> {
        let program = match elements.required() {
            Term::Binary(b) => b.bytes,
            other => {
                return Err(argument(format!(
                    "the program must be a binary (MLIR text or bytecode), got {other}"
                )))
            }
        };
        if let Some(opts) = elements.optional() {
            let keys: Vec<String> = keywords(&opts)?.into_iter().map(|(k, _)| k).collect();
            if !keys.is_empty() {
                return Err(argument(format!(
                    "unknown compile options {keys:?} (none are supported yet)"
                )));
            }
        }
        Ok(CompileRequest { program })
    }

    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let program = self.program;
        state.spawn(move |state| {
            let compiled = state.compile(program, &from.pid).map(Term::from);
            let explained = compiled.map_err(|e| explain_missing_handler(e, state).into());
            state.reply_result(&from, explained);
        });
    }
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
