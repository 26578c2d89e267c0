//! Host callbacks: XLA custom calls that send genuine Erlang messages to processes on any node
//! and wait for their replies.
//!
//! EXLA lowers `Nx.runtime_call`/`Nx.io_call` to `stablehlo.custom_call @exla_runtime_callback`
//! and sketches two stream calls (`@exla_beam_outfeed`, `@exla_beam_infeed`). [`Dispatcher::install`]
//! registers host handlers for the three targets; the handlers turn each call into a message to a
//! process of the cluster and (except for outfeed) block the XLA thread until the reply arrives.
//!
//! A run's target is named per run: the server passes a [`RunHandle`] as the program's parameter 0
//! (EXLA's `u8[8]`) and calls [`Dispatcher::open_run`] with it and the run's `callback_server`
//! option, so modules compiled by EXLA run unchanged. Modules may instead carry
//! `term_to_binary(target)` themselves (see [`target`]).
//!
//! Nothing waits forever: each wait monitors its target, is bounded by the run's timeout, and is
//! abandoned when the process that asked for the run dies (see `wait.rs` and `run.rs`).
//!
//! Files: `target` (operand 0: run handles and term-encoded targets), `run` (per-run state and the
//! requester watch), `wait` (send + wait with monitors and timeouts), `watch` (monitors shared by
//! every callback to one process), `handlers` (the three FFI targets and reply checking),
//! `polling` (how long a waiting thread polls), `streams` (outfeed sending), `inspect`
//! (Elixir-style error texts).

mod handlers;
pub mod inspect;
mod polling;
mod run;
mod streams;
pub mod target;
mod wait;
mod watch;

pub use target::RunHandle;

use crate::metrics::{Histogram, Snapshot};
use crate::node::{Dest, Node};
use crate::schedule::CallingBackRun;
use crate::xla::{register_host_handler, CallFrame, Client, HostHandler, XlaError};
use eetf::Pid;
use run::RunState;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use target::{Operand0, Resolved};

/// FFI target of `Nx.runtime_call` / `Nx.io_call`.
pub const RUNTIME_CALLBACK: &str = "exla_runtime_callback";
/// FFI target that streams values out of a running program.
pub const BEAM_OUTFEED: &str = "exla_beam_outfeed";
/// FFI target that asks a stream process for the next value.
pub const BEAM_INFEED: &str = "exla_beam_infeed";
/// Every custom-call target the dispatcher serves.
pub const CALLBACK_TARGETS: [&str; 3] = [RUNTIME_CALLBACK, BEAM_OUTFEED, BEAM_INFEED];

/// Counters of the dispatcher, for `:info` and `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Requests sent that wait for a reply (runtime calls, io_calls, infeeds).
    pub callbacks: u64,
    /// Replies received (whatever their content): the round trips recorded.
    pub replies: u64,
    /// Waits that failed other than by timeout: the target was down, or the run was abandoned.
    pub errors: u64,
    /// Waits that timed out.
    pub timeouts: u64,
    /// Microseconds spent waiting for the replies received, each from the request's write to
    /// the reply in the waiting thread's hands: the callback's round trip through the network and
    /// the target's node, as this node sees it. `reply_wait_us / replies` is its mean.
    pub reply_wait_us: u64,
    /// Callbacks waiting right now.
    pub pending: u64,
    /// Outfeed messages sent.
    pub outfeeds: u64,
    /// Runs with an open callback context.
    pub open_runs: u64,
    /// Callbacks ended, per [`Outcome`] (indexed as [`Outcome::ALL`]).
    pub outcomes: [u64; Outcome::ALL.len()],
    /// The round trips of the replies received.
    pub round_trip: Snapshot,
}

impl DispatchStats {
    /// Callbacks that ended with `outcome`.
    pub fn ended(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome as usize]
    }
}

