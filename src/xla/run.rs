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
    /// An SPMD program's arguments: one list per partition (then `args` is empty).
    partitions: Vec<Vec<Argument>>,
    /// Where it executes: an index into the client's addressable devices.
    device: usize,
}

impl Run {
    /// Checks `given` against the parameters of `exe`. `leading`: host arrays the node puts
    /// ahead of them (the callback handle that EXLA's modules take as parameter 0); error texts
    /// count the given arguments only, which are the ones the caller knows of. It runs where
    /// its buffers are, on device 0 if it names none (see [`Run::on_device`]).
    pub fn new(
        exe: Arc<Executable>,
        leading: Vec<HostTensor>,
        given: Vec<Argument>,
    ) -> Result<Run, XlaError> {
        Run::on_device(exe, leading, given, None)
    }

    /// [`Run::new`] on `device` (an index into the client's addressable devices; `None`: where
    /// its buffers are, else device 0). Buffers are never moved: one on another device than the
    /// run's is refused, and the error names both devices.
    pub fn on_device(
        exe: Arc<Executable>,
        leading: Vec<HostTensor>,
        given: Vec<Argument>,
        device: Option<usize>,
    ) -> Result<Run, XlaError> {
        let partitions = exe.partition_devices().len();
        if partitions > 0 {
            return Err(XlaError::Argument(format!(
                "the program runs on {partitions} devices at once: give one list of arguments \
                 per device"
            )));
        }
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
        check_arguments(&exe, &args, supplied)?;
        let device = run_device(&exe, &args, supplied, device)?;
        Ok(Run {
            exe,
            args,
            partitions: Vec::new(),
            device,
        })
    }

    /// A run of an SPMD program (compiled over several devices): `lists` holds one list of
    /// arguments per device of the program, in its order, each checked against the
    /// parameters (one device's shard of each) and against its device as [`Run::on_device`]
    /// checks them.
    pub fn partitioned(exe: Arc<Executable>, lists: Vec<Vec<Argument>>) -> Result<Run, XlaError> {
        let devices = exe.partition_devices().to_vec();
        if devices.is_empty() {
            return Err(XlaError::Argument(
                "the program runs on one device: give one list of arguments, not one per device"
                    .into(),
            ));
        }
        if lists.len() != devices.len() {
            return Err(XlaError::Argument(format!(
                "the program runs on {} devices at once, got {} lists of arguments",
                devices.len(),
                lists.len()
            )));
        }
        let checked = lists
            .into_iter()
            .zip(&devices)
            .enumerate()
            .map(|(i, (args, &device))| {
                let on = exe.client().device_name(device);
                let single =
                    Run::checked_single(exe.clone(), args, device).map_err(|e| match e {
                        XlaError::Argument(m) => {
                            XlaError::Argument(format!("device {i} ({on}): {m}"))
                        }
                        other => other,
                    })?;
                Ok(single.args)
            })
            .collect::<Result<Vec<_>, XlaError>>()?;
        Ok(Run {
            exe,
            args: Vec::new(),
            partitions: checked,
            device: devices[0],
        })
    }

    /// One partition's arguments checked as a single-device run's on `device`.
    fn checked_single(
        exe: Arc<Executable>,
        args: Vec<Argument>,
        device: usize,
    ) -> Result<Run, XlaError> {
        let params = exe.parameters();
        if args.len() != params.len() {
            return Err(XlaError::Argument(format!(
                "expected {} arguments, got {}",
                params.len(),
                args.len()
            )));
        }
        check_arguments(&exe, &args, 0)?;
        let device = run_device(&exe, &args, 0, Some(device))?;
        Ok(Run {
            exe,
            args,
            partitions: Vec::new(),
            device,
        })
    }

    /// How many devices it runs on at once: one, or an SPMD program's partitions.
    pub fn device_count(&self) -> usize {
        self.partitions.len().max(1)
    }

    /// The devices it runs on: its one device, or an SPMD program's, one per partition.
    pub fn devices(&self) -> Vec<usize> {
        match self.exe.partition_devices() {
            [] => vec![self.device],
            devices => devices.to_vec(),
        }
    }

