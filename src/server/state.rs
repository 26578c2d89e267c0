//! What the `:xla` server holds: the node it answers from, XLA (the executor and the callback
//! dispatcher), the executables and buffers it handed out, the scheduler that places runs, and
//! the operator's settings.
//!
//! One [`State`] is shared (`Arc`) by the server's task and the executor threads that answer
//! requests; each part is immutable or synchronized on its own. Its parts are private: each
//! request family asks it, through the methods below, for what it needs (replying, resources,
//! the device budget, compiling, scheduling a run, the figures `:info` and `/metrics` report),
//! so that no family reaches into another's parts.

use super::device_budget::{DeviceBudget, Reservation};
use super::error::{ErrorTally, RequestError};
use super::kernels::KernelPolicy;
use super::resources::{Held, HoldChange, HoldError, Program, Resource, Resources, Strictness};
use super::transfer::Upload;
use crate::dispatch::{DispatchStats, Dispatcher, RunCallbacks, RunHandle};
use crate::metrics::Histogram;
use crate::node::gen::{self, Caller};
use crate::node::term::ok;
use crate::node::{Dest, Node};
use crate::schedule::tenants::Tenant;
use crate::schedule::{CallingBackRun, RunCounts, RunJob, RunTicket, Scheduler, TimedOut};
use crate::xla::{Buffer, Client, CompileOptions, Executor, ExecutorStats, HostTensor, XlaError};
use eetf::{Pid, Reference, Term};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The operator's settings the server answers under.
pub struct Settings {
    /// The PJRT plugin's path, for `:info`.
    pub plugin: PathBuf,
    /// How long a run may wait for a place unless it says otherwise (`None`: no limit).
    pub queue_timeout: Option<Duration>,
    /// The operator's kernel settings (`--kernel-dir`, `--kernel-version-shim`).
    pub kernels: KernelPolicy,
    /// `--max-device-bytes` (`None`: no bound).
    pub max_device_bytes: Option<u64>,
}

pub struct State {
    node: Node,
    /// The `:xla` server's pid: replies come from it, owner monitors belong to it.
    server: Pid,
    executor: Executor,
    dispatcher: Arc<Dispatcher>,
    scheduler: Arc<Scheduler>,
    resources: Resources,
    /// `--max-device-bytes`, and the bytes of transfers and runs in flight.
    device_budget: DeviceBudget,
    runs: RunTally,
    /// Runs on each device: `:info`'s `device_info`.
    device_runs: DeviceRuns,
    /// How long each compile request took on its executor thread (cache hits included).
    compile_time: Histogram,
    /// Error replies sent, by kind.
    errors: ErrorTally,
    plugin: PathBuf,
    queue_timeout: Option<Duration>,
    kernels: KernelPolicy,
}

impl State {
    /// The state of the server `server` on `node`, with nothing handed out yet.
    pub fn new(
        node: Node,
        server: Pid,
        executor: Executor,
        dispatcher: Arc<Dispatcher>,
        scheduler: Arc<Scheduler>,
        settings: Settings,
    ) -> State {
        let device_runs = DeviceRuns::new(executor.client().device_count());
        State {
            node,
            server,
            executor,
            dispatcher,
            scheduler,
            resources: Resources::default(),
            device_budget: DeviceBudget::new(settings.max_device_bytes),
            runs: RunTally::default(),
            device_runs,
            compile_time: Histogram::default(),
            errors: ErrorTally::default(),
            plugin: settings.plugin,
            queue_timeout: settings.queue_timeout,
            kernels: settings.kernels,
        }
    }

    // --- replies ---

    /// Replies to a call, from the server's pid.
    pub fn reply(&self, from: &Caller, reply: Term) {
        gen::reply_from(&self.node, &self.server, from, reply);
    }

    /// Replies `{:error, {kind, message}}`, and counts it: every error reply goes through here,
    /// a refusal (`:overloaded`, `:quota`, `:resource_exhausted`, `:timeout`) also for the
    /// caller's node.
    pub fn reply_error(&self, from: &Caller, error: &RequestError) {
        let kind = error.kind();
        self.errors.record(kind);
        if let Some(refusal) = kind.refusal() {
            self.tenant_of(&from.pid).refused(refusal);
        }
        self.reply(from, error.to_reply());
    }

    /// Replies `{:ok, value}`, or the error.
    pub fn reply_result(&self, from: &Caller, result: Result<Term, RequestError>) {
        match result {
            Ok(value) => self.reply(from, ok(value)),
            Err(e) => self.reply_error(from, &e),
        }
    }

