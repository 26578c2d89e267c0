//! The `:xla` server's compute requests: compile, run, and device buffers.
//!
//! The server process only parses a request and looks up the references it names; the work then
//! goes to an executor thread, which sends the reply itself. Runs are admitted to those threads
//! by the [`Scheduler`] (see `schedule.rs`: where XLA work executes, and why). The data path of
//! a run reads straight: tensors arrive in the request, are checked against the executable's
//! parameters, copied to the device, executed, and the results go back in the reply.

use super::request::{RequestError, RunArg, RunRequest};
use super::resources::{Owner, Program, Resource, Resources};
use super::schedule::Scheduler;
use crate::node::gen::{self, From};
use crate::node::probe;
use crate::node::term::{atom, binary, boolean, int, list, ok};
use crate::node::{Dest, Node};
use crate::tensor_term::host_tensor_term;
use crate::xla::{Buffer, Executable, Executor, HostTensor, Input, XlaError};
use eetf::{Pid, Reference, Term};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Everything the compute requests share; cloned into each job.
#[derive(Clone)]
pub struct Compute {
    pub node: Node,
    /// The `:xla` server's pid: replies come from it, owner monitors belong to it.
    pub server: Pid,
    pub executor: Executor,
    pub resources: Arc<Resources>,
    pub plugin: PathBuf,
    pub dispatcher: Arc<crate::dispatch::Dispatcher>,
    pub scheduler: Arc<Scheduler>,
    /// How long a run may wait for a place unless it says otherwise (`None`: no limit).
    pub queue_timeout: Option<Duration>,
    /// Runs finished, and how many of them failed.
    pub runs: Arc<(AtomicU64, AtomicU64)>,
    /// The operator's kernel settings (`--kernel-dir`, `--kernel-version-shim`).
    pub kernels: Arc<super::kernels::KernelPolicy>,
}

/// A run argument: a tensor from the request, or a buffer already on the device.
enum Arg {
    Host(HostTensor),
    Device(Arc<Buffer>),
}

/// A run's options with the node's defaults filled in.
struct RunOptions {
    keep_on_device: bool,
    callback_server: Option<Dest>,
    callback_timeout: Duration,
    queue_timeout: Option<Duration>,
}

/// A compile error about a custom-call target XLA has no handler for also lists the kernels
/// that are loaded: the usual cause is a kernel that was never loaded, or loaded under another
/// name.
fn with_kernels(error: XlaError) -> XlaError {
    match error {
        XlaError::Compile(message) if message.contains("No FFI handler registered for") => {
            XlaError::Compile(format!(
                "{message}. {}",
                crate::xla::describe_loaded_kernels()
            ))
        }
        other => other,
    }
}

/// Checks a run's arguments against the executable's parameters (count, dtype, dims, byte size),
/// and returns whether the node supplies parameter 0: EXLA-compiled modules take the callback
/// server as a `u8[8]` first parameter, which the node fills with a handle into the dispatcher's
/// table when the caller leaves it out.
fn check_arguments(exe: &Executable, args: &[Arg], opts: &RunOptions) -> Result<bool, XlaError> {
    let params = exe.parameters();
    let callback_param = params
        .first()
        .is_some_and(|p| p.dtype == crate::xla::DType::U8 && p.dims == [8]);
    let supply_handle =
        callback_param && (opts.callback_server.is_some() || args.len() + 1 == params.len());
    let offset = usize::from(supply_handle);
    if args.len() + offset != params.len() {
        return Err(XlaError::Argument(format!(
            "expected {} arguments{}, got {}",
            params.len() - offset,
            if offset == 1 {
                " (after the callback handle the node supplies)"
            } else {
                ""
            },
            args.len()
        )));
    }
    for (i, (arg, param)) in args.iter().zip(&params[offset..]).enumerate() {
        let given = match arg {
            Arg::Host(t) => t.spec(),
            Arg::Device(b) => b.spec().clone(),
        };
        if &given != param {
            return Err(XlaError::Argument(format!(
                "argument {i}: expected {param} ({} bytes), got {given} ({} bytes)",
                param.byte_size(),
                given.byte_size()
            )));
        }
    }
    Ok(supply_handle)
}

