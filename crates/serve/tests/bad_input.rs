//! Bad requests get an OpenAI-style error with the right status and the field at fault,
//! and the server keeps answering.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::{config, connect, TestServer};
use serde_json::{json, Value};

/// Checks the error body of a refused request: its shape, status and param.
fn refused(r: &common::Response, status: u16, param: Option<&str>, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", r.text());
    let v = r.json();
    let e = &v["error"];
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {v}"
    );
    assert!(e["type"].is_string(), "{what}: {v}");
    assert!(e.get("code").is_some(), "{what}: {v}");
    assert_eq!(e["param"].as_str(), param, "{what}: {v}");
    if let Some(p) = param {
        let field = p.split(['[', '.']).next().unwrap_or(p);
        assert!(
            e["message"].as_str().unwrap().contains(field),
            "{what}: message names no field: {v}"
        );
    }
}

fn ok_chat(server: &TestServer) {
    let r = server.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn each_bad_request_is_refused_by_name_and_the_server_keeps_serving() {
    let mut cfg = config();
    cfg.body_limit = 64 * 1024;
    let server = TestServer::start(cfg);
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let long_prompt = "x".repeat(2100);
    // (what, route, body, status, param)
    type Case<'a> = (&'a str, &'a str, Vec<u8>, u16, Option<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "malformed JSON",
            chat,
            b"{\"messages\": [".to_vec(),
            400,
            None,
        ),
        ("not an object", chat, b"[1, 2]".to_vec(), 400, None),
        (
            "missing messages",
            chat,
            json!({"model": "tiny-chat"}).to_string().into_bytes(),
            400,
            Some("messages"),
        ),
        (
            "messages of the wrong type",
            chat,
            json!({"messages": "hi"}).to_string().into_bytes(),
            400,
            Some("messages"),
        ),
        (
            "content of the wrong type",
            chat,
            json!({"messages": [{"role": "user", "content": 5}]})
                .to_string()
                .into_bytes(),
            400,
            Some("messages[0].content"),
        ),
        (
            "max_tokens of the wrong type",
            chat,
            json!({"messages": msgs, "max_tokens": "ten"})
                .to_string()
                .into_bytes(),
            400,
            Some("max_tokens"),
        ),
        (
            "temperature of the wrong type",
            chat,
            json!({"messages": msgs, "temperature": [1]})
                .to_string()
                .into_bytes(),
            400,
            Some("temperature"),
        ),
        (
            "stop of the wrong type",
            chat,
            json!({"messages": msgs, "stop": 7})
                .to_string()
                .into_bytes(),
            400,
            Some("stop"),
        ),
        (
            "unknown model",
            chat,
            json!({"model": "gpt-9", "messages": msgs})
                .to_string()
                .into_bytes(),
            404,
            Some("model"),
        ),
        (
            "embedding model for chat",
            chat,
            json!({"model": "tiny-embed", "messages": msgs})
                .to_string()
                .into_bytes(),
            400,
            Some("model"),
        ),
        (
            "empty messages",
            chat,
            json!({"messages": []}).to_string().into_bytes(),
            400,
            Some("messages"),
        ),
        (
            "unknown role",
            chat,
            json!({"messages": [{"role": "robot", "content": "x"}]})
                .to_string()
                .into_bytes(),
            400,
            Some("messages[0].role"),
        ),
        (
            "max_tokens zero",
            chat,
            json!({"messages": msgs, "max_tokens": 0})
                .to_string()
                .into_bytes(),
            400,
            Some("max_tokens"),
        ),
        (
            "max_tokens negative",
            chat,
            json!({"messages": msgs, "max_completion_tokens": -5})
                .to_string()
                .into_bytes(),
            400,
            Some("max_completion_tokens"),
        ),
        (
            "max_tokens past the context",
            chat,
            json!({"messages": msgs, "max_tokens": 100000})
                .to_string()
                .into_bytes(),
            400,
            Some("max_tokens"),
        ),
        (
            "prompt longer than the context",
            chat,
            json!({"messages": [{"role": "user", "content": long_prompt}]})
                .to_string()
                .into_bytes(),
            400,
            Some("messages"),
        ),
        (
            "temperature out of range",
            chat,
            json!({"messages": msgs, "temperature": 3})
                .to_string()
                .into_bytes(),
            400,
            Some("temperature"),
        ),
        (
            "top_p out of range",
            chat,
            json!({"messages": msgs, "top_p": 0})
                .to_string()
                .into_bytes(),
            400,
            Some("top_p"),
        ),
        (
            "more choices than taken",
            chat,
            json!({"messages": msgs, "n": 17}).to_string().into_bytes(),
            400,
            Some("n"),
        ),
        (
            "no choices",
            chat,
            json!({"messages": msgs, "n": 0}).to_string().into_bytes(),
            400,
            Some("n"),
        ),
        (
            "several choices of a session",
            chat,
            json!({"messages": msgs, "n": 2, "session_id": "s1"})
                .to_string()
                .into_bytes(),
            400,
            Some("n"),
        ),
        (
            "top_logprobs without logprobs",
            chat,
            json!({"messages": msgs, "top_logprobs": 2})
                .to_string()
                .into_bytes(),
            400,
            Some("top_logprobs"),
        ),
        (
            "bad session id",
            chat,
            json!({"messages": msgs, "session_id": "a b"})
                .to_string()
                .into_bytes(),
            400,
            Some("session_id"),
        ),
        (
            "completion without prompt",
            "/v1/completions",
            json!({"max_tokens": 3}).to_string().into_bytes(),
            400,
            Some("prompt"),
        ),
        (
            "empty prompt",
            "/v1/completions",
            json!({"prompt": ""}).to_string().into_bytes(),
            400,
            Some("prompt"),
        ),
        (
            "prompt of the wrong type",
            "/v1/completions",
            json!({"prompt": {"a": 1}}).to_string().into_bytes(),
            400,
            Some("prompt"),
        ),
        (
            "several prompts",
            "/v1/completions",
            json!({"prompt": ["a", "b"]}).to_string().into_bytes(),
            400,
            Some("prompt"),
        ),
        (
            "token id out of range",
            "/v1/completions",
            json!({"prompt": [1, -2]}).to_string().into_bytes(),
            400,
            Some("prompt"),
        ),
        (
            "embedding input of the wrong type",
            "/v1/embeddings",
            json!({"input": 3}).to_string().into_bytes(),
            400,
            Some("input"),
        ),
        (
            "empty embedding input",
            "/v1/embeddings",
            json!({"input": []}).to_string().into_bytes(),
            400,
            Some("input"),
        ),
        (
            "chat model for embeddings",
            "/v1/embeddings",
            json!({"model": "tiny-chat", "input": "x"})
                .to_string()
                .into_bytes(),
            400,
            Some("model"),
        ),
        (
            "body over the limit",
            chat,
            format!("{{\"messages\": \"{}\"}}", "y".repeat(70 * 1024)).into_bytes(),
            413,
            None,
        ),
    ];
    for (what, path, body, status, param) in &cases {
        let r = server.post_raw(path, &[], body);
        refused(&r, *status, *param, what);
        ok_chat(&server);
    }
    let r = server.get("/v1/nothing");
    refused(&r, 404, None, "unknown route");
    let r = server.get("/v1/chat/completions");
    refused(&r, 405, None, "wrong method");
    ok_chat(&server);
}

