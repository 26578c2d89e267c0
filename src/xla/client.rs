//! Loading a PJRT plugin and creating a client.
//!
//! [`Api`] wraps the `PJRT_Api` function table of a dynamically loaded plugin
//! (e.g. the XLA CPU plugin `xla_cpu_pjrt.so`). Loading checks the table size
//! and version and runs `PJRT_Plugin_Initialize` once. A plugin is loaded at most once per process (a process-wide
//! table keyed by path) and is never unloaded: XLA keeps threads and static
//! state alive, and `dlclose` on it is not safe.
//!
//! [`Client`] is a cheap, cloneable, thread-safe handle (an `Arc`) on a
//! `PJRT_Client`; buffers and executables hold a clone so that the client and
//! the plugin outlive everything created from them.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_void};
use std::fmt;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::catch::{call_catching, Thrown};
use super::error::XlaError;
use super::options::{CreateOption, OptionValue};
use super::sys::*;

pub(crate) struct ApiInner {
    /// Kept alive (never unloaded) so that `raw` stays valid.
    _lib: ManuallyDrop<libloading::Library>,
    raw: *const PJRT_Api,
    path: PathBuf,
    version: (i32, i32),
}

// SAFETY: `raw` points to the plugin's immutable, process-lifetime function
// table; the PJRT C API is thread-safe per its contract, and everything else
// in the struct is plain owned data.
unsafe impl Send for ApiInner {}
// SAFETY: see `Send`; no interior mutability.
unsafe impl Sync for ApiInner {}

/// A loaded PJRT plugin.
#[derive(Clone)]
pub struct Api(pub(crate) Arc<ApiInner>);

static LOADED: Mutex<Vec<Api>> = Mutex::new(Vec::new());

impl Api {
    /// Loads (once per process and path) and initializes a PJRT plugin.
    pub fn load(path: impl AsRef<Path>) -> Result<Api, XlaError> {
        let path = path.as_ref();
        let canonical = path
            .canonicalize()
            .map_err(|e| XlaError::Plugin(format!("cannot open plugin {}: {e}", path.display())))?;
        let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(api) = loaded.iter().find(|a| a.0.path == canonical) {
            return Ok(api.clone());
        }
        let api = Api::load_uncached(&canonical)?;
        loaded.push(api.clone());
        Ok(api)
    }

    fn load_uncached(path: &Path) -> Result<Api, XlaError> {
        // SAFETY: loading a shared library runs its initialisers; the PJRT
        // plugin is designed to be dlopen'ed this way.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| XlaError::Plugin(format!("cannot load {}: {e}", path.display())))?;
        // SAFETY: `GetPjrtApi` is the documented entry point of every PJRT
        // plugin, with signature `const PJRT_Api* GetPjrtApi(void)`.
        let raw = unsafe {
            let get: libloading::Symbol<unsafe extern "C" fn() -> *const PJRT_Api> =
                lib.get(b"GetPjrtApi\0").map_err(|e| {
                    XlaError::Plugin(format!("{} has no GetPjrtApi: {e}", path.display()))
                })?;
            get()
        };
        if raw.is_null() {
            return Err(XlaError::Plugin("GetPjrtApi returned null".into()));
        }
        // SAFETY: `raw` is non-null and points to the plugin's static table;
        // we only read the leading size/version fields before checking them.
        let (size, major, minor) = unsafe {
            (
                (*raw).struct_size,
                (*raw).pjrt_api_version.major_version,
                (*raw).pjrt_api_version.minor_version,
            )
        };
        if major != PJRT_API_MAJOR {
            return Err(XlaError::Plugin(format!(
                "unsupported PJRT API version {major}.{minor} (need {PJRT_API_MAJOR}.x)"
            )));
        }
        if size < PJRT_API_STRUCT_SIZE {
            return Err(XlaError::Plugin(format!(
                "PJRT_Api struct too small: {size} bytes, need {PJRT_API_STRUCT_SIZE} (API {major}.{minor})"
            )));
        }
        let inner = ApiInner {
            _lib: ManuallyDrop::new(lib),
            raw,
            path: path.to_path_buf(),
            version: (major, minor),
        };
        let mut init = PJRT_Plugin_Initialize_Args::new();
        // SAFETY: correct argument struct for PJRT_Plugin_Initialize.
        unsafe { inner.call(inner.fns().PJRT_Plugin_Initialize, &mut init) }
            .map_err(|e| XlaError::Plugin(format!("PJRT_Plugin_Initialize: {e}")))?;
        Ok(Api(Arc::new(inner)))
    }

