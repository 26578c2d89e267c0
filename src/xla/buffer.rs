//! Device buffers.
//!
//! A [`Buffer`] owns one `PJRT_Buffer` (destroyed on drop) and remembers its
//! element type and dimensions, so that argument validation never has to call
//! into XLA. Host→device copies validate the byte size first (XLA CHECK-fails
//! abort the process) and wait until XLA no longer needs the host slice: at once
//! ([`Client::buffer_from_host`]), or after the run that takes the buffer has been launched
//! ([`PendingUpload`]), so that the run queues behind the copy instead of waiting for it.
//! Device→host copies wait for the buffer's ready event (execution errors,
//! including host custom-call errors, surface there) and then, on the CPU
//! platform, read the dense row-major device memory directly (much cheaper
//! than `PJRT_Buffer_ToHostBuffer`, see docs/performance.md); other platforms, or unexpected
//! layouts, use `PJRT_Buffer_ToHostBuffer`. The same direct access lets an
//! executable refill its small CPU input buffers from run to run
//! ([`Buffer::overwrite`]) instead of creating new ones.
//!
//! Host data is packed as Nx packs it. For 2- and 4-bit elements that is not what PJRT's host
//! buffers hold (one element per byte), so their copies convert on the way (see
//! [`super::packing`]) and always go through PJRT, never through device memory directly.

#![allow(unsafe_code)]

use std::borrow::Cow;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use super::client::{slice_or_empty, Client};
use super::dtype::{DType, TensorSpec};
use super::error::XlaError;
use super::packing;
use super::sys::*;
use super::tensor::HostTensor;

/// A buffer on a device of a [`Client`].
pub struct Buffer {
    client: Client,
    raw: *mut PJRT_Buffer,
    spec: TensorSpec,
    /// The device it lives on: an index into the client's addressable devices.
    device: usize,
    /// Set once the ready event has been awaited without error.
    ready: AtomicBool,
    /// Whether the buffer's memory can be accessed directly (see [`Buffer::is_direct`]), when
    /// already known: an executable knows it for its outputs after the first run.
    direct: Option<bool>,
    /// CPU platform only: the address of the buffer's memory, once it is known whether it can
    /// be read directly (`None`: it cannot). The memory of a CPU buffer never moves, and our
    /// buffers are never donated, so the address holds for the buffer's life.
    host_memory: OnceLock<Option<usize>>,
}

// SAFETY: PJRT buffers may be used from any thread (the PJRT C API is
// thread-safe); the Rust side holds no thread-affine state.
unsafe impl Send for Buffer {}
// SAFETY: all `&self` methods only read immutable data, use an atomic flag or
// make thread-safe PJRT calls.
unsafe impl Sync for Buffer {}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer({} on device {})", self.spec, self.device)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let api = self.client.inner().api();
        let mut d = PJRT_Buffer_Destroy_Args::new();
        d.buffer = self.raw;
        // SAFETY: we own `raw` and destroy it exactly once.
        if let Err(e) = unsafe { api.call(api.fns().PJRT_Buffer_Destroy, &mut d) } {
            tracing::warn!("PJRT_Buffer_Destroy failed: {e}");
        }
    }
}

impl Client {
    /// Copies a dense row-major host array, packed as Nx packs it, to device 0.
    ///
    /// `data.len()` must equal the spec's [`TensorSpec::byte_size`]. The data
    /// is copied before this returns; the slice may be freed afterwards.
    pub fn buffer_from_host(
        &self,
        data: &[u8],
        dtype: DType,
        dims: &[i64],
    ) -> Result<Buffer, XlaError> {
        self.buffer_from_host_on(data, dtype, dims, 0)
    }

    /// [`Client::buffer_from_host`] onto `device`, an index into the client's addressable
    /// devices.
    ///
    /// On the CPU platform the copy is made within the call, on this thread: XLA would hand a
    /// large one (over 100 KiB) to one of its threads and this one would sleep until it is
    /// done, two thread wake-ups for the same copy.
    pub fn buffer_from_host_on(
        &self,
        data: &[u8],
        dtype: DType,
        dims: &[i64],
        device: usize,
    ) -> Result<Buffer, XlaError> {
        let within_call = self.inner().is_cpu;
        self.upload(data, dtype, dims, device, within_call)?
            .finish()
    }

