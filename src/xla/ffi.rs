//! Host custom-call handlers (XLA FFI, `api_version = 4` custom calls).
//!
//! Lets Rust closures serve `stablehlo.custom_call @target(...)` ops, e.g. EXLA's
//! `@exla_runtime_callback`, in programs of the client's own platform: on the CPU ("Host") the
//! closure reads and writes the call's buffers in place; inside a CUDA program its operands are
//! first copied to the host on the call's stream and its results copied back after it (`cuda`),
//! so the closure sees the same host bytes on both.
//!
//! Registration goes through the PJRT FFI extension (type 5 in the plugin's
//! extension chain). An `XLA_FFI_Handler` is a bare C function pointer with no
//! user-data argument, so a fixed number of static trampolines ([`MAX_HANDLERS`])
//! each dispatch to the closure stored in their slot. XLA's registration
//! reports success even when it silently failed, so every registration is
//! verified by compiling a tiny module that uses the target.
//!
//! A trampoline answers XLA's metadata query (FFI API version 0.1) before
//! anything else, ignores every stage but EXECUTE, catches panics, and turns a
//! handler's `Err(text)` into an `XLA_FFI_Error` carrying exactly that text,
//! which then surfaces as [`XlaError::Runtime`] from `Executable::execute`.
//!
//! [`CallFrame`] is the safe view of a call: argument data is lent as `&[u8]`
//! through `&self`, result data as `&mut [u8]` through `&mut self`, so the
//! borrow checker forbids holding both at once. That keeps results that alias
//! operands (`output_operand_aliases`: XLA passes the same pointer) sound.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CString};
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::catch::call_catching;
use super::client::Client;
use super::cuda;
use super::dtype::{element_count, DType};
use super::error::XlaError;
use super::packing;
use super::sys::*;

/// A host handler: reads arguments, writes results, or fails with a message.
pub type HostHandler = Arc<dyn Fn(&mut CallFrame<'_>) -> Result<(), String> + Send + Sync>;

/// Number of distinct custom-call targets that can be registered per process.
pub const MAX_HANDLERS: usize = 16;

static SLOTS: [RwLock<Option<HostHandler>>; MAX_HANDLERS] =
    [const { RwLock::new(None) }; MAX_HANDLERS];

/// Whether each slot's handler serves CUDA programs (its buffers are device memory).
static SLOT_ON_GPU: [AtomicBool; MAX_HANDLERS] = [const { AtomicBool::new(false) }; MAX_HANDLERS];

/// The platforms whose programs the handlers can serve, as XLA's FFI registry names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerPlatform {
    /// The CPU: buffers are host memory.
    Host,
    /// NVIDIA GPUs: buffers are device memory, copied through the call's stream.
    Cuda,
}

impl HandlerPlatform {
    /// The platform the handlers would serve on `client`, or why there is none.
    pub fn of(client: &Client) -> Result<HandlerPlatform, XlaError> {
        match client.ffi_platform() {
            "Host" => Ok(HandlerPlatform::Host),
            "CUDA" => Ok(HandlerPlatform::Cuda),
            _ => Err(XlaError::Plugin(format!(
                "the node has no host-callback handler for platform {:?} (only for cpu and cuda)",
                client.platform_name()
            ))),
        }
    }

    fn registry_name(self) -> &'static [u8] {
        match self {
            HandlerPlatform::Host => b"Host",
            HandlerPlatform::Cuda => b"CUDA",
        }
    }
}

/// target name → slot index (process-wide, like XLA's own registry), and the
/// next unused slot (slots are never reused: XLA may keep a registration).
static REGISTRY: Mutex<Option<(HashMap<String, usize>, usize)>> = Mutex::new(None);

/// The plugin's `XLA_FFI_Api` table, as seen in the first metadata query (XLA passes it in every
/// call frame; it is static data of the plugin). Loading kernels needs it: its
/// `XLA_FFI_Handler_Register` reports registration errors that the PJRT extension swallows.
static FFI_API: AtomicPtr<XLA_FFI_Api> = AtomicPtr::new(std::ptr::null_mut());

/// The plugin's FFI API table, once any host handler has been registered.
pub(crate) fn ffi_api() -> Option<&'static XLA_FFI_Api> {
    let api = FFI_API.load(Ordering::Acquire);
    // SAFETY: only ever set to the `api` pointer of a call frame, which is the plugin's static
    // table; the plugin stays loaded for the life of the process.
    unsafe { api.as_ref() }
}

