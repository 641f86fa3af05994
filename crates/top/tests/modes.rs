//! The JSON modes and the text frame, driven by a scripted source.

mod common;

use std::time::Duration;

use quench_top::fake::FakeSource;
use quench_top::modes::{frame_text, json_once, watch, TopError};
use quench_top::{NvmlSource, SourceError};
use serde_json::Value;

#[test]
fn watch_streams_one_line_per_reading() {
    let mut rng = common::rng("watch_streams_one_line_per_reading");
    let snaps: Vec<_> = (0..3)
        .map(|i| common::snapshot(1000 + i, vec![common::full_gpu(&mut rng, 0)]))
        .collect();
    let mut src = FakeSource::new(snaps.clone());
    let mut out = Vec::new();
    watch(
        &mut src,
        &mut None,
        Duration::from_millis(1),
        Some(3),
        &mut out,
    )
    .expect("watch");
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    for (line, snap) in lines.iter().zip(&snaps) {
        let v: Value = serde_json::from_str(line).expect("each line is JSON");
        assert_eq!(v["time_unix_ms"], snap.time_unix_ms);
        assert_eq!(v["gpus"][0], serde_json::to_value(&snap.gpus[0]).unwrap());
    }
}

#[test]
fn watch_stops_on_a_failed_reading() {
    let mut rng = common::rng("watch_stops_on_a_failed_reading");
    let mut src = FakeSource::scripted([
        Ok(common::snapshot(1, vec![common::full_gpu(&mut rng, 0)])),
        Err(SourceError::NoGpu),
    ]);
    let mut out = Vec::new();
    let err = watch(
        &mut src,
        &mut None,
        Duration::from_millis(1),
        None,
        &mut out,
    )
    .expect_err("fails");
    assert!(matches!(err, TopError::Source(SourceError::NoGpu)));
    assert_eq!(String::from_utf8(out).unwrap().lines().count(), 1);
}

#[test]
fn json_once_reports_the_second_reading() {
    let mut rng = common::rng("json_once_reports_the_second_reading");
    let a = common::snapshot(1, vec![common::full_gpu(&mut rng, 0)]);
    let b = common::snapshot(2, vec![common::full_gpu(&mut rng, 0)]);
    let mut src = FakeSource::new([a, b.clone()]);
    let v = json_once(&mut src, &mut None, Duration::from_millis(1)).expect("json");
    assert_eq!(v["time_unix_ms"], 2);
    assert_eq!(v["gpus"][0], serde_json::to_value(&b.gpus[0]).unwrap());
    let mut failing = FakeSource::scripted([Err(SourceError::NoGpu)]);
    assert!(json_once(&mut failing, &mut None, Duration::from_millis(1)).is_err());
}

#[test]
fn frame_text_draws_one_frame_at_the_asked_size() {
    let mut rng = common::rng("frame_text_draws_one_frame_at_the_asked_size");
    let g = common::full_gpu(&mut rng, 0);
    let mut src = FakeSource::new([
        common::snapshot(1, vec![g.clone()]),
        common::snapshot(2, vec![g.clone()]),
    ]);
    let text = frame_text(
        Ok(&mut src),
        &mut None,
        Duration::from_millis(1),
        2,
        120,
        40,
    );
    assert_eq!(text.lines().count(), 40);
    assert!(text.lines().all(|l| l.chars().count() <= 120));
    assert!(text.contains(g.name.as_deref().unwrap()));
    let none = frame_text(
        Err(SourceError::NoGpu),
        &mut None,
        Duration::from_millis(1),
        2,
        120,
        40,
    );
    assert!(
        none.contains("No GPU readings: no GPU:") && none.contains("no devices"),
        "{none}"
    );
}

#[test]
fn a_missing_nvml_library_is_an_error_that_names_it() {
    let path = "/nonexistent/quench-test/libnvidia-ml.so.1";
    match NvmlSource::open_library(path) {
        Err(e @ SourceError::LibraryNotLoaded { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(path) && msg.contains("NVIDIA driver"), "{msg}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("loaded NVML from a path that does not exist"),
    }
}
