//! Compiling programs and running them.
//!
//! [`Client::compile`] takes StableHLO/MLIR as text or bytecode (PJRT program
//! format `"mlir"`) and returns an [`Executable`] that knows its parameter and
//! output types. Running one goes through [`Run`](super::Run), which checks the
//! arguments against those types *before* anything reaches XLA (XLA CHECK-fails
//! abort the process); the run itself (here) executes on the client's first
//! addressable device, waits for completion and checks every place an
//! execution error can surface: Execute's return value, the device completion
//! event and, except on CPU where the completion event defines them, each
//! output's ready event. Multi-result programs come back untupled, one
//! [`Buffer`] per result.
//!
//! Arguments are host arrays and device buffers alike. On the CPU platform,
//! small host arguments are copied into input buffers that the executable
//! keeps from run to run: creating a PJRT buffer costs more than the whole of a
//! tiny program's execution.

#![allow(unsafe_code)]

use std::ffi::c_char;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use super::buffer::Buffer;
use super::catch::Thrown;
use super::client::{slice_or_empty, str_from, Client, Failure};
use super::dtype::{DType, TensorSpec};
use super::error::XlaError;
use super::known_faults;
use super::partitions;
use super::proto::sub_message;
use super::signature;
use super::sys::*;
use super::tensor::HostTensor;

/// Compile options (serialized to an `xla.CompileOptionsProto`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    pub num_replicas: u32,
    pub num_partitions: u32,
    /// A portable executable has no device of its own: each execution names the device it runs
    /// on (`execute_device`), so one compile serves every device of the client.
    pub portable: bool,
    /// For an SPMD program (`num_partitions` > 1): the PJRT device id of each partition, in
    /// order (the device assignment).
    pub partition_devices: Vec<i64>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            portable: true,
            partition_devices: Vec::new(),
        }
    }
}

impl CompileOptions {
    /// One SPMD program over the devices whose PJRT ids `device_ids` gives, one partition each
    /// (XLA's SPMD partitioner splits it as the module's sharding annotations say).
    pub fn partitioned(device_ids: Vec<i64>) -> CompileOptions {
        CompileOptions {
            num_replicas: 1,
            num_partitions: device_ids.len() as u32,
            portable: false,
            partition_devices: device_ids,
        }
    }

