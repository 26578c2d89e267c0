//! A run: an executable and its arguments, checked against each other once.
//!
//! XLA does not check arguments: a count, element type, dimension or byte size that differs
//! from the program's parameters fails one of its `CHECK`s, which aborts the whole process. So
//! the only way to execute a program is a [`Run`], and the only way to make one is
//! [`Run::new`], which checks every argument first. The check costs a comparison per argument,
//! and a caller can make it wherever it suits: the node makes it on the server's task, so that
//! wrong arguments are answered at once instead of waiting for a place to execute.

use std::sync::Arc;

use super::buffer::Buffer;
use super::error::XlaError;
use super::executable::{Argument, Executable};
use super::tensor::HostTensor;

/// An executable with arguments that match its parameters: ready to execute, as often as
/// wanted.
#[derive(Debug)]
pub struct Run {
    exe: Arc<Executable>,
    args: Vec<Argument>,
}

impl Run {
    /// Checks `given` against the parameters of `exe`. `leading`: host arrays the node puts
    /// ahead of them (the callback handle that EXLA's modules take as parameter 0); error texts
    /// count the given arguments only, which are the ones the caller knows of.
    pub fn new(
        exe: Arc<Executable>,
        leading: Vec<HostTensor>,
        given: Vec<Argument>,
    ) -> Result<Run, XlaError> {
        let params = exe.parameters();
        let supplied = leading.len();
        if supplied + given.len() != params.len() {
            return Err(XlaError::Argument(format!(
                "expected {} arguments{}, got {}",
                params.len().saturating_sub(supplied),
                match supplied {
                    0 => String::new(),
                    1 => " (after the callback handle the node supplies)".to_string(),
                    n => format!(" (after the {n} the node supplies)"),
                },
                given.len()
            )));
        }
        let args: Vec<Argument> = if leading.is_empty() {
            given
        } else {
            leading
                .into_iter()
                .map(Argument::Host)
                .chain(given)
                .collect()
        };
        for (i, (arg, param)) in args.iter().zip(params).enumerate() {
            let (given, bytes) = match arg {
                Argument::Host(t)
                    if t.dtype == param.dtype
                        && t.dims == param.dims
                        && t.data.len() == param.byte_size() =>
                {
                    continue
                }
                Argument::Host(t) => (t.spec(), t.data.len()),
                Argument::Device(b) if !exe.owns(b) => {
                    return Err(XlaError::Argument(format!(
                        "{}: the buffer belongs to another client",
                        name(i, supplied)
                    )))
                }
                Argument::Device(b) if b.spec() == param => continue,
                Argument::Device(b) => (b.spec().clone(), b.byte_size()),
            };
            return Err(XlaError::Argument(format!(
                "{}: expected {param} ({} bytes), got {given} ({bytes} bytes)",
                name(i, supplied),
                param.byte_size(),
            )));
        }
        Ok(Run { exe, args })
    }

    /// Bytes this run puts on the device beyond the buffers it names: its host arguments,
    /// copied there for the run, and its results. Known before anything is allocated, so a
    /// caller can refuse a run that would not fit.
    pub fn device_bytes(&self) -> u64 {
        let uploaded: usize = self
            .args
            .iter()
            .map(|arg| match arg {
                Argument::Host(t) => t.data.len(),
                Argument::Device(_) => 0,
            })
            .sum();
        let results: usize = self.exe.outputs().iter().map(|o| o.byte_size()).sum();
        (uploaded + results) as u64
    }

    /// Executes on the client's first device and waits for the results, one buffer each.
    pub fn execute(&self) -> Result<Vec<Buffer>, XlaError> {
        self.execute_observed(&mut |_| {})
    }

    /// [`Run::execute`], calling `launched` once XLA's `Execute` has returned, before the
    /// results are awaited, with whether the program had already completed (it executed on the
    /// calling thread) or XLA queued it for its own threads. Not called when uploading a host
    /// argument fails before `Execute`.
    pub fn execute_observed(
        &self,
        launched: &mut dyn FnMut(bool),
    ) -> Result<Vec<Buffer>, XlaError> {
        self.exe.run_checked(&self.args, launched, None)
    }

    /// Executes and hands the results to `hand_over` as soon as XLA's `Execute` has returned,
    /// while XLA may still compute them, so that a caller who keeps them on the device need not
    /// wait; then waits for completion here (the run's host arguments stay borrowed until then)
    /// and returns XLA's error, if any. The handed buffers carry their readiness: a read, or a
    /// run that takes one, waits for it, and meets that error too. Nothing is handed over when
    /// the run fails before its results exist (uploading a host argument, `Execute` itself).
    pub fn execute_handing_over(
        &self,
        launched: &mut dyn FnMut(bool),
        hand_over: &mut dyn FnMut(Vec<Buffer>),
    ) -> Result<(), XlaError> {
        self.exe
            .run_checked(&self.args, launched, Some(hand_over))
            .map(drop)
    }
}

/// How error texts name argument `i` of a list whose first `supplied` the node supplies.
fn name(i: usize, supplied: usize) -> String {
    match i.checked_sub(supplied) {
        Some(given) => format!("argument {given}"),
        None => format!("the node's argument {i}"),
    }
}
