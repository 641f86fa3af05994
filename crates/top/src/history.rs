//! The last 60 seconds of a reading, for the history graphs.

use std::collections::VecDeque;

use crate::sample::GpuSample;

/// How far back the graphs reach.
pub const WINDOW_MS: u64 = 60_000;

/// Timed values of one reading over the last [`WINDOW_MS`]. A reading that was not
/// available is kept as `None`, so the graph shows a gap there.
#[derive(Clone, Debug, Default)]
pub struct Series {
    points: VecDeque<(u64, Option<f64>)>,
}

impl Series {
    pub fn push(&mut self, time_unix_ms: u64, value: Option<f64>) {
        self.points
            .push_back((time_unix_ms, value.filter(|v| v.is_finite())));
        // Keep one point older than the window: it holds the value at the window's start.
        let oldest = time_unix_ms.saturating_sub(WINDOW_MS);
        while self.points.get(1).is_some_and(|&(t, _)| t <= oldest) {
            self.points.pop_front();
        }
    }

    pub fn max(&self) -> Option<f64> {
        self.points.iter().filter_map(|&(_, v)| v).reduce(f64::max)
    }

    /// The window ending at `now_ms` cut into `n` equal slots, oldest first. A slot
    /// holds the largest value read in it; a slot no reading fell in holds the reading
    /// before it (a reading stands until the next), and `None` before the first
    /// reading or after one that was not available.
    pub fn buckets(&self, now_ms: u64, n: usize) -> Vec<Option<f64>> {
        let mut out = vec![None; n];
        let start = now_ms.saturating_sub(WINDOW_MS);
        let span = u128::from(now_ms - start);
        let mut points = self.points.iter().filter(|&&(t, _)| t <= now_ms).peekable();
        let mut held: Option<f64> = None;
        for (i, cell) in out.iter_mut().enumerate() {
            let end = if i + 1 == n {
                now_ms + 1
            } else {
                start + (span * (i as u128 + 1) / n as u128) as u64
            };
            let mut read_here = false;
            let mut best: Option<f64> = None;
            while let Some(&&(t, v)) = points.peek() {
                if t >= end {
                    break;
                }
                points.next();
                held = v;
                if t >= start {
                    read_here = true;
                    best = match (best, v) {
                        (Some(b), Some(v)) => Some(b.max(v)),
                        (b, v) => b.or(v),
                    };
                }
            }
            *cell = if read_here { best } else { held };
        }
        out
    }
}

/// The graphed readings of one GPU.
#[derive(Clone, Debug, Default)]
pub struct GpuHistory {
    pub utilization_gpu_percent: Series,
    pub memory_used_bytes: Series,
    pub power_draw_watts: Series,
}

impl GpuHistory {
    pub fn push(&mut self, time_unix_ms: u64, g: &GpuSample) {
        self.utilization_gpu_percent
            .push(time_unix_ms, g.utilization_gpu_percent.map(f64::from));
        self.memory_used_bytes
            .push(time_unix_ms, g.memory_used_bytes.map(|b| b as f64));
        self.power_draw_watts.push(time_unix_ms, g.power_draw_watts);
    }
}
