//! The GPU a command runs on, described for receipts.

use quench_rt::native::NativeExecutor;
use quench_rt::{CudaExecutor, Executor};
use serde_json::{json, Value};

use crate::model_args::RuntimeArg;

/// Name, compute capability, memory and driver of GPU `ordinal`, or an error saying
/// why there is none.
pub fn describe(ordinal: u32) -> Result<Value, String> {
    let devs = quench_rt::list_devices().map_err(|e| e.to_string())?;
    let d = devs
        .into_iter()
        .find(|d| d.ordinal == ordinal)
        .ok_or_else(|| format!("no GPU with ordinal {ordinal}"))?;
    Ok(json!({
        "name": d.name,
        "compute_capability": format!("{}.{}", d.compute_capability.0, d.compute_capability.1),
        "memory_bytes": d.total_memory_bytes,
        "driver": d.driver_version,
    }))
}

/// As [`describe`], as `runtime` sees GPU `ordinal`: the native backend asks the kernel
/// module's resource manager, without libcuda.
pub fn describe_on(ordinal: u32, runtime: RuntimeArg) -> Result<Value, String> {
    match runtime {
        RuntimeArg::Cuda => describe(ordinal),
        RuntimeArg::Native => {
            let devs = quench_rt::native::list_devices().map_err(|e| e.to_string())?;
            let d = devs
                .into_iter()
                .find(|d| d.ordinal == ordinal)
                .ok_or_else(|| format!("no GPU with ordinal {ordinal}"))?;
            Ok(json!({
                "name": d.name,
                "architecture": d.architecture.to_string(),
                "memory_bytes": d.memory_bytes,
                "driver": d.driver_version,
                "runtime": "native",
            }))
        }
    }
}

/// An executor of its own on GPU `ordinal` through `runtime`.
pub fn executor(ordinal: u32, runtime: RuntimeArg) -> Result<Box<dyn Executor>, String> {
    Ok(match runtime {
        RuntimeArg::Cuda => {
            Box::new(CudaExecutor::new(ordinal).map_err(|e| format!("--backend cuda: {e}"))?)
        }
        RuntimeArg::Native => {
            Box::new(NativeExecutor::open(ordinal).map_err(|e| format!("--backend native: {e}"))?)
        }
    })
}
