//! A resource manager in memory for the tests: it keeps an object tree with the rules
//! the real one enforces on the calls quench makes, answers the controls from a list of
//! GPUs, fails where a test asks it to, and records every call.

use std::any::Any;
use std::cell::RefCell;
use std::mem::size_of_val;
use std::rc::Rc;

use super::controls::{
    Control, FbGetInfoV2Params, GpfifoGetWorkSubmitTokenParams, GpfifoScheduleParams,
    GpuGetIdInfoV2Params, GpuGetNameStringParams, GrGetInfoV2Params, GrGetSmToGpcTpcMappingsParams,
    McGetArchInfoParams, FB_INFO_INDEX_HEAP_SIZE, FB_INFO_INDEX_TOTAL_RAM_SIZE,
    FB_INFO_INDEX_USABLE_RAM_SIZE, GR_INFO_INDEX_LITTER_NUM_GPCS,
    GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC, GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC,
    GR_INFO_INDEX_MAX_WARPS_PER_SM,
};
use super::error::NativeError;
use super::ioctl::{CardInfo, Params, PciInfo};
use super::objects::{
    alloc_flags, Nv0080AllocParameters, Nv2080AllocParameters, NvChannelAllocParams,
    NvChannelGroupAllocationParameters, NvMemoryAllocationParams, NvVaspaceAllocationParameters,
    FERMI_VASPACE_A, HOPPER_CHANNEL_GPFIFO_A, HOPPER_COMPUTE_A, HOPPER_DMA_COPY_A,
    HOPPER_USERMODE_A, KEPLER_CHANNEL_GROUP_A, NV01_DEVICE_0, NV01_MEMORY_LOCAL_USER,
    NV01_MEMORY_SYSTEM, NV01_ROOT_CLIENT, NV2080_ENGINE_TYPE_GRAPHICS, NV20_SUBDEVICE_0,
    NV50_MEMORY_VIRTUAL,
};
use super::rm::{CallError, CpuMapping, Handle, MapNode, ResourceManager, VersionReply};
use super::status::NvStatus;

const NV_ERR_INSUFFICIENT_PERMISSIONS: NvStatus = NvStatus(0x1b);
const NV_ERR_INVALID_ARGUMENT: NvStatus = NvStatus(0x1f);
const NV_ERR_INVALID_CLASS: NvStatus = NvStatus(0x22);
const NV_ERR_INVALID_OBJECT_HANDLE: NvStatus = NvStatus(0x33);
const NV_ERR_INVALID_OBJECT_PARENT: NvStatus = NvStatus(0x36);
const NV_ERR_INVALID_PARAM_STRUCT: NvStatus = NvStatus(0x3a);
const NV_ERR_NO_MEMORY: NvStatus = NvStatus(0x51);
const NV_ERR_NOT_SUPPORTED: NvStatus = NvStatus(0x56);

/// A GPU the fake reports.
#[derive(Clone, Copy, Debug)]
pub struct FakeGpu {
    pub gpu_id: u32,
    pub minor: u32,
    pub bus: u8,
    pub name: &'static str,
    pub sms: u32,
    pub total_kib: u32,
    pub usable_kib: u32,
    pub heap_kib: u32,
    pub architecture: u32,
    pub implementation: u32,
}

/// An H200 with illustrative memory figures.
pub const H200: FakeGpu = FakeGpu {
    gpu_id: 0x1800,
    minor: 0,
    bus: 0x18,
    name: "NVIDIA H200",
    sms: 132,
    total_kib: 150_994_944,
    usable_kib: 147_221_504,
    heap_kib: 146_591_680,
    architecture: 0x180,
    implementation: 0,
};

/// One call the fake received (allocations as they succeeded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    CheckVersion(String),
    CardInfo,
    OpenGpu(u32),
    CloseGpu(u32),
    Alloc {
        class: u32,
        parent: Handle,
        handle: Handle,
    },
    Free {
        parent: Handle,
        handle: Handle,
    },
    Control {
        object: Handle,
        cmd: u32,
    },
    MapMemory {
        device: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
        node: MapNode,
    },
    UnmapMemory {
        device: Handle,
        memory: Handle,
    },
    MapDma {
        device: Handle,
        dma: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
        address: u64,
    },
    UnmapDma {
        dma: Handle,
        memory: Handle,
        address: u64,
    },
}

