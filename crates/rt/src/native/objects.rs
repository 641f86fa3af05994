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

/// `FERMI_VASPACE_A` (src/common/sdk/nvidia/inc/class/cl90f1.h): a GPU virtual address
/// space, allocated under a device with [`NvVaspaceAllocationParameters`]. The device
/// quench creates has none of its own ([`NV_DEVICE_ALLOCATION_VAMODE_MULTIPLE_VASPACES`]),
/// so memory and channels name this one.
pub const FERMI_VASPACE_A: Class = Class {
    id: 0x90f1,
    name: "FERMI_VASPACE_A",
};

/// `NV01_MEMORY_LOCAL_USER` (src/common/sdk/nvidia/inc/class/cl0040.h): memory on the
/// GPU, allocated under a device with [`NvMemoryAllocationParams`].
pub const NV01_MEMORY_LOCAL_USER: Class = Class {
    id: 0x40,
    name: "NV01_MEMORY_LOCAL_USER",
};

/// `NV01_MEMORY_SYSTEM` (src/common/sdk/nvidia/inc/class/cl003e.h): host memory the GPU
/// reaches over PCIe, allocated under a device with [`NvMemoryAllocationParams`].
pub const NV01_MEMORY_SYSTEM: Class = Class {
    id: 0x3e,
    name: "NV01_MEMORY_SYSTEM",
};

/// `NV50_MEMORY_VIRTUAL` (src/common/sdk/nvidia/inc/class/cl50a0.h): a range of a GPU
/// virtual address space, allocated under a device with [`NvMemoryAllocationParams`]
/// (`NVOS32_ALLOC_FLAGS_VIRTUAL`, `h_va_space`); memory is mapped into it with
/// `NV_ESC_RM_MAP_MEMORY_DMA`.
pub const NV50_MEMORY_VIRTUAL: Class = Class {
    id: 0x50a0,
    name: "NV50_MEMORY_VIRTUAL",
};

/// `KEPLER_CHANNEL_GROUP_A` (src/common/sdk/nvidia/inc/class/cla06c.h): a channel group
/// (TSG), allocated under a device with [`NvChannelGroupAllocationParameters`]; the
/// hardware schedules groups.
pub const KEPLER_CHANNEL_GROUP_A: Class = Class {
    id: 0xa06c,
    name: "KEPLER_CHANNEL_GROUP_A",
};

/// `HOPPER_CHANNEL_GPFIFO_A` (src/common/sdk/nvidia/inc/class/clc86f.h): a channel,
/// allocated under a channel group with [`NvChannelAllocParams`].
pub const HOPPER_CHANNEL_GPFIFO_A: Class = Class {
    id: 0xc86f,
    name: "HOPPER_CHANNEL_GPFIFO_A",
};

/// `HOPPER_COMPUTE_A` (src/common/sdk/nvidia/inc/class/clcbc0.h): the compute engine's
/// class, allocated on a channel without parameters.
pub const HOPPER_COMPUTE_A: Class = Class {
    id: 0xcbc0,
    name: "HOPPER_COMPUTE_A",
};

/// `HOPPER_DMA_COPY_A` (src/common/sdk/nvidia/inc/class/clc8b5.h): the copy engine's
/// class, allocated on a channel without parameters.
pub const HOPPER_DMA_COPY_A: Class = Class {
    id: 0xc8b5,
    name: "HOPPER_DMA_COPY_A",
};

/// `HOPPER_USERMODE_A` (src/common/sdk/nvidia/inc/class/clc661.h): the GPU's usermode
/// registers, among them the doorbell, allocated under a subdevice without parameters
/// and mapped for the CPU.
pub const HOPPER_USERMODE_A: Class = Class {
    id: 0xc661,
    name: "HOPPER_USERMODE_A",
};

/// `NV_VASPACE_ALLOCATION_PARAMETERS` (src/common/sdk/nvidia/inc/nvos.h). All zero asks
/// for a new address space (`NV_VASPACE_ALLOCATION_INDEX_GPU_NEW`) of the default size,
/// base and big page size, whose page tables the resource manager keeps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvVaspaceAllocationParameters {
    pub index: u32,
    pub flags: u32,
    pub va_size: u64,
    pub va_start_internal: u64,
    pub va_limit_internal: u64,
    pub big_page_size: u32,
    pub va_base: u64,
    pub pasid: u32,
}
assert_layout!(NvVaspaceAllocationParameters, size 56, index @ 0, flags @ 4,
    va_size @ 8, va_start_internal @ 16, va_limit_internal @ 24, big_page_size @ 32,
    va_base @ 40, pasid @ 48);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for NvVaspaceAllocationParameters {}

