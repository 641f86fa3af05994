//! The NVML sample source: reads every GPU through the driver's management library.

mod ffi;
mod xid;

use std::ffi::{c_char, c_uint, c_ulonglong};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::sample::{GpuSample, ProcessKind, ProcessSample, Snapshot};
use crate::source::{SampleSource, SourceError};
use ffi::{Api, Device};

pub use ffi::LIBRARY;

/// Reads GPUs through NVML. Opening it loads the library and initialises NVML; dropping
/// it shuts NVML down.
pub struct NvmlSource {
    api: Api,
    devices: Vec<Device>,
    /// Previous cumulative NVLink counters (KiB) per device, for rates.
    nvlink_prev: Vec<Option<NvlinkCounters>>,
    xid: xid::XidWatch,
}

#[derive(Clone, Copy)]
struct NvlinkCounters {
    at: Instant,
    tx_kib: u64,
    rx_kib: u64,
}

impl NvmlSource {
    /// Loads `libnvidia-ml.so.1` and opens every GPU.
    pub fn open() -> Result<Self, SourceError> {
        Self::open_library(LIBRARY)
    }

    /// Loads NVML from `library` (a path, or a name searched like `dlopen` does).
    pub fn open_library(library: &str) -> Result<Self, SourceError> {
        let api = Api::load(library)?;
        // SAFETY: plain NVML calls with valid out-pointers.
        let rc = unsafe { (api.nvmlInit_v2)() };
        if rc != ffi::SUCCESS {
            return Err(SourceError::Call {
                call: "nvmlInit_v2",
                message: api.describe(rc),
            });
        }
        // From here on `source` owns the initialised NVML and shuts it down on drop.
        let mut source = NvmlSource {
            api,
            devices: Vec::new(),
            nvlink_prev: Vec::new(),
            xid: xid::XidWatch::none(),
        };
        let mut count: c_uint = 0;
        let rc = unsafe { (source.api.nvmlDeviceGetCount_v2)(&mut count) };
        if rc != ffi::SUCCESS {
            let message = source.api.describe(rc);
            return Err(SourceError::Call {
                call: "nvmlDeviceGetCount_v2",
                message,
            });
        }
        if count == 0 {
            return Err(SourceError::NoGpu);
        }
        for i in 0..count {
            let mut dev: Device = std::ptr::null_mut();
            let rc = unsafe { (source.api.nvmlDeviceGetHandleByIndex_v2)(i, &mut dev) };
            if rc != ffi::SUCCESS {
                let message = format!("GPU {i}: {}", source.api.describe(rc));
                return Err(SourceError::Call {
                    call: "nvmlDeviceGetHandleByIndex_v2",
                    message,
                });
            }
            source.devices.push(dev);
        }
        source.nvlink_prev = vec![None; source.devices.len()];
        source.xid = xid::XidWatch::register(&source.api, &source.devices);
        Ok(source)
    }

    pub fn device_count(&self) -> usize {
        self.devices.len()
    }

    fn read_gpu(&mut self, index: usize) -> GpuSample {
        let api = &self.api;
        let dev = self.devices[index];
        let mut g = GpuSample {
            index: index as u32,
            ..GpuSample::default()
        };
        g.name = text(api.nvmlDeviceGetName, dev, ffi::NAME_BUFFER);
        g.uuid = text(api.nvmlDeviceGetUUID, dev, ffi::UUID_BUFFER);
        g.pci_bus_id = api.nvmlDeviceGetPciInfo_v3.and_then(|f| {
            // SAFETY: PciInfo is plain data NVML fills in.
            let mut info: ffi::PciInfo = unsafe { std::mem::zeroed() };
            ok(unsafe { f(dev, &mut info) })
                .then(|| ffi::buffer_text(&info.bus_id))
                .flatten()
        });
        if let Some(f) = api.nvmlDeviceGetUtilizationRates {
            let mut u = ffi::Utilization::default();
            if ok(unsafe { f(dev, &mut u) }) {
                g.utilization_gpu_percent = Some(u.gpu);
                g.utilization_memory_percent = Some(u.memory);
            }
        }
        read_memory(api, dev, &mut g);
        g.sm_clock_mhz = uint_arg(api.nvmlDeviceGetClockInfo, dev, ffi::CLOCK_SM);
        g.memory_clock_mhz = uint_arg(api.nvmlDeviceGetClockInfo, dev, ffi::CLOCK_MEM);
        g.power_draw_watts = uint(api.nvmlDeviceGetPowerUsage, dev).map(milliwatts);
        g.power_limit_watts = uint(api.nvmlDeviceGetPowerManagementLimit, dev).map(milliwatts);
        g.temperature_c = uint_arg(api.nvmlDeviceGetTemperature, dev, ffi::TEMPERATURE_GPU);
        g.fan_speed_percent = uint(api.nvmlDeviceGetFanSpeed, dev);
        // NVML reports PCIe throughput in KiB/s over a 20 ms window.
        g.pcie_tx_bytes_per_s = uint_arg(
            api.nvmlDeviceGetPcieThroughput,
            dev,
            ffi::PCIE_UTIL_TX_BYTES,
        )
        .map(kib);
        g.pcie_rx_bytes_per_s = uint_arg(
            api.nvmlDeviceGetPcieThroughput,
            dev,
            ffi::PCIE_UTIL_RX_BYTES,
        )
        .map(kib);
        self.read_nvlink(index, &mut g);
        let api = &self.api;
        let ecc = |kind, counter| {
            api.nvmlDeviceGetTotalEccErrors.and_then(|f| {
                let mut v: c_ulonglong = 0;
                ok(unsafe { f(dev, kind, counter, &mut v) }).then_some(v)
            })
        };
        g.ecc_corrected_volatile_count = ecc(ffi::MEMORY_ERROR_CORRECTED, ffi::VOLATILE_ECC);
        g.ecc_uncorrected_volatile_count = ecc(ffi::MEMORY_ERROR_UNCORRECTED, ffi::VOLATILE_ECC);
        g.ecc_corrected_aggregate_count = ecc(ffi::MEMORY_ERROR_CORRECTED, ffi::AGGREGATE_ECC);
        g.ecc_uncorrected_aggregate_count = ecc(ffi::MEMORY_ERROR_UNCORRECTED, ffi::AGGREGATE_ECC);
        if let Some(x) = self.xid.summary(index) {
            g.xid_events_count = Some(x.count);
            g.xid_last_code = x.last_code;
        }
        g.processes = read_processes(&self.api, dev);
        g
    }

