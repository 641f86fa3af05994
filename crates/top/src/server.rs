//! A quench server's `/metrics`, shown beside the GPU: every `quench_` series, with
//! counters turned into rates between two readings, and three headline figures.
//!
//! The headline figures are found by name, so they follow the server's metric names
//! without a fixed list:
//! - tokens/s: the summed rate of counters named `*completion_tokens*`,
//!   `*generated_tokens*` or `*output_tokens*` (and prompt tokens/s likewise from
//!   `*prompt_tokens*` or `*input_tokens*`), leaving out `cached` ones;
//! - queue depth: the gauges whose name contains `queue` (summed over labels);
//! - KV blocks: gauges whose name contains `kv` and `block`, split into used
//!   (`used`, `in_use`, `active`) and total (`total`, `capacity`).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::Serialize;

use crate::http;
use crate::prom::{self, Exposition, MetricType};

/// The URL tried when the user names none; silence when nothing answers there.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080/metrics";
const PREFIX: &str = "quench_";
const GENERATED_TOKENS: &[&str] = &["completion_tokens", "generated_tokens", "output_tokens"];
const PROMPT_TOKENS: &[&str] = &["prompt_tokens", "input_tokens"];

/// The server's state at one reading.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServerSample {
    pub url: String,
    /// Why the metrics could not be read; the other fields are empty then.
    pub error: Option<String>,
    /// Generated tokens per second.
    pub tokens_per_s: Option<f64>,
    /// Prompt tokens processed per second.
    pub prompt_tokens_per_s: Option<f64>,
    pub queue_depth: Option<f64>,
    pub kv_blocks_used: Option<f64>,
    pub kv_blocks_total: Option<f64>,
    pub metrics: Vec<ServerMetric>,
}

/// One `quench_` series.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServerMetric {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// `counter`, `gauge`, or `histogram`/`summary` for their `_sum` and `_count`.
    pub kind: &'static str,
    /// For all but gauges: the increase per second over the last few seconds
    /// ([`RATE_WINDOW_MS`]), or since the previous reading when that is older.
    pub rate_per_s: Option<f64>,
}

/// How far back counter rates reach, so that a burst of tokens between two quick
/// refreshes does not swing the figure from zero to its peak.
pub const RATE_WINDOW_MS: u64 = 5_000;

/// Turns successive expositions into samples, remembering counters for rates.
#[derive(Debug, Default)]
pub struct ServerTracker {
    /// Earlier readings' counters, oldest first, reaching back about RATE_WINDOW_MS.
    earlier: VecDeque<(u64, HashMap<String, f64>)>,
}

impl ServerTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// The sample for `exposition` read at `time_unix_ms`.
    pub fn observe(
        &mut self,
        url: &str,
        time_unix_ms: u64,
        exposition: &Exposition,
    ) -> ServerSample {
        let mut series = Vec::new();
        for s in exposition
            .samples
            .iter()
            .filter(|s| s.name.starts_with(PREFIX))
        {
            // Buckets and quantiles are too many to show; their _sum and _count stay.
            if s.name.ends_with("_bucket") || s.labels.iter().any(|(k, _)| k == "quantile") {
                continue;
            }
            let kind = match exposition.type_of(&s.name) {
                MetricType::Counter => "counter",
                MetricType::Gauge => "gauge",
                MetricType::Histogram => "histogram",
                MetricType::Summary => "summary",
                MetricType::Untyped if s.name.ends_with("_total") => "counter",
                MetricType::Untyped => "gauge",
            };
            series.push((s, kind, series_key(&s.name, &s.labels)));
        }
        // Counters and the _sum/_count series of histograms and summaries only grow.
        let counters: HashMap<String, f64> = series
            .iter()
            .filter(|(_, kind, _)| *kind != "gauge")
            .map(|(s, _, key)| (key.clone(), s.value))
            .collect();
        self.forget_before(time_unix_ms, &counters);
        let metrics: Vec<ServerMetric> = series
            .into_iter()
            .map(|(s, kind, key)| ServerMetric {
                name: s.name.clone(),
                labels: s.labels.clone(),
                kind,
                value: s.value,
                rate_per_s: counters
                    .get(&key)
                    .and_then(|&v| self.rate(&key, v, time_unix_ms)),
            })
            .collect();
        self.earlier.push_back((time_unix_ms, counters));
        ServerSample {
            url: url.to_string(),
            error: None,
            tokens_per_s: counter_rate(&metrics, GENERATED_TOKENS),
            prompt_tokens_per_s: counter_rate(&metrics, PROMPT_TOKENS),
            queue_depth: gauge_sum(&metrics, |n| n.contains("queue")),
            kv_blocks_used: gauge_sum(&metrics, |n| {
                is_kv_blocks(n) && ["used", "in_use", "active"].iter().any(|w| n.contains(w))
            }),
            kv_blocks_total: gauge_sum(&metrics, |n| {
                is_kv_blocks(n) && ["total", "capacity"].iter().any(|w| n.contains(w))
            }),
            metrics,
        }
    }

    /// Drops readings older than the rate window (keeping the latest one), and all of
    /// them when a counter went down: the server restarted, and rates across a
    /// restart mean nothing.
    fn forget_before(&mut self, time_unix_ms: u64, counters: &HashMap<String, f64>) {
        let reset = self.earlier.back().is_some_and(|(_, last)| {
            counters
                .iter()
                .any(|(k, v)| last.get(k).is_some_and(|old| v < old))
        });
        if reset {
            self.earlier.clear();
        }
        let oldest = time_unix_ms.saturating_sub(RATE_WINDOW_MS);
        while self.earlier.len() > 1 && self.earlier.front().is_some_and(|&(t, _)| t < oldest) {
            self.earlier.pop_front();
        }
    }

    fn rate(&self, key: &str, value: f64, time_unix_ms: u64) -> Option<f64> {
        let (t0, old) = self.earlier.front()?;
        let old = *old.get(key)?;
        let dt = time_unix_ms.checked_sub(*t0).filter(|&d| d > 0)? as f64 / 1000.0;
        Some((value - old) / dt)
    }
}