    /// Starts copying a host array (as [`Client::buffer_from_host_on`]) and returns at once: the
    /// buffer exists and a run may take it (XLA orders the run after the copy), while XLA may
    /// still read `data`, which stays borrowed until the upload is finished or dropped.
    /// `within_call`: XLA copies `data` before this returns, on this thread (then finishing
    /// waits for nothing), rather than when it sees fit.
    pub(crate) fn upload<'a>(
        &self,
        data: &'a [u8],
        dtype: DType,
        dims: &[i64],
        device: usize,
        within_call: bool,
    ) -> Result<PendingUpload<'a>, XlaError> {
        let device_handle = self.addressable_device(device)?;
        if let Some((i, d)) = dims.iter().enumerate().find(|(_, d)| **d < 0) {
            return Err(XlaError::Argument(format!(
                "dimension {i} is negative ({d})"
            )));
        }
        let spec = TensorSpec::new(dtype, dims.to_vec());
        let expected = spec.byte_size();
        if data.len() != expected {
            return Err(XlaError::Argument(format!(
                "{spec} needs {expected} bytes, got {} bytes",
                data.len()
            )));
        }
        let data = packing::to_host_buffer(dtype, spec.element_count(), data);
        let inner = self.inner();
        let api = inner.api();
        // A non-null pointer even for empty arrays.
        let dummy = [0u8; 16];
        let ptr = if data.is_empty() {
            dummy.as_ptr()
        } else {
            data.as_ptr()
        };
        let mut a = PJRT_Client_BufferFromHostBuffer_Args::new();
        a.client = inner.raw;
        a.data = ptr as *const c_void;
        a.type_ = dtype.to_pjrt();
        a.dims = spec.dims.as_ptr();
        a.num_dims = spec.dims.len();
        a.host_buffer_semantics = if within_call {
            PJRT_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL
        } else {
            PJRT_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES
        };
        a.device = device_handle;
        // SAFETY: matching args; `data` holds exactly the bytes described by
        // dtype/dims (checked above, one byte per element for 2- and 4-bit
        // types) and stays alive, in the returned upload (or until the await below when there
        // is none), until the done_with_host_buffer event has fired.
        unsafe { api.call(api.fns().PJRT_Client_BufferFromHostBuffer, &mut a) }
            .map_err(XlaError::Runtime)?;
        if a.buffer.is_null() {
            api.await_and_destroy(a.done_with_host_buffer).ok();
            return Err(XlaError::Runtime(
                "BufferFromHostBuffer returned no buffer".into(),
            ));
        }
        let mut upload = PendingUpload {
            buffer: Some(Buffer::from_raw_with_spec(
                self, a.buffer, spec, device, None,
            )),
            done: a.done_with_host_buffer,
            client: self.clone(),
            _data: data,
        };
        if upload._data.is_empty() {
            // XLA was handed `dummy`, which lives on this frame only.
            upload.wait()?;
        }
        Ok(upload)
    }
}

/// A host array on its way to the device ([`Client::upload`]): its buffer, and the host bytes
/// XLA may read until the copy is done. Finishing it, or dropping it, waits for that.
pub(crate) struct PendingUpload<'a> {
    /// `None` once finished.
    buffer: Option<Buffer>,
    /// The `done_with_host_buffer` event; null once awaited.
    done: *mut PJRT_Event,
    client: Client,
    /// What XLA copies from: kept alive until `done` has fired.
    _data: Cow<'a, [u8]>,
}

impl PendingUpload<'_> {
    /// The buffer, usable as a run's argument before the copy is done.
    pub(crate) fn buffer(&self) -> &Buffer {
        self.buffer
            .as_ref()
            .expect("an upload's buffer until finished")
    }

    /// Waits until XLA is done with the host bytes (at once when it was already); returns the
    /// copy's error, if any.
    pub(crate) fn wait(&mut self) -> Result<(), XlaError> {
        let done = std::mem::replace(&mut self.done, std::ptr::null_mut());
        let api = self.client.inner().api();
        api.await_and_destroy(done).map_err(XlaError::Runtime)
    }

    /// [`PendingUpload::wait`], then the buffer.
    pub(crate) fn finish(mut self) -> Result<Buffer, XlaError> {
        self.wait()?;
        Ok(self.buffer.take().expect("finished once"))
    }
}

impl Drop for PendingUpload<'_> {
    fn drop(&mut self) {
        // Before the fields go: XLA may still read `_data` until the event fires.
        if !self.done.is_null() {
            let api = self.client.inner().api();
            api.await_and_destroy(self.done).ok();
        }
    }
}

