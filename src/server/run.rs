//! `{:run, exe, args}` / `{:run, exe, args, opts}`: running a compiled program, the node's data
//! path.
//!
//! It reads straight: the request's tensors (and the buffers it names) are checked once against
//! the executable's parameters, here on the server's task, so that wrong arguments are answered
//! at once and never wait for a place ([`Run::new`], the one check between a request and XLA);
//! the [`Scheduler`](crate::schedule::Scheduler) admits the run to an executor thread, which
//! passes the gate through the run's [`Place`], executes it and replies with the results, as
//! tensors or as buffers left on the device, each result as `keep_on_device` says (where the run
//! waits on the way: `crate::schedule`). A run whose results all stay on the device, of a program
//! that does not call back, is answered as soon as XLA has launched it, unless `wait: true`: its
//! buffers carry their readiness, so the caller's next use of one waits for it (and meets any
//! error XLA reports at completion), while its executor thread waits for completion before it
//! gives the run's place back.
//! A run reserves its host arguments' and results' bytes under `--max-device-bytes` before it
//! executes (`device_budget.rs`). Every run that was parsed is answered, and counted, by
//! [`reply`].
//!
//! A program compiled over several devices (`{:compile, mlir, [devices: [...]]}`, SPMD) takes one
//! list of arguments per device, `[[args of device 0], [args of device 1], ...]` in the order
//! of its `devices`, and answers one list of results per device in the same order.
//!
//! Programs that EXLA compiled take a callback handle as parameter 0 (`u8[8]`); the node supplies
//! it when the caller leaves it out, and opens the run's callback context with the dispatcher
//! for as long as the run executes.

use super::error::RequestError;
use super::parse::{
    self, argument, boolean, keywords, milliseconds_or_infinity, reference, Elements, Milliseconds,
};
use super::resources::Resource;
use super::state::State;
use crate::dispatch::RunHandle;
use crate::node::gen::Caller;
use crate::node::term::{as_atom, as_i64, as_list, list};
use crate::node::Dest;
use crate::schedule::run_probe::{self, RunMarks, Step};
use crate::schedule::tenants::Priority;
use crate::schedule::{Place, RunJob, RunTicket, TimedOut};
use crate::tensor_term::{host_tensor_term, parse_tensor};
use crate::xla::{Argument, Buffer, DType, Executable, HostTensor, Run, XlaError};
use eetf::{Pid, Reference, Term};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `{:run, exe, args, opts}`, parsed.
#[derive(Debug)]
pub struct RunRequest {
    exe: Reference,
    args: RunArgs,
    options: RunOptions,
}

/// A run's arguments: one list, or one per device of an SPMD program.
#[derive(Debug)]
enum RunArgs {
    One(Vec<RunArg>),
    PerDevice(Vec<Vec<RunArg>>),
}

/// A run argument as the request gives it.
#[derive(Debug)]
enum RunArg {
    Tensor(HostTensor),
    Buffer(Reference),
}

/// Which results stay on the device as buffers; the others come back as tensors.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum Kept {
    #[default]
    None,
    All,
    /// Results by index: distinct, and below the program's result count (checked against the
    /// executable in [`Kept::check`]).
    Listed(Vec<usize>),
}

impl Kept {
    /// `keep_on_device`'s value: a boolean, or a list of distinct result indices.
    fn parse(value: &Term) -> Result<Kept, RequestError> {
        let wrong = || {
            argument(format!(
                "keep_on_device must be a boolean or a list of distinct result indices, got {value}"
            ))
        };
        match as_atom(value) {
            Some("true") => return Ok(Kept::All),
            Some("false") => return Ok(Kept::None),
            _ => {}
        }
        let items = as_list(value).ok_or_else(wrong)?;
        let mut indices = Vec::with_capacity(items.len());
        for item in &items {
            let index = as_i64(item)
                .and_then(|i| usize::try_from(i).ok())
                .ok_or_else(wrong)?;
            if indices.contains(&index) {
                return Err(argument(format!(
                    "keep_on_device lists result {index} twice: {value}"
                )));
            }
            indices.push(index);
        }
        Ok(Kept::Listed(indices))
    }

