//! The resource-manager control calls quench makes (`NV_ESC_RM_CONTROL`): each
//! command's id and its parameter struct, laid out as NVIDIA's header declares it.
//!
//! A command id says which class answers it: `0x0000xxxx` the root client,
//! `0x2080xxxx` a subdevice. Every struct here holds its data inline (no pointers into
//! the caller's memory), so the resource manager copies it in and out whole.

use super::ioctl::{c_string, Params};

/// A control command and its parameters.
pub trait Control: Params {
    /// The command id (`NVxxxx_CTRL_CMD_...`).
    const CMD: u32;
    /// The header's name, for messages.
    const NAME: &'static str;
}

/// `NV0000_CTRL_GPU_GET_ID_INFO_V2_PARAMS`
/// (src/common/sdk/nvidia/inc/ctrl/ctrl0000/ctrl0000gpu.h): the instance numbers of the
/// GPU with a given id, asked of the root client.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuGetIdInfoV2Params {
    pub gpu_id: u32,
    pub gpu_flags: u32,
    pub device_instance: u32,
    pub sub_device_instance: u32,
    pub sli_status: u32,
    pub board_id: u32,
    pub gpu_instance: u32,
    pub numa_id: i32,
}
assert_layout!(GpuGetIdInfoV2Params, size 32, gpu_id @ 0, gpu_flags @ 4,
    device_instance @ 8, sub_device_instance @ 12, sli_status @ 16, board_id @ 20,
    gpu_instance @ 24, numa_id @ 28);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for GpuGetIdInfoV2Params {}

impl Control for GpuGetIdInfoV2Params {
    const CMD: u32 = 0x205;
    const NAME: &'static str = "NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2";
}

impl GpuGetIdInfoV2Params {
    pub fn new(gpu_id: u32) -> Self {
        GpuGetIdInfoV2Params {
            gpu_id,
            ..Self::default()
        }
    }
}

/// `NV2080_GPU_MAX_NAME_STRING_LENGTH` (ctrl2080gpu.h).
pub const GPU_MAX_NAME_STRING_LENGTH: usize = 0x40;

/// `NV2080_CTRL_GPU_GET_NAME_STRING_PARAMS`
/// (src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080gpu.h): the GPU's marketing name.
/// The header's `gpuNameString` is a union of 64 ASCII bytes and 64 UTF-16 units; this
/// struct holds its 128 bytes and reads the ASCII form.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuGetNameStringParams {
    /// `NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_ASCII` (0) or `_UNICODE` (1).
    pub gpu_name_string_flags: u32,
    pub gpu_name_string: [u8; 2 * GPU_MAX_NAME_STRING_LENGTH],
}
assert_layout!(GpuGetNameStringParams, size 132, gpu_name_string_flags @ 0,
    gpu_name_string @ 4);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for GpuGetNameStringParams {}

impl Control for GpuGetNameStringParams {
    const CMD: u32 = 0x2080_0110;
    const NAME: &'static str = "NV2080_CTRL_CMD_GPU_GET_NAME_STRING";
}

impl GpuGetNameStringParams {
    /// Asks for the ASCII name.
    pub fn ascii() -> Self {
        GpuGetNameStringParams {
            gpu_name_string_flags: 0,
            gpu_name_string: [0; 2 * GPU_MAX_NAME_STRING_LENGTH],
        }
    }

    /// The ASCII name the driver wrote (at most 64 bytes, NUL-terminated).
    pub fn name(&self) -> String {
        c_string(&self.gpu_name_string[..GPU_MAX_NAME_STRING_LENGTH])
            .trim()
            .to_string()
    }
}

/// `NVXXXX_CTRL_XXX_INFO` (src/common/sdk/nvidia/inc/ctrl/ctrlxxxx.h): one value of an
/// info list, asked for by index.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InfoEntry {
    pub index: u32,
    pub data: u32,
}
assert_layout!(InfoEntry, size 8, index @ 0, data @ 4);

/// `NV2080_CTRL_FB_INFO_MAX_LIST_SIZE` (ctrl2080fb.h; 0x39 before the 580 branch).
pub const FB_INFO_MAX_LIST_SIZE: usize = 0x80;
/// `NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE` (ctrl2080fb.h): KiB of memory for use with
/// the GPU.
pub const FB_INFO_INDEX_TOTAL_RAM_SIZE: u32 = 0x8;
/// `NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE` (ctrl2080fb.h): KiB available for allocations,
/// the total less what the driver reserves.
pub const FB_INFO_INDEX_HEAP_SIZE: u32 = 0x9;
/// `NV2080_CTRL_FB_INFO_INDEX_USABLE_RAM_SIZE` (ctrl2080fb.h): KiB of usable memory
/// physically present.
pub const FB_INFO_INDEX_USABLE_RAM_SIZE: u32 = 0x20;