fn series_key(name: &str, labels: &[(String, String)]) -> String {
    let mut key = name.to_string();
    for (k, v) in labels {
        key.push_str(&format!("|{k}={v}"));
    }
    key
}

fn is_kv_blocks(name: &str) -> bool {
    name.contains("kv") && name.contains("block")
}

/// The summed rate of the counters whose name contains one of `words`, leaving out
/// `cached` ones (tokens served from a session's cache, not processed); `None` when
/// no counter matches or one has no rate yet.
fn counter_rate(metrics: &[ServerMetric], words: &[&str]) -> Option<f64> {
    let picked: Vec<&ServerMetric> = metrics
        .iter()
        .filter(|m| {
            m.kind == "counter"
                && words.iter().any(|w| m.name.contains(w))
                && !m.name.contains("cached")
        })
        .collect();
    if picked.is_empty() {
        return None;
    }
    picked.iter().map(|m| m.rate_per_s).sum()
}

fn gauge_sum(metrics: &[ServerMetric], pick: impl Fn(&str) -> bool) -> Option<f64> {
    let mut picked = metrics
        .iter()
        .filter(|m| m.kind == "gauge" && pick(&m.name))
        .peekable();
    picked.peek()?;
    Some(picked.map(|m| m.value).sum())
}

/// Fetches a server's metrics on each call, feeding a tracker.
pub struct ServerPoller {
    url: String,
    /// Whether the user named the URL: if not, a server that is not there is no news.
    explicit: bool,
    timeout: Duration,
    tracker: ServerTracker,
}

impl ServerPoller {
    pub fn new(url: Option<&str>) -> Self {
        ServerPoller {
            url: url.unwrap_or(DEFAULT_URL).to_string(),
            explicit: url.is_some(),
            timeout: Duration::from_millis(250),
            tracker: ServerTracker::new(),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The server's state now; `None` when no URL was named and nothing quench-like
    /// answers at the default one.
    pub fn poll(&mut self, time_unix_ms: u64) -> Option<ServerSample> {
        let read = http::get(&self.url, self.timeout)
            .map_err(|e| e.to_string())
            .and_then(|body| prom::parse(&body).map_err(|e| e.to_string()));
        let failed = |error: String| ServerSample {
            url: self.url.clone(),
            error: Some(error),
            tokens_per_s: None,
            prompt_tokens_per_s: None,
            queue_depth: None,
            kv_blocks_used: None,
            kv_blocks_total: None,
            metrics: Vec::new(),
        };
        match read {
            Ok(exposition) => {
                let sample = self.tracker.observe(&self.url, time_unix_ms, &exposition);
                if !sample.metrics.is_empty() {
                    Some(sample)
                } else if self.explicit {
                    Some(failed(format!("{} serves no quench_ metrics", self.url)))
                } else {
                    None
                }
            }
            Err(e) => self.explicit.then(|| failed(e)),
        }
    }
}
