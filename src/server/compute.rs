//! The `:xla` server's compute requests: compile, run, and device buffers.
//!
//! The server process only parses a request and looks up the references it names; the work then
//! goes to an executor thread, which sends the reply itself. Runs are admitted to those threads
//! by the [`Scheduler`] (see `schedule.rs`: where XLA work executes, and why). The data path of
//! a run reads straight: tensors arrive in the request, are checked against the executable's
//! parameters, copied to the device, executed, and the results go back in the reply.

use super::resources::{Owner, Program, Resource, Resources};
use super::schedule::Scheduler;
use crate::node::gen::{self, From};
use crate::node::term::{
    as_atom, as_i64, as_list, as_tuple, atom, binary, error_kind, int, list, ok,
};
use crate::node::{Dest, Node};
use crate::tensor_term::{host_tensor_term, parse_tensor};
use crate::xla::{Buffer, Executor, HostTensor, Input, XlaError};
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
}

/// A run argument: a tensor from the request, or a buffer already on the device.
enum Arg {
    Host(HostTensor),
    Device(Arc<Buffer>),
}

struct RunOptions {
    keep_on_device: bool,
    callback_server: Option<Dest>,
    callback_timeout: Duration,
    queue_timeout: Option<Duration>,
}

fn argument_error(message: impl Into<String>) -> Term {
    error_kind("argument_error", message)
}

fn xla_error(e: &XlaError) -> Term {
    let kind = match e {
        XlaError::Compile(_) => "compile_error",
        XlaError::Argument(_) => "argument_error",
        XlaError::Runtime(_) | XlaError::Plugin(_) => "runtime_error",
    };
    error_kind(kind, e.message())
}

/// Reads a keyword list into (key, value) pairs.
fn keywords(opts: &Term) -> Result<Vec<(String, Term)>, String> {
    let items =
        as_list(opts).ok_or_else(|| format!("options must be a keyword list, got {opts}"))?;
    items
        .iter()
        .map(|item| match as_tuple(item, 2) {
            Some([k, v]) if as_atom(k).is_some() => {
                Ok((as_atom(k).expect("checked").to_string(), v.clone()))
            }
            _ => Err(format!(
                "options must be a keyword list, got element {item}"
            )),
        })
        .collect()
}

