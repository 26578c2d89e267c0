//! The `:xla` server's requests as a type: [`Request::parse`] reads a term into one variant per
//! row of the README's request table, or into a [`RequestError`], in this one place. Each
//! variant is handled by one function (`server::handle_call` and `compute.rs`), and every
//! `{:error, {kind, message}}` reply is built from a [`RequestError`] by
//! [`RequestError::to_reply`].
//!
//! Adding a request means a variant here, an arm in [`Request::parse`], and a handler.

use super::kernels::LoadKernelRequest;
use crate::node::term::{as_atom, as_i64, as_list, as_tuple, error_kind};
use crate::node::Dest;
use crate::tensor_term::parse_tensor;
use crate::xla::{HostTensor, XlaError};
use eetf::{Reference, Term};
use std::time::Duration;

/// One request to `:xla`.
#[derive(Debug)]
pub enum Request {
    /// `:ping`.
    Ping,
    /// `{:echo, term}`.
    Echo(Term),
    /// `:info`.
    Info,
    /// `{:compile, mlir}` / `{:compile, mlir, []}`.
    Compile { program: Vec<u8> },
    /// `{:run, exe, args}` / `{:run, exe, args, opts}`.
    Run(RunRequest),
    /// `{:to_device, tensor}`.
    ToDevice(HostTensor),
    /// `{:read, buffer}`.
    Read(Reference),
    /// `{:free, exe_or_buffer}`.
    Free(Reference),
    /// `:spawn_echo`.
    SpawnEcho,
    /// `{:load_kernel, target, path, symbol}` / `{:load_kernel, target, path, symbol, opts}`.
    LoadKernel(LoadKernelRequest),
}

/// `{:run, exe, args, opts}`, parsed.
#[derive(Debug)]
pub struct RunRequest {
    pub exe: Reference,
    pub args: Vec<RunArg>,
    pub options: RunOptions,
}

/// A run argument as the request gives it.
#[derive(Debug)]
pub enum RunArg {
    Tensor(HostTensor),
    Buffer(Reference),
}

/// The run options the request sets; `None`: the node's default.
#[derive(Debug, Default)]
pub struct RunOptions {
    pub keep_on_device: bool,
    pub callback_server: Option<Dest>,
    pub callback_timeout: Option<Duration>,
    /// `Some(None)`: `:infinity`.
    pub queue_timeout: Option<Option<Duration>>,
}

/// Why a request failed; its kind is the atom the `{:error, {kind, message}}` reply carries.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// Not a request `:xla` knows (`:bad_request`).
    #[error("{0}")]
    BadRequest(String),
    /// A malformed or inconsistent argument or option (`:argument_error`).
    #[error("{0}")]
    Argument(String),
    /// What XLA said (`:compile_error`, `:argument_error` or `:runtime_error`).
    #[error("{}", .0.message())]
    Xla(#[from] XlaError),
    /// A run that waited longer than its `queue_timeout` for a place (`:timeout`).
    #[error("{0}")]
    Timeout(String),
    /// A kernel that could not be loaded, or a load the node does not allow (`:kernel_error`).
    #[error("{0}")]
    Kernel(String),
}

impl RequestError {
    pub fn kind(&self) -> &'static str {
        match self {
            RequestError::BadRequest(_) => "bad_request",
            RequestError::Argument(_) => "argument_error",
            RequestError::Xla(XlaError::Compile(_)) => "compile_error",
            RequestError::Xla(XlaError::Argument(_)) => "argument_error",
            RequestError::Xla(XlaError::Runtime(_) | XlaError::Plugin(_)) => "runtime_error",
            RequestError::Timeout(_) => "timeout",
            RequestError::Kernel(_) => "kernel_error",
        }
    }

    /// `{:error, {kind, message}}`.
    pub fn to_reply(&self) -> Term {
        error_kind(self.kind(), self.to_string())
    }
}

fn argument(message: impl Into<String>) -> RequestError {
    RequestError::Argument(message.into())
}

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
        match (tag, elements.len()) {
            ("echo", 2) => {
                let [_, term] = take::<2>(elements);
                Ok(Request::Echo(term))
            }
            ("compile", 2 | 3) => {
                let mut e = elements.into_iter().skip(1);
                let program = match e.next().expect("arity checked") {
                    Term::Binary(b) => b.bytes,
                    other => {
                        return Err(argument(format!(
                            "the program must be a binary (MLIR text or bytecode), got {other}"
                        )))
                    }
                };
                if let Some(opts) = e.next() {
                    let keys: Vec<String> = keywords(&opts)?.into_iter().map(|(k, _)| k).collect();
                    if !keys.is_empty() {
                        return Err(argument(format!(
                            "unknown compile options {keys:?} (none are supported yet)"
                        )));
                    }
                }
                Ok(Request::Compile { program })
            }
            ("run", 3 | 4) => {
                let mut e = elements.into_iter().skip(1);
                let exe = reference(e.next().expect("arity checked"))?;
                let args = run_args(e.next().expect("arity checked"))?;
                let options = e.next().map(|o| run_options(&o)).transpose()?;
                Ok(Request::Run(RunRequest {
                    exe,
                    args,
                    options: options.unwrap_or_default(),
                }))
            }
            ("to_device", 2) => {
                let [_, tensor] = take::<2>(elements);
                parse_tensor(tensor)
                    .map(Request::ToDevice)
                    .map_err(RequestError::Argument)
            }
            ("read", 2) => {
                let [_, buffer] = take::<2>(elements);
                Ok(Request::Read(reference(buffer)?))
            }
            ("free", 2) => match take::<2>(elements) {
                [_, Term::Reference(r)] => Ok(Request::Free(*r)),
                [_, other] => Err(argument(format!("unknown or freed reference {other}"))),
            },
            ("load_kernel", 4 | 5) => {
                let mut e = elements.into_iter().skip(1);
                let mut text = |what: &str| {
                    let term = e.next().expect("arity checked");
                    string(&term).ok_or_else(|| {
                        argument(format!(
                            "load_kernel: the {what} must be a string, got {term}"
                        ))
                    })
                };
                let (target, path, symbol) = (text("target")?, text("path")?, text("symbol")?);
                let mut version_shim = None;
                if let Some(opts) = e.next() {
                    for (key, value) in keywords(&opts)? {
                        match (key.as_str(), as_atom(&value)) {
                            ("version_shim", Some(b @ ("true" | "false"))) => {
                                version_shim = Some(b == "true")
                            }
                            ("version_shim", _) => {
                                return Err(argument(format!(
                                    "version_shim must be a boolean, got {value}"
                                )))
                            }
                            (other, _) => {
                                return Err(argument(format!(
                                    "unknown load_kernel option {other} (supported: version_shim)"
                                )))
                            }
                        }
                    }
                }
                Ok(Request::LoadKernel(LoadKernelRequest {
                    target,
                    path: path.into(),
                    symbol,
                    version_shim,
                }))
            }
            _ => Err(unknown(&Term::from(eetf::Tuple::from(elements)))),
        }
    }
}

