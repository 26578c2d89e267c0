//! Where a run waits, and why: read this first to follow a run from the `:xla` server's task to
//! its reply. [`Scheduler`] is the one type that decides it; everything a run waits for on its way
//! is here or named here.
//!
//! One run (`GenServer.call({:xla, node}, {:run, exe, args, opts})`), in order:
//!
//! 1. **Checked on the server's task** (`server/run.rs`): its executable and buffers looked up, its
//!    arguments checked against the parameters (`xla::Run::new`). Nothing waits yet.
//! 2. **Admitted** ([`Scheduler::submit_run`]): it takes a place at once if fewer than
//!    [`MAX_RUNS`] runs execute (and, for a program that calls back, fewer than
//!    [`MAX_CALLING_BACK`] of those call back); otherwise it waits in the node's queue, in arrival
//!    order, until a place frees or its `queue_timeout` fires.
//! 3. **Handed to a thread**: the admitted run goes to the executor's worker pool
//!    (`xla/pool.rs`), whose queue starts a thread whenever none is idle (up to 256, far above
//!    [`MAX_RUNS`]): an admitted run never waits there for a thread, only for one to wake.
//! 4. **At the gate** ([`Place::enter_xla`], `gate.rs`), on its executor thread: it waits for its
//!    turn to enter XLA's line of queued computations, then executes ([`Passage::execute`]).
//! 5. **At its callbacks** (runs that call back): each custom call sends a message and waits for
//!    the reply (`dispatch::wait`); the first on the run's own thread tells the gate
//!    ([`CallingBackRun::called_back_on_run_thread`]), so that runs behind it go on.
//! 6. **Replied to** from its executor thread: once it completed, or, for a run whose results all
//!    stay on the device and that does not call back, once `Execute` has returned
//!    ([`Passage::execute_handing_over`]; the caller's next use of a buffer waits for it). Either
//!    way the run holds its place until it has completed; dropping its [`Place`] then admits the
//!    next queued runs.
//!
//! The rule everything follows: **the network side never waits on XLA.** Connection
//! readers and writers, ticks, `net_kernel`, the `:xla` server's request intake and the delivery
//! of callback replies run as tasks of the node's async runtime; XLA work runs on executor
//! threads, which exist to block. A run that waits for a callback's reply therefore only ever
//! waits for the network side, which never waits for it: no cycle (docs/threading.md).
//!
//! | what | where | why |
//! |---|---|---|
//! | parsing a request, looking up references, checking arguments | the `:xla` server's task | no XLA call: `:ping` and `:info` are answered whatever runs do |
//! | compile, `to_device`, `read`, dropping freed resources | an executor thread, at once | every PJRT call may block (a buffer waits for the run that defines it) |
//! | a run, when admitted | an executor thread | `Execute` runs a small program on the calling thread, custom calls included, and those wait for callback replies; a large one returns at once but its completion event waits for XLA's threads; the 33rd `Execute` in flight on a device blocks until one ends |
//! | a run beyond [`MAX_RUNS`], or a run that calls back beyond [`MAX_CALLING_BACK`] | the node's queue, in arrival order; `:info` counts it in `runs_queued` | XLA's CPU client holds 32 computations in flight per device and blocks the next `Execute`; below that bound no thread ever waits inside XLA for a place, and runs without callbacks always find one of the places runs that call back cannot take |
//! | an admitted run, before `Execute` | the [`Gate`] (`gate.rs`), on its executor thread: [`Place::enter_xla`] | XLA's CPU client executes queued computations one after another, client-wide; a run that calls back must not hold that line while it waits for a reply |
//! | a queued run still waiting after its `queue_timeout` | answered `{:error, {:timeout, text}}` | a run never hangs; the timer is the runtime's, which never waits on XLA |
//! | a callback's wait for its reply | the thread XLA runs the custom call on (an executor thread or one of XLA's) | it polls for `--callback-spin-us` when the target usually answers within that, on one of half the CPUs at most (`dispatch::polling`: a parked thread is slow to wake on a VM whose idle CPUs halt), then parks with a deadline of its own (see `dispatch::wait`) |
//!
//! Every run counts from admission until it has completed and its reply is sent, which is after
//! XLA is done with it,
//! so the node's count of runs in flight is never below XLA's: an admitted `Execute` never waits
//! for a place.
//!
//! Files: this one (admission, the hand-over, [`Place`]), `gate` (the last wait before
//! `Execute`), `callback_activity` (whether idle executor threads may poll for their next job),
//! `run_probe` (where a run's time goes, with `XLA_NODE_RUN_TRACE=1`).

