//! XLA execution through a PJRT plugin (the XLA CPU plugin by default).
//!
//! This is the only part of the crate that contains `unsafe` code: the raw C
//! bindings (`sys`) and the thin safe wrappers around them (`client`,
//! `buffer`, `executable`, `ffi`, `kernel`). `executor` builds the node-facing service
//! (compile cache, worker pool) on the safe API only. The compiler enforces
//! it: the crate denies `unsafe_code` and only those six files allow it.

mod buffer;
mod client;
mod dtype;
mod error;
mod executable;
mod executor;
pub mod ffi;
mod kernel;
mod signature;
mod sys;

pub use buffer::{check_byte_size, Buffer};
pub use client::{Api, Client, DeviceInfo, PluginAttr};
pub use dtype::{element_count, DType, TensorSpec};
pub use error::XlaError;
pub use executable::{CompileOptions, Executable, HostTensor, Input, ParameterSource};
pub use executor::{Executor, ExecutorConfig, ExecutorStats, Job};
pub use ffi::{register_host_handler, Attr, CallFrame, HostHandler, TensorMut, TensorRef};
pub use kernel::{
    describe_loaded_kernels, load_kernel, loaded_kernels, KernelError, KernelSpec, Loaded,
    LoadedKernel,
};
pub use signature::{mlir_main_parameters, parse_tensor_type};

use std::path::PathBuf;

/// Default location of the PJRT CPU plugin:
/// `$HOME/.local/share/xla_node/pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so`.
pub fn default_plugin_path() -> PathBuf {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/"));
    home.join(".local/share/xla_node/pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")
}

/// Plugin path from `XLA_NODE_PJRT_PLUGIN`, else [`default_plugin_path`].
pub fn plugin_path_from_env() -> PathBuf {
    std::env::var_os("XLA_NODE_PJRT_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(default_plugin_path)
}
