//! Time per kernel over a set of dispatches.

use crate::Dispatch;

/// One kernel's dispatches, summarized. Times in nanoseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryRow {
    pub kernel: String,
    pub calls: usize,
    pub total_ns: u64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    /// This kernel's share of the summed time of all dispatches, in [0, 1].
    pub share: f64,
}

/// The nearest-rank percentile `p` (0..=100) of sorted, non-empty `xs`.
fn percentile(xs: &[u64], p: u32) -> u64 {
    let rank = (p as usize * xs.len()).div_ceil(100).max(1);
    xs[rank.min(xs.len()) - 1]
}

/// Rows per kernel, most total time first (ties by name).
pub fn summarize(dispatches: &[Dispatch]) -> Vec<SummaryRow> {
    let mut kernels: Vec<&str> = dispatches.iter().map(|d| d.kernel.as_str()).collect();
    kernels.sort_unstable();
    kernels.dedup();
    let all: u64 = dispatches.iter().map(Dispatch::duration_ns).sum();
    let mut rows: Vec<SummaryRow> = kernels
        .into_iter()
        .map(|k| {
            let mut t: Vec<u64> = dispatches.iter().filter(|d| d.kernel == k).map(Dispatch::duration_ns).collect();
            t.sort_unstable();
            let total: u64 = t.iter().sum();
            SummaryRow {
                kernel: k.to_string(),
                calls: t.len(),
                total_ns: total,
                mean_ns: total as f64 / t.len() as f64,
                p50_ns: percentile(&t, 50),
                p90_ns: percentile(&t, 90),
                share: if all == 0 { 0.0 } else { total as f64 / all as f64 },
            }
        })
        .collect();
    rows.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then_with(|| a.kernel.cmp(&b.kernel)));
    rows
}

/// The rows as a text table, times in microseconds.
pub fn render(rows: &[SummaryRow]) -> String {
    let w = rows.iter().map(|r| r.kernel.len()).max().unwrap_or(0).max("kernel".len());
    let mut s = format!(
        "{:<w$}  {:>6}  {:>12}  {:>10}  {:>10}  {:>10}  {:>6}\n",
        "kernel", "calls", "total µs", "mean µs", "p50 µs", "p90 µs", "share"
    );
    for r in rows {
        s += &format!(
            "{:<w$}  {:>6}  {:>12.3}  {:>10.3}  {:>10.3}  {:>10.3}  {:>5.1}%\n",
            r.kernel,
            r.calls,
            r.total_ns as f64 / 1e3,
            r.mean_ns / 1e3,
            r.p50_ns as f64 / 1e3,
            r.p90_ns as f64 / 1e3,
            r.share * 100.0
        );
    }
    s
}