mod callback_activity;
mod gate;
pub mod run_probe;

pub use callback_activity::CallbackActivity;
pub use gate::{CallingBackRun, Gate, QueueableRun};

use crate::node::Node;
use crate::xla::{Buffer, Executor, Run, XlaError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Runs executing at once. All runs execute on the client's first device, where XLA's CPU
/// client blocks the 33rd computation in flight.
pub const MAX_RUNS: usize = 28;

/// Runs of programs that call back executing at once: each may hold its place for as long as
/// its callbacks take, so they may not take every place.
pub const MAX_CALLING_BACK: usize = 24;

/// What the scheduler holds now, for `:info` and the watchdog.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunCounts {
    /// Runs admitted and not yet answered.
    pub running: usize,
    /// Of those, runs of programs that call back.
    pub running_calling_back: usize,
    /// Runs waiting for a place.
    pub queued: usize,
    /// Runs that waited for a place longer than their `queue_timeout` (since the node started).
    pub queue_timeouts: u64,
}

/// Answers a queued run that timed out, with the error text.
pub type TimedOut = Box<dyn FnOnce(String) + Send + 'static>;

/// An admitted run's work, on its executor thread: it passes the gate through its [`Place`].
pub type RunJob = Box<dyn FnOnce(&Place) + Send + 'static>;

struct Queued {
    id: u64,
    job: RunJob,
    timed_out: TimedOut,
}

#[derive(Default)]
struct State {
    running: usize,
    running_calling_back: usize,
    /// Runs of programs without callbacks, and with, waiting for a place.
    plain: VecDeque<Queued>,
    calling_back: VecDeque<Queued>,
    next_id: u64,
    queue_timeouts: u64,
}

impl State {
    fn admits(&self, calls_back: bool) -> bool {
        self.running < MAX_RUNS && (!calls_back || self.running_calling_back < MAX_CALLING_BACK)
    }

    fn start(&mut self, calls_back: bool) {
        self.running += 1;
        self.running_calling_back += usize::from(calls_back);
    }

    /// The longest-waiting queued run that may start now, taken off its queue and counted.
    fn next_admitted(&mut self) -> Option<(bool, RunJob)> {
        let plain = self.plain.front().filter(|_| self.admits(false));
        let calling_back = self.calling_back.front().filter(|_| self.admits(true));
        let calls_back = match (plain, calling_back) {
            (None, None) => return None,
            (Some(p), Some(c)) => c.id < p.id,
            (None, Some(_)) => true,
            (Some(_), None) => false,
        };
        let queue = if calls_back {
            &mut self.calling_back
        } else {
            &mut self.plain
        };
        let run = queue.pop_front()?;
        self.start(calls_back);
        Some((calls_back, run.job))
    }
}

/// Admits runs to the executor's threads within the bounds above, queues the rest.
pub struct Scheduler {
    executor: Executor,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    /// Keeps runs that call back out of XLA's line of queued computations.
    gate: Arc<Gate>,
    calling_back: Arc<CallbackActivity>,
    /// Whose busy wait a run holds while XLA's threads compute its program.
    node: Node,
}