impl Compute {
    pub(super) fn reply(&self, from: &From, reply: Term) {
        gen::reply_from(&self.node, &self.server, from, reply);
    }

    /// Replies `{:ok, value}`, or the error.
    fn reply_ok(&self, from: &From, result: Result<Term, RequestError>) {
        self.reply(from, result.map_or_else(|e| e.to_reply(), ok));
    }

    /// Stores a new resource for `owner` and returns the reference that names it.
    fn register(&self, resource: Resource, owner: &Pid) -> Reference {
        let reference = self.node.make_ref();
        if let Owner::New = self.resources.insert(&reference, resource, owner) {
            let monitor = self.node.monitor(&self.server, Dest::Pid(owner.clone()));
            self.resources.set_monitor(owner, monitor);
        }
        reference
    }

    fn lookup(&self, reference: &Reference) -> Result<Resource, RequestError> {
        self.resources.get(reference).ok_or_else(|| {
            RequestError::Argument(format!(
                "unknown or freed reference {}",
                Term::from(reference.clone())
            ))
        })
    }

    fn lookup_buffer(&self, reference: &Reference) -> Result<Arc<Buffer>, RequestError> {
        match self.lookup(reference)? {
            Resource::Buffer(b) => Ok(b),
            Resource::Executable(_) => Err(RequestError::Argument(format!(
                "{} is an executable, not a buffer",
                Term::from(reference.clone())
            ))),
        }
    }

    /// `{:compile, mlir}`.
    pub fn compile(&self, from: From, program: Vec<u8>) {
        let calls_back = Program::mentions_callbacks(&program);
        let this = self.clone();
        self.scheduler.spawn(Box::new(move || {
            let compiled = this.executor.compile(program).map(|(exe, _cache_hit)| {
                let program = Program::new(exe, calls_back);
                let exe = Resource::Executable(Arc::new(program));
                Term::from(this.register(exe, &from.pid))
            });
            this.reply_ok(
                &from,
                compiled.map_err(|e| RequestError::from(with_kernels(e))),
            );
        }));
    }

    /// `{:run, exe, args, opts}`: looks up what the request names, then hands the run to the
    /// scheduler.
    pub fn run(&self, from: From, request: RunRequest) {
        let prepared = (|| {
            let Resource::Executable(program) = self.lookup(&request.exe)? else {
                return Err(RequestError::Argument(format!(
                    "{} is a buffer, not an executable",
                    Term::from(request.exe.clone())
                )));
            };
            let args = request
                .args
                .into_iter()
                .enumerate()
                .map(|(i, arg)| match arg {
                    RunArg::Tensor(t) => Ok(Arg::Host(t)),
                    RunArg::Buffer(r) => self
                        .lookup_buffer(&r)
                        .map(Arg::Device)
                        .map_err(|e| RequestError::Argument(format!("argument {i}: {e}"))),
                })
                .collect::<Result<Vec<Arg>, RequestError>>()?;
            Ok((program, args))
        })();
        let (program, args) = match prepared {
            Ok(p) => p,
            Err(e) => return self.reply(&from, e.to_reply()),
        };
        let given = request.options;
        let opts = RunOptions {
            keep_on_device: given.keep_on_device,
            callback_server: given.callback_server,
            callback_timeout: given
                .callback_timeout
                .unwrap_or_else(|| self.dispatcher.default_timeout()),
            queue_timeout: given.queue_timeout.unwrap_or(self.queue_timeout),
        };
        // Checked here, before the run takes a place: wrong arguments never wait in the queue.
        let supply_handle = match check_arguments(&program.exe, &args, &opts) {
            Ok(supply_handle) => supply_handle,
            Err(e) => {
                self.runs.0.fetch_add(1, Ordering::Relaxed);
                self.runs.1.fetch_add(1, Ordering::Relaxed);
                return self.reply(&from, RequestError::from(e).to_reply());
            }
        };
        let this = self.clone();
        let timed_out = self.clone();
        let waiting = from.clone();
        self.scheduler.submit_run(
            program.calls_back,
            opts.queue_timeout,
            Box::new(move || this.run_and_reply(&program, args, supply_handle, &opts, &from)),
            Box::new(move |text| timed_out.reply(&waiting, RequestError::Timeout(text).to_reply())),
        );
    }

