//! The nvidia driver's ioctl interface: how a request number is built, the escape
//! numbers, and the parameter structs of the escapes quench uses.
//!
//! Every call is `ioctl(fd, _IOWR('F', nr, sizeof(params)), &params)`. The driver's own
//! escapes (card info, version check) are numbered from `NV_IOCTL_BASE` = 200
//! (kernel-open/common/inc/nv-ioctl-numbers.h); the resource manager's (alloc, free,
//! control) keep their own small numbers (src/nvidia/arch/nvalloc/unix/include/
//! nv_escape.h). The driver takes the size of the parameters from the request number
//! and rejects a size that differs from its own struct, so every struct's layout is
//! checked at compile time against the header.

use std::any::Any;

/// `NV_IOCTL_MAGIC` (nv-ioctl-numbers.h).
pub const NV_IOCTL_MAGIC: u8 = b'F';
/// `NV_IOCTL_BASE` (nv-ioctl-numbers.h): the driver's own escapes count from here.
pub const NV_IOCTL_BASE: u8 = 200;
/// `NV_ESC_CARD_INFO` (nv-ioctl-numbers.h): the GPUs the driver has probed.
pub const NV_ESC_CARD_INFO: u8 = NV_IOCTL_BASE;
/// `NV_ESC_CHECK_VERSION_STR` (nv-ioctl-numbers.h): the version handshake.
pub const NV_ESC_CHECK_VERSION_STR: u8 = NV_IOCTL_BASE + 10;
/// `NV_ESC_RM_FREE` (nv_escape.h): takes [`Nvos00Parameters`].
pub const NV_ESC_RM_FREE: u8 = 0x29;
/// `NV_ESC_RM_CONTROL` (nv_escape.h): takes [`Nvos54Parameters`].
pub const NV_ESC_RM_CONTROL: u8 = 0x2A;
/// `NV_ESC_RM_ALLOC` (nv_escape.h): takes [`Nvos21Parameters`].
pub const NV_ESC_RM_ALLOC: u8 = 0x2B;
/// `NV_ESC_RM_MAP_MEMORY` (nv_escape.h): takes [`Nvos33ParametersWithFd`].
pub const NV_ESC_RM_MAP_MEMORY: u8 = 0x4E;
/// `NV_ESC_RM_UNMAP_MEMORY` (nv_escape.h): takes [`Nvos34Parameters`].
pub const NV_ESC_RM_UNMAP_MEMORY: u8 = 0x4F;
/// `NV_ESC_RM_MAP_MEMORY_DMA` (nv_escape.h): takes [`Nvos46Parameters`].
pub const NV_ESC_RM_MAP_MEMORY_DMA: u8 = 0x57;
/// `NV_ESC_RM_UNMAP_MEMORY_DMA` (nv_escape.h): takes [`Nvos47Parameters`].
pub const NV_ESC_RM_UNMAP_MEMORY_DMA: u8 = 0x58;

/// `_IOWR(NV_IOCTL_MAGIC, nr, size)` in Linux's generic encoding, the one x86-64 and
/// Arm64 use: direction in bits 31:30 (read and write: 3), size in 29:16, type in 15:8,
/// number in 7:0. Used in constant context, so a size that does not fit fails the build.
pub const fn iowr(nr: u8, size: usize) -> u32 {
    const READ_WRITE: u32 = 3;
    assert!(size < 1 << 14, "the ioctl size field has 14 bits");
    (READ_WRITE << 30) | ((size as u32) << 16) | ((NV_IOCTL_MAGIC as u32) << 8) | nr as u32
}

/// A parameter struct that the driver reads and writes in place.
///
/// # Safety
/// Implementors are `#[repr(C)]` structs (or arrays of them) made only of integers and
/// arrays of integers, laid out as NVIDIA's headers declare them, so that the driver
/// may write any bytes into them.
pub unsafe trait Params: Any {}

/// `NV_MAX_DEVICES` (src/common/sdk/nvidia/inc/nvlimits.h): the most GPUs the driver
/// reports; `NV_ESC_CARD_INFO` fails when given fewer entries than it has GPUs.
pub const MAX_DEVICES: usize = 32;

/// `nv_pci_info_t` (kernel-open/common/inc/nv-ioctl.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PciInfo {
    pub domain: u32,
    pub bus: u8,
    pub slot: u8,
    pub function: u8,
    pub vendor_id: u16,
    pub device_id: u16,
}
assert_layout!(PciInfo, size 12, domain @ 0, bus @ 4, slot @ 5, function @ 6,
    vendor_id @ 8, device_id @ 10);