#[test]
fn slow_clients_time_out_without_holding_up_others() {
    let mut cfg = config();
    cfg.header_timeout = Duration::from_millis(500);
    cfg.body_timeout = Duration::from_millis(500);
    let server = TestServer::start(cfg);

    // Headers that never end: the connection is closed after the header timeout.
    let mut slow_headers = connect(server.addr);
    slow_headers
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n")
        .unwrap();
    // A body that never comes: 408 after the body timeout.
    let mut slow_body = connect(server.addr);
    slow_body
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mess")
        .unwrap();
    // Others are served meanwhile.
    let started = Instant::now();
    ok_chat(&server);
    assert!(started.elapsed() < Duration::from_millis(400));

    let mut rest = Vec::new();
    let read = slow_headers.read_to_end(&mut rest);
    assert!(
        read.is_err() || !String::from_utf8_lossy(&rest).contains("200"),
        "the slow client was answered: {rest:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    let r = common::read_response(&mut std::io::BufReader::new(slow_body));
    refused(&r, 408, None, "slow body");
    ok_chat(&server);
}

#[test]
fn a_model_with_no_room_for_the_prompt_in_its_kv_budget_refuses_it() {
    let mut cfg = config();
    cfg.engine.kv_blocks = 2;
    let server = TestServer::start(cfg);
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": "z".repeat(40), "max_tokens": 2}),
    );
    refused(&r, 400, Some("prompt"), "prompt over the KV budget");
    let v: Value = server
        .post(
            "/v1/completions",
            &json!({"prompt": "z", "max_tokens": 2, "temperature": 0}),
        )
        .json();
    assert_eq!(v["usage"]["completion_tokens"], 2);
}

