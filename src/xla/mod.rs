//! XLA execution through a PJRT plugin (the XLA CPU plugin by default).
//!
//! This is the only part of the crate that contains `unsafe` code: the raw C
//! bindings (`sys`), the frame that catches the C++ exceptions XLA throws
//! (`catch`, around `catch.cc`) and the thin safe wrappers around them (`client`,
//! `buffer`, `executable`, `ffi`, `kernel`, `cuda`: the CUDA driver calls of a callback inside
//! a GPU program). The rest is safe code on top:
//! `run` (the one way to execute a program: its arguments checked first),
//! `executor` (a compile cache, `compile_cache`, and a worker pool, `pool`), `tensor`,
//! `dtype`, `packing` (how 2- and 4-bit elements are laid out), `signature`, `proto` (the
//! protobuf reader it uses),
//! `known_faults` (programs refused because XLA's CPU backend mishandles them), `partitions` (how
//! an SPMD program's partitions are launched).
//! The compiler enforces it: the crate denies `unsafe_code` and only the files
//! with unsafe code allow it.

mod buffer;
mod catch;
mod client;
mod compile_cache;
mod cuda;
mod device_upload;
mod dtype;
mod error;
mod executable;
mod executor;
pub mod ffi;
mod kernel;
mod known_faults;
mod options;
pub mod packing;
mod partitions;
mod pool;
mod proto;
mod run;
mod signature;
mod sys;
mod tensor;

pub use buffer::Buffer;
pub use client::{Api, Client, DeviceInfo, DeviceMemory};
pub use device_upload::DeviceUpload;
pub use dtype::{element_count, DType, TensorSpec};
pub use error::XlaError;
pub use executable::{Argument, CompileOptions, Executable};
pub use executor::{Executor, ExecutorStats, IdlePolling, Job, DEFAULT_MAX_CACHED};
pub use ffi::{
    register_host_handler, Attr, CallFrame, HandlerPlatform, HostHandler, TensorMut, TensorRef,
};
pub use kernel::{
    describe_loaded_kernels, load_kernel, loaded_kernels, KernelError, KernelSpec, Loaded,
    LoadedKernel,
};
pub use options::{parse_ints, CreateOption, OptionValue};
pub use run::Run;
pub use tensor::HostTensor;