/// `NV2080_CTRL_FB_GET_INFO_V2_PARAMS`
/// (src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080fb.h): memory figures by index.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FbGetInfoV2Params {
    pub fb_info_list_size: u32,
    pub fb_info_list: [InfoEntry; FB_INFO_MAX_LIST_SIZE],
}
assert_layout!(FbGetInfoV2Params, size 1028, fb_info_list_size @ 0, fb_info_list @ 4);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for FbGetInfoV2Params {}

impl Control for FbGetInfoV2Params {
    const CMD: u32 = 0x2080_1303;
    const NAME: &'static str = "NV2080_CTRL_CMD_FB_GET_INFO_V2";
}

/// Fills `list` with requests for `indices` (as many as fit); returns how many.
fn request_info(list: &mut [InfoEntry], indices: &[u32]) -> u32 {
    let mut n = 0;
    for (entry, &index) in list.iter_mut().zip(indices) {
        entry.index = index;
        n += 1;
    }
    n
}

/// The value returned for `index` among the first `size` entries of `list`.
fn info_value(list: &[InfoEntry], size: u32, index: u32) -> Option<u32> {
    list[..(size as usize).min(list.len())]
        .iter()
        .find(|e| e.index == index)
        .map(|e| e.data)
}

impl FbGetInfoV2Params {
    /// Asks for the values at `indices` (at most [`FB_INFO_MAX_LIST_SIZE`]; the rest
    /// are ignored).
    pub fn request(indices: &[u32]) -> Self {
        let mut params = FbGetInfoV2Params {
            fb_info_list_size: 0,
            fb_info_list: [InfoEntry::default(); FB_INFO_MAX_LIST_SIZE],
        };
        params.fb_info_list_size = request_info(&mut params.fb_info_list, indices);
        params
    }

    /// The value returned for `index`, if it was asked for.
    pub fn value(&self, index: u32) -> Option<u32> {
        info_value(&self.fb_info_list, self.fb_info_list_size, index)
    }
}

/// `NV2080_CTRL_GR_ROUTE_INFO` (= `NV0080_CTRL_GR_ROUTE_INFO`,
/// src/common/sdk/nvidia/inc/ctrl/ctrl0080/ctrl0080gr.h): which graphics engine a GR
/// control is for. All zero: the GPU's only one (without MIG partitions).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrRouteInfo {
    pub flags: u32,
    pub route: u64,
}
assert_layout!(GrRouteInfo, size 16, flags @ 0, route @ 8);

/// `NV0080_CTRL_GR_INFO_MAX_SIZE` (ctrl0080gr.h): entries of a GR info list.
pub const GR_INFO_MAX_SIZE: usize = 0x3a;
/// `NV0080_CTRL_GR_INFO_INDEX_MAX_WARPS_PER_SM` (ctrl0080gr.h).
pub const GR_INFO_INDEX_MAX_WARPS_PER_SM: u32 = 0xd;
/// `NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_GPCS`: GPCs the chip's design has (enabled or
/// not), which bounds the GPC ids hardware uses.
pub const GR_INFO_INDEX_LITTER_NUM_GPCS: u32 = 0x14;
/// `NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC`: TPCs per GPC in the design.
pub const GR_INFO_INDEX_LITTER_NUM_TPC_PER_GPC: u32 = 0x17;
/// `NV0080_CTRL_GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC`.
pub const GR_INFO_INDEX_LITTER_NUM_SM_PER_TPC: u32 = 0x20;

/// `NV2080_CTRL_GR_GET_INFO_V2_PARAMS` (= `NV0080_CTRL_GR_GET_INFO_V2_PARAMS`,
/// src/common/sdk/nvidia/inc/ctrl/ctrl0080/ctrl0080gr.h): graphics engine figures by
/// index, the list inline.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrGetInfoV2Params {
    pub gr_info_list_size: u32,
    pub gr_info_list: [InfoEntry; GR_INFO_MAX_SIZE],
    pub gr_route_info: GrRouteInfo,
}
assert_layout!(GrGetInfoV2Params, size 488, gr_info_list_size @ 0, gr_info_list @ 4,
    gr_route_info @ 472);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for GrGetInfoV2Params {}

impl Control for GrGetInfoV2Params {
    const CMD: u32 = 0x2080_1228;
    const NAME: &'static str = "NV2080_CTRL_CMD_GR_GET_INFO_V2";
}

