//! Native kernels: XLA FFI handler libraries, as written for `jax.ffi`, loaded into the node.
//!
//! A kernel is a shared library exporting an `XLA_FFI_Handler` symbol (usually defined with
//! XLA's `XLA_FFI_DEFINE_HANDLER_SYMBOL`); a program calls it as
//! `stablehlo.custom_call @target(...)`. [`load_kernel`] registers such a handler for the
//! client's platform, and says why when it cannot, which XLA itself does not do well:
//!
//! - The PJRT FFI extension reports success for every registration, so handlers go through
//!   `XLA_FFI_Handler_Register` of the plugin's FFI API table instead (captured from a call
//!   frame, see `ffi.rs`), which returns XLA's real error (version rejected, duplicate name).
//! - Before registering, the node asks the handler for its FFI version itself (the metadata
//!   query XLA would send) so that a handler built against newer headers than the plugin speaks
//!   is refused with both versions and the remedy. With the version shim, the node answers that
//!   query in the handler's place and forwards every other call: the FFI ABI differs between
//!   0.2 and 0.3 only in the state get/set arguments, so this is sound for kernels without FFI
//!   state, and the shim refuses handlers that declare a state type.
//! - XLA cannot unregister a handler, so a loaded library stays loaded for the life of the
//!   process; loading the same (target, library, symbol) again is a no-op.

#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::catch::call_catching;
use super::client::Client;
use super::ffi;
use super::sys::*;

/// What to load: the custom-call target a program names, and where its handler lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSpec {
    pub target: String,
    pub library: PathBuf,
    pub symbol: String,
    /// Answer a newer handler's version query in its place (see the module documentation).
    pub version_shim: bool,
}

/// A registered kernel, as `:info` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedKernel {
    pub target: String,
    /// The library's canonical path.
    pub library: PathBuf,
    pub symbol: String,
    /// The FFI API version the handler was built against (its headers').
    pub ffi_version: (i32, i32),
    /// Whether the node answers the handler's version query for it.
    pub shimmed: bool,
}

/// What [`load_kernel`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    New(LoadedKernel),
    /// The same target, library and symbol were loaded before: nothing changed.
    Already(LoadedKernel),
}

/// Why a kernel could not be loaded, naming the target, the file and the symbol.
#[derive(Debug, Clone, thiserror::Error)]
#[error("kernel {target} ({library}, symbol {symbol}): {reason}")]
pub struct KernelError {
    pub target: String,
    pub library: String,
    pub symbol: String,
    pub reason: String,
}

/// Handlers registered through the shim are forwarded by one of these slots.
pub const MAX_SHIMMED: usize = 16;

static KERNELS: Mutex<Vec<LoadedKernel>> = Mutex::new(Vec::new());
static SHIMMED: [OnceLock<XLA_FFI_Handler>; MAX_SHIMMED] = [const { OnceLock::new() }; MAX_SHIMMED];
/// The next unused shim slot. Slots are never reused, even after a failed load: XLA may hold on
/// to a trampoline it was given.
static NEXT_SHIM_SLOT: AtomicUsize = AtomicUsize::new(0);

