//! Raw, hand-written `repr(C)` bindings to the subset of the PJRT C API
//! (`pjrt_c_api.h`, API version 0.81) and of the XLA FFI C API
//! (`xla/ffi/api/c_api.h`) that this crate uses.
//!
//! Why by hand: the project must not depend on xla-rs/pjrt crates, and only a
//! few dozen entry points are needed. Every argument struct carries a
//! `struct_size` that the plugin validates; it is computed exactly like the
//! header's `PJRT_STRUCT_SIZE(type, last_field)` (offset of the last field plus
//! its size, *without* trailing padding). The sizes are pinned by unit tests
//! against values printed by a C compiler from the real header.
//!
//! Nothing here is safe to call directly; the safe wrappers live in
//! `client.rs`, `buffer.rs`, `executable.rs` and `ffi.rs`.

#![allow(unsafe_code)]
#![allow(non_camel_case_types, non_snake_case, dead_code)]

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

/// Opaque handle types.
#[repr(C)]
pub struct PJRT_Error {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Event {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Client {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Device {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_DeviceDescription {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Memory {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_AsyncHostToDeviceTransferManager {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Executable {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_LoadedExecutable {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_Buffer {
    _p: [u8; 0],
}
#[repr(C)]
pub struct PJRT_ExecuteContext {
    _p: [u8; 0],
}

/// `PJRT_Extension_Base`: header of every entry in an extension chain.
#[repr(C)]
#[derive(Debug)]
pub struct PJRT_Extension_Base {
    pub struct_size: usize,
    pub type_: u32,
    pub next: *mut PJRT_Extension_Base,
}

pub const PJRT_EXTENSION_TYPE_FFI: u32 = 5;

/// `PJRT_Api_Version`.
#[repr(C)]
#[derive(Debug)]
pub struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub major_version: c_int,
    pub minor_version: c_int,
}

/// Generic entry point: every PJRT function except the two error helpers takes
/// a pointer to its argument struct and returns an owned `PJRT_Error*` (null on
/// success). The argument type is erased here; `client.rs` passes the right
/// struct for each entry.
pub type ApiFn = Option<unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error>;

/// `PJRT_Api` (0.81): struct_size 984.
#[repr(C)]
pub struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub pjrt_api_version: PJRT_Api_Version,
    pub PJRT_Error_Destroy: Option<unsafe extern "C" fn(*mut PJRT_Error_Destroy_Args)>,
    pub PJRT_Error_Message: Option<unsafe extern "C" fn(*mut PJRT_Error_Message_Args)>,
    pub PJRT_Error_GetCode: ApiFn,
    pub PJRT_Plugin_Initialize: ApiFn,
    pub PJRT_Plugin_Attributes: ApiFn,
    pub PJRT_Event_Destroy: ApiFn,
    pub PJRT_Event_IsReady: ApiFn,
    pub PJRT_Event_Error: ApiFn,
    pub PJRT_Event_Await: ApiFn,
    pub PJRT_Event_OnReady: ApiFn,
    pub PJRT_Client_Create: ApiFn,
    pub PJRT_Client_Destroy: ApiFn,
    pub PJRT_Client_PlatformName: ApiFn,
    pub PJRT_Client_ProcessIndex: ApiFn,
    pub PJRT_Client_PlatformVersion: ApiFn,
    pub PJRT_Client_Devices: ApiFn,
    pub PJRT_Client_AddressableDevices: ApiFn,
    pub PJRT_Client_LookupDevice: ApiFn,
    pub PJRT_Client_LookupAddressableDevice: ApiFn,
    pub PJRT_Client_AddressableMemories: ApiFn,
    pub PJRT_Client_Compile: ApiFn,
    pub PJRT_Client_DefaultDeviceAssignment: ApiFn,
    pub PJRT_Client_BufferFromHostBuffer: ApiFn,
    pub PJRT_DeviceDescription_Id: ApiFn,
    pub PJRT_DeviceDescription_ProcessIndex: ApiFn,
    pub PJRT_DeviceDescription_Attributes: ApiFn,
    pub PJRT_DeviceDescription_Kind: ApiFn,
    pub PJRT_DeviceDescription_DebugString: ApiFn,
    pub PJRT_DeviceDescription_ToString: ApiFn,
    pub PJRT_Device_GetDescription: ApiFn,
    pub PJRT_Device_IsAddressable: ApiFn,
    pub PJRT_Device_LocalHardwareId: ApiFn,
    pub PJRT_Device_AddressableMemories: ApiFn,
    pub PJRT_Device_DefaultMemory: ApiFn,
    pub PJRT_Device_MemoryStats: ApiFn,
    pub PJRT_Memory_Id: ApiFn,
    pub PJRT_Memory_Kind: ApiFn,
    pub PJRT_Memory_DebugString: ApiFn,
    pub PJRT_Memory_ToString: ApiFn,
    pub PJRT_Memory_AddressableByDevices: ApiFn,
    pub PJRT_Executable_Destroy: ApiFn,
    pub PJRT_Executable_Name: ApiFn,
    pub PJRT_Executable_NumReplicas: ApiFn,
    pub PJRT_Executable_NumPartitions: ApiFn,
    pub PJRT_Executable_NumOutputs: ApiFn,
    pub PJRT_Executable_SizeOfGeneratedCodeInBytes: ApiFn,
    pub PJRT_Executable_GetCostAnalysis: ApiFn,
    pub PJRT_Executable_OutputMemoryKinds: ApiFn,
    pub PJRT_Executable_OptimizedProgram: ApiFn,
    pub PJRT_Executable_Serialize: ApiFn,
    pub PJRT_LoadedExecutable_Destroy: ApiFn,
    pub PJRT_LoadedExecutable_GetExecutable: ApiFn,
    pub PJRT_LoadedExecutable_AddressableDevices: ApiFn,
    pub PJRT_LoadedExecutable_Delete: ApiFn,
    pub PJRT_LoadedExecutable_IsDeleted: ApiFn,
    pub PJRT_LoadedExecutable_Execute: ApiFn,
    pub PJRT_Executable_DeserializeAndLoad: ApiFn,
    pub PJRT_LoadedExecutable_Fingerprint: ApiFn,
    pub PJRT_Buffer_Destroy: ApiFn,
    pub PJRT_Buffer_ElementType: ApiFn,
    pub PJRT_Buffer_Dimensions: ApiFn,
    pub PJRT_Buffer_UnpaddedDimensions: ApiFn,
    pub PJRT_Buffer_DynamicDimensionIndices: ApiFn,
    pub PJRT_Buffer_GetMemoryLayout: ApiFn,
    pub PJRT_Buffer_OnDeviceSizeInBytes: ApiFn,
    pub PJRT_Buffer_Device: ApiFn,
    pub PJRT_Buffer_Memory: ApiFn,
    pub PJRT_Buffer_Delete: ApiFn,
    pub PJRT_Buffer_IsDeleted: ApiFn,
    pub PJRT_Buffer_CopyToDevice: ApiFn,
    pub PJRT_Buffer_ToHostBuffer: ApiFn,
    pub PJRT_Buffer_IsOnCpu: ApiFn,
    pub PJRT_Buffer_ReadyEvent: ApiFn,
    pub PJRT_Buffer_UnsafePointer: ApiFn,
    pub PJRT_Buffer_IncreaseExternalReferenceCount: ApiFn,
    pub PJRT_Buffer_DecreaseExternalReferenceCount: ApiFn,
    pub PJRT_Buffer_OpaqueDeviceMemoryDataPointer: ApiFn,
    pub PJRT_CopyToDeviceStream_Destroy: ApiFn,
    pub PJRT_CopyToDeviceStream_AddChunk: ApiFn,
    pub PJRT_CopyToDeviceStream_TotalBytes: ApiFn,
    pub PJRT_CopyToDeviceStream_GranuleSize: ApiFn,
    pub PJRT_CopyToDeviceStream_CurrentBytes: ApiFn,
    pub PJRT_TopologyDescription_Create: ApiFn,
    pub PJRT_TopologyDescription_Destroy: ApiFn,
    pub PJRT_TopologyDescription_PlatformName: ApiFn,
    pub PJRT_TopologyDescription_PlatformVersion: ApiFn,
    pub PJRT_TopologyDescription_GetDeviceDescriptions: ApiFn,
    pub PJRT_TopologyDescription_Serialize: ApiFn,
    pub PJRT_TopologyDescription_Attributes: ApiFn,
    pub PJRT_Compile: ApiFn,
    pub PJRT_Executable_OutputElementTypes: ApiFn,
    pub PJRT_Executable_OutputDimensions: ApiFn,
    pub PJRT_Buffer_CopyToMemory: ApiFn,
    pub PJRT_Client_CreateViewOfDeviceBuffer: ApiFn,
    pub PJRT_Executable_Fingerprint: ApiFn,
    pub PJRT_Client_TopologyDescription: ApiFn,
    pub PJRT_Executable_GetCompiledMemoryStats: ApiFn,
    pub PJRT_Memory_Kind_Id: ApiFn,
    pub PJRT_ExecuteContext_Create: ApiFn,
    pub PJRT_ExecuteContext_Destroy: ApiFn,
    pub PJRT_Buffer_CopyRawToHost: ApiFn,
    pub PJRT_AsyncHostToDeviceTransferManager_Destroy: ApiFn,
    pub PJRT_AsyncHostToDeviceTransferManager_TransferData: ApiFn,
    pub PJRT_Client_CreateBuffersForAsyncHostToDevice: ApiFn,
    pub PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer: ApiFn,
    pub PJRT_AsyncHostToDeviceTransferManager_Device: ApiFn,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferCount: ApiFn,
    pub PJRT_AsyncHostToDeviceTransferManager_BufferSize: ApiFn,
    pub PJRT_AsyncHostToDeviceTransferManager_SetBufferError: ApiFn,
    pub PJRT_AsyncHostToDeviceTransferManager_AddMetadata: ApiFn,
    pub PJRT_Client_DmaMap: ApiFn,
    pub PJRT_Client_DmaUnmap: ApiFn,
    pub PJRT_Client_CreateUninitializedBuffer: ApiFn,
    pub PJRT_Client_UpdateGlobalProcessInfo: ApiFn,
    pub PJRT_TopologyDescription_Deserialize: ApiFn,
    pub PJRT_Client_CreateAliasBuffer: ApiFn,
    pub PJRT_Client_FulfillAliasBuffer: ApiFn,
    pub PJRT_LoadedExecutable_GetDeviceAssignment: ApiFn,
}

pub const PJRT_API_STRUCT_SIZE: usize = 984;
pub const PJRT_API_MAJOR: c_int = 0;
pub const PJRT_API_MINOR: c_int = 81;

/// Declares a PJRT argument struct whose first two fields are `struct_size`
/// and `extension_start`, plus `SIZE` (= `PJRT_STRUCT_SIZE(name, last)`) and a
/// zero-initialising `new()` that fills in `struct_size`.
macro_rules! pjrt_args {
    ($name:ident, last = $last:ident : $lty:ty, { $($field:ident : $fty:ty),* $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *mut PJRT_Extension_Base,
            $(pub $field: $fty,)*
        }
        impl $name {
            pub const SIZE: usize = offset_of!($name, $last) + size_of::<$lty>();
            pub fn new() -> Self {
                // SAFETY: the struct only holds integers, bools, raw pointers and
                // `Option<fn>`s, for all of which the all-zero bit pattern is a
                // valid value (0 / false / null / None).
                let mut s: Self = unsafe { std::mem::zeroed() };
                s.struct_size = Self::SIZE;
                s
            }
        }
    };
}

pjrt_args!(PJRT_Error_Destroy_Args, last = error: *mut PJRT_Error, { error: *mut PJRT_Error });
pjrt_args!(PJRT_Error_Message_Args, last = message_size: usize, {
    error: *const PJRT_Error,
    message: *const c_char,
    message_size: usize,
});
pjrt_args!(PJRT_Error_GetCode_Args, last = code: c_int, {
    error: *const PJRT_Error,
    code: c_int,
});
pjrt_args!(PJRT_Plugin_Initialize_Args, last = extension_start: *mut PJRT_Extension_Base, {});

/// `PJRT_NamedValue` (a tagged union; `value` holds the union's bits).
#[repr(C)]
pub struct PJRT_NamedValue {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub name: *const c_char,
    pub name_size: usize,
    pub type_: u32,
    pub value: u64,
    pub value_size: usize,
}
impl PJRT_NamedValue {
    pub const SIZE: usize = offset_of!(PJRT_NamedValue, value_size) + size_of::<usize>();
}
pub const PJRT_NAMED_VALUE_STRING: u32 = 0;
pub const PJRT_NAMED_VALUE_INT64: u32 = 1;
pub const PJRT_NAMED_VALUE_INT64_LIST: u32 = 2;
pub const PJRT_NAMED_VALUE_FLOAT: u32 = 3;
pub const PJRT_NAMED_VALUE_BOOL: u32 = 4;

pjrt_args!(PJRT_Plugin_Attributes_Args, last = num_attributes: usize, {
    attributes: *const PJRT_NamedValue,
    num_attributes: usize,
});

pjrt_args!(PJRT_Event_Destroy_Args, last = event: *mut PJRT_Event, { event: *mut PJRT_Event });
pjrt_args!(PJRT_Event_Await_Args, last = event: *mut PJRT_Event, { event: *mut PJRT_Event });
pjrt_args!(PJRT_Event_IsReady_Args, last = is_ready: bool, {
    event: *mut PJRT_Event,
    is_ready: bool,
});

pjrt_args!(PJRT_Client_Create_Args, last = kv_try_get_user_arg: *mut c_void, {
    create_options: *const PJRT_NamedValue,
    num_options: usize,
    kv_get_callback: *mut c_void,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: *mut c_void,
    kv_put_user_arg: *mut c_void,
    client: *mut PJRT_Client,
    kv_try_get_callback: *mut c_void,
    kv_try_get_user_arg: *mut c_void,
});
pjrt_args!(PJRT_Client_Destroy_Args, last = client: *mut PJRT_Client, { client: *mut PJRT_Client });
pjrt_args!(PJRT_Client_PlatformName_Args, last = platform_name_size: usize, {
    client: *mut PJRT_Client,
    platform_name: *const c_char,
    platform_name_size: usize,
});
pjrt_args!(PJRT_Client_PlatformVersion_Args, last = platform_version_size: usize, {
    client: *mut PJRT_Client,
    platform_version: *const c_char,
    platform_version_size: usize,
});
pjrt_args!(PJRT_Client_Devices_Args, last = num_devices: usize, {
    client: *mut PJRT_Client,
    devices: *const *mut PJRT_Device,
    num_devices: usize,
});
pjrt_args!(PJRT_Client_AddressableDevices_Args, last = num_addressable_devices: usize, {
    client: *mut PJRT_Client,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});

// `PJRT_Program`.
pjrt_args!(PJRT_Program, last = format_size: usize, {
    code: *mut c_char,
    code_size: usize,
    format: *const c_char,
    format_size: usize,
});
pjrt_args!(PJRT_Client_Compile_Args, last = executable: *mut PJRT_LoadedExecutable, {
    client: *mut PJRT_Client,
    program: *const PJRT_Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut PJRT_LoadedExecutable,
});

pub const PJRT_HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: u32 = 0;
pub const PJRT_HOST_BUFFER_IMMUTABLE_UNTIL_TRANSFER_COMPLETES: u32 = 1;

pjrt_args!(PJRT_Client_BufferFromHostBuffer_Args, last = buffer: *mut PJRT_Buffer, {
    client: *mut PJRT_Client,
    data: *const c_void,
    type_: u32,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: u32,
    device: *mut PJRT_Device,
    memory: *mut PJRT_Memory,
    device_layout: *mut c_void,
    done_with_host_buffer: *mut PJRT_Event,
    buffer: *mut PJRT_Buffer,
});

pjrt_args!(PJRT_DeviceDescription_Id_Args, last = id: c_int, {
    device_description: *mut PJRT_DeviceDescription,
    id: c_int,
});
pjrt_args!(PJRT_DeviceDescription_Kind_Args, last = device_kind_size: usize, {
    device_description: *mut PJRT_DeviceDescription,
    device_kind: *const c_char,
    device_kind_size: usize,
});
pjrt_args!(PJRT_Device_GetDescription_Args, last = device_description: *mut PJRT_DeviceDescription, {
    device: *mut PJRT_Device,
    device_description: *mut PJRT_DeviceDescription,
});
pjrt_args!(PJRT_Device_IsAddressable_Args, last = is_addressable: bool, {
    device: *mut PJRT_Device,
    is_addressable: bool,
});

pjrt_args!(PJRT_Device_MemoryStats_Args, last = peak_pool_bytes_is_set: bool, {
    device: *mut PJRT_Device,
    bytes_in_use: i64,
    peak_bytes_in_use: i64,
    peak_bytes_in_use_is_set: bool,
    num_allocs: i64,
    num_allocs_is_set: bool,
    largest_alloc_size: i64,
    largest_alloc_size_is_set: bool,
    bytes_limit: i64,
    bytes_limit_is_set: bool,
    bytes_reserved: i64,
    bytes_reserved_is_set: bool,
    peak_bytes_reserved: i64,
    peak_bytes_reserved_is_set: bool,
    bytes_reservable_limit: i64,
    bytes_reservable_limit_is_set: bool,
    largest_free_block_bytes: i64,
    largest_free_block_bytes_is_set: bool,
    pool_bytes: i64,
    pool_bytes_is_set: bool,
    peak_pool_bytes: i64,
    peak_pool_bytes_is_set: bool,
});

pjrt_args!(PJRT_Device_DefaultMemory_Args, last = memory: *mut PJRT_Memory, {
    device: *mut PJRT_Device,
    memory: *mut PJRT_Memory,
});
pjrt_args!(PJRT_ShapeSpec, last = element_type: u32, {
    dims: *const i64,
    num_dims: usize,
    element_type: u32,
});
pjrt_args!(PJRT_Client_CreateBuffersForAsyncHostToDevice_Args, last = transfer_manager: *mut PJRT_AsyncHostToDeviceTransferManager, {
    client: *mut PJRT_Client,
    shape_specs: *mut PJRT_ShapeSpec,
    num_shape_specs: usize,
    device_layouts: *mut *mut c_void,
    num_device_layouts: usize,
    memory: *mut PJRT_Memory,
    transfer_manager: *mut PJRT_AsyncHostToDeviceTransferManager,
});
pjrt_args!(PJRT_AsyncHostToDeviceTransferManager_TransferData_Args, last = done_with_h2d_transfer: *mut PJRT_Event, {
    transfer_manager: *mut PJRT_AsyncHostToDeviceTransferManager,
    buffer_index: c_int,
    data: *const c_void,
    offset: i64,
    transfer_size: i64,
    is_last_transfer: bool,
    done_with_h2d_transfer: *mut PJRT_Event,
});
pjrt_args!(PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args, last = buffer_out: *mut PJRT_Buffer, {
    transfer_manager: *mut PJRT_AsyncHostToDeviceTransferManager,
    buffer_index: c_int,
    buffer_out: *mut PJRT_Buffer,
});
pjrt_args!(PJRT_AsyncHostToDeviceTransferManager_Destroy_Args, last = transfer_manager: *mut PJRT_AsyncHostToDeviceTransferManager, {
    transfer_manager: *mut PJRT_AsyncHostToDeviceTransferManager,
});

pjrt_args!(PJRT_Executable_Destroy_Args, last = executable: *mut PJRT_Executable, {
    executable: *mut PJRT_Executable,
});
pjrt_args!(PJRT_LoadedExecutable_Destroy_Args, last = executable: *mut PJRT_LoadedExecutable, {
    executable: *mut PJRT_LoadedExecutable,
});
pjrt_args!(PJRT_LoadedExecutable_GetExecutable_Args, last = executable: *mut PJRT_Executable, {
    loaded_executable: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
});
pjrt_args!(PJRT_Executable_NumOutputs_Args, last = num_outputs: usize, {
    executable: *mut PJRT_Executable,
    num_outputs: usize,
});
pjrt_args!(PJRT_Executable_OptimizedProgram_Args, last = program: *mut PJRT_Program, {
    executable: *mut PJRT_Executable,
    program: *mut PJRT_Program,
});
pjrt_args!(PJRT_Executable_OutputElementTypes_Args, last = num_output_types: usize, {
    executable: *mut PJRT_Executable,
    output_types: *const u32,
    num_output_types: usize,
});
pjrt_args!(PJRT_Executable_OutputDimensions_Args, last = dim_sizes: *const usize, {
    executable: *mut PJRT_Executable,
    num_outputs: usize,
    dims: *const i64,
    dim_sizes: *const usize,
});

pjrt_args!(PJRT_ExecuteOptions, last = incarnation_ids: *mut i64, {
    send_callbacks: *mut c_void,
    recv_callbacks: *mut c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: c_int,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut PJRT_ExecuteContext,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut c_int,
    incarnation_ids: *mut i64,
});
pjrt_args!(PJRT_LoadedExecutable_Execute_Args, last = execute_device: *mut PJRT_Device, {
    executable: *mut PJRT_LoadedExecutable,
    options: *mut PJRT_ExecuteOptions,
    argument_lists: *const *const *mut PJRT_Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut PJRT_Buffer,
    device_complete_events: *mut *mut PJRT_Event,
    execute_device: *mut PJRT_Device,
});

pjrt_args!(PJRT_Buffer_Destroy_Args, last = buffer: *mut PJRT_Buffer, { buffer: *mut PJRT_Buffer });
pjrt_args!(PJRT_Buffer_ElementType_Args, last = type_: u32, {
    buffer: *mut PJRT_Buffer,
    type_: u32,
});
pjrt_args!(PJRT_Buffer_Dimensions_Args, last = num_dims: usize, {
    buffer: *mut PJRT_Buffer,
    dims: *const i64,
    num_dims: usize,
});

/// `PJRT_Buffer_MemoryLayout_Tiled`.
#[repr(C)]
pub struct PJRT_Buffer_MemoryLayout_Tiled {
    pub struct_size: usize,
    pub extension_start: *mut PJRT_Extension_Base,
    pub minor_to_major: *const i64,
    pub minor_to_major_size: usize,
    pub tile_dims: *const i64,
    pub tile_dim_sizes: *const usize,
    pub num_tiles: usize,
}
// `PJRT_Buffer_MemoryLayout` (the union is represented by its larger member,
// `tiled`; `strides` would overlay its first four words).
pjrt_args!(PJRT_Buffer_MemoryLayout, last = type_: u32, {
    tiled: PJRT_Buffer_MemoryLayout_Tiled,
    type_: u32,
});
pub const PJRT_BUFFER_MEMORY_LAYOUT_TILED: u32 = 0;
pjrt_args!(PJRT_Buffer_GetMemoryLayout_Args, last = layout: PJRT_Buffer_MemoryLayout, {
    buffer: *mut PJRT_Buffer,
    layout: PJRT_Buffer_MemoryLayout,
});
pjrt_args!(PJRT_Buffer_ToHostBuffer_Args, last = event: *mut PJRT_Event, {
    src: *mut PJRT_Buffer,
    host_layout: *mut PJRT_Buffer_MemoryLayout,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut PJRT_Event,
});
pjrt_args!(PJRT_Buffer_ReadyEvent_Args, last = event: *mut PJRT_Event, {
    buffer: *mut PJRT_Buffer,
    event: *mut PJRT_Event,
});
pjrt_args!(PJRT_Buffer_Device_Args, last = device: *mut PJRT_Device, {
    buffer: *mut PJRT_Buffer,
    device: *mut PJRT_Device,
});
pjrt_args!(PJRT_Buffer_OnDeviceSizeInBytes_Args, last = on_device_size_in_bytes: usize, {
    buffer: *mut PJRT_Buffer,
    on_device_size_in_bytes: usize,
});
pjrt_args!(PJRT_Buffer_ExternalReferenceCount_Args, last = buffer: *mut PJRT_Buffer, {
    buffer: *mut PJRT_Buffer,
});
pjrt_args!(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args, last = device_memory_ptr: *mut c_void, {
    buffer: *mut PJRT_Buffer,
    device_memory_ptr: *mut c_void,
});

// ----------------------------- FFI extension ---------------------------------

/// `PJRT_FFI_Extension` (extension type 5).
#[repr(C)]
pub struct PJRT_FFI_Extension {
    pub base: PJRT_Extension_Base,
    pub type_id_register: ApiFn,
    pub user_data_add: ApiFn,
    pub register_handler:
        Option<unsafe extern "C" fn(*mut PJRT_FFI_Register_Handler_Args) -> *mut PJRT_Error>,
}

/// `PJRT_FFI_Register_Handler_Args` (no `extension_start` in this struct).
#[repr(C)]
pub struct PJRT_FFI_Register_Handler_Args {
    pub struct_size: usize,
    pub target_name: *const c_char,
    pub target_name_size: usize,
    pub handler: *mut c_void,
    pub platform_name: *const c_char,
    pub platform_name_size: usize,
    pub traits: u32,
}
impl PJRT_FFI_Register_Handler_Args {
    pub const SIZE: usize = offset_of!(PJRT_FFI_Register_Handler_Args, traits) + size_of::<u32>();
}

// ------------------------------ XLA FFI API ----------------------------------

/// `XLA_FFI_Extension_Base`.
#[repr(C)]
pub struct XLA_FFI_Extension_Base {
    pub struct_size: usize,
    pub type_: u32,
    pub next: *mut XLA_FFI_Extension_Base,
}
pub const XLA_FFI_EXTENSION_METADATA: u32 = 1;

/// `XLA_FFI_Api_Version`.
#[repr(C)]
pub struct XLA_FFI_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub major_version: c_int,
    pub minor_version: c_int,
}

/// `XLA_FFI_Metadata`. `struct_size` covers fields up to `traits`; handlers of stateful kernels
/// also write `state_type_id` (an `XLA_FFI_TypeId`, 0 for none).
#[repr(C)]
pub struct XLA_FFI_Metadata {
    pub struct_size: usize,
    pub api_version: XLA_FFI_Api_Version,
    pub traits: u32,
    pub state_type_id: i64,
}
impl XLA_FFI_Metadata {
    pub const SIZE: usize = offset_of!(XLA_FFI_Metadata, traits) + size_of::<u32>();
}
impl XLA_FFI_Api_Version {
    pub const SIZE: usize = offset_of!(XLA_FFI_Api_Version, minor_version) + size_of::<c_int>();
}

/// `XLA_FFI_Metadata_Extension`.
#[repr(C)]
pub struct XLA_FFI_Metadata_Extension {
    pub extension_base: XLA_FFI_Extension_Base,
    pub metadata: *mut XLA_FFI_Metadata,
}

/// `XLA_FFI_Error_Create_Args`.
#[repr(C)]
pub struct XLA_FFI_Error_Create_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub message: *const c_char,
    pub errc: u32,
}
impl XLA_FFI_Error_Create_Args {
    pub const SIZE: usize = offset_of!(XLA_FFI_Error_Create_Args, errc) + size_of::<u32>();
}

#[repr(C)]
pub struct XLA_FFI_Error {
    _p: [u8; 0],
}

pub type XLA_FFI_Error_Create =
    unsafe extern "C" fn(*mut XLA_FFI_Error_Create_Args) -> *mut XLA_FFI_Error;

/// `XLA_FFI_Error_GetMessage_Args`.
#[repr(C)]
pub struct XLA_FFI_Error_GetMessage_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub error: *mut XLA_FFI_Error,
    pub message: *const c_char,
}
impl XLA_FFI_Error_GetMessage_Args {
    pub const SIZE: usize = size_of::<XLA_FFI_Error_GetMessage_Args>();
}
pub type XLA_FFI_Error_GetMessage = unsafe extern "C" fn(*mut XLA_FFI_Error_GetMessage_Args);

/// `XLA_FFI_Error_Destroy_Args`.
#[repr(C)]
pub struct XLA_FFI_Error_Destroy_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub error: *mut XLA_FFI_Error,
}
impl XLA_FFI_Error_Destroy_Args {
    pub const SIZE: usize = size_of::<XLA_FFI_Error_Destroy_Args>();
}
pub type XLA_FFI_Error_Destroy = unsafe extern "C" fn(*mut XLA_FFI_Error_Destroy_Args);

/// `XLA_FFI_Handler_Bundle`: one handler per execution stage; only `execute` is required.
#[repr(C)]
pub struct XLA_FFI_Handler_Bundle {
    pub instantiate: Option<XLA_FFI_Handler>,
    pub prepare: Option<XLA_FFI_Handler>,
    pub initialize: Option<XLA_FFI_Handler>,
    pub execute: Option<XLA_FFI_Handler>,
}

/// `XLA_FFI_Handler_Register_Args`.
#[repr(C)]
pub struct XLA_FFI_Handler_Register_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub name: XLA_FFI_ByteSpan,
    pub platform: XLA_FFI_ByteSpan,
    pub bundle: XLA_FFI_Handler_Bundle,
    pub traits: u32,
}
impl XLA_FFI_Handler_Register_Args {
    pub const SIZE: usize = offset_of!(XLA_FFI_Handler_Register_Args, traits) + size_of::<u32>();
}
pub type XLA_FFI_Handler_Register =
    unsafe extern "C" fn(*mut XLA_FFI_Handler_Register_Args) -> *mut XLA_FFI_Error;

/// `XLA_FFI_Stream_Get_Args`: the platform stream (a `CUstream` on CUDA) of a running call.
#[repr(C)]
pub struct XLA_FFI_Stream_Get_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub ctx: *mut c_void,
    pub stream: *mut c_void,
}
impl XLA_FFI_Stream_Get_Args {
    pub const SIZE: usize = offset_of!(XLA_FFI_Stream_Get_Args, stream) + size_of::<usize>();
}
pub type XLA_FFI_Stream_Get =
    unsafe extern "C" fn(*mut XLA_FFI_Stream_Get_Args) -> *mut XLA_FFI_Error;

/// Prefix of `XLA_FFI_Api` up to `XLA_FFI_Stream_Get` (all we use; `struct_size` says whether
/// a plugin's table reaches it).
#[repr(C)]
pub struct XLA_FFI_Api {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub api_version: XLA_FFI_Api_Version,
    pub internal_api: *mut c_void,
    pub XLA_FFI_Error_Create: Option<XLA_FFI_Error_Create>,
    pub XLA_FFI_Error_GetMessage: Option<XLA_FFI_Error_GetMessage>,
    pub XLA_FFI_Error_Destroy: Option<XLA_FFI_Error_Destroy>,
    pub XLA_FFI_Handler_Register: Option<XLA_FFI_Handler_Register>,
    pub XLA_FFI_Stream_Get: Option<XLA_FFI_Stream_Get>,
}

pub const XLA_FFI_ERROR_CODE_UNKNOWN: u32 = 2;
pub const XLA_FFI_ERROR_CODE_INTERNAL: u32 = 13;

/// `XLA_FFI_Buffer`.
#[repr(C)]
pub struct XLA_FFI_Buffer {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub dtype: u32,
    pub data: *mut c_void,
    pub rank: i64,
    pub dims: *const i64,
}

/// `XLA_FFI_Args` / `XLA_FFI_Rets` (identical layout: size, types, pointers).
#[repr(C)]
pub struct XLA_FFI_Args {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub size: i64,
    pub types: *const u32,
    pub args: *const *mut c_void,
}
pub const XLA_FFI_ARG_TYPE_BUFFER: u32 = 1;

/// `XLA_FFI_ByteSpan`.
#[repr(C)]
pub struct XLA_FFI_ByteSpan {
    pub ptr: *const c_char,
    pub len: usize,
}

/// `XLA_FFI_Attrs`.
#[repr(C)]
pub struct XLA_FFI_Attrs {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub size: i64,
    pub types: *const u32,
    pub names: *const *const XLA_FFI_ByteSpan,
    pub attrs: *const *mut c_void,
}
pub const XLA_FFI_ATTR_ARRAY: u32 = 1;
pub const XLA_FFI_ATTR_DICTIONARY: u32 = 2;
pub const XLA_FFI_ATTR_SCALAR: u32 = 3;
pub const XLA_FFI_ATTR_STRING: u32 = 4;

/// `XLA_FFI_Scalar`.
#[repr(C)]
pub struct XLA_FFI_Scalar {
    pub dtype: u32,
    pub value: *const c_void,
}

/// `XLA_FFI_Array`.
#[repr(C)]
pub struct XLA_FFI_Array {
    pub dtype: u32,
    pub size: usize,
    pub data: *const c_void,
}

pub const XLA_FFI_STAGE_EXECUTE: u32 = 3;

/// `XLA_FFI_CallFrame`.
#[repr(C)]
pub struct XLA_FFI_CallFrame {
    pub struct_size: usize,
    pub extension_start: *mut XLA_FFI_Extension_Base,
    pub api: *const XLA_FFI_Api,
    pub ctx: *mut c_void,
    pub stage: u32,
    pub args: XLA_FFI_Args,
    pub rets: XLA_FFI_Args,
    pub attrs: XLA_FFI_Attrs,
    pub future: *mut c_void,
}

impl XLA_FFI_CallFrame {
    /// `XLA_FFI_CallFrame_STRUCT_SIZE`: up to `attrs` (handlers check it exactly).
    pub const SIZE: usize = offset_of!(XLA_FFI_CallFrame, attrs) + size_of::<XLA_FFI_Attrs>();
}

/// `XLA_FFI_Handler`.
pub type XLA_FFI_Handler = unsafe extern "C" fn(*mut XLA_FFI_CallFrame) -> *mut XLA_FFI_Error;

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by gcc from pjrt_c_api.h 0.81 (`PJRT_STRUCT_SIZE`) and
    /// from the documented FFI layout (x86_64).
    #[test]
    fn struct_sizes_match_header() {
        assert_eq!(size_of::<PJRT_Api>(), PJRT_API_STRUCT_SIZE);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, api), 0x10);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, ctx), 0x18);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, stage), 0x20);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, args), 0x28);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, rets), 0x50);
        assert_eq!(offset_of!(XLA_FFI_CallFrame, attrs), 0x78);
        assert_eq!(offset_of!(XLA_FFI_Buffer, dtype), 0x10);
        assert_eq!(offset_of!(XLA_FFI_Buffer, data), 0x18);
        assert_eq!(offset_of!(XLA_FFI_Buffer, rank), 0x20);
        assert_eq!(offset_of!(XLA_FFI_Buffer, dims), 0x28);
        assert_eq!(size_of::<PJRT_FFI_Extension>(), 0x30);
        assert_eq!(PJRT_FFI_Register_Handler_Args::SIZE, 0x34);
        assert_eq!(offset_of!(XLA_FFI_Api, XLA_FFI_Error_Create), 0x30);
        assert_eq!(offset_of!(XLA_FFI_Metadata_Extension, metadata), 0x18);
        assert_eq!(offset_of!(XLA_FFI_Api, XLA_FFI_Handler_Register), 0x48);
        assert_eq!(offset_of!(XLA_FFI_Api, XLA_FFI_Stream_Get), 0x50);
        assert_eq!(XLA_FFI_Stream_Get_Args::SIZE, 32);
        assert_eq!(XLA_FFI_Metadata::SIZE, 36);
        assert_eq!(XLA_FFI_CallFrame::SIZE, 168);
        assert_eq!(offset_of!(XLA_FFI_Metadata, state_type_id), 40);
        assert_eq!(XLA_FFI_Handler_Register_Args::SIZE, 84);
        assert_eq!(XLA_FFI_Error_GetMessage_Args::SIZE, 32);
        assert_eq!(XLA_FFI_Error_Destroy_Args::SIZE, 24);
        assert_eq!(PJRT_Error_Destroy_Args::SIZE, 24);
        assert_eq!(PJRT_Error_Message_Args::SIZE, 40);
        assert_eq!(PJRT_Error_GetCode_Args::SIZE, 28);
        assert_eq!(PJRT_Plugin_Initialize_Args::SIZE, 16);
        assert_eq!(PJRT_Plugin_Attributes_Args::SIZE, 32);
        assert_eq!(PJRT_Event_Destroy_Args::SIZE, 24);
        assert_eq!(PJRT_Event_Await_Args::SIZE, 24);
        assert_eq!(PJRT_Event_IsReady_Args::SIZE, 25);
        assert_eq!(PJRT_Client_Create_Args::SIZE, 88);
        assert_eq!(PJRT_Device_MemoryStats_Args::SIZE, 185);
        assert_eq!(PJRT_Device_DefaultMemory_Args::SIZE, 32);
        assert_eq!(PJRT_ShapeSpec::SIZE, 36);
        assert_eq!(PJRT_Client_CreateBuffersForAsyncHostToDevice_Args::SIZE, 72);
        assert_eq!(
            offset_of!(
                PJRT_AsyncHostToDeviceTransferManager_TransferData_Args,
                offset
            ),
            0x28
        );
        assert_eq!(
            PJRT_AsyncHostToDeviceTransferManager_TransferData_Args::SIZE,
            0x48
        );
        assert_eq!(
            PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args::SIZE,
            40
        );
        assert_eq!(PJRT_AsyncHostToDeviceTransferManager_Destroy_Args::SIZE, 24);
        assert_eq!(PJRT_Client_Destroy_Args::SIZE, 24);
        assert_eq!(PJRT_Client_PlatformName_Args::SIZE, 40);
        assert_eq!(PJRT_Client_PlatformVersion_Args::SIZE, 40);
        assert_eq!(PJRT_Client_Devices_Args::SIZE, 40);
        assert_eq!(PJRT_Client_AddressableDevices_Args::SIZE, 40);
        assert_eq!(PJRT_Program::SIZE, 48);
        assert_eq!(PJRT_Client_Compile_Args::SIZE, 56);
        assert_eq!(PJRT_Client_BufferFromHostBuffer_Args::SIZE, 120);
        assert_eq!(PJRT_DeviceDescription_Id_Args::SIZE, 28);
        assert_eq!(PJRT_DeviceDescription_Kind_Args::SIZE, 40);
        assert_eq!(PJRT_Device_GetDescription_Args::SIZE, 32);
        assert_eq!(PJRT_Device_IsAddressable_Args::SIZE, 25);
        assert_eq!(PJRT_Executable_Destroy_Args::SIZE, 24);
        assert_eq!(PJRT_LoadedExecutable_Destroy_Args::SIZE, 24);
        assert_eq!(PJRT_LoadedExecutable_GetExecutable_Args::SIZE, 32);
        assert_eq!(PJRT_Executable_NumOutputs_Args::SIZE, 32);
        assert_eq!(PJRT_Executable_OptimizedProgram_Args::SIZE, 32);
        assert_eq!(PJRT_Executable_OutputElementTypes_Args::SIZE, 40);
        assert_eq!(PJRT_Executable_OutputDimensions_Args::SIZE, 48);
        assert_eq!(PJRT_ExecuteOptions::SIZE, 112);
        assert_eq!(PJRT_LoadedExecutable_Execute_Args::SIZE, 80);
        assert_eq!(PJRT_Buffer_Destroy_Args::SIZE, 24);
        assert_eq!(PJRT_Buffer_ElementType_Args::SIZE, 28);
        assert_eq!(PJRT_Buffer_Dimensions_Args::SIZE, 40);
        assert_eq!(PJRT_Buffer_MemoryLayout::SIZE, 76);
        assert_eq!(PJRT_Buffer_GetMemoryLayout_Args::SIZE, 104);
        assert_eq!(PJRT_Buffer_ToHostBuffer_Args::SIZE, 56);
        assert_eq!(PJRT_Buffer_ReadyEvent_Args::SIZE, 32);
        assert_eq!(PJRT_Buffer_OnDeviceSizeInBytes_Args::SIZE, 32);
        assert_eq!(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args::SIZE, 32);
        assert_eq!(PJRT_Buffer_ExternalReferenceCount_Args::SIZE, 24);
        assert_eq!(size_of::<PJRT_Api>(), 984);
        assert_eq!(size_of::<PJRT_NamedValue>(), 56);
    }
}