/// `NVOS32_TYPE_IMAGE` (nvos.h): the ordinary surface type.
pub const NVOS32_TYPE_IMAGE: u32 = 0;

/// Page table entry kinds (`NV_MMU_PTE_KIND_*`, hopper/gh100/dev_mmu.h), the `format` of
/// a memory allocation.
pub const NV_MMU_PTE_KIND_PITCH: u32 = 0x00;
pub const NV_MMU_PTE_KIND_GENERIC_MEMORY: u32 = 0x06;

/// `NVOS32_ALLOC_FLAGS_*` (nvos.h).
pub mod alloc_flags {
    pub const IGNORE_BANK_PLACEMENT: u32 = 0x0000_0001;
    pub const ALIGNMENT_FORCE: u32 = 0x0000_0100;
    pub const MAP_NOT_REQUIRED: u32 = 0x0000_8000;
    pub const VIRTUAL: u32 = 0x0008_0000;
}

/// `NVOS32_ATTR_*` (nvos.h): fields of `attr`, already shifted into place.
pub mod attr {
    /// `PAGE_SIZE` (24:23) `_4KB`.
    pub const PAGE_SIZE_4KB: u32 = 1 << 23;
    /// `PAGE_SIZE` (24:23) `_BIG`: 64 KiB pages.
    pub const PAGE_SIZE_BIG: u32 = 2 << 23;
    /// `PAGE_SIZE` (24:23) `_HUGE`: the size `attr2`'s `PAGE_SIZE_HUGE` names.
    pub const PAGE_SIZE_HUGE: u32 = 3 << 23;
    /// `LOCATION` (26:25) `_VIDMEM`.
    pub const LOCATION_VIDMEM: u32 = 0 << 25;
    /// `LOCATION` (26:25) `_PCI`: host memory.
    pub const LOCATION_PCI: u32 = 1 << 25;
    /// `PHYSICALITY` (28:27) `_NONCONTIGUOUS`.
    pub const PHYSICALITY_NONCONTIGUOUS: u32 = 1 << 27;
    /// `PHYSICALITY` (28:27) `_ALLOW_NONCONTIGUOUS`.
    pub const PHYSICALITY_ALLOW_NONCONTIGUOUS: u32 = 3 << 27;
    /// `COHERENCY` (31:29) `_UNCACHED`.
    pub const COHERENCY_UNCACHED: u32 = 0 << 29;
    /// `COHERENCY` (31:29) `_CACHED`: the GPU's accesses snoop the CPU's caches.
    pub const COHERENCY_CACHED: u32 = 1 << 29;
}

/// `NVOS32_ATTR2_*` (nvos.h): fields of `attr2`, already shifted into place.
pub mod attr2 {
    /// `ZBC` (1:0) `_PREFER_NO_ZBC`.
    pub const ZBC_PREFER_NO_ZBC: u32 = 1;
    /// `GPU_CACHEABLE` (3:2) `_YES`.
    pub const GPU_CACHEABLE_YES: u32 = 1 << 2;
    /// `GPU_CACHEABLE` (3:2) `_NO`.
    pub const GPU_CACHEABLE_NO: u32 = 2 << 2;
    /// `PAGE_SIZE_HUGE` (21:20) `_2MB`.
    pub const PAGE_SIZE_HUGE_2MB: u32 = 1 << 20;
}

/// `NV_MEMORY_ALLOCATION_PARAMS` (src/common/sdk/nvidia/inc/nvos.h): how memory (or a
/// virtual range) is allocated through `NV_ESC_RM_ALLOC`; flags and attributes are the
/// `NVOS32_*` values above.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvMemoryAllocationParams {
    pub owner: u32,
    pub type_: u32,
    pub flags: u32,
    pub width: u32,
    pub height: u32,
    pub pitch: i32,
    pub attr: u32,
    pub attr2: u32,
    pub format: u32,
    pub compr_covg: u32,
    pub zcull_covg: u32,
    pub range_lo: u64,
    pub range_hi: u64,
    pub size: u64,
    pub alignment: u64,
    pub offset: u64,
    pub limit: u64,
    pub address: u64,
    pub ctag_offset: u32,
    pub h_va_space: u32,
    pub internalflags: u32,
    pub tag: u32,
    pub numa_node: i32,
}
assert_layout!(NvMemoryAllocationParams, size 128, owner @ 0, type_ @ 4, flags @ 8,
    width @ 12, height @ 16, pitch @ 20, attr @ 24, attr2 @ 28, format @ 32,
    compr_covg @ 36, zcull_covg @ 40, range_lo @ 48, range_hi @ 56, size @ 64,
    alignment @ 72, offset @ 80, limit @ 88, address @ 96, ctag_offset @ 104,
    h_va_space @ 108, internalflags @ 112, tag @ 116, numa_node @ 120);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for NvMemoryAllocationParams {}

