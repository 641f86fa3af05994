//! The CUDA devices the driver sees (`quench devices`).

use cudarc::driver::result::device;
use cudarc::driver::sys::CUdevice_attribute;
use serde::Serialize;

use crate::cuda::driver::{driver, drv, version_string};
use crate::error::RtError;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    pub ordinal: u32,
    pub name: String,
    /// (major, minor): (9, 0) for H100/H200.
    pub compute_capability: (u32, u32),
    pub total_memory_bytes: u64,
    /// Streaming multiprocessors (132 on an H100 SXM or H200).
    pub multiprocessors: u32,
    /// The CUDA version the driver supports, e.g. "13.0".
    pub driver_version: String,
}

/// Every CUDA device, in ordinal order. [`RtError::NoGpu`] if there is no driver or it
/// reports no device.
pub fn list_devices() -> Result<Vec<DeviceInfo>, RtError> {
    driver()?;
    let count = device::get_count().map_err(drv("cuDeviceGetCount"))?;
    (0..count.max(0) as u32).map(device_info).collect()
}

/// One device's description.
pub(crate) fn device_info(ordinal: u32) -> Result<DeviceInfo, RtError> {
    let version = driver()?;
    let count = device::get_count().map_err(drv("cuDeviceGetCount"))?;
    if ordinal >= count.max(0) as u32 {
        return Err(RtError::NoGpu {
            reason: format!("there is no CUDA device {ordinal} (the driver reports {count})"),
        });
    }
    let dev = device::get(ordinal as i32).map_err(drv("cuDeviceGet"))?;
    let name = device::get_name(dev).map_err(drv("cuDeviceGetName"))?;
    let attr = |a| {
        // SAFETY: `dev` came from cuDeviceGet.
        unsafe { device::get_attribute(dev, a) }.map_err(drv("cuDeviceGetAttribute"))
    };
    let major = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    // SAFETY: as above.
    let total = unsafe { device::total_mem(dev) }.map_err(drv("cuDeviceTotalMem"))?;
    Ok(DeviceInfo {
        ordinal,
        name,
        compute_capability: (major as u32, minor as u32),
        total_memory_bytes: total as u64,
        multiprocessors: sms.max(0) as u32,
        driver_version: version_string(version),
    })
}
