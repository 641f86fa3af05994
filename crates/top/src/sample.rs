//! What one reading of the GPUs holds. Every measurement's name carries its unit;
//! a reading the driver does not expose is `None` (JSON `null`), never a stand-in 0.

use serde::Serialize;

/// One reading of every GPU, taken at `time_unix_ms`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Snapshot {
    pub time_unix_ms: u64,
    pub driver_version: Option<String>,
    pub nvml_version: Option<String>,
    pub gpus: Vec<GpuSample>,
}

/// One GPU's readings.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GpuSample {
    /// NVML's device index (the same order as `nvidia-smi`).
    pub index: u32,
    pub name: Option<String>,
    pub uuid: Option<String>,
    pub pci_bus_id: Option<String>,
    pub utilization_gpu_percent: Option<u32>,
    pub utilization_memory_percent: Option<u32>,
    /// Memory in use, not counting what the driver reserves (as `nvidia-smi` counts).
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub memory_reserved_bytes: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub memory_clock_mhz: Option<u32>,
    pub power_draw_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    pub temperature_c: Option<u32>,
    pub fan_speed_percent: Option<u32>,
    pub pcie_tx_bytes_per_s: Option<u64>,
    pub pcie_rx_bytes_per_s: Option<u64>,
    pub nvlink_link_count: Option<u32>,
    /// NVLink payload rates over the interval since the previous reading.
    pub nvlink_tx_bytes_per_s: Option<u64>,
    pub nvlink_rx_bytes_per_s: Option<u64>,
    /// ECC error counts since the driver loaded (volatile) and over the GPU's life
    /// (aggregate).
    pub ecc_corrected_volatile_count: Option<u64>,
    pub ecc_uncorrected_volatile_count: Option<u64>,
    pub ecc_corrected_aggregate_count: Option<u64>,
    pub ecc_uncorrected_aggregate_count: Option<u64>,
    /// Xid (critical error) events seen since this monitor started, and the last code.
    pub xid_events_count: Option<u64>,
    pub xid_last_code: Option<u64>,
    pub processes: Option<Vec<ProcessSample>>,
}

/// A process holding memory on a GPU.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessSample {
    pub pid: u32,
    pub name: Option<String>,
    pub used_memory_bytes: Option<u64>,
    pub kind: ProcessKind,
}

/// Whether a process uses the GPU for compute, graphics or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ProcessKind {
    #[serde(rename = "compute")]
    Compute,
    #[serde(rename = "graphics")]
    Graphics,
    #[serde(rename = "compute+graphics")]
    ComputeGraphics,
}
