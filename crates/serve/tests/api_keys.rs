//! A server started with API keys: every route but the health check and the chat page
//! answers 401 in OpenAI's shape without a key or with a wrong one, and serves with any
//! of its keys.

mod common;

use common::{config, request, TestServer};
use quench_serve::{ServeConfig, Server};

#[test]
fn routes_need_one_of_the_keys() {
    let server = TestServer::start(ServeConfig {
        api_keys: vec!["sk-first".into(), "sk-second".into()],
        ..config()
    });
    let call = |path: &str, key: Option<&str>| {
        let auth = key.map(|k| format!("Bearer {k}"));
        let headers: Vec<(&str, &str)> = auth
            .as_deref()
            .map(|a| vec![("Authorization", a)])
            .unwrap_or_default();
        request(server.addr, "GET", path, &headers, None)
    };
    for path in ["/v1/models", "/v1/sessions", "/metrics"] {
        for key in [None, Some("sk-firs"), Some("sk-first-and-more")] {
            let r = call(path, key);
            assert_eq!(r.status, 401, "{path} with {key:?}: {}", r.text());
            let e = &r.json()["error"];
            assert_eq!(e["type"], "authentication_error", "{path}");
            assert_eq!(e["code"], "invalid_api_key", "{path}");
            assert_eq!(r.header("www-authenticate"), Some("Bearer"));
        }
        for key in ["sk-first", "sk-second"] {
            assert_eq!(call(path, Some(key)).status, 200, "{path} with {key}");
        }
    }
    let missing = call("/v1/models", None).json();
    assert!(
        missing["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("Authorization: Bearer")),
        "{missing}"
    );
    // The health check and the chat page stay open.
    assert_eq!(call("/health", None).status, 200);
    assert_eq!(call("/", None).status, 200);
    // A POST is refused before its body is read as a request.
    let r = request(
        server.addr,
        "POST",
        "/v1/chat/completions",
        &[],
        Some(b"{\"messages\": []}"),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    server.stop();
}

#[test]
fn an_unusable_key_is_refused_at_start() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let err = runtime
        .block_on(Server::start(ServeConfig {
            api_keys: vec!["two words".into()],
            ..config()
        }))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("API key 1"), "{err}");
}

/// A session belongs to the key that made it: another key neither lists, continues nor
/// deletes it.
#[test]
fn sessions_belong_to_their_key() {
    let server = TestServer::start(ServeConfig {
        api_keys: vec!["sk-alice".into(), "sk-bob".into()],
        ..config()
    });
    let call = |method: &str, path: &str, key: &str, body: Option<&serde_json::Value>| {
        let auth = format!("Bearer {key}");
        let text = body.map(|b| b.to_string());
        request(
            server.addr,
            method,
            path,
            &[("Authorization", auth.as_str())],
            text.as_deref().map(str::as_bytes),
        )
    };
    let turn = serde_json::json!({
        "messages": [{"role": "user", "content": "my secret is 1234"}],
        "max_tokens": 2,
        "session_id": "notes",
    });
    let r = call("POST", "/v1/chat/completions", "sk-alice", Some(&turn));
    assert_eq!(r.status, 200, "{}", r.text());
    let ids = |key: &str| -> Vec<String> {
        call("GET", "/v1/sessions", key, None).json()["data"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|s| s["id"].as_str().expect("an id").to_owned())
            .collect()
    };
    assert_eq!(ids("sk-alice"), ["notes"]);
    assert!(ids("sk-bob").is_empty());
    let r = call("POST", "/v1/chat/completions", "sk-bob", Some(&turn));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "session_id");
    assert_eq!(
        call("DELETE", "/v1/sessions/notes", "sk-bob", None).status,
        404
    );
    assert_eq!(
        call("DELETE", "/v1/sessions/notes", "sk-alice", None).status,
        200
    );
    server.stop();
}