/// The fake's answer to `NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN` on `channel`.
pub fn work_submit_token(channel: Handle) -> u32 {
    0x00c0_ffee ^ channel
}

/// The usermode registers the fake backs a usermode mapping with.
const USERMODE_BYTES: u64 = 0x10000;

#[derive(Clone, Copy, Debug)]
struct Object {
    handle: Handle,
    parent: Handle,
    class: u32,
    /// The GPU a device or subdevice stands for.
    gpu: Option<usize>,
}

#[derive(Default)]
struct State {
    calls: Vec<Call>,
    objects: Vec<Object>,
    open_nodes: Vec<u32>,
    next_handle: Handle,
    /// The allocation parameters of each object, as bytes.
    params: Vec<(Handle, Vec<u8>)>,
    /// Host memory standing for each memory object a mapping was asked of; kept until the
    /// fake goes, so that a pointer handed out stays valid.
    backing: Vec<(Handle, *mut u64, usize)>,
    /// CPU and GPU mappings not yet undone.
    cpu_mappings: usize,
    dma_mappings: Vec<(Handle, u64)>,
    next_gpu_address: u64,
    /// Fallible calls made so far (alloc, control, map, map DMA).
    attempts: usize,
}

impl Drop for State {
    fn drop(&mut self) {
        for &(_, words, len) in &self.backing {
            // SAFETY: made by Box::into_raw of a boxed slice of `len` words, freed once.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(words, len)) });
        }
    }
}

pub struct FakeRm {
    driver: String,
    gpus: Vec<FakeGpu>,
    state: Rc<RefCell<State>>,
    /// Answer the handshake as a driver that does not know it.
    pub version_unrecognized: bool,
    /// Fail `NV_ESC_CARD_INFO` with this errno.
    pub card_info_errno: Option<i32>,
    /// Fail this control command with this status.
    pub fail_control: Option<(u32, NvStatus)>,
    /// Fail allocations of this class with this status.
    pub fail_alloc: Option<(u32, NvStatus)>,
    /// Behave as if these `/dev/nvidiaN` did not exist.
    pub missing_nodes: Vec<u32>,
    /// Fail the fallible call (alloc, control, map, map DMA) of this index, counted from
    /// 0 over all of them, with this status.
    pub fail_at: Option<(usize, NvStatus)>,
}

/// An open GPU node of the fake; closing it is recorded.
pub struct FakeNode {
    state: Rc<RefCell<State>>,
    minor: u32,
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        let mut s = self.state.borrow_mut();
        s.open_nodes.retain(|&m| m != self.minor);
        s.calls.push(Call::CloseGpu(self.minor));
    }
}

impl FakeRm {
    /// A driver of version `driver` with these GPUs, in this order.
    pub fn new(driver: &str, gpus: Vec<FakeGpu>) -> Self {
        FakeRm {
            driver: driver.to_string(),
            gpus,
            state: Rc::new(RefCell::new({
                let mut s = State::default();
                s.next_handle = 1;
                s
            })),
            version_unrecognized: false,
            card_info_errno: None,
            fail_control: None,
            fail_alloc: None,
            missing_nodes: vec![],
            fail_at: None,
        }
    }

    /// How many fallible calls have been made.
    pub fn attempts(&self) -> usize {
        self.state.borrow().attempts
    }

    /// Counts a fallible call; fails it if the test asked for that.
    fn attempt(&self) -> Result<(), CallError> {
        let mut s = self.state.borrow_mut();
        let n = s.attempts;
        s.attempts += 1;
        match self.fail_at {
            Some((at, status)) if at == n => Err(CallError::Status(status)),
            _ => Ok(()),
        }
    }