    // --- resources ---

    /// Stores a new resource held by `owner` and returns the reference that names it.
    pub fn register(&self, resource: Resource, owner: &Pid) -> Reference {
        // Its node is a client node whose device bytes `:info` reports, whether it asked for
        // anything or not (an `owner:` elsewhere).
        self.tenant_of(owner);
        let reference = self.node.make_ref();
        self.resources
            .insert(&reference, resource, owner, &|holder| self.monitor(holder));
        reference
    }

    /// Monitors a holder from the server, so that its holds end when it does.
    fn monitor(&self, holder: &Pid) -> Reference {
        self.node.monitor(&self.server, Dest::Pid(holder.clone()))
    }

    /// Changes who holds each of `references` (`holders.rs`): every one or none, answering the
    /// first that cannot change ([`Strictness::AllOrNothing`], a call), or those that can
    /// ([`Strictness::SkipInvalid`], a cast). What a last holder released is freed.
    pub fn change_holds(
        &self,
        references: &[Reference],
        change: HoldChange,
        strictness: Strictness,
    ) -> Result<(), RequestError> {
        if let HoldChange::Share(holder) | HoldChange::GiveAway { to: holder, .. } = change {
            // As in `register`: the new holder's node is a client node.
            self.tenant_of(holder);
        }
        let released = self
            .resources
            .change_holds(references, change, strictness, &|holder| {
                self.monitor(holder)
            })
            .map_err(|e| hold_error(e, change))?;
        self.release(released);
        Ok(())
    }

    /// What `reference` names: an executable, a buffer or an upload.
    pub fn lookup(&self, reference: &Reference) -> Result<Resource, RequestError> {
        self.resources
            .get(reference)
            .ok_or_else(|| unknown_reference(reference.clone()))
    }

    /// The buffer `reference` names.
    pub fn lookup_buffer(&self, reference: &Reference) -> Result<Arc<Buffer>, RequestError> {
        match self.lookup(reference)? {
            Resource::Buffer(b) => Ok(b),
            Resource::Executable(_) => Err(RequestError::Argument(format!(
                "{} is an executable, not a buffer",
                Term::from(reference.clone())
            ))),
            Resource::Upload(_) => Err(RequestError::Argument(format!(
                "{} is an upload not yet done ({{:upload_done, upload}} makes it a buffer)",
                Term::from(reference.clone())
            ))),
        }
    }

    /// The executable `reference` names.
    pub fn lookup_program(&self, reference: &Reference) -> Result<Arc<Program>, RequestError> {
        match self.lookup(reference)? {
            Resource::Executable(program) => Ok(program),
            Resource::Buffer(_) | Resource::Upload(_) => Err(RequestError::Argument(format!(
                "{} is a buffer, not an executable",
                Term::from(reference.clone())
            ))),
        }
    }

    /// The upload `reference` names (`transfer.rs`).
    pub fn lookup_upload(&self, reference: &Reference) -> Result<Arc<Upload>, RequestError> {
        match self.lookup(reference)? {
            Resource::Upload(upload) => Ok(upload),
            _ => Err(RequestError::Argument(format!(
                "{} is not an upload",
                Term::from(reference.clone())
            ))),
        }
    }

    /// Takes the upload `reference` names out of the table, to be made a buffer.
    pub fn take_upload(&self, reference: &Reference) -> Result<Arc<Upload>, RequestError> {
        let upload = self.lookup_upload(reference)?;
        self.resources.free(reference);
        Ok(upload)
    }

    /// Frees what `reference` names: out of the table now, dropped on an executor thread.
    pub fn free(&self, reference: &Reference) -> Result<(), RequestError> {
        let resource = self
            .resources
            .free(reference)
            .ok_or_else(|| unknown_reference(reference.clone()))?;
        self.release(vec![resource]);
        Ok(())
    }

    /// Frees what each of `references` names; those that name nothing are skipped (a cast
    /// cannot answer, and a scope's buffers may be freed already).
    pub fn free_all(&self, references: &[Reference]) {
        let freed = references
            .iter()
            .filter_map(|r| self.resources.free(r))
            .collect();
        self.release(freed);
    }

    /// The holder behind `monitor` went down: frees all it held alone. Returns how many
    /// resources.
    pub fn owner_down(&self, monitor: &Reference) -> usize {
        let freed = self.resources.owner_down(monitor);
        let count = freed.len();
        self.release(freed);
        count
    }

