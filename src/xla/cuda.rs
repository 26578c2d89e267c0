//! The few CUDA driver calls a host callback inside a CUDA program needs: copy its operands from
//! the device to the host on the call's stream, wait for them, and copy its results back.
//!
//! The driver (`libcuda.so.1`, which every machine with the NVIDIA driver has) is loaded at run
//! time, the first time a callback runs on a GPU: the build needs no CUDA, and a machine without
//! a GPU never loads it. Copies go through page-locked ("pinned") staging memory, which the
//! device reads and writes by DMA; a copy from ordinary memory goes through a driver-owned pinned
//! bounce buffer instead. One staging area per thread, grown as needed and kept: callbacks run on
//! XLA's few GPU executor threads.

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

type CUresult = c_int;
type CUstream = *mut c_void;
type CUcontext = *mut c_void;
type CUdeviceptr = u64;

const CUDA_SUCCESS: CUresult = 0;
/// `CU_MEMHOSTALLOC_PORTABLE`: the pinned memory serves every context, whichever device runs.
const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;

struct Driver {
    /// Keeps the library loaded while the function pointers below are in use.
    _lib: libloading::Library,
    init: unsafe extern "C" fn(c_uint) -> CUresult,
    stream_get_ctx: unsafe extern "C" fn(CUstream, *mut CUcontext) -> CUresult,
    ctx_push: unsafe extern "C" fn(CUcontext) -> CUresult,
    ctx_pop: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    dtoh_async: unsafe extern "C" fn(*mut c_void, CUdeviceptr, usize, CUstream) -> CUresult,
    htod_async: unsafe extern "C" fn(CUdeviceptr, *const c_void, usize, CUstream) -> CUresult,
    stream_synchronize: unsafe extern "C" fn(CUstream) -> CUresult,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CUresult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CUresult,
    error_string: unsafe extern "C" fn(CUresult, *mut *const c_char) -> CUresult,
}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

