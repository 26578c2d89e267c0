//! Sending a request to a callback target and waiting for its reply, without ever hanging.
//!
//! The waiting side is a process of this node (a *waiter*), so the reply is a plain Erlang
//! `send(pid, {ref, reply})` that the node's network tasks put into the waiter's mailbox: no XLA
//! thread is needed to receive it. The XLA thread running the custom call first polls that mailbox
//! for a short while (the node's `--callback-spin-us`) if the target usually answers within it,
//! then parks on it with [`Process::recv_blocking_until`]. That thread is an executor thread or
//! one of XLA's, never a thread of the node's runtime (see `server::schedule`), and the wait's
//! deadline is the parked thread's own, so it holds whatever the runtime is doing.
//!
//! Each wait:
//! 1. registers with the target's shared monitor (see [`super::watch`]): a `Down` (exit,
//!    `noproc`, `noconnection`) wakes the waiter with [`TARGET_DOWN`] and fails the call at once,
//!    naming the process, its node and the reason;
//! 2. uses a fresh reference per callback: a reply that arrives after its callback gave up
//!    carries an old reference and is discarded by whichever later wait finds it;
//! 3. is bounded by the run's timeout;
//! 4. registers with its run, whose requester watch wakes it when the requester dies.
//!
//! Waiters are pooled (creating a process costs a table insert, but a pool also keeps pids
//! stable for the node's process table). Stale messages left in a pooled waiter's mailbox are
//! skipped by the next wait.

use super::inspect;
use super::polling::ReplyPolling;
use super::run::{RunState, ABANDON};
use super::watch::Watches;
use super::{Counters, Outcome};
use crate::node::probe::{self, Step};
use crate::node::term::{as_atom, atom, tuple};
use crate::node::{Dest, Node, Process, Signal};
use eetf::{Reference, Term};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Idle waiters kept for reuse.
const POOL_MAX: usize = 64;

/// First element of the message that wakes a waiter whose target went down:
/// `{TARGET_DOWN, callback_ref, reason}`.
const TARGET_DOWN: &str = "$xla_node_callback_target_down";

/// Why a callback failed; the text is what the run fails with.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// No reply within the timeout.
    TimedOut(String),
    /// The target is not alive, exited or is unreachable.
    TargetDown(String),
    /// The run gave up on the callback, or the node is shutting down.
    Abandoned(String),
    /// The reply came, and was an error or not what the program needs.
    Refused(String),
}

impl WaitError {
    pub(crate) fn into_message(self) -> String {
        match self {
            WaitError::TimedOut(m)
            | WaitError::TargetDown(m)
            | WaitError::Abandoned(m)
            | WaitError::Refused(m) => m,
        }
    }
}

/// How a callback that ended with `result` is counted.
fn outcome<R>(result: &Result<R, WaitError>) -> Outcome {
    match result {
        Ok(_) => Outcome::Ok,
        Err(WaitError::Refused(_)) => Outcome::Error,
        Err(WaitError::TimedOut(_)) => Outcome::Timeout,
        Err(WaitError::TargetDown(_)) => Outcome::TargetDown,
        Err(WaitError::Abandoned(_)) => Outcome::Abandoned,
    }
}

/// One callback, as its handler describes it.
pub(crate) struct Call<'a> {
    pub dest: &'a Dest,
    /// The run it belongs to, when the program names a run handle.
    pub run: Option<&'a Arc<RunState>>,
    /// How long it waits for the reply (`None`: no limit, `:infinity`).
    pub timeout: Option<Duration>,
    /// Names the call in error texts ("callback :add_one").
    pub what: &'a str,
}

/// The pool of waiting processes.
pub(crate) struct Waiters {
    node: Node,
    watches: Arc<Watches>,
    idle: Mutex<Vec<Process>>,
    /// Whether, and how long, a waiting thread polls for its reply before it parks.
    polling: ReplyPolling,
}

impl Waiters {
    pub(crate) fn new(node: Node, watches: Arc<Watches>, spin: Duration) -> Self {
        Waiters {
            watches,
            idle: Mutex::new(Vec::new()),
            polling: ReplyPolling::new(spin, node.busy_threads().clone()),
            node,
        }
    }

    fn take(&self) -> Process {
        let popped = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        popped.unwrap_or_else(|| self.node.spawn_process())
    }

    fn put(&self, p: Process) {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < POOL_MAX {
            idle.push(p);
        }
    }

    /// Sends `build(reply_tag)` to the call's target (reply_tag = `{waiter_pid, ref}`), waits
    /// for `{ref, reply}`, and returns what `accept` makes of `reply`. Every callback is counted
    /// here, once, by how it ended.
    pub(crate) fn call<R>(
        &self,
        call: Call<'_>,
        counters: &Counters,
        build: impl FnOnce(Term) -> Term,
        accept: impl FnOnce(Term) -> Result<R, String>,
    ) -> Result<R, WaitError> {
        let result = self
            .exchange(&call, counters, build)
            .and_then(|reply| accept(reply).map_err(WaitError::Refused));
        counters.ended(outcome(&result));
        result
    }

