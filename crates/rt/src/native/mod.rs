//! `native`: quench's own runtime below the CUDA driver library, talking to NVIDIA's open
//! kernel module directly through its resource-manager ioctls on `/dev/nvidiactl` and
//! `/dev/nvidiaN`. No libcuda.
//!
//! It finds and describes the GPUs, and [`NativeExecutor`] runs the executor contract on
//! them (memory, copies on the copy engine, kernels from cubins, events, graphs), grids
//! started without waiting for them. The layers, bottom to top:
//!
//! - [`ioctl`]: request numbers and the parameter structs of the driver's escapes.
//! - [`objects`], [`controls`]: the resource-manager classes quench allocates and the
//!   control calls it makes, each struct laid out as NVIDIA's header declares it.
//! - [`ResourceManager`]: alloc, free, control, CPU and GPU mappings, card info and the
//!   version check, with [`DeviceFiles`] over the real device nodes (and a recording fake
//!   in the tests).
//! - [`version`]: which kernel module is loaded (`/proc/driver/nvidia/version`).
//! - [`query_devices`]: the version handshake and the device query over any resource
//!   manager; objects are freed in reverse order when they go out of scope.
//! - [`Gpu`], [`Allocation`]: one GPU opened for work with its virtual address space
//!   (`FERMI_VASPACE_A`), and memory on the GPU or the host mapped into it (and into this
//!   process).
//! - [`Channel`]: a channel group and a HOPPER_CHANNEL_GPFIFO_A channel with compute and
//!   copy objects, its GPFIFO ring and USERD, and the usermode doorbell; `submit` hands
//!   it a push buffer segment.
//! - [`Program`], [`Launcher`]: kernels' code in GPU memory; grids, copies and GPU
//!   timestamps run through a channel, in order.
//! - [`NativeExecutor`]: the executor contract over all of it.
//!
//! What a kernel launch sends, encoded without a GPU:
//!
//! - [`qmd`]: the launch descriptor of HOPPER_COMPUTE_A (QMD V04_00), its fields one table
//!   of NVIDIA's `clcbc0qmd.h` bit positions.
//! - [`pushbuf`]: push buffer methods and GPFIFO entries of HOPPER_CHANNEL_GPFIFO_A:
//!   method headers, `SET_OBJECT`, host semaphores, and the compute class's
//!   `SEND_PCAS_A` / `SEND_SIGNALING_PCAS2_B` that start a grid.
//! - [`launch`]: a kernel of a cubin, its launch dimensions and parameter bytes, checked
//!   against Hopper's limits and turned into the QMD's values.
//!
//! Layouts follow open-gpu-kernel-modules 580.142; the structs quench uses are identical
//! in every 580 and 590 release and differ in other branches, so [`version`] refuses
//! those by name.

use std::path::Path;

/// Checks at compile time that a `#[repr(C)]` struct has the size and field offsets of
/// its C declaration in NVIDIA's headers.
macro_rules! assert_layout {
    ($t:ty, size $size:expr $(, $field:ident @ $offset:expr)* $(,)?) => {
        const _: () = {
            assert!(std::mem::size_of::<$t>() == $size);
            $(assert!(std::mem::offset_of!($t, $field) == $offset);)*
        };
    };
}

pub mod arch;
mod channel;
pub mod controls;
mod copy_kernel;
mod device_files;
mod dispatch;
mod error;
mod executor;
#[cfg(test)]
mod fake;
pub mod ioctl;
pub mod launch;
mod memory;
pub mod objects;
pub mod pushbuf;
pub mod qmd;
mod query;
mod rm;
mod segment;
pub mod status;
pub mod version;

pub use arch::Architecture;
pub use channel::{Channel, MAX_GPFIFO_ENTRIES};
pub use device_files::DeviceFiles;
pub use dispatch::{Launcher, Program};
pub use error::NativeError;
pub use executor::NativeExecutor;
pub use memory::{Allocation, Gpu, Placement};
pub use query::{query_devices, NativeDeviceInfo};
pub use rm::{CallError, CpuMapping, Handle, MapNode, ResourceManager, VersionReply};
pub use status::NvStatus;

/// Where the device nodes live.
const DEV_DIR: &str = "/dev";

/// Every GPU the open kernel module drives, as its resource manager describes it; or
/// the error that says what is missing (module, device node, permission, version).
pub fn list_devices() -> Result<Vec<NativeDeviceInfo>, NativeError> {
    let module = version::loaded_module(Path::new(version::PROC_VERSION))?;
    let rm = DeviceFiles::open(Path::new(DEV_DIR))?;
    query_devices(&rm, &module.version)
}
