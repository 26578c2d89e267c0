//! Where a run waits, and why: read this first to follow a run from the `:xla` server's task to
//! its reply. [`Scheduler`] is the one type that decides it; everything a run waits for on its way
//! is here or named here.
//!
//! One run (`GenServer.call({:xla, node}, {:run, exe, args, opts})`), in order:
//!
//! 1. **Checked on the server's task** (`server/run.rs`): its executable and buffers looked up, its
//!    arguments checked against the parameters (`xla::Run::new`), its bytes against its client
//!    node's device memory quota. Nothing waits yet.
//! 2. **Admitted** ([`Scheduler::submit_run`]): it takes a place at once if fewer than
//!    [`MAX_RUNS`] runs execute and its lane has room ([`Lane`]: for a program that calls back,
//!    fewer than [`MAX_CALLING_BACK`] of those; for a program that may wait in XLA's line of
//!    queued computations, fewer than [`MAX_IN_LINE`] of those on its device); otherwise it waits
//!    in its client node's queue until a place frees or its `queue_timeout` fires, or is refused
//!    at once (`:overloaded`) when its node already has its `max_queued` runs waiting. A freed
//!    place goes to the client nodes by weighted fair queueing, and within a node by priority,
//!    then arrival (`fair.rs`): a node with runs waiting gets its share whatever another has
//!    queued, and a node with nothing in flight a place at once ([`RESERVED_PLACES`]).
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
//! | a run beyond [`MAX_RUNS`], a run that calls back beyond [`MAX_CALLING_BACK`], a run that may wait in XLA's line beyond [`MAX_IN_LINE`] on its device | its client node's queue (`fair.rs`): weighted fair between nodes, by priority then arrival within one; `:info` counts it in `runs_queued` and in its node's `tenants` entry | XLA's CPU client holds 32 computations in flight per device and blocks the next `Execute`; below that bound no thread ever waits inside XLA for a place, and runs without callbacks always find one of the places runs that call back cannot take. XLA executes queued computations one after another: a run admitted behind 27 others in that line waits for all of them, so the line is kept short and a node's share is a share of it |
//! | a run whose client node has `max_queued` runs waiting already | nowhere: answered `{:error, {:overloaded, text}}` at once | overload is an answer, not a timeout |
//! | an admitted run, before `Execute` | the [`Gate`] (`gate.rs`), on its executor thread: [`Place::enter_xla`] | XLA's CPU client executes queued computations one after another, client-wide; a run that calls back must not hold that line while it waits for a reply |
//! | a queued run still waiting after its `queue_timeout` | answered `{:error, {:timeout, text}}` | a run never hangs; the timer is the runtime's, which never waits on XLA |
//! | a callback's wait for its reply | the thread XLA runs the custom call on (an executor thread or one of XLA's) | it polls for `--callback-spin-us` when the target usually answers within that, on one of half the CPUs at most (`dispatch::polling`: a parked thread is slow to wake on a VM whose idle CPUs halt), then parks with a deadline of its own (see `dispatch::wait`) |
//!
//! Every run counts from admission until it has completed and its reply is sent, which is after
//! XLA is done with it,
//! so the node's count of runs in flight is never below XLA's: an admitted `Execute` never waits
//! for a place.
//!
//! Files: this one (admission, the hand-over, [`Place`]), `fair` (which queued run a freed place
//! goes to), `tenants` (client nodes: the operator's rules and what is counted per node), `gate`
//! (the last wait before `Execute`), `callback_activity` (whether idle executor threads may poll
//! for their next job), `run_probe` (where a run's time goes, with `XLA_NODE_RUN_TRACE=1`).

mod callback_activity;
mod fair;
mod gate;
pub mod run_probe;
pub mod tenants;

pub use callback_activity::CallbackActivity;
pub use fair::Lane;
pub use gate::{CallingBackRun, Gate, QueueableRun};

use crate::node::Node;
use crate::xla::{Buffer, Executor, Run, XlaError};
use fair::FairQueue;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tenants::{Priority, Tenant, Tenants};

