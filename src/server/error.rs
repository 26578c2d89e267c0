//! Why a request failed, and the `{:error, {kind, message}}` reply that says so.
//!
//! Every error reply of `:xla` is built here, from a [`RequestError`], so that its kind atoms
//! (the README's list) have one source.

use crate::node::term::error_kind;
use crate::xla::XlaError;
use eetf::Term;

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
