//! The `:xla` server's requests as a type: [`Request::parse`] reads a term into one variant per
//! row of the README's request table, or into a [`RequestError`], and [`Request::apply`] answers
//! it through the file of its family:
//!
//! | requests | file |
//! |---|---|
//! | `:ping`, `{:echo, term}`, `:spawn_echo` | here (`echo.rs`: the process `:spawn_echo` starts) |
//! | `:info` | `info.rs` |
//! | `{:compile, mlir}`, `{:compile, mlir, opts}` | `compile.rs` |
//! | `{:run, exe, args}`, `{:run, exe, args, opts}` | `run.rs` |
//! | `{:to_device, tensor}`, `{:read, buffer}`, `{:free, exe_or_buffer}` | `buffers.rs` |
//! | `{:upload, ...}`, `{:upload_done, upload}`, `{:read, buffer, opts}`, `{:free, [refs]}` (also casts) | `transfer.rs` |
//! | `{:load_kernel, target, path, symbol}`, `{:load_kernel, target, path, symbol, opts}` | `load_kernel.rs` |
//!
//! Adding a request means a variant here, its forms in [`Request::parse`], and its family's
//! parse and apply.

use super::buffers;
use super::compile::CompileRequest;
use super::echo;
use super::error::RequestError;
use super::info;
use super::load_kernel::LoadKernelRequest;
use super::parse::{self, Elements};
use super::run::RunRequest;
use super::state::State;
use super::transfer;
use crate::node::gen::From;
use crate::node::term::{as_atom, atom, ok};
use crate::xla::HostTensor;
use eetf::{Reference, Term};
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
    /// `{:run, exe, args}` / `{:run, exe, args, opts}`.
    Run(RunRequest),
    /// `{:to_device, tensor}`.
    ToDevice(HostTensor),
    /// `{:read, buffer}` / `{:read, buffer, [chunk_bytes: n]}`.
    Read(Reference, Option<usize>),
    /// `{:free, exe_or_buffer}`.
    Free(Reference),
    /// `{:free, [refs]}`: frees those the node has, ignores the rest.
    FreeAll(Vec<Reference>),
    /// `{:upload, {type, dims}}`: a tensor that comes in chunks.
    Upload(Term),
    /// `{:upload, upload, chunk}`.
    UploadChunk(Reference, Term),
    /// `{:upload_done, upload}`.
    UploadDone(Reference),
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
            ("run", 3 | 4) => Some(|e| RunRequest::parse(e).map(Request::Run)),
            ("to_device", 2) => Some(|e| parse::tensor(e.required()).map(Request::ToDevice)),
            ("read", 2 | 3) => Some(|e| {
                let buffer = parse::reference(e.required())?;
                let chunk_bytes = match e.optional() {
                    Some(opts) => transfer::parse_read_options(&opts)?,
                    None => None,
                };
                Ok(Request::Read(buffer, chunk_bytes))
            }),
            ("free", 2) => Some(|e| {
                let target = e.required();
                match transfer::parse_free_list(&target) {
                    Some(refs) => refs.map(Request::FreeAll),
                    None => buffers::parse_free(target).map(Request::Free),
                }
            }),
            ("upload", 2) => Some(|e| Ok(Request::Upload(e.required()))),
            ("upload", 3) => Some(|e| {
                let upload = parse::reference(e.required())?;
                Ok(Request::UploadChunk(upload, e.required()))
            }),
            ("upload_done", 2) => Some(|e| parse::reference(e.required()).map(Request::UploadDone)),
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

    /// Handles a request sent with `GenServer.cast`, which gets no answer: frees and upload
    /// chunks only. A chunk that fails marks its upload, whose `{:upload_done, upload}` then
    /// says what went wrong.
    pub fn apply_cast(self, state: &Arc<State>) {
        match self {
            Request::FreeAll(refs) => transfer::free_all(state, &refs),
            Request::Free(reference) => transfer::free_all(state, &[reference]),
            Request::UploadChunk(upload, chunk) => {
                if let Err(e) = transfer::chunk(state, &upload, chunk) {
                    tracing::debug!("xla: upload chunk cast: {e}");
                }
            }
            other => tracing::debug!(
                "xla: ignoring cast {other:?}: only frees and upload chunks are casts"
            ),
        }
    }

    /// Answers the request: the quick ones here, on the server's task; the ones that call XLA
    /// from an executor thread, which sends the reply itself.
    pub fn apply(self, state: &Arc<State>, from: From) {
        let reply = match self {
            Request::Ping => atom("pong"),
            Request::Echo(term) => term,
            Request::SpawnEcho => ok(echo::spawn(&state.node)),
            Request::Info => ok(info::info(state)),
            Request::Free(reference) => match buffers::free(state, &reference) {
                Ok(reply) => reply,
                Err(e) => return state.reply_error(&from, &e),
            },
            Request::FreeAll(refs) => {
                transfer::free_all(state, &refs);
                atom("ok")
            }
            Request::UploadChunk(upload, chunk) => match transfer::chunk(state, &upload, chunk) {
                Ok(()) => atom("ok"),
                Err(e) => return state.reply_error(&from, &e),
            },
            Request::Upload(shape) => return transfer::begin(state, from, shape),
            Request::UploadDone(upload) => return transfer::done(state, from, upload),
            Request::Compile(compile) => return compile.apply(state, from),
            Request::Run(run) => return run.apply(state, from),
            Request::ToDevice(tensor) => return buffers::to_device(state, from, tensor),
            Request::Read(buffer, chunk_bytes) => {
                return buffers::read(state, from, buffer, chunk_bytes)
            }
            Request::LoadKernel(load) => return load.apply(state, from),
        };
        state.reply(&from, reply);
    }
}

fn unknown(request: &Term) -> RequestError {
    RequestError::BadRequest(format!("unknown request {request}"))
}