    /// Checks listed indices against the program's `results`; a list that names every result
    /// is [`Kept::All`].
    fn check(self, results: usize) -> Result<Kept, RequestError> {
        let Kept::Listed(indices) = self else {
            return Ok(self);
        };
        if let Some(index) = indices.iter().find(|&&i| i >= results) {
            return Err(argument(format!(
                "keep_on_device: result {index} does not exist (the program has {results} results)"
            )));
        }
        Ok(if indices.len() == results {
            Kept::All
        } else {
            Kept::Listed(indices)
        })
    }

    fn keeps(&self, index: usize) -> bool {
        match self {
            Kept::None => false,
            Kept::All => true,
            Kept::Listed(indices) => indices.contains(&index),
        }
    }
}

/// The run options the request sets; `None`: the node's default.
#[derive(Debug, Default)]
struct RunOptions {
    keep_on_device: Kept,
    /// Answer only once the run has completed, also when every result stays on the device.
    wait: bool,
    callback_server: Option<Dest>,
    /// `Some(None)`: `:infinity`.
    callback_timeout: Option<Option<Duration>>,
    /// `Some(None)`: `:infinity`.
    queue_timeout: Option<Option<Duration>>,
    /// `device: n` as given, checked against the node's devices when applied.
    device: Option<Term>,
    /// `owner: pid`: who holds the results kept on the device (`None`: the caller).
    owner: Option<Pid>,
    /// Among the queued runs of the caller's node.
    priority: Priority,
}

impl RunRequest {
    pub fn parse(elements: &mut Elements) -> Result<RunRequest, RequestError> {
        let exe = reference(elements.required())?;
        let args = run_args_per_device(elements.required())?;
        let options = match elements.optional() {
            Some(opts) => run_options(&opts)?,
            None => RunOptions::default(),
        };
        Ok(RunRequest { exe, args, options })
    }

    /// Looks up what the request names, checks the arguments, and hands the run to the
    /// scheduler.
    pub fn apply(self, state: &Arc<State>, from: Caller) {
        let received = Instant::now();
        let mut marks = RunMarks::received();
        let RunRequest {
            exe,
            args,
            mut options,
        } = self;
        let found = state.lookup_program(&exe).and_then(|program| {
            let kept = std::mem::take(&mut options.keep_on_device);
            options.keep_on_device = kept.check(program.exe.outputs().len())?;
            Ok(program)
        });
        let program = match found {
            Ok(program) => program,
            Err(e) => return reply(state, &from, Err(e)),
        };
        // Checked before the run takes a place: wrong arguments never wait in the queue.
        let (run, handle) = match checked_run(state, &program.exe, args, &options) {
            Ok(checked) => checked,
            Err(e) => return reply(state, &from, Err(e)),
        };
        let calls_back = program.calls_back;
        let tenant = state.tenant_of(&from.pid);
        // Refused now rather than after a wait when it cannot fit its node's quota as things
        // stand; checked again, and reserved, once it has its place.
        if let Err(e) = state.check_quota("the run", run.device_bytes(), &tenant) {
            return reply(state, &from, Err(e));
        }
        let ticket = RunTicket {
            tenant: tenant.clone(),
            priority: options.priority,
            lane: program.lane(run.devices()[0]),
            queue_timeout: options
                .queue_timeout
                .unwrap_or_else(|| state.default_queue_timeout()),
        };
        let timed_out: TimedOut = {
            let (state, from) = (state.clone(), from.clone());
            Box::new(move |text| state.reply_error(&from, &RequestError::Timeout(text)))
        };
        marks.mark(Step::Checked);
        let job: RunJob = {
            let (state, from) = (state.clone(), from.clone());
            Box::new(move |place| {
                run_probe::started(marks);
                let started = state.runs().started(received);
                tenant
                    .queue_wait
                    .record(started.saturating_duration_since(received));
                // Checked here, when the run has its place and before XLA allocates: buffers
                // freed while it waited count no more.
                let reserved = state.reserve_device("the run", run.device_bytes(), &from.pid);
                let mut reserved = match reserved {
                    Ok(reserved) => Some(reserved),
                    Err(refused) => {
                        state.runs().executed(started);
                        drop(place);
                        return reply(&state, &from, Err(refused));
                    }
                };
                // The run holds its place until it has completed, also when it was answered at
                // launch; answered at completion, it gives it back before its caller hears.
                let early = early_answer(calls_back, &options);
                let inline = execute(
                    &state,
                    place,
                    &run,
                    handle,
                    &options,
                    &from,
                    early,
                    &mut |results| {
                        run_probe::mark(Step::Converted);
                        state.runs().executed(started);
                        // Its results are the caller's buffers now (registered), or gone (read
                        // back): their bytes are given back before the caller hears, whose next
                        // request must not find them counted twice. A run answered at launch
                        // keeps its host arguments' until it completes: XLA still uses them.
                        match (early, &mut reserved) {
                            (true, Some(reserved)) => reserved.give_back(run.result_bytes()),
                            _ => drop(reserved.take()),
                        }
                        reply(&state, &from, results.map_err(Into::into));
                        run_probe::mark(Step::Replied);
                    },
                );
                drop(reserved);
                if let Some(inline) = inline {
                    program.executed(inline);
                }
                run_probe::finished();
            })
        };
        // A refusal is no run: counted among the node's overloaded runs, not its run errors.
        if let Err(overloaded) = state.submit_run(ticket, job, timed_out) {
            state.reply_error(&from, &overloaded);
        }
    }
}