/// A string given as a binary, an atom or a charlist.
fn string(term: &Term) -> Option<String> {
    match term {
        Term::Binary(b) => String::from_utf8(b.bytes.clone()).ok(),
        Term::Atom(a) => Some(a.name.clone()),
        Term::ByteList(b) => String::from_utf8(b.bytes.clone()).ok(),
        _ => None,
    }
}

fn unknown(request: &Term) -> RequestError {
    RequestError::BadRequest(format!("unknown request {request}"))
}

/// The elements of a tuple whose arity the caller checked.
fn take<const N: usize>(elements: Vec<Term>) -> [Term; N] {
    elements.try_into().expect("arity checked")
}

fn reference(term: Term) -> Result<Reference, RequestError> {
    match term {
        Term::Reference(r) => Ok(*r),
        other => Err(argument(format!("expected a reference, got {other}"))),
    }
}

fn run_args(args: Term) -> Result<Vec<RunArg>, RequestError> {
    let args = match args {
        Term::List(l) => l.elements,
        Term::ByteList(_) => {
            return Err(argument(
                "args must be a list of tensors or buffers, got a charlist",
            ))
        }
        other => {
            return Err(argument(format!(
                "args must be a list of tensors or buffers, got {other}"
            )))
        }
    };
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| match arg {
            Term::Reference(r) => Ok(RunArg::Buffer(*r)),
            tensor => parse_tensor(tensor)
                .map(RunArg::Tensor)
                .map_err(|e| argument(format!("argument {i}: {e}"))),
        })
        .collect()
}

fn run_options(opts: &Term) -> Result<RunOptions, RequestError> {
    let mut options = RunOptions::default();
    for (key, value) in keywords(opts)? {
        match key.as_str() {
            "keep_on_device" => {
                options.keep_on_device = match as_atom(&value) {
                    Some("true") => true,
                    Some("false") => false,
                    _ => return Err(argument(format!("keep_on_device must be a boolean, got {value}"))),
                }
            }
            "callback_server" => {
                options.callback_server = Some(Dest::from_term(&value).ok_or_else(|| {
                    argument(format!(
                        "callback_server must be a pid, an atom or {{atom, node}}, got {value}"
                    ))
                })?)
            }
            "callback_timeout" => {
                options.callback_timeout = Some(match (as_i64(&value), as_atom(&value)) {
                    (Some(ms), _) if ms > 0 => Duration::from_millis(ms as u64),
                    (_, Some("infinity")) => Duration::from_secs(100 * 365 * 24 * 3600),
                    _ => return Err(argument(format!("callback_timeout must be a positive number of milliseconds or :infinity, got {value}"))),
                })
            }
            "queue_timeout" => {
                options.queue_timeout = Some(match (as_i64(&value), as_atom(&value)) {
                    (Some(ms), _) if ms >= 0 => Some(Duration::from_millis(ms as u64)),
                    (_, Some("infinity")) => None,
                    _ => return Err(argument(format!("queue_timeout must be a non-negative number of milliseconds or :infinity, got {value}"))),
                })
            }
            other => {
                return Err(argument(format!(
                    "unknown run option {other} (supported: keep_on_device, callback_server, callback_timeout, queue_timeout)"
                )))
            }
        }
    }
    Ok(options)
}

/// Reads a keyword list into (key, value) pairs.
fn keywords(opts: &Term) -> Result<Vec<(String, Term)>, RequestError> {
    let items = as_list(opts)
        .ok_or_else(|| argument(format!("options must be a keyword list, got {opts}")))?;
    items
        .iter()
        .map(|item| match as_tuple(item, 2) {
            Some([k, v]) if as_atom(k).is_some() => {
                Ok((as_atom(k).expect("checked").to_string(), v.clone()))
            }
            _ => Err(argument(format!(
                "options must be a keyword list, got element {item}"
            ))),
        })
        .collect()
}