    /// PJRT C API version implemented by the plugin.
    pub fn version(&self) -> (i32, i32) {
        self.0.version
    }
}

impl ApiInner {
    pub(crate) fn fns(&self) -> &PJRT_Api {
        // SAFETY: `raw` was checked non-null and large enough at load time and
        // points to a table that lives as long as the (never unloaded) plugin.
        unsafe { &*self.raw }
    }

    /// Calls a PJRT entry point and converts its returned error.
    ///
    /// # Safety
    /// `args` must be the argument struct type that `f` expects, fully
    /// initialised as that function requires.
    pub(crate) unsafe fn call<T>(&self, f: ApiFn, args: &mut T) -> Result<(), String> {
        // SAFETY: guaranteed by the caller (matching argument struct).
        unsafe { self.call_or_throw(f, args) }.map_err(|failure| failure.to_string())
    }

    /// Calls a PJRT entry point through [`call_catching`], telling an error it returned from
    /// a C++ exception it threw. After a throw, `args` may be half-written: the caller must
    /// use none of its outputs.
    ///
    /// # Safety
    /// As for [`ApiInner::call`].
    pub(crate) unsafe fn call_or_throw<T>(&self, f: ApiFn, args: &mut T) -> Result<(), Failure> {
        let f = f.ok_or_else(|| {
            Failure::Returned("entry point not provided by this PJRT plugin".to_string())
        })?;
        // SAFETY: guaranteed by the caller (matching argument struct).
        let err =
            unsafe { call_catching(f, args as *mut T as *mut c_void) }.map_err(Failure::Threw)?;
        match self.take_error(err) {
            None => Ok(()),
            Some(msg) => Err(Failure::Returned(msg)),
        }
    }

    /// Converts an owned `PJRT_Error*` to its message and frees it.
    pub(crate) fn take_error(&self, err: *mut PJRT_Error) -> Option<String> {
        if err.is_null() {
            return None;
        }
        let mut m = PJRT_Error_Message_Args::new();
        m.error = err;
        let msg = match self.fns().PJRT_Error_Message {
            Some(f) => {
                // SAFETY: `err` is a live error returned by the plugin and `m`
                // is the matching argument struct; the message is valid until
                // the error is destroyed below, and we copy it before that.
                unsafe {
                    f(&mut m);
                    if m.message.is_null() {
                        String::from("unknown PJRT error")
                    } else {
                        let bytes =
                            std::slice::from_raw_parts(m.message as *const u8, m.message_size);
                        String::from_utf8_lossy(bytes).into_owned()
                    }
                }
            }
            None => String::from("unknown PJRT error"),
        };
        if let Some(f) = self.fns().PJRT_Error_Destroy {
            let mut d = PJRT_Error_Destroy_Args::new();
            d.error = err;
            // SAFETY: we own `err` and destroy it exactly once.
            unsafe { f(&mut d) };
        }
        Some(msg)
    }