impl Buffer {
    /// Wraps a buffer on `device` whose type is known, e.g. from the executable's output
    /// signature (takes ownership; saves two PJRT queries per output). `direct`
    /// is [`Buffer::is_direct`], if known.
    pub(crate) fn from_raw_with_spec(
        client: &Client,
        raw: *mut PJRT_Buffer,
        spec: TensorSpec,
        device: usize,
        direct: Option<bool>,
    ) -> Buffer {
        Buffer {
            client: client.clone(),
            raw,
            spec,
            device,
            ready: AtomicBool::new(false),
            direct,
            host_memory: OnceLock::new(),
        }
    }

    pub(crate) fn raw(&self) -> *mut PJRT_Buffer {
        self.raw
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The device it lives on: an index into the client's addressable devices.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.spec.dtype
    }

    /// Dimensions (row-major).
    pub fn dims(&self) -> &[i64] {
        &self.spec.dims
    }

    /// Type and dimensions.
    pub fn spec(&self) -> &TensorSpec {
        &self.spec
    }

    /// Size in bytes, packed as Nx packs it.
    pub fn byte_size(&self) -> usize {
        self.spec.byte_size()
    }

    /// Waits until the buffer is computed; returns the computation's error
    /// (for outputs) if it failed.
    pub fn await_ready(&self) -> Result<(), XlaError> {
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let api = self.client.inner().api();
        let mut r = PJRT_Buffer_ReadyEvent_Args::new();
        r.buffer = self.raw;
        // SAFETY: live buffer; matching args; the event is owned by us and
        // destroyed by `await_and_destroy`.
        unsafe { api.call(api.fns().PJRT_Buffer_ReadyEvent, &mut r) }.map_err(XlaError::Runtime)?;
        api.await_and_destroy(r.event).map_err(XlaError::Runtime)?;
        self.ready.store(true, Ordering::Release);
        Ok(())
    }

    pub(crate) fn mark_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// The buffer's contents as a host tensor (see [`Buffer::to_host`]).
    pub fn to_host_tensor(&self) -> Result<HostTensor, XlaError> {
        Ok(HostTensor::new(
            self.dtype(),
            self.dims().to_vec(),
            self.to_host()?,
        ))
    }

    /// Copies the buffer to a dense row-major host array, packed as Nx packs it.
    pub fn to_host(&self) -> Result<Vec<u8>, XlaError> {
        self.await_ready()?;
        let size = self.byte_size();
        if size == 0 {
            return Ok(Vec::new());
        }
        if self.dtype().is_sub_byte() {
            let host = self.to_host_via_pjrt(self.spec.element_count())?;
            return Ok(packing::from_host_buffer(self.dtype(), host));
        }
        if let Some(memory) = self.host_memory() {
            let mut v = vec![0u8; size];
            // SAFETY: `host_memory` is this buffer's dense row-major memory of
            // `size` bytes, valid while the buffer lives (borrowed here); the
            // buffer is ready (awaited above); `v` does not overlap it.
            unsafe { std::ptr::copy_nonoverlapping(memory as *const u8, v.as_mut_ptr(), size) };
            return Ok(v);
        }
        self.to_host_via_pjrt(size)
    }

    /// Replaces the buffer's contents with `data` by writing its memory
    /// directly; returns false (and writes nothing) where that is not possible:
    /// other platforms than CPU, another layout, a size mismatch.
    ///
    /// `&mut self` makes the write exclusive on the Rust side, and every
    /// execution that used the buffer has completed by the time
    /// [`Executable::execute`](super::Executable::execute) returns, so XLA is
    /// not reading it either.
    pub(crate) fn overwrite(&mut self, data: &[u8]) -> bool {
        if data.len() != self.byte_size() || data.is_empty() || self.await_ready().is_err() {
            return false;
        }
        let Some(memory) = self.host_memory() else {
            return false;
        };
        // SAFETY: `memory` is this buffer's dense row-major memory of exactly
        // `data.len()` bytes (checked); no execution uses the buffer and no
        // other reference to it exists (see above); `data` is a distinct
        // host slice.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), memory as *mut u8, data.len()) };
        true
    }