/// Whether `target` is served by one of this process's host handlers.
pub(crate) fn is_host_target(target: &str) -> bool {
    let reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    reg.as_ref().is_some_and(|(r, _)| r.contains_key(target))
}

/// Defines `count` static `XLA_FFI_Handler`s in the array `$array`, the i-th calling
/// `$body(i, frame)`. An XLA handler is a bare function pointer with no user data, so each slot
/// of a handler table needs a function of its own.
macro_rules! slot_trampolines {
    ($array:ident: $count:expr, $body:ident; $($name:ident = $idx:expr),* $(,)?) => {
        $(
            unsafe extern "C" fn $name(frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
                // SAFETY: XLA calls handlers with a valid call frame (or null, which the body
                // tolerates).
                unsafe { $body($idx, frame) }
            }
        )*
        static $array: [XLA_FFI_Handler; $count] = [$($name),*];
    };
}
pub(super) use slot_trampolines;

slot_trampolines!(
    TRAMPOLINES: MAX_HANDLERS, dispatch;
    t0 = 0,
    t1 = 1,
    t2 = 2,
    t3 = 3,
    t4 = 4,
    t5 = 5,
    t6 = 6,
    t7 = 7,
    t8 = 8,
    t9 = 9,
    t10 = 10,
    t11 = 11,
    t12 = 12,
    t13 = 13,
    t14 = 14,
    t15 = 15,
);

/// Common body of all trampolines.
///
/// # Safety
/// `frame` must be null or a valid `XLA_FFI_CallFrame` for the duration of
/// the call, as XLA guarantees.
unsafe fn dispatch(slot: usize, frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-null frame provided by XLA.
    let f = unsafe { &*frame };
    if !f.api.is_null() && FFI_API.load(Ordering::Relaxed).is_null() {
        FFI_API.store(f.api as *mut XLA_FFI_Api, Ordering::Release);
    }
    // 1. Metadata query: answer the supported FFI API version.
    // SAFETY: the frame is valid (see above).
    if unsafe { answer_metadata_query(f, (0, 1)) } {
        return std::ptr::null_mut();
    }
    // 2. Only the execute stage does work.
    if f.stage != XLA_FFI_STAGE_EXECUTE {
        return std::ptr::null_mut();
    }
    let handler = match SLOTS[slot].read() {
        Ok(g) => g.clone(),
        Err(p) => p.into_inner().clone(),
    };
    let Some(handler) = handler else {
        // SAFETY: valid frame (see above).
        return unsafe { make_error(f, "no host handler installed for this custom call") };
    };
    let mut cf = CallFrame {
        raw: frame,
        host: None,
        _life: PhantomData,
    };
    let staged = if SLOT_ON_GPU[slot].load(Ordering::Relaxed) {
        // SAFETY: valid frame of a CUDA program's running call (see above).
        match unsafe { cf.stage_on_host() } {
            Ok(staged) => Some(staged),
            // SAFETY: valid frame (see above).
            Err(msg) => return unsafe { make_error(f, &msg) },
        }
    } else {
        None
    };
    let mut result = catch_unwind(AssertUnwindSafe(|| handler(&mut cf)));
    if let Some(staged) = staged {
        let handled = matches!(result, Ok(Ok(())));
        if let Err(msg) = staged.finish(handled) {
            result = Ok(Err(msg));
        }
    }
    match result {
        Ok(Ok(())) => std::ptr::null_mut(),
        // SAFETY: valid frame (see above).
        Ok(Err(msg)) => unsafe { make_error(f, &msg) },
        Err(panic) => {
            let msg = if let Some(s) = panic.downcast_ref::<&str>() {
                format!("host handler panicked: {s}")
            } else if let Some(s) = panic.downcast_ref::<String>() {
                format!("host handler panicked: {s}")
            } else {
                "host handler panicked".to_string()
            };
            // SAFETY: valid frame (see above).
            unsafe { make_error(f, &msg) }
        }
    }
}