    /// The allocation parameters `handle` was made with.
    pub fn params<T: Params + Copy>(&self, handle: Handle) -> T {
        let s = self.state.borrow();
        let (_, bytes) = s
            .params
            .iter()
            .find(|(h, _)| *h == handle)
            .unwrap_or_else(|| panic!("object {handle} was made without parameters"));
        assert_eq!(bytes.len(), std::mem::size_of::<T>());
        // SAFETY: the bytes of a `T` (same size, checked), which is plain integers.
        unsafe { bytes.as_ptr().cast::<T>().read_unaligned() }
    }

    /// The class of a live object.
    pub fn class_of(&self, handle: Handle) -> Option<u32> {
        self.object(handle).map(|o| o.class)
    }

    /// CPU mappings and GPU mappings not yet undone.
    pub fn live_mappings(&self) -> (usize, usize) {
        let s = self.state.borrow();
        (s.cpu_mappings, s.dma_mappings.len())
    }

    /// Reads the 32-bit word at `offset` of the host memory backing `memory`'s mappings.
    pub fn read_u32(&self, memory: Handle, offset: u64) -> u32 {
        let s = self.state.borrow();
        let &(_, words, len) = s
            .backing
            .iter()
            .find(|(h, _, _)| *h == memory)
            .expect("memory never mapped");
        assert!(offset.is_multiple_of(4) && offset + 4 <= len as u64 * 8);
        // SAFETY: in bounds and aligned (checked); the backing lives as long as the fake.
        unsafe {
            words
                .cast::<u8>()
                .add(offset as usize)
                .cast::<u32>()
                .read_volatile()
        }
    }

    /// Reads the 64-bit word at `offset`, as [`Self::read_u32`].
    pub fn read_u64(&self, memory: Handle, offset: u64) -> u64 {
        u64::from(self.read_u32(memory, offset))
            | (u64::from(self.read_u32(memory, offset + 4)) << 32)
    }

    /// Host memory of `bytes` (rounded up to words) standing for `memory`.
    fn backing(&self, memory: Handle, bytes: u64) -> *mut u8 {
        let mut s = self.state.borrow_mut();
        if let Some(&(_, words, _)) = s.backing.iter().find(|(h, _, _)| *h == memory) {
            return words.cast();
        }
        let len = bytes.div_ceil(8) as usize;
        let words = Box::into_raw(vec![0u64; len].into_boxed_slice()).cast::<u64>();
        s.backing.push((memory, words, len));
        words.cast()
    }

    /// The size a memory (or virtual) object was allocated with.
    fn memory_size(&self, handle: Handle) -> u64 {
        self.params::<NvMemoryAllocationParams>(handle).size
    }

    fn is_live(&self, handle: Handle, class: u32) -> bool {
        self.class_of(handle) == Some(class)
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state.borrow().calls.clone()
    }

    /// Handles of the objects not yet freed.
    pub fn live_objects(&self) -> Vec<Handle> {
        self.state
            .borrow()
            .objects
            .iter()
            .map(|o| o.handle)
            .collect()
    }

    fn object(&self, handle: Handle) -> Option<Object> {
        self.state
            .borrow()
            .objects
            .iter()
            .find(|o| o.handle == handle)
            .copied()
    }

    /// The GPU behind a subdevice handle, for the subdevice's controls.
    fn subdevice_gpu(&self, handle: Handle) -> Result<FakeGpu, CallError> {
        match self.object(handle) {
            Some(Object {
                class,
                gpu: Some(gpu),
                ..
            }) if class == NV20_SUBDEVICE_0.id => Ok(self.gpus[gpu]),
            _ => Err(CallError::Status(NV_ERR_INVALID_OBJECT_HANDLE)),
        }
    }