/// Runs executing at once, on all devices together: XLA's CPU client blocks the 33rd
/// computation in flight on a device.
pub const MAX_RUNS: usize = 28;

/// Runs of programs that call back executing at once: each may hold its place for as long as
/// its callbacks take, so they may not take every place.
pub const MAX_CALLING_BACK: usize = 24;

/// Places a client node that has runs in flight leaves free, of [`MAX_RUNS`] and of
/// [`MAX_CALLING_BACK`]: a node with nothing in flight never waits for a place while another node
/// holds all the others, however many runs that one keeps queued.
pub const RESERVED_PLACES: usize = 2;

/// Runs of programs that may wait in XLA's line of queued computations ([`Lane::Line`]) admitted
/// at once per device. XLA executes that line one computation after another, so a few keep it
/// busy (one executing, the next ones uploading their arguments); more would only make every run
/// admitted after them wait for all of them, whoever sent it.
pub const MAX_IN_LINE: usize = 4;

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
    /// Runs refused because their client node had its `max_queued` runs waiting.
    pub overloaded: u64,
}

/// Answers a queued run that timed out, with the error text.
pub type TimedOut = Box<dyn FnOnce(String) + Send + 'static>;

/// An admitted run's work, on its executor thread: it passes the gate through its [`Place`],
/// which it gives back by dropping it (at the latest when the job returns).
pub type RunJob = Box<dyn FnOnce(Place) + Send + 'static>;

/// What the scheduler needs to know of a run to place it.
pub struct RunTicket {
    /// Its client node.
    pub tenant: Arc<Tenant>,
    /// Among its node's queued runs.
    pub priority: Priority,
    /// The bound it counts against besides [`MAX_RUNS`].
    pub lane: Lane,
    /// How long it may wait for a place (`None`: no limit).
    pub queue_timeout: Option<Duration>,
}

struct Queued {
    job: RunJob,
    timed_out: TimedOut,
    tenant: Arc<Tenant>,
}

/// The runs admitted, counted against the bounds above.
#[derive(Default)]
struct Admitted {
    running: usize,
    running_calling_back: usize,
    /// Runs of [`Lane::Line`], by device.
    in_line: Vec<usize>,
}

impl Admitted {
    /// Whether a run of `tenant` in `lane` may start now. A node with runs in flight leaves
    /// [`RESERVED_PLACES`] places (and as many of those for runs that call back) to the nodes
    /// with none.
    fn admits(&self, lane: Lane, tenant: &Tenant) -> bool {
        let reserved = match tenant.running.load(Ordering::Relaxed) {
            0 => 0,
            _ => RESERVED_PLACES,
        };
        self.running + reserved < MAX_RUNS
            && match lane {
                Lane::Inline => true,
                Lane::CallingBack => self.running_calling_back + reserved < MAX_CALLING_BACK,
                Lane::Line(device) => self.in_line.get(device).copied().unwrap_or(0) < MAX_IN_LINE,
            }
    }

    fn start(&mut self, lane: Lane, tenant: &Tenant) {
        self.running += 1;
        match lane {
            Lane::Inline => {}
            Lane::CallingBack => self.running_calling_back += 1,
            Lane::Line(device) => {
                if self.in_line.len() <= device {
                    self.in_line.resize(device + 1, 0);
                }
                self.in_line[device] += 1;
            }
        }
        tenant.running.fetch_add(1, Ordering::Relaxed);
    }