/// `nv_ioctl_card_info_t` (kernel-open/common/inc/nv-ioctl.h): one GPU the driver has
/// probed. `NV_ESC_CARD_INFO` fills an array of [`MAX_DEVICES`] of them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CardInfo {
    /// `NvBool`: nonzero for an entry that describes a GPU.
    pub valid: u8,
    pub pci_info: PciInfo,
    /// The driver's id of the GPU, which `NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2` takes.
    pub gpu_id: u32,
    pub interrupt_line: u16,
    pub reg_address: u64,
    pub reg_size: u64,
    pub fb_address: u64,
    pub fb_size: u64,
    /// N of the GPU's device node `/dev/nvidiaN`.
    pub minor_number: u32,
    pub dev_name: [u8; 10],
}
assert_layout!(CardInfo, size 72, valid @ 0, pci_info @ 4, gpu_id @ 16,
    interrupt_line @ 20, reg_address @ 24, reg_size @ 32, fb_address @ 40, fb_size @ 48,
    minor_number @ 56, dev_name @ 60);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for [CardInfo; MAX_DEVICES] {}

impl CardInfo {
    /// The PCI address as `lspci` and nvidia-smi write it: `0000:18:00.0`.
    pub fn pci_bus_id(&self) -> String {
        let p = &self.pci_info;
        format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            p.domain, p.bus, p.slot, p.function
        )
    }
}

/// `NV_RM_API_VERSION_STRING_LENGTH` (nv-ioctl.h).
pub const RM_API_VERSION_STRING_LENGTH: usize = 64;
/// `NV_RM_API_VERSION_CMD_STRICT` (nv-ioctl.h): the whole version string must match.
pub const RM_API_VERSION_CMD_STRICT: u32 = 0;
/// `NV_RM_API_VERSION_REPLY_RECOGNIZED` (nv-ioctl.h): the driver understood the
/// request (whether or not the versions match).
pub const RM_API_VERSION_REPLY_RECOGNIZED: u32 = 1;

/// `nv_ioctl_rm_api_version_t` (kernel-open/common/inc/nv-ioctl.h). On a mismatch the
/// driver fails the ioctl with EINVAL and writes its own version into `version_string`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmApiVersion {
    pub cmd: u32,
    pub reply: u32,
    pub version_string: [u8; RM_API_VERSION_STRING_LENGTH],
}
assert_layout!(RmApiVersion, size 72, cmd @ 0, reply @ 4, version_string @ 8);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for RmApiVersion {}

impl RmApiVersion {
    /// A strict check of `version`, NUL-terminated (a longer string is cut to fit; the
    /// driver's own is shorter, so a cut string cannot match by accident).
    pub fn strict(version: &str) -> Self {
        let mut version_string = [0u8; RM_API_VERSION_STRING_LENGTH];
        let bytes = version.as_bytes();
        let n = bytes.len().min(RM_API_VERSION_STRING_LENGTH - 1);
        version_string[..n].copy_from_slice(&bytes[..n]);
        RmApiVersion {
            cmd: RM_API_VERSION_CMD_STRICT,
            reply: 0,
            version_string,
        }
    }

    /// The version string up to its NUL.
    pub fn version(&self) -> String {
        c_string(&self.version_string)
    }
}

/// `NVOS00_PARAMETERS` (src/common/sdk/nvidia/inc/nvos.h): `NV_ESC_RM_FREE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos00Parameters {
    pub h_root: u32,
    pub h_object_parent: u32,
    pub h_object_old: u32,
    pub status: u32,
}
assert_layout!(Nvos00Parameters, size 16, h_root @ 0, h_object_parent @ 4,
    h_object_old @ 8, status @ 12);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nvos00Parameters {}

/// `NVOS21_PARAMETERS` (src/common/sdk/nvidia/inc/nvos.h): `NV_ESC_RM_ALLOC`. A zero
/// `h_object_new` asks the resource manager to choose the handle, which it writes back.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos21Parameters {
    pub h_root: u32,
    pub h_object_parent: u32,
    pub h_object_new: u32,
    pub h_class: u32,
    /// `NvP64`: the address of the class's allocation parameters, or 0.
    pub p_alloc_parms: u64,
    pub params_size: u32,
    pub status: u32,
}
assert_layout!(Nvos21Parameters, size 32, h_root @ 0, h_object_parent @ 4,
    h_object_new @ 8, h_class @ 12, p_alloc_parms @ 16, params_size @ 24, status @ 28);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nvos21Parameters {}