    /// `CompileOptionsProto{executable_build_options (3): {num_replicas (4),
    /// num_partitions (5), use_spmd_partitioning (6), device_assignment (9),
    /// allow_spmd_sharding_propagation_to_output (12)}, compile_portable_executable (4)}`.
    /// Never empty: empty options abort the CPU plugin.
    /// `DeviceAssignmentProto{replica_count (1), computation_count (2), computation_devices (3):
    /// [{replica_device_ids (1)}]}`, one computation per partition. An SPMD program's results
    /// without a sharding annotation are split as the partitioner finds best, as `jax.jit` and
    /// EXLA let it, rather than gathered whole onto every device.
    pub fn to_proto(&self) -> Vec<u8> {
        let mut ebo = Vec::new();
        ebo.push(0x20);
        put_varint(&mut ebo, self.num_replicas as u64);
        ebo.push(0x28);
        put_varint(&mut ebo, self.num_partitions as u64);
        if !self.partition_devices.is_empty() {
            ebo.extend_from_slice(&[0x30, 0x01]);
            let mut assignment = vec![0x08];
            put_varint(&mut assignment, self.num_replicas as u64);
            assignment.push(0x10);
            put_varint(&mut assignment, self.partition_devices.len() as u64);
            for &id in &self.partition_devices {
                let mut ids = Vec::new();
                put_varint(&mut ids, id as u64);
                let mut computation = vec![0x0a];
                put_varint(&mut computation, ids.len() as u64);
                computation.extend_from_slice(&ids);
                assignment.push(0x1a);
                put_varint(&mut assignment, computation.len() as u64);
                assignment.extend_from_slice(&computation);
            }
            ebo.push(0x4a);
            put_varint(&mut ebo, assignment.len() as u64);
            ebo.extend_from_slice(&assignment);
            // One value applies to every result.
            ebo.extend_from_slice(&[0x60, 0x01]);
        }
        let mut out = vec![0x1a];
        put_varint(&mut out, ebo.len() as u64);
        out.extend_from_slice(&ebo);
        if self.portable {
            out.extend_from_slice(&[0x20, 0x01]);
        }
        out
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// MLIR bytecode magic.
const MLIR_BYTECODE_MAGIC: &[u8] = b"ML\xefR";

/// A compiled, loaded program.
pub struct Executable {
    client: Client,
    raw: *mut PJRT_LoadedExecutable,
    parameters: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    non_donatable: Vec<i64>,
    /// An SPMD program's devices, one per partition (indices into the client's addressable
    /// devices); empty for a portable single-device program.
    partition_devices: Vec<usize>,
    /// An SPMD program whose partitions exchange nothing: each is launched on its own device
    /// from the calling thread rather than all at once by XLA (see `partitions`).
    launch_each: bool,
    /// Whether each output's memory is the dense row-major array itself (its
    /// layout is fixed at compile time), learned from the first run on CPU.
    outputs_direct: OnceLock<Vec<bool>>,
    /// CPU platform only: sets of input buffers, one slot per parameter, that
    /// small host arguments are copied into, each with the device its buffers are on; a run
    /// takes a set of its device for its duration.
    staging: Mutex<Vec<(usize, StagingSet)>>,
}

/// One reused input buffer per parameter (`None` until a host argument fills it).
type StagingSet = Vec<Option<Buffer>>;

/// What one `Execute` call gave back (see [`Executable::launch`]).
struct Launched {
    /// Each argument list's outputs in turn.
    outputs: Vec<Buffer>,
    /// The first output XLA left out, if any.
    missing: Option<XlaError>,
    /// One completion event per argument list, to be awaited and destroyed.
    complete: Vec<*mut PJRT_Event>,
}

/// Host arguments of at most this many bytes in all go through reused input buffers.
const STAGING_MAX_BYTES: usize = 64 * 1024;

/// The bytes of a run's host arguments.
fn host_bytes(args: &[Argument]) -> usize {
    args.iter()
        .map(|arg| match arg {
            Argument::Host(t) => t.data.len(),
            Argument::Device(_) => 0,
        })
        .sum()
}

/// Takes a run's results once `Execute` has returned, before they are computed (see
/// [`Run::execute_handing_over`](super::Run::execute_handing_over)).
pub(crate) type HandOver<'a> = &'a mut dyn FnMut(Vec<Buffer>);

/// An argument of a run: a host array, copied to the device for the run, or a buffer already
/// there.
#[derive(Debug, Clone)]
pub enum Argument {
    Host(HostTensor),
    Device(Arc<Buffer>),
}

/// Sets of reused input buffers an executable keeps per device (runs beyond this many at
/// once on one device create and drop their own).
const STAGING_MAX_SETS: usize = 4;

// SAFETY: PJRT loaded executables may be executed concurrently from any
// thread; the Rust side holds only immutable data after construction.
unsafe impl Send for Executable {}
// SAFETY: see `Send`.
unsafe impl Sync for Executable {}

impl fmt::Debug for Executable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executable")
            .field("parameters", &self.parameters)
            .field("outputs", &self.outputs)
            .finish()
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let api = self.client.inner().api();
        let mut d = PJRT_LoadedExecutable_Destroy_Args::new();
        d.executable = self.raw;
        // SAFETY: we own `raw`; no execution can be in flight because
        // `execute` borrows `self` until completion.
        if let Err(e) = unsafe { api.call(api.fns().PJRT_LoadedExecutable_Destroy, &mut d) } {
            tracing::warn!("PJRT_LoadedExecutable_Destroy failed: {e}");
        }
    }
}

impl Client {
    /// Compiles MLIR (StableHLO) text or bytecode with default options.
    pub fn compile(&self, program: &[u8]) -> Result<Executable, XlaError> {
        self.compile_with_options(program, &CompileOptions::default())
    }

