//! The `:xla` server's requests as a type: [`Request::parse`] reads a term into one variant per
//! row of the README's request table, or into a [`RequestError`], and [`Request::apply`] answers
//! it through the file of its family:
//!
//! | requests | file |
//! |---|---|
//! | `:ping`, `{:echo, term}`, `:spawn_echo` | here (`echo.rs`: the process `:spawn_echo` starts) |
//! | `:info` | `info.rs` |
//! | `{:compile, mlir}`, `{:compile, mlir, opts}` | `compile.rs` |
//! | `{:describe, exe_or_buffer}` | `describe.rs` |
//! | `{:run, exe, args}`, `{:run, exe, args, opts}` | `run.rs` |
//! | `{:to_device, tensor}`, `{:to_device, tensor, opts}`, `{:read, buffer}`, `{:read, buffer, opts}`, `{:free, exe_or_buffer}`, `{:free, [refs]}` | `buffers.rs` |
//! | `{:upload, {type, dims}}`, `{:upload, {type, dims}, opts}`, `{:upload, upload, chunk}`, `{:upload_done, upload}` | `transfer.rs` |
//! | `{:share, refs, pid}`, `{:give_away, refs, pid}`, `{:release, refs}`, `{:release, refs, pid}` | `holders.rs` |
//! | `{:load_kernel, target, path, symbol}`, `{:load_kernel, target, path, symbol, opts}` | `load_kernel.rs` |
//!
//! `GenServer.cast` reaches [`Request::apply_cast`], which serves frees, upload chunks, shares
//! and releases that name their holder.
//!
//! Adding a request means a variant here, its forms in [`Request::parse`], and its family's
//! parse and apply.

use super::buffers::{FreeRequest, ReadRequest, ToDeviceRequest};
use super::compile::CompileRequest;
use super::describe::DescribeRequest;
use super::echo;
use super::error::RequestError;
use super::holders::HoldRequest;
use super::info;
use super::load_kernel::LoadKernelRequest;
use super::parse::Elements;
use super::run::RunRequest;
use super::state::State;
use super::transfer::{UploadChunkRequest, UploadDoneRequest, UploadRequest};
use crate::node::gen::Caller;
use crate::node::term::{as_atom, atom, ok};
use eetf::Term;
use std::sync::Arc;

/// One request to `:xla`.
#[derive(Debug)]
pub enum Request {
    /// `:ping`.
    Ping,
    /// `{:echo, term}`.
    Echo(Term),
    /// `:spawn_echo`.
    SpawnEcho,
    /// `:info`.
    Info,
    /// `{:compile, mlir}` / `{:compile, mlir, opts}`.
    Compile(CompileRequest),
    /// `{:describe, exe_or_buffer}`.
    Describe(DescribeRequest),
    /// `{:run, exe, args}` / `{:run, exe, args, opts}`.
    Run(RunRequest),
    /// `{:to_device, tensor}` / `{:to_device, tensor, [device: n]}`.
    ToDevice(ToDeviceRequest),
    /// `{:read, buffer}` / `{:read, buffer, [chunk_bytes: n]}`.
    Read(ReadRequest),
    /// `{:free, exe_or_buffer}` / `{:free, [exe_or_buffer, ...]}`.
    Free(FreeRequest),
    /// `{:upload, {type, dims}}` / `{:upload, {type, dims}, [device: n]}`.
    Upload(UploadRequest),
    /// `{:upload, upload, chunk}`.
    UploadChunk(UploadChunkRequest),
    /// `{:upload_done, upload}`.
    UploadDone(UploadDoneRequest),
    /// `{:share, refs, pid}`, `{:give_away, refs, pid}`, `{:release, refs}` / `{:release, refs,
    /// pid}`.
    Hold(HoldRequest),
    /// `{:load_kernel, target, path, symbol}` / `{:load_kernel, target, path, symbol, opts}`.
    LoadKernel(LoadKernelRequest),
}

/// Reads the elements after a request's tag.
type Parse = fn(&mut Elements) -> Result<Request, RequestError>;

