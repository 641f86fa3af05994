//! `tools` on chat completions, on the synthetic chat model (random weights, sampled at
//! temperature 1; its template knows no tools, so they are described in the system
//! message): a required or named choice gets calls of the defined tools with valid
//! arguments, whole or streamed; earlier calls and results are taken back; bad tool
//! requests are refused by name.

mod common;

use common::{config, TestServer};
use serde_json::{json, Value};

fn tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "parameters": {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9},
                       "unit": {"enum": ["c", "f"]}},
        "required": ["n", "unit"], "additionalProperties": false}}})
}

fn request(tools: Value, choice: Value, seed: u64) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Go."}],
        "tools": tools,
        "tool_choice": choice,
        "temperature": 1,
        "seed": seed,
        "max_tokens": 120,
    })
}

/// Name and arguments of each call, the arguments checked against `tool`'s schema.
fn calls(list: &Value) -> Vec<(String, Value)> {
    list.as_array()
        .expect("tool_calls is a list")
        .iter()
        .map(|c| {
            assert_eq!(c["type"], "function", "{c}");
            assert!(
                c["id"].as_str().is_some_and(|id| id.starts_with("call_")),
                "{c}"
            );
            let name = c["function"]["name"].as_str().unwrap().to_owned();
            let text = c["function"]["arguments"]
                .as_str()
                .expect("arguments are a string");
            let args: Value = serde_json::from_str(text).unwrap();
            assert!((1..=9).contains(&args["n"].as_i64().unwrap_or(0)), "{args}");
            assert!(
                ["c", "f"].contains(&args["unit"].as_str().unwrap_or("")),
                "{args}"
            );
            assert_eq!(args.as_object().unwrap().len(), 2, "{args}");
            (name, args)
        })
        .collect()
}

#[test]
fn a_required_or_named_choice_gets_valid_calls_whole_and_streamed() {
    let server = TestServer::start(config());
    let tools = json!([tool("weather"), tool("time")]);
    let named = json!({"type": "function", "function": {"name": "time"}});
    for seed in 0..4 {
        for (choice, only) in [(json!("required"), None), (named.clone(), Some("time"))] {
            // One call per reply: random weights, free to go on, call until out of tokens.
            let mut body = request(tools.clone(), choice.clone(), seed);
            body["parallel_tool_calls"] = json!(false);
            let r = server.post("/v1/chat/completions", &body);
            assert_eq!(r.status, 200, "{}", r.text());
            let v = r.json();
            let choice0 = &v["choices"][0];
            assert_eq!(choice0["finish_reason"], "tool_calls", "{v}");
            assert_eq!(choice0["message"]["content"], Value::Null, "{v}");
            let whole = calls(&choice0["message"]["tool_calls"]);
            assert_eq!(whole.len(), 1, "{v}");
            for (name, _) in &whole {
                match only {
                    Some(n) => assert_eq!(name, n),
                    None => assert!(name == "weather" || name == "time", "{name}"),
                }
            }

            // The same seed streamed: the deltas add up to the same calls.
            let mut body = body;
            body["stream"] = json!(true);
            let r = server.post("/v1/chat/completions", &body);
            assert_eq!(r.status, 200, "{}", r.text());
            let mut streamed = Vec::new();
            let mut finish = None;
            for e in r.events() {
                if e == "[DONE]" {
                    break;
                }
                let chunk: Value = serde_json::from_str(&e).unwrap();
                let c = &chunk["choices"][0];
                if let Some(list) = c["delta"].get("tool_calls") {
                    assert_eq!(list[0]["index"], streamed.len(), "{chunk}");
                    streamed.extend(calls(list));
                }
                if let Some(f) = c["finish_reason"].as_str() {
                    finish = Some(f.to_owned());
                }
            }
            assert_eq!(streamed, whole, "seed {seed}");
            assert_eq!(finish.as_deref(), Some("tool_calls"));
        }
    }
    // Parallel calls: as many as the reply holds, each valid; a reply cut off inside a
    // call comes back as text, flagged, with finish_reason "length".
    let mut several = 0;
    for seed in 0..6 {
        let r = server.post(
            "/v1/chat/completions",
            &request(tools.clone(), json!("required"), seed),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let c = &v["choices"][0];
        match c["finish_reason"].as_str() {
            Some("tool_calls") => several += calls(&c["message"]["tool_calls"]).len(),
            Some("length") => {
                let text = c["message"]["content"].as_str().unwrap();
                assert!(text.starts_with("<tool_call>\n{\"name\": \""), "{v}");
                assert!(c["message"]["tool_call_error"].is_string(), "{v}");
            }
            other => panic!("finish_reason {other:?}: {v}"),
        }
    }
    eprintln!("parallel: {several} calls in the replies that finished");
    server.stop();
}

#[test]
fn earlier_calls_and_results_are_taken_back_and_auto_may_answer_in_text() {
    let server = TestServer::start(config());
    let history = json!([
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "weather", "arguments": "{\"n\": 2, \"unit\": \"c\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"t\": 3}"}
    ]);
    let mut body = request(json!([tool("weather")]), json!("auto"), 1);
    body["messages"] = history.clone();
    body["max_tokens"] = json!(4);
    let r = server.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    // Random weights answer in text; whatever comes is content or calls, never an error.
    assert!(
        c["message"]["content"].is_string() || c["message"]["tool_calls"].is_array(),
        "{v}"
    );
    // The history's call and result are in the prompt: it is longer than without them.
    let mut short = body.clone();
    short["messages"] = json!([{"role": "user", "content": "Go."}]);
    let without = server.post("/v1/chat/completions", &short).json();
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap()
            > without["usage"]["prompt_tokens"].as_u64().unwrap() + 40,
        "{v} {without}"
    );
    // tool_choice "none" leaves the tools out of the prompt.
    let mut none = short.clone();
    none["tool_choice"] = json!("none");
    let plain = server.post("/v1/chat/completions", &none).json();
    assert!(
        plain["usage"]["prompt_tokens"].as_u64().unwrap()
            < without["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{plain} {without}"
    );
    server.stop();
}

#[test]
fn bad_tool_requests_are_refused_by_name() {
    let server = TestServer::start(config());
    let base = request(json!([tool("weather")]), json!("auto"), 0);
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        body
    };
    let cases = [
        (with("tools", json!([{"type": "code"}])), "tools[0].type"),
        (
            with(
                "tools",
                json!([{"type": "function", "function": {"name": "no spaces"}}]),
            ),
            "tools[0].function.name",
        ),
        (
            with("tools", json!([tool("weather"), tool("weather")])),
            "tools[1].function.name",
        ),
        (
            with(
                "tool_choice",
                json!({"type": "function", "function": {"name": "elsewhere"}}),
            ),
            "tool_choice.function.name",
        ),
        (with("tool_choice", json!("sometimes")), "tool_choice"),
        (
            {
                let mut b = with("tools", json!([]));
                b["tool_choice"] = json!("required");
                b
            },
            "tool_choice",
        ),
        (
            {
                let mut b = with("tool_choice", json!("required"));
                b["response_format"] = json!({"type": "json_object"});
                b
            },
            "tool_choice",
        ),
        (
            with(
                "messages",
                json!([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
            ),
            "messages[0].tool_calls[0]",
        ),
        (
            with(
                "messages",
                json!([{"role": "user", "content": "x", "tool_calls": []}]),
            ),
            "messages[0].tool_calls",
        ),
    ];
    for (body, param) in cases {
        let r = server.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{param}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{}", r.text());
    }
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": "x", "tools": [tool("weather")], "max_tokens": 2}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "tools");
    server.stop();
}