/// `NVOS54_PARAMETERS` (src/common/sdk/nvidia/inc/nvos.h): `NV_ESC_RM_CONTROL`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos54Parameters {
    pub h_client: u32,
    pub h_object: u32,
    pub cmd: u32,
    pub flags: u32,
    /// `NvP64`: the address of the command's parameters.
    pub params: u64,
    pub params_size: u32,
    pub status: u32,
}
assert_layout!(Nvos54Parameters, size 32, h_client @ 0, h_object @ 4, cmd @ 8,
    flags @ 12, params @ 16, params_size @ 24, status @ 28);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nvos54Parameters {}

/// `NVOS33_PARAMETERS` (src/common/sdk/nvidia/inc/nvos.h): maps a memory object (or a
/// class with registers, such as the usermode doorbell) for the CPU. The resource manager
/// writes `p_linear_address`, an opaque value that the unmap takes back; the mapping
/// itself is made by `mmap` of the file descriptor passed beside it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos33Parameters {
    pub h_client: u32,
    /// The device (or subdevice) the memory belongs to.
    pub h_device: u32,
    pub h_memory: u32,
    pub offset: u64,
    pub length: u64,
    pub p_linear_address: u64,
    pub status: u32,
    pub flags: u32,
}
assert_layout!(Nvos33Parameters, size 48, h_client @ 0, h_device @ 4, h_memory @ 8,
    offset @ 16, length @ 24, p_linear_address @ 32, status @ 40, flags @ 44);

/// `NVOS46_FLAGS_CACHE_SNOOP_ENABLE` (nvos.h, field `CACHE_SNOOP` 4:4): the GPU's accesses
/// to host memory through the mapping snoop the CPU's caches (the page table entries'
/// coherent system-memory aperture). Without it they do not, and a CPU that writes a
/// push buffer through a cached mapping may leave the GPU reading stale memory.
pub const NVOS46_FLAGS_CACHE_SNOOP_ENABLE: u32 = 1 << 4;

/// `NVOS33_FLAGS_ACCESS_WRITE_ONLY` (nvos.h, field `ACCESS` 1:0).
pub const NVOS33_FLAGS_ACCESS_WRITE_ONLY: u32 = 2;

/// `nv_ioctl_nvos33_parameters_with_fd` (src/nvidia/arch/nvalloc/unix/include/
/// nv-unix-nvos-params-wrappers.h): what `NV_ESC_RM_MAP_MEMORY` takes. `fd` is a fresh
/// descriptor of the node the mapping goes through (`/dev/nvidiactl` for system memory,
/// `/dev/nvidiaN` for the GPU's apertures); the driver attaches the mapping to it, one per
/// descriptor, and `mmap` of that descriptor makes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos33ParametersWithFd {
    pub params: Nvos33Parameters,
    pub fd: i32,
}
assert_layout!(Nvos33ParametersWithFd, size 56, params @ 0, fd @ 48);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nvos33ParametersWithFd {}

/// `NVOS34_PARAMETERS` (nvos.h): `NV_ESC_RM_UNMAP_MEMORY`, with the `p_linear_address`
/// the map returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos34Parameters {
    pub h_client: u32,
    pub h_device: u32,
    pub h_memory: u32,
    pub p_linear_address: u64,
    pub status: u32,
    pub flags: u32,
}
assert_layout!(Nvos34Parameters, size 32, h_client @ 0, h_device @ 4, h_memory @ 8,
    p_linear_address @ 16, status @ 24, flags @ 28);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nvos34Parameters {}

/// `NVOS46_PARAMETERS` (nvos.h): `NV_ESC_RM_MAP_MEMORY_DMA`, maps a memory object into a
/// GPU virtual range (`h_dma`: an `NV50_MEMORY_VIRTUAL` object). With `DMA_OFFSET_FIXED`
/// clear, `dma_offset` goes in relative to the virtual range and comes back as the GPU
/// virtual address of the mapping.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos46Parameters {
    pub h_client: u32,
    pub h_device: u32,
    pub h_dma: u32,
    pub h_memory: u32,
    pub offset: u64,
    pub length: u64,
    pub flags: u32,
    pub flags2: u32,
    pub kind_override: u32,
    pub dma_offset: u64,
    pub status: u32,
}
assert_layout!(Nvos46Parameters, size 64, h_client @ 0, h_device @ 4, h_dma @ 8,
    h_memory @ 12, offset @ 16, length @ 24, flags @ 32, flags2 @ 36, kind_override @ 40,
    dma_offset @ 48, status @ 56);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nvos46Parameters {}