impl Compute {
    fn reply(&self, from: &From, reply: Term) {
        gen::reply_from(&self.node, &self.server, from, reply);
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

    fn lookup(&self, term: &Term) -> Result<Resource, String> {
        match term {
            Term::Reference(r) => self
                .resources
                .get(r)
                .ok_or_else(|| format!("unknown or freed reference {term}")),
            other => Err(format!("expected a reference, got {other}")),
        }
    }

    /// `{:compile, mlir}` / `{:compile, mlir, opts}`.
    pub fn compile(&self, from: From, program: Term, opts: Option<Term>) {
        let program = match program {
            Term::Binary(b) => b.bytes,
            other => {
                return self.reply(
                    &from,
                    argument_error(format!(
                        "the program must be a binary (MLIR text or bytecode), got {other}"
                    )),
                )
            }
        };
        if let Some(opts) = opts {
            match keywords(&opts) {
                Ok(kw) if kw.is_empty() => {}
                Ok(kw) => {
                    let keys: Vec<&str> = kw.iter().map(|(k, _)| k.as_str()).collect();
                    return self.reply(
                        &from,
                        argument_error(format!(
                            "unknown compile options {keys:?} (none are supported yet)"
                        )),
                    );
                }
                Err(e) => return self.reply(&from, argument_error(e)),
            }
        }
        let calls_back = Program::mentions_callbacks(&program);
        let this = self.clone();
        self.scheduler.spawn(Box::new(move || {
            let reply = match this.executor.compile(program) {
                Ok((exe, _cache_hit)) => {
                    let program = Program::new(exe, calls_back);
                    ok(Term::from(this.register(
                        Resource::Executable(Arc::new(program)),
                        &from.pid,
                    )))
                }
                Err(e) => xla_error(&e),
            };
            this.reply(&from, reply);
        }));
    }

    /// `{:run, exe, args}` / `{:run, exe, args, opts}`.
    pub fn run(&self, from: From, exe: Term, args: Term, opts: Option<Term>) {
        let prepared = (|| {
            let Resource::Executable(program) = self.lookup(&exe)? else {
                return Err(format!("{exe} is a buffer, not an executable"));
            };
            let Term::List(args) = args else {
                return match args {
                    Term::ByteList(_) => {
                        Err("args must be a list of tensors or buffers, got a charlist".to_string())
                    }
                    other => Err(format!(
                        "args must be a list of tensors or buffers, got {other}"
                    )),
                };
            };
            let args = args
                .elements
                .into_iter()
                .enumerate()
                .map(|(i, arg)| match arg {
                    Term::Reference(_) => match self.lookup(&arg) {
                        Ok(Resource::Buffer(b)) => Ok(Arg::Device(b)),
                        Ok(Resource::Executable(_)) => Err(format!(
                            "argument {i}: {arg} is an executable, not a buffer"
                        )),
                        Err(e) => Err(format!("argument {i}: {e}")),
                    },
                    tensor => parse_tensor(tensor)
                        .map(Arg::Host)
                        .map_err(|e| format!("argument {i}: {e}")),
                })
                .collect::<Result<Vec<Arg>, String>>()?;
            let opts = self.run_options(opts)?;
            Ok((program, args, opts))
        })();
        let (program, args, opts) = match prepared {
            Ok(p) => p,
            Err(e) => return self.reply(&from, argument_error(e)),
        };
        let this = self.clone();
        let timed_out = self.clone();
        let waiting = from.clone();
        self.scheduler.submit_run(
            program.calls_back,
            opts.queue_timeout,
            Box::new(move || this.run_and_reply(&program, args, &opts, &from)),
            Box::new(move |text| timed_out.reply(&waiting, error_kind("timeout", text))),
        );
    }

    fn run_and_reply(&self, program: &Program, args: Vec<Arg>, opts: &RunOptions, from: &From) {
        self.runs.0.fetch_add(1, Ordering::Relaxed);
        let reply = match self.execute(program, args, opts, &from.pid) {
            Ok(results) => ok(list(results)),
            Err(e) => {
                self.runs.1.fetch_add(1, Ordering::Relaxed);
                xla_error(&e)
            }
        };
        self.reply(from, reply);
    }

    fn run_options(&self, opts: Option<Term>) -> Result<RunOptions, String> {
        let mut options = RunOptions {
            keep_on_device: false,
            callback_server: None,
            callback_timeout: self.dispatcher.default_timeout(),
            queue_timeout: self.queue_timeout,
        };
        for (key, value) in opts.map(|o| keywords(&o)).transpose()?.unwrap_or_default() {
            match key.as_str() {
                "keep_on_device" => {
                    options.keep_on_device = match as_atom(&value) {
                        Some("true") => true,
                        Some("false") => false,
                        _ => return Err(format!("keep_on_device must be a boolean, got {value}")),
                    }
                }
                "callback_server" => {
                    options.callback_server = Some(Dest::from_term(&value).ok_or_else(|| {
                        format!("callback_server must be a pid, an atom or {{atom, node}}, got {value}")
                    })?)
                }
                "callback_timeout" => {
                    options.callback_timeout = match (as_i64(&value), as_atom(&value)) {
                        (Some(ms), _) if ms > 0 => Duration::from_millis(ms as u64),
                        (_, Some("infinity")) => Duration::from_secs(100 * 365 * 24 * 3600),
                        _ => return Err(format!("callback_timeout must be a positive number of milliseconds or :infinity, got {value}")),
                    }
                }
                "queue_timeout" => {
                    options.queue_timeout = match (as_i64(&value), as_atom(&value)) {
                        (Some(ms), _) if ms >= 0 => Some(Duration::from_millis(ms as u64)),
                        (_, Some("infinity")) => None,
                        _ => return Err(format!("queue_timeout must be a non-negative number of milliseconds or :infinity, got {value}")),
                    }
                }
                other => {
                    return Err(format!(
                        "unknown run option {other} (supported: keep_on_device, callback_server, callback_timeout, queue_timeout)"
                    ))
                }
            }
        }
        Ok(options)
    }

    /// Check, upload, execute, collect (on an executor thread).
    fn execute(
        &self,
        program: &Program,
        args: Vec<Arg>,
        opts: &RunOptions,
        requester: &Pid,
    ) -> Result<Vec<Term>, XlaError> {
        let exe = &program.exe;
        let params = exe.parameters();
        // EXLA-compiled modules take the callback server as a u8[8] first parameter: the node
        // supplies it (as a handle into the dispatcher's table) when the caller leaves it out.
        let callback_param = params
            .first()
            .is_some_and(|p| p.dtype == crate::xla::DType::U8 && p.dims == [8]);
        let supply_handle =
            callback_param && (opts.callback_server.is_some() || args.len() + 1 == params.len());
        let callbacks = supply_handle.then(|| {
            self.dispatcher.open_run(
                opts.callback_server.clone(),
                requester.clone(),
                opts.callback_timeout,
            )
        });
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
    pub fn to_device(&self, from: From, tensor: Term) {
        let tensor = match parse_tensor(tensor) {
            Ok(t) => t,
            Err(e) => return self.reply(&from, argument_error(e)),
        };
        let this = self.clone();
        self.scheduler.spawn(Box::new(move || {
            let reply = match this.executor.client().buffer_from_host(
                &tensor.data,
                tensor.dtype,
                &tensor.dims,
            ) {
                Ok(b) => ok(Term::from(
                    this.register(Resource::Buffer(Arc::new(b)), &from.pid),
                )),
                Err(e) => xla_error(&e),
            };
            this.reply(&from, reply);
        }));
    }

    /// `{:read, buffer}`.
    pub fn read(&self, from: From, buffer: Term) {
        let buffer = match self.lookup(&buffer) {
            Ok(Resource::Buffer(b)) => b,
            Ok(Resource::Executable(_)) => {
                return self.reply(
                    &from,
                    argument_error(format!("{buffer} is an executable, not a buffer")),
                )
            }
            Err(e) => return self.reply(&from, argument_error(e)),
        };
        let this = self.clone();
        self.scheduler.spawn(Box::new(move || {
            let reply = match buffer.to_host() {
                Ok(data) => ok(host_tensor_term(HostTensor::new(
                    buffer.dtype(),
                    buffer.dims().to_vec(),
                    data,
                ))),
                Err(e) => xla_error(&e),
            };
            this.reply(&from, reply);
        }));
    }

    /// `{:free, reference}`.
    pub fn free(&self, from: From, reference: Term) {
        let freed = match &reference {
            Term::Reference(r) => self.resources.free(r),
            _ => None,
        };
        let reply = match freed {
            Some(resource) => {
                self.release(vec![resource]);
                atom("ok")
            }
            None => argument_error(format!("unknown or freed reference {reference}")),
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
        ]
    }

    /// The dispatcher's counters, for `:info`.
    fn callback_info(&self) -> Term {
        let s = self.dispatcher.stats();
        super::map(vec![
            ("sent", int(s.callbacks as i64)),
            ("replies", int(s.replies as i64)),
            ("errors", int(s.errors as i64)),
            ("timeouts", int(s.timeouts as i64)),
            ("reply_wait_us", int(s.reply_wait_us as i64)),
            ("pending", int(s.pending as i64)),
            ("outfeeds", int(s.outfeeds as i64)),
            ("open_runs", int(s.open_runs as i64)),
        ])
    }
}
