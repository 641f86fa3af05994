//! Chrome trace / Perfetto JSON of dispatches and host spans.

use std::time::Instant;

use serde_json::{json, Value};

use crate::Dispatch;

/// A finished host-side span, in nanoseconds since its [`HostSpans`] began.
#[derive(Clone, Debug, PartialEq)]
pub struct HostSpan {
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Host-side spans (graph assembly, submission, sampling, ...) on one clock.
#[derive(Debug)]
pub struct HostSpans {
    origin: Instant,
    spans: Vec<HostSpan>,
}

/// An open host span; [`Span::end`] records it.
#[derive(Debug)]
pub struct Span {
    name: String,
    start: Instant,
}

impl Default for HostSpans {
    fn default() -> Self {
        HostSpans::new()
    }
}

impl HostSpans {
    pub fn new() -> HostSpans {
        HostSpans {
            origin: Instant::now(),
            spans: vec![],
        }
    }

    pub fn begin(&self, name: &str) -> Span {
        Span {
            name: name.to_string(),
            start: Instant::now(),
        }
    }

    /// Record a span given in nanoseconds since this collection began.
    pub fn push(&mut self, span: HostSpan) {
        self.spans.push(span);
    }

    /// Record a span between two instants.
    pub fn record(&mut self, name: &str, start: Instant, end: Instant) {
        let (start_ns, end_ns) = (self.since(start), self.since(end));
        self.spans.push(HostSpan {
            name: name.to_string(),
            start_ns,
            end_ns,
        });
    }

    pub fn spans(&self) -> &[HostSpan] {
        &self.spans
    }

    fn since(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_nanos() as u64
    }
}

impl Span {
    pub fn end(self, into: &mut HostSpans) {
        into.record(&self.name, self.start, Instant::now());
    }
}

const GPU_PID: u32 = 1;
const HOST_PID: u32 = 2;

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// The Chrome trace (`{"traceEvents": [...]}`, opens in ui.perfetto.dev): a "GPU"
/// process with a thread per stream holding the dispatches, and a "host" process with
/// the host spans. A dispatch's slice is named for its kernel; its arguments hold the
/// launches its record saw, the end-time lanes they raised and, where known, its label,
/// step, bytes and FLOPs. GPU times are shown from the earliest dispatch start; the GPU
/// clock and the host clock are not aligned with each other.
pub fn chrome_trace(dispatches: &[Dispatch], host: &HostSpans) -> Value {
    let origin = dispatches.iter().map(|d| d.start_ns).min().unwrap_or(0);
    let mut events = vec![
        json!({"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "args": {"name": "GPU"}}),
        json!({"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "host"}}),
    ];
    let mut streams: Vec<u32> = dispatches.iter().map(|d| d.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    for s in streams {
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": GPU_PID, "tid": s,
            "args": {"name": format!("stream {s}")}}),
        );
    }
    let mut gpu: Vec<&Dispatch> = dispatches.iter().collect();
    gpu.sort_by_key(|d| (d.stream, d.start_ns));
    for d in gpu {
        let mut args = json!({"launches": d.launches, "lanes_ended": d.lanes_ended});
        if !d.label.is_empty() {
            args["label"] = json!(d.label);
        }
        if let Some(step) = d.step {
            args["step"] = json!(step);
        }
        if d.bytes > 0 {
            args["bytes"] = json!(d.bytes);
        }
        if d.flops > 0 {
            args["flops"] = json!(d.flops);
        }
        events.push(
            json!({"ph": "X", "cat": "kernel", "name": d.kernel, "pid": GPU_PID, "tid": d.stream,
            "ts": us(d.start_ns - origin), "dur": us(d.duration_ns()), "args": args}),
        );
    }
    let mut spans: Vec<&HostSpan> = host.spans().iter().collect();
    spans.sort_by_key(|s| s.start_ns);
    for s in spans {
        events.push(
            json!({"ph": "X", "cat": "host", "name": s.name, "pid": HOST_PID, "tid": 0,
            "ts": us(s.start_ns), "dur": us(s.end_ns.saturating_sub(s.start_ns))}),
        );
    }
    json!({"traceEvents": events, "displayTimeUnit": "ns"})
}