/// If `f` is XLA's metadata query (a frame carrying a Metadata extension), answers it with FFI
/// API version `(major, minor)`, no traits and no state, and returns true.
///
/// # Safety
/// `f` must be a valid call frame, as XLA passes to handlers.
pub(super) unsafe fn answer_metadata_query(f: &XLA_FFI_CallFrame, version: (c_int, c_int)) -> bool {
    let mut ext = f.extension_start;
    while !ext.is_null() {
        // SAFETY: extension chain entries are valid while the frame is.
        let e = unsafe { &*ext };
        if e.type_ == XLA_FFI_EXTENSION_METADATA {
            // SAFETY: an extension of type Metadata is an `XLA_FFI_Metadata_Extension` whose
            // `metadata` points to a writable `XLA_FFI_Metadata` (up to `traits`).
            unsafe {
                let m = &*(ext as *const XLA_FFI_Metadata_Extension);
                if !m.metadata.is_null() {
                    (*m.metadata).api_version.major_version = version.0;
                    (*m.metadata).api_version.minor_version = version.1;
                    (*m.metadata).traits = 0;
                }
            }
            return true;
        }
        ext = e.next;
    }
    false
}

/// Creates an `XLA_FFI_Error` with `msg` through the frame's API table.
///
/// # Safety
/// `f.api` must be null or point to a valid `XLA_FFI_Api`.
pub(crate) unsafe fn make_error(f: &XLA_FFI_CallFrame, msg: &str) -> *mut XLA_FFI_Error {
    if f.api.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `api` is XLA's static FFI API table (checked non-null).
    let Some(create) = (unsafe { (*f.api).XLA_FFI_Error_Create }) else {
        return std::ptr::null_mut();
    };
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    let mut args = XLA_FFI_Error_Create_Args {
        struct_size: XLA_FFI_Error_Create_Args::SIZE,
        extension_start: std::ptr::null_mut(),
        message: c.as_ptr(),
        errc: XLA_FFI_ERROR_CODE_INTERNAL,
    };
    // SAFETY: matching argument struct; XLA copies the message.
    unsafe { create(&mut args) }
}

/// Whether `target` can name a custom-call target: letters, digits, `_`, `.`, `-` and `$`, which
/// a module can write unquoted and the verification module can embed.
pub(crate) fn valid_target_name(target: &str) -> bool {
    !target.is_empty()
        && target
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '$'))
}

/// Registers `handler` for custom-call target `target` on the client's platform (see
/// [`HandlerPlatform`]; another platform is an error saying so).
///
/// Registering a target again replaces its handler (XLA keeps the first
/// registration, which points at the same trampoline). Registration is
/// verified by compiling a module that uses the target.
pub fn register_host_handler(
    client: &Client,
    target: &str,
    handler: HostHandler,
) -> Result<(), XlaError> {
    if !valid_target_name(target) {
        return Err(XlaError::Argument(format!(
            "invalid custom-call target name {target:?}"
        )));
    }
    let platform = HandlerPlatform::of(client)?;
    let mut reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let (reg, next_slot) = reg.get_or_insert_with(|| (HashMap::new(), 0));
    if let Some(&slot) = reg.get(target) {
        *SLOTS[slot].write().unwrap_or_else(|p| p.into_inner()) = Some(handler);
        SLOT_ON_GPU[slot].store(platform == HandlerPlatform::Cuda, Ordering::Relaxed);
        return Ok(());
    }
    let slot = *next_slot;
    if slot >= MAX_HANDLERS {
        return Err(XlaError::Plugin(format!(
            "too many host handlers (at most {MAX_HANDLERS} targets)"
        )));
    }
    let ext = find_ffi_extension(client)?;
    // SAFETY: `ext` points to the plugin's static FFI extension struct.
    let register = unsafe { (*ext).register_handler }
        .ok_or_else(|| XlaError::Plugin("FFI extension has no register_handler".into()))?;
    *next_slot += 1;
    *SLOTS[slot].write().unwrap_or_else(|p| p.into_inner()) = Some(handler);
    SLOT_ON_GPU[slot].store(platform == HandlerPlatform::Cuda, Ordering::Relaxed);
    let platform = platform.registry_name();
    let mut args = PJRT_FFI_Register_Handler_Args {
        struct_size: PJRT_FFI_Register_Handler_Args::SIZE,
        target_name: target.as_ptr() as *const _,
        target_name_size: target.len(),
        handler: TRAMPOLINES[slot] as *mut c_void,
        platform_name: platform.as_ptr() as *const _,
        platform_name_size: platform.len(),
        traits: 0,
    };
    let api = client.inner().api();
    // SAFETY: matching argument struct; name/platform strings outlive the call
    // (XLA copies them); the trampoline is a static function.
    let registered = unsafe { call_catching(register, &mut args) }.map(|err| api.take_error(err));
    let verified = match registered {
        Err(thrown) => Err(XlaError::Plugin(format!(
            "registering FFI handler {target}: {thrown}"
        ))),
        Ok(Some(msg)) => Err(XlaError::Plugin(format!(
            "registering FFI handler {target}: {msg}"
        ))),
        Ok(None) => verify_registration(client, target),
    };
    match verified {
        Ok(()) => {
            reg.insert(target.to_string(), slot);
            Ok(())
        }
        Err(e) => {
            *SLOTS[slot].write().unwrap_or_else(|p| p.into_inner()) = None;
            Err(e)
        }
    }
}

