//! The GPU a command runs on, described for receipts.

use serde_json::{json, Value};

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