    /// Compiles MLIR (StableHLO) text or bytecode.
    pub fn compile_with_options(
        &self,
        program: &[u8],
        options: &CompileOptions,
    ) -> Result<Executable, XlaError> {
        let text = check_program(program)?;
        if let Some(text) = text {
            known_faults::check_text(text).map_err(XlaError::Compile)?;
        }
        let inner = self.inner();
        let api = inner.api();
        let opts = options.to_proto();
        let format = b"mlir";
        let mut prog = PJRT_Program::new();
        prog.code = program.as_ptr() as *mut c_char;
        prog.code_size = program.len();
        prog.format = format.as_ptr() as *const c_char;
        prog.format_size = format.len();
        let mut c = PJRT_Client_Compile_Args::new();
        c.client = inner.raw;
        c.program = &prog;
        c.compile_options = opts.as_ptr() as *const c_char;
        c.compile_options_size = opts.len();
        // SAFETY: matching args; `program`, `prog`, `format` and `opts` outlive
        // the call (the plugin only reads `code` during compilation).
        // After a throw `c.executable` may be unset or half-written: it is not looked at.
        unsafe { api.call_or_throw(api.fns().PJRT_Client_Compile, &mut c) }.map_err(|failure| {
            match failure {
                Failure::Returned(message) => XlaError::Compile(message),
                Failure::Threw(thrown) => XlaError::Compile(compiler_threw(&thrown)),
            }
        })?;
        if c.executable.is_null() {
            return Err(XlaError::Compile(
                "PJRT_Client_Compile returned no executable".into(),
            ));
        }
        let mut exe = Executable {
            client: self.clone(),
            raw: c.executable,
            parameters: Vec::new(),
            outputs: Vec::new(),
            non_donatable: Vec::new(),
            partition_devices: options
                .partition_devices
                .iter()
                .map(|&id| self.addressable_index_of(id))
                .collect::<Result<_, _>>()?,
            launch_each: false,
            outputs_direct: OnceLock::new(),
            staging: Mutex::new(Vec::new()),
        };
        exe.outputs = exe.query_outputs()?;
        // An SPMD program's text gives the whole arrays; each device takes its shard, which
        // only XLA's partitioned program tells.
        let text_parameters = text
            .filter(|_| exe.partition_devices.is_empty())
            .and_then(signature::mlir_main_parameters);
        // XLA's own program is read only where needed: for parameters the text does not tell,
        // and for faults that only it shows (see `known_faults`).
        let hlo = if text_parameters.is_none() || text.is_some_and(known_faults::mentions_two_bit) {
            let hlo = exe.optimized_module()?;
            known_faults::check_hlo(&hlo).map_err(XlaError::Compile)?;
            Some(hlo)
        } else {
            None
        };
        exe.parameters = match text_parameters {
            Some(p) => p,
            None => hlo
                .as_deref()
                .and_then(signature::hlo_parameters)
                .ok_or_else(|| {
                    XlaError::Compile(
                        "cannot determine parameter types (unsupported parameter type?)".into(),
                    )
                })?,
        };
        exe.non_donatable = (0..exe.parameters.len() as i64).collect();
        // An SPMD program's optimized module is always read (its parameters come from it).
        exe.launch_each = !exe.partition_devices.is_empty()
            && hlo
                .as_deref()
                .is_some_and(|hlo| !partitions::communicates(hlo));
        Ok(exe)
    }
}

/// The compile error for a program on which XLA's compiler threw: the node stopped the
/// exception and refuses the program.
fn compiler_threw(thrown: &Thrown) -> String {
    format!(
        "XLA's compiler failed: it threw a C++ exception ({}) instead of returning an error, \
         so the node refuses this program. One known cause: a transpose of 2- or 4-bit integers \
         that XLA turns into a copy (a result among several, or one XLA adds around a gather or \
         scatter); transpose them as 8-bit integers",
        thrown.0
    )
}

/// Rejects input that is certainly not MLIR; returns the text if it is text.
fn check_program(program: &[u8]) -> Result<Option<&str>, XlaError> {
    if program.is_empty() {
        return Err(XlaError::Compile("empty program".into()));
    }
    if program.starts_with(MLIR_BYTECODE_MAGIC) {
        return Ok(None);
    }
    let text = std::str::from_utf8(program).map_err(|_| {
        XlaError::Compile("program is neither MLIR bytecode nor UTF-8 MLIR text".into())
    })?;
    if text.trim().is_empty() {
        return Err(XlaError::Compile("empty program".into()));
    }
    if !text.contains("main") {
        return Err(XlaError::Compile("program has no main function".into()));
    }
    Ok(Some(text))
}

/// Owns a `PJRT_Executable*` obtained from a loaded executable.
struct ExecutableView<'a> {
    client: &'a Client,
    raw: *mut PJRT_Executable,
}