fn find_ffi_extension(client: &Client) -> Result<*const PJRT_FFI_Extension, XlaError> {
    let api = client.inner().api();
    let mut ext = api.fns().extension_start;
    while !ext.is_null() {
        // SAFETY: extension chain entries are static plugin data.
        let e = unsafe { &*ext };
        if e.type_ == PJRT_EXTENSION_TYPE_FFI {
            if e.struct_size < std::mem::size_of::<PJRT_FFI_Extension>() {
                return Err(XlaError::Plugin("FFI extension struct too small".into()));
            }
            return Ok(ext as *const PJRT_FFI_Extension);
        }
        ext = e.next;
    }
    Err(XlaError::Plugin("PJRT plugin has no FFI extension".into()))
}

pub(crate) fn verify_registration(client: &Client, target: &str) -> Result<(), XlaError> {
    let module = format!(
        "func.func @main(%x: tensor<1xui8>) -> tensor<1xui8> {{\n  \
         %0 = stablehlo.custom_call @\"{target}\"(%x) {{api_version = 4 : i32, has_side_effect = true}} : (tensor<1xui8>) -> tensor<1xui8>\n  \
         return %0 : tensor<1xui8>\n}}\n"
    );
    client
        .compile(module.as_bytes())
        .map(|_| ())
        .map_err(|e| XlaError::Plugin(format!("FFI handler {target} not usable: {}", e.message())))
}

/// A custom-call attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum Attr {
    Bool(bool),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    F32(f32),
    F64(f64),
    ArrayI8(Vec<i8>),
    ArrayI16(Vec<i16>),
    ArrayI32(Vec<i32>),
    ArrayI64(Vec<i64>),
    ArrayU8(Vec<u8>),
    ArrayU16(Vec<u16>),
    ArrayU32(Vec<u32>),
    ArrayU64(Vec<u64>),
    ArrayF32(Vec<f32>),
    ArrayF64(Vec<f64>),
    Str(String),
    /// Dictionaries and other element types.
    Unsupported,
}

/// An argument of a custom call (read-only view).
#[derive(Debug)]
pub struct TensorRef<'a> {
    /// `None` for element types outside [`DType`] (see `xla_type`).
    pub dtype: Option<DType>,
    /// Raw `XLA_FFI_DataType` value.
    pub xla_type: u32,
    pub dims: Vec<i64>,
    /// Dense row-major bytes as XLA holds them in device memory (empty for unsupported
    /// element types): packed for 2- and 4-bit elements, in another order than Nx's.
    pub data: &'a [u8],
}

impl TensorRef<'_> {
    /// The operand's bytes packed as Nx packs them: `data` itself but for 2- and 4-bit
    /// elements, whose order within each byte differs in XLA's device memory.
    pub fn to_nx_bytes(&self) -> Vec<u8> {
        let mut bytes = self.data.to_vec();
        if let Some(dtype) = self.dtype {
            packing::swap_device_order(dtype, &mut bytes);
        }
        bytes
    }
}

/// A result of a custom call (writable view).
#[derive(Debug)]
pub struct TensorMut<'a> {
    pub dtype: Option<DType>,
    pub xla_type: u32,
    pub dims: Vec<i64>,
    pub data: &'a mut [u8],
}

impl TensorMut<'_> {
    /// Writes the result from bytes packed as Nx packs them (see [`TensorRef::to_nx_bytes`]);
    /// `nx` must be exactly `data`'s length.
    pub fn write_nx_bytes(&mut self, nx: &[u8]) {
        self.data.copy_from_slice(nx);
        if let Some(dtype) = self.dtype {
            packing::swap_device_order(dtype, self.data);
        }
    }
}

