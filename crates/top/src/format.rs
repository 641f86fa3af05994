//! Readings as people read them: binary byte units, watts, MHz; "n/a" where the
//! driver exposes nothing.

pub const NA: &str = "n/a";

const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

/// `bytes` in the largest binary unit that keeps the number at or above 1.
pub fn bytes(bytes: u64) -> String {
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

pub fn rate(bytes_per_s: Option<u64>) -> String {
    bytes_per_s.map_or(NA.to_string(), |b| format!("{}/s", bytes(b)))
}

pub fn opt<T: std::fmt::Display>(v: Option<T>, unit: &str) -> String {
    v.map_or(NA.to_string(), |v| format!("{v} {unit}"))
}

pub fn watts(w: Option<f64>) -> String {
    w.map_or(NA.to_string(), |w| format!("{w:.1} W"))
}

pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// A plain number with up to one decimal, for metrics whose unit the name carries.
pub fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A duration in seconds with at most two decimals and no trailing zeros: 1, 0.5, 0.05.
pub fn seconds(d: std::time::Duration) -> String {
    let text = format!("{:.2}", d.as_secs_f64());
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}
