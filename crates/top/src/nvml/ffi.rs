//! The part of NVML's C interface that `quench top` reads, loaded from the driver's
//! `libnvidia-ml.so.1` at run time, so that building quench needs no driver.
//!
//! Layouts and constants follow `nvml.h` (NVML 12/13). Entry points that every driver
//! since NVML 11 exports are required; the others are optional, and a reading whose
//! entry point is missing is reported as unavailable.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

use libloading::Library;

use crate::source::SourceError;

/// The library name the NVIDIA driver installs.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

pub type Ret = c_int;
pub type Device = *mut c_void;
pub type EventSet = *mut c_void;

pub const SUCCESS: Ret = 0;
pub const ERROR_INSUFFICIENT_SIZE: Ret = 7;

pub const CLOCK_SM: c_uint = 1;
pub const CLOCK_MEM: c_uint = 2;
pub const TEMPERATURE_GPU: c_uint = 0;
pub const PCIE_UTIL_TX_BYTES: c_uint = 0;
pub const PCIE_UTIL_RX_BYTES: c_uint = 1;
pub const MEMORY_ERROR_CORRECTED: c_uint = 0;
pub const MEMORY_ERROR_UNCORRECTED: c_uint = 1;
pub const VOLATILE_ECC: c_uint = 0;
pub const AGGREGATE_ECC: c_uint = 1;
pub const EVENT_TYPE_XID_CRITICAL_ERROR: c_ulonglong = 0x8;

/// Field ids for `nvmlDeviceGetFieldValues`.
pub const FI_NVLINK_LINK_COUNT: u32 = 91;
/// Cumulative NVLink payload counters in KiB; scope `u32::MAX` sums every link.
pub const FI_NVLINK_THROUGHPUT_DATA_TX: u32 = 138;
pub const FI_NVLINK_THROUGHPUT_DATA_RX: u32 = 139;
pub const SCOPE_ALL_LINKS: u32 = u32::MAX;

/// `nvmlValueType_t`
pub const VALUE_TYPE_DOUBLE: c_int = 0;
pub const VALUE_TYPE_UNSIGNED_INT: c_int = 1;
pub const VALUE_TYPE_UNSIGNED_LONG: c_int = 2;
pub const VALUE_TYPE_UNSIGNED_LONG_LONG: c_int = 3;
pub const VALUE_TYPE_SIGNED_LONG_LONG: c_int = 4;
pub const VALUE_TYPE_SIGNED_INT: c_int = 5;
pub const VALUE_TYPE_UNSIGNED_SHORT: c_int = 6;

/// NVML's "value not available" marker for per-process memory.
pub const VALUE_NOT_AVAILABLE_U64: u64 = u64::MAX;

pub const NAME_BUFFER: usize = 96;
pub const UUID_BUFFER: usize = 96;
pub const VERSION_BUFFER: usize = 80;
pub const PROCESS_NAME_BUFFER: usize = 256;

#[repr(C)]
#[derive(Default)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

#[repr(C)]
#[derive(Default)]
pub struct MemoryV1 {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2_t`: `used` excludes the memory the driver reserves, as
/// `nvidia-smi` reports it.
#[repr(C)]
#[derive(Default)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlMemory_v2`: the struct size with version 2 in the top byte.
pub const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

#[repr(C)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

/// `nvmlProcessInfo_t` (v2 and v3 share this layout).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub union Value {
    pub d: f64,
    pub ui: c_uint,
    /// `unsigned long`: 64 bits on the Linux targets NVML ships for.
    pub ul: u64,
    pub ull: c_ulonglong,
    pub sll: i64,
    pub si: c_int,
    pub us: u16,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct FieldValue {
    pub field_id: u32,
    pub scope_id: u32,
    pub timestamp: i64,
    pub latency_usec: i64,
    pub value_type: c_int,
    pub nvml_return: Ret,
    pub value: Value,
}

impl FieldValue {
    pub fn request(field_id: u32, scope_id: u32) -> Self {
        FieldValue {
            field_id,
            scope_id,
            timestamp: 0,
            latency_usec: 0,
            value_type: 0,
            nvml_return: SUCCESS,
            value: Value { ull: 0 },
        }
    }

