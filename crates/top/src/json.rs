//! The JSON form of a reading: one object per sample, named by `format`.

use serde::Serialize;

use crate::sample::{GpuSample, Snapshot};
use crate::server::ServerSample;

/// Names this JSON layout; it changes when a field changes meaning.
pub const FORMAT: &str = "quench.top.v1";

#[derive(Serialize)]
struct Report<'a> {
    format: &'static str,
    time_unix_ms: u64,
    driver_version: &'a Option<String>,
    nvml_version: &'a Option<String>,
    gpus: &'a [GpuSample],
    /// `null` when no server was named and none answers at the default URL.
    server: Option<&'a ServerSample>,
}

/// The reading as a JSON value.
pub fn report(snapshot: &Snapshot, server: Option<&ServerSample>) -> serde_json::Value {
    let r = Report {
        format: FORMAT,
        time_unix_ms: snapshot.time_unix_ms,
        driver_version: &snapshot.driver_version,
        nvml_version: &snapshot.nvml_version,
        gpus: &snapshot.gpus,
        server,
    };
    // Serialising plain structs of strings and numbers cannot fail; non-finite floats
    // (which JSON lacks) become null.
    serde_json::to_value(r).unwrap_or(serde_json::Value::Null)
}