impl Drop for ExecutableView<'_> {
    fn drop(&mut self) {
        let api = self.client.inner().api();
        let mut d = PJRT_Executable_Destroy_Args::new();
        d.executable = self.raw;
        // SAFETY: the view owns `raw` (returned by GetExecutable).
        if let Err(e) = unsafe { api.call(api.fns().PJRT_Executable_Destroy, &mut d) } {
            tracing::warn!("PJRT_Executable_Destroy failed: {e}");
        }
    }
}

impl Executable {
    /// Parameter types, in order.
    pub fn parameters(&self) -> &[TensorSpec] {
        &self.parameters
    }

    /// An SPMD program's devices, one per partition (indices into the client's addressable
    /// devices); empty for a single-device program, which runs on any device.
    pub fn partition_devices(&self) -> &[usize] {
        &self.partition_devices
    }

    /// Whether an SPMD program's partitions exchange data (a collective, a send or receive), so
    /// that XLA launches them all at once; partitions that do not are each launched on their own
    /// device (see `partitions`). False for a single-device program.
    pub fn partitions_communicate(&self) -> bool {
        !self.partition_devices.is_empty() && !self.launch_each
    }

    /// Result types, in order: what a run leaves on the device.
    pub fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    /// The client it was compiled for.
    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    /// Whether `buffer` lives on this executable's client (a buffer of another client cannot
    /// be an argument).
    pub(super) fn owns(&self, buffer: &Buffer) -> bool {
        buffer.client().same_client(&self.client)
    }