impl GrGetInfoV2Params {
    /// Asks for the values at `indices` (at most [`GR_INFO_MAX_SIZE`]).
    pub fn request(indices: &[u32]) -> Self {
        let mut params = GrGetInfoV2Params {
            gr_info_list_size: 0,
            gr_info_list: [InfoEntry::default(); GR_INFO_MAX_SIZE],
            gr_route_info: GrRouteInfo::default(),
        };
        params.gr_info_list_size = request_info(&mut params.gr_info_list, indices);
        params
    }

    /// The value returned for `index`, if it was asked for.
    pub fn value(&self, index: u32) -> Option<u32> {
        info_value(&self.gr_info_list, self.gr_info_list_size, index)
    }
}

/// `NV2080_CTRL_GR_GET_SM_TO_GPC_TPC_MAPPINGS_MAX_SM_COUNT` (ctrl2080gr.h; 144 before the
/// 560 branch).
pub const GR_SM_MAPPINGS_MAX_SM_COUNT: usize = 240;

/// One entry of the SM map: the GPC and TPC an SM sits in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmId {
    pub gpc_id: u32,
    pub tpc_id: u32,
}
assert_layout!(SmId, size 8, gpc_id @ 0, tpc_id @ 4);

/// `NV2080_CTRL_GR_GET_SM_TO_GPC_TPC_MAPPINGS_PARAMS`
/// (src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080gr.h): every SM the GPU has enabled,
/// in the driver's global SM order. `sm_count` is the number of multiprocessors.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrGetSmToGpcTpcMappingsParams {
    pub sm_id: [SmId; GR_SM_MAPPINGS_MAX_SM_COUNT],
    pub sm_count: u32,
    pub gr_route_info: GrRouteInfo,
}
assert_layout!(GrGetSmToGpcTpcMappingsParams, size 1944, sm_id @ 0, sm_count @ 1920,
    gr_route_info @ 1928);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for GrGetSmToGpcTpcMappingsParams {}

impl Control for GrGetSmToGpcTpcMappingsParams {
    const CMD: u32 = 0x2080_120f;
    const NAME: &'static str = "NV2080_CTRL_CMD_GR_GET_SM_TO_GPC_TPC_MAPPINGS";
}

impl Default for GrGetSmToGpcTpcMappingsParams {
    fn default() -> Self {
        GrGetSmToGpcTpcMappingsParams {
            sm_id: [SmId::default(); GR_SM_MAPPINGS_MAX_SM_COUNT],
            sm_count: 0,
            gr_route_info: GrRouteInfo::default(),
        }
    }
}

/// `NV2080_CTRL_MC_GET_ARCH_INFO_PARAMS`
/// (src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080mc.h): the chip's architecture and
/// implementation (see [`super::Architecture`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct McGetArchInfoParams {
    pub architecture: u32,
    pub implementation: u32,
    pub revision: u32,
    pub sub_revision: u8,
}
assert_layout!(McGetArchInfoParams, size 16, architecture @ 0, implementation @ 4,
    revision @ 8, sub_revision @ 12);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for McGetArchInfoParams {}

impl Control for McGetArchInfoParams {
    const CMD: u32 = 0x2080_1701;
    const NAME: &'static str = "NV2080_CTRL_CMD_MC_GET_ARCH_INFO";
}

/// `NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN_PARAMS`
/// (src/common/sdk/nvidia/inc/ctrl/ctrlc36f.h), asked of a channel: the value to write to
/// the usermode doorbell to make the GPU look at the channel's new work.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpfifoGetWorkSubmitTokenParams {
    pub work_submit_token: u32,
}
assert_layout!(GpfifoGetWorkSubmitTokenParams, size 4, work_submit_token @ 0);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for GpfifoGetWorkSubmitTokenParams {}

impl Control for GpfifoGetWorkSubmitTokenParams {
    const CMD: u32 = 0xc36f_0108;
    const NAME: &'static str = "NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN";
}

/// `NVA06F_CTRL_GPFIFO_SCHEDULE_PARAMS`
/// (src/common/sdk/nvidia/inc/ctrl/ctrla06f/ctrla06fgpfifo.h), which the channel group's
/// `NVA06C_CTRL_CMD_GPFIFO_SCHEDULE` (ctrl/ctrla06c.h) takes as its own: puts the group
/// on the hardware's runlist (`b_enable`) once its channels have their objects.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpfifoScheduleParams {
    pub b_enable: u8,
    pub b_skip_submit: u8,
    pub b_skip_enable: u8,
}
assert_layout!(GpfifoScheduleParams, size 3, b_enable @ 0, b_skip_submit @ 1,
    b_skip_enable @ 2);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for GpfifoScheduleParams {}

