//! xla_node: a hidden Erlang node that hosts an XLA executor and calls back into the cluster.

// `unsafe` is confined to the PJRT bindings and their safe wrappers: only the files of `xla`
// that need it allow it (`#![allow(unsafe_code)]`).
#![deny(unsafe_code)]

pub mod byte_count;
pub mod dispatch;
pub mod metrics;
pub mod node;
pub mod schedule;
pub mod server;
pub mod shutdown;
pub mod tensor_term;
#[cfg(test)]
mod test_support;
pub mod xla;
