//! Server metrics: rates from counters, headline figures, and fetching over HTTP.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use quench_top::prom::parse;
use quench_top::server::{ServerPoller, ServerTracker};
use rand::Rng;

fn exposition(
    completion: u64,
    prompt: u64,
    cached: u64,
    queue: u64,
    used: u64,
    total: u64,
    itl_count: u64,
) -> String {
    format!(
        "# TYPE quench_completion_tokens_total counter\n\
         quench_completion_tokens_total{{model=\"a\"}} {completion}\n\
         # TYPE quench_prompt_tokens_total counter\n\
         quench_prompt_tokens_total{{model=\"a\"}} {prompt}\n\
         # TYPE quench_cached_prompt_tokens_total counter\n\
         quench_cached_prompt_tokens_total{{model=\"a\"}} {cached}\n\
         # TYPE quench_queue_depth gauge\n\
         quench_queue_depth{{model=\"a\"}} {queue}\n\
         # TYPE quench_kv_blocks_used gauge\n\
         quench_kv_blocks_used{{model=\"a\"}} {used}\n\
         # TYPE quench_kv_blocks_total gauge\n\
         quench_kv_blocks_total{{model=\"a\"}} {total}\n\
         # TYPE quench_inter_token_seconds histogram\n\
         quench_inter_token_seconds_bucket{{model=\"a\",le=\"0.01\"}} {itl_count}\n\
         quench_inter_token_seconds_sum{{model=\"a\"}} 1.5\n\
         quench_inter_token_seconds_count{{model=\"a\"}} {itl_count}\n\
         # TYPE go_threads gauge\n\
         go_threads 12\n"
    )
}

#[test]
fn rates_and_headline_figures() {
    let mut rng = common::rng("rates_and_headline_figures");
    let mut t = ServerTracker::new();
    let (c0, p0, k0, i0) = (
        rng.gen_range(0..1_000_000u64),
        rng.gen_range(0..1_000_000u64),
        rng.gen_range(0..1000u64),
        rng.gen_range(0..1000u64),
    );
    let first = t.observe(
        "u",
        10_000,
        &parse(&exposition(c0, p0, k0, 1, 2, 3, i0)).unwrap(),
    );
    assert_eq!(first.tokens_per_s, None, "no rate from one reading");
    assert!(first.metrics.iter().all(|m| m.rate_per_s.is_none()));
    let (dc, dp, dk, di) = (
        rng.gen_range(0..50_000u64),
        rng.gen_range(0..50_000u64),
        rng.gen_range(0..500u64),
        rng.gen_range(0..500u64),
    );
    let dt_ms = rng.gen_range(100..5000u64);
    let (q, used, total) = (
        rng.gen_range(0..64u64),
        rng.gen_range(0..1000u64),
        rng.gen_range(1000..5000u64),
    );
    let s = t.observe(
        "u",
        10_000 + dt_ms,
        &parse(&exposition(
            c0 + dc,
            p0 + dp,
            k0 + dk,
            q,
            used,
            total,
            i0 + di,
        ))
        .unwrap(),
    );
    let dt = dt_ms as f64 / 1000.0;
    assert_eq!(s.tokens_per_s, Some(dc as f64 / dt));
    assert_eq!(
        s.prompt_tokens_per_s,
        Some(dp as f64 / dt),
        "cached prompt tokens are not counted"
    );
    assert_eq!(s.queue_depth, Some(q as f64));
    assert_eq!(s.kv_blocks_used, Some(used as f64));
    assert_eq!(s.kv_blocks_total, Some(total as f64));
    let names: Vec<&str> = s.metrics.iter().map(|m| m.name.as_str()).collect();
    assert!(
        !names.iter().any(|n| n.ends_with("_bucket")),
        "buckets are not listed"
    );
    assert!(!names.contains(&"go_threads"), "only quench_ metrics");
    let count = s
        .metrics
        .iter()
        .find(|m| m.name == "quench_inter_token_seconds_count")
        .unwrap();
    assert_eq!(
        (count.kind, count.rate_per_s),
        ("histogram", Some(di as f64 / dt))
    );
    assert_eq!(s.metrics.len(), 8);
}

