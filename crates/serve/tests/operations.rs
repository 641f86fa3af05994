//! Load, admission, cancellation and shutdown, over HTTP.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::time::{Duration, Instant};

use common::{config, connect, TestServer};
use quench_serve::{ServeError, Server};
use serde_json::{json, Value};

fn chat_body(question: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
           "temperature": 0, "stream": stream})
}

fn answer(r: &common::Response) -> String {
    assert_eq!(r.status, 200, "{}", r.text());
    if r.header("content-type") == Some("text/event-stream") {
        r.events()
            .iter()
            .filter(|e| e.as_str() != "[DONE]")
            .filter_map(|e| {
                let v: Value = serde_json::from_str(e).unwrap();
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    } else {
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

#[test]
fn concurrent_greedy_answers_equal_the_same_requests_alone() {
    let server = TestServer::start(config());
    let questions: Vec<String> = (0..12)
        .map(|i| format!("question {i}: {}", "why ".repeat(i * 7)))
        .collect();
    let alone: Vec<String> = questions
        .iter()
        .map(|q| answer(&server.post("/v1/chat/completions", &chat_body(q, 40, false))))
        .collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = questions
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let server = &server;
                scope.spawn(move || {
                    answer(&server.post("/v1/chat/completions", &chat_body(q, 40, i % 2 == 0)))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let mut cfg = config();
    cfg.engine.max_batch = 1;
    cfg.engine.queue = 1;
    let server = TestServer::start(cfg);
    let statuses: Vec<(u16, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let server = &server;
                scope.spawn(move || {
                    let r = server.post(
                        "/v1/completions",
                        &json!({"prompt": "hello", "max_tokens": 200}),
                    );
                    (r.status, r.header("retry-after").map(str::to_owned))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let refused: Vec<_> = statuses.iter().filter(|(s, _)| *s == 429).collect();
    assert!(!refused.is_empty(), "{statuses:?}");
    assert!(refused
        .iter()
        .all(|(_, retry)| retry.as_deref() == Some("1")));
    assert!(
        statuses.iter().all(|(s, _)| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert!(server
        .get("/metrics")
        .text()
        .contains("quench_rejected_queue_full_total"));
}

fn kv_blocks_used(server: &TestServer) -> u64 {
    server.get("/health").json()["models"][0]["kv_blocks_used"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_client_that_disconnects_frees_its_kv_blocks() {
    let server = TestServer::start(config());
    for stream in [true, false] {
        let mut s = connect(server.addr);
        let body =
            json!({"prompt": "a".repeat(20), "max_tokens": 480, "stream": stream, "ignore_eos": true})
                .to_string();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        if stream {
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            while !line.starts_with("data:") {
                line.clear();
                r.read_line(&mut line).unwrap();
            }
        } else {
            let until = Instant::now() + Duration::from_secs(10);
            while kv_blocks_used(&server) == 0 {
                assert!(Instant::now() < until, "the request never started");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        drop(s);
        let until = Instant::now() + Duration::from_secs(10);
        while kv_blocks_used(&server) != 0 {
            assert!(
                Instant::now() < until,
                "blocks still held after disconnect (stream: {stream})"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[test]
fn shutdown_lets_requests_in_flight_finish() {
    let server = TestServer::start(config());
    let addr = server.addr;
    let in_flight = std::thread::spawn(move || {
        common::request(
            addr,
            "POST",
            "/v1/completions",
            &[],
            Some(
                json!({"prompt": "b".repeat(200), "max_tokens": 300, "stream": true})
                    .to_string()
                    .as_bytes(),
            ),
        )
    });
    let until = Instant::now() + Duration::from_secs(10);
    while kv_blocks_used(&server) == 0 {
        assert!(Instant::now() < until, "the request never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    server.stop();
    let r = in_flight.join().unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still accepting after shutdown"
    );
}

#[test]
fn a_busy_port_or_a_missing_model_is_refused_with_a_clear_message() {
    let server = TestServer::start(config());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut cfg = config();
    cfg.port = server.addr.port();
    match runtime.block_on(Server::start(cfg)) {
        Err(e @ ServeError::Bind { .. }) => {
            let m = e.to_string();
            assert!(
                m.contains(&server.addr.port().to_string()) && m.contains("in use"),
                "{m}"
            );
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("bound a busy port"),
    }
    let mut cfg = config();
    cfg.models = vec!["/no/such/model.gguf".parse().unwrap()];
    match runtime.block_on(Server::start(cfg)) {
        Err(e @ ServeError::Load { .. }) => {
            assert!(e.to_string().contains("/no/such/model.gguf"), "{e}")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("loaded a missing model"),
    }
}

#[test]
fn shutdown_cancels_what_is_left_at_the_deadline() {
    let mut cfg = config();
    cfg.shutdown_grace = Duration::ZERO;
    let server = TestServer::start(cfg);
    let addr = server.addr;
    let in_flight = std::thread::spawn(move || {
        common::request(
            addr,
            "POST",
            "/v1/completions",
            &[],
            Some(
                json!({"prompt": "c".repeat(20), "max_tokens": 480, "stream": true,
                        "ignore_eos": true})
                .to_string()
                .as_bytes(),
            ),
        )
    });
    let until = Instant::now() + Duration::from_secs(10);
    while kv_blocks_used(&server) == 0 {
        assert!(Instant::now() < until, "the request never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    server.stop();
    let r = in_flight.join().unwrap();
    assert_eq!(r.status, 200);
    let last: Value = serde_json::from_str(r.events().last().unwrap()).unwrap();
    assert!(
        last["error"]["message"]
            .as_str()
            .unwrap()
            .contains("shut down"),
        "{last}"
    );
}

#[test]
fn beyond_the_connection_limit_clients_wait_for_a_free_one() {
    let mut cfg = config();
    cfg.max_connections = 1;
    cfg.header_timeout = Duration::from_millis(300);
    let server = TestServer::start(cfg);
    // An idle connection holds the only place until the header timeout closes it.
    let idle = connect(server.addr);
    std::thread::sleep(Duration::from_millis(50));
    let started = Instant::now();
    let r = server.get("/health");
    assert_eq!(r.status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "answered after {:?} while the limit was taken",
        started.elapsed()
    );
    drop(idle);
}
