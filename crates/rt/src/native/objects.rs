//! The resource-manager classes quench allocates and their allocation parameters.
//!
//! Objects form a tree: a root client owns devices (one per GPU), a device owns
//! subdevices; control calls go to an object of the right class.

use super::ioctl::Params;

/// A resource-manager class: what `NV_ESC_RM_ALLOC` creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Class {
    pub id: u32,
    /// The header's name, for messages.
    pub name: &'static str,
}

/// `NV01_ROOT_CLIENT` (src/common/sdk/nvidia/inc/nvos.h): a client of the resource
/// manager, the root of every object tree. Allocated without parameters.
pub const NV01_ROOT_CLIENT: Class = Class {
    id: 0x41,
    name: "NV01_ROOT_CLIENT",
};

/// `NV01_DEVICE_0` (src/common/sdk/nvidia/inc/class/cl0080.h): one GPU (a broadcast
/// device), allocated under a client with [`Nv0080AllocParameters`].
pub const NV01_DEVICE_0: Class = Class {
    id: 0x80,
    name: "NV01_DEVICE_0",
};

/// `NV20_SUBDEVICE_0` (src/common/sdk/nvidia/inc/class/cl2080.h): the GPU itself
/// (unicast), allocated under a device with [`Nv2080AllocParameters`]. Most queries are
/// its controls.
pub const NV20_SUBDEVICE_0: Class = Class {
    id: 0x2080,
    name: "NV20_SUBDEVICE_0",
};

/// `NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES` (nvos.h): the device makes no
/// address space of its own; quench will create the ones it needs explicitly.
pub const NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES: u32 = 2;

/// `NV0080_ALLOC_PARAMETERS` (src/common/sdk/nvidia/inc/class/cl0080.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nv0080AllocParameters {
    /// The device instance, from `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2`.
    pub device_id: u32,
    pub h_client_share: u32,
    pub h_target_client: u32,
    pub h_target_device: u32,
    pub flags: u32,
    pub va_space_size: u64,
    pub va_start_internal: u64,
    pub va_limit_internal: u64,
    pub va_mode: u32,
}
assert_layout!(Nv0080AllocParameters, size 56, device_id @ 0, h_client_share @ 4,
    h_target_client @ 8, h_target_device @ 12, flags @ 16, va_space_size @ 24,
    va_start_internal @ 32, va_limit_internal @ 40, va_mode @ 48);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nv0080AllocParameters {}

impl Nv0080AllocParameters {
    /// Device instance `device_id`, owned by `client` alone, without an address space.
    pub fn new(device_id: u32, client: u32) -> Self {
        Nv0080AllocParameters {
            device_id,
            h_client_share: client,
            va_mode: NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES,
            ..Self::default()
        }
    }
}

/// `NV2080_ALLOC_PARAMETERS` (src/common/sdk/nvidia/inc/class/cl2080.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nv2080AllocParameters {
    /// The subdevice's index within its device: 0, since a device holds one GPU.
    pub sub_device_id: u32,
}
assert_layout!(Nv2080AllocParameters, size 4, sub_device_id @ 0);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nv2080AllocParameters {}
