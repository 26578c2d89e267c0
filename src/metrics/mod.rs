//! How the node measures itself for operators: the lock-free [`Histogram`] that runs, compiles
//! and callbacks are timed with, and the HTTP [`endpoint`] that serves `GET /metrics` when the
//! node is started with `--metrics-addr`.
//!
//! The metric families themselves are read, at each scrape, from the counters the node keeps
//! anyway and `:info` reports (see `server::metrics`): one source per figure, nothing counted
//! twice.

pub mod endpoint;
pub mod histogram;

pub use histogram::{Histogram, Snapshot};