/// `NV2080_ENGINE_TYPE_GRAPHICS` (src/common/sdk/nvidia/inc/class/cl2080_notification.h):
/// the graphics engine, on which compute runs.
pub const NV2080_ENGINE_TYPE_GRAPHICS: u32 = 1;

/// `NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS` (src/common/sdk/nvidia/inc/nvos.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvChannelGroupAllocationParameters {
    pub h_object_error: u32,
    pub h_object_ecc_error: u32,
    /// The group's address space; its channels run in it.
    pub h_va_space: u32,
    pub engine_type: u32,
    pub b_is_calling_context_vgpu_plugin: u8,
}
assert_layout!(NvChannelGroupAllocationParameters, size 20, h_object_error @ 0,
    h_object_ecc_error @ 4, h_va_space @ 8, engine_type @ 12,
    b_is_calling_context_vgpu_plugin @ 16);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for NvChannelGroupAllocationParameters {}

/// `NV_MAX_SUBDEVICES` (src/common/sdk/nvidia/inc/nvlimits.h).
pub const NV_MAX_SUBDEVICES: usize = 8;

/// `NV_MEMORY_DESC_PARAMS` (src/common/sdk/nvidia/inc/alloc/alloc_channel.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvMemoryDescParams {
    pub base: u64,
    pub size: u64,
    pub address_space: u32,
    pub cache_attrib: u32,
}
assert_layout!(NvMemoryDescParams, size 24, base @ 0, size @ 8, address_space @ 16,
    cache_attrib @ 20);

/// `NV_CHANNEL_ALLOC_PARAMS` (src/common/sdk/nvidia/inc/alloc/alloc_channel.h): a GPFIFO
/// channel. quench fills the ring (`gp_fifo_offset`: its GPU address; `gp_fifo_entries`)
/// and the USERD page (`h_userd_memory[0]` and `userd_offset[0]`: a memory object and the
/// offset in it); the rest stays zero, the context share included (a channel of a group
/// without one runs in the group's address space).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvChannelAllocParams {
    pub h_object_error: u32,
    pub h_object_buffer: u32,
    pub gp_fifo_offset: u64,
    pub gp_fifo_entries: u32,
    pub flags: u32,
    pub h_context_share: u32,
    pub h_va_space: u32,
    pub h_userd_memory: [u32; NV_MAX_SUBDEVICES],
    pub userd_offset: [u64; NV_MAX_SUBDEVICES],
    pub engine_type: u32,
    pub cid: u32,
    pub sub_device_id: u32,
    pub h_object_ecc_error: u32,
    pub instance_mem: NvMemoryDescParams,
    pub userd_mem: NvMemoryDescParams,
    pub ramfc_mem: NvMemoryDescParams,
    pub mthdbuf_mem: NvMemoryDescParams,
    pub h_phys_channel_group: u32,
    pub internal_flags: u32,
    pub error_notifier_mem: NvMemoryDescParams,
    pub ecc_error_notifier_mem: NvMemoryDescParams,
    pub process_id: u32,
    pub sub_process_id: u32,
    pub encrypt_iv: [u32; 3],
    pub decrypt_iv: [u32; 3],
    pub hmac_nonce: [u32; 8],
    pub tpc_config_id: u32,
}
assert_layout!(NvChannelAllocParams, size 368, h_object_error @ 0, h_object_buffer @ 4,
    gp_fifo_offset @ 8, gp_fifo_entries @ 16, flags @ 20, h_context_share @ 24,
    h_va_space @ 28, h_userd_memory @ 32, userd_offset @ 64, engine_type @ 128, cid @ 132,
    sub_device_id @ 136, h_object_ecc_error @ 140, instance_mem @ 144, userd_mem @ 168,
    ramfc_mem @ 192, mthdbuf_mem @ 216, h_phys_channel_group @ 240, internal_flags @ 244,
    error_notifier_mem @ 248, ecc_error_notifier_mem @ 272, process_id @ 296,
    sub_process_id @ 300, encrypt_iv @ 304, decrypt_iv @ 316, hmac_nonce @ 328,
    tpc_config_id @ 360);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for NvChannelAllocParams {}
