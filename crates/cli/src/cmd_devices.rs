//! `quench devices`: the GPUs the driver sees.

use quench_rt::list_devices;

pub fn run() -> Result<(), String> {
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
                    d.total_memory_bytes as f64 / (1u64 << 30) as f64,
                    d.driver_version
                );
            }
        }
        Err(e) => println!("{e}"),
    }
    Ok(())
}