/// The run the request asks for, its arguments checked, and the callback handle the node
/// supplies, if any (never to an SPMD program).
fn checked_run(
    state: &State,
    exe: &Arc<Executable>,
    args: RunArgs,
    options: &RunOptions,
) -> Result<(Run, Option<RunHandle>), RequestError> {
    let args = match args {
        RunArgs::One(args) => args,
        RunArgs::PerDevice(lists) => {
            if options.device.is_some() {
                return Err(argument(
                    "device: names one device; a run with one list of arguments per device \
                     runs on the devices its program was compiled for",
                ));
            }
            let lists = lists
                .into_iter()
                .map(|list| arguments(state, list))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok((Run::partitioned(exe.clone(), lists)?, None));
        }
    };
    let given = arguments(state, args)?;
    let handle = supplies_handle(exe, given.len(), options).then(RunHandle::next);
    let leading = handle.map(RunHandle::tensor).into_iter().collect();
    let device = options
        .device
        .as_ref()
        .map(|n| parse::device("device", n, state.client().device_count()))
        .transpose()?;
    Ok((Run::on_device(exe.clone(), leading, given, device)?, handle))
}

/// The arguments as the run takes them: the request's tensors, and the buffers it names.
fn arguments(state: &State, args: Vec<RunArg>) -> Result<Vec<Argument>, RequestError> {
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| match arg {
            RunArg::Tensor(t) => Ok(Argument::Host(t)),
            RunArg::Buffer(r) => state
                .lookup_buffer(&r)
                .map(Argument::Device)
                .map_err(|e| argument(format!("argument {i}: {e}"))),
        })
        .collect()
}

/// Whether the node supplies parameter 0: EXLA-compiled modules take the callback server as a
/// `u8[8]` first parameter, which the node fills with the run's handle when the caller names a
/// callback server or leaves that parameter out.
fn supplies_handle(exe: &Executable, given: usize, options: &RunOptions) -> bool {
    let params = exe.parameters();
    let callback_param = params
        .first()
        .is_some_and(|p| p.dtype == DType::U8 && p.dims == [8]);
    callback_param && (options.callback_server.is_some() || given + 1 == params.len())
}

/// Whether a run is answered once XLA has launched it rather than once it completed: when every
/// result stays on the device, the program does not call back (its callbacks would reach the
/// caller after the answer), and the caller did not ask to wait.
fn early_answer(calls_back: bool, options: &RunOptions) -> bool {
    options.keep_on_device == Kept::All && !calls_back && !options.wait
}