/// Bodies a web page could POST from another origin without a preflight (plain text,
/// forms, a body without a type) are refused with 415 before they are parsed, on every
/// route that reads JSON; `application/json`, with a charset or not, is read.
#[test]
fn bodies_not_sent_as_json_are_refused() {
    let server = TestServer::start(config());
    let chat = br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}"#;
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"] {
        for ty in [
            "text/plain",
            "text/plain;charset=UTF-8",
            "multipart/form-data; boundary=x",
            "application/x-www-form-urlencoded",
        ] {
            let r = server.post_raw(path, &[("Content-Type", ty)], chat);
            refused(&r, 415, None, &format!("{path} as {ty}"));
        }
    }
    for ty in ["application/json", "application/json; charset=utf-8"] {
        let r = server.post_raw("/v1/chat/completions", &[("Content-Type", ty)], chat);
        assert_eq!(r.status, 200, "{ty}: {}", r.text());
    }
    let mut s = connect(server.addr);
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        chat.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(chat).unwrap();
    let r = common::read_response(&mut std::io::BufReader::new(s));
    refused(&r, 415, None, "a body without a type");
    assert_eq!(r.json()["error"]["code"], "unsupported_media_type");
    assert!(r.text().contains("application/json"), "{}", r.text());
    ok_chat(&server);
    server.stop();
}

/// What a request may ask for that the server does not do is refused by name, never
/// answered as if not asked; the values that ask for nothing are served.
#[test]
fn unserved_fields_are_refused_by_name() {
    let server = TestServer::start(config());
    let base = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        body
    };
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": {}}});
    for (field, value) in [
        ("best_of", json!(3)),
        ("tool_choice", json!("required")),
        ("functions", json!([{"name": "f"}])),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
        ),
        ("top_k", json!(-2)),
        ("min_p", json!(1.5)),
        ("repetition_penalty", json!(0)),
    ] {
        let r = server.post("/v1/chat/completions", &with(field, value.clone()));
        refused(&r, 400, Some(field), &format!("{field}: {value}"));
    }
    for (field, value) in [
        ("logit_bias", json!({})),
        ("best_of", json!(1)),
        ("tools", json!([])),
        ("tools", json!([tool])),
        ("tool_choice", json!("none")),
        ("response_format", json!({"type": "text"})),
        ("response_format", json!({"type": "json_object"})),
        (
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
        ),
        ("top_k", json!(-1)),
        ("min_p", json!(0.05)),
        ("repetition_penalty", json!(1.1)),
    ] {
        let r = server.post("/v1/chat/completions", &with(field, value.clone()));
        assert_eq!(r.status, 200, "{field}: {value}: {}", r.text());
    }
    // top_k is honoured: keeping one token samples what greedy decoding picks.
    let answer = |body: Value| {
        let r = server.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0]["message"]["content"].clone()
    };
    let long = with("max_tokens", json!(12));
    let greedy_long = {
        let mut b = long.clone();
        b["temperature"] = json!(0);
        answer(b)
    };
    for seed in 0..3 {
        let mut b = long.clone();
        b["temperature"] = json!(1.5);
        b["top_k"] = json!(1);
        b["seed"] = json!(seed);
        assert_eq!(answer(b), greedy_long, "top_k 1 at seed {seed}");
    }
    server.stop();
}

/// A token-id prompt with an id past the vocabulary is refused with 400 naming the id.
#[test]
fn token_ids_outside_the_vocabulary_are_refused() {
    let server = TestServer::start(config());
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": [1, 2, 4_000_000], "max_tokens": 2}),
    );
    refused(&r, 400, Some("prompt[2]"), "an id past the vocabulary");
    assert!(r.text().contains("4000000"), "{}", r.text());
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": [1, 2, 3], "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    server.stop();
}