/// `NVOS47_PARAMETERS` (nvos.h): `NV_ESC_RM_UNMAP_MEMORY_DMA`, with the `dma_offset` the
/// map returned (`size` 0: the whole mapping).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Nvos47Parameters {
    pub h_client: u32,
    pub h_device: u32,
    pub h_dma: u32,
    pub h_memory: u32,
    pub flags: u32,
    pub dma_offset: u64,
    pub size: u64,
    pub status: u32,
}
assert_layout!(Nvos47Parameters, size 48, h_client @ 0, h_device @ 4, h_dma @ 8,
    h_memory @ 12, flags @ 16, dma_offset @ 24, size @ 32, status @ 40);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for Nvos47Parameters {}

/// The text of a NUL-terminated byte buffer (all of it when there is no NUL).
pub(crate) fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    #[test]
    fn request_numbers_encode_number_size_and_direction() {
        // The values strace prints as _IOC(_IOC_READ|_IOC_WRITE, 0x46, nr, size).
        assert_eq!(
            iowr(NV_ESC_RM_ALLOC, size_of::<Nvos21Parameters>()),
            0xC020_462B
        );
        assert_eq!(
            iowr(NV_ESC_RM_CONTROL, size_of::<Nvos54Parameters>()),
            0xC020_462A
        );
        assert_eq!(
            iowr(NV_ESC_RM_FREE, size_of::<Nvos00Parameters>()),
            0xC010_4629
        );
        assert_eq!(
            iowr(NV_ESC_CHECK_VERSION_STR, size_of::<RmApiVersion>()),
            0xC048_46D2
        );
        assert_eq!(
            iowr(NV_ESC_CARD_INFO, size_of::<[CardInfo; MAX_DEVICES]>()),
            0xC900_46C8
        );
    }

    #[test]
    fn mapping_request_numbers_carry_their_struct_sizes() {
        assert_eq!(
            iowr(NV_ESC_RM_MAP_MEMORY, size_of::<Nvos33ParametersWithFd>()),
            0xC038_464E
        );
        assert_eq!(
            iowr(NV_ESC_RM_UNMAP_MEMORY, size_of::<Nvos34Parameters>()),
            0xC020_464F
        );
        assert_eq!(
            iowr(NV_ESC_RM_MAP_MEMORY_DMA, size_of::<Nvos46Parameters>()),
            0xC040_4657
        );
        assert_eq!(
            iowr(NV_ESC_RM_UNMAP_MEMORY_DMA, size_of::<Nvos47Parameters>()),
            0xC030_4658
        );
    }

    #[test]
    fn escape_numbers_are_the_headers() {
        assert_eq!(NV_ESC_CARD_INFO, 200);
        assert_eq!(NV_ESC_CHECK_VERSION_STR, 210);
        assert_eq!(
            (NV_ESC_RM_FREE, NV_ESC_RM_CONTROL, NV_ESC_RM_ALLOC),
            (0x29, 0x2A, 0x2B)
        );
    }

    #[test]
    fn version_string_round_trips_and_is_nul_terminated() {
        let v = RmApiVersion::strict("580.159.04");
        assert_eq!(v.cmd, RM_API_VERSION_CMD_STRICT);
        assert_eq!(&v.version_string[..11], b"580.159.04\0");
        assert_eq!(v.version(), "580.159.04");
        let long = "9".repeat(100);
        let cut = RmApiVersion::strict(&long);
        assert_eq!(cut.version().len(), RM_API_VERSION_STRING_LENGTH - 1);
        assert_eq!(cut.version_string[RM_API_VERSION_STRING_LENGTH - 1], 0);
    }

    #[test]
    fn pci_bus_id_is_written_as_lspci_does() {
        let card = CardInfo {
            pci_info: PciInfo {
                domain: 0,
                bus: 0x18,
                slot: 0,
                function: 0,
                vendor_id: 0x10de,
                device_id: 0x2335,
            },
            ..CardInfo::default()
        };
        assert_eq!(card.pci_bus_id(), "0000:18:00.0");
    }
}
