//! A reader for the Prometheus text exposition format (what a `/metrics` endpoint
//! serves): `# TYPE` lines and samples `name{label="value",...} value [timestamp]`.

use std::collections::BTreeMap;

/// The declared type of a metric family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

/// One sample line.
#[derive(Clone, Debug, PartialEq)]
pub struct PromSample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A parsed exposition: samples in the order served, and the declared family types.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exposition {
    pub samples: Vec<PromSample>,
    pub types: BTreeMap<String, MetricType>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("metrics line {line}: {reason}")]
pub struct PromError {
    pub line: usize,
    pub reason: String,
}

impl Exposition {
    /// The type of the family `sample_name` belongs to: histogram and summary series
    /// (`_bucket`, `_sum`, `_count`) belong to their base name.
    pub fn type_of(&self, sample_name: &str) -> MetricType {
        if let Some(t) = self.types.get(sample_name) {
            return *t;
        }
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = sample_name.strip_suffix(suffix) {
                if let Some(t @ (MetricType::Histogram | MetricType::Summary)) =
                    self.types.get(base)
                {
                    return *t;
                }
            }
        }
        MetricType::Untyped
    }
}

/// Parses exposition text; a malformed line is an error naming it.
pub fn parse(text: &str) -> Result<Exposition, PromError> {
    let mut out = Exposition::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let err = |reason: String| PromError {
            line: i + 1,
            reason,
        };
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_whitespace();
            if words.next() == Some("TYPE") {
                let name = words
                    .next()
                    .ok_or_else(|| err("TYPE without a metric name".into()))?;
                let kind = match words.next() {
                    Some("counter") => MetricType::Counter,
                    Some("gauge") => MetricType::Gauge,
                    Some("histogram") => MetricType::Histogram,
                    Some("summary") => MetricType::Summary,
                    Some("untyped") => MetricType::Untyped,
                    other => return Err(err(format!("unknown metric type {other:?}"))),
                };
                out.types.insert(name.to_string(), kind);
            }
            continue;
        }
        out.samples.push(parse_sample(line).map_err(err)?);
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<PromSample, String> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if !valid_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(body) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(body)?;
        labels = parsed;
        rest = after;
    }
    let mut fields = rest.split_whitespace();
    let value_text = fields
        .next()
        .ok_or_else(|| format!("{name} has no value"))?;
    let value =
        parse_value(value_text).ok_or_else(|| format!("{name} has a bad value {value_text:?}"))?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("{name} has a bad timestamp {ts:?}"))?;
    }
    if let Some(extra) = fields.next() {
        return Err(format!("{name} has trailing text {extra:?}"));
    }
    Ok(PromSample {
        name: name.to_string(),
        labels,
        value,
    })
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

type Labels = Vec<(String, String)>;

/// Labels up to the closing `}`; returns them and the text after it.
fn parse_labels(mut s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = s.find('=').ok_or("label without '='")?;
        let key = s[..eq].trim();
        if !valid_name(key) {
            return Err(format!("bad label name {key:?}"));
        }
        s = s[eq + 1..]
            .trim_start()
            .strip_prefix('"')
            .ok_or("label value without opening quote")?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let close = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                    Some((_, c)) => return Err(format!("bad escape \\{c} in label {key}")),
                    None => return Err(format!("unterminated label {key}")),
                },
                Some((_, c)) => value.push(c),
                None => return Err(format!("unterminated label {key}")),
            }
        };
        labels.push((key.to_string(), value));
        s = s[close + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err("labels not separated by ','".into());
        }
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}
