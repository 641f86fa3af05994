//! Seeded random readings for the tests.
#![allow(dead_code)]

use quench_top::{GpuSample, ProcessKind, ProcessSample, Snapshot};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub fn rng(test: &str) -> ChaCha8Rng {
    // A fresh seed per run, printed so that a failure can be replayed.
    let seed: u64 = std::env::var("QUENCH_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("{test}: seed {seed} (QUENCH_TEST_SEED={seed} to replay)");
    ChaCha8Rng::seed_from_u64(seed)
}

/// A GPU with every reading present, values drawn from `rng`.
pub fn full_gpu(rng: &mut ChaCha8Rng, index: u32) -> GpuSample {
    let total: u64 = rng.gen_range(16u64..=192) << 30;
    let nprocs = rng.gen_range(1..4);
    let processes = (0..nprocs)
        .map(|i| ProcessSample {
            pid: rng.gen_range(1000..99_999),
            name: Some(format!("proc{i}-{}", rng.gen_range(0..1000))),
            used_memory_bytes: Some(rng.gen_range(1u64..8192) << 20),
            kind: [
                ProcessKind::Compute,
                ProcessKind::Graphics,
                ProcessKind::ComputeGraphics,
            ][rng.gen_range(0..3)],
        })
        .collect();
    GpuSample {
        index,
        name: Some(format!("NVIDIA Test{}", rng.gen_range(100..999))),
        uuid: Some(format!(
            "GPU-{:08x}-{:04x}",
            rng.gen::<u32>(),
            rng.gen::<u16>()
        )),
        pci_bus_id: Some(format!("00000000:{:02X}:00.0", rng.gen_range(1..255))),
        utilization_gpu_percent: Some(rng.gen_range(0..=100)),
        utilization_memory_percent: Some(rng.gen_range(0..=100)),
        memory_used_bytes: Some(rng.gen_range(0..total)),
        memory_total_bytes: Some(total),
        memory_reserved_bytes: Some(rng.gen_range(0u64..1024) << 20),
        sm_clock_mhz: Some(rng.gen_range(300..2100)),
        memory_clock_mhz: Some(rng.gen_range(1000..3300)),
        power_draw_watts: Some(f64::from(rng.gen_range(500..7000)) / 10.0),
        power_limit_watts: Some(f64::from(rng.gen_range(7001..9000)) / 10.0),
        temperature_c: Some(rng.gen_range(20..95)),
        fan_speed_percent: Some(rng.gen_range(0..=100)),
        pcie_tx_bytes_per_s: Some(rng.gen_range(0..1u64 << 34)),
        pcie_rx_bytes_per_s: Some(rng.gen_range(0..1u64 << 34)),
        nvlink_link_count: Some(rng.gen_range(1..19)),
        nvlink_tx_bytes_per_s: Some(rng.gen_range(0..1u64 << 38)),
        nvlink_rx_bytes_per_s: Some(rng.gen_range(0..1u64 << 38)),
        ecc_corrected_volatile_count: Some(rng.gen_range(0..100)),
        ecc_uncorrected_volatile_count: Some(rng.gen_range(0..100)),
        ecc_corrected_aggregate_count: Some(rng.gen_range(100..1000)),
        ecc_uncorrected_aggregate_count: Some(rng.gen_range(100..1000)),
        xid_events_count: Some(rng.gen_range(1..10)),
        xid_last_code: Some(rng.gen_range(1..200)),
        processes: Some(processes),
    }
}

/// A GPU the driver tells nothing about but its index.
pub fn empty_gpu(index: u32) -> GpuSample {
    GpuSample {
        index,
        ..GpuSample::default()
    }
}

pub fn snapshot(time_unix_ms: u64, gpus: Vec<GpuSample>) -> Snapshot {
    Snapshot {
        time_unix_ms,
        driver_version: Some("580.159.03".into()),
        nvml_version: Some("13.580.159.03".into()),
        gpus,
    }
}