/// The kernels loaded in this process, in load order.
pub fn loaded_kernels() -> Vec<LoadedKernel> {
    KERNELS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A sentence listing the loaded kernels, for errors about unknown custom-call targets.
pub fn describe_loaded_kernels() -> String {
    let kernels = loaded_kernels();
    if kernels.is_empty() {
        return "No kernels are loaded (--kernel TARGET=PATH:SYMBOL, or XlaNode.load_kernel/5)."
            .to_string();
    }
    let names: Vec<String> = kernels
        .iter()
        .map(|k| format!("{} ({}:{})", k.target, k.library.display(), k.symbol))
        .collect();
    format!("Loaded kernels: {}.", names.join(", "))
}

/// Loads `spec.library`, checks the handler's FFI version and registers it for the client's
/// platform, verified by a test compile. Blocking: call it off the async runtime.
pub fn load_kernel(client: &Client, spec: &KernelSpec) -> Result<Loaded, KernelError> {
    let fail = |reason: String| KernelError {
        target: spec.target.clone(),
        library: spec.library.display().to_string(),
        symbol: spec.symbol.clone(),
        reason,
    };
    if !ffi::valid_target_name(&spec.target) {
        return Err(fail(
            "invalid target name (letters, digits, '_', '.', '-' and '$' only)".into(),
        ));
    }
    let library = std::fs::canonicalize(&spec.library)
        .map_err(|e| fail(format!("cannot open the library: {e}")))?;
    if !library.is_file() {
        return Err(fail("not a file".into()));
    }
    let mut kernels = KERNELS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(k) = kernels.iter().find(|k| k.target == spec.target) {
        return if k.library == library && k.symbol == spec.symbol {
            Ok(Loaded::Already(k.clone()))
        } else {
            Err(fail(format!(
                "target {} is already served by {} (symbol {})",
                k.target,
                k.library.display(),
                k.symbol
            )))
        };
    }
    if ffi::is_host_target(&spec.target) {
        return Err(fail(format!(
            "target {} is one of xla_node's own callback targets",
            spec.target
        )));
    }
    let api = ffi_api(client).map_err(fail)?;
    let (lib, handler) = open_handler(&library, &spec.symbol).map_err(fail)?;
    let metadata = query_metadata(api, handler).map_err(fail)?;
    let plugin = (api.api_version.major_version, api.api_version.minor_version);
    let version = (
        metadata.api_version.major_version,
        metadata.api_version.minor_version,
    );
    let newer = version.0 != plugin.0 || version.1 > plugin.1;
    let shimmed = newer && spec.version_shim;
    if newer && !spec.version_shim {
        return Err(fail(format!(
            "the handler was built against XLA FFI {}.{} headers, but this node's XLA speaks FFI \
             {}.{} and accepts handlers up to {}.{}. Rebuild the kernel against the headers of \
             an FFI <= {}.{} (jaxlib 0.8.1's jaxlib/include, from `pip download --no-deps \
             jaxlib==0.8.1`), or load it with the version shim (--kernel-version-shim, or \
             version_shim: true), which is safe only for kernels without FFI state",
            version.0, version.1, plugin.0, plugin.1, plugin.0, plugin.1, plugin.0, plugin.1
        )));
    }
    if shimmed && version.0 != plugin.0 {
        return Err(fail(format!(
            "the handler speaks XLA FFI {}.{}; the version shim only bridges minor versions of \
             FFI {}.x",
            version.0, version.1, plugin.0
        )));
    }
    if shimmed && metadata.state_type_id != 0 {
        return Err(fail(
            "the handler keeps FFI state, which the version shim cannot carry: rebuild it \
             against the plugin's FFI headers"
                .into(),
        ));
    }
    let registered = if shimmed {
        let slot = NEXT_SHIM_SLOT.fetch_add(1, Ordering::Relaxed);
        if slot >= MAX_SHIMMED {
            return Err(fail(format!(
                "at most {MAX_SHIMMED} kernels can be loaded with the version shim"
            )));
        }
        // A fresh slot: this is its only `set`.
        let _ = SHIMMED[slot].set(handler);
        SHIM_TRAMPOLINES[slot]
    } else {
        handler
    };
    register(
        api,
        &spec.target,
        client.ffi_platform(),
        registered,
        if shimmed { 0 } else { metadata.traits },
    )
    .map_err(fail)?;
    // XLA keeps the handler for the life of the process from here on: so must the library.
    std::mem::forget(lib);
    ffi::verify_registration(client, &spec.target).map_err(|e| fail(e.message().to_string()))?;
    let loaded = LoadedKernel {
        target: spec.target.clone(),
        library,
        symbol: spec.symbol.clone(),
        ffi_version: version,
        shimmed,
    };
    kernels.push(loaded.clone());
    Ok(Loaded::New(loaded))
}

/// The plugin's FFI API table; it is learnt from the first metadata query XLA sends, so a
/// throwaway host handler is registered if none was yet.
fn ffi_api(client: &Client) -> Result<&'static XLA_FFI_Api, String> {
    if let Some(api) = ffi::ffi_api() {
        return Ok(api);
    }
    let unused: ffi::HostHandler = std::sync::Arc::new(|_| Err("not a kernel".into()));
    ffi::register_host_handler(client, "xla_node_ffi_api_probe", unused)
        .map_err(|e| format!("cannot reach the plugin's FFI API: {}", e.message()))?;
    ffi::ffi_api().ok_or_else(|| "the plugin never passed its FFI API to a handler".to_string())
}

