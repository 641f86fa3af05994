//! Hostile clients: names and web pages the server does not answer, a client that takes more
//! than its share (sessions, connections, the embedder's time), bodies declared too large,
//! and work that must stop when its client goes or the server stops.

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{config, connect, read_response, request, Response, TestServer};
use quench_serve::{ModelSource, ModelSpec, ServeConfig};
use serde_json::{json, Value};

fn chat(session: Option<&str>) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    if let Some(s) = session {
        body["session_id"] = json!(s);
    }
    body
}

fn post_as(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> common::Response {
    request(
        addr,
        "POST",
        path,
        headers,
        Some(body.to_string().as_bytes()),
    )
}

fn code(r: &Response) -> String {
    r.json()["error"]["code"].as_str().unwrap_or("").to_owned()
}

/// A connection to `addr` from the loopback address `from` (127.0.0.0/8 all reaches this
/// machine), so that a test can be several clients.
fn connect_from(from: [u8; 4], addr: SocketAddr) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(SocketAddr::from((from, 0)))
            .expect("binding a loopback address");
        socket.connect(addr).await.unwrap()
    });
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    stream
}

/// One request from the loopback address `from`.
fn request_from(
    from: [u8; 4],
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Response {
    let mut s = connect_from(from, addr);
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    read_response(&mut BufReader::new(s))
}

#[test]
fn requests_for_other_host_names_are_refused() {
    let server = TestServer::start(config());
    let addr = server.addr;
    let port = addr.port();
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "127.0.0.1.evil",
    ] {
        for path in ["/v1/models", "/health"] {
            let r = request(addr, "GET", path, &[("Host", host)], None);
            assert_eq!(r.status, 403, "{host}{path}: {}", r.text());
            assert_eq!(code(&r), "host_not_allowed");
        }
        let r = post_as(addr, "/v1/chat/completions", &[("Host", host)], &chat(None));
        assert_eq!(r.status, 403, "{host}: {}", r.text());
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "localhost".to_owned(),
    ] {
        let r = request(addr, "GET", "/v1/models", &[("Host", &host)], None);
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
    server.stop();

    let server = TestServer::start(ServeConfig {
        allowed_hosts: vec!["api.example.com".into()],
        ..config()
    });
    let r = request(
        server.addr,
        "GET",
        "/v1/models",
        &[("Host", "API.example.com:443")],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = request(
        server.addr,
        "GET",
        "/v1/models",
        &[("Host", "other.example.com")],
        None,
    );
    assert_eq!(r.status, 403);
    server.stop();
}

#[test]
fn pages_of_other_origins_are_refused_unless_named() {
    let app = "https://app.example.com";
    let server = TestServer::start(ServeConfig {
        cors_origins: vec![app.into()],
        ..config()
    });
    let addr = server.addr;
    let before = server.get("/metrics").text();
    // A body without a Content-Type needs no preflight in a browser: such a page's request
    // is refused before anything runs.
    let r = request(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("Origin", "https://evil.example"), ("Content-Type", "")],
        Some(chat(None).to_string().as_bytes()),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(code(&r), "origin_not_allowed");
    assert!(r.header("access-control-allow-origin").is_none());
    let after = server.get("/metrics").text();
    let generated = |m: &str| {
        m.lines()
            .find(|l| l.starts_with("quench_completion_tokens_total"))
            .map(str::to_owned)
    };
    assert_eq!(
        generated(&before),
        generated(&after),
        "the refused page's request ran"
    );

    // The server's own page (the chat page) is answered.
    let own = format!("http://{addr}");
    let r = post_as(
        addr,
        "/v1/chat/completions",
        &[("Origin", &own)],
        &chat(None),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    // A named origin is answered with CORS headers, and its preflight allowed.
    let r = post_as(
        addr,
        "/v1/chat/completions",
        &[("Origin", app)],
        &chat(None),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(app));
    let preflight = [
        ("Origin", app),
        ("Access-Control-Request-Method", "POST"),
        (
            "Access-Control-Request-Headers",
            "authorization, content-type",
        ),
    ];
    let r = request(addr, "OPTIONS", "/v1/chat/completions", &preflight, None);
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(r.header("access-control-allow-origin"), Some(app));
    let allowed = r.header("access-control-allow-headers").unwrap_or("");
    assert!(allowed.contains("authorization") && allowed.contains("content-type"));
    let r = request(
        addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("Origin", "https://evil.example"),
            ("Access-Control-Request-Method", "POST"),
        ],
        None,
    );
    assert_eq!(r.status, 403);
    server.stop();

    // Without --cors-origin no other page is answered.
    let server = TestServer::start(config());
    let r = post_as(
        server.addr,
        "/v1/chat/completions",
        &[("Origin", app)],
        &chat(None),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    server.stop();
}

fn sessions_of(addr: SocketAddr, key: &str) -> Vec<String> {
    let auth = format!("Bearer {key}");
    let r = request(
        addr,
        "GET",
        "/v1/sessions",
        &[("Authorization", &auth)],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut ids: Vec<String> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

#[test]
fn a_key_at_its_session_quota_forgets_its_own_sessions_only() {
    let server = TestServer::start(ServeConfig {
        api_keys: vec!["sk-a".into(), "sk-b".into()],
        sessions_per_client: 2,
        ..config()
    });
    let addr = server.addr;
    let turn = |key: &str, session: &str| {
        let auth = format!("Bearer {key}");
        let r = post_as(
            addr,
            "/v1/chat/completions",
            &[("Authorization", &auth)],
            &chat(Some(session)),
        );
        assert_eq!(r.status, 200, "{key} {session}: {}", r.text());
    };
    turn("sk-b", "b-1");
    for i in 1..=40 {
        turn("sk-a", &format!("a-{i}"));
    }
    assert_eq!(sessions_of(addr, "sk-a"), ["a-39", "a-40"]);
    assert_eq!(sessions_of(addr, "sk-b"), ["b-1"]);
    turn("sk-b", "b-1");
    let info = request(
        addr,
        "GET",
        "/v1/sessions",
        &[("Authorization", "Bearer sk-b")],
        None,
    );
    assert_eq!(info.json()["data"][0]["turns"], 2, "{}", info.text());
    server.stop();
}

/// A chat turn of session `id` from the loopback address `from`.
fn turn_from(from: [u8; 4], addr: SocketAddr, id: &str) -> Response {
    request_from(
        from,
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&chat(Some(id))),
    )
}

/// Two clients on one address (every local client is 127.0.0.1), on a server without keys:
/// neither can list the other's sessions, and one at the address's quota is refused rather
/// than forgetting the other's.
#[test]
fn without_keys_clients_on_one_address_neither_list_nor_evict_each_other() {
    let server = TestServer::start(ServeConfig {
        sessions_per_client: 3,
        ..config()
    });
    let addr = server.addr;
    let local = [127, 0, 0, 1];
    let r = turn_from(local, addr, "alice-secret");
    assert_eq!(r.status, 200, "{}", r.text());

    // Bob, on the same address, cannot enumerate: a clear refusal, no ids in it.
    let r = request_from(local, addr, "GET", "/v1/sessions", None);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(code(&r), "session_listing_needs_api_key");
    assert!(r.json()["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("--api-key")));
    assert!(!r.text().contains("alice-secret"));

    // Bob fills the address's quota, then is refused: Alice's session stays.
    for id in ["bob-1", "bob-2"] {
        let r = turn_from(local, addr, id);
        assert_eq!(r.status, 200, "{id}: {}", r.text());
    }
    for id in ["bob-3", "bob-4"] {
        let r = turn_from(local, addr, id);
        assert_eq!(r.status, 429, "{id}: {}", r.text());
        assert_eq!(code(&r), "session_quota");
    }
    let r = request_from(local, addr, "GET", "/v1/sessions/alice-secret", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["turns"], 1);
    // Alice continues her conversation, from the cache she left.
    let r = turn_from(local, addr, "alice-secret");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{}",
        r.text()
    );
    // Bob makes room by deleting one of his own.
    let r = request_from(local, addr, "DELETE", "/v1/sessions/bob-1", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(turn_from(local, addr, "bob-3").status, 200);
    server.stop();
}

/// A full store (`--max-sessions`) does not let one client flush the others' sessions:
/// with keys it forgets the caller's own oldest, otherwise the new session is refused.
#[test]
fn a_full_store_forgets_nobody_elses_sessions() {
    let server = TestServer::start(ServeConfig {
        api_keys: vec!["sk-a".into(), "sk-b".into(), "sk-c".into()],
        max_sessions: 3,
        ..config()
    });
    let addr = server.addr;
    let turn = |key: &str, session: &str| {
        let auth = format!("Bearer {key}");
        post_as(
            addr,
            "/v1/chat/completions",
            &[("Authorization", &auth)],
            &chat(Some(session)),
        )
    };
    for (key, id) in [("sk-a", "a-1"), ("sk-a", "a-2"), ("sk-b", "b-1")] {
        assert_eq!(turn(key, id).status, 200, "{id}");
    }
    // b's own session makes room, not a's older ones.
    assert_eq!(turn("sk-b", "b-2").status, 200);
    assert_eq!(sessions_of(addr, "sk-a"), ["a-1", "a-2"]);
    assert_eq!(sessions_of(addr, "sk-b"), ["b-2"]);
    // c has nothing of its own to forget.
    let r = turn("sk-c", "c-1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(code(&r), "session_quota");
    assert_eq!(sessions_of(addr, "sk-a"), ["a-1", "a-2"]);
    assert_eq!(sessions_of(addr, "sk-b"), ["b-2"]);
    server.stop();

    // Without keys, one address cannot flush another's either.
    let server = TestServer::start(ServeConfig {
        max_sessions: 2,
        ..config()
    });
    let addr = server.addr;
    assert_eq!(turn_from([127, 0, 0, 1], addr, "one").status, 200);
    assert_eq!(turn_from([127, 0, 0, 2], addr, "two").status, 200);
    let r = turn_from([127, 0, 0, 2], addr, "three");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(code(&r), "session_quota");
    for id in ["one", "two"] {
        let r = request_from(
            [127, 0, 0, 3],
            addr,
            "GET",
            &format!("/v1/sessions/{id}"),
            None,
        );
        assert_eq!(r.status, 200, "{id}: {}", r.text());
    }
    server.stop();
}

/// KV blocks the chat model holds (sessions' caches included), from `/health`.
fn kv_blocks_used(addr: SocketAddr) -> u64 {
    let health = request(addr, "GET", "/health", &[], None).json();
    health["models"]
        .as_array()
        .and_then(|m| m.iter().find_map(|m| m["kv_blocks_used"].as_u64()))
        .unwrap_or_else(|| panic!("no kv_blocks_used in {health}"))
}

/// Waits (up to 10 s) for the chat model's KV blocks in use to reach `want`.
fn blocks_reach(addr: SocketAddr, want: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let used = kv_blocks_used(addr);
        if used == want || Instant::now() > deadline {
            return used;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deleting a session drops its KV cache, whoever (allowed) deletes it; another key's
/// delete is 404 and leaves the session and its cache alone.
#[test]
fn deleting_a_session_frees_its_cache_and_another_key_cannot() {
    let server = TestServer::start(ServeConfig {
        api_keys: vec!["sk-alice".into(), "sk-bob".into()],
        ..config()
    });
    let addr = server.addr;
    let call = |method: &str, path: &str, key: &str, body: Option<&Value>| {
        let auth = format!("Bearer {key}");
        let text = body.map(Value::to_string);
        request(
            addr,
            method,
            path,
            &[("Authorization", &auth)],
            text.as_deref().map(str::as_bytes),
        )
    };
    let r = call(
        "POST",
        "/v1/chat/completions",
        "sk-alice",
        Some(&chat(Some("notes"))),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let held = kv_blocks_used(addr);
    assert!(held > 0, "the idle session keeps its cache");
    let r = call("DELETE", "/v1/sessions/notes", "sk-bob", None);
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(code(&r), "session_not_found");
    assert_eq!(
        call("GET", "/v1/sessions/notes", "sk-bob", None).status,
        404
    );
    assert_eq!(kv_blocks_used(addr), held);
    assert_eq!(
        call("GET", "/v1/sessions/notes", "sk-alice", None).status,
        200
    );
    let r = call("DELETE", "/v1/sessions/notes", "sk-alice", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        blocks_reach(addr, 0),
        0,
        "the deleted session's cache is freed"
    );
    server.stop();

    // Without keys the id is what reaches a session: a delete from another address than
    // the one that made it frees the cache too.
    let server = TestServer::start(config());
    let addr = server.addr;
    assert_eq!(turn_from([127, 0, 0, 1], addr, "shared").status, 200);
    assert!(kv_blocks_used(addr) > 0);
    let r = request_from([127, 0, 0, 2], addr, "DELETE", "/v1/sessions/shared", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        blocks_reach(addr, 0),
        0,
        "the deleted session's cache is freed"
    );
    server.stop();
}

#[test]
fn a_body_declared_too_large_is_refused_at_once() {
    let server = TestServer::start(config());
    let mut s = connect(server.addr);
    let started = Instant::now();
    // Headers only: the 100 MB the client declares never come.
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: 100000000\r\n\r\n",
        server.addr
    );
    s.write_all(head.as_bytes()).unwrap();
    let r = read_response(&mut BufReader::new(s));
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the 413 took {:?}",
        started.elapsed()
    );
    server.stop();
}

#[test]
fn one_address_cannot_take_every_connection() {
    let server = TestServer::start(ServeConfig {
        connections_per_address: 8,
        header_timeout: Duration::from_secs(30),
        ..config()
    });
    let addr = server.addr;
    let slow: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = connect_from([127, 0, 0, 2], addr);
            s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
                .unwrap();
            s
        })
        .collect();
    // The ninth from that address is told why and closed.
    let mut ninth = connect_from([127, 0, 0, 2], addr);
    let _ = ninth.write_all(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n");
    let r = read_response(&mut BufReader::new(&mut ninth));
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(code(&r), "too_many_connections");
    // Another address is served at once.
    let started = Instant::now();
    let r = post_as(addr, "/v1/chat/completions", &[], &chat(None));
    assert_eq!(r.status, 200);
    assert!(started.elapsed() < Duration::from_secs(2));
    // Once its connections close, the address is served again.
    drop(slow);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = request_from([127, 0, 0, 2], addr, "GET", "/v1/models", None);
        if r.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {}", r.text());
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop();
}

#[test]
fn while_draining_a_kept_alive_connection_is_answered_503() {
    let mut server = TestServer::start(ServeConfig {
        shutdown_grace: Duration::from_secs(10),
        body_timeout: Duration::from_secs(3),
        ..config()
    });
    let addr = server.addr;
    let mut kept = connect(addr);
    let get = format!("GET /v1/models HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    kept.write_all(get.as_bytes()).unwrap();
    let mut reader = BufReader::new(kept.try_clone().unwrap());
    assert_eq!(read_response(&mut reader).status, 200);
    // A request in flight (its body comes slowly) keeps the server draining.
    let mut slow = connect(addr);
    slow.write_all(
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: 100\r\n\r\n{{\"pro"
        )
        .as_bytes(),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let stopping = Instant::now();
    server.begin_stop();
    std::thread::sleep(Duration::from_millis(300));
    kept.write_all(get.as_bytes()).unwrap();
    let r = read_response(&mut reader);
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));
    assert!(r.header("retry-after").is_some());
    // The slow request ends at its body timeout, and the server stops then.
    let r = read_response(&mut BufReader::new(&mut slow));
    assert_eq!(r.status, 408, "{}", r.text());
    drop(server);
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(6), "stopping took {took:?}");
}

/// The embedding inputs the server has finished, from /metrics.
fn embedded(addr: SocketAddr) -> u64 {
    let text = request(addr, "GET", "/metrics", &[], None).text();
    text.lines()
        .find_map(|l| l.strip_prefix("quench_embedding_inputs_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A server embedding with all-MiniLM-L6-v2 (slow enough on a CPU that a large request takes
/// minutes), or `None` when the model is missing.
fn minilm_server(grace: Duration) -> Option<TestServer> {
    let dir = quench_testkit::minilm_dir()?;
    Some(TestServer::start(ServeConfig {
        models: Vec::new(),
        embedding_models: vec![ModelSpec {
            name: "minilm".into(),
            source: ModelSource::Path(dir),
        }],
        shutdown_grace: grace,
        body_limit: 64 << 20,
        ..config()
    }))
}

/// 2,048 texts of about 50 words: minutes of work on a CPU.
fn large_request(addr: SocketAddr) -> TcpStream {
    let text = "the quick brown fox jumps over the lazy dog while it rains ".repeat(5);
    let body = json!({"model": "minilm", "input": vec![text; 2048]}).to_string();
    let mut s = connect(addr);
    let head = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    s
}

/// Waits until the server has embedded more than `n` inputs; returns how long it took.
fn wait_past(addr: SocketAddr, n: u64) -> Duration {
    let started = Instant::now();
    while embedded(addr) <= n {
        assert!(started.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

#[test]
fn a_large_embeddings_request_neither_starves_others_nor_outlives_its_client() {
    let Some(server) = minilm_server(Duration::from_secs(30)) else {
        return;
    };
    let addr = server.addr;
    let large = large_request(addr);
    let piece = wait_past(addr, 0);
    // A small request is answered within a piece or two, long before the large one ends.
    let started = Instant::now();
    let r = post_as(
        addr,
        "/v1/embeddings",
        &[],
        &json!({"input": "a short text"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let waited = started.elapsed();
    assert!(
        waited < piece * 3 + Duration::from_secs(1),
        "a one-text request waited {waited:?} (a piece takes {piece:?})"
    );
    let done = embedded(addr);
    assert!(done < 2048, "the large request finished first: {done}");
    // The large request's client goes: its work stops after the piece under way.
    drop(large);
    std::thread::sleep(piece * 2 + Duration::from_millis(200));
    let stopped_at = embedded(addr);
    std::thread::sleep(piece * 3 + Duration::from_millis(200));
    assert_eq!(
        embedded(addr),
        stopped_at,
        "work went on after the client left"
    );
    let r = post_as(
        addr,
        "/v1/embeddings",
        &[],
        &json!({"input": ["still", "there"]}),
    );
    assert_eq!(r.status, 200);
    server.stop();
}

#[test]
fn shutdown_ends_within_the_grace_while_embeddings_run() {
    let grace = Duration::from_secs(1);
    let Some(mut server) = minilm_server(grace) else {
        return;
    };
    let addr = server.addr;
    let mut large = large_request(addr);
    let piece = wait_past(addr, 0);
    let stopping = Instant::now();
    server.begin_stop();
    drop(server);
    let took = stopping.elapsed();
    // The grace, the piece under way, and the moment left for last bytes.
    assert!(
        took < grace + piece + Duration::from_secs(3),
        "stopping took {took:?} (a piece takes {piece:?})"
    );
    let mut rest = Vec::new();
    let _ = large.read_to_end(&mut rest);
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.is_empty() || rest.starts_with("HTTP/1.1 503"),
        "the cancelled request got: {}",
        &rest[..rest.len().min(200)]
    );
}
