//! A resource manager in memory for the tests: it keeps an object tree with the rules
//! the real one enforces on the calls quench makes, answers the controls from a list of
//! GPUs, fails where a test asks it to, and records every call.

use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;

use super::controls::{
    Control, FbGetInfoV2Params, GpuGetIdInfoV2Params, GpuGetNameStringParams,
    GrGetSmToGpcTpcMappingsParams, McGetArchInfoParams, FB_INFO_INDEX_HEAP_SIZE,
    FB_INFO_INDEX_TOTAL_RAM_SIZE, FB_INFO_INDEX_USABLE_RAM_SIZE,
};
use super::error::NativeError;
use super::ioctl::{CardInfo, Params, PciInfo};
use super::objects::{
    Nv0080AllocParameters, Nv2080AllocParameters, NV01_DEVICE_0, NV01_ROOT_CLIENT, NV20_SUBDEVICE_0,
};
use super::rm::{CallError, Handle, ResourceManager, VersionReply};
use super::status::NvStatus;

const NV_ERR_INSUFFICIENT_PERMISSIONS: NvStatus = NvStatus(0x1b);
const NV_ERR_INVALID_ARGUMENT: NvStatus = NvStatus(0x1f);
const NV_ERR_INVALID_CLASS: NvStatus = NvStatus(0x22);
const NV_ERR_INVALID_OBJECT_HANDLE: NvStatus = NvStatus(0x33);
const NV_ERR_INVALID_OBJECT_PARENT: NvStatus = NvStatus(0x36);
const NV_ERR_INVALID_PARAM_STRUCT: NvStatus = NvStatus(0x3a);
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
}

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
            state: Rc::new(RefCell::new(State {
                next_handle: 1,
                ..State::default()
            })),
            version_unrecognized: false,
            card_info_errno: None,
            fail_control: None,
            fail_alloc: None,
            missing_nodes: vec![],
        }
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
            _ => Err(NV_ERR_INVALID_CLASS),
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
            McGetArchInfoParams::CMD => {
                let gpu = self.subdevice_gpu(object)?;
                let p = params
                    .downcast_mut::<McGetArchInfoParams>()
                    .ok_or(wrong_struct)?;
                p.architecture = gpu.architecture;
                p.implementation = gpu.implementation;
                p.revision = 0xa1;
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
        if let Some((failing, status)) = self.fail_alloc {
            if failing == class {
                return Err(CallError::Status(status));
            }
        }
        let gpu = self
            .admit(client, parent, class, params)
            .map_err(CallError::Status)?;
        let mut s = self.state.borrow_mut();
        let handle = s.next_handle;
        s.next_handle += 1;
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
        if let Some((failing, status)) = self.fail_control {
            if failing == cmd {
                return Err(CallError::Status(status));
            }
        }
        self.answer(object, cmd, params)
    }
}