    fn run_and_reply(
        &self,
        program: &Program,
        args: Vec<Arg>,
        supply_handle: bool,
        opts: &RunOptions,
        from: &From,
    ) {
        self.runs.0.fetch_add(1, Ordering::Relaxed);
        let results = self.execute(program, args, supply_handle, opts, &from.pid);
        if results.is_err() {
            self.runs.1.fetch_add(1, Ordering::Relaxed);
        }
        self.reply_ok(from, results.map(list).map_err(RequestError::from));
    }

    /// Upload, execute, collect (on an executor thread); `supply_handle`: the node passes the
    /// run's callback handle as parameter 0 (see [`check_arguments`]).
    fn execute(
        &self,
        program: &Program,
        args: Vec<Arg>,
        supply_handle: bool,
        opts: &RunOptions,
        requester: &Pid,
    ) -> Result<Vec<Term>, XlaError> {
        let exe = &program.exe;
        let callbacks = supply_handle.then(|| {
            self.dispatcher.open_run(
                opts.callback_server.clone(),
                requester.clone(),
                opts.callback_timeout,
            )
        });
        let handle = callbacks.as_ref().map(|callbacks| {
            HostTensor::new(
                crate::xla::DType::U8,
                vec![8],
                callbacks.handle_bytes().to_vec(),
            )
        });
        let inputs: Vec<Input<'_>> = handle
            .iter()
            .map(Input::Host)
            .chain(args.iter().map(|arg| match arg {
                Arg::Host(t) => Input::Host(t),
                Arg::Device(b) => Input::Device(b),
            }))
            .collect();
        let outputs = if program.calls_back {
            let run = self.scheduler.gate.run_calling_back();
            if let Some(callbacks) = &callbacks {
                let on_its_thread = run.clone();
                callbacks.on_call_on_run_thread(move || on_its_thread.called_back_on_run_thread());
            }
            let outputs = exe.run_observed(&inputs, &mut |completed| run.launched(completed));
            run.finished();
            outputs
        } else {
            let _window = self.scheduler.gate.run_without_callbacks();
            exe.run(&inputs)
        };
        drop(callbacks);
        let outputs = outputs?;
        if opts.keep_on_device {
            return Ok(outputs
                .into_iter()
                .map(|b| Term::from(self.register(Resource::Buffer(Arc::new(b)), requester)))
                .collect());
        }
        outputs
            .iter()
            .map(|b| {
                Ok(host_tensor_term(HostTensor::new(
                    b.dtype(),
                    b.dims().to_vec(),
                    b.to_host()?,
                )))
            })
            .collect()
    }

    /// `{:to_device, tensor}`.
    pub fn to_device(&self, from: From, tensor: HostTensor) {
        let this = self.clone();
        self.scheduler.spawn(Box::new(move || {
            let client = this.executor.client();
            let uploaded = client
                .buffer_from_host(&tensor.data, tensor.dtype, &tensor.dims)
                .map(|b| Term::from(this.register(Resource::Buffer(Arc::new(b)), &from.pid)));
            this.reply_ok(&from, uploaded.map_err(RequestError::from));
        }));
    }