/// Opens the library and finds the handler symbol.
fn open_handler(
    library: &Path,
    symbol: &str,
) -> Result<(libloading::Library, XLA_FFI_Handler), String> {
    // SAFETY: loading a library runs its initializers; loading kernels is what the operator
    // asked for, from a path they named (or allowed with --kernel-dir).
    let lib = unsafe { libloading::Library::new(library) }
        .map_err(|e| format!("not a loadable shared library: {e}"))?;
    // SAFETY: the symbol is taken to be an `XLA_FFI_Handler`, the documented contract of a
    // kernel symbol; its metadata query below checks that it answers like one.
    let handler = unsafe { lib.get::<XLA_FFI_Handler>(symbol.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("no exported symbol {symbol}: {e}"))?;
    Ok((lib, handler))
}

/// Sends `handler` XLA's metadata query: a call frame carrying a metadata extension, which a
/// handler built with XLA's C++ API answers with its headers' FFI version, traits and state type.
fn query_metadata(
    api: &'static XLA_FFI_Api,
    handler: XLA_FFI_Handler,
) -> Result<XLA_FFI_Metadata, String> {
    let mut metadata = XLA_FFI_Metadata {
        struct_size: XLA_FFI_Metadata::SIZE,
        api_version: XLA_FFI_Api_Version {
            struct_size: XLA_FFI_Api_Version::SIZE,
            extension_start: std::ptr::null_mut(),
            major_version: -1,
            minor_version: -1,
        },
        traits: 0,
        state_type_id: 0,
    };
    let mut extension = XLA_FFI_Metadata_Extension {
        extension_base: XLA_FFI_Extension_Base {
            struct_size: std::mem::size_of::<XLA_FFI_Metadata_Extension>(),
            type_: XLA_FFI_EXTENSION_METADATA,
            next: std::ptr::null_mut(),
        },
        metadata: &mut metadata,
    };
    let empty = || XLA_FFI_Args {
        struct_size: std::mem::size_of::<XLA_FFI_Args>(),
        extension_start: std::ptr::null_mut(),
        size: 0,
        types: std::ptr::null(),
        args: std::ptr::null(),
    };
    let mut frame = XLA_FFI_CallFrame {
        struct_size: XLA_FFI_CallFrame::SIZE,
        extension_start: &mut extension.extension_base,
        api,
        ctx: std::ptr::null_mut(),
        stage: XLA_FFI_STAGE_EXECUTE,
        args: empty(),
        rets: empty(),
        attrs: XLA_FFI_Attrs {
            struct_size: std::mem::size_of::<XLA_FFI_Attrs>(),
            extension_start: std::ptr::null_mut(),
            size: 0,
            types: std::ptr::null(),
            names: std::ptr::null(),
            attrs: std::ptr::null(),
        },
        future: std::ptr::null_mut(),
    };
    // SAFETY: the frame, its extension and the metadata it points to live on this stack for the
    // whole call; a metadata query reads nothing else and writes only `metadata`.
    let error = unsafe { call_catching(handler, &mut frame) }
        .map_err(|thrown| format!("the handler threw in XLA's metadata query: {thrown}"))?;
    if let Some(message) = take_ffi_error(api, error) {
        return Err(format!(
            "the handler failed XLA's metadata query: {message}"
        ));
    }
    if metadata.api_version.major_version < 0 {
        return Err(
            "the handler did not answer XLA's metadata query: is the symbol an XLA FFI \
                    handler (XLA_FFI_DEFINE_HANDLER_SYMBOL)?"
                .into(),
        );
    }
    Ok(metadata)
}

/// Registers `handler` as the execute stage of `target` through XLA's own registration call,
/// which reports what went wrong.
fn register(
    api: &'static XLA_FFI_Api,
    target: &str,
    platform: &str,
    handler: XLA_FFI_Handler,
    traits: u32,
) -> Result<(), String> {
    let register = api
        .XLA_FFI_Handler_Register
        .ok_or("the plugin's FFI API has no XLA_FFI_Handler_Register")?;
    let span = |s: &str| XLA_FFI_ByteSpan {
        ptr: s.as_ptr().cast(),
        len: s.len(),
    };
    let mut args = XLA_FFI_Handler_Register_Args {
        struct_size: XLA_FFI_Handler_Register_Args::SIZE,
        extension_start: std::ptr::null_mut(),
        name: span(target),
        platform: span(platform),
        bundle: XLA_FFI_Handler_Bundle {
            instantiate: None,
            prepare: None,
            initialize: None,
            execute: Some(handler),
        },
        traits,
    };
    // SAFETY: matching argument struct; XLA copies the name and platform; the handler stays
    // valid because its library is never unloaded.
    let error = unsafe { call_catching(register, &mut args) }
        .map_err(|thrown| format!("XLA's registration threw: {thrown}"))?;
    match take_ffi_error(api, error) {
        Some(message) => Err(format!("XLA refused the handler: {message}")),
        None => Ok(()),
    }
}

/// The message of an `XLA_FFI_Error` (which is then destroyed), or `None` for success.
pub(super) fn take_ffi_error(
    api: &'static XLA_FFI_Api,
    error: *mut XLA_FFI_Error,
) -> Option<String> {
    if error.is_null() {
        return None;
    }
    let mut message = "unknown error (the FFI API cannot read it)".to_string();
    if let Some(get) = api.XLA_FFI_Error_GetMessage {
        let mut args = XLA_FFI_Error_GetMessage_Args {
            struct_size: XLA_FFI_Error_GetMessage_Args::SIZE,
            extension_start: std::ptr::null_mut(),
            error,
            message: std::ptr::null(),
        };
        // SAFETY: `error` is a live error of this API; the message stays valid until destroyed.
        unsafe {
            get(&mut args);
            if !args.message.is_null() {
                message = std::ffi::CStr::from_ptr(args.message)
                    .to_string_lossy()
                    .into_owned();
            }
        }
    }
    if let Some(destroy) = api.XLA_FFI_Error_Destroy {
        let mut args = XLA_FFI_Error_Destroy_Args {
            struct_size: XLA_FFI_Error_Destroy_Args::SIZE,
            extension_start: std::ptr::null_mut(),
            error,
        };
        // SAFETY: `error` is live and owned by us; it is not used afterwards.
        unsafe { destroy(&mut args) };
    }
    Some(message)
}

ffi::slot_trampolines!(
    SHIM_TRAMPOLINES: MAX_SHIMMED, forward;
    s0 = 0,
    s1 = 1,
    s2 = 2,
    s3 = 3,
    s4 = 4,
    s5 = 5,
    s6 = 6,
    s7 = 7,
    s8 = 8,
    s9 = 9,
    s10 = 10,
    s11 = 11,
    s12 = 12,
    s13 = 13,
    s14 = 14,
    s15 = 15,
);

/// The version shim: answers XLA's metadata query with the plugin's own FFI version (and no
/// traits, no state) and hands every other call to the shimmed handler unchanged.
///
/// # Safety
/// `frame` must be null or a valid `XLA_FFI_CallFrame` for the duration of the call.
unsafe fn forward(slot: usize, frame: *mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error {
    if frame.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: non-null frame provided by XLA.
    let f = unsafe { &*frame };
    if !f.api.is_null() {
        // SAFETY: `api` is XLA's FFI table, valid while the frame is.
        let version = unsafe { &(*f.api).api_version };
        // SAFETY: the frame is valid (see above).
        if unsafe { ffi::answer_metadata_query(f, (version.major_version, version.minor_version)) }
        {
            return std::ptr::null_mut();
        }
    }
    let Some(&handler) = SHIMMED[slot].get() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the frame is XLA's, passed on unchanged to the handler it was meant for.
    match unsafe { call_catching(handler, frame) } {
        Ok(error) => error,
        // SAFETY: the frame is valid (see above).
        Err(thrown) => unsafe { ffi::make_error(f, &format!("the kernel threw: {thrown}")) },
    }
}