    /// NVLink link count and payload rates. A GPU without active links has no NVLink
    /// throughput to report, so its rates stay `None`.
    fn read_nvlink(&mut self, index: usize, g: &mut GpuSample) {
        let Some(f) = self.api.nvmlDeviceGetFieldValues else {
            return;
        };
        let dev = self.devices[index];
        let mut fields = [
            ffi::FieldValue::request(ffi::FI_NVLINK_LINK_COUNT, 0),
            ffi::FieldValue::request(ffi::FI_NVLINK_THROUGHPUT_DATA_TX, ffi::SCOPE_ALL_LINKS),
            ffi::FieldValue::request(ffi::FI_NVLINK_THROUGHPUT_DATA_RX, ffi::SCOPE_ALL_LINKS),
        ];
        // SAFETY: `fields` holds as many entries as the count passed.
        if !ok(unsafe { f(dev, fields.len() as i32, fields.as_mut_ptr()) }) {
            return;
        }
        let links = fields[0].as_u64().and_then(|n| u32::try_from(n).ok());
        g.nvlink_link_count = links;
        let (Some(tx_kib), Some(rx_kib)) = (fields[1].as_u64(), fields[2].as_u64()) else {
            self.nvlink_prev[index] = None;
            return;
        };
        let now = NvlinkCounters {
            at: Instant::now(),
            tx_kib,
            rx_kib,
        };
        if let (Some(prev), Some(1..)) = (self.nvlink_prev[index], links) {
            let dt = now.at.duration_since(prev.at).as_secs_f64();
            let rate = |cur: u64, old: u64| {
                // A counter that went backwards was reset: no rate for this interval.
                (dt > 0.0 && cur >= old).then(|| ((cur - old) as f64 * 1024.0 / dt).round() as u64)
            };
            g.nvlink_tx_bytes_per_s = rate(tx_kib, prev.tx_kib);
            g.nvlink_rx_bytes_per_s = rate(rx_kib, prev.rx_kib);
        }
        self.nvlink_prev[index] = Some(now);
    }
}

impl SampleSource for NvmlSource {
    fn sample(&mut self) -> Result<Snapshot, SourceError> {
        self.xid.drain(&self.api, &self.devices);
        let gpus = (0..self.devices.len()).map(|i| self.read_gpu(i)).collect();
        Ok(Snapshot {
            time_unix_ms: unix_ms(),
            driver_version: system_text(self.api.nvmlSystemGetDriverVersion),
            nvml_version: system_text(self.api.nvmlSystemGetNVMLVersion),
            gpus,
        })
    }
}

impl Drop for NvmlSource {
    fn drop(&mut self) {
        self.xid.free(&self.api);
        // SAFETY: NVML was initialised in `open_library`; shutdown pairs with that init.
        unsafe { (self.api.nvmlShutdown)() };
    }
}