impl Control for GpfifoScheduleParams {
    const CMD: u32 = 0xa06c_0101;
    const NAME: &'static str = "NVA06C_CTRL_CMD_GPFIFO_SCHEDULE";
}

/// `NV2080_CTRL_PERF_BOOST_PARAMS` (src/common/sdk/nvidia/inc/ctrl/ctrl2080/ctrl2080perf.h):
/// asks the GPU's performance control for its highest clocks, as CUDA does for its
/// contexts, for `duration` seconds or until the client is freed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerfBoostParams {
    pub flags: u32,
    pub duration: u32,
}
assert_layout!(PerfBoostParams, size 8, flags @ 0, duration @ 4);

// SAFETY: #[repr(C)] integers only, layout asserted above.
unsafe impl Params for PerfBoostParams {}

impl Control for PerfBoostParams {
    const CMD: u32 = 0x2080_200a;
    const NAME: &'static str = "NV2080_CTRL_CMD_PERF_BOOST";
}

impl PerfBoostParams {
    /// `CMD_BOOST_TO_MAX` (1:0 = 2), `CUDA_YES` (4:4), `CUDA_PRIORITY_HIGH` (6:6), for as
    /// long as the client lives (`DURATION_INFINITE`).
    pub fn cuda_max() -> Self {
        PerfBoostParams {
            flags: 2 | (1 << 4) | (1 << 6),
            duration: u32::MAX,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_ids_name_their_class_interface_and_message() {
        // (class << 16) | (interface << 8) | message, as the headers' finn comments say.
        let parts = |cmd: u32| (cmd >> 16, (cmd >> 8) & 0xff, cmd & 0xff);
        assert_eq!(parts(GpuGetIdInfoV2Params::CMD), (0x0000, 0x02, 0x05));
        assert_eq!(parts(GpuGetNameStringParams::CMD), (0x2080, 0x01, 0x10));
        assert_eq!(
            parts(GrGetSmToGpcTpcMappingsParams::CMD),
            (0x2080, 0x12, 0x0f)
        );
        assert_eq!(parts(FbGetInfoV2Params::CMD), (0x2080, 0x13, 0x03));
        assert_eq!(parts(McGetArchInfoParams::CMD), (0x2080, 0x17, 0x01));
        assert_eq!(
            parts(GpfifoGetWorkSubmitTokenParams::CMD),
            (0xc36f, 0x01, 0x08)
        );
        assert_eq!(parts(GpfifoScheduleParams::CMD), (0xa06c, 0x01, 0x01));
        assert_eq!(parts(PerfBoostParams::CMD), (0x2080, 0x20, 0x0a));
        // BOOST_TO_MAX in bits 1:0, CUDA_YES at 4, CUDA_PRIORITY_HIGH at 6.
        assert_eq!(PerfBoostParams::cuda_max().flags, 0b101_0010);
    }

    #[test]
    fn fb_info_asks_for_indices_and_reads_values_back() {
        let mut p =
            FbGetInfoV2Params::request(&[FB_INFO_INDEX_TOTAL_RAM_SIZE, FB_INFO_INDEX_HEAP_SIZE]);
        assert_eq!(p.fb_info_list_size, 2);
        p.fb_info_list[1].data = 42;
        assert_eq!(p.value(FB_INFO_INDEX_HEAP_SIZE), Some(42));
        assert_eq!(p.value(FB_INFO_INDEX_TOTAL_RAM_SIZE), Some(0));
        assert_eq!(p.value(FB_INFO_INDEX_USABLE_RAM_SIZE), None);
        // A list size the driver wrote past the array is clamped, never trusted.
        p.fb_info_list_size = u32::MAX;
        assert_eq!(p.value(FB_INFO_INDEX_HEAP_SIZE), Some(42));
    }

    #[test]
    fn name_stops_at_the_nul_and_within_64_bytes() {
        let mut p = GpuGetNameStringParams::ascii();
        p.gpu_name_string[..12].copy_from_slice(b"NVIDIA H200\0");
        p.gpu_name_string[12] = b'x';
        assert_eq!(p.name(), "NVIDIA H200");
        p.gpu_name_string = [b'A'; 2 * GPU_MAX_NAME_STRING_LENGTH];
        assert_eq!(p.name().len(), GPU_MAX_NAME_STRING_LENGTH);
    }
}