    /// Waits for an event, destroys it and returns its error status.
    ///
    /// The one place the node waits on XLA. It blocks, possibly for as long as a host callback
    /// takes, so it must never run on a thread of the async runtime, whose tasks serve the
    /// network (see `server::schedule`); debug builds check that.
    pub(crate) fn await_and_destroy(&self, event: *mut PJRT_Event) -> Result<(), String> {
        debug_assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "waiting on an XLA event on a thread of the async runtime"
        );
        if event.is_null() {
            return Ok(());
        }
        let mut a = PJRT_Event_Await_Args::new();
        a.event = event;
        // SAFETY: `event` is a live event owned by us; matching args struct.
        let res = unsafe { self.call(self.fns().PJRT_Event_Await, &mut a) };
        self.destroy_event(event);
        res
    }

    /// Whether an event has completed (successfully or not); never waits. A null event counts
    /// as complete.
    pub(crate) fn event_is_ready(&self, event: *mut PJRT_Event) -> bool {
        if event.is_null() {
            return true;
        }
        let mut a = PJRT_Event_IsReady_Args::new();
        a.event = event;
        // SAFETY: `event` is a live event owned by the caller; matching args struct.
        match unsafe { self.call(self.fns().PJRT_Event_IsReady, &mut a) } {
            Ok(()) => a.is_ready,
            Err(_) => true,
        }
    }

    pub(crate) fn destroy_event(&self, event: *mut PJRT_Event) {
        if event.is_null() {
            return;
        }
        let mut d = PJRT_Event_Destroy_Args::new();
        d.event = event;
        // SAFETY: we own `event` and destroy it exactly once.
        if let Err(e) = unsafe { self.call(self.fns().PJRT_Event_Destroy, &mut d) } {
            tracing::warn!("PJRT_Event_Destroy failed: {e}");
        }
    }
}

/// How a call into the plugin failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Failure {
    /// It returned an error, with this message.
    Returned(String),
    /// It threw a C++ exception.
    Threw(Thrown),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Returned(message) => f.write_str(message),
            Failure::Threw(thrown) => thrown.fmt(f),
        }
    }
}

/// Copies a (pointer, length) string owned by the plugin.
///
/// # Safety
/// `p` must be null or valid for reads of `len` bytes.
pub(crate) unsafe fn str_from(p: *const c_char, len: usize) -> String {
    if p.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// A device known to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub id: i32,
    pub kind: String,
    pub addressable: bool,
}

/// How the node names a device (`:info`'s `devices`, `/metrics`' `device` label, errors):
/// `kind:id`, as `cpu:0` or `cuda:1`.
fn device_label(kind: &str, id: i32) -> String {
    format!("{kind}:{id}")
}

impl DeviceInfo {
    /// The device's name, `kind:id`.
    pub fn name(&self) -> String {
        device_label(&self.kind, self.id)
    }
}

impl DeviceMemory {
    /// The device's name, `kind:id`.
    pub fn name(&self) -> String {
        device_label(&self.kind, self.id)
    }
}

/// One device's memory, in bytes, as its plugin reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMemory {
    pub id: i32,
    pub kind: String,
    pub bytes_in_use: Option<i64>,
    pub peak_bytes_in_use: Option<i64>,
    pub bytes_limit: Option<i64>,
}

pub(crate) struct ClientInner {
    pub(crate) api: Api,
    pub(crate) raw: *mut PJRT_Client,
    platform_name: String,
    platform_version: String,
    devices: Vec<DeviceInfo>,
    /// The plugin's handle of each of `devices`, in the same order.
    device_handles: Vec<*mut PJRT_Device>,
    /// Addressable devices, in client order; index 0 is the default device.
    pub(crate) addressable: Vec<*mut PJRT_Device>,
    pub(crate) is_cpu: bool,
}

// SAFETY: a PJRT_Client is thread-safe per the PJRT contract; the raw device
// pointers are owned by the client and immutable for its lifetime.
unsafe impl Send for ClientInner {}
// SAFETY: see `Send`; no interior mutability on the Rust side.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut d = PJRT_Client_Destroy_Args::new();
        d.client = self.raw;
        // SAFETY: every buffer/executable holds an `Arc` on this inner value,
        // so nothing created from the client is alive any more.
        if let Err(e) = unsafe {
            self.api
                .0
                .call(self.api.0.fns().PJRT_Client_Destroy, &mut d)
        } {
            tracing::warn!("PJRT_Client_Destroy failed: {e}");
        }
    }
}

