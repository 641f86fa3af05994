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