impl Request {
    /// Reads a request term.
    pub fn parse(request: Term) -> Result<Request, RequestError> {
        let elements = match request {
            Term::Atom(a) => {
                return match a.name.as_str() {
                    "ping" => Ok(Request::Ping),
                    "info" => Ok(Request::Info),
                    "spawn_echo" => Ok(Request::SpawnEcho),
                    _ => Err(unknown(&Term::Atom(a))),
                }
            }
            Term::Tuple(t) => t.elements,
            other => return Err(unknown(&other)),
        };
        let tag = elements.first().and_then(as_atom).unwrap_or_default();
        let parse: Option<Parse> = match (tag, elements.len()) {
            ("echo", 2) => Some(|e| Ok(Request::Echo(e.required()))),
            ("compile", 2 | 3) => Some(|e| CompileRequest::parse(e).map(Request::Compile)),
            ("describe", 2) => Some(|e| DescribeRequest::parse(e).map(Request::Describe)),
            ("run", 3 | 4) => Some(|e| RunRequest::parse(e).map(Request::Run)),
            ("to_device", 2 | 3) => Some(|e| ToDeviceRequest::parse(e).map(Request::ToDevice)),
            ("read", 2 | 3) => Some(|e| ReadRequest::parse(e).map(Request::Read)),
            ("upload", 2) => Some(|e| UploadRequest::parse(e).map(Request::Upload)),
            // `{:upload, upload, chunk}` names an upload; `{:upload, shape, opts}` a shape.
            ("upload", 3) if matches!(elements[1], Term::Reference(_)) => {
                Some(|e| UploadChunkRequest::parse(e).map(Request::UploadChunk))
            }
            ("upload", 3) => Some(|e| UploadRequest::parse(e).map(Request::Upload)),
            ("upload_done", 2) => Some(|e| UploadDoneRequest::parse(e).map(Request::UploadDone)),
            ("free", 2) => Some(|e| FreeRequest::parse(e).map(Request::Free)),
            ("share", 3) => Some(|e| HoldRequest::parse_share(e).map(Request::Hold)),
            ("give_away", 3) => Some(|e| HoldRequest::parse_give_away(e).map(Request::Hold)),
            ("release", 2 | 3) => Some(|e| HoldRequest::parse_release(e).map(Request::Hold)),
            ("load_kernel", 4 | 5) => {
                Some(|e| LoadKernelRequest::parse(e).map(Request::LoadKernel))
            }
            _ => None,
        };
        match parse {
            Some(parse) => parse(&mut Elements::after_tag(elements)),
            None => Err(unknown(&Term::from(eetf::Tuple::from(elements)))),
        }
    }

    /// Serves a request sent with `GenServer.cast`, which gets no answer: frees, upload chunks,
    /// shares and releases; any other is ignored (there is no one to tell).
    pub fn apply_cast(self, state: &Arc<State>) {
        match self {
            Request::Free(free) => free.apply_cast(state),
            Request::UploadChunk(chunk) => chunk.apply_cast(state),
            Request::Hold(hold) => hold.apply_cast(state),
            other => tracing::debug!(
                "xla: ignoring cast {other:?}: only frees, upload chunks, shares and releases \
                 are casts"
            ),
        }
    }

    /// Answers the request: the quick ones here, on the server's task; the ones that call XLA
    /// from an executor thread, which sends the reply itself.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let reply = match self {
            Request::Ping => atom("pong"),
            Request::Echo(term) => term,
            Request::SpawnEcho => ok(echo::spawn(state.node())),
            Request::Info => ok(info::info(state)),
            Request::Compile(compile) => return compile.apply(state, from),
            Request::Describe(describe) => return state.reply_result(&from, describe.apply(state)),
            Request::Run(run) => return run.apply(state, from),
            Request::ToDevice(to_device) => return to_device.apply(state, from),
            Request::Read(read) => return read.apply(state, from),
            Request::Free(free) => return free.apply(state, from),
            Request::Upload(upload) => return upload.apply(state, from),
            Request::UploadChunk(chunk) => return chunk.apply(state, from),
            Request::UploadDone(done) => return done.apply(state, from),
            Request::Hold(hold) => return hold.apply(state, from),
            Request::LoadKernel(load) => return load.apply(state, from),
        };
        state.reply(&from, reply);
    }
}

fn unknown(request: &Term) -> RequestError {
    RequestError::BadRequest(format!("unknown request {request}"))
}