/// A PJRT client (thread-safe, cheap to clone).
#[derive(Clone)]
pub struct Client(pub(crate) Arc<ClientInner>);

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.0.platform_name)
            .field("version", &self.0.platform_version)
            .field("devices", &self.0.devices.len())
            .finish()
    }
}

impl Client {
    /// Creates a client with the plugin's default options.
    pub fn new(api: &Api) -> Result<Client, XlaError> {
        Client::with_options(api, &[])
    }

    /// Creates a client with `options` (the plugin refuses a name it does not know or a value of
    /// the wrong type, and the error says which).
    pub fn with_options(api: &Api, options: &[CreateOption]) -> Result<Client, XlaError> {
        let a = &api.0;
        // Each value's bytes (strings, int lists) must outlive the call; PJRT copies them.
        let int_lists: Vec<&[i64]> = options
            .iter()
            .map(|o| match &o.value {
                OptionValue::IntList(l) => l.as_slice(),
                _ => &[],
            })
            .collect();
        let named: Vec<PJRT_NamedValue> = options
            .iter()
            .zip(&int_lists)
            .map(|(o, list)| {
                let (type_, value, value_size) = match &o.value {
                    OptionValue::Str(s) => (PJRT_NAMED_VALUE_STRING, s.as_ptr() as u64, s.len()),
                    OptionValue::Int(i) => (PJRT_NAMED_VALUE_INT64, *i as u64, 1),
                    OptionValue::IntList(_) => (
                        PJRT_NAMED_VALUE_INT64_LIST,
                        list.as_ptr() as u64,
                        list.len(),
                    ),
                    OptionValue::Float(x) => (PJRT_NAMED_VALUE_FLOAT, x.to_bits() as u64, 1),
                    OptionValue::Bool(b) => (PJRT_NAMED_VALUE_BOOL, *b as u64, 1),
                };
                PJRT_NamedValue {
                    struct_size: PJRT_NamedValue::SIZE,
                    extension_start: std::ptr::null_mut(),
                    name: o.name.as_ptr() as *const _,
                    name_size: o.name.len(),
                    type_,
                    value,
                    value_size,
                }
            })
            .collect();
        let mut c = PJRT_Client_Create_Args::new();
        c.create_options = named.as_ptr();
        c.num_options = named.len();
        // SAFETY: matching argument struct; the options' names and values live in `options`
        // and `named` until the call returns; no KV callbacks.
        unsafe { a.call(a.fns().PJRT_Client_Create, &mut c) }.map_err(|e| {
            if options.is_empty() {
                XlaError::Plugin(format!("PJRT_Client_Create: {e}"))
            } else {
                let given: Vec<String> = options.iter().map(|o| o.to_string()).collect();
                XlaError::Plugin(format!(
                    "PJRT_Client_Create with options {}: {e}",
                    given.join(", ")
                ))
            }
        })?;
        if c.client.is_null() {
            return Err(XlaError::Plugin(
                "PJRT_Client_Create returned no client".into(),
            ));
        }
        let mut inner = ClientInner {
            api: api.clone(),
            raw: c.client,
            platform_name: String::new(),
            platform_version: String::new(),
            devices: Vec::new(),
            device_handles: Vec::new(),
            addressable: Vec::new(),
            is_cpu: false,
        };
        let plugin = |e: String| XlaError::Plugin(e);

        let mut p = PJRT_Client_PlatformName_Args::new();
        p.client = inner.raw;
        // SAFETY: matching args; the returned string is owned by the client.
        unsafe {
            a.call(a.fns().PJRT_Client_PlatformName, &mut p)
                .map_err(plugin)?;
            inner.platform_name = str_from(p.platform_name, p.platform_name_size);
        }
        let mut v = PJRT_Client_PlatformVersion_Args::new();
        v.client = inner.raw;
        // SAFETY: matching args; the returned string is owned by the client.
        unsafe {
            a.call(a.fns().PJRT_Client_PlatformVersion, &mut v)
                .map_err(plugin)?;
            inner.platform_version = str_from(v.platform_version, v.platform_version_size);
        }
        inner.is_cpu = inner.platform_name == "cpu";

        let mut d = PJRT_Client_Devices_Args::new();
        d.client = inner.raw;
        // SAFETY: matching args; the device array is owned by the client.
        let devices: Vec<*mut PJRT_Device> = unsafe {
            a.call(a.fns().PJRT_Client_Devices, &mut d)
                .map_err(plugin)?;
            slice_or_empty(d.devices, d.num_devices).to_vec()
        };
        for dev in devices {
            inner.devices.push(device_info(a, dev).map_err(plugin)?);
            inner.device_handles.push(dev);
        }
        let mut ad = PJRT_Client_AddressableDevices_Args::new();
        ad.client = inner.raw;
        // SAFETY: matching args; the device array is owned by the client.
        unsafe {
            a.call(a.fns().PJRT_Client_AddressableDevices, &mut ad)
                .map_err(plugin)?;
            inner.addressable =
                slice_or_empty(ad.addressable_devices, ad.num_addressable_devices).to_vec();
        }
        if inner.addressable.is_empty() {
            return Err(XlaError::Plugin("client has no addressable devices".into()));
        }
        Ok(Client(Arc::new(inner)))
    }