/// Safe view of one custom-call invocation.
pub struct CallFrame<'a> {
    raw: *mut XLA_FFI_CallFrame,
    /// Inside a CUDA program: the host copies that stand for the call's device buffers.
    host: Option<HostCopies>,
    _life: PhantomData<&'a mut XLA_FFI_CallFrame>,
}

/// Host addresses that replace the device addresses of a call's buffers, by list position.
struct HostCopies {
    args: Vec<*mut u8>,
    rets: Vec<*mut u8>,
}

struct RawTensor {
    xla_type: u32,
    dims: Vec<i64>,
    data: *mut u8,
    len: usize,
}

impl RawTensor {
    fn dtype(&self) -> Option<DType> {
        DType::from_xla(self.xla_type)
    }
}

/// Bits of one element of an `XLA_FFI_DataType`, if it has data. Elements narrower than a byte
/// are packed in device memory (see [`super::packing`]).
fn xla_type_bits(t: u32) -> Option<usize> {
    match DType::from_xla(t) {
        Some(d) => Some(d.bits() as usize),
        // FP8 variants without an Nx equivalent.
        None if matches!(t, 23 | 24 | 25 | 28 | 29 | 33) => Some(8),
        // F4E2M1FN.
        None if t == 32 => Some(4),
        None => None,
    }
}