    /// Sends the request and waits for its reply.
    fn exchange(
        &self,
        call: &Call<'_>,
        counters: &Counters,
        build: impl FnOnce(Term) -> Term,
    ) -> Result<Term, WaitError> {
        let Call {
            dest,
            run,
            timeout,
            what,
        } = *call;
        if let Some(run) = run {
            if let Some(reason) = run.closed() {
                return Err(WaitError::Abandoned(format!("{what} abandoned: {reason}")));
            }
            run.ensure_watch(&self.watches);
        }
        let mut waiter = self.take();
        let cref = self.node.make_ref();
        if let Some(run) = run {
            if let Err(reason) = run.register(&cref, waiter.pid()) {
                self.put(waiter);
                return Err(WaitError::Abandoned(format!("{what} abandoned: {reason}")));
            }
        }
        let local = self.node.name();
        let (node, pid, wake_ref) = (self.node.clone(), waiter.pid().clone(), cref.clone());
        let registration = self.watches.register(dest, move |reason| {
            let wake = tuple(vec![
                atom(TARGET_DOWN),
                Term::from(wake_ref),
                reason.clone(),
            ]);
            node.send(&pid, Dest::Pid(pid.clone()), wake);
        });
        let registration = match registration {
            Ok(r) => r,
            Err(reason) => {
                if let Some(run) = run {
                    run.unregister(&cref);
                }
                self.put(waiter);
                return Err(WaitError::TargetDown(down_text(dest, local, &reason, what)));
            }
        };
        counters.pending.fetch_add(1, Ordering::Relaxed);
        probe::mark(Step::Registered);
        let tag = tuple(vec![
            Term::from(waiter.pid().clone()),
            Term::from(cref.clone()),
        ]);
        let request = build(tag);
        probe::mark(Step::Built);
        probe::waiting_in(waiter.pid());
        // The request's write counts as waiting: it is the network's time, not the program's.
        let waiting = Instant::now();
        waiter.send(dest.clone(), request);
        probe::mark(Step::Written);
        counters.sent.fetch_add(1, Ordering::Relaxed);

        let poll = self.polling.window(registration.typical_reply().get());
        let result = self.wait(&mut waiter, dest, &cref, run, timeout, poll, what);
        probe::mark(Step::Woken);
        probe::stopped_waiting(waiter.pid());
        let waited = waiting.elapsed();
        if result.is_ok() {
            registration.typical_reply().record(waited);
            counters.round_trip.record(waited);
        }

        drop(registration);
        if let Some(run) = run {
            run.unregister(&cref);
        }
        counters.pending.fetch_sub(1, Ordering::Relaxed);
        self.put(waiter);
        result
    }

    /// Polls the waiter's mailbox until `until`, yielding the CPU between polls, if one of the
    /// few polling places is free (see [`ReplyPolling`]).
    fn spin_for_signal(&self, waiter: &mut Process, until: Instant) -> Option<Signal> {
        if Instant::now() >= until {
            return None;
        }
        let _place = self.polling.place()?;
        loop {
            if let Some(signal) = waiter.try_recv() {
                return Some(signal);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::yield_now();
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn wait(
        &self,
        waiter: &mut Process,
        dest: &Dest,
        cref: &Reference,
        run: Option<&Arc<RunState>>,
        timeout: Option<Duration>,
        poll: Duration,
        what: &str,
    ) -> Result<Term, WaitError> {
        let local = self.node.name();
        let started = Instant::now();
        let deadline = timeout.map(|timeout| started + timeout);
        let poll_until = started + timeout.map_or(poll, |timeout| poll.min(timeout));
        loop {
            let passed = deadline.is_some_and(|deadline| Instant::now() >= deadline);
            let Some(signal) = (if passed {
                None
            } else {
                self.spin_for_signal(waiter, poll_until)
                    .or_else(|| waiter.recv_blocking_until(deadline))
            }) else {
                let (Some(timeout), Some(deadline)) = (timeout, deadline) else {
                    return Err(shutting_down(what));
                };
                if Instant::now() < deadline {
                    return Err(shutting_down(what));
                }
                return Err(WaitError::TimedOut(format!(
                    "callback timed out after {} ms waiting for {} to answer {what}",
                    timeout.as_millis(),
                    inspect::dest(dest, local)
                )));
            };
            match signal {
                Signal::Message(Term::Tuple(t)) if t.elements.len() == 2 => {
                    let mut e = t.elements;
                    match &e[0] {
                        Term::Reference(r) if **r == *cref => return Ok(e.swap_remove(1)),
                        Term::Atom(a) if a.name == ABANDON => {
                            if matches!(&e[1], Term::Reference(r) if **r == *cref) {
                                let reason = run
                                    .and_then(|r| r.closed())
                                    .unwrap_or_else(|| "the run was abandoned".to_string());
                                return Err(WaitError::Abandoned(format!(
                                    "{what} abandoned: {reason}"
                                )));
                            }
                        }
                        _ => {} // a stale reply or something else: not ours
                    }
                }
                Signal::Message(Term::Tuple(t))
                    if t.elements.len() == 3
                        && as_atom(&t.elements[0]) == Some(TARGET_DOWN)
                        && matches!(&t.elements[1], Term::Reference(r) if **r == *cref) =>
                {
                    return Err(WaitError::TargetDown(down_text(
                        dest,
                        local,
                        &t.elements[2],
                        what,
                    )));
                }
                _ => {} // stale wake-ups, stray messages, exit signals (waiters are not linked)
            }
        }
    }
}

/// The error text for a target that went down while (or before) we waited.
fn down_text(dest: &Dest, local: &str, reason: &Term, what: &str) -> String {
    let who = inspect::dest(dest, local);
    let node = dest.node(local);
    let body = match as_atom(reason) {
        Some("noproc") => match dest {
            Dest::Pid(_) => format!("callback process {who} is not alive (noproc)"),
            _ => format!("callback process {who} is not registered (noproc)"),
        },
        Some("noconnection") => format!(
            "callback process {who} is unreachable: node {node} is down or disconnected (noconnection)"
        ),
        _ => format!(
            "callback process {who} exited: {}",
            inspect::reason(reason)
        ),
    };
    format!("{body} (while waiting for the reply to {what})")
}

/// A wait that ended because the node shuts down (its mailbox closed).
fn shutting_down(what: &str) -> WaitError {
    WaitError::Abandoned(format!("{what} failed: the node is shutting down"))
}