    /// Where it executes: an index into the client's addressable devices.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Bytes this run puts on the device beyond the buffers it names: its host arguments,
    /// copied there for the run, and its results ([`Run::result_bytes`]). Known before anything
    /// is allocated, so a caller can refuse a run that would not fit.
    pub fn device_bytes(&self) -> u64 {
        let uploaded: usize = self
            .args
            .iter()
            .chain(self.partitions.iter().flatten())
            .map(|arg| match arg {
                Argument::Host(t) => t.data.len(),
                Argument::Device(_) => 0,
            })
            .sum();
        uploaded as u64 + self.result_bytes()
    }

    /// Bytes of this run's results, on every device it runs on.
    pub fn result_bytes(&self) -> u64 {
        let per_device: usize = self.exe.outputs().iter().map(|o| o.byte_size()).sum();
        (per_device * self.device_count()) as u64
    }

    /// Executes on its device and waits for the results, one buffer each.
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
        if !self.partitions.is_empty() {
            return self.exe.run_partitioned(&self.partitions, launched);
        }
        self.exe
            .run_checked(&self.args, self.device, launched, None)
    }

    /// Executes and hands the results to `hand_over` as soon as XLA's `Execute` has returned,
    /// while XLA may still compute them, so that a caller who keeps them on the device need not
    /// wait; then waits for completion here (the run's host arguments stay borrowed until then)
    /// and returns XLA's error, if any. The handed buffers carry their readiness: a read, or a
    /// run that takes one, waits for it, and meets that error too. Nothing is handed over when
    /// the run fails before its results exist (uploading a host argument, `Execute` itself). A
    /// run over several devices hands its results over once it has completed.
    pub fn execute_handing_over(
        &self,
        launched: &mut dyn FnMut(bool),
        hand_over: &mut dyn FnMut(Vec<Buffer>),
    ) -> Result<(), XlaError> {
        if !self.partitions.is_empty() {
            let outputs = self.exe.run_partitioned(&self.partitions, launched)?;
            hand_over(outputs);
            return Ok(());
        }
        self.exe
            .run_checked(&self.args, self.device, launched, Some(hand_over))
            .map(drop)
    }
}

/// The device a run executes on: `asked` if given, else that of its first buffer, else 0;
/// every buffer must be on it.
fn run_device(
    exe: &Executable,
    args: &[Argument],
    supplied: usize,
    asked: Option<usize>,
) -> Result<usize, XlaError> {
    let client = exe.client();
    let buffers = args.iter().enumerate().filter_map(|(i, arg)| match arg {
        Argument::Device(b) => Some((i, b.device())),
        Argument::Host(_) => None,
    });
    let mut chosen: Option<(usize, Option<usize>)> = asked.map(|d| (d, None));
    if let Some(d) = asked {
        client.addressable_device(d)?;
    }
    for (i, on) in buffers {
        match chosen {
            None => chosen = Some((on, Some(i))),
            Some((device, _)) if device == on => {}
            Some((device, by)) => {
                let run_on = match by {
                    Some(j) => format!(
                        "{} (where {} is)",
                        client.device_name(device),
                        name(j, supplied)
                    ),
                    None => client.device_name(device),
                };
                return Err(XlaError::Argument(format!(
                    "{} is on device {}, but the run is on device {run_on}: the node does not move \
                     buffers between devices (read it and place it there, or run on its device)",
                    name(i, supplied),
                    client.device_name(on),
                )));
            }
        }
    }
    Ok(chosen.map_or(0, |(device, _)| device))
}

/// Checks each argument against the executable's parameter of its position (the count was
/// checked): a tensor of its type and shape, a buffer of this client with its spec.
fn check_arguments(exe: &Executable, args: &[Argument], supplied: usize) -> Result<(), XlaError> {
    for (i, (arg, param)) in args.iter().zip(exe.parameters()).enumerate() {
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
    Ok(())
}

/// How error texts name argument `i` of a list whose first `supplied` the node supplies.
fn name(i: usize, supplied: usize) -> String {
    match i.checked_sub(supplied) {
        Some(given) => format!("argument {given}"),
        None => format!("the node's argument {i}"),
    }
}