impl Scheduler {
    /// A scheduler whose queue timers run on `node`'s runtime, which records in `calling_back`
    /// when runs that call back execute, and holds `node`'s busy wait while XLA's threads
    /// compute a run's program ([`Node::hold_busy_wait`]).
    pub fn new(
        executor: Executor,
        node: Node,
        calling_back: Arc<CallbackActivity>,
    ) -> Arc<Scheduler> {
        Arc::new(Scheduler {
            executor,
            runtime: node.runtime().clone(),
            state: Mutex::default(),
            gate: Arc::default(),
            calling_back,
            node,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Work other than runs (compile, transfers, dropping resources): on an executor thread at
    /// once. Never blocks.
    pub fn spawn(&self, job: crate::xla::Job) {
        self.executor.submit(job);
    }

    /// Runs `job` on an executor thread as soon as the bounds admit it, handing it its
    /// [`Place`]. If it is still queued after `queue_timeout` (`None`: no limit), it is dropped
    /// and `timed_out` is called instead, on the runtime. Never blocks.
    pub fn submit_run(
        self: &Arc<Self>,
        calls_back: bool,
        queue_timeout: Option<Duration>,
        job: RunJob,
        timed_out: TimedOut,
    ) {
        let mut state = self.lock();
        if state.admits(calls_back) {
            state.start(calls_back);
            drop(state);
            return self.execute(calls_back, job);
        }
        let id = state.next_id;
        state.next_id += 1;
        let queue = if calls_back {
            &mut state.calling_back
        } else {
            &mut state.plain
        };
        queue.push_back(Queued { id, job, timed_out });
        drop(state);
        if let Some(timeout) = queue_timeout {
            let this = self.clone();
            self.runtime.spawn(async move {
                tokio::time::sleep(timeout).await;
                this.expire(calls_back, id, timeout);
            });
        }
    }

    /// Hands an admitted run to an executor thread; its place is given back when it ends (also
    /// if it panics).
    fn execute(self: &Arc<Self>, calls_back: bool, job: RunJob) {
        if calls_back {
            self.calling_back.started();
        }
        let place = Place {
            scheduler: self.clone(),
            calls_back,
        };
        self.executor.submit(Box::new(move || job(&place)));
    }

    /// A run ended: starts the queued runs its place admits.
    fn finished(self: &Arc<Self>, calls_back: bool) {
        if calls_back {
            self.calling_back.ended();
        }
        let mut state = self.lock();
        state.running -= 1;
        state.running_calling_back -= usize::from(calls_back);
        let mut admitted = Vec::new();
        while let Some(next) = state.next_admitted() {
            admitted.push(next);
        }
        drop(state);
        for (calls_back, job) in admitted {
            self.execute(calls_back, job);
        }
    }

    /// A queued run's timer fired: fails it if it is still queued.
    fn expire(&self, calls_back: bool, id: u64, timeout: Duration) {
        let mut state = self.lock();
        let queue = if calls_back {
            &mut state.calling_back
        } else {
            &mut state.plain
        };
        let Some(position) = queue.iter().position(|r| r.id == id) else {
            return; // it started
        };
        let run = queue.remove(position).expect("position is in the queue");
        state.queue_timeouts += 1;
        let text = format!(
            "the run could not start within its queue_timeout of {} ms: {} runs were executing \
             ({} of them programs that call back; at most {MAX_RUNS} and {MAX_CALLING_BACK} \
             execute at once) and {} more were queued",
            timeout.as_millis(),
            state.running,
            state.running_calling_back,
            state.plain.len() + state.calling_back.len()
        );
        drop(state);
        (run.timed_out)(text);
    }

    pub fn counts(&self) -> RunCounts {
        let state = self.lock();
        RunCounts {
            running: state.running,
            running_calling_back: state.running_calling_back,
            queued: state.plain.len() + state.calling_back.len(),
            queue_timeouts: state.queue_timeouts,
        }
    }
}

/// An admitted run's place, held on its executor thread; dropping it gives the place back.
pub struct Place {
    scheduler: Arc<Scheduler>,
    calls_back: bool,
}

impl Place {
    /// Waits (on this executor thread) for the run's turn at XLA's line of queued computations
    /// (see [`Gate`]); the run executes through the returned passage.
    pub fn enter_xla(&self) -> Passage<'_> {
        let gate = &self.scheduler.gate;
        if self.calls_back {
            Passage::CallingBack(gate.run_calling_back())
        } else {
            Passage::WithoutCallbacks(gate.run_without_callbacks(), &self.scheduler.node)
        }
    }
}

/// A run past the gate, about to execute.
pub enum Passage<'a> {
    /// A run without callbacks: its window at the gate lasts until it is executed. While XLA's
    /// threads compute it, it holds the node's busy wait: they keep the CPUs awake, and a
    /// spinning thread would only take time from them.
    WithoutCallbacks(QueueableRun<'a>, &'a Node),
    /// A run that calls back: the dispatcher reports its first custom call on the run's own
    /// thread to it.
    CallingBack(Arc<CallingBackRun>),
}

impl Passage<'_> {
    /// What the run's callback context reports to, for a run that calls back.
    pub fn calling_back(&self) -> Option<Arc<CallingBackRun>> {
        match self {
            Passage::CallingBack(run) => Some(run.clone()),
            Passage::WithoutCallbacks(..) => None,
        }
    }

