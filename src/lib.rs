//! xla_node: a hidden Erlang node that hosts an XLA executor and calls back into the cluster.

mod claim;
pub mod dispatch;
pub mod node;
pub mod server;
pub mod tensor_term;
mod typical;
pub mod xla;