    /// Loads the plugin at `path` (once per process) and creates a client.
    pub fn from_plugin(path: impl AsRef<Path>) -> Result<Client, XlaError> {
        Client::new(&Api::load(path)?)
    }

    /// Platform name, e.g. `cpu`.
    pub fn platform_name(&self) -> &str {
        &self.0.platform_name
    }

    /// This client's platform as XLA's FFI registry names it (`Host`, `CUDA`, ...), which is
    /// not how PJRT names it (`cpu`, `cuda`, ...).
    pub(crate) fn ffi_platform(&self) -> &str {
        match self.platform_name().to_ascii_lowercase().as_str() {
            "cpu" | "host" => "Host",
            "cuda" | "gpu" => "CUDA",
            "rocm" => "ROCM",
            _ => self.platform_name(),
        }
    }

    /// Platform version string.
    pub fn platform_version(&self) -> &str {
        &self.0.platform_version
    }

    /// All devices of the client.
    pub fn devices(&self) -> Vec<DeviceInfo> {
        self.0.devices.clone()
    }

    /// How many devices buffers and runs can be placed on: the addressable ones, which device
    /// indices count (index 0 is the default device).
    pub fn device_count(&self) -> usize {
        self.0.addressable.len()
    }

    /// The name of addressable device `index` as `:info` lists it, `kind:id` (`cpu:2`).
    pub fn device_name(&self, index: usize) -> String {
        let Some(&handle) = self.0.addressable.get(index) else {
            return format!("device {index}");
        };
        match self.0.device_handles.iter().position(|&h| h == handle) {
            Some(i) => self.0.devices[i].name(),
            None => format!("device {index}"),
        }
    }

    /// The index among the addressable devices of the device whose PJRT id is `id`.
    pub(crate) fn addressable_index_of(&self, id: i64) -> Result<usize, XlaError> {
        self.0
            .addressable
            .iter()
            .position(|&h| {
                let i = self.0.device_handles.iter().position(|&d| d == h);
                i.is_some_and(|i| self.0.devices[i].id as i64 == id)
            })
            .ok_or_else(|| XlaError::Argument(format!("no addressable device has id {id}")))
    }

