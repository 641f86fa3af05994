//! The 60-second history behind the graphs.

mod common;

use quench_top::history::{Series, WINDOW_MS};
use rand::Rng;

/// Slot values computed the slow way: for each slot, the largest value read in it,
/// else the last reading before it.
fn reference(points: &[(u64, Option<f64>)], now: u64, n: usize) -> Vec<Option<f64>> {
    let start = now.saturating_sub(WINDOW_MS);
    (0..n)
        .map(|i| {
            let lo = start + ((now - start) as u128 * i as u128 / n as u128) as u64;
            let hi = if i + 1 == n {
                now + 1
            } else {
                start + ((now - start) as u128 * (i as u128 + 1) / n as u128) as u64
            };
            let inside: Vec<Option<f64>> = points
                .iter()
                .filter(|p| p.0 >= lo.max(start) && p.0 < hi)
                .map(|p| p.1)
                .collect();
            if inside.is_empty() {
                points
                    .iter()
                    .rev()
                    .find(|p| p.0 < lo.max(start))
                    .and_then(|p| p.1)
            } else {
                inside.into_iter().flatten().reduce(f64::max)
            }
        })
        .collect()
}

#[test]
fn buckets_match_a_slow_reference() {
    let mut rng = common::rng("buckets_match_a_slow_reference");
    for _ in 0..200 {
        let mut s = Series::default();
        let mut t = rng.gen_range(1_000_000u64..2_000_000);
        let mut points = Vec::new();
        for _ in 0..rng.gen_range(1..400) {
            t += rng.gen_range(1..700);
            let v = (rng.gen_range(0..10) > 0).then(|| rng.gen_range(0.0..1000.0));
            s.push(t, v);
            points.push((t, v));
        }
        let now = t + rng.gen_range(0..2000);
        let n = rng.gen_range(1..200);
        // Only points inside the window, plus the one before it, matter.
        assert_eq!(
            s.buckets(now, n),
            reference(&points, now, n),
            "n {n} now {now}"
        );
    }
}

#[test]
fn old_points_leave_the_window() {
    let mut s = Series::default();
    s.push(0, Some(500.0));
    s.push(1_000, Some(7.0));
    s.push(WINDOW_MS + 2_000, Some(3.0));
    // The reading from 62 s ago has gone; the one at 1 s stood until 62 s, inside the window.
    assert_eq!(s.max(), Some(7.0));
    let b = s.buckets(WINDOW_MS + 2_000, 60);
    assert_eq!((b[0], b[58], b[59]), (Some(7.0), Some(7.0), Some(3.0)));
    s.push(WINDOW_MS + 5_000, Some(1.0));
    s.push(2 * WINDOW_MS + 5_000, Some(2.0));
    assert_eq!(
        s.max(),
        Some(2.0),
        "the readings before {} ms have left",
        WINDOW_MS + 5_000
    );
    let b = s.buckets(2 * WINDOW_MS + 5_000, 60);
    assert_eq!((b[0], b[58], b[59]), (Some(1.0), Some(1.0), Some(2.0)));
}
