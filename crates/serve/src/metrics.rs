//! Counters, gauges and histograms, written in the Prometheus text format at `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Bucket upper bounds, in seconds, for time to first token.
const TTFT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Bucket upper bounds, in seconds, for the time between two tokens of one stream.
const ITL_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Bucket upper bounds, in seconds, for one structured-output token mask.
const MASK_BOUNDS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
];

/// A Prometheus histogram: counts per bucket, their sum and count.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    state: Mutex<HistogramState>,
}

#[derive(Debug, Default)]
struct HistogramState {
    /// Observations at or below each bound (not cumulative; summed when written).
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            state: Mutex::new(HistogramState {
                buckets: vec![0; bounds.len()],
                ..Default::default()
            }),
        }
    }

    pub fn observe(&self, seconds: f64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = self.bounds.iter().position(|&b| seconds <= b) {
            s.buckets[i] += 1;
        }
        s.sum += seconds;
        s.count += 1;
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&s.buckets) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", s.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", s.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", s.count);
    }
}

/// What one causal model's engine thread reports.
#[derive(Debug)]
pub struct EngineStats {
    /// Requests waiting to start (admission queue, preempted ones included).
    pub queued: AtomicUsize,
    pub running: AtomicUsize,
    pub kv_blocks_used: AtomicUsize,
    /// Blocks the prefix cache holds (given back whenever a request needs them).
    pub kv_blocks_cached: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens that a session's cache already held.
    pub cached_prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub preemptions: AtomicU64,
    /// Requests that started from the prefix cache, and those that found nothing there.
    pub prefix_hits: AtomicU64,
    pub prefix_misses: AtomicU64,
    pub ttft: Histogram,
    pub inter_token: Histogram,
    /// Computing and applying one token's `response_format` mask.
    pub grammar_mask: Histogram,
}

impl EngineStats {
    pub fn new(kv_blocks_total: usize) -> Self {
        EngineStats {
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            kv_blocks_used: AtomicUsize::new(0),
            kv_blocks_cached: AtomicUsize::new(0),
            kv_blocks_total: AtomicUsize::new(kv_blocks_total),
            prompt_tokens: AtomicU64::new(0),
            cached_prompt_tokens: AtomicU64::new(0),
            completion_tokens: AtomicU64::new(0),
            preemptions: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_misses: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            inter_token: Histogram::new(ITL_BOUNDS),
            grammar_mask: Histogram::new(MASK_BOUNDS),
        }
    }
}

/// Server-wide counters.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Finished requests by (route, status).
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub embedding_inputs: AtomicU64,
    pub embedding_tokens: AtomicU64,
    pub rejected_queue_full: AtomicU64,
    /// Requests received whose response has not been sent (or abandoned) yet.
    pub in_flight: AtomicUsize,
}

impl Metrics {
    pub fn count_request(&self, route: &str, status: u16) {
        let mut r = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *r.entry((route.to_owned(), status)).or_default() += 1;
    }

