//! Error type of the XLA layer.
//!
//! Every failure crossing the PJRT boundary is turned into an [`XlaError`]
//! value; nothing in this module aborts. The variants separate who is at
//! fault: the program text (`Compile`), the caller's arguments (`Argument`,
//! detected *before* calling into XLA because XLA CHECK-fails abort the whole
//! process), the computation itself (`Runtime`, XLA's text unchanged, which
//! includes errors returned by host custom-call handlers) and the plugin /
//! loading machinery (`Plugin`).

/// Errors returned by the XLA layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XlaError {
    /// The program could not be compiled (invalid MLIR, unsupported op, ...).
    #[error("compile error: {0}")]
    Compile(String),
    /// An argument does not match the executable's signature.
    #[error("argument error: {0}")]
    Argument(String),
    /// Execution failed; the text is XLA's (or a host handler's) message.
    #[error("runtime error: {0}")]
    Runtime(String),
    /// The plugin could not be loaded or misbehaved.
    #[error("plugin error: {0}")]
    Plugin(String),
}

impl XlaError {
    /// The message without the variant prefix.
    pub fn message(&self) -> &str {
        match self {
            XlaError::Compile(m)
            | XlaError::Argument(m)
            | XlaError::Runtime(m)
            | XlaError::Plugin(m) => m,
        }
    }
}