    fn view(&self) -> Result<ExecutableView<'_>, XlaError> {
        let api = self.client.inner().api();
        let mut g = PJRT_LoadedExecutable_GetExecutable_Args::new();
        g.loaded_executable = self.raw;
        // SAFETY: live loaded executable; matching args.
        unsafe { api.call(api.fns().PJRT_LoadedExecutable_GetExecutable, &mut g) }
            .map_err(XlaError::Compile)?;
        Ok(ExecutableView {
            client: &self.client,
            raw: g.executable,
        })
    }

    fn query_outputs(&self) -> Result<Vec<TensorSpec>, XlaError> {
        let api = self.client.inner().api();
        let view = self.view()?;
        let mut n = PJRT_Executable_NumOutputs_Args::new();
        n.executable = view.raw;
        // SAFETY: live executable; matching args.
        unsafe { api.call(api.fns().PJRT_Executable_NumOutputs, &mut n) }
            .map_err(XlaError::Compile)?;
        let mut t = PJRT_Executable_OutputElementTypes_Args::new();
        t.executable = view.raw;
        // SAFETY: live executable; matching args; the array is owned by the
        // executable and copied while `view` is alive.
        let types: Vec<u32> = unsafe {
            api.call(api.fns().PJRT_Executable_OutputElementTypes, &mut t)
                .map_err(XlaError::Compile)?;
            slice_or_empty(t.output_types, t.num_output_types).to_vec()
        };
        let mut d = PJRT_Executable_OutputDimensions_Args::new();
        d.executable = view.raw;
        // SAFETY: as above.
        let (all_dims, sizes): (Vec<i64>, Vec<usize>) = unsafe {
            api.call(api.fns().PJRT_Executable_OutputDimensions, &mut d)
                .map_err(XlaError::Compile)?;
            let sizes = slice_or_empty(d.dim_sizes, d.num_outputs).to_vec();
            let total: usize = sizes.iter().sum();
            (slice_or_empty(d.dims, total).to_vec(), sizes)
        };
        if types.len() != n.num_outputs || sizes.len() != n.num_outputs {
            return Err(XlaError::Compile(format!(
                "inconsistent output metadata: {} outputs, {} types, {} shapes",
                n.num_outputs,
                types.len(),
                sizes.len()
            )));
        }
        let mut out = Vec::with_capacity(types.len());
        let mut off = 0;
        for (ty, sz) in types.into_iter().zip(sizes) {
            let dtype = DType::from_pjrt(ty).ok_or_else(|| {
                XlaError::Compile(format!("unsupported output element type (PJRT type {ty})"))
            })?;
            out.push(TensorSpec::new(dtype, all_dims[off..off + sz].to_vec()));
            off += sz;
        }
        Ok(out)
    }

    /// The optimized program XLA compiled (a serialized `HloModuleProto`): what the
    /// parameter types are read from when the MLIR text does not tell them (bytecode), and what
    /// [`known_faults::check_hlo`] reads.
    fn optimized_module(&self) -> Result<Vec<u8>, XlaError> {
        let api = self.client.inner().api();
        let view = self.view()?;
        let mut prog = PJRT_Program::new();
        let mut a = PJRT_Executable_OptimizedProgram_Args::new();
        a.executable = view.raw;
        a.program = &mut prog;
        // SAFETY: first call with `code == null` only queries the size.
        unsafe { api.call(api.fns().PJRT_Executable_OptimizedProgram, &mut a) }
            .map_err(XlaError::Compile)?;
        let mut code = vec![0u8; prog.code_size];
        prog.code = code.as_mut_ptr() as *mut c_char;
        a.program = &mut prog;
        // SAFETY: second call fills `code`, which holds `code_size` bytes.
        unsafe { api.call(api.fns().PJRT_Executable_OptimizedProgram, &mut a) }
            .map_err(XlaError::Compile)?;
        // SAFETY: the format string is owned by the implementation and valid
        // while the executable is alive.
        let format = unsafe { str_from(prog.format, prog.format_size) };
        code.truncate(prog.code_size);
        if format == "hlo" {
            return Ok(code);
        }
        // `hlo_with_config`: HloModuleProtoWithConfig.hlo_module = 1.
        sub_message(&code, 1).map(<[u8]>::to_vec).ok_or_else(|| {
            XlaError::Compile(format!(
                "cannot read the optimized program (format {format:?})"
            ))
        })
    }

    /// Executes with `args` on `device` (an index into the client's addressable devices, where
    /// every buffer of `args` is) and waits for it; returns one buffer per result.
    /// Errors raised during the run (including by host custom-call handlers) come back as
    /// [`XlaError::Runtime`] with XLA's text. Calls `launched` once `Execute` has returned,
    /// before the results are awaited, with whether the program had already completed: XLA's
    /// CPU client runs a small program on the calling thread, within `Execute`, and queues a
    /// larger one (or one submitted while an earlier one is still queued) for its own threads,
    /// where it runs after every computation queued before it.
    ///
    /// With `hand_over`, the results go to it as soon as `Execute` has returned, while XLA may
    /// still compute them, and this returns no buffers: it still waits for completion (the
    /// arguments stay borrowed until then) and returns the error XLA reports there, which the
    /// handed buffers carry too: awaiting one ([`Buffer::await_ready`], any read) returns it.
    fn execute(
        &self,
        args: &[&Buffer],
        device: usize,
        launched: &mut dyn FnMut(bool),
        hand_over: Option<HandOver<'_>>,
    ) -> Result<Vec<Buffer>, XlaError> {
        let api = self.client.inner().api();
        let Launched {
            outputs,
            missing,
            complete,
        } = self.launch(&[args], &[device], launched)?;
        let [complete] = complete[..] else {
            unreachable!("one completion event per argument list")
        };
        if let Some(hand_over) = hand_over {
            if let Some(err) = missing {
                // Outputs dropped here go once the run is done with them (PJRT defers it).
                drop(outputs);
                api.await_and_destroy(complete).ok();
                return Err(err);
            }
            hand_over(outputs);
            api.await_and_destroy(complete).map_err(XlaError::Runtime)?;
            return Ok(Vec::new());
        }
        let mut first_err = missing;
        if let Err(msg) = api.await_and_destroy(complete) {
            first_err.get_or_insert(XlaError::Runtime(msg));
        }
        if let Some(err) = first_err {
            return Err(err);
        }
        self.outputs_ready(&outputs)?;
        Ok(outputs)
    }

    /// The one `PJRT_LoadedExecutable_Execute` call: one argument list per device of `devices`
    /// (one device, named as `execute_device`: a portable program's, or one partition's of an
    /// SPMD program; or every partition of an SPMD program, in order), each borrowed for the
    /// call. Returns each list's outputs in turn, taken into [`Buffer`]s so that they are freed
    /// on any error, the first output XLA left out, and one completion event per list, not yet
    /// awaited. `launched` as in [`Executable::execute`].
    fn launch(
        &self,
        lists: &[&[&Buffer]],
        devices: &[usize],
        launched: &mut dyn FnMut(bool),
    ) -> Result<Launched, XlaError> {
        let api = self.client.inner().api();
        // Learnt by a portable program's first run (`execute`); an SPMD program never learns it.
        let direct = self.outputs_direct.get();
        let n = lists.len();
        let arg_ptrs: Vec<Vec<*mut PJRT_Buffer>> = lists
            .iter()
            .map(|list| list.iter().map(|b| b.raw()).collect())
            .collect();
        let arg_lists: Vec<*const *mut PJRT_Buffer> =
            arg_ptrs.iter().map(|list| list.as_ptr()).collect();
        let mut out_ptrs: Vec<Vec<*mut PJRT_Buffer>> =
            vec![vec![std::ptr::null_mut(); self.outputs.len().max(1)]; n];
        let out_lists: Vec<*mut *mut PJRT_Buffer> =
            out_ptrs.iter_mut().map(|list| list.as_mut_ptr()).collect();
        let mut complete: Vec<*mut PJRT_Event> = vec![std::ptr::null_mut(); n];
        let mut opts = PJRT_ExecuteOptions::new();
        // Our buffers stay owned by their `Buffer`s: never let XLA donate them.
        opts.non_donatable_input_indices = self.non_donatable.as_ptr();
        opts.num_non_donatable_input_indices = self.non_donatable.len();
        let mut e = PJRT_LoadedExecutable_Execute_Args::new();
        e.executable = self.raw;
        e.options = &mut opts;
        e.argument_lists = arg_lists.as_ptr();
        e.num_devices = n;
        e.num_args = lists.first().map_or(0, |list| list.len());
        e.output_lists = out_lists.as_ptr();
        e.device_complete_events = complete.as_mut_ptr();
        if n == 1 {
            // One list: the run names its device, a portable program's (see `CompileOptions`)
            // or one partition's of an SPMD program launched partition by partition.
            e.execute_device = self.client.addressable_device(devices[0])?;
        }
        // SAFETY: matching args; one argument list per device, each checked against the
        // signature and its device (count, dtype, dims, client, device: `Run::new`,
        // `Run::partitioned`) and borrowed for the whole call; each output list has room for
        // every output; all arrays outlive the call.
        let executed = unsafe { api.call(api.fns().PJRT_LoadedExecutable_Execute, &mut e) };
        launched(executed.is_err() || complete.iter().all(|&c| api.event_is_ready(c)));
        executed.map_err(XlaError::Runtime)?;
        let mut outputs = Vec::with_capacity(n * self.outputs.len());
        let mut missing = None;
        for (list, &device) in out_ptrs.iter().zip(devices) {
            for (i, (&p, spec)) in list.iter().zip(&self.outputs).enumerate() {
                if p.is_null() {
                    missing.get_or_insert_with(|| {
                        XlaError::Runtime("execution produced no output buffer".into())
                    });
                    continue;
                }
                outputs.push(Buffer::from_raw_with_spec(
                    &self.client,
                    p,
                    spec.clone(),
                    device,
                    direct.map(|d| d[i]),
                ));
            }
        }
        Ok(Launched {
            outputs,
            missing,
            complete,
        })
    }

    /// Runs an SPMD program with one argument list per partition, each on its partition's
    /// device, all checked by [`Run::partitioned`](super::Run::partitioned); returns each
    /// partition's results in turn (partition 0's, then partition 1's, ...). On the CPU, small
    /// host arguments go through each device's reused input buffers, as a single-device run's
    /// do ([`Executable::run_checked`]).
    pub(super) fn run_partitioned(
        &self,
        lists: &[Vec<Argument>],
        launched: &mut dyn FnMut(bool),
    ) -> Result<Vec<Buffer>, XlaError> {
        let devices = &self.partition_devices;
        let staged = self.client.inner().is_cpu
            && lists
                .iter()
                .all(|args| host_bytes(args) <= STAGING_MAX_BYTES);
        if !staged {
            let uploaded = lists
                .iter()
                .zip(devices)
                .map(|(args, &device)| {
                    args.iter()
                        .map(|arg| match arg {
                            Argument::Host(t) => self
                                .client
                                .buffer_from_host_on(&t.data, t.dtype, &t.dims, device)
                                .map(Some),
                            Argument::Device(_) => Ok(None),
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .collect::<Result<Vec<_>, _>>()?;
            return self.execute_partitions(lists, &uploaded, launched);
        }
        let mut sets: Vec<StagingSet> = lists
            .iter()
            .zip(devices)
            .map(|(args, &device)| self.take_staging(device, args.len()))
            .collect();
        let filled = sets
            .iter_mut()
            .zip(lists)
            .zip(devices)
            .try_for_each(|((set, args), &device)| self.stage(set, args, device));
        let result = filled.and_then(|()| self.execute_partitions(lists, &sets, launched));
        for (set, &device) in sets.into_iter().zip(devices) {
            self.give_back_staging(device, set);
        }
        result
    }

    /// Launches an SPMD program's partitions with `lists`, host arguments taken from `host`
    /// (same positions), waits for them all and returns their results in turn. Partitions that
    /// exchange nothing are launched one by one on their devices (see `partitions`), others
    /// all at once by XLA.
    fn execute_partitions(
        &self,
        lists: &[Vec<Argument>],
        host: &[StagingSet],
        launched: &mut dyn FnMut(bool),
    ) -> Result<Vec<Buffer>, XlaError> {
        let devices = &self.partition_devices;
        let buffers: Vec<Vec<&Buffer>> = lists
            .iter()
            .zip(host)
            .map(|(args, host)| Self::argument_buffers(args, host))
            .collect();
        let buffers: Vec<&[&Buffer]> = buffers.iter().map(Vec::as_slice).collect();
        let api = self.client.inner().api();
        let Launched {
            outputs,
            missing,
            complete,
        } = if self.launch_each {
            let mut all = Launched {
                outputs: Vec::with_capacity(devices.len() * self.outputs.len()),
                missing: None,
                complete: Vec::with_capacity(devices.len()),
            };
            let mut completed = true;
            for (list, &device) in buffers.iter().zip(devices) {
                match self.launch(&[list], &[device], &mut |done| completed &= done) {
                    Ok(one) => {
                        all.outputs.extend(one.outputs);
                        all.missing = all.missing.or(one.missing);
                        all.complete.extend(one.complete);
                    }
                    Err(e) => {
                        // The partitions launched still read their arguments: wait for them.
                        drop(all.outputs);
                        for event in all.complete {
                            api.await_and_destroy(event).ok();
                        }
                        launched(true);
                        return Err(e);
                    }
                }
            }
            launched(completed);
            all
        } else {
            self.launch(&buffers, devices, launched)?
        };
        let mut first_err = missing;
        for event in complete {
            if let Err(msg) = api.await_and_destroy(event) {
                first_err.get_or_insert(XlaError::Runtime(msg));
            }
        }
        if let Some(err) = first_err {
            return Err(err);
        }
        self.outputs_ready(&outputs)?;
        Ok(outputs)
    }

    /// Marks a completed run's outputs ready: on the CPU the completion events defined them
    /// (and the executable learns once whether each can be read directly); elsewhere each has
    /// its own event, awaited here.
    fn outputs_ready(&self, outputs: &[Buffer]) -> Result<(), XlaError> {
        let is_cpu = self.client.inner().is_cpu;
        for b in outputs {
            if !is_cpu {
                b.await_ready()?;
            }
            b.mark_ready();
        }
        if is_cpu {
            // Known from here on; set once (by the first run to get here). Every device's
            // outputs are laid out alike: the first list's tell.
            self.outputs_direct.get_or_init(|| {
                outputs
                    .iter()
                    .take(self.outputs.len())
                    .map(Buffer::is_direct)
                    .collect()
            });
        }
        Ok(())
    }

    /// Runs the program with `args` on `device`, which [`Run::new`](super::Run::new) checked
    /// against its parameters; `launched` as in [`Executable::execute`].
    pub(super) fn run_checked(
        &self,
        args: &[Argument],
        device: usize,
        launched: &mut dyn FnMut(bool),
        hand_over: Option<HandOver<'_>>,
    ) -> Result<Vec<Buffer>, XlaError> {
        if self.client.inner().is_cpu && host_bytes(args) <= STAGING_MAX_BYTES {
            let mut set = self.take_staging(device, args.len());
            let result = self.stage(&mut set, args, device).and_then(|()| {
                self.execute(
                    &Self::argument_buffers(args, &set),
                    device,
                    launched,
                    hand_over,
                )
            });
            self.give_back_staging(device, set);
            return result;
        }
        // Off the CPU, every host argument's copy is started, and none awaited, before
        // `Execute`: the run queues behind the copies (XLA orders it after each buffer's
        // definition), and the copies are awaited once the run is done with them. On the CPU
        // plugin runs were slower so, not faster (measured: docs/performance.md).
        let defer = !self.client.inner().is_cpu;
        let uploads = args
            .iter()
            .map(|arg| match arg {
                Argument::Host(t) => {
                    // Not deferred, XLA makes the copy within the call: a large one would
                    // otherwise go to one of its threads while this one sleeps.
                    let upload = self
                        .client
                        .upload(&t.data, t.dtype, &t.dims, device, !defer)?;
                    Ok(Some(upload))
                }
                Argument::Device(_) => Ok(None),
            })
            .collect::<Result<Vec<_>, XlaError>>()?;
        let buffers = args
            .iter()
            .zip(&uploads)
            .map(|(arg, upload)| match (arg, upload) {
                (Argument::Device(b), _) => &**b,
                (Argument::Host(_), upload) => upload
                    .as_ref()
                    .expect("one upload per host argument")
                    .buffer(),
            })
            .collect::<Vec<_>>();
        let outputs = self.execute(&buffers, device, launched, hand_over);
        drop(buffers);
        let copied = uploads
            .into_iter()
            .flatten()
            .try_for_each(|upload| upload.finish().map(drop));
        // A failed copy fails the run that read it too: the run's error says more.
        let outputs = outputs?;
        copied?;
        Ok(outputs)
    }

    /// A set of reused input buffers for a run on `device` (see `staging`): one of the
    /// executable's, or a new empty one of `slots` slots.
    fn take_staging(&self, device: usize, slots: usize) -> StagingSet {
        let mut pool = self.staging.lock().expect("staging lock");
        let found = pool.iter().rposition(|(on, _)| *on == device);
        found
            .map(|i| pool.swap_remove(i).1)
            .unwrap_or_else(|| (0..slots).map(|_| None).collect())
    }

    /// Keeps a set taken with [`Executable::take_staging`] for later runs, up to
    /// `STAGING_MAX_SETS` per device; the run that used it has completed.
    fn give_back_staging(&self, device: usize, set: StagingSet) {
        let mut pool = self.staging.lock().expect("staging lock");
        if pool.iter().filter(|(on, _)| *on == device).count() < STAGING_MAX_SETS {
            pool.push((device, set));
        }
    }

    /// Copies `args`' host arrays into `set`'s buffers on `device`; a slot is filled by a
    /// fresh upload the first time, or when its buffer cannot be written directly.
    fn stage(
        &self,
        set: &mut [Option<Buffer>],
        args: &[Argument],
        device: usize,
    ) -> Result<(), XlaError> {
        for (slot, arg) in set.iter_mut().zip(args) {
            if let Argument::Host(t) = arg {
                let refilled = slot.as_mut().is_some_and(|b| b.overwrite(&t.data));
                if !refilled {
                    *slot = Some(
                        self.client
                            .buffer_from_host_on(&t.data, t.dtype, &t.dims, device)?,
                    );
                }
            }
        }
        Ok(())
    }

    /// The buffers to execute with: device arguments as given, host arguments
    /// from `host` (same positions).
    fn argument_buffers<'a>(args: &'a [Argument], host: &'a [Option<Buffer>]) -> Vec<&'a Buffer> {
        args.iter()
            .zip(host)
            .map(|(arg, uploaded)| match arg {
                Argument::Host(_) => uploaded.as_ref().expect("one buffer per host argument"),
                Argument::Device(b) => b,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `executable_build_options` message inside the serialized options.
    fn build_options(proto: &[u8]) -> &[u8] {
        assert_eq!(proto[0], 0x1a);
        &proto[2..2 + proto[1] as usize]
    }

    #[test]
    fn an_spmd_program_lets_the_partitioner_split_its_results() {
        let options = CompileOptions::partitioned(vec![0, 1]).to_proto();
        assert!(build_options(&options).ends_with(&[0x60, 0x01]));
    }

    #[test]
    fn a_single_device_program_has_no_sharding_options() {
        let options = CompileOptions::default().to_proto();
        assert_eq!(build_options(&options), &[0x20, 0x01, 0x28, 0x01]);
    }
}