    /// Executes `run` and leaves the gate: XLA's `Execute`, then the wait for its results.
    pub fn execute(self, run: &Run) -> Result<Vec<Buffer>, XlaError> {
        match self {
            Passage::CallingBack(gated) => {
                let outputs = run.execute_observed(&mut |completed| {
                    run_probe::mark(run_probe::Step::Launched);
                    gated.launched(completed);
                });
                gated.finished();
                run_probe::mark(run_probe::Step::Completed);
                outputs
            }
            Passage::WithoutCallbacks(_window, node) => {
                let mut held = early_hold(run, node);
                let outputs = run.execute_observed(&mut |completed| {
                    run_probe::mark(run_probe::Step::Launched);
                    held = (!completed).then(|| node.hold_busy_wait());
                });
                drop(held);
                run_probe::mark(run_probe::Step::Completed);
                outputs
            }
        }
    }

    /// [`Passage::execute`], handing the results over as soon as XLA's `Execute` has returned
    /// ([`Run::execute_handing_over`]) for a run without callbacks; a run that calls back hands
    /// them over once complete, so that its callbacks are over before its caller hears of it.
    /// Either way the run leaves the gate, and gives its place back, only once complete: the
    /// node's count of runs in flight never falls below XLA's.
    pub fn execute_handing_over(
        self,
        run: &Run,
        hand_over: &mut dyn FnMut(Vec<Buffer>),
    ) -> Result<(), XlaError> {
        match self {
            Passage::WithoutCallbacks(_window, node) => {
                let mut held = early_hold(run, node);
                let completed = run.execute_handing_over(
                    &mut |completed| {
                        run_probe::mark(run_probe::Step::Launched);
                        held = (!completed).then(|| node.hold_busy_wait());
                    },
                    hand_over,
                );
                drop(held);
                run_probe::mark(run_probe::Step::Completed);
                completed
            }
            calling_back => {
                hand_over(calling_back.execute(run)?);
                Ok(())
            }
        }
    }
}

/// A run over several devices holds the busy wait from before its launch: each partition it
/// launches wakes XLA's threads, and a spinner competes with the first partitions while the
/// last are launched. A single-device run takes it only once XLA has queued it: a program XLA
/// executes within `Execute` would pay for a wake-up of the spinner afterwards.
fn early_hold(run: &Run, node: &Node) -> Option<crate::node::busy_wait::BusyHold> {
    (run.device_count() > 1).then(|| node.hold_busy_wait())
}

impl Drop for Place {
    fn drop(&mut self) {
        self.scheduler.finished(self.calls_back);
    }
}