    /// The value as a u64 when NVML returned one that fits.
    pub fn as_u64(&self) -> Option<u64> {
        if self.nvml_return != SUCCESS {
            return None;
        }
        // SAFETY: `value_type` names the union member NVML wrote.
        unsafe {
            match self.value_type {
                VALUE_TYPE_UNSIGNED_INT => Some(u64::from(self.value.ui)),
                VALUE_TYPE_UNSIGNED_LONG => Some(self.value.ul),
                VALUE_TYPE_UNSIGNED_LONG_LONG => Some(self.value.ull),
                VALUE_TYPE_SIGNED_LONG_LONG => u64::try_from(self.value.sll).ok(),
                VALUE_TYPE_SIGNED_INT => u64::try_from(self.value.si).ok(),
                VALUE_TYPE_UNSIGNED_SHORT => Some(u64::from(self.value.us)),
                VALUE_TYPE_DOUBLE if self.value.d >= 0.0 && self.value.d.is_finite() => {
                    Some(self.value.d as u64)
                }
                _ => None,
            }
        }
    }
}

#[repr(C)]
pub struct EventData {
    pub device: Device,
    pub event_type: c_ulonglong,
    pub event_data: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// Declares the function table: required entry points fail `load`, optional ones
/// become `None`.
macro_rules! nvml_api {
    (
        required { $($req:ident: fn($($ra:ty),*);)* }
        optional { $($opt:ident: fn($($oa:ty),*);)* }
    ) => {
        #[allow(non_snake_case)]
        pub struct Api {
            $(pub $req: unsafe extern "C" fn($($ra),*) -> Ret,)*
            $(pub $opt: Option<unsafe extern "C" fn($($oa),*) -> Ret>,)*
            error_string: Option<unsafe extern "C" fn(Ret) -> *const c_char>,
            // Kept last and alive as long as the pointers above are callable.
            _lib: Library,
        }

        #[allow(non_snake_case)]
        impl Api {
            /// Loads the library at `path` (a file name is searched like `dlopen` does).
            pub fn load(path: &str) -> Result<Api, SourceError> {
                // SAFETY: loading NVML runs only its (side-effect free) initialisers.
                let lib = unsafe { Library::new(path) }.map_err(|e| SourceError::LibraryNotLoaded {
                    library: path.to_string(),
                    reason: e.to_string(),
                })?;
                // SAFETY: each symbol is read with the signature `nvml.h` declares.
                unsafe {
                    $(
                        let $req = *lib
                            .get::<unsafe extern "C" fn($($ra),*) -> Ret>(
                                concat!(stringify!($req), "\0").as_bytes(),
                            )
                            .map_err(|_| SourceError::MissingSymbol { symbol: stringify!($req) })?;
                    )*
                    $(
                        let $opt = lib
                            .get::<unsafe extern "C" fn($($oa),*) -> Ret>(
                                concat!(stringify!($opt), "\0").as_bytes(),
                            )
                            .ok()
                            .map(|s| *s);
                    )*
                    let error_string = lib
                        .get::<unsafe extern "C" fn(Ret) -> *const c_char>(b"nvmlErrorString\0")
                        .ok()
                        .map(|s| *s);
                    Ok(Api { $($req,)* $($opt,)* error_string, _lib: lib })
                }
            }
        }
    };
}

nvml_api! {
    required {
        nvmlInit_v2: fn();
        nvmlShutdown: fn();
        nvmlDeviceGetCount_v2: fn(*mut c_uint);
        nvmlDeviceGetHandleByIndex_v2: fn(c_uint, *mut Device);
    }
    optional {
        nvmlSystemGetDriverVersion: fn(*mut c_char, c_uint);
        nvmlSystemGetNVMLVersion: fn(*mut c_char, c_uint);
        nvmlSystemGetProcessName: fn(c_uint, *mut c_char, c_uint);
        nvmlDeviceGetName: fn(Device, *mut c_char, c_uint);
        nvmlDeviceGetUUID: fn(Device, *mut c_char, c_uint);
        nvmlDeviceGetPciInfo_v3: fn(Device, *mut PciInfo);
        nvmlDeviceGetUtilizationRates: fn(Device, *mut Utilization);
        nvmlDeviceGetMemoryInfo: fn(Device, *mut MemoryV1);
        nvmlDeviceGetMemoryInfo_v2: fn(Device, *mut MemoryV2);
        nvmlDeviceGetClockInfo: fn(Device, c_uint, *mut c_uint);
        nvmlDeviceGetPowerUsage: fn(Device, *mut c_uint);
        nvmlDeviceGetPowerManagementLimit: fn(Device, *mut c_uint);
        nvmlDeviceGetTemperature: fn(Device, c_uint, *mut c_uint);
        nvmlDeviceGetFanSpeed: fn(Device, *mut c_uint);
        nvmlDeviceGetPcieThroughput: fn(Device, c_uint, *mut c_uint);
        nvmlDeviceGetFieldValues: fn(Device, c_int, *mut FieldValue);
        nvmlDeviceGetTotalEccErrors: fn(Device, c_uint, c_uint, *mut c_ulonglong);
        nvmlDeviceGetComputeRunningProcesses_v3: fn(Device, *mut c_uint, *mut ProcessInfo);
        nvmlDeviceGetGraphicsRunningProcesses_v3: fn(Device, *mut c_uint, *mut ProcessInfo);
        nvmlEventSetCreate: fn(*mut EventSet);
        nvmlDeviceRegisterEvents: fn(Device, c_ulonglong, EventSet);
        nvmlEventSetWait_v2: fn(EventSet, *mut EventData, c_uint);
        nvmlEventSetFree: fn(EventSet);
    }
}

impl Api {
    /// NVML's text for a return code.
    pub fn describe(&self, code: Ret) -> String {
        let text = self.error_string.and_then(|f| {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string or null.
            let p = unsafe { f(code) };
            (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        });
        text.unwrap_or_else(|| format!("NVML error {code}"))
    }
}

/// The text NVML wrote into a fixed-size buffer, up to its NUL.
pub fn buffer_text(buf: &[c_char]) -> Option<String> {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let s = String::from_utf8_lossy(&bytes).trim().to_string();
    (!s.is_empty()).then_some(s)
}
