//! Receipts: JSON records of what was run, on what, against which bound, and what
//! came out (failures included).

use std::path::Path;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const FORMAT: &str = "quench.receipt.v1";

pub fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 of the file at `path`, read a piece at a time (a model file is not held whole).
pub fn sha256_file(path: &Path) -> Result<String, String> {
    use std::io::Read;
    let mut file =
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The process's peak resident memory so far (Linux's VmHWM), in bytes; `None` elsewhere.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// SHA-256 of the running binary, or a note saying why it could not be read.
fn binary_sha256() -> String {
    match std::env::current_exe().and_then(std::fs::read) {
        Ok(bytes) => sha256_hex(&bytes),
        Err(e) => format!("unreadable: {e}"),
    }
}

/// A receipt of `kind` with the device it ran on, the inputs (hashes, seeds), the bound
/// fixed before the run and the outcome.
pub fn receipt(kind: &str, device: Value, inputs: Value, bound: Value, outcome: Value) -> Value {
    json!({
        "format": FORMAT,
        "kind": kind,
        "date": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "git_commit": env!("QUENCH_GIT_COMMIT"),
        "git_dirty": env!("QUENCH_GIT_DIRTY") == "true",
        "binary_sha256": binary_sha256(),
        "quench_version": env!("CARGO_PKG_VERSION"),
        "device": device,
        "inputs": inputs,
        "bound": bound,
        "outcome": outcome,
    })
}

/// Write pretty JSON to `path`, creating its folder; a file is replaced only once the
/// new one is complete.
pub fn write_json(path: &Path, v: &Value) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(v).map_err(|e| e.to_string())? + "\n";
    let tmp = path.with_extension("json.partial");
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Prints `v` as pretty JSON on stdout.
pub fn print_json(v: &Value) -> Result<(), String> {
    println!(
        "{}",
        serde_json::to_string_pretty(v).map_err(|e| e.to_string())?
    );
    Ok(())
}
