//! A device buffer written piece by piece as its bytes arrive: PJRT's asynchronous
//! host-to-device transfer manager, for tensors that come to the node in chunks.
//!
//! Each piece is copied to the device at its offset while the next one is still on the wire; the
//! buffer exists once the last piece is written. Types of at least a byte per element only: a 2-
//! or 4-bit tensor's host layout is not its packed bytes (see `packing`), so those are put
//! together first and placed whole.

#![allow(unsafe_code)]

use std::ffi::c_void;

use super::buffer::Buffer;
use super::client::Client;
use super::dtype::{DType, TensorSpec};
use super::error::XlaError;
use super::sys::*;

/// A buffer being written in pieces; dropping it before [`DeviceUpload::finish`] abandons it.
pub struct DeviceUpload {
    client: Client,
    manager: *mut PJRT_AsyncHostToDeviceTransferManager,
    spec: TensorSpec,
    /// The index of the device the buffer is on.
    device: usize,
    /// The bytes the buffer takes, and how many have been written.
    size: usize,
    written: usize,
}

// SAFETY: the transfer manager is a plugin object with no thread affinity; `&mut self` serialises
// every use of it.
unsafe impl Send for DeviceUpload {}

impl DeviceUpload {
    /// A buffer of `dtype` and `dims` on `device` (an index into the client's addressable
    /// devices), to be written in pieces.
    pub fn new(
        client: &Client,
        dtype: DType,
        dims: &[i64],
        device: usize,
    ) -> Result<DeviceUpload, XlaError> {
        if dtype.is_sub_byte() {
            return Err(XlaError::Argument(format!(
                "{dtype:?} elements are not written to the device in pieces"
            )));
        }
        let spec = TensorSpec::new(dtype, dims.to_vec());
        let inner = client.inner();
        let api = inner.api();
        let mut memory = PJRT_Device_DefaultMemory_Args::new();
        memory.device = client.addressable_device(device)?;
        // SAFETY: matching args; the device belongs to the live client.
        unsafe { api.call(api.fns().PJRT_Device_DefaultMemory, &mut memory) }
            .map_err(XlaError::Runtime)?;
        let mut shape = PJRT_ShapeSpec::new();
        shape.dims = spec.dims.as_ptr();
        shape.num_dims = spec.dims.len();
        shape.element_type = dtype.to_pjrt();
        let mut a = PJRT_Client_CreateBuffersForAsyncHostToDevice_Args::new();
        a.client = inner.raw;
        a.shape_specs = &mut shape;
        a.num_shape_specs = 1;
        a.memory = memory.memory;
        // SAFETY: matching args; `shape` and its dims outlive the call, the memory belongs to the
        // client's device.
        unsafe {
            api.call(
                api.fns().PJRT_Client_CreateBuffersForAsyncHostToDevice,
                &mut a,
            )
        }
        .map_err(XlaError::Runtime)?;
        if a.transfer_manager.is_null() {
            return Err(XlaError::Runtime(
                "CreateBuffersForAsyncHostToDevice returned no transfer manager".into(),
            ));
        }
        Ok(DeviceUpload {
            client: client.clone(),
            manager: a.transfer_manager,
            size: spec.byte_size(),
            spec,
            device,
            written: 0,
        })
    }

    /// The bytes the whole buffer takes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Writes the next piece (right after the previous one) and waits until the plugin is done
    /// with `data`; the piece that completes the buffer makes it ready.
    pub fn write(&mut self, data: &[u8]) -> Result<(), XlaError> {
        if self.written + data.len() > self.size {
            return Err(XlaError::Argument(format!(
                "{} takes {} bytes; {} more after {}",
                self.spec,
                self.size,
                data.len(),
                self.written
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        let api = self.client.inner().api();
        let mut a = PJRT_AsyncHostToDeviceTransferManager_TransferData_Args::new();
        a.transfer_manager = self.manager;
        a.buffer_index = 0;
        a.data = data.as_ptr() as *const c_void;
        a.offset = self.written as i64;
        a.transfer_size = data.len() as i64;
        a.is_last_transfer = self.written + data.len() == self.size;
        // SAFETY: matching args; `data` stays borrowed until the done event, awaited below.
        unsafe {
            api.call(
                api.fns().PJRT_AsyncHostToDeviceTransferManager_TransferData,
                &mut a,
            )
        }
        .map_err(XlaError::Runtime)?;
        api.await_and_destroy(a.done_with_h2d_transfer)
            .map_err(XlaError::Runtime)?;
        self.written += data.len();
        Ok(())
    }

    /// The buffer, once every byte is written.
    pub fn finish(self) -> Result<Buffer, XlaError> {
        if self.written != self.size && self.size > 0 {
            return Err(XlaError::Argument(format!(
                "{} takes {} bytes, {} were written",
                self.spec, self.size, self.written
            )));
        }
        let api = self.client.inner().api();
        let mut a = PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args::new();
        a.transfer_manager = self.manager;
        a.buffer_index = 0;
        // SAFETY: matching args; the manager holds one buffer, index 0.
        unsafe {
            api.call(
                api.fns()
                    .PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer,
                &mut a,
            )
        }
        .map_err(XlaError::Runtime)?;
        if a.buffer_out.is_null() {
            return Err(XlaError::Runtime(
                "RetrieveBuffer returned no buffer".into(),
            ));
        }
        Ok(Buffer::from_raw_with_spec(
            &self.client,
            a.buffer_out,
            self.spec.clone(),
            self.device,
            None,
        ))
    }
}

impl Drop for DeviceUpload {
    fn drop(&mut self) {
        let api = self.client.inner().api();
        let mut a = PJRT_AsyncHostToDeviceTransferManager_Destroy_Args::new();
        a.transfer_manager = self.manager;
        // SAFETY: the manager is ours and used by nothing after this; a retrieved buffer lives
        // on by itself.
        if let Err(e) = unsafe {
            api.call(
                api.fns().PJRT_AsyncHostToDeviceTransferManager_Destroy,
                &mut a,
            )
        } {
            tracing::warn!("destroying a transfer manager: {e}");
        }
    }
}
