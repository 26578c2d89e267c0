//! Where and when XLA work executes: the node's one scheduling policy.
//!
//! The rule everything below follows: **the network side never waits on XLA.** Connection
//! readers and writers, ticks, `net_kernel`, the `:xla` server's request intake and the delivery
//! of callback replies run as tasks of the node's async runtime; XLA work runs on executor
//! threads, which exist to block. A run that waits for a callback's reply therefore only ever
//! waits for the network side, which never waits for it: no cycle.
//!
//! | what | where | why |
//! |---|---|---|
//! | parsing a request, looking up references, checking arguments | the `:xla` server's task | no XLA call: `:ping` and `:info` are answered whatever runs do |
//! | compile, `to_device`, `read`, dropping freed resources | an executor thread, at once | every PJRT call may block (a buffer waits for the run that defines it) |
//! | a run, when admitted | an executor thread | `Execute` runs a small program on the calling thread, custom calls included, and those wait for callback replies; a large one returns at once but its completion event waits for XLA's threads; the 33rd `Execute` in flight on a device blocks until one ends |
//! | a run beyond [`MAX_RUNS`], or a run that calls back beyond [`MAX_CALLING_BACK`] | the node's queue, in arrival order; `:info` counts it in `runs_queued` | XLA's CPU client holds 32 computations in flight per device and blocks the next `Execute`; below that bound no thread ever waits inside XLA for a place, and runs without callbacks always find one of the places runs that call back cannot take |
//! | an admitted run, before `Execute` | the [`Gate`], on its executor thread | XLA's CPU client executes queued computations one after another, client-wide; a run that calls back must not hold that line while it waits for a reply |
//! | a queued run still waiting after its `queue_timeout` | answered `{:error, {:timeout, text}}` | a run never hangs; the timer is the runtime's, which never waits on XLA |
//! | a callback's wait for its reply | the thread XLA runs the custom call on (an executor thread or one of XLA's) | it polls for `--callback-spin-us` when the target usually answers within that, on one of half the CPUs at most (`dispatch::polling`: a parked thread is slow to wake on a VM whose idle CPUs halt), then parks with a deadline of its own (see `dispatch::wait`) |
//!
//! Every run counts from admission until its reply is sent, which is after XLA is done with it,
//! so the node's count of runs in flight is never below XLA's: an admitted `Execute` never waits
//! for a place.

use crate::xla::{Executor, Job};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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