    /// The address of the buffer's memory if it can be accessed directly: CPU
    /// platform, dense row-major layout, on-device size equal to the dense size.
    fn host_memory(&self) -> Option<usize> {
        if !self.client.inner().is_cpu || self.byte_size() == 0 {
            return None;
        }
        *self.host_memory.get_or_init(|| {
            if !self.direct.unwrap_or_else(|| self.is_direct()) {
                return None;
            }
            let api = self.client.inner().api();
            let mut p = PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args::new();
            p.buffer = self.raw;
            // SAFETY: live buffer; matching args. The plugin holds an external
            // reference only for the duration of the call; the address stays
            // valid afterwards because CPU buffer memory never moves and our
            // buffers are never donated or deleted while a `Buffer` owns them.
            let ok =
                unsafe { api.call(api.fns().PJRT_Buffer_OpaqueDeviceMemoryDataPointer, &mut p) }
                    .is_ok();
            (ok && !p.device_memory_ptr.is_null()).then_some(p.device_memory_ptr as usize)
        })
    }

    /// Whether the memory is laid out as the dense row-major array itself:
    /// dense row-major layout, and an on-device size equal to the dense size.
    /// Never for 2- and 4-bit elements, which XLA packs in another order than Nx.
    pub(crate) fn is_direct(&self) -> bool {
        !self.dtype().is_sub_byte()
            && self.is_dense_row_major()
            && self.on_device_size() == Some(self.byte_size())
    }

    /// The device PJRT says the buffer is on, as an index into the client's addressable
    /// devices (`None` if PJRT does not say, or names a device that is not one of them): what
    /// checks that [`Buffer::device`] is right.
    pub fn reported_device(&self) -> Option<usize> {
        let api = self.client.inner().api();
        let mut d = PJRT_Buffer_Device_Args::new();
        d.buffer = self.raw;
        // SAFETY: live buffer; matching args; the device is owned by the client.
        unsafe { api.call(api.fns().PJRT_Buffer_Device, &mut d) }.ok()?;
        self.client
            .inner()
            .addressable
            .iter()
            .position(|&h| h == d.device)
    }

    fn on_device_size(&self) -> Option<usize> {
        let api = self.client.inner().api();
        let mut s = PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        s.buffer = self.raw;
        // SAFETY: live buffer; matching args.
        unsafe { api.call(api.fns().PJRT_Buffer_OnDeviceSizeInBytes, &mut s) }
            .ok()
            .map(|_| s.on_device_size_in_bytes)
    }

    /// Whether XLA stores this buffer densely in row-major order.
    fn is_dense_row_major(&self) -> bool {
        let api = self.client.inner().api();
        let mut l = PJRT_Buffer_GetMemoryLayout_Args::new();
        l.buffer = self.raw;
        l.layout = PJRT_Buffer_MemoryLayout::new();
        // SAFETY: live buffer; matching args; the layout data is owned by the
        // buffer and only read while it is alive.
        unsafe {
            if api
                .call(api.fns().PJRT_Buffer_GetMemoryLayout, &mut l)
                .is_err()
            {
                return false;
            }
            if l.layout.type_ != PJRT_BUFFER_MEMORY_LAYOUT_TILED || l.layout.tiled.num_tiles != 0 {
                return false;
            }
            let m2m = slice_or_empty(
                l.layout.tiled.minor_to_major,
                l.layout.tiled.minor_to_major_size,
            );
            let rank = self.spec.dims.len();
            m2m.len() == rank
                && m2m
                    .iter()
                    .enumerate()
                    .all(|(i, &d)| d == (rank - 1 - i) as i64)
        }
    }

    /// `PJRT_Buffer_ToHostBuffer` into `size` bytes: the dense size, with one
    /// byte per element for 2- and 4-bit types.
    fn to_host_via_pjrt(&self, size: usize) -> Result<Vec<u8>, XlaError> {
        let api = self.client.inner().api();
        let mut v = vec![0u8; size];
        let mut a = PJRT_Buffer_ToHostBuffer_Args::new();
        a.src = self.raw;
        a.dst = v.as_mut_ptr() as *mut c_void;
        a.dst_size = size;
        // SAFETY: live buffer; `v` is writable for `size` bytes and is kept
        // alive (and not touched) until the completion event has been awaited.
        unsafe { api.call(api.fns().PJRT_Buffer_ToHostBuffer, &mut a) }
            .map_err(XlaError::Runtime)?;
        api.await_and_destroy(a.event).map_err(XlaError::Runtime)?;
        Ok(v)
    }
}