fn driver() -> Result<&'static Driver, String> {
    DRIVER
        .get_or_init(|| {
            // SAFETY: loading the NVIDIA driver library runs its initialisers, which are sound
            // to run in any process; the symbols below have the driver API's documented types.
            let driver = unsafe { load() }.map_err(|e| {
                format!("cannot load the CUDA driver (libcuda.so.1) for a callback on the GPU: {e}")
            })?;
            // SAFETY: cuInit takes flags, which must be 0.
            check(&driver, unsafe { (driver.init)(0) }, "cuInit")?;
            Ok(driver)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// # Safety
/// Loads a shared library and reads symbols by the driver API's names and types.
unsafe fn load() -> Result<Driver, libloading::Error> {
    // SAFETY: see the function's contract.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1")?;
        Ok(Driver {
            init: *lib.get(b"cuInit\0")?,
            stream_get_ctx: *lib.get(b"cuStreamGetCtx\0")?,
            ctx_push: *lib.get(b"cuCtxPushCurrent_v2\0")?,
            ctx_pop: *lib.get(b"cuCtxPopCurrent_v2\0")?,
            dtoh_async: *lib.get(b"cuMemcpyDtoHAsync_v2\0")?,
            htod_async: *lib.get(b"cuMemcpyHtoDAsync_v2\0")?,
            stream_synchronize: *lib.get(b"cuStreamSynchronize\0")?,
            mem_host_alloc: *lib.get(b"cuMemHostAlloc\0")?,
            mem_free_host: *lib.get(b"cuMemFreeHost\0")?,
            error_string: *lib.get(b"cuGetErrorString\0")?,
            _lib: lib,
        })
    }
}

fn check(driver: &Driver, result: CUresult, what: &str) -> Result<(), String> {
    if result == CUDA_SUCCESS {
        return Ok(());
    }
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string, or leaves it null.
    unsafe { (driver.error_string)(result, &mut text) };
    let text = if text.is_null() {
        format!("CUDA error {result}")
    } else {
        // SAFETY: a static NUL-terminated string of the driver.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    Err(format!("{what}: {text}"))
}

/// One device region a callback reads or writes: its device address and byte length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceRegion {
    pub device: *mut u8,
    pub len: usize,
}

/// The host copies of one callback's operands and results, valid until [`Staged::finish`]:
/// `operands[i]` and `results[i]` are host addresses of the same length as the i-th region.
pub(crate) struct Staged {
    stream: CUstream,
    context: CUcontext,
    pub operands: Vec<*mut u8>,
    pub results: Vec<*mut u8>,
    result_regions: Vec<DeviceRegion>,
    /// Results that share memory with an operand (`output_operand_aliases`): the device
    /// already holds their value, nothing is copied back.
    copy_back: Vec<bool>,
}

thread_local! {
    static STAGING: RefCell<Pinned> = const { RefCell::new(Pinned { ptr: std::ptr::null_mut(), len: 0 }) };
}

/// A pinned host allocation of the driver, freed with the thread.
struct Pinned {
    ptr: *mut u8,
    len: usize,
}

impl Pinned {
    /// At least `len` bytes, reusing the thread's area when it is large enough.
    fn reserve(&mut self, driver: &Driver, len: usize) -> Result<*mut u8, String> {
        if len <= self.len {
            return Ok(self.ptr);
        }
        self.release(driver);
        let size = len.next_power_of_two().max(1 << 16);
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: cuMemHostAlloc writes the address of `size` new bytes to `ptr`.
        let result = unsafe { (driver.mem_host_alloc)(&mut ptr, size, CU_MEMHOSTALLOC_PORTABLE) };
        check(driver, result, "cuMemHostAlloc")?;
        self.ptr = ptr as *mut u8;
        self.len = size;
        Ok(self.ptr)
    }

    fn release(&mut self, driver: &Driver) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` came from cuMemHostAlloc and no copy uses it (each callback waits for
            // its copies before it returns).
            unsafe { (driver.mem_free_host)(self.ptr as *mut c_void) };
            self.ptr = std::ptr::null_mut();
            self.len = 0;
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Some(Ok(driver)) = DRIVER.get() {
            self.release(driver);
        }
    }
}

const ALIGN: usize = 64;

/// Copies `operands` from the device to host staging on `stream` and waits for them, and sets
/// aside host room for `results` (a result at the same device address as an operand shares its
/// host copy, as it shares its memory on the device).
///
/// # Safety
/// `stream` must be the CUDA stream XLA gave the running custom call, and every region device
/// memory of that call, valid for its length until [`Staged::finish`] returns.
pub(crate) unsafe fn stage(
    stream: *mut c_void,
    operands: &[DeviceRegion],
    results: &[DeviceRegion],
) -> Result<Staged, String> {
    let driver = driver()?;
    let mut context: CUcontext = std::ptr::null_mut();
    // SAFETY: `stream` is a live stream (the caller's contract); the call writes its context.
    check(
        driver,
        unsafe { (driver.stream_get_ctx)(stream, &mut context) },
        "cuStreamGetCtx",
    )?;
    // SAFETY: a context of a live stream; popped in `finish` (or below on failure).
    check(
        driver,
        unsafe { (driver.ctx_push)(context) },
        "cuCtxPushCurrent",
    )?;
    let aliases: Vec<Option<usize>> = results
        .iter()
        .map(|r| {
            operands
                .iter()
                .position(|o| o.len > 0 && o.device == r.device)
        })
        .collect();
    let padded = |len: usize| len.div_ceil(ALIGN) * ALIGN;
    let total: usize = operands.iter().map(|o| padded(o.len)).sum::<usize>()
        + results
            .iter()
            .zip(&aliases)
            .filter(|(_, alias)| alias.is_none())
            .map(|(r, _)| padded(r.len))
            .sum::<usize>();
    let mut staged = Staged {
        stream,
        context,
        operands: Vec::with_capacity(operands.len()),
        results: Vec::with_capacity(results.len()),
        result_regions: results.to_vec(),
        copy_back: aliases.iter().map(Option::is_none).collect(),
    };
    let copied = STAGING.with(|pinned| -> Result<(), String> {
        let base = pinned.borrow_mut().reserve(driver, total)?;
        let mut at = 0;
        for o in operands {
            // SAFETY: `at + o.len <= total`, within the staging area.
            let host = unsafe { base.add(at) };
            at += padded(o.len);
            staged.operands.push(host);
            if o.len > 0 {
                // SAFETY: `host` has room for `o.len` bytes; `o` is device memory of the call.
                let r = unsafe {
                    (driver.dtoh_async)(host as *mut c_void, o.device as u64, o.len, stream)
                };
                check(driver, r, "cuMemcpyDtoHAsync")?;
            }
        }
        for alias in &aliases {
            match alias {
                Some(i) => staged.results.push(staged.operands[*i]),
                None => {
                    // SAFETY: within the staging area, as above.
                    staged.results.push(unsafe { base.add(at) });
                    at += padded(staged.result_regions[staged.results.len() - 1].len);
                }
            }
        }
        // SAFETY: a live stream; waits for the copies above.
        check(
            driver,
            unsafe { (driver.stream_synchronize)(stream) },
            "cuStreamSynchronize",
        )
    });
    if let Err(e) = copied {
        staged.pop_context(driver);
        return Err(e);
    }
    Ok(staged)
}

impl Staged {
    /// Copies the results the callback wrote from host staging to the device on the call's
    /// stream (when `write_back`) and waits for them, so that the staging area can serve the
    /// next callback; then leaves the stream's context.
    pub(crate) fn finish(self, write_back: bool) -> Result<(), String> {
        let driver = driver()?;
        let mut result = Ok(());
        if write_back {
            result = self.copy_results(driver);
        }
        self.pop_context(driver);
        result
    }

    fn copy_results(&self, driver: &Driver) -> Result<(), String> {
        for ((region, host), copy) in self
            .result_regions
            .iter()
            .zip(&self.results)
            .zip(&self.copy_back)
        {
            if *copy && region.len > 0 {
                // SAFETY: `host` holds `region.len` bytes the callback wrote; `region` is a
                // result buffer of the running call (the contract of `stage`).
                let r = unsafe {
                    (driver.htod_async)(
                        region.device as u64,
                        *host as *const c_void,
                        region.len,
                        self.stream,
                    )
                };
                check(driver, r, "cuMemcpyHtoDAsync")?;
            }
        }
        // SAFETY: a live stream; the staging area is reused only after these copies end.
        check(
            driver,
            unsafe { (driver.stream_synchronize)(self.stream) },
            "cuStreamSynchronize",
        )
    }

    fn pop_context(&self, driver: &Driver) {
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context `stage` pushed on this thread.
        unsafe { (driver.ctx_pop)(&mut popped) };
        debug_assert!(popped.is_null() || popped == self.context);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without the NVIDIA driver (as on machines with no GPU), the first callback inside a GPU
    /// program fails with a message naming the driver library, and nothing else happens.
    #[test]
    fn a_machine_without_the_driver_gets_a_clear_error() {
        // SAFETY: loading the driver library (when there is one) has no other effect.
        if unsafe { libloading::Library::new("libcuda.so.1") }.is_ok() {
            return; // a machine with the driver: nothing to check here
        }
        let error = driver().err().expect("no driver");
        assert!(
            error.starts_with("cannot load the CUDA driver (libcuda.so.1)"),
            "{error}"
        );
        // SAFETY: with no driver, `stage` fails before touching the stream or the regions.
        let staged = unsafe { stage(std::ptr::null_mut(), &[], &[]) };
        assert_eq!(staged.err(), Some(error));
    }
}
