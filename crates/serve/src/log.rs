//! Structured logs: one JSON object per line on standard error.
//!
//! Every request gets an id (sent back in `X-Request-Id`) and one line when its response
//! has been sent or abandoned: route, status, model, token counts and milliseconds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};

use crate::metrics::Metrics;

/// Writes one log line: time, level and message first, then `fields` (an object).
pub fn line(level: &str, message: &str, fields: Value) {
    let ts = chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string();
    let mut out = format!(
        "{{\"ts\":{},\"level\":{},\"msg\":{}",
        Value::from(ts),
        Value::from(level),
        Value::from(message)
    );
    if let Value::Object(extra) = fields {
        for (k, v) in extra {
            out.push_str(&format!(",{}:{v}", Value::from(k)));
        }
    }
    out.push('}');
    eprintln!("{out}");
}

/// Makes request ids: a random prefix per process and a counter.
#[derive(Debug)]
pub struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds {
            prefix: rand::random(),
            next: AtomicU64::new(1),
        }
    }
}

impl RequestIds {
    pub fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:08x}{n:06x}", self.prefix)
    }
}

#[derive(Debug, Default)]
struct Details {
    status: u16,
    model: Option<String>,
    session: Option<String>,
    prompt_tokens: Option<usize>,
    completion_tokens: Option<usize>,
    error: Option<String>,
    /// The client went away before its answer was finished.
    cancelled: bool,
}

/// One request's log line, written when the last reference to it is dropped (after the
/// response body has been sent, or the client went away).
#[derive(Debug)]
pub struct RequestLog {
    pub id: String,
    method: String,
    route: String,
    started: Instant,
    metrics: Arc<Metrics>,
    details: Mutex<Details>,
}

impl RequestLog {
    pub fn new(id: String, method: &str, route: String, metrics: Arc<Metrics>) -> Self {
        metrics.in_flight.fetch_add(1, Ordering::AcqRel);
        RequestLog {
            id,
            method: method.to_owned(),
            route,
            started: Instant::now(),
            metrics,
            details: Mutex::new(Details::default()),
        }
    }

    fn with(&self, f: impl FnOnce(&mut Details)) {
        f(&mut self.details.lock().unwrap_or_else(|e| e.into_inner()));
    }

    pub fn set_status(&self, status: u16) {
        self.with(|d| d.status = status);
    }

    pub fn set_model(&self, model: &str) {
        self.with(|d| d.model = Some(model.to_owned()));
    }

    pub fn set_session(&self, session: &str) {
        self.with(|d| d.session = Some(session.to_owned()));
    }

    pub fn set_tokens(&self, prompt: usize, completion: usize) {
        self.with(|d| {
            d.prompt_tokens = Some(prompt);
            d.completion_tokens = Some(completion);
        });
    }

    pub fn set_cancelled(&self) {
        self.with(|d| d.cancelled = true);
    }

    /// What went wrong, for a request that failed after its status was sent (a stream).
    pub fn set_error(&self, error: &str) {
        self.with(|d| d.error = Some(error.to_owned()));
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        let d = self.details.get_mut().unwrap_or_else(|e| e.into_inner());
        if d.status == 0 {
            // The client went away before the response began (nginx's "client closed request").
            d.status = 499;
            d.cancelled = true;
        }
        self.metrics.count_request(&self.route, d.status);
        self.metrics.in_flight.fetch_sub(1, Ordering::AcqRel);
        let level = if d.status >= 500 || d.error.is_some() {
            "error"
        } else {
            "info"
        };
        let mut fields = json!({
            "request_id": self.id,
            "method": self.method,
            "route": self.route,
            "status": d.status,
            "ms": (self.started.elapsed().as_secs_f64() * 1e4).round() / 10.0,
        });
        let extra = [
            ("model", d.model.take().map(Value::from)),
            ("session_id", d.session.take().map(Value::from)),
            ("prompt_tokens", d.prompt_tokens.map(Value::from)),
            ("completion_tokens", d.completion_tokens.map(Value::from)),
            ("error", d.error.take().map(Value::from)),
            ("cancelled", d.cancelled.then_some(Value::Bool(true))),
        ];
        for (key, value) in extra {
            if let Some(v) = value {
                fields[key] = v;
            }
        }
        line(level, "request", fields);
    }
}
