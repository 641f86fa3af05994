//! quench-rt: the executor contract and its backends.
//!
//! - [`Executor`]: allocate, copy, load, launch on streams, time with events, capture
//!   and replay graphs; every backend implements it and reports errors as values.
//! - [`KernelAbi`]: a kernel's interface, derived from the IR and checked on every
//!   launch (argument count and types, launch shape, shared memory).
//! - [`InterpExecutor`]: the IR interpreter on the CPU.
//! - [`CudaExecutor`]: the NVIDIA driver, loaded at run time.
//! - [`list_devices`]: the CUDA devices present.
//! - [`native`]: quench's own runtime over the NVIDIA kernel module's ioctls, no libcuda
//!   (the GPUs described, and [`native::NativeExecutor`]).

pub mod abi;
mod alloc_table;
mod checks;
pub mod codegen;
pub mod cuda;
pub mod devices;
pub mod error;
pub mod executor;
mod handles;
pub mod interp;
pub mod native;

pub use abi::{AbiParam, KernelAbi, ParamKind};
pub use codegen::Codegen;
pub use cuda::{CacheStats, CubinRewrite, CudaExecutor};
pub use devices::{list_devices, DeviceInfo};
pub use error::RtError;
pub use executor::{Arg, DevicePtr, EventId, Executor, GraphId, KernelId, Launch, StreamId};
pub use interp::InterpExecutor;
