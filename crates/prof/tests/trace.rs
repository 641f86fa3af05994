//! The Chrome trace and the summary table over deterministic dispatch lists.

use quench_prof::summary::{render, to_json};
use quench_prof::{chrome_trace, summarize, Ceilings, Dispatch, HostSpan, HostSpans};

fn d(kernel: &str, stream: u32, start_ns: u64, end_ns: u64) -> Dispatch {
    Dispatch {
        kernel: kernel.to_string(),
        stream,
        start_ns,
        end_ns,
        launches: 1,
        lanes_ended: 4,
        ..Dispatch::default()
    }
}

fn dispatches() -> Vec<Dispatch> {
    // Serialized on stream 0 (listed out of order), one on stream 3.
    vec![
        d("gemv", 0, 10_000, 12_000),
        d("norm", 0, 5_000, 6_000),
        d("gemv", 0, 6_500, 9_500),
        d("norm", 0, 12_500, 13_500),
        d("argmax", 3, 7_000, 7_250),
    ]
}

#[test]
fn trace_has_lanes_and_ordered_disjoint_events() {
    let mut host = HostSpans::new();
    host.push(HostSpan {
        name: "submit".into(),
        start_ns: 2_000,
        end_ns: 3_000,
    });
    let span = host.begin("sample");
    span.end(&mut host);
    let text = serde_json::to_string(&chrome_trace(&dispatches(), &host)).expect("serializes");
    let v: serde_json::Value = serde_json::from_str(&text).expect("parses");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let complete: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), 7);

    let lane = |pid: u64, tid: u64| -> Vec<(f64, f64, String)> {
        complete
            .iter()
            .filter(|e| e["pid"] == pid && e["tid"] == tid)
            .map(|e| {
                (
                    e["ts"].as_f64().expect("ts"),
                    e["dur"].as_f64().expect("dur"),
                    e["name"].to_string(),
                )
            })
            .collect()
    };
    let s0 = lane(1, 0);
    let names: Vec<&str> = s0.iter().map(|e| e.2.trim_matches('"')).collect();
    assert_eq!(names, ["norm", "gemv", "gemv", "norm"]);
    // Microseconds from the earliest dispatch start.
    assert_eq!((s0[0].0, s0[0].1), (0.0, 1.0));
    assert_eq!((s0[1].0, s0[1].1), (1.5, 3.0));
    for w in s0.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "overlap in {w:?}");
    }
    assert_eq!(lane(1, 3), [(2.0, 0.25, "\"argmax\"".to_string())]);
    assert!(complete
        .iter()
        .filter(|e| e["pid"] == 1)
        .all(|e| e["args"]["launches"] == 1 && e["args"]["lanes_ended"] == 4));
    let h = lane(2, 0);
    assert_eq!(h.len(), 2);
    let submit = h.iter().find(|e| e.2 == "\"submit\"").expect("submit span");
    assert_eq!((submit.0, submit.1), (2.0, 1.0));
    assert!(h.iter().any(|e| e.2 == "\"sample\"" && e.1 >= 0.0));
    assert!(h[0].0 <= h[1].0, "host spans in start order");

    let names: Vec<String> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| e["args"]["name"].as_str().expect("name").to_string())
        .collect();
    assert_eq!(names, ["stream 0", "stream 3"]);
}