    fn finish(&mut self, lane: Lane, tenant: &Tenant) {
        self.running -= 1;
        match lane {
            Lane::Inline => {}
            Lane::CallingBack => self.running_calling_back -= 1,
            Lane::Line(device) => self.in_line[device] -= 1,
        }
        tenant.running.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct State {
    admitted: Admitted,
    queue: FairQueue<Queued>,
    queue_timeouts: u64,
    overloaded: u64,
}

impl State {
    /// The next queued run that may start now, taken off its queue and counted.
    fn next_admitted(&mut self) -> Option<(Lane, RunJob, Arc<Tenant>)> {
        let admitted = &self.admitted;
        let next = self
            .queue
            .pop(|lane, queued: &Queued| admitted.admits(lane, &queued.tenant))?;
        let Queued { job, tenant, .. } = next.item;
        tenant.queued.fetch_sub(1, Ordering::Relaxed);
        self.admitted.start(next.lane, &tenant);
        Some((next.lane, job, tenant))
    }
}

/// Admits runs to the executor's threads within the bounds above, queues the rest by client node.
pub struct Scheduler {
    executor: Executor,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    /// Keeps runs that call back out of XLA's line of queued computations.
    gate: Arc<Gate>,
    calling_back: Arc<CallbackActivity>,
    tenants: Tenants,
    /// Whose busy wait a run holds while XLA's threads compute its program.
    node: Node,
}

impl Scheduler {
    /// A scheduler whose queue timers run on `node`'s runtime, which records in `calling_back`
    /// when runs that call back execute, gives client nodes what `tenants`' rules say, and holds
    /// `node`'s busy wait while XLA's threads compute a run's program
    /// ([`Node::hold_busy_wait`]).
    pub fn new(
        executor: Executor,
        node: Node,
        calling_back: Arc<CallbackActivity>,
        tenants: Tenants,
    ) -> Arc<Scheduler> {
        Arc::new(Scheduler {
            executor,
            runtime: node.runtime().clone(),
            state: Mutex::default(),
            gate: Arc::default(),
            calling_back,
            tenants,
            node,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client nodes seen so far, with their settings and figures.
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// Work other than runs (compile, transfers, dropping resources): on an executor thread at
    /// once. Never blocks.
    pub fn spawn(&self, job: crate::xla::Job) {
        self.executor.submit(job);
    }

    /// Runs `job` on an executor thread as soon as the bounds admit it, handing it its
    /// [`Place`]. If it is still queued after its `queue_timeout`, it is dropped and `timed_out`
    /// is called instead, on the runtime. A run that would wait while its client node already
    /// has its `max_queued` runs waiting is refused: `Err` with the text of the `:overloaded`
    /// reply, and `job` is dropped. Never blocks.
    pub fn submit_run(
        self: &Arc<Self>,
        ticket: RunTicket,
        job: RunJob,
        timed_out: TimedOut,
    ) -> Result<(), String> {
        let RunTicket {
            tenant,
            priority,
            lane,
            queue_timeout,
        } = ticket;
        let weight = tenant.settings.weight;
        let mut state = self.lock();
        if state.admitted.admits(lane, &tenant) {
            state.admitted.start(lane, &tenant);
            state.queue.charge(&tenant.node, weight);
            drop(state);
            self.execute(lane, job, tenant);
            return Ok(());
        }
        let waiting = state.queue.queued(&tenant.node);
        if let Some(max) = tenant.settings.max_queued.filter(|&max| waiting >= max) {
            state.overloaded += 1;
            let text = format!(
                "node {} has {waiting} runs waiting for a place, its max_queued of {max} \
                 (--tenant {}); the node executes {} runs ({} of them programs that call back) and \
                 {} more wait: retry later, or send fewer runs at once",
                tenant.node,
                tenant.settings.rule,
                state.admitted.running,
                state.admitted.running_calling_back,
                state.queue.len() - waiting,
            );
            return Err(text);
        }
        let node = tenant.node.clone();
        tenant.queued.fetch_add(1, Ordering::Relaxed);
        let id = state.queue.push(
            &node,
            weight,
            priority,
            lane,
            Queued {
                job,
                timed_out,
                tenant,
            },
        );
        drop(state);
        if let Some(timeout) = queue_timeout {
            let this = self.clone();
            self.runtime.spawn(async move {
                tokio::time::sleep(timeout).await;
                this.expire(&node, priority, lane, id, timeout);
            });
        }
        Ok(())
    }

    /// Hands an admitted run to an executor thread; its place is given back when it ends (also
    /// if it panics).
    fn execute(self: &Arc<Self>, lane: Lane, job: RunJob, tenant: Arc<Tenant>) {
        if lane == Lane::CallingBack {
            self.calling_back.started();
        }
        let place = Place {
            scheduler: self.clone(),
            lane,
            tenant,
        };
        self.executor.submit(Box::new(move || job(place)));
    }

    /// A run ended: starts the queued runs its place admits.
    fn finished(self: &Arc<Self>, lane: Lane, tenant: &Tenant) {
        if lane == Lane::CallingBack {
            self.calling_back.ended();
        }
        let mut state = self.lock();
        state.admitted.finish(lane, tenant);
        let mut admitted = Vec::new();
        while let Some(next) = state.next_admitted() {
            admitted.push(next);
        }
        drop(state);
        for (lane, job, tenant) in admitted {
            self.execute(lane, job, tenant);
        }
    }

    /// A queued run's timer fired: fails it if it is still queued.
    fn expire(&self, node: &str, priority: Priority, lane: Lane, id: u64, timeout: Duration) {
        let mut state = self.lock();
        let Some(run) = state.queue.remove(node, priority, lane, id) else {
            return; // it started
        };
        run.tenant.queued.fetch_sub(1, Ordering::Relaxed);
        state.queue_timeouts += 1;
        let text = format!(
            "the run could not start within its queue_timeout of {} ms: {} runs were executing \
             ({} of them programs that call back; at most {MAX_RUNS} and {MAX_CALLING_BACK} \
             execute at once) and {} more were queued ({} of them from {node})",
            timeout.as_millis(),
            state.admitted.running,
            state.admitted.running_calling_back,
            state.queue.len(),
            state.queue.queued(node),
        );
        drop(state);
        (run.timed_out)(text);
    }

    pub fn counts(&self) -> RunCounts {
        let state = self.lock();
        RunCounts {
            running: state.admitted.running,
            running_calling_back: state.admitted.running_calling_back,
            queued: state.queue.len(),
            queue_timeouts: state.queue_timeouts,
            overloaded: state.overloaded,
        }
    }
}

/// An admitted run's place, held on its executor thread; dropping it gives the place back.
pub struct Place {
    scheduler: Arc<Scheduler>,
    lane: Lane,
    tenant: Arc<Tenant>,
}

impl Place {
    /// Waits (on this executor thread) for the run's turn at XLA's line of queued computations
    /// (see [`Gate`]); the run executes through the returned passage.
    pub fn enter_xla(&self) -> Passage<'_> {
        let gate = &self.scheduler.gate;
        if self.lane == Lane::CallingBack {
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
    /// `launched` hears, once `Execute` has returned, whether the program had already completed
    /// (it executed on this thread).
    pub fn execute(
        self,
        run: &Run,
        launched: &mut dyn FnMut(bool),
    ) -> Result<Vec<Buffer>, XlaError> {
        match self {
            Passage::CallingBack(gated) => {
                let outputs = run.execute_observed(&mut |completed| {
                    run_probe::mark(run_probe::Step::Launched);
                    gated.launched(completed);
                    launched(completed);
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
                    launched(completed);
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
        launched: &mut dyn FnMut(bool),
        hand_over: &mut dyn FnMut(Vec<Buffer>),
    ) -> Result<(), XlaError> {
        match self {
            Passage::WithoutCallbacks(_window, node) => {
                let mut held = early_hold(run, node);
                let completed = run.execute_handing_over(
                    &mut |completed| {
                        run_probe::mark(run_probe::Step::Launched);
                        held = (!completed).then(|| node.hold_busy_wait());
                        launched(completed);
                    },
                    hand_over,
                );
                drop(held);
                run_probe::mark(run_probe::Step::Completed);
                completed
            }
            calling_back => {
                hand_over(calling_back.execute(run, launched)?);
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
        self.scheduler.finished(self.lane, &self.tenant);
    }
}