fn ok(rc: ffi::Ret) -> bool {
    rc == ffi::SUCCESS
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn milliwatts(mw: u32) -> f64 {
    f64::from(mw) / 1000.0
}

fn kib(v: u32) -> u64 {
    u64::from(v) * 1024
}

type TextFn = Option<unsafe extern "C" fn(Device, *mut c_char, c_uint) -> ffi::Ret>;
type UintFn = Option<unsafe extern "C" fn(Device, *mut c_uint) -> ffi::Ret>;
type UintArgFn = Option<unsafe extern "C" fn(Device, c_uint, *mut c_uint) -> ffi::Ret>;

fn text(f: TextFn, dev: Device, len: usize) -> Option<String> {
    let f = f?;
    let mut buf = vec![0 as c_char; len];
    // SAFETY: the buffer holds `len` bytes, as passed.
    ok(unsafe { f(dev, buf.as_mut_ptr(), len as c_uint) })
        .then(|| ffi::buffer_text(&buf))
        .flatten()
}

fn system_text(f: Option<unsafe extern "C" fn(*mut c_char, c_uint) -> ffi::Ret>) -> Option<String> {
    let f = f?;
    let mut buf = vec![0 as c_char; ffi::VERSION_BUFFER];
    // SAFETY: the buffer holds VERSION_BUFFER bytes, as passed.
    ok(unsafe { f(buf.as_mut_ptr(), buf.len() as c_uint) })
        .then(|| ffi::buffer_text(&buf))
        .flatten()
}

fn uint(f: UintFn, dev: Device) -> Option<u32> {
    let f = f?;
    let mut v: c_uint = 0;
    ok(unsafe { f(dev, &mut v) }).then_some(v)
}

fn uint_arg(f: UintArgFn, dev: Device, arg: c_uint) -> Option<u32> {
    let f = f?;
    let mut v: c_uint = 0;
    ok(unsafe { f(dev, arg, &mut v) }).then_some(v)
}

/// Memory through the v2 call (which separates the driver's reservation, as
/// `nvidia-smi` does), falling back to v1 on drivers without it.
fn read_memory(api: &Api, dev: Device, g: &mut GpuSample) {
    if let Some(f) = api.nvmlDeviceGetMemoryInfo_v2 {
        let mut m = ffi::MemoryV2 {
            version: ffi::MEMORY_V2_VERSION,
            ..Default::default()
        };
        if ok(unsafe { f(dev, &mut m) }) {
            g.memory_total_bytes = Some(m.total);
            g.memory_used_bytes = Some(m.used);
            g.memory_reserved_bytes = Some(m.reserved);
            return;
        }
    }
    if let Some(f) = api.nvmlDeviceGetMemoryInfo {
        let mut m = ffi::MemoryV1::default();
        if ok(unsafe { f(dev, &mut m) }) {
            g.memory_total_bytes = Some(m.total);
            g.memory_used_bytes = Some(m.used);
        }
    }
}

type ProcessFn =
    Option<unsafe extern "C" fn(Device, *mut c_uint, *mut ffi::ProcessInfo) -> ffi::Ret>;

/// The processes on `dev`, compute and graphics merged by pid; `None` when NVML
/// cannot list them.
fn read_processes(api: &Api, dev: Device) -> Option<Vec<ProcessSample>> {
    let compute = list_processes(api.nvmlDeviceGetComputeRunningProcesses_v3, dev);
    let graphics = list_processes(api.nvmlDeviceGetGraphicsRunningProcesses_v3, dev);
    if compute.is_none() && graphics.is_none() {
        return None;
    }
    let mut out: Vec<ProcessSample> = Vec::new();
    let tagged = compute
        .into_iter()
        .flatten()
        .map(|p| (p, ProcessKind::Compute))
        .chain(
            graphics
                .into_iter()
                .flatten()
                .map(|p| (p, ProcessKind::Graphics)),
        );
    for (p, kind) in tagged {
        let used = (p.used_gpu_memory != ffi::VALUE_NOT_AVAILABLE_U64).then_some(p.used_gpu_memory);
        match out.iter_mut().find(|q| q.pid == p.pid) {
            Some(q) => {
                q.kind = ProcessKind::ComputeGraphics;
                q.used_memory_bytes = q.used_memory_bytes.max(used);
            }
            None => out.push(ProcessSample {
                pid: p.pid,
                name: process_name(api, p.pid),
                used_memory_bytes: used,
                kind,
            }),
        }
    }
    out.sort_by(|a, b| {
        b.used_memory_bytes
            .cmp(&a.used_memory_bytes)
            .then(a.pid.cmp(&b.pid))
    });
    Some(out)
}

fn list_processes(f: ProcessFn, dev: Device) -> Option<Vec<ffi::ProcessInfo>> {
    let f = f?;
    // Processes come and go between the sizing call and the read: retry a few times.
    let mut capacity: c_uint = 0;
    for _ in 0..4 {
        let mut list = vec![ffi::ProcessInfo::default(); capacity as usize];
        let mut count = capacity;
        let ptr = if list.is_empty() {
            std::ptr::null_mut()
        } else {
            list.as_mut_ptr()
        };
        // SAFETY: `list` holds `count` entries (or the pointer is null with count 0).
        match unsafe { f(dev, &mut count, ptr) } {
            ffi::SUCCESS => {
                list.truncate(count as usize);
                return Some(list);
            }
            ffi::ERROR_INSUFFICIENT_SIZE => capacity = count + 8,
            _ => return None,
        }
    }
    None
}

fn process_name(api: &Api, pid: u32) -> Option<String> {
    if let Some(f) = api.nvmlSystemGetProcessName {
        let mut buf = vec![0 as c_char; ffi::PROCESS_NAME_BUFFER];
        // SAFETY: the buffer holds PROCESS_NAME_BUFFER bytes, as passed.
        if ok(unsafe { f(pid, buf.as_mut_ptr(), buf.len() as c_uint) }) {
            if let Some(name) = ffi::buffer_text(&buf) {
                return Some(name);
            }
        }
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}