    /// Drops resources taken out of the table on an executor thread: destroying a buffer or an
    /// executable is a PJRT call, which the server's task never makes.
    fn release(&self, resources: Vec<Resource>) {
        if !resources.is_empty() {
            self.scheduler.spawn(Box::new(move || drop(resources)));
        }
    }

    // --- work on executor threads ---

    /// Runs `job` on an executor thread at once: work that calls XLA but is not a run (see
    /// `crate::schedule`).
    pub fn spawn(self: &Arc<Self>, job: impl FnOnce(&State) + Send + 'static) {
        let state = self.clone();
        self.scheduler.spawn(Box::new(move || job(&state)));
    }

    /// Reserves `bytes` of device memory for `what` of `owner` under its node's quota and
    /// `--max-device-bytes`, counting the buffers held, or says why not.
    pub fn reserve_device(
        &self,
        what: &str,
        bytes: u64,
        owner: &Pid,
    ) -> Result<Reservation<'_>, RequestError> {
        let tenant = self.tenant_of(owner);
        self.device_budget
            .reserve(&self.resources, what, bytes, &tenant)
    }

    /// Whether `bytes` more of device memory for `what` fit `tenant`'s quota now (`:quota` if
    /// not), reserving nothing.
    pub fn check_quota(&self, what: &str, bytes: u64, tenant: &Tenant) -> Result<(), RequestError> {
        self.device_budget
            .check_quota(&self.resources, what, bytes, tenant)
    }

    // --- client nodes ---

    /// The client node of `pid`, with its settings and figures.
    pub fn tenant_of(&self, pid: &Pid) -> Arc<Tenant> {
        self.scheduler.tenants().get(&pid.node.name)
    }

    /// Every client node seen so far.
    pub fn tenants(&self) -> Vec<Arc<Tenant>> {
        self.scheduler.tenants().all()
    }

    /// Bytes of device memory client node `node` holds: (in its buffers, in work in flight).
    pub fn device_bytes_of(&self, node: &str) -> (u64, u64) {
        (
            self.resources.bytes_of_node(node),
            self.device_budget.in_flight_of(node),
        )
    }

    /// Copies `tensor` to `device` as a buffer `owner` holds (on an executor thread).
    pub fn upload(
        &self,
        tensor: &HostTensor,
        device: usize,
        owner: &Pid,
    ) -> Result<Reference, RequestError> {
        let _reserved = self.reserve_device("the to_device", tensor.data.len() as u64, owner)?;
        let buffer = self.executor.client().buffer_from_host_on(
            &tensor.data,
            tensor.dtype,
            &tensor.dims,
            device,
        )?;
        Ok(self.register(Resource::Buffer(Arc::new(buffer)), owner))
    }

    /// Compiles `module` (or takes it from the cache) as an executable `owner` holds, timing it
    /// (on an executor thread).
    pub fn compile(
        &self,
        module: Vec<u8>,
        options: &CompileOptions,
        owner: &Pid,
    ) -> Result<Reference, XlaError> {
        let calls_back = Program::mentions_callbacks(&module);
        let started = Instant::now();
        let compiled = self
            .executor
            .compile_with(module, options)
            .map(|(exe, _cache_hit)| {
                let program = Resource::Executable(Arc::new(Program::new(exe, calls_back)));
                self.register(program, owner)
            });
        self.compile_time.record(started.elapsed());
        compiled
    }

    /// The client, for work that calls XLA directly (loading kernels).
    pub fn client(&self) -> &Client {
        self.executor.client()
    }

    /// The operator's kernel settings.
    pub fn kernel_policy(&self) -> &KernelPolicy {
        &self.kernels
    }

    // --- runs ---

    /// The node's default bound on a run's wait for a place (`None`: no limit).
    pub fn default_queue_timeout(&self) -> Option<Duration> {
        self.queue_timeout
    }

    /// Hands a run to the scheduler; `Err`: refused, with the `:overloaded` reply's text.
    pub fn submit_run(
        &self,
        ticket: RunTicket,
        job: RunJob,
        timed_out: TimedOut,
    ) -> Result<(), RequestError> {
        self.scheduler
            .submit_run(ticket, job, timed_out)
            .map_err(RequestError::Overloaded)
    }

    /// Opens a run's callback context (see [`Dispatcher::open_run`]); `timeout`: the run's own
    /// bound on each callback wait (`None`: the node's default; `Some(None)`: no bound).
    pub fn open_callbacks(
        &self,
        handle: RunHandle,
        target: Option<Dest>,
        requester: Pid,
        timeout: Option<Option<Duration>>,
        calling_back: Option<Arc<CallingBackRun>>,
    ) -> RunCallbacks {
        let timeout = timeout.unwrap_or_else(|| Some(self.dispatcher.default_timeout()));
        self.dispatcher
            .open_run(handle, target, requester, timeout, calling_back)
    }

    /// The runs' counts and timings.
    pub fn runs(&self) -> &RunTally {
        &self.runs
    }

    pub fn device_runs(&self) -> &DeviceRuns {
        &self.device_runs
    }

    /// Sends `message` to `to` from the server's pid (messages that are not replies, such as a
    /// read's chunks).
    pub fn send(&self, to: &Pid, message: Term) {
        self.node.send(&self.server, Dest::Pid(to.clone()), message);
    }

    // --- what `:info` and `/metrics` report ---

    /// Whether programs may make host callbacks, and why not when they may not.
    pub fn host_callbacks(&self) -> Result<(), &str> {
        match self.dispatcher.unavailable_reason() {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn plugin(&self) -> &Path {
        &self.plugin
    }

    pub fn executor_stats(&self) -> ExecutorStats {
        self.executor.stats()
    }

    pub fn dispatch_stats(&self) -> DispatchStats {
        self.dispatcher.stats()
    }

    /// Executables and buffers held for clients.
    pub fn held(&self) -> Held {
        self.resources.held()
    }

    /// Runs executing and queued (the scheduler's counts).
    pub fn run_counts(&self) -> RunCounts {
        self.scheduler.counts()
    }

    pub fn compile_time(&self) -> &Histogram {
        &self.compile_time
    }

    pub fn errors(&self) -> &ErrorTally {
        &self.errors
    }

    /// `--max-device-bytes`.
    pub fn device_limit(&self) -> Option<u64> {
        self.device_budget.limit()
    }

    /// Bytes reserved by transfers and runs in flight.
    pub fn device_in_flight(&self) -> u64 {
        self.device_budget.in_flight()
    }
}

/// The error for a reference that names nothing (never did, or was freed).
pub fn unknown_reference(reference: impl Into<Term>) -> RequestError {
    RequestError::Argument(format!("unknown or freed reference {}", reference.into()))
}

/// The `:argument_error` for a reference whose holders cannot change as asked.
fn hold_error(error: HoldError, change: HoldChange) -> RequestError {
    match error {
        HoldError::Unknown(reference) => unknown_reference(reference),
        HoldError::Upload(reference) => RequestError::Argument(format!(
            "{} is an upload not yet done: it is its caller's alone until {{:upload_done, upload}}",
            Term::from(reference)
        )),
        HoldError::NotHeld(reference) => {
            let (holder, what) = match change {
                HoldChange::GiveAway { from, .. } => (from, "give it away"),
                HoldChange::Release(pid) => (pid, "release it"),
                HoldChange::Share(pid) => (pid, "share it"),
            };
            RequestError::Argument(format!(
                "{} is not held by {}: only a holder can {what}",
                Term::from(reference),
                Term::from(holder.clone())
            ))
        }
    }
}

/// Runs executed on each device, and running there now, by device index: what shows in
/// `:info` where work runs.
#[derive(Debug)]
pub struct DeviceRuns {
    executed: Vec<AtomicU64>,
    running: Vec<AtomicU64>,
}

/// A run executing on a device, counted as running there until dropped.
pub struct RunningOn<'a> {
    runs: &'a DeviceRuns,
    device: usize,
}

impl Drop for RunningOn<'_> {
    fn drop(&mut self) {
        self.runs.running[self.device].fetch_sub(1, Ordering::Relaxed);
        self.runs.executed[self.device].fetch_add(1, Ordering::Relaxed);
    }
}

impl DeviceRuns {
    fn new(devices: usize) -> DeviceRuns {
        let counters = || (0..devices).map(|_| AtomicU64::new(0)).collect();
        DeviceRuns {
            executed: counters(),
            running: counters(),
        }
    }

    /// A run starts executing on `device` (an index the run was checked against).
    pub fn start(&self, device: usize) -> RunningOn<'_> {
        self.running[device].fetch_add(1, Ordering::Relaxed);
        RunningOn { runs: self, device }
    }

    /// (runs executed, running now) on `device`; zeros for an index beyond the node's devices.
    pub fn counts(&self, device: usize) -> (u64, u64) {
        let load = |c: &Vec<AtomicU64>| c.get(device).map_or(0, |n| n.load(Ordering::Relaxed));
        (load(&self.executed), load(&self.running))
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
