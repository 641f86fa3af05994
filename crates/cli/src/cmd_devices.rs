//! `quench devices`: the GPUs the driver sees, through the CUDA driver library or
//! through quench's native backend (the kernel module's resource manager).

use clap::{Args, ValueEnum};
use quench_rt::{list_devices, native};
use serde_json::json;

use crate::receipt::print_json;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CUDA driver library (libcuda).
    Cuda,
    /// quench's own runtime: ioctls to NVIDIA's open kernel module, no libcuda.
    Native,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Native => "native",
        }
    }
}

#[derive(Args)]
pub struct DevicesArgs {
    /// Who asks the driver.
    #[arg(long, value_enum, default_value = "cuda")]
    pub backend: Backend,
    /// Print {"backend", "devices"} (or {"backend", "error"}) as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &DevicesArgs) -> Result<(), String> {
    match (args.backend, args.json) {
        (Backend::Cuda, false) => cuda_text(),
        (Backend::Native, false) => native_text(),
        (backend, true) => {
            let listed = match backend {
                Backend::Cuda => list_devices().map(|d| json!(d)).map_err(|e| e.to_string()),
                Backend::Native => native::list_devices()
                    .map(|d| json!(d))
                    .map_err(|e| e.to_string()),
            };
            let (out, result) = match listed {
                Ok(devices) => (
                    json!({"backend": backend.name(), "devices": devices}),
                    Ok(()),
                ),
                Err(e) => (json!({"backend": backend.name(), "error": e}), Err(e)),
            };
            print_json(&out)?;
            result
        }
    }
}

fn cuda_text() -> Result<(), String> {
    match list_devices() {
        Ok(devs) if devs.is_empty() => println!("no GPU: the NVIDIA driver reports no devices"),
        Ok(devs) => {
            for d in devs {
                println!(
                    "{}: {} (compute capability {}.{}, {:.1} GiB, driver {})",
                    d.ordinal,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    gib(d.total_memory_bytes),
                    d.driver_version
                );
            }
        }
        Err(e) => println!("{e}"),
    }
    Ok(())
}

fn native_text() -> Result<(), String> {
    let devs = native::list_devices().map_err(|e| e.to_string())?;
    if devs.is_empty() {
        println!("no GPU: the NVIDIA kernel module reports no devices");
    }
    for d in devs {
        println!(
            "{}: {} ({}, {} multiprocessors, {:.1} GiB for allocations of {:.1} GiB, PCI {}, driver {} open kernel module)",
            d.ordinal,
            d.name,
            d.architecture,
            d.multiprocessors,
            gib(d.heap_bytes),
            gib(d.memory_bytes),
            d.pci_bus_id,
            d.driver_version
        );
    }
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}