/// How a callback (a wait for a reply, or an outfeed that could not be sent) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The reply came and gave the results.
    Ok,
    /// The reply came as an error, or was not what the program needs.
    Error,
    /// No reply within the run's callback timeout.
    Timeout,
    /// The target is not alive, exited, or its node is unreachable.
    TargetDown,
    /// The run gave up on it: its requester went away, or the node is shutting down.
    Abandoned,
}

impl Outcome {
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Timeout,
        Outcome::TargetDown,
        Outcome::Abandoned,
    ];

    /// The label `/metrics` gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::TargetDown => "target_down",
            Outcome::Abandoned => "abandoned",
        }
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub sent: AtomicU64,
    pub pending: AtomicI64,
    pub outfeeds: AtomicU64,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    /// Each reply's round trip, from the request's write to the reply in the waiting thread's
    /// hands.
    pub round_trip: Histogram,
}

impl Counters {
    pub fn ended(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Serves the callback custom calls of every run on one client.
pub struct Dispatcher {
    node: Node,
    /// Why programs of this client cannot call back, if they cannot (`None`: they can).
    unavailable: Option<String>,
    default_timeout: Duration,
    runs: Mutex<HashMap<u64, Arc<RunState>>>,
    waiters: wait::Waiters,
    streams: streams::Streams,
    counters: Counters,
}

impl Dispatcher {
    /// Registers the FFI targets `exla_runtime_callback`, `exla_beam_outfeed`, `exla_beam_infeed`
    /// for the client's platform, verifying each with a test compile. Where that cannot be done
    /// (a platform the node has no handler for, a plugin that refuses them) the dispatcher is made
    /// all the same and [`Dispatcher::host_callbacks`] says false: programs that call back do not
    /// compile there, and clients split them at their callbacks instead.
    ///
    /// The registration is process-wide (XLA's FFI registry is): installing a second dispatcher
    /// routes every later callback to the new one. `default_timeout` bounds each wait for a
    /// reply unless the run sets its own; `reply_spin` is how long a waiting thread polls for the
    /// reply before it sleeps.
    pub fn install(
        node: Node,
        client: &Client,
        default_timeout: Duration,
        reply_spin: Duration,
    ) -> Arc<Dispatcher> {
        // The handlers hold the dispatcher weakly: XLA's registry keeps them forever, and must
        // not keep the node alive.
        Arc::new_cyclic(|dispatcher: &Weak<Dispatcher>| {
            let registered = Self::register_targets(client, dispatcher);
            let watches = Arc::new(watch::Watches::new(node.clone()));
            Dispatcher {
                unavailable: registered.err().map(|e| e.message().to_string()),
                waiters: wait::Waiters::new(node.clone(), watches, reply_spin),
                streams: streams::Streams::new(node.clone()),
                node,
                default_timeout,
                runs: Mutex::new(HashMap::new()),
                counters: Counters::default(),
            }
        })
    }

    /// Whether programs of this node's client can make host callbacks (`:info`'s
    /// `host_callbacks`).
    pub fn host_callbacks(&self) -> bool {
        self.unavailable.is_none()
    }

    /// Why programs cannot make host callbacks, when they cannot.
    pub fn unavailable_reason(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    fn register_targets(client: &Client, dispatcher: &Weak<Dispatcher>) -> Result<(), XlaError> {
        type Handler = fn(&Dispatcher, &mut CallFrame<'_>) -> Result<(), String>;
        let targets: [(&str, Handler); 3] = [
            (RUNTIME_CALLBACK, handlers::runtime_callback),
            (BEAM_OUTFEED, handlers::outfeed),
            (BEAM_INFEED, handlers::infeed),
        ];
        for (target, handler) in targets {
            let weak = dispatcher.clone();
            let host: HostHandler = Arc::new(move |frame: &mut CallFrame<'_>| {
                crate::node::probe::entered();
                let result = match weak.upgrade() {
                    Some(d) => handler(&d, frame),
                    None => Err(format!("{target}: the callback dispatcher was shut down")),
                };
                crate::node::probe::returned();
                result
            });
            register_host_handler(client, target, host)?;
        }
        Ok(())
    }

    /// Opens the callback context of one run, on the thread that executes it: `handle` = the
    /// run's handle (in the program's parameter 0), `target` = the run's `callback_server` option
    /// (None if not given), `requester` = pid that asked for the run, `timeout` = bound on each
    /// callback wait (`None`: no bound), `calling_back` = the run's passage at the scheduler's
    /// gate, for a program that calls back: the first custom call on the run's own thread tells
    /// it that the program executes there. A bare name as target means a process registered on
    /// the requester's node.
    pub fn open_run(
        self: &Arc<Self>,
        handle: RunHandle,
        target: Option<Dest>,
        requester: Pid,
        timeout: Option<Duration>,
        calling_back: Option<Arc<CallingBackRun>>,
    ) -> RunCallbacks {
        let target = target.map(|t| match t {
            Dest::Name(name) => Dest::Remote {
                name,
                node: requester.node.name.clone(),
            },
            other => other,
        });
        let handle = handle.number();
        let state = Arc::new(RunState::new(
            self.node.clone(),
            target,
            requester,
            timeout,
            calling_back,
        ));
        self.runs_lock().insert(handle, state.clone());
        RunCallbacks {
            dispatcher: self.clone(),
            handle,
            state,
        }
    }

    pub fn default_timeout(&self) -> Duration {
        self.default_timeout
    }

    pub fn stats(&self) -> DispatchStats {
        let c = &self.counters;
        let outcomes = Outcome::ALL.map(|o| c.outcomes[o as usize].load(Ordering::Relaxed));
        let round_trip = c.round_trip.snapshot();
        DispatchStats {
            callbacks: c.sent.load(Ordering::Relaxed),
            replies: round_trip.count(),
            errors: outcomes[Outcome::TargetDown as usize] + outcomes[Outcome::Abandoned as usize],
            timeouts: outcomes[Outcome::Timeout as usize],
            reply_wait_us: round_trip.sum().as_micros() as u64,
            pending: c.pending.load(Ordering::Relaxed).max(0) as u64,
            outfeeds: c.outfeeds.load(Ordering::Relaxed),
            open_runs: self.runs_lock().len() as u64,
            outcomes,
            round_trip,
        }
    }

    fn runs_lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<RunState>>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The target named by a callback's operand 0, with its run when it was a handle.
    fn resolve(&self, arg0: Option<&crate::xla::TensorRef<'_>>) -> Result<Resolved, String> {
        match target::read_operand0(arg0)? {
            Operand0::Handle(n) => {
                let run = self.runs_lock().get(&n).cloned().ok_or_else(|| {
                    format!(
                        "{} (the program's callback operand holds run handle {n}, which belongs \
                         to no open run: the run is over or the handle came from elsewhere)",
                        target::NO_SERVER
                    )
                })?;
                run.note_call();
                let dest = run.target.clone().ok_or_else(|| {
                    format!(
                        "{} (the program makes host callbacks, but the run has no target)",
                        target::NO_SERVER
                    )
                })?;
                Ok(Resolved {
                    dest,
                    run: Some(run),
                })
            }
            Operand0::Term(dest) => Ok(Resolved { dest, run: None }),
        }
    }
}

/// The callback context of one run. Dropping it removes the run's handle from the table and
/// abandons whatever callback of the run still waits.
pub struct RunCallbacks {
    dispatcher: Arc<Dispatcher>,
    handle: u64,
    state: Arc<RunState>,
}

impl Drop for RunCallbacks {
    fn drop(&mut self) {
        self.dispatcher.runs_lock().remove(&self.handle);
        self.state.close();
    }
}

impl std::fmt::Debug for RunCallbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCallbacks")
            .field("handle", &self.handle)
            .field("target", &self.state.target)
            .finish()
    }
}

/// The server moves both across threads.
#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<Dispatcher>();
    is::<RunCallbacks>();
}