    /// `{:read, buffer}`.
    pub fn read(&self, from: From, buffer: Reference) {
        let buffer = match self.lookup_buffer(&buffer) {
            Ok(b) => b,
            Err(e) => return self.reply(&from, e.to_reply()),
        };
        let this = self.clone();
        self.scheduler.spawn(Box::new(move || {
            let read = buffer.to_host().map(|data| {
                host_tensor_term(HostTensor::new(
                    buffer.dtype(),
                    buffer.dims().to_vec(),
                    data,
                ))
            });
            this.reply_ok(&from, read.map_err(RequestError::from));
        }));
    }

    /// `{:free, reference}`.
    pub fn free(&self, from: From, reference: Reference) {
        let reply = match self.resources.free(&reference) {
            Some(resource) => {
                self.release(vec![resource]);
                atom("ok")
            }
            None => RequestError::Argument(format!(
                "unknown or freed reference {}",
                Term::from(reference)
            ))
            .to_reply(),
        };
        self.reply(&from, reply);
    }

    /// Drops resources taken out of the table on an executor thread: destroying a buffer or an
    /// executable is a PJRT call, which the server's task never makes.
    pub fn release(&self, resources: Vec<Resource>) {
        if !resources.is_empty() {
            self.scheduler.spawn(Box::new(move || drop(resources)));
        }
    }

    /// The compute part of `:info`.
    pub fn info(&self) -> Vec<(&'static str, Term)> {
        let client = self.executor.client();
        let stats = self.executor.stats();
        let (executables, buffers) = self.resources.counts();
        let scheduled = self.scheduler.counts();
        let (major, minor) = client.api().version();
        let devices = client
            .devices()
            .iter()
            .map(|d| binary(format!("{}:{}", d.kind, d.id).into_bytes()))
            .collect();
        vec![
            (
                "platform",
                binary(client.platform_name().as_bytes().to_vec()),
            ),
            (
                "platform_version",
                binary(client.platform_version().as_bytes().to_vec()),
            ),
            ("devices", list(devices)),
            ("host_callbacks", boolean(client.runs_host_handlers())),
            (
                "plugin",
                binary(self.plugin.display().to_string().into_bytes()),
            ),
            (
                "pjrt_api_version",
                binary(format!("{major}.{minor}").into_bytes()),
            ),
            ("executables", int(executables as i64)),
            ("buffers", int(buffers as i64)),
            ("compiles", int(stats.compiles as i64)),
            ("cache_hits", int(stats.cache_hits as i64)),
            ("cached_executables", int(stats.cached as i64)),
            ("runs", int(self.runs.0.load(Ordering::Relaxed) as i64)),
            ("runs_running", int(scheduled.running as i64)),
            ("runs_queued", int(scheduled.queued as i64)),
            ("queue_timeouts", int(scheduled.queue_timeouts as i64)),
            (
                "run_errors",
                int(self.runs.1.load(Ordering::Relaxed) as i64),
            ),
            ("callbacks", self.callback_info()),
            ("kernels", super::kernels::info()),
        ]
    }

    /// The dispatcher's counters, for `:info`.
    fn callback_info(&self) -> Term {
        let s = self.dispatcher.stats();
        let mut entries = vec![
            ("sent", int(s.callbacks as i64)),
            ("replies", int(s.replies as i64)),
            ("errors", int(s.errors as i64)),
            ("timeouts", int(s.timeouts as i64)),
            ("reply_wait_us", int(s.reply_wait_us as i64)),
            ("pending", int(s.pending as i64)),
            ("outfeeds", int(s.outfeeds as i64)),
            ("open_runs", int(s.open_runs as i64)),
        ];
        // With XLA_NODE_CALLBACK_TRACE=1: the median microseconds from a custom call's start to
        // each step of its callback (see `node::probe`).
        if let Some((samples, medians)) = probe::medians() {
            let mut trace = vec![("samples", int(samples as i64))];
            trace.extend(
                probe::MEASURED
                    .iter()
                    .zip(medians)
                    .map(|((_, name), us)| (*name, Term::from(eetf::Float { value: us }))),
            );
            entries.push(("trace", super::map(trace)));
        }
        super::map(entries)
    }
}