    /// The text exposition: server-wide metrics, then those of each causal model.
    pub fn render<'a>(
        &self,
        models: impl Iterator<Item = (&'a str, &'a EngineStats)>,
        sessions: usize,
    ) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "quench_requests_total",
            "counter",
            "HTTP requests answered, by route and status.",
        );
        for ((route, status), n) in self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "quench_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
            );
        }
        let simple: [(&str, &str, &str, u64); 5] = [
            (
                "quench_requests_in_flight",
                "gauge",
                "Requests being answered.",
                loadz(&self.in_flight) as u64,
            ),
            (
                "quench_rejected_queue_full_total",
                "counter",
                "Requests refused with 429 because the admission queue was full.",
                load(&self.rejected_queue_full),
            ),
            (
                "quench_embedding_inputs_total",
                "counter",
                "Texts embedded.",
                load(&self.embedding_inputs),
            ),
            (
                "quench_embedding_tokens_total",
                "counter",
                "Tokens of the texts embedded.",
                load(&self.embedding_tokens),
            ),
            (
                "quench_sessions",
                "gauge",
                "Sessions held.",
                sessions as u64,
            ),
        ];
        for (name, kind, help, value) in simple {
            header(&mut out, name, kind, help);
            let _ = writeln!(out, "{name} {value}");
        }
        let models: Vec<_> = models.collect();
        type Read = fn(&EngineStats) -> u64;
        let per_model: [(&str, &str, &str, Read); 11] = [
            (
                "quench_queue_depth",
                "gauge",
                "Requests waiting to start.",
                |s| loadz(&s.queued) as u64,
            ),
            (
                "quench_running_sequences",
                "gauge",
                "Sequences in the running batch.",
                |s| loadz(&s.running) as u64,
            ),
            (
                "quench_kv_blocks_used",
                "gauge",
                "KV cache blocks (16 positions each) held by running sequences and sessions.",
                |s| loadz(&s.kv_blocks_used) as u64,
            ),
            (
                "quench_kv_blocks_cached",
                "gauge",
                "KV cache blocks the prefix cache holds for later requests (evicted when needed).",
                |s| loadz(&s.kv_blocks_cached) as u64,
            ),
            (
                "quench_kv_blocks_total",
                "gauge",
                "KV cache blocks available (--kv-blocks).",
                |s| loadz(&s.kv_blocks_total) as u64,
            ),
            (
                "quench_prompt_tokens_total",
                "counter",
                "Prompt tokens of finished and running requests.",
                |s| load(&s.prompt_tokens),
            ),
            (
                "quench_cached_prompt_tokens_total",
                "counter",
                "Prompt tokens a session's cache or the prefix cache already held (not prefilled again).",
                |s| load(&s.cached_prompt_tokens),
            ),
            (
                "quench_prefix_cache_hits_total",
                "counter",
                "Requests that started from a prompt prefix the prefix cache held.",
                |s| load(&s.prefix_hits),
            ),
            (
                "quench_prefix_cache_misses_total",
                "counter",
                "Requests the prefix cache held no prefix of.",
                |s| load(&s.prefix_misses),
            ),
            (
                "quench_completion_tokens_total",
                "counter",
                "Tokens generated.",
                |s| load(&s.completion_tokens),
            ),
            (
                "quench_preemptions_total",
                "counter",
                "Sequences paused for lack of KV blocks and recomputed later.",
                |s| load(&s.preemptions),
            ),
        ];
        for (name, kind, help, read) in per_model {
            header(&mut out, name, kind, help);
            for (model, stats) in &models {
                let _ = writeln!(out, "{name}{{model=\"{model}\"}} {}", read(stats));
            }
        }
        type Get = fn(&EngineStats) -> &Histogram;
        let histograms: [(&str, &str, Get); 3] = [
            (
                "quench_time_to_first_token_seconds",
                "Time from a request's arrival to its first generated token.",
                |s| &s.ttft,
            ),
            (
                "quench_inter_token_latency_seconds",
                "Time between consecutive tokens of one request.",
                |s| &s.inter_token,
            ),
            (
                "quench_grammar_mask_seconds",
                "Time to compute and apply one token's response_format mask.",
                |s| &s.grammar_mask,
            ),
        ];
        for (name, help, get) in histograms {
            header(&mut out, name, "histogram", help);
            for (model, stats) in &models {
                get(stats).write(&mut out, name, &format!("model=\"{model}\""));
            }
        }
        out
    }
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn loadz(a: &AtomicUsize) -> usize {
    a.load(Ordering::Relaxed)
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.write(&mut out, "x", "m=\"a\"");
        assert!(out.contains("x_bucket{m=\"a\",le=\"0.1\"} 1\n"));
        assert!(out.contains("x_bucket{m=\"a\",le=\"1\"} 3\n"));
        assert!(out.contains("x_bucket{m=\"a\",le=\"+Inf\"} 4\n"));
        assert!(out.contains("x_count{m=\"a\"} 4\n"));
        assert!(out.contains("x_sum{m=\"a\"} 4.25\n"));
    }

    #[test]
    fn render_names_every_family() {
        let m = Metrics::default();
        m.count_request("/v1/models", 200);
        let stats = EngineStats::new(64);
        stats.ttft.observe(0.2);
        let text = m.render([("tiny", &stats)].into_iter(), 3);
        for needle in [
            "quench_requests_total{route=\"/v1/models\",status=\"200\"} 1",
            "quench_kv_blocks_total{model=\"tiny\"} 64",
            "quench_sessions 3",
            "quench_time_to_first_token_seconds_count{model=\"tiny\"} 1",
            "# TYPE quench_inter_token_latency_seconds histogram",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }
}
