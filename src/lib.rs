//! xla_node: a hidden Erlang node that hosts an XLA executor and calls back into the cluster.

pub mod dispatch;
pub mod node;
pub mod server;
pub mod tensor_term;
pub mod xla;