impl CallFrame<'_> {
    fn frame(&self) -> &XLA_FFI_CallFrame {
        // SAFETY: `raw` is the valid frame XLA passed to the trampoline; a
        // `CallFrame` never outlives that call.
        unsafe { &*self.raw }
    }

    /// Entry `i` of the operands (`rets` false) or results as a buffer, at its host address.
    fn buffer(&self, rets: bool, i: usize) -> Option<RawTensor> {
        let f = self.frame();
        let list = if rets { &f.rets } else { &f.args };
        let mut t = Self::raw_tensor(list, i)?;
        if let Some(host) = &self.host {
            let copies = if rets { &host.rets } else { &host.args };
            t.data = copies.get(i).copied().unwrap_or(std::ptr::null_mut());
        }
        Some(t)
    }

    /// Copies the operands of a call inside a CUDA program to the host, and sets aside host
    /// room for its results; the frame's views then show those host copies.
    ///
    /// # Safety
    /// The frame must be that of a running call of a CUDA program, as XLA passes it.
    unsafe fn stage_on_host(&mut self) -> Result<cuda::Staged, String> {
        let f = self.frame();
        let reaches_stream_get = |api: &&XLA_FFI_Api| {
            api.struct_size >= std::mem::offset_of!(XLA_FFI_Api, XLA_FFI_Stream_Get) + 8
        };
        // SAFETY: `f.api` is XLA's static FFI table (null-checked), loaded for the life of the
        // process; `struct_size` says whether it reaches `XLA_FFI_Stream_Get`.
        let api: &'static XLA_FFI_Api = unsafe { f.api.as_ref() }
            .filter(reaches_stream_get)
            .ok_or("the plugin's FFI gives no stream to a callback inside a GPU program")?;
        let stream_get = api
            .XLA_FFI_Stream_Get
            .ok_or("the plugin's FFI gives no stream to a callback inside a GPU program")?;
        let mut args = XLA_FFI_Stream_Get_Args {
            struct_size: XLA_FFI_Stream_Get_Args::SIZE,
            extension_start: std::ptr::null_mut(),
            ctx: f.ctx,
            stream: std::ptr::null_mut(),
        };
        // SAFETY: matching argument struct; `ctx` is the running call's execution context.
        let err = unsafe { stream_get(&mut args) };
        if let Some(msg) = super::kernel::take_ffi_error(api, err) {
            return Err(format!("getting the callback's CUDA stream: {msg}"));
        }
        // One region per list position; entries that are not buffers take no room.
        let regions = |list: &XLA_FFI_Args| -> Vec<cuda::DeviceRegion> {
            (0..Self::list_len(list))
                .map(|i| match Self::raw_tensor(list, i) {
                    Some(t) => cuda::DeviceRegion {
                        device: t.data,
                        len: t.len,
                    },
                    None => cuda::DeviceRegion {
                        device: std::ptr::null_mut(),
                        len: 0,
                    },
                })
                .collect()
        };
        // SAFETY: `args.stream` is the call's stream and the regions its buffers (the
        // function's contract).
        let staged = unsafe { cuda::stage(args.stream, &regions(&f.args), &regions(&f.rets)) }?;
        let host = HostCopies {
            args: staged.operands.clone(),
            rets: staged.results.clone(),
        };
        self.host = Some(host);
        Ok(staged)
    }

    /// Reads entry `i` of an args/rets list as a buffer, at the address XLA gave.
    fn raw_tensor(list: &XLA_FFI_Args, i: usize) -> Option<RawTensor> {
        // SAFETY: `i < list.size`, checked by callers; `types` and `args`
        // have `size` entries; a BUFFER entry points to an `XLA_FFI_Buffer`
        // whose `dims` has `rank` entries.
        unsafe {
            if *list.types.add(i) != XLA_FFI_ARG_TYPE_BUFFER {
                return None;
            }
            let b = &*(*list.args.add(i) as *const XLA_FFI_Buffer);
            let rank = usize::try_from(b.rank).ok()?;
            let dims = if rank == 0 || b.dims.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(b.dims, rank).to_vec()
            };
            let len = match xla_type_bits(b.dtype) {
                Some(bits) if !b.data.is_null() => (element_count(&dims) * bits).div_ceil(8),
                _ => 0,
            };
            Some(RawTensor {
                xla_type: b.dtype,
                dims,
                data: b.data as *mut u8,
                len,
            })
        }
    }

    fn list_len(list: &XLA_FFI_Args) -> usize {
        usize::try_from(list.size).unwrap_or(0)
    }

    /// Operands (non-buffer operands, e.g. tokens, are skipped).
    pub fn args(&self) -> Vec<TensorRef<'_>> {
        (0..Self::list_len(&self.frame().args))
            .filter_map(|i| self.buffer(false, i))
            .map(|t| TensorRef {
                dtype: t.dtype(),
                xla_type: t.xla_type,
                data: if t.len == 0 {
                    &[]
                } else {
                    // SAFETY: XLA guarantees the operand buffer holds `len`
                    // bytes for the duration of the call; it is only read
                    // here, and writable views (`rets_mut`) need `&mut self`,
                    // so no `&mut` to possibly aliased memory can coexist.
                    unsafe { std::slice::from_raw_parts(t.data, t.len) }
                },
                dims: t.dims,
            })
            .collect()
    }

    /// Result types (no data), usable while holding [`CallFrame::args`].
    pub fn ret_specs(&self) -> Vec<(Option<DType>, Vec<i64>)> {
        (0..Self::list_len(&self.frame().rets))
            .filter_map(|i| self.buffer(true, i))
            .map(|t| (t.dtype(), t.dims))
            .collect()
    }

    /// For each result, the operand index it shares memory with (via
    /// `output_operand_aliases`), if any.
    pub fn ret_aliases(&self) -> Vec<Option<usize>> {
        let f = self.frame();
        let args: Vec<Option<RawTensor>> = (0..Self::list_len(&f.args))
            .map(|i| self.buffer(false, i))
            .collect();
        (0..Self::list_len(&f.rets))
            .filter_map(|i| self.buffer(true, i))
            .map(|r| {
                args.iter().position(|a| {
                    a.as_ref()
                        .is_some_and(|a| !r.data.is_null() && a.data == r.data)
                })
            })
            .collect()
    }

    /// Writable results. Fails if two results overlap in memory (the
    /// slices could not be handed out as disjoint `&mut`).
    pub fn rets_mut(&mut self) -> Result<Vec<TensorMut<'_>>, String> {
        let raws: Vec<RawTensor> = (0..Self::list_len(&self.frame().rets))
            .filter_map(|i| self.buffer(true, i))
            .collect();
        for (i, a) in raws.iter().enumerate() {
            for b in &raws[i + 1..] {
                let (a0, a1) = (a.data as usize, a.data as usize + a.len);
                let (b0, b1) = (b.data as usize, b.data as usize + b.len);
                if a.len > 0 && b.len > 0 && a0 < b1 && b0 < a1 {
                    return Err("custom-call results overlap in memory".into());
                }
            }
        }
        Ok(raws
            .into_iter()
            .map(|t| TensorMut {
                dtype: t.dtype(),
                xla_type: t.xla_type,
                data: if t.len == 0 {
                    &mut []
                } else {
                    // SAFETY: XLA provides each result buffer, writable for
                    // `len` bytes, for the duration of the call; results were
                    // checked to be pairwise disjoint above, and `&mut self`
                    // guarantees no `&[u8]` operand view (which might alias)
                    // is alive.
                    unsafe { std::slice::from_raw_parts_mut(t.data, t.len) }
                },
                dims: t.dims,
            })
            .collect())
    }

    /// Looks up an attribute by name.
    pub fn attr(&self, name: &str) -> Option<Attr> {
        let a = &self.frame().attrs;
        let n = usize::try_from(a.size).unwrap_or(0);
        for i in 0..n {
            // SAFETY: `i < size`; `names`, `types` and `attrs` have `size`
            // valid entries for the duration of the call.
            unsafe {
                if span_to_string(*a.names.add(i)) == name {
                    return Some(decode_attr(*a.types.add(i), *a.attrs.add(i)));
                }
            }
        }
        None
    }
}