    /// Checks a new object against the tree; returns the GPU it stands for.
    fn admit(
        &self,
        client: Handle,
        parent: Handle,
        class: u32,
        params: Option<&mut dyn Params>,
    ) -> Result<Option<usize>, NvStatus> {
        let params: Option<&mut dyn Any> = params.map(|p| p as &mut dyn Any);
        let parent_class = self.object(parent).map(|o| o.class);
        match class {
            c if c == NV01_ROOT_CLIENT.id => match (client, parent, params) {
                (0, 0, None) => Ok(None),
                _ => Err(NV_ERR_INVALID_ARGUMENT),
            },
            c if c == NV01_DEVICE_0.id => {
                if parent != client || parent_class != Some(NV01_ROOT_CLIENT.id) {
                    return Err(NV_ERR_INVALID_OBJECT_PARENT);
                }
                let p = params
                    .and_then(|p| p.downcast_mut::<Nv0080AllocParameters>())
                    .ok_or(NV_ERR_INVALID_PARAM_STRUCT)?;
                let gpu = p.device_id as usize;
                let minor = self.gpus.get(gpu).ok_or(NV_ERR_INVALID_ARGUMENT)?.minor;
                if p.h_client_share != client {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                // As the driver: a device only for a process holding the GPU's node.
                if !self.state.borrow().open_nodes.contains(&minor) {
                    return Err(NV_ERR_INSUFFICIENT_PERMISSIONS);
                }
                Ok(Some(gpu))
            }
            c if c == NV20_SUBDEVICE_0.id => {
                let gpu = match self.object(parent) {
                    Some(o) if o.class == NV01_DEVICE_0.id => o.gpu,
                    _ => return Err(NV_ERR_INVALID_OBJECT_PARENT),
                };
                match params.and_then(|p| p.downcast_mut::<Nv2080AllocParameters>()) {
                    Some(p) if p.sub_device_id == 0 => Ok(gpu),
                    Some(_) => Err(NV_ERR_INVALID_CLASS),
                    None => Err(NV_ERR_INVALID_PARAM_STRUCT),
                }
            }
            c if c == FERMI_VASPACE_A.id => {
                let gpu = self.under(parent, NV01_DEVICE_0.id)?;
                params
                    .and_then(|p| p.downcast_mut::<NvVaspaceAllocationParameters>())
                    .ok_or(NV_ERR_INVALID_PARAM_STRUCT)?;
                Ok(gpu)
            }
            c if c == NV01_MEMORY_LOCAL_USER.id
                || c == NV01_MEMORY_SYSTEM.id
                || c == NV50_MEMORY_VIRTUAL.id =>
            {
                let gpu = self.under(parent, NV01_DEVICE_0.id)?;
                let p = params
                    .and_then(|p| p.downcast_mut::<NvMemoryAllocationParams>())
                    .ok_or(NV_ERR_INVALID_PARAM_STRUCT)?;
                let virtual_ = p.flags & alloc_flags::VIRTUAL != 0;
                if p.owner != client || p.size == 0 || virtual_ != (c == NV50_MEMORY_VIRTUAL.id) {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                if p.alignment != 0 && p.size % p.alignment != 0 {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                if virtual_ && !self.is_live(p.h_va_space, FERMI_VASPACE_A.id) {
                    return Err(NV_ERR_INVALID_OBJECT_HANDLE);
                }
                let heap = gpu.map_or(0, |g| u64::from(self.gpus[g].heap_kib) * 1024);
                if c == NV01_MEMORY_LOCAL_USER.id && p.size > heap {
                    return Err(NV_ERR_NO_MEMORY);
                }
                Ok(gpu)
            }
            c if c == KEPLER_CHANNEL_GROUP_A.id => {
                let gpu = self.under(parent, NV01_DEVICE_0.id)?;
                let p = params
                    .and_then(|p| p.downcast_mut::<NvChannelGroupAllocationParameters>())
                    .ok_or(NV_ERR_INVALID_PARAM_STRUCT)?;
                // As the driver: a device without an address space of its own needs the
                // group to name one.
                if !self.is_live(p.h_va_space, FERMI_VASPACE_A.id) {
                    return Err(NV_ERR_INVALID_OBJECT_HANDLE);
                }
                if p.engine_type != NV2080_ENGINE_TYPE_GRAPHICS {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                Ok(gpu)
            }
            c if c == HOPPER_CHANNEL_GPFIFO_A.id => {
                let gpu = self.under(parent, KEPLER_CHANNEL_GROUP_A.id)?;
                let p = params
                    .and_then(|p| p.downcast_mut::<NvChannelAllocParams>())
                    .ok_or(NV_ERR_INVALID_PARAM_STRUCT)?;
                // As the driver: a channel of a group names no address space.
                if p.h_va_space != 0 || p.gp_fifo_entries == 0 || p.gp_fifo_offset == 0 {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                let userd = p.h_userd_memory[0];
                if !self.is_live(userd, NV01_MEMORY_LOCAL_USER.id)
                    && !self.is_live(userd, NV01_MEMORY_SYSTEM.id)
                {
                    return Err(NV_ERR_INVALID_OBJECT_HANDLE);
                }
                if p.userd_offset[0] + 0x200 > self.memory_size(userd) {
                    return Err(NV_ERR_INVALID_ARGUMENT);
                }
                Ok(gpu)
            }
            c if c == HOPPER_COMPUTE_A.id || c == HOPPER_DMA_COPY_A.id => {
                let gpu = self.under(parent, HOPPER_CHANNEL_GPFIFO_A.id)?;
                match params {
                    None => Ok(gpu),
                    Some(_) => Err(NV_ERR_INVALID_PARAM_STRUCT),
                }
            }
            c if c == HOPPER_USERMODE_A.id => {
                let gpu = self.under(parent, NV20_SUBDEVICE_0.id)?;
                match params {
                    None => Ok(gpu),
                    Some(_) => Err(NV_ERR_INVALID_PARAM_STRUCT),
                }
            }
            _ => Err(NV_ERR_INVALID_CLASS),
        }
    }

    /// The GPU of `parent`, which must be a live object of class `class`.
    fn under(&self, parent: Handle, class: u32) -> Result<Option<usize>, NvStatus> {
        match self.object(parent) {
            Some(o) if o.class == class => Ok(o.gpu),
            _ => Err(NV_ERR_INVALID_OBJECT_PARENT),
        }
    }

    /// Answers control `cmd` on `object`.
    fn answer(&self, object: Handle, cmd: u32, params: &mut dyn Any) -> Result<(), CallError> {
        let wrong_struct = CallError::Status(NV_ERR_INVALID_PARAM_STRUCT);
        match cmd {
            GpuGetIdInfoV2Params::CMD => {
                match self.object(object) {
                    Some(o) if o.class == NV01_ROOT_CLIENT.id => {}
                    _ => return Err(CallError::Status(NV_ERR_INVALID_OBJECT_HANDLE)),
                }
                let p = params
                    .downcast_mut::<GpuGetIdInfoV2Params>()
                    .ok_or(wrong_struct)?;
                let instance = self
                    .gpus
                    .iter()
                    .position(|g| g.gpu_id == p.gpu_id)
                    .ok_or(CallError::Status(NV_ERR_INVALID_ARGUMENT))?;
                p.device_instance = instance as u32;
                p.sub_device_instance = 0;
            }
            GpuGetNameStringParams::CMD => {
                let gpu = self.subdevice_gpu(object)?;
                let p = params
                    .downcast_mut::<GpuGetNameStringParams>()
                    .ok_or(wrong_struct)?;
                p.gpu_name_string[..gpu.name.len()].copy_from_slice(gpu.name.as_bytes());
            }
            GrGetSmToGpcTpcMappingsParams::CMD => {
                let gpu = self.subdevice_gpu(object)?;
                let p = params
                    .downcast_mut::<GrGetSmToGpcTpcMappingsParams>()
                    .ok_or(wrong_struct)?;
                p.sm_count = gpu.sms;
            }
            FbGetInfoV2Params::CMD => {
                let gpu = self.subdevice_gpu(object)?;
                let p = params
                    .downcast_mut::<FbGetInfoV2Params>()
                    .ok_or(wrong_struct)?;
                let n = p.fb_info_list_size as usize;
                for entry in &mut p.fb_info_list[..n] {
                    entry.data = match entry.index {
                        FB_INFO_INDEX_TOTAL_RAM_SIZE => gpu.total_kib,
                        FB_INFO_INDEX_USABLE_RAM_SIZE => gpu.usable_kib,
                        FB_INFO_INDEX_HEAP_SIZE => gpu.heap_kib,
                        _ => 0,
                    };
                }
            }
            GrGetInfoV2Params::CMD => {
                self.subdevice_gpu(object)?;
                let p = params
                    .downcast_mut::<GrGetInfoV2Params>()
                    .ok_or(wrong_struct)?;
                let n = p.gr_info_list_size as usize;
                // GH100's design: 8 GPCs of 9 TPCs of 2 SMs, 64 warps per SM.
                for entry in &mut p.gr_info_list[..n] {
                    entry.data = match entry.index {
                        GR_INFO_INDEX_MAX_WARPS_PER_SM => 64,
                        GR_INFO_INDEX_LITTER_NUM_GPCS => 8,
                        GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC => 9,
                        GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC => 2,
                        _ => 0,
                    };
                }
            }
            McGetArchInfoParams::CMD => {
                let gpu = self.subdevice_gpu(object)?;
                let p = params
                    .downcast_mut::<McGetArchInfoParams>()
                    .ok_or(wrong_struct)?;
                p.architecture = gpu.architecture;
                p.implementation = gpu.implementation;
                p.revision = 0xa1;
            }
            GpfifoGetWorkSubmitTokenParams::CMD => {
                if !self.is_live(object, HOPPER_CHANNEL_GPFIFO_A.id) {
                    return Err(CallError::Status(NV_ERR_INVALID_OBJECT_HANDLE));
                }
                let p = params
                    .downcast_mut::<GpfifoGetWorkSubmitTokenParams>()
                    .ok_or(wrong_struct)?;
                p.work_submit_token = work_submit_token(object);
            }
            GpfifoScheduleParams::CMD => {
                if !self.is_live(object, KEPLER_CHANNEL_GROUP_A.id) {
                    return Err(CallError::Status(NV_ERR_INVALID_OBJECT_HANDLE));
                }
                let p = params
                    .downcast_mut::<GpfifoScheduleParams>()
                    .ok_or(wrong_struct)?;
                if p.b_enable != 1 || p.b_skip_submit != 0 || p.b_skip_enable != 0 {
                    return Err(CallError::Status(NV_ERR_INVALID_ARGUMENT));
                }
            }
            _ => return Err(CallError::Status(NV_ERR_NOT_SUPPORTED)),
        }
        Ok(())
    }
}

impl ResourceManager for FakeRm {
    type GpuNode = FakeNode;

    fn check_version(&self, version: &str) -> Result<VersionReply, CallError> {
        let mut s = self.state.borrow_mut();
        s.calls.push(Call::CheckVersion(version.to_string()));
        Ok(if self.version_unrecognized {
            VersionReply::Unrecognized
        } else if version == self.driver {
            VersionReply::Match
        } else {
            VersionReply::Mismatch {
                driver: self.driver.clone(),
            }
        })
    }

    fn card_info(&self) -> Result<Vec<CardInfo>, CallError> {
        self.state.borrow_mut().calls.push(Call::CardInfo);
        if let Some(errno) = self.card_info_errno {
            return Err(CallError::Os(errno));
        }
        Ok(self
            .gpus
            .iter()
            .map(|g| CardInfo {
                valid: 1,
                pci_info: PciInfo {
                    domain: 0,
                    bus: g.bus,
                    slot: 0,
                    function: 0,
                    vendor_id: 0x10de,
                    device_id: 0x2335,
                },
                gpu_id: g.gpu_id,
                minor_number: g.minor,
                ..CardInfo::default()
            })
            .collect())
    }

    fn open_gpu(&self, minor: u32) -> Result<FakeNode, NativeError> {
        let mut s = self.state.borrow_mut();
        s.calls.push(Call::OpenGpu(minor));
        if self.missing_nodes.contains(&minor) {
            return Err(NativeError::NodeMissing {
                node: format!("/dev/nvidia{minor}"),
            });
        }
        s.open_nodes.push(minor);
        Ok(FakeNode {
            state: self.state.clone(),
            minor,
        })
    }

    fn alloc(
        &self,
        client: Handle,
        parent: Handle,
        class: u32,
        params: Option<&mut dyn Params>,
    ) -> Result<Handle, CallError> {
        self.attempt()?;
        if let Some((failing, status)) = self.fail_alloc {
            if failing == class {
                return Err(CallError::Status(status));
            }
        }
        let bytes = params.as_ref().map(|p| {
            let size = size_of_val(&**p);
            // SAFETY: a `Params` struct is plain integers: `size` readable bytes.
            unsafe { std::slice::from_raw_parts((&**p as *const dyn Params).cast::<u8>(), size) }
                .to_vec()
        });
        let gpu = self
            .admit(client, parent, class, params)
            .map_err(CallError::Status)?;
        let mut s = self.state.borrow_mut();
        let handle = s.next_handle;
        s.next_handle += 1;
        if let Some(bytes) = bytes {
            s.params.push((handle, bytes));
        }
        s.objects.push(Object {
            handle,
            parent,
            class,
            gpu,
        });
        s.calls.push(Call::Alloc {
            class,
            parent,
            handle,
        });
        Ok(handle)
    }

    fn free(&self, _client: Handle, parent: Handle, object: Handle) -> Result<(), CallError> {
        let known = self.object(object);
        let mut s = self.state.borrow_mut();
        match known {
            Some(o) if o.parent == parent => {
                // As the driver: an object goes with everything under it.
                let mut doomed = vec![object];
                while let Some(h) = doomed.pop() {
                    let children = s.objects.iter().filter(|o| o.parent == h);
                    doomed.extend(children.map(|o| o.handle).collect::<Vec<_>>());
                    s.objects.retain(|o| o.handle != h);
                }
                s.calls.push(Call::Free {
                    parent,
                    handle: object,
                });
                Ok(())
            }
            _ => Err(CallError::Status(NV_ERR_INVALID_OBJECT_HANDLE)),
        }
    }

    fn control(
        &self,
        _client: Handle,
        object: Handle,
        cmd: u32,
        params: &mut dyn Params,
    ) -> Result<(), CallError> {
        self.state
            .borrow_mut()
            .calls
            .push(Call::Control { object, cmd });
        self.attempt()?;
        if let Some((failing, status)) = self.fail_control {
            if failing == cmd {
                return Err(CallError::Status(status));
            }
        }
        self.answer(object, cmd, params)
    }

    fn map_memory(
        &self,
        _client: Handle,
        device: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
        node: MapNode,
    ) -> Result<CpuMapping, NativeError> {
        let call = |e| NativeError::call("NV_ESC_RM_MAP_MEMORY", e);
        self.attempt().map_err(call)?;
        let object = self
            .object(memory)
            .ok_or(call(CallError::Status(NV_ERR_INVALID_OBJECT_HANDLE)))?;
        // As the driver: the memory is named with the device (or subdevice) it is under,
        // and the mapping goes through the node of its aperture.
        if object.parent != device {
            return Err(call(CallError::Status(NV_ERR_INVALID_OBJECT_PARENT)));
        }
        let minor = object.gpu.map(|g| self.gpus[g].minor);
        let (bytes, expected_node) = match object.class {
            c if c == NV01_MEMORY_SYSTEM.id => (self.memory_size(memory), MapNode::Control),
            c if c == NV01_MEMORY_LOCAL_USER.id => {
                (self.memory_size(memory), MapNode::Gpu(minor.unwrap()))
            }
            c if c == HOPPER_USERMODE_A.id => (USERMODE_BYTES, MapNode::Gpu(minor.unwrap())),
            _ => return Err(call(CallError::Status(NV_ERR_INVALID_CLASS))),
        };
        if length == 0 || length > bytes || node != expected_node {
            return Err(call(CallError::Status(NV_ERR_INVALID_ARGUMENT)));
        }
        let address = self.backing(memory, bytes);
        let mut s = self.state.borrow_mut();
        s.cpu_mappings += 1;
        s.calls.push(Call::MapMemory {
            device,
            memory,
            length,
            flags,
            node,
        });
        Ok(CpuMapping {
            address,
            length: length as usize,
            linear_address: 0x7f00_0000_0000 | u64::from(memory) << 24,
            keep: Box::new(()),
        })
    }

    fn unmap_memory(
        &self,
        _client: Handle,
        device: Handle,
        memory: Handle,
        mapping: CpuMapping,
    ) -> Result<(), CallError> {
        let mut s = self.state.borrow_mut();
        assert_eq!(
            mapping.linear_address,
            0x7f00_0000_0000 | u64::from(memory) << 24
        );
        s.cpu_mappings -= 1;
        s.calls.push(Call::UnmapMemory { device, memory });
        Ok(())
    }

    fn map_memory_dma(
        &self,
        _client: Handle,
        device: Handle,
        dma: Handle,
        memory: Handle,
        length: u64,
        flags: u32,
    ) -> Result<u64, CallError> {
        self.attempt()?;
        if !self.is_live(dma, NV50_MEMORY_VIRTUAL.id) {
            return Err(CallError::Status(NV_ERR_INVALID_OBJECT_HANDLE));
        }
        if !self.is_live(memory, NV01_MEMORY_LOCAL_USER.id)
            && !self.is_live(memory, NV01_MEMORY_SYSTEM.id)
        {
            return Err(CallError::Status(NV_ERR_INVALID_OBJECT_HANDLE));
        }
        if length > self.memory_size(dma) || length > self.memory_size(memory) {
            return Err(CallError::Status(NV_ERR_INVALID_ARGUMENT));
        }
        let mut s = self.state.borrow_mut();
        let address = 0x20_0000_0000 + s.next_gpu_address;
        s.next_gpu_address += length.next_multiple_of(2 << 20);
        s.dma_mappings.push((memory, address));
        s.calls.push(Call::MapDma {
            device,
            dma,
            memory,
            length,
            flags,
            address,
        });
        Ok(address)
    }

    fn unmap_memory_dma(
        &self,
        _client: Handle,
        _device: Handle,
        dma: Handle,
        memory: Handle,
        address: u64,
    ) -> Result<(), CallError> {
        let mut s = self.state.borrow_mut();
        let at = s
            .dma_mappings
            .iter()
            .position(|&m| m == (memory, address))
            .ok_or(CallError::Status(NV_ERR_INVALID_ARGUMENT))?;
        s.dma_mappings.remove(at);
        s.calls.push(Call::UnmapDma {
            dma,
            memory,
            address,
        });
        Ok(())
    }
}

/// Checks that every object and mapping in `calls` was undone, the most recent first:
/// frees and unmaps pop what allocs and maps pushed, in stack order, and nothing is left.
/// A GPU node is closed only once nothing made after it was opened is left.
pub fn assert_undone_in_reverse(calls: &[Call]) {
    #[derive(Debug, PartialEq)]
    enum Made {
        Object(Handle),
        Cpu(Handle),
        Dma(Handle, u64),
        Node(u32),
    }
    let mut stack = vec![];
    for call in calls {
        let (push, pop) = match *call {
            Call::Alloc { handle, .. } => (Some(Made::Object(handle)), None),
            Call::Free { handle, .. } => (None, Some(Made::Object(handle))),
            Call::MapMemory { memory, .. } => (Some(Made::Cpu(memory)), None),
            Call::UnmapMemory { memory, .. } => (None, Some(Made::Cpu(memory))),
            Call::MapDma {
                memory, address, ..
            } => (Some(Made::Dma(memory, address)), None),
            Call::UnmapDma {
                memory, address, ..
            } => (None, Some(Made::Dma(memory, address))),
            Call::OpenGpu(minor) => (Some(Made::Node(minor)), None),
            Call::CloseGpu(minor) => (None, Some(Made::Node(minor))),
            _ => (None, None),
        };
        if let Some(made) = push {
            stack.push(made);
        }
        if let Some(undone) = pop {
            // The driver frees a client with everything under it; quench frees each
            // object itself, so the client (and with it the node's objects) comes last.
            let top = stack.pop();
            assert_eq!(
                top.as_ref(),
                Some(&undone),
                "undone out of order in {calls:#?}"
            );
        }
    }
    assert!(stack.is_empty(), "left behind: {stack:?}");
}
