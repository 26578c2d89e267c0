//! Why a request failed, and the `{:error, {kind, message}}` reply that says so.
//!
//! Every error reply of `:xla` is built here, from a [`RequestError`], so that its kind atoms
//! (the README's list) have one source, and counted by kind (`State::reply_error`).

use crate::node::term::error_kind;
use crate::schedule::tenants::Refusal;
use crate::xla::XlaError;
use eetf::Term;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// A transfer or run that would take the device past `--max-device-bytes`
    /// (`:resource_exhausted`).
    #[error("{0}")]
    ResourceExhausted(String),
    /// A transfer or run that would take its client node past its `max_device_bytes` (`:quota`).
    #[error("{0}")]
    Quota(String),
    /// A run whose client node already has its `max_queued` runs waiting (`:overloaded`).
    #[error("{0}")]
    Overloaded(String),
}

impl RequestError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            RequestError::BadRequest(_) => ErrorKind::BadRequest,
            RequestError::Argument(_) => ErrorKind::Argument,
            RequestError::Xla(XlaError::Compile(_)) => ErrorKind::Compile,
            RequestError::Xla(XlaError::Argument(_)) => ErrorKind::Argument,
            RequestError::Xla(XlaError::Runtime(_) | XlaError::Plugin(_)) => ErrorKind::Runtime,
            RequestError::Timeout(_) => ErrorKind::Timeout,
            RequestError::Kernel(_) => ErrorKind::Kernel,
            RequestError::ResourceExhausted(_) => ErrorKind::ResourceExhausted,
            RequestError::Quota(_) => ErrorKind::Quota,
            RequestError::Overloaded(_) => ErrorKind::Overloaded,
        }
    }

    /// `{:error, {kind, message}}`.
    pub fn to_reply(&self) -> Term {
        error_kind(self.kind().as_str(), self.to_string())
    }
}

/// The kind atom of an error reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    BadRequest,
    Argument,
    Compile,
    Runtime,
    Timeout,
    Kernel,
    ResourceExhausted,
    Quota,
    Overloaded,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 9] = [
        ErrorKind::BadRequest,
        ErrorKind::Argument,
        ErrorKind::Compile,
        ErrorKind::Runtime,
        ErrorKind::Timeout,
        ErrorKind::Kernel,
        ErrorKind::ResourceExhausted,
        ErrorKind::Quota,
        ErrorKind::Overloaded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Argument => "argument_error",
            ErrorKind::Compile => "compile_error",
            ErrorKind::Runtime => "runtime_error",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Kernel => "kernel_error",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::Quota => "quota",
            ErrorKind::Overloaded => "overloaded",
        }
    }
}

impl ErrorKind {
    /// The refusal a client node is counted for on an error reply of this kind, if any.
    pub fn refusal(self) -> Option<Refusal> {
        match self {
            ErrorKind::Overloaded => Some(Refusal::Overloaded),
            ErrorKind::Quota => Some(Refusal::Quota),
            ErrorKind::ResourceExhausted => Some(Refusal::ResourceExhausted),
            ErrorKind::Timeout => Some(Refusal::Timeout),
            _ => None,
        }
    }
}

/// Error replies sent, per kind: `:info`'s `request_errors`, `/metrics`'
/// `xla_node_request_errors_total`.
#[derive(Debug, Default)]
pub struct ErrorTally([AtomicU64; ErrorKind::ALL.len()]);

impl ErrorTally {
    pub fn record(&self, kind: ErrorKind) {
        self.0[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// (kind, replies) for every kind.
    pub fn counts(&self) -> [(ErrorKind, u64); ErrorKind::ALL.len()] {
        ErrorKind::ALL.map(|k| (k, self.0[k as usize].load(Ordering::Relaxed)))
    }
}