    /// The PJRT id of addressable device `index` (what a device assignment names).
    pub fn device_id(&self, index: usize) -> Result<i64, XlaError> {
        let handle = self.addressable_device(index)?;
        let i = self.0.device_handles.iter().position(|&h| h == handle);
        Ok(i.map_or(index as i64, |i| self.0.devices[i].id as i64))
    }

    /// The plugin's handle of addressable device `index`, or an error saying how many there are.
    pub(crate) fn addressable_device(&self, index: usize) -> Result<*mut PJRT_Device, XlaError> {
        self.0.addressable.get(index).copied().ok_or_else(|| {
            XlaError::Argument(format!(
                "device {index} is out of range: this node has {} devices (0..{})",
                self.device_count(),
                self.device_count().saturating_sub(1)
            ))
        })
    }

    /// Each device's memory as the plugin reports it now (figures it does not report are
    /// `None`; the CPU plugin reports none).
    pub fn device_memory(&self) -> Vec<DeviceMemory> {
        let a = &self.0.api.0;
        self.0
            .devices
            .iter()
            .zip(&self.0.device_handles)
            .map(|(info, &dev)| {
                let mut m = PJRT_Device_MemoryStats_Args::new();
                m.device = dev;
                // SAFETY: `dev` is a device of the live client; matching args.
                let reported = unsafe { a.call(a.fns().PJRT_Device_MemoryStats, &mut m) }.is_ok();
                let set = |value: i64, is_set: bool| (reported && is_set).then_some(value);
                DeviceMemory {
                    id: info.id,
                    kind: info.kind.clone(),
                    bytes_in_use: set(m.bytes_in_use, true),
                    peak_bytes_in_use: set(m.peak_bytes_in_use, m.peak_bytes_in_use_is_set),
                    bytes_limit: set(m.bytes_limit, m.bytes_limit_is_set),
                }
            })
            .collect()
    }

    /// The plugin this client was created from.
    pub fn api(&self) -> &Api {
        &self.0.api
    }

    pub(crate) fn inner(&self) -> &ClientInner {
        &self.0
    }

    pub(crate) fn same_client(&self, other: &Client) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl ClientInner {
    pub(crate) fn api(&self) -> &ApiInner {
        &self.api.0
    }
}

fn device_info(a: &ApiInner, dev: *mut PJRT_Device) -> Result<DeviceInfo, String> {
    let mut g = PJRT_Device_GetDescription_Args::new();
    g.device = dev;
    // SAFETY: `dev` is a device owned by the live client; matching args.
    unsafe { a.call(a.fns().PJRT_Device_GetDescription, &mut g)? };
    let mut id = PJRT_DeviceDescription_Id_Args::new();
    id.device_description = g.device_description;
    // SAFETY: description returned above, owned by the device.
    unsafe { a.call(a.fns().PJRT_DeviceDescription_Id, &mut id)? };
    let mut k = PJRT_DeviceDescription_Kind_Args::new();
    k.device_description = g.device_description;
    // SAFETY: as above; the kind string is owned by the description.
    let kind = unsafe {
        a.call(a.fns().PJRT_DeviceDescription_Kind, &mut k)?;
        str_from(k.device_kind, k.device_kind_size)
    };
    let mut ia = PJRT_Device_IsAddressable_Args::new();
    ia.device = dev;
    // SAFETY: matching args.
    unsafe { a.call(a.fns().PJRT_Device_IsAddressable, &mut ia)? };
    Ok(DeviceInfo {
        id: id.id,
        kind,
        addressable: ia.is_addressable,
    })
}

/// Views a plugin-owned (pointer, length) array, tolerating null.
///
/// # Safety
/// `p` must be null or valid for reads of `n` elements for the lifetime used.
pub(crate) unsafe fn slice_or_empty<'a, T>(p: *const T, n: usize) -> &'a [T] {
    if p.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: guaranteed by the caller.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}
