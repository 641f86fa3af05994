//! Time per kernel over a set of dispatches, with the bandwidth and FLOP/s they achieved
//! against the ceilings measured in the same run.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::Dispatch;

/// The machine's limits, as measured in the same run (absent where not measured).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ceilings {
    /// Device-to-device copy bandwidth, bytes read plus bytes written per second.
    pub copy_bytes_per_s: Option<f64>,
    /// f32 FMA throughput, FLOP/s.
    pub flops: Option<f64>,
}

/// One kernel's dispatches, summarized. Times in nanoseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    pub kernel: String,
    pub calls: usize,
    pub total_ns: u64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    /// This kernel's share of the step time ([`Summary::step_ns`]), in [0, 1].
    pub share: f64,
    /// Bytes read and written over all calls (0: not modeled).
    pub bytes: u64,
    /// Floating-point operations over all calls (0: not modeled).
    pub flops: u64,
}

impl SummaryRow {
    /// Bytes moved per second of kernel time, where bytes are modeled.
    pub fn bytes_per_s(&self) -> Option<f64> {
        (self.bytes > 0 && self.total_ns > 0)
            .then(|| self.bytes as f64 / (self.total_ns as f64 * 1e-9))
    }

    /// FLOP/s over the kernel's time, where FLOPs are modeled.
    pub fn flops_per_s(&self) -> Option<f64> {
        (self.flops > 0 && self.total_ns > 0)
            .then(|| self.flops as f64 / (self.total_ns as f64 * 1e-9))
    }
}

/// Rows per kernel and the time they share.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Most total time first (ties by name).
    pub rows: Vec<SummaryRow>,
    /// Distinct steps among the dispatches.
    pub steps: usize,
    /// Step time: for each step, from its first dispatch's start to its last one's end,
    /// summed; a dispatch outside any step adds its own duration.
    pub step_ns: u64,
    /// Summed dispatch durations (`step_ns` minus this: gaps between dispatches).
    pub busy_ns: u64,
}

/// The nearest-rank percentile `p` (0..=100) of sorted, non-empty `xs`.
fn percentile(xs: &[u64], p: u32) -> u64 {
    let rank = (p as usize * xs.len()).div_ceil(100).max(1);
    xs[rank.min(xs.len()) - 1]
}

/// Step time as [`Summary::step_ns`] defines it.
fn step_time(dispatches: &[Dispatch]) -> (usize, u64) {
    let mut spans: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    let mut outside = 0;
    for d in dispatches {
        match d.step {
            Some(s) => {
                let span = spans.entry(s).or_insert((d.start_ns, d.end_ns));
                span.0 = span.0.min(d.start_ns);
                span.1 = span.1.max(d.end_ns);
            }
            None => outside += d.duration_ns(),
        }
    }
    (
        spans.len(),
        outside
            + spans
                .values()
                .map(|(a, b)| b.saturating_sub(*a))
                .sum::<u64>(),
    )
}

/// Summarize `dispatches` per kernel.
pub fn summarize(dispatches: &[Dispatch]) -> Summary {
    let mut per: BTreeMap<&str, Vec<&Dispatch>> = BTreeMap::new();
    for d in dispatches {
        per.entry(d.kernel.as_str()).or_default().push(d);
    }
    let (steps, step_ns) = step_time(dispatches);
    let mut rows: Vec<SummaryRow> = per
        .into_iter()
        .map(|(k, ds)| {
            let mut t: Vec<u64> = ds.iter().map(|d| d.duration_ns()).collect();
            t.sort_unstable();
            let total: u64 = t.iter().sum();
            SummaryRow {
                kernel: k.to_string(),
                calls: t.len(),
                total_ns: total,
                mean_ns: total as f64 / t.len() as f64,
                p50_ns: percentile(&t, 50),
                p90_ns: percentile(&t, 90),
                share: if step_ns == 0 {
                    0.0
                } else {
                    total as f64 / step_ns as f64
                },
                bytes: ds.iter().map(|d| d.bytes).sum(),
                flops: ds.iter().map(|d| d.flops).sum(),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.total_ns
            .cmp(&a.total_ns)
            .then_with(|| a.kernel.cmp(&b.kernel))
    });
    let busy_ns = rows.iter().map(|r| r.total_ns).sum();
    Summary {
        rows,
        steps,
        step_ns,
        busy_ns,
    }
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("-".to_string(), |x| format!("{x:.digits$}"))
}

/// The summary as a text table, times in microseconds, bandwidth in GB/s (10^9 bytes)
/// and as a percentage of the copy ceiling, FLOP/s in GFLOP/s.
pub fn render(s: &Summary, ceilings: &Ceilings) -> String {
    let w = s
        .rows
        .iter()
        .map(|r| r.kernel.len())
        .max()
        .unwrap_or(0)
        .max("kernel".len());
    let mut out = format!(
        "{:<w$}  {:>6}  {:>12}  {:>10}  {:>10}  {:>10}  {:>6}  {:>8}  {:>6}  {:>9}\n",
        "kernel",
        "calls",
        "total µs",
        "mean µs",
        "p50 µs",
        "p90 µs",
        "share",
        "GB/s",
        "% copy",
        "GFLOP/s"
    );
    for r in &s.rows {
        let bw = r.bytes_per_s();
        let of_copy = bw
            .zip(ceilings.copy_bytes_per_s)
            .map(|(b, c)| 100.0 * b / c);
        out += &format!(
            "{:<w$}  {:>6}  {:>12.3}  {:>10.3}  {:>10.3}  {:>10.3}  {:>5.1}%  {:>8}  {:>6}  {:>9}\n",
            r.kernel,
            r.calls,
            r.total_ns as f64 / 1e3,
            r.mean_ns / 1e3,
            r.p50_ns as f64 / 1e3,
            r.p90_ns as f64 / 1e3,
            r.share * 100.0,
            opt(bw.map(|b| b / 1e9), 1),
            opt(of_copy, 1),
            opt(r.flops_per_s().map(|f| f / 1e9), 1),
        );
    }
    if s.steps > 0 && s.step_ns > 0 {
        out += &format!(
            "{} steps, {:.3} µs of step time: kernels busy {:.1}% of it, the rest between dispatches\n",
            s.steps,
            s.step_ns as f64 / 1e3,
            100.0 * s.busy_ns as f64 / s.step_ns as f64
        );
    }
    out
}

/// The summary as JSON (times in nanoseconds, rates per second).
pub fn to_json(s: &Summary, ceilings: &Ceilings) -> Value {
    let rows: Vec<Value> = s
        .rows
        .iter()
        .map(|r| {
            json!({
                "kernel": r.kernel, "calls": r.calls, "total_ns": r.total_ns, "mean_ns": r.mean_ns,
                "p50_ns": r.p50_ns, "p90_ns": r.p90_ns, "share_of_step_time": r.share,
                "bytes": r.bytes, "flops": r.flops,
                "bytes_per_s": r.bytes_per_s(), "flops_per_s": r.flops_per_s(),
                "fraction_of_copy_bandwidth": r.bytes_per_s().zip(ceilings.copy_bytes_per_s).map(|(b, c)| b / c),
            })
        })
        .collect();
    json!({
        "steps": s.steps, "step_ns": s.step_ns, "busy_ns": s.busy_ns,
        "ceilings": {"copy_bytes_per_s": ceilings.copy_bytes_per_s, "flops": ceilings.flops},
        "kernels": rows,
    })
}