#[test]
fn a_counter_reset_gives_no_rate() {
    let mut t = ServerTracker::new();
    t.observe(
        "u",
        0,
        &parse("quench_completion_tokens_total 500\n").unwrap(),
    );
    let s = t.observe(
        "u",
        1000,
        &parse("quench_completion_tokens_total 3\n").unwrap(),
    );
    assert_eq!(s.tokens_per_s, None);
    let s = t.observe(
        "u",
        2000,
        &parse("quench_completion_tokens_total 13\n").unwrap(),
    );
    assert_eq!(s.tokens_per_s, Some(10.0));
}

/// A burst between two quick readings is spread over the rate window.
#[test]
fn rates_reach_over_the_window() {
    let mut t = ServerTracker::new();
    let mut at = std::collections::BTreeMap::new();
    for step in 0..=16u64 {
        let ms = step * 500;
        let tokens = if ms < 3000 { 0 } else { 1000 };
        let s = t.observe(
            "u",
            ms,
            &parse(&format!("quench_completion_tokens_total {tokens}\n")).unwrap(),
        );
        at.insert(ms, s.tokens_per_s);
    }
    assert_eq!(at[&0], None);
    assert_eq!(at[&2500], Some(0.0));
    assert_eq!(at[&3000], Some(1000.0 / 3.0));
    assert_eq!(at[&5000], Some(200.0));
    assert_eq!(at[&7500], Some(200.0));
    assert_eq!(at[&8000], Some(0.0));
}

/// Serves each of `responses` to one connection, on a fresh local port.
fn serve(responses: Vec<Vec<u8>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for r in responses {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut req = [0u8; 1024];
            let _ = conn.read(&mut req);
            conn.write_all(&r).expect("write");
        }
    });
    format!("http://127.0.0.1:{port}/metrics")
}

#[test]
fn polls_a_server_over_http() {
    let body1 = "quench_completion_tokens_total 100\nquench_queue_depth 1\n";
    let body2 = "quench_completion_tokens_total 300\nquench_queue_depth 0\n";
    let plain = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body1}",
        body1.len()
    );
    // The second answer is chunked, split mid-line.
    let (a, b) = body2.split_at(10);
    let chunked = format!(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\n\r\n",
        a.len(),
        b.len()
    );
    let url = serve(vec![plain.into_bytes(), chunked.into_bytes()]);
    let mut p = ServerPoller::new(Some(&url));
    let s1 = p.poll(1_000).expect("a sample");
    assert_eq!((s1.error.as_deref(), s1.queue_depth), (None, Some(1.0)));
    let s2 = p.poll(3_000).expect("a sample");
    assert_eq!((s2.tokens_per_s, s2.queue_depth), (Some(100.0), Some(0.0)));
}

#[test]
fn a_named_server_that_fails_is_reported_and_the_default_one_is_quiet() {
    let url = serve(vec![
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_vec(),
        b"HTTP/1.1 200 OK\r\n\r\nother_metric 1\n".to_vec(),
    ]);
    let mut p = ServerPoller::new(Some(&url));
    let s = p.poll(0).expect("named servers always report");
    assert!(s.error.as_deref().unwrap().contains("HTTP 503"), "{s:?}");
    let s = p.poll(0).expect("named servers always report");
    assert!(
        s.error.as_deref().unwrap().contains("no quench_ metrics"),
        "{s:?}"
    );
    // A port nobody listens on: bind one, then drop the listener.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        format!(
            "http://127.0.0.1:{}/metrics",
            l.local_addr().unwrap().port()
        )
    };
    let s = ServerPoller::new(Some(&closed))
        .poll(0)
        .expect("named servers always report");
    assert!(
        s.error.as_deref().unwrap().starts_with("cannot reach"),
        "{s:?}"
    );
    let s = ServerPoller::new(Some("https://example/metrics"))
        .poll(0)
        .unwrap();
    assert!(
        s.error.as_deref().unwrap().contains("not an http:// URL"),
        "{s:?}"
    );
}