#[test]
fn summary_per_kernel() {
    let mut ds = dispatches();
    ds.extend((1..=8).map(|i| d("gemv", 0, 20_000 + 1_000 * i, 20_000 + 1_000 * i + 100 * i)));
    let s = summarize(&ds);
    let rows = &s.rows;
    let kernels: Vec<&str> = rows.iter().map(|r| r.kernel.as_str()).collect();
    assert_eq!(kernels, ["gemv", "norm", "argmax"]);
    let g = &rows[0];
    // gemv durations: 2000, 3000, 100..=800.
    assert_eq!(g.calls, 10);
    assert_eq!(g.total_ns, 5_000 + 3_600);
    assert_eq!(g.mean_ns, 860.0);
    assert_eq!((g.p50_ns, g.p90_ns), (500, 2_000));
    // No steps: the shares are of the summed dispatch time.
    let all = 8_600 + 2_000 + 250;
    assert_eq!((s.steps, s.step_ns, s.busy_ns), (0, all, all));
    assert!((g.share - 8_600.0 / all as f64).abs() < 1e-12);
    assert_eq!(
        (
            rows[1].calls,
            rows[1].total_ns,
            rows[1].p50_ns,
            rows[1].p90_ns
        ),
        (2, 2_000, 1_000, 1_000)
    );
    assert_eq!(
        (rows[2].calls, rows[2].p50_ns, rows[2].p90_ns),
        (1, 250, 250)
    );
    let total_share: f64 = rows.iter().map(|r| r.share).sum();
    assert!((total_share - 1.0).abs() < 1e-12);
    assert_eq!(g.bytes_per_s(), None, "no bytes modeled");

    let table = render(&s, &Ceilings::default());
    assert_eq!(table.lines().count(), 4);
    assert!(table.lines().nth(1).expect("row").starts_with("gemv "));
    assert!(table.contains("79.3%"), "{table}");
    assert!(summarize(&[]).rows.is_empty());
}

#[test]
fn steps_share_bandwidth_and_flops() {
    // Two steps of two dispatches with gaps between them; one dispatch outside any step.
    let w =
        |kernel: &str, step: Option<u32>, start_ns: u64, end_ns: u64, bytes: u64, flops: u64| {
            Dispatch {
                kernel: kernel.into(),
                step,
                start_ns,
                end_ns,
                bytes,
                flops,
                ..Dispatch::default()
            }
        };
    let ds = [
        w("gemv", Some(0), 1_000, 2_000, 4_000, 2_000),
        w("argmax", Some(0), 2_500, 3_000, 1_000, 0),
        w("gemv", Some(1), 10_000, 11_000, 4_000, 2_000),
        w("argmax", Some(1), 11_200, 11_700, 1_000, 0),
        w("copy", None, 20_000, 20_400, 0, 0),
    ];
    let s = summarize(&ds);
    assert_eq!(
        (s.steps, s.step_ns, s.busy_ns),
        (2, 2_000 + 1_700 + 400, 2_000 + 1_000 + 400)
    );
    let gemv = &s.rows[0];
    assert_eq!(
        (gemv.kernel.as_str(), gemv.bytes, gemv.flops),
        ("gemv", 8_000, 4_000)
    );
    assert!((gemv.share - 2_000.0 / 4_100.0).abs() < 1e-12);
    // 8000 bytes in 2000 ns: 4 GB/s; 4000 FLOPs: 2 GFLOP/s.
    assert!((gemv.bytes_per_s().expect("bytes") - 4e9).abs() < 1.0);
    assert!((gemv.flops_per_s().expect("flops") - 2e9).abs() < 1.0);
    let argmax = s
        .rows
        .iter()
        .find(|r| r.kernel == "argmax")
        .expect("argmax");
    assert_eq!(argmax.flops_per_s(), None);

    let ceilings = Ceilings {
        copy_bytes_per_s: Some(8e9),
        flops: Some(1e12),
    };
    let table = render(&s, &ceilings);
    let gemv_line = table
        .lines()
        .find(|l| l.starts_with("gemv"))
        .expect("gemv row");
    assert!(
        gemv_line.contains(" 4.0 ") && gemv_line.contains(" 50.0 ") && gemv_line.contains(" 2.0"),
        "{table}"
    );
    assert!(table.contains("2 steps"), "{table}");
    let j = to_json(&s, &ceilings);
    let fraction = j["kernels"][0]["fraction_of_copy_bandwidth"]
        .as_f64()
        .expect("a fraction");
    assert!((fraction - 0.5).abs() < 1e-12, "{fraction}");
    assert_eq!(j["step_ns"], 4_100);
}