struct Queued {
    id: u64,
    job: Job,
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
    fn next_admitted(&mut self) -> Option<(bool, Job)> {
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

/// How long after the last run that called back idle executor threads may poll again.
const CALLBACK_QUIET: Duration = Duration::from_millis(10);

/// Whether runs of programs that call back are executing, or did lately: idle executor threads
/// poll for their next job (`xla::executor`'s idle polling) only when none has for
/// [`CALLBACK_QUIET`]. Polling makes a tiny run faster but a run that calls back slower (its
/// waiting thread's wake-up and the network both slow down on a small machine), even with the
/// polling stopped while a callback waits; figures in docs/performance.md.
#[derive(Debug)]
pub struct CallbackActivity {
    epoch: Instant,
    running: AtomicUsize,
    /// When the last one ended, in nanoseconds after `epoch`.
    last_end: AtomicU64,
}

impl Default for CallbackActivity {
    fn default() -> Self {
        CallbackActivity {
            epoch: Instant::now(),
            running: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
        }
    }
}

impl CallbackActivity {
    /// True when no run that calls back executes and none ended within [`CALLBACK_QUIET`]
    /// (nor ever, for a node that has run none).
    pub fn quiet(&self) -> bool {
        if self.running.load(Ordering::Relaxed) > 0 {
            return false;
        }
        let last = self.last_end.load(Ordering::Relaxed);
        last == 0 || self.now().saturating_sub(last) >= CALLBACK_QUIET.as_nanos() as u64
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn started(&self) {
        self.running.fetch_add(1, Ordering::Relaxed);
    }

    fn ended(&self) {
        self.last_end.store(self.now().max(1), Ordering::Relaxed);
        self.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Admits runs to the executor's threads within the bounds above, queues the rest.
pub struct Scheduler {
    executor: Executor,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    /// Keeps runs that call back out of XLA's line of queued computations.
    pub gate: Arc<Gate>,
    calling_back: Arc<CallbackActivity>,
}

impl Scheduler {
    /// A scheduler whose queue timers run on `runtime`, which records in `calling_back` when
    /// runs that call back execute.
    pub fn new(
        executor: Executor,
        runtime: tokio::runtime::Handle,
        calling_back: Arc<CallbackActivity>,
    ) -> Arc<Scheduler> {
        Arc::new(Scheduler {
            executor,
            runtime,
            state: Mutex::default(),
            gate: Arc::default(),
            calling_back,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Work other than runs (compile, transfers, dropping resources): on an executor thread at
    /// once. Never blocks.
    pub fn spawn(&self, job: Job) {
        self.executor.submit(job);
    }

    /// Runs `job` on an executor thread as soon as the bounds admit it. If it is still queued
    /// after `queue_timeout` (`None`: no limit), it is dropped and `timed_out` is called instead,
    /// on the runtime. Never blocks.
    pub fn submit_run(
        self: &Arc<Self>,
        calls_back: bool,
        queue_timeout: Option<Duration>,
        job: Job,
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
    fn execute(self: &Arc<Self>, calls_back: bool, job: Job) {
        if calls_back {
            self.calling_back.started();
        }
        let place = Place {
            scheduler: self.clone(),
            calls_back,
        };
        self.executor.submit(Box::new(move || {
            let _place = place;
            job();
        }));
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

/// An admitted run's place; dropping it gives the place back.
struct Place {
    scheduler: Arc<Scheduler>,
    calls_back: bool,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.scheduler.finished(self.calls_back);
    }
}

/// Keeps runs that call back out of the line in which XLA's CPU client executes queued
/// computations.
///
/// The client executes a program within `Execute`, on the calling thread, only if the program is
/// cheap (under 1,000 flops) and no computation it queued earlier is still pending; otherwise it
/// queues it, and executes the queued ones one after another, client-wide, in the order they
/// came. A run that calls back and lands in that line holds it for as long as its callbacks wait:
/// every large program after it waits too. So a run that calls back starts only when no run that
/// may be queued is in XLA, and runs without callbacks start only when no run that calls back is
/// between its start and the moment it is known to be executing on its own thread. Both windows
/// last microseconds for the programs they are meant for; turns are taken in arrival order, so
/// neither kind starves the other. Runs that call back and are queued all the same (large ones)
/// are counted as queued runs from then on, which they are.
///
/// All waiting happens on executor threads. A run waits only for windows of runs that already
/// started, which end without any other run's help: no cycle.
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    /// Runs that may be in XLA's line now: runs without callbacks from start to completion, and
    /// runs that call back once XLA queued them.
    queueable: usize,
    /// Runs that call back, started, and not yet known to execute on their own thread.
    starting: usize,
    next_ticket: u64,
    serving: u64,
}

/// Where a run that calls back stands (see [`Gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Starting,
    OnItsThread,
    Queued,
    Done,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for this run's turn and for `clear`, then counts the run in with `enter`.
    fn pass(&self, clear: impl Fn(&GateState) -> bool, enter: impl FnOnce(&mut GateState)) {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        while state.serving != ticket || !clear(&state) {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.serving += 1;
        enter(&mut state);
        drop(state);
        self.changed.notify_all();
    }

    fn update(&self, change: impl FnOnce(&mut GateState)) {
        change(&mut self.lock());
        self.changed.notify_all();
    }

    /// A run without callbacks: its window lasts until the returned guard drops.
    pub fn run_without_callbacks(&self) -> QueueableRun<'_> {
        self.pass(|s| s.starting == 0, |s| s.queueable += 1);
        QueueableRun(self)
    }

    /// A run that calls back: passes once no run may be in XLA's line. Report what is learned
    /// of where it executes on the returned guard.
    pub fn run_calling_back(self: &Arc<Self>) -> Arc<CallingBackRun> {
        self.pass(|s| s.queueable == 0, |s| s.starting += 1);
        Arc::new(CallingBackRun {
            gate: self.clone(),
            phase: Mutex::new(Phase::Starting),
        })
    }
}

/// The window of a run without callbacks; dropping it closes the window.
pub struct QueueableRun<'a>(&'a Gate);

impl Drop for QueueableRun<'_> {
    fn drop(&mut self) {
        self.0.update(|s| s.queueable -= 1);
    }
}

/// A run that calls back, past the gate.
pub struct CallingBackRun {
    gate: Arc<Gate>,
    phase: Mutex<Phase>,
}

impl CallingBackRun {
    fn move_to(&self, next: Phase) {
        let mut phase = self.phase.lock().unwrap_or_else(|p| p.into_inner());
        let from = *phase;
        let moves = match next {
            Phase::OnItsThread | Phase::Queued => from == Phase::Starting,
            Phase::Done => from != Phase::Done,
            Phase::Starting => false,
        };
        if !moves {
            return;
        }
        *phase = next;
        self.gate.update(|s| {
            match from {
                Phase::Starting => s.starting -= 1,
                Phase::Queued => s.queueable -= 1,
                Phase::OnItsThread | Phase::Done => {}
            }
            if next == Phase::Queued {
                s.queueable += 1;
            }
        });
    }

    /// One of the program's custom calls is running on the thread that called `Execute`, which
    /// only happens inside `Execute`: the program executes there, out of XLA's line.
    pub fn called_back_on_run_thread(&self) {
        self.move_to(Phase::OnItsThread);
    }

    /// `Execute` returned; `completed`: the program had already finished (it executed on this
    /// thread), else XLA queued it.
    pub fn launched(&self, completed: bool) {
        self.move_to(if completed {
            Phase::OnItsThread
        } else {
            Phase::Queued
        });
    }

    /// The run is over (also when it failed before `Execute`).
    pub fn finished(&self) {
        self.move_to(Phase::Done);
    }
}

impl Drop for CallingBackRun {
    fn drop(&mut self) {
        self.finished();
    }
}
