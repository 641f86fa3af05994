//! The Prometheus text reader.

mod common;

use quench_top::prom::{parse, MetricType, PromSample};
use rand::Rng;

#[test]
fn reads_a_typical_exposition() {
    let text = "# HELP quench_requests_total HTTP requests answered.\n\
                # TYPE quench_requests_total counter\n\
                quench_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 17\n\
                quench_requests_total{route=\"/v1/models\",status=\"404\"} 2 1700000000000\n\
                \n\
                # TYPE quench_ttft_seconds histogram\n\
                quench_ttft_seconds_bucket{model=\"m\",le=\"0.5\"} 3\n\
                quench_ttft_seconds_bucket{model=\"m\",le=\"+Inf\"} 4\n\
                quench_ttft_seconds_sum{model=\"m\"} 1.25\n\
                quench_ttft_seconds_count{model=\"m\"} 4\n\
                # a comment\n\
                weird_label{msg=\"say \\\"hi\\\"\\nback\\\\slash\",} -Inf\n\
                quench_nan NaN\n";
    let e = parse(text).expect("parses");
    assert_eq!(e.samples.len(), 8);
    assert_eq!(
        e.samples[0],
        PromSample {
            name: "quench_requests_total".into(),
            labels: vec![
                ("route".into(), "/v1/chat/completions".into()),
                ("status".into(), "200".into())
            ],
            value: 17.0,
        }
    );
    assert_eq!(e.samples[1].value, 2.0);
    assert_eq!(e.samples[3].labels[1], ("le".into(), "+Inf".into()));
    assert_eq!(
        e.samples[6].labels,
        vec![("msg".into(), "say \"hi\"\nback\\slash".into())]
    );
    assert_eq!(e.samples[6].value, f64::NEG_INFINITY);
    assert!(e.samples[7].value.is_nan());
    assert_eq!(e.type_of("quench_requests_total"), MetricType::Counter);
    assert_eq!(e.type_of("quench_ttft_seconds_sum"), MetricType::Histogram);
    assert_eq!(
        e.type_of("quench_ttft_seconds_bucket"),
        MetricType::Histogram
    );
    assert_eq!(e.type_of("quench_nan"), MetricType::Untyped);
}

#[test]
fn malformed_lines_are_named() {
    for (text, line, what) in [
        ("ok 1\nbad{a=\"x\" 2\n", 2, "not separated"),
        ("a{b=\"x} 1\n", 1, "unterminated"),
        ("9name 1\n", 1, "bad metric name"),
        ("a{b=c} 1\n", 1, "opening quote"),
        ("a 1 2 3\n", 1, "trailing"),
        ("a one\n", 1, "bad value"),
        ("a\n", 1, "no value"),
        ("a 1 later\n", 1, "bad timestamp"),
        ("# TYPE a meter\n", 1, "unknown metric type"),
        ("a{b=\"\\q\"} 1\n", 1, "bad escape"),
    ] {
        let err = parse(text).expect_err(text);
        assert_eq!(err.line, line, "{text:?}: {err}");
        assert!(err.to_string().contains(what), "{text:?}: {err}");
    }
}

/// Random metrics written in the text format and read back: every name, label and
/// value as written.
#[test]
fn random_expositions_read_back_exactly() {
    let mut rng = common::rng("random_expositions_read_back_exactly");
    let alphabet: Vec<char> = "ab_:Z9\"\\\n é{},=".chars().collect();
    for _ in 0..50 {
        let n = rng.gen_range(1..30);
        let mut expected = Vec::new();
        let mut text = String::new();
        for i in 0..n {
            let name = format!("quench_m{i}_{}", rng.gen_range(0..1000));
            let nlabels = rng.gen_range(0..4);
            let labels: Vec<(String, String)> = (0..nlabels)
                .map(|j| {
                    let len = rng.gen_range(0..12);
                    let v: String = (0..len)
                        .map(|_| alphabet[rng.gen_range(0..alphabet.len())])
                        .collect();
                    (format!("l{j}"), v)
                })
                .collect();
            let value: f64 = match rng.gen_range(0..4) {
                0 => rng.gen_range(0u64..1 << 53) as f64,
                1 => rng.gen_range(-1e9..1e9),
                2 => rng.gen::<f64>() * 1e-12,
                _ => -(rng.gen_range(0..100) as f64),
            };
            text.push_str(&name);
            if !labels.is_empty() {
                let body: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| {
                        format!(
                            "{k}=\"{}\"",
                            v.replace('\\', "\\\\")
                                .replace('"', "\\\"")
                                .replace('\n', "\\n")
                        )
                    })
                    .collect();
                text.push_str(&format!("{{{}}}", body.join(",")));
            }
            text.push_str(&format!(" {value:e}\n"));
            expected.push(PromSample {
                name,
                labels,
                value,
            });
        }
        let got = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(got.samples, expected, "{text}");
    }
}