/// Executes the run (on an executor thread) with its callback context open, and calls `answer`
/// once with the results as the reply lists them (the results the caller keeps registered as
/// its buffers) or the run's error: at launch when `early` ([`early_answer`]), else at
/// completion. After an early answer, an error XLA reports at completion reaches the caller
/// through the kept buffers, at their next use. Returns, for a run that succeeded, whether it
/// had completed when XLA's `Execute` returned (it executed on this thread). The run's place
/// and its count as running on its devices end before an answer at completion, so that the
/// caller's next `:info` no longer counts it; after an answer at launch, once it completed.
#[allow(clippy::too_many_arguments)]
fn execute(
    state: &State,
    place: Place,
    run: &Run,
    handle: Option<RunHandle>,
    options: &RunOptions,
    from: &Caller,
    early: bool,
    answer: &mut dyn FnMut(Result<Vec<Term>, XlaError>),
) -> Option<bool> {
    let running: Vec<_> = run
        .devices()
        .iter()
        .map(|&device| state.device_runs().start(device))
        .collect();
    let passage = place.enter_xla();
    run_probe::mark(Step::Entered);
    let callbacks = handle.map(|handle| {
        state.open_callbacks(
            handle,
            options.callback_server.clone(),
            from.pid.clone(),
            options.callback_timeout,
            passage.calling_back(),
        )
    });
    let kept = &options.keep_on_device;
    let device_count = run.device_count();
    let terms = |outputs: Vec<Buffer>| -> Result<Vec<Term>, XlaError> {
        // An SPMD program's results come device after device, each device's the program's.
        let per_device = (outputs.len() / device_count).max(1);
        let results: Vec<Term> = outputs
            .into_iter()
            .enumerate()
            .map(|(i, b)| match kept.keeps(i % per_device) {
                true => Ok(Term::from(state.register(
                    Resource::Buffer(Arc::new(b)),
                    options.owner.as_ref().unwrap_or(&from.pid),
                ))),
                false => b.to_host_tensor().map(host_tensor_term),
            })
            .collect::<Result<_, _>>()?;
        if device_count == 1 {
            return Ok(results);
        }
        // One list for each device.
        Ok(results
            .chunks(per_device)
            .map(|chunk| list(chunk.to_vec()))
            .collect())
    };
    let mut inline = false;
    if early {
        let mut answered = false;
        let completed = passage.execute_handing_over(
            run,
            &mut |completed| inline = completed,
            &mut |outputs| {
                answered = true;
                answer(terms(outputs));
            },
        );
        drop(callbacks);
        let succeeded = completed.is_ok();
        if let (Err(e), false) = (completed, answered) {
            answer(Err(e));
        }
        return succeeded.then_some(inline);
    }
    let outputs = passage.execute(run, &mut |completed| inline = completed);
    drop(callbacks);
    let succeeded = outputs.is_ok();
    let results = outputs.and_then(terms);
    drop(running);
    drop(place);
    answer(results);
    succeeded.then_some(inline)
}

/// Replies with a run's results or its error, and counts it: every run that was parsed ends
/// here, once (a lookup or argument error, a refusal, XLA's result), except a run whose
/// `queue_timeout` passed or that was refused as overloaded, which the scheduler counts apart.
fn reply(state: &State, from: &Caller, results: Result<Vec<Term>, RequestError>) {
    state.runs().record(results.is_err());
    state.tenant_of(&from.pid).answered();
    state.reply_result(from, results.map(list));
}

/// `[arg, ...]`, or `[[arg, ...], ...]`: one list per device of an SPMD program.
fn run_args_per_device(args: Term) -> Result<RunArgs, RequestError> {
    let per_device = match &args {
        Term::List(l) => {
            !l.elements.is_empty() && l.elements.iter().all(|e| matches!(e, Term::List(_)))
        }
        _ => false,
    };
    if !per_device {
        return run_args(args).map(RunArgs::One);
    }
    let Term::List(lists) = args else {
        unreachable!("checked above")
    };
    lists
        .elements
        .into_iter()
        .enumerate()
        .map(|(i, list)| {
            run_args(list).map_err(|e| match e {
                RequestError::Argument(m) => argument(format!("device {i}: {m}")),
                other => other,
            })
        })
        .collect::<Result<_, _>>()
        .map(RunArgs::PerDevice)
}