/// # Safety
/// `s` must be null or point to a valid `XLA_FFI_ByteSpan`.
unsafe fn span_to_string(s: *const XLA_FFI_ByteSpan) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller; the span's bytes are valid.
    unsafe { super::client::str_from((*s).ptr, (*s).len) }
}

/// # Safety
/// `p` must point to the attribute structure that `ty` describes.
unsafe fn decode_attr(ty: u32, p: *mut c_void) -> Attr {
    if p.is_null() {
        return Attr::Unsupported;
    }
    macro_rules! arr {
        ($a:expr, $t:ty, $v:ident) => {{
            let a = $a;
            if a.data.is_null() || a.size == 0 {
                Attr::$v(Vec::new())
            } else {
                // SAFETY: an array attribute of this dtype holds `size`
                // (suitably aligned) elements of `$t` at `data`.
                let v = unsafe { std::slice::from_raw_parts(a.data as *const $t, a.size) };
                Attr::$v(v.to_vec())
            }
        }};
    }
    macro_rules! scalar {
        ($s:expr, $t:ty, $v:ident) => {{
            // SAFETY: a scalar attribute of this dtype points to one `$t`.
            Attr::$v(unsafe { std::ptr::read_unaligned($s.value as *const $t) })
        }};
    }
    match ty {
        XLA_FFI_ATTR_ARRAY => {
            // SAFETY: guaranteed by the caller.
            let a = unsafe { &*(p as *const XLA_FFI_Array) };
            match DType::from_xla(a.dtype) {
                Some(DType::S8) => arr!(a, i8, ArrayI8),
                Some(DType::S16) => arr!(a, i16, ArrayI16),
                Some(DType::S32) => arr!(a, i32, ArrayI32),
                Some(DType::S64) => arr!(a, i64, ArrayI64),
                Some(DType::U8) => arr!(a, u8, ArrayU8),
                Some(DType::U16) => arr!(a, u16, ArrayU16),
                Some(DType::U32) => arr!(a, u32, ArrayU32),
                Some(DType::U64) => arr!(a, u64, ArrayU64),
                Some(DType::F32) => arr!(a, f32, ArrayF32),
                Some(DType::F64) => arr!(a, f64, ArrayF64),
                _ => Attr::Unsupported,
            }
        }
        XLA_FFI_ATTR_SCALAR => {
            // SAFETY: guaranteed by the caller.
            let s = unsafe { &*(p as *const XLA_FFI_Scalar) };
            if s.value.is_null() {
                return Attr::Unsupported;
            }
            match DType::from_xla(s.dtype) {
                Some(DType::Pred) => {
                    // SAFETY: a PRED scalar points to one byte.
                    Attr::Bool(unsafe { *(s.value as *const u8) } != 0)
                }
                Some(DType::S8) => scalar!(s, i8, I8),
                Some(DType::S16) => scalar!(s, i16, I16),
                Some(DType::S32) => scalar!(s, i32, I32),
                Some(DType::S64) => scalar!(s, i64, I64),
                Some(DType::U8) => scalar!(s, u8, U8),
                Some(DType::U16) => scalar!(s, u16, U16),
                Some(DType::U32) => scalar!(s, u32, U32),
                Some(DType::U64) => scalar!(s, u64, U64),
                Some(DType::F32) => scalar!(s, f32, F32),
                Some(DType::F64) => scalar!(s, f64, F64),
                _ => Attr::Unsupported,
            }
        }
        // SAFETY: a STRING attribute is an `XLA_FFI_ByteSpan`.
        XLA_FFI_ATTR_STRING => Attr::Str(unsafe { span_to_string(p as *const XLA_FFI_ByteSpan) }),
        _ => Attr::Unsupported,
    }
}
