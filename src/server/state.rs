//! What the `:xla` server holds: the node it answers from, XLA (the executor and the callback
//! dispatcher), the executables and buffers it handed out, the scheduler that places runs, and
//! the operator's settings.
//!
//! One [`State`] is shared (`Arc`) by the server's task and the executor threads that answer
//! requests; each part is immutable or synchronized on its own. Its methods are what every
//! request family needs: replying, registering and looking up resources, releasing them.

use super::error::RequestError;
use super::kernels::KernelPolicy;
use super::resources::{Owner, Resource, Resources};
use super::schedule::Scheduler;
use crate::dispatch::Dispatcher;
use crate::node::gen::{self, From};
use crate::node::term::ok;
use crate::node::{Dest, Node};
use crate::xla::{Buffer, Executor};
use eetf::{Pid, Reference, Term};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub struct State {
    pub node: Node,
    /// The `:xla` server's pid: replies come from it, owner monitors belong to it.
    pub server: Pid,
    pub executor: Executor,
    pub dispatcher: Arc<Dispatcher>,
    pub scheduler: Arc<Scheduler>,
    pub resources: Resources,
    pub runs: RunTally,
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

    /// Replies `{:ok, value}`, or the error.
    pub fn reply_result(&self, from: &From, result: Result<Term, RequestError>) {
        self.reply(from, result.map_or_else(|e| e.to_reply(), ok));
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

/// Runs answered, and how many of them failed: `:info`'s `runs` and `run_errors`.
#[derive(Debug, Default)]
pub struct RunTally {
    answered: AtomicU64,
    failed: AtomicU64,
}

impl RunTally {
    pub fn record(&self, failed: bool) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// (runs answered, of which failed).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.answered.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}