fn run_args(args: Term) -> Result<Vec<RunArg>, RequestError> {
    let args = match args {
        Term::List(l) => l.elements,
        Term::ByteList(_) => {
            return Err(argument(
                "args must be a list of tensors or buffers, got a charlist",
            ))
        }
        other => {
            return Err(argument(format!(
                "args must be a list of tensors or buffers, got {other}"
            )))
        }
    };
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| match arg {
            Term::Reference(r) => Ok(RunArg::Buffer(*r)),
            tensor => parse_tensor(tensor)
                .map(RunArg::Tensor)
                .map_err(|e| argument(format!("argument {i}: {e}"))),
        })
        .collect()
}

fn run_options(opts: &Term) -> Result<RunOptions, RequestError> {
    let mut options = RunOptions::default();
    for (key, value) in keywords(opts)? {
        match key.as_str() {
            "device" => options.device = Some(value),
            "owner" => options.owner = Some(parse::owner(&value)?),
            "keep_on_device" => options.keep_on_device = Kept::parse(&value)?,
            "wait" => options.wait = boolean(&key, &value)?,
            "callback_server" => {
                options.callback_server = Some(Dest::from_term(&value).ok_or_else(|| {
                    argument(format!(
                        "callback_server must be a pid, an atom or {{atom, node}}, got {value}"
                    ))
                })?)
            }
            "callback_timeout" => {
                options.callback_timeout = Some(milliseconds_or_infinity(
                    &key,
                    &value,
                    Milliseconds::Positive,
                )?)
            }
            "queue_timeout" => {
                options.queue_timeout = Some(milliseconds_or_infinity(
                    &key,
                    &value,
                    Milliseconds::NonNegative,
                )?)
            }
            "priority" => {
                options.priority = as_atom(&value).and_then(Priority::parse).ok_or_else(|| {
                    argument(format!(
                        "priority must be :high, :normal or :low, got {value}"
                    ))
                })?
            }
            other => {
                return Err(argument(format!(
                    "unknown run option {other} (supported: device, keep_on_device, wait, callback_server, callback_timeout, queue_timeout, owner, priority)"
                )))
            }
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::term::{atom, int};

    fn kept(value: Term) -> Result<Kept, String> {
        Kept::parse(&value).map_err(|e| e.to_string())
    }

    #[test]
    fn keep_on_device_takes_a_boolean_or_distinct_indices() {
        assert_eq!(kept(atom("true")), Ok(Kept::All));
        assert_eq!(kept(atom("false")), Ok(Kept::None));
        assert_eq!(
            kept(list(vec![int(2), int(0)])),
            Ok(Kept::Listed(vec![2, 0]))
        );
        assert_eq!(kept(list(vec![])), Ok(Kept::Listed(vec![])));
        assert!(kept(list(vec![int(1), int(1)]))
            .unwrap_err()
            .contains("result 1 twice"));
        assert!(kept(list(vec![int(-1)]))
            .unwrap_err()
            .contains("distinct result indices"));
        assert!(kept(atom("yes"))
            .unwrap_err()
            .contains("distinct result indices"));
    }

    #[test]
    fn listed_indices_are_checked_against_the_result_count() {
        assert_eq!(
            Kept::Listed(vec![1]).check(3).ok(),
            Some(Kept::Listed(vec![1]))
        );
        assert_eq!(Kept::Listed(vec![2, 0, 1]).check(3).ok(), Some(Kept::All));
        assert!(Kept::Listed(vec![3]).check(3).is_err());
        assert_eq!(Kept::None.check(0).ok(), Some(Kept::None));
        let listed = Kept::Listed(vec![0, 2]);
        assert!(listed.keeps(2) && !listed.keeps(1));
    }
}
