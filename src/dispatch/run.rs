//! Per-run callback state: the run's target, who asked for the run, and the callbacks now waiting.
//!
//! XLA's FFI handlers carry no run identity, so a run is found through the 8-byte handle the
//! server puts into the program's parameter 0 (see [`super::target`]). Besides the target, each
//! run watches its *requester*: when the process that asked for the run dies, nobody wants the
//! result any more, so every callback waiting in that run is woken and fails ("abandoned"), and
//! any later callback of the run fails at once.
//!
//! The watch is set up lazily, by the first callback of the run: most runs make no callbacks and
//! then cost no monitor traffic at all. It is a registration with the requester's shared
//! [`Watch`](super::watch) (one monitor per requester, however many runs it asks for), handled
//! on the node's runtime, so a `Down` is noticed while every callback of the run is blocked on an
//! XLA thread. Abandoning wakes waiters by sending them an abandon message carrying the
//! callback's reference, which is why waiters register here while they wait.

use super::inspect;
use super::watch::{Registration, Watches};
use crate::node::term::{atom, tuple};
use crate::node::Node;
use crate::schedule::CallingBackRun;
use eetf::{Pid, Reference, Term};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::ThreadId;
use std::time::Duration;

use crate::node::Dest;

/// First element of the message that wakes an abandoned waiter: `{ABANDON, callback_ref}`.
pub(crate) const ABANDON: &str = "$xla_node_callback_abandoned";

/// One run's callback context (shared by the table, the [`super::RunCallbacks`] and the waiters).
pub(crate) struct RunState {
    pub(crate) target: Option<Dest>,
    pub(crate) requester: Pid,
    /// Bound on each callback wait (`None`: `:infinity`).
    pub(crate) timeout: Option<Duration>,
    node: Node,
    inner: Mutex<Inner>,
    /// The thread that opened the run, which is the thread that executes it.
    thread: ThreadId,
    /// The run's passage at the scheduler's gate (a program that calls back), told once, by the
    /// first custom call of the run that runs on that thread.
    calling_back: Mutex<Option<Arc<CallingBackRun>>>,
}

#[derive(Default)]
struct Inner {
    /// Why the run's callbacks are abandoned, once they are.
    closed: Option<String>,
    /// Callbacks waiting now: callback reference -> waiting process.
    pending: HashMap<Reference, Pid>,
    /// The requester watch, once a callback started it.
    watch: Option<Registration>,
}

impl RunState {
    pub(crate) fn new(
        node: Node,
        target: Option<Dest>,
        requester: Pid,
        timeout: Option<Duration>,
        calling_back: Option<Arc<CallingBackRun>>,
    ) -> Self {
        RunState {
            target,
            requester,
            timeout,
            node,
            inner: Mutex::new(Inner::default()),
            thread: std::thread::current().id(),
            calling_back: Mutex::new(calling_back),
        }
    }

    /// A custom call of this run is starting: on the run's own thread, which XLA's CPU client
    /// only does inside `Execute` for a program it executes on the calling thread, that tells the
    /// scheduler's gate the program executes there (see `crate::schedule::Gate`).
    pub(crate) fn note_call(&self) {
        if std::thread::current().id() != self.thread {
            return;
        }
        let calling_back = self
            .calling_back
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(calling_back) = calling_back {
            calling_back.called_back_on_run_thread();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why this run's callbacks fail at once, if they do.
    pub(crate) fn closed(&self) -> Option<String> {
        self.lock().closed.clone()
    }

    /// Starts monitoring the requester (once per run).
    pub(crate) fn ensure_watch(self: &Arc<Self>, watches: &Watches) {
        if self.lock().watch.is_some() {
            return;
        }
        let weak: Weak<RunState> = Arc::downgrade(self);
        let requester = self.requester.clone();
        let abandon = move |reason: &Term| {
            if let Some(run) = weak.upgrade() {
                run.abandon(requester_exited(&requester, reason));
            }
        };
        // Registered outside the run's lock: a requester already down abandons the run at once.
        match watches.register(&Dest::Pid(self.requester.clone()), abandon) {
            Ok(registration) => {
                let mut inner = self.lock();
                if inner.watch.is_none() && inner.closed.is_none() {
                    inner.watch = Some(registration);
                }
            }
            Err(reason) => self.abandon(requester_exited(&self.requester, &reason)),
        }
    }

    /// Registers a waiting callback; fails with the reason if the run's callbacks are abandoned.
    pub(crate) fn register(&self, cref: &Reference, waiter: &Pid) -> Result<(), String> {
        let mut inner = self.lock();
        if let Some(reason) = &inner.closed {
            return Err(reason.clone());
        }
        inner.pending.insert(cref.clone(), waiter.clone());
        Ok(())
    }

    pub(crate) fn unregister(&self, cref: &Reference) {
        self.lock().pending.remove(cref);
    }

    /// Abandons the run's callbacks: wakes every waiter and fails later callbacks with `reason`.
    pub(crate) fn abandon(&self, reason: String) {
        let pending: Vec<(Reference, Pid)> = {
            let mut inner = self.lock();
            if inner.closed.is_some() {
                return;
            }
            inner.closed = Some(reason);
            inner.pending.drain().collect()
        };
        for (cref, waiter) in pending {
            let wake = tuple(vec![atom(ABANDON), Term::from(cref)]);
            self.node.send(&waiter, Dest::Pid(waiter.clone()), wake);
        }
    }

    /// The run is over: abandon what still waits and stop watching the requester.
    pub(crate) fn close(&self) {
        self.abandon("the run is over (its callback context was closed)".to_string());
        // Dropped outside the run's lock: a firing watch takes its own lock, then this run's.
        let registration = self.lock().watch.take();
        drop(registration);
    }
}

/// Why a run's callbacks are abandoned when its requester exits.
fn requester_exited(requester: &Pid, reason: &Term) -> String {
    format!(
        "the process that asked for the run, {} on node {}, exited: {}",
        inspect::pid(requester),
        requester.node.name,
        inspect::reason(reason)
    )
}
