//! The resource manager as quench sees it: the handful of driver calls everything else
//! is built from. [`super::DeviceFiles`] makes them through the device nodes; the tests
//! use a fake that records them.

use std::any::Any;
use std::fmt;
use std::io;

use super::error::NativeError;
use super::ioctl::{CardInfo, Params};
use super::status::NvStatus;

/// A resource-manager object handle (`NvHandle`).
pub type Handle = u32;

/// How one call to the driver failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The ioctl itself failed, with this errno.
    Os(i32),
    /// The resource manager ran the call and returned a status other than `NV_OK`.
    Status(NvStatus),
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Os(errno) => write!(
                f,
                "the driver refused the ioctl: {}",
                io::Error::from_raw_os_error(*errno)
            ),
            CallError::Status(status) => {
                write!(f, "the resource manager returned {status}")
            }
        }
    }
}

impl std::error::Error for CallError {}

/// The driver's answer to the version handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VersionReply {
    /// The versions match.
    Match,
    /// The driver is another version: this one.
    Mismatch { driver: String },
    /// The driver did not recognise the request.
    Unrecognized,
}

/// The device node a CPU mapping goes through: the control node for host memory, the
/// GPU's node for its apertures (memory through BAR1, registers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapNode {
    Control,
    Gpu(u32),
}

impl fmt::Display for MapNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapNode::Control => write!(f, "/dev/nvidiactl"),
            MapNode::Gpu(minor) => write!(f, "/dev/nvidia{minor}"),
        }
    }
}

/// Memory mapped into this process by [`ResourceManager::map_memory`]; it stays mapped
/// until handed back to [`ResourceManager::unmap_memory`].
pub struct CpuMapping {
    /// Where the mapping starts in this process.
    pub address: *mut u8,
    /// Its length in bytes.
    pub length: usize,
    /// The resource manager's `pLinearAddress`, which the unmap takes back.
    pub linear_address: u64,
    /// What keeps the mapping alive (the descriptor it was made through).
    pub keep: Box<dyn Any>,
}

impl fmt::Debug for CpuMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpuMapping")
            .field("address", &self.address)
            .field("length", &self.length)
            .finish()
    }
}

/// The calls quench makes of NVIDIA's resource manager.
pub trait ResourceManager {
    /// An open GPU device node, closed when dropped.
    type GpuNode;

    /// `NV_ESC_CHECK_VERSION_STR`, strict: does the driver run exactly `version`?
    fn check_version(&self, version: &str) -> Result<VersionReply, CallError>;

    /// `NV_ESC_CARD_INFO`: the GPUs the driver has probed, in its order.
    fn card_info(&self) -> Result<Vec<CardInfo>, CallError>;

    /// Opens `/dev/nvidia{minor}`. The resource manager lets a process allocate a
    /// device object only while that process holds the GPU's node open.
    fn open_gpu(&self, minor: u32) -> Result<Self::GpuNode, NativeError>;

    /// `NV_ESC_RM_ALLOC`: an object of class `class` under `parent`; returns the handle
    /// the resource manager chose. A root client has no client or parent (both 0).
    fn alloc(
        &self,
        client: Handle,
        parent: Handle,
        class: u32,
        params: Option<&mut dyn Params>,
    ) -> Result<Handle, CallError>;

    /// `NV_ESC_RM_FREE`: frees `object` and everything under it.
    fn free(&self, client: Handle, parent: Handle, object: Handle) -> Result<(), CallError>;

    /// `NV_ESC_RM_CONTROL`: runs command `cmd` on `object`, which reads and writes
    /// `params`.
    fn control(
        &self,
        client: Handle,
        object: Handle,
        cmd: u32,
        params: &mut dyn Params,
    ) -> Result<(), CallError>;

    /// `NV_ESC_RM_MAP_MEMORY` and `mmap`: maps `length` bytes of `memory` (an object under
    /// `device`, which may be a subdevice) into this process through `node`, with
    /// `NVOS33_FLAGS_*` `flags`.
    fn map_memory(
        &self,
        client: Handle,
        device: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
        node: MapNode,
    ) -> Result<CpuMapping, NativeError>;

    /// `munmap` and `NV_ESC_RM_UNMAP_MEMORY`: undoes [`Self::map_memory`].
    fn unmap_memory(
        &self,
        client: Handle,
        device: Handle,
        memory: Handle,
        mapping: CpuMapping,
    ) -> Result<(), CallError>;

    /// `NV_ESC_RM_MAP_MEMORY_DMA`: maps `length` bytes of `memory` into the GPU virtual
    /// range `dma` (an `NV50_MEMORY_VIRTUAL` under `device`) with `NVOS46_FLAGS_*`
    /// `flags`; returns the GPU address.
    fn map_memory_dma(
        &self,
        client: Handle,
        device: Handle,
        dma: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
    ) -> Result<u64, CallError>;

    /// `NV_ESC_RM_UNMAP_MEMORY_DMA`: undoes the mapping at GPU address `address`.
    fn unmap_memory_dma(
        &self,
        client: Handle,
        device: Handle,
        dma: Handle,
        memory: Handle,
        address: u64,
    ) -> Result<(), CallError>;
}
