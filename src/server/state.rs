//! What the `:xla` server holds: the node it answers from, XLA (the executor and the callback
//! dispatcher), the executables and buffers it handed out, the scheduler that places runs, and
//! the operator's settings.
//!
//! One [`State`] is shared (`Arc`) by the server's task and the executor threads that answer
//! requests; each part is immutable or synchronized on its own. Its methods are what every
//! request family needs: replying, registering and looking up resources, releasing them.

use super::device_budget::DeviceBudget;
use super::error::{ErrorTally, RequestError};
use super::kernels::KernelPolicy;
use super::resources::{Owner, Resource, Resources};
use crate::dispatch::Dispatcher;
use crate::metrics::Histogram;
use crate::node::gen::{self, From};
use crate::node::term::ok;
use crate::node::{Dest, Node};
use crate::schedule::Scheduler;
use crate::xla::{Buffer, Executor};
use eetf::{Pid, Reference, Term};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct State {
    pub node: Node,
    /// The `:xla` server's pid: replies come from it, owner monitors belong to it.
    pub server: Pid,
    pub executor: Executor,
    pub dispatcher: Arc<Dispatcher>,
    pub scheduler: Arc<Scheduler>,
    pub resources: Resources,
    /// `--max-device-bytes`, and the bytes of transfers and runs in flight.
    pub device_budget: DeviceBudget,
    pub runs: RunTally,
    /// How long each compile request took on its executor thread (cache hits included).
    pub compile_time: Histogram,
    /// Error replies sent, by kind.
    pub errors: ErrorTally,
    /// The PJRT plugin's path, for `:info`.
    pub plugin: PathBuf,
    /// How long a run may wait for a place unless it says otherwise (`None`: no limit).
    pub queue_timeout: Option<Duration>,
    /// The operator's kernel settings (`--kernel-dir`, `--kernel-version-shim`).
    pub kernels: KernelPolicy,
}

impl State {
    /// Replies to a call, from the server's pid.
    pub fn reply(&self, from: &From, reply: Term) {
        gen::reply_from(&self.node, &self.server, from, reply);
    }

    /// Replies `{:error, {kind, message}}`, and counts it: every error reply goes through here.
    pub fn reply_error(&self, from: &From, error: &RequestError) {
        self.errors.record(error.kind());
        self.reply(from, error.to_reply());
    }

    /// Replies `{:ok, value}`, or the error.
    pub fn reply_result(&self, from: &From, result: Result<Term, RequestError>) {
        match result {
            Ok(value) => self.reply(from, ok(value)),
            Err(e) => self.reply_error(from, &e),
        }
    }

    /// Stores a new resource for `owner` and returns the reference that names it.
    pub fn register(&self, resource: Resource, owner: &Pid) -> Reference {
        let reference = self.node.make_ref();
        if let Owner::New = self.resources.insert(&reference, resource, owner) {
            let monitor = self.node.monitor(&self.server, Dest::Pid(owner.clone()));
            self.resources.set_monitor(owner, monitor);
        }
        reference
    }

    pub fn lookup(&self, reference: &Reference) -> Result<Resource, RequestError> {
        self.resources.get(reference).ok_or_else(|| {
            RequestError::Argument(format!(
                "unknown or freed reference {}",
                Term::from(reference.clone())
            ))
        })
    }

    pub fn lookup_buffer(&self, reference: &Reference) -> Result<Arc<Buffer>, RequestError> {
        match self.lookup(reference)? {
            Resource::Buffer(b) => Ok(b),
            Resource::Executable(_) => Err(RequestError::Argument(format!(
                "{} is an executable, not a buffer",
                Term::from(reference.clone())
            ))),
        }
    }

    /// Runs `job` on an executor thread at once: work that calls XLA but is not a run (see
    /// `schedule.rs`).
    pub fn spawn(self: &Arc<Self>, job: impl FnOnce(&State) + Send + 'static) {
        let state = self.clone();
        self.scheduler.spawn(Box::new(move || job(&state)));
    }

    /// Drops resources taken out of the table on an executor thread: destroying a buffer or an
    /// executable is a PJRT call, which the server's task never makes.
    pub fn release(&self, resources: Vec<Resource>) {
        if !resources.is_empty() {
            self.scheduler.spawn(Box::new(move || drop(resources)));
        }
    }
}

/// Runs answered, by outcome, and how long they waited and took: `:info`'s `runs`,
/// `run_errors` and `latency_us`, and `/metrics`' `xla_node_runs_total` (queue timeouts are the
/// scheduler's count) and run histograms.
#[derive(Debug, Default)]
pub struct RunTally {
    succeeded: AtomicU64,
    failed: AtomicU64,
    /// From the request's arrival to the run's start on an executor thread.
    pub queue_wait: Histogram,
    /// From the run's start to its results in hand (their copy to the host included).
    pub duration: Histogram,
}

impl RunTally {
    pub fn record(&self, failed: bool) {
        let counter = if failed {
            &self.failed
        } else {
            &self.succeeded
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// A run that arrived at `received` starts now: records its wait, returns its start.
    pub fn started(&self, received: Instant) -> Instant {
        let now = Instant::now();
        self.queue_wait
            .record(now.saturating_duration_since(received));
        now
    }

    /// A run that started at `started` has its results.
    pub fn executed(&self, started: Instant) {
        self.duration.record(started.elapsed());
    }

    /// (runs answered, of which failed).
    pub fn counts(&self) -> (u64, u64) {
        let failed = self.failed.load(Ordering::Relaxed);
        (self.succeeded.load(Ordering::Relaxed) + failed, failed)
    }
}
