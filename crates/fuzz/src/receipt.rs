//! The receipt of a fuzz run: what ran (targets, inputs, seed), on what (CPU, cores, git
//! commit and whether the tree was dirty, the binary's hash), the bound fixed before the
//! run, and per target what came out: inputs tried, panics, slow inputs, the slowest input
//! and the peak resident memory of the process that ran it.

use std::process::Command;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::driver::{FailureKind, Report};

pub const FORMAT: &str = "quench.receipt.v1";

/// Peak resident memory of this process (`VmHWM`), in KiB; 0 where /proc is missing.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Threads of this process now (`Threads` in /proc): beyond the main thread and the
/// watchdog, these are chat template renders stopped for good (see quench-text's
/// `render_budget`), each holding at most twice its memory budget.
pub fn threads() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// One target's outcome as the receipt holds it.
pub fn report_json(report: &Report, peak_rss_kib: u64) -> Value {
    let failures: Vec<Value> = report
        .failures
        .iter()
        .map(|f| {
            let (kind, detail) = match &f.kind {
                FailureKind::Panic(m) => ("panic", m.clone()),
                FailureKind::Slow(d) => ("slow", format!("{:.3} s", d.as_secs_f64())),
            };
            json!({
                "input": f.index,
                "kind": kind,
                "detail": detail,
                "reproducer": f.file.as_ref().map(|p| p.display().to_string()),
            })
        })
        .collect();
    let count = |kind: &str| failures.iter().filter(|f| f["kind"] == kind).count();
    json!({
        "target": report.target,
        "seed": report.seed,
        "inputs": report.inputs,
        "accepted": report.accepted,
        "refused": report.refused,
        "distinct_outcomes": report.outcomes,
        "top_outcomes": report.top_outcomes.iter().map(|(s, n)| json!([s, n])).collect::<Vec<_>>(),
        "seconds": report.seconds,
        "inputs_per_s": report.inputs as f64 / report.seconds.max(1e-9),
        "panics": count("panic"),
        "slow_inputs": count("slow"),
        "slowest_input": {
            "input": report.slowest.index,
            "seconds": report.slowest.seconds,
            "bytes": report.slowest.bytes,
        },
        "peak_rss_kib": peak_rss_kib,
        "threads_at_end": threads(),
        "failures": failures,
    })
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn device() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    json!({
        "kind": "cpu",
        "cpu": cpu,
        "logical_cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "os": std::env::consts::OS,
    })
}

/// The checkout a run starts from: its commit and whether tracked files differ from it.
/// Read before the run, since the tree may change while it goes on.
#[derive(Clone, Debug)]
pub struct Checkout {
    pub commit: String,
    pub dirty: bool,
}

impl Checkout {
    pub fn now() -> Checkout {
        Checkout {
            commit: git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned()),
            dirty: git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty()),
        }
    }
}

/// The settings of the run a receipt records.
pub struct RunSettings {
    pub checkout: Checkout,
    pub iterations: u64,
    pub seed: u64,
    pub jobs: usize,
    pub slow_s: f64,
    pub hang_s: f64,
    pub max_rss_kib: u64,
    pub wall_s: f64,
}

/// The whole receipt; `passed` is whether every target met the bound.
pub fn receipt(settings: &RunSettings, targets: &[Value]) -> (Value, bool) {
    let passed = targets.iter().all(|t| {
        t["panics"] == 0
            && t["slow_inputs"] == 0
            && t["inputs"].as_u64() == Some(settings.iterations)
            && t["peak_rss_kib"]
                .as_u64()
                .is_some_and(|k| k <= settings.max_rss_kib)
    });
    let binary = std::env::current_exe()
        .and_then(std::fs::read)
        .map_or_else(|e| format!("unreadable: {e}"), |b| sha256_hex(&b));
    let receipt = json!({
        "format": FORMAT,
        "kind": "fuzz",
        "date": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "git_commit": settings.checkout.commit,
        "git_dirty": settings.checkout.dirty,
        "binary_sha256": binary,
        "quench_version": env!("CARGO_PKG_VERSION"),
        "device": device(),
        "inputs": {
            "targets": targets.iter().map(|t| t["target"].clone()).collect::<Vec<_>>(),
            "inputs_per_target": settings.iterations,
            "seed": settings.seed,
            "mutator": "quench-fuzz: SplitMix64 per input (seed, index); seeds built in code; bit flips, boundary integers, boundary decimals, inserts, deletes, duplicates, splices, dictionary tokens; inputs reaching a new outcome join the corpus",
            "parallel_jobs": settings.jobs,
        },
        "bound": format!(
            "fixed before the run: per target, every input returns Ok or Err (0 panics), none takes over {} s (none still running after {} s: a hang ends the run), peak RSS of the target's process ≤ {} MiB",
            settings.slow_s, settings.hang_s, settings.max_rss_kib / 1024
        ),
        "outcome": {
            "passed": passed,
            "wall_seconds": settings.wall_s,
            "targets": targets,
        },
    });
    (receipt, passed)
}
