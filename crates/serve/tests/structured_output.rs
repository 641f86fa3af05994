//! `response_format`: replies of the synthetic chat model (random weights, sampled at
//! temperature 1) are JSON objects, or JSON valid against a schema, because each step's
//! logits are masked to what the grammar allows; without the mask they are noise.

mod common;

use common::{config, TestServer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

fn chat(format: Value, seed: u64, max_tokens: usize) -> Value {
    json!({
        "messages": [{"role": "user", "content": "Describe a cat as JSON."}],
        "temperature": 1,
        "seed": seed,
        "max_tokens": max_tokens,
        "response_format": format,
    })
}

fn schema_format(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": true}})
}

/// The reply's content and finish reason.
fn answer(server: &TestServer, body: &Value) -> (String, String) {
    let r = server.post("/v1/chat/completions", body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let choice = &v["choices"][0];
    (
        choice["message"]["content"].as_str().unwrap().to_owned(),
        choice["finish_reason"].as_str().unwrap().to_owned(),
    )
}

/// A random schema over the subset the validator below knows: objects whose properties are
/// all required (strings with a length bound, bounded integers, booleans, string enums,
/// short arrays, nested objects).
fn random_schema(rng: &mut ChaCha8Rng, depth: usize) -> Value {
    let n = rng.gen_range(1..=4);
    let mut properties = serde_json::Map::new();
    let mut required = Vec::new();
    for i in 0..n {
        let name = format!(
            "p{i}_{}",
            ["name", "id", "ok", "kind", "list", "sub"][i % 6]
        );
        let kinds = if depth < 2 { 6 } else { 5 };
        let value = match rng.gen_range(0..kinds) {
            0 => json!({"type": "string", "maxLength": rng.gen_range(1..=6)}),
            1 => {
                let lo = rng.gen_range(-50..=50);
                json!({"type": "integer", "minimum": lo, "maximum": lo + rng.gen_range(0..=100)})
            }
            2 => json!({"type": "boolean"}),
            3 => {
                let colours = ["red", "green", "blue"];
                json!({"enum": colours[..rng.gen_range(1..=3)]})
            }
            4 => {
                let items = match rng.gen_range(0..3) {
                    0 => json!({"type": "boolean"}),
                    1 => json!({"type": "integer", "minimum": 0, "maximum": 9}),
                    _ => json!({"type": "string", "maxLength": 3}),
                };
                let min = rng.gen_range(0..=1);
                json!({"type": "array", "items": items, "minItems": min,
                       "maxItems": min + rng.gen_range(0..=2)})
            }
            _ => random_schema(rng, depth + 1),
        };
        properties.insert(name.clone(), value);
        required.push(name);
    }
    json!({"type": "object", "properties": properties, "required": required,
           "additionalProperties": false})
}

/// Whether `v` validates against `schema` (the subset [`random_schema`] writes).
fn validate(v: &Value, schema: &Value) -> Result<(), String> {
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return match options.contains(v) {
            true => Ok(()),
            false => Err(format!("{v} is not one of {options:?}")),
        };
    }
    let bound = |k: &str| schema.get(k).and_then(Value::as_i64);
    match schema["type"].as_str() {
        Some("object") => {
            let object = v.as_object().ok_or(format!("{v} is not an object"))?;
            let properties = schema["properties"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            for r in schema["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap();
                if !object.contains_key(r) {
                    return Err(format!("{v} lacks {r}"));
                }
            }
            for (k, value) in object {
                match properties.get(k) {
                    Some(s) => validate(value, s)?,
                    None if schema["additionalProperties"] == json!(false) => {
                        return Err(format!("{v} has {k}, which the schema does not"))
                    }
                    None => {}
                }
            }
            Ok(())
        }
        Some("string") => {
            let s = v.as_str().ok_or(format!("{v} is not a string"))?;
            let n = s.chars().count() as i64;
            if bound("maxLength").is_some_and(|m| n > m)
                || bound("minLength").is_some_and(|m| n < m)
            {
                return Err(format!("{v}: length {n} out of bounds"));
            }
            Ok(())
        }
        Some("integer") => {
            let i = v.as_i64().ok_or(format!("{v} is not an integer"))?;
            if bound("minimum").is_some_and(|m| i < m) || bound("maximum").is_some_and(|m| i > m) {
                return Err(format!("{v} out of bounds"));
            }
            Ok(())
        }
        Some("boolean") => v
            .as_bool()
            .map(|_| ())
            .ok_or(format!("{v} is not a boolean")),
        Some("array") => {
            let a = v.as_array().ok_or(format!("{v} is not an array"))?;
            let n = a.len() as i64;
            if bound("maxItems").is_some_and(|m| n > m) || bound("minItems").is_some_and(|m| n < m)
            {
                return Err(format!("{v}: {n} items out of bounds"));
            }
            a.iter().try_for_each(|x| validate(x, &schema["items"]))
        }
        other => Err(format!("the validator does not know type {other:?}")),
    }
}

/// Whether `text` is one JSON object (RFC 8259 syntax; serde_json refuses numbers such as
/// 2E2539277703, which are JSON all the same).
fn is_json_object(text: &str) -> bool {
    fn ws(b: &[u8], i: &mut usize) {
        while *i < b.len() && b" \t\n\r".contains(&b[*i]) {
            *i += 1;
        }
    }
    fn digits(b: &[u8], i: &mut usize) -> bool {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i > start
    }
    fn value(b: &[u8], i: &mut usize) -> bool {
        ws(b, i);
        let ok = match b.get(*i) {
            Some(b'{') => {
                *i += 1;
                ws(b, i);
                if b.get(*i) == Some(&b'}') {
                    *i += 1;
                    return true;
                }
                loop {
                    ws(b, i);
                    if b.get(*i) != Some(&b'"') || !string(b, i) {
                        return false;
                    }
                    ws(b, i);
                    if b.get(*i) != Some(&b':') {
                        return false;
                    }
                    *i += 1;
                    if !value(b, i) {
                        return false;
                    }
                    ws(b, i);
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b'}') => break,
                        _ => return false,
                    }
                }
                *i += 1;
                true
            }
            Some(b'[') => {
                *i += 1;
                ws(b, i);
                if b.get(*i) == Some(&b']') {
                    *i += 1;
                    return true;
                }
                loop {
                    if !value(b, i) {
                        return false;
                    }
                    ws(b, i);
                    match b.get(*i) {
                        Some(b',') => *i += 1,
                        Some(b']') => break,
                        _ => return false,
                    }
                }
                *i += 1;
                true
            }
            Some(b'"') => string(b, i),
            Some(b't') | Some(b'f') | Some(b'n') => ["true", "false", "null"].iter().any(|w| {
                let hit = b[*i..].starts_with(w.as_bytes());
                if hit {
                    *i += w.len();
                }
                hit
            }),
            Some(_) => {
                if b[*i] == b'-' {
                    *i += 1;
                }
                if b.get(*i) == Some(&b'0') {
                    *i += 1;
                } else if !digits(b, i) {
                    return false;
                }
                if b.get(*i) == Some(&b'.') {
                    *i += 1;
                    if !digits(b, i) {
                        return false;
                    }
                }
                if matches!(b.get(*i), Some(b'e') | Some(b'E')) {
                    *i += 1;
                    if matches!(b.get(*i), Some(b'+') | Some(b'-')) {
                        *i += 1;
                    }
                    if !digits(b, i) {
                        return false;
                    }
                }
                true
            }
            None => false,
        };
        ok
    }
    fn string(b: &[u8], i: &mut usize) -> bool {
        *i += 1;
        while let Some(&c) = b.get(*i) {
            *i += 1;
            match c {
                b'"' => return true,
                b'\\' => match b.get(*i) {
                    Some(b'u') => {
                        let hex = b.get(*i + 1..*i + 5);
                        if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                            return false;
                        }
                        *i += 5;
                    }
                    Some(e) if b"\"\\/bfnrt".contains(e) => *i += 1,
                    _ => return false,
                },
                c if c < 0x20 => return false,
                _ => {}
            }
        }
        false
    }
    let b = text.as_bytes();
    let mut i = 0;
    ws(b, &mut i);
    if b.get(i) != Some(&b'{') || !value(b, &mut i) {
        return false;
    }
    ws(b, &mut i);
    i == b.len()
}

#[test]
fn the_json_recognizer_tells_good_from_bad() {
    for good in [
        r#"{}"#,
        r#" {"a": [1, -2.5e+3, "x\u00e9\n"], "b": {"c": null}} "#,
        r#"{"n": 2E2539277703}"#,
    ] {
        assert!(is_json_object(good), "{good}");
    }
    for bad in [
        r#"[]"#,
        r#"{"a"}"#,
        r#"{"a": 01}"#,
        r#"{"a": "x"#,
        r#"{"a": 1,}"#,
        r#"{} x"#,
        "{\"a\": \"\u{1}\"}",
    ] {
        assert!(!is_json_object(bad), "{bad}");
    }
}

#[test]
fn the_validator_tells_good_from_bad() {
    let schema = json!({"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 3},
        "b": {"type": "array", "items": {"enum": ["x"]}, "maxItems": 1}},
        "required": ["a", "b"], "additionalProperties": false});
    assert!(validate(&json!({"a": 2, "b": ["x"]}), &schema).is_ok());
    for bad in [
        json!({"a": 4, "b": []}),
        json!({"a": 1}),
        json!({"a": 1, "b": ["y"]}),
        json!({"a": 1, "b": ["x", "x"]}),
        json!({"a": 1, "b": [], "c": 0}),
        json!("a"),
    ] {
        assert!(validate(&bad, &schema).is_err(), "{bad}");
    }
}

#[test]
fn json_object_replies_are_json_objects() {
    let server = TestServer::start(config());
    for seed in 0..6 {
        let (text, finish) = answer(&server, &chat(json!({"type": "json_object"}), seed, 400));
        assert_eq!(finish, "stop", "seed {seed}: {text:?}");
        assert!(is_json_object(&text), "seed {seed}: {text:?}");
    }
    // Text completions take it too.
    let r = server.post(
        "/v1/completions",
        &json!({"prompt": "A cat:", "temperature": 1, "seed": 3, "max_tokens": 400,
                "response_format": {"type": "json_object"}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{text:?}");
    assert!(is_json_object(text), "{text:?}");
    server.stop();
}

#[test]
fn replies_validate_against_generated_schemas() {
    let server = TestServer::start(config());
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    for case in 0..24 {
        let schema = random_schema(&mut rng, 0);
        for seed in [case, case + 100] {
            let (text, finish) = answer(&server, &chat(schema_format(&schema), seed, 400));
            assert_eq!(finish, "stop", "schema {schema}, seed {seed}: {text:?}");
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("schema {schema}, seed {seed}: {e}: {text:?}"));
            if let Err(e) = validate(&v, &schema) {
                panic!("schema {schema}, seed {seed}: {e}");
            }
        }
    }
    // The stream carries the same reply.
    let schema = random_schema(&mut rng, 0);
    let mut body = chat(schema_format(&schema), 5, 400);
    let (whole, _) = answer(&server, &body);
    body["stream"] = json!(true);
    let r = server.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.text());
    let streamed: String = r
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            let v: Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(streamed, whole);
    server.stop();
}

#[test]
fn greedy_replies_follow_the_schema_too() {
    let server = TestServer::start(config());
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 5},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
        "required": ["name", "age", "tags"], "additionalProperties": false});
    let mut body = chat(schema_format(&schema), 0, 400);
    body["temperature"] = json!(0);
    let (text, finish) = answer(&server, &body);
    assert_eq!(finish, "stop", "{text:?}");
    validate(&serde_json::from_str(&text).unwrap(), &schema).unwrap();
    server.stop();
}

#[test]
fn bad_formats_are_refused_and_short_budgets_end_by_length() {
    let server = TestServer::start(config());
    let refused = |format: Value, param: &str| {
        let r = server.post("/v1/chat/completions", &chat(format.clone(), 0, 10));
        assert_eq!(r.status, 400, "{format}: {}", r.text());
        let v = r.json();
        assert_eq!(v["error"]["param"], param, "{format}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("response_format"),
            "{v}"
        );
        v["error"]["message"].as_str().unwrap().to_owned()
    };
    let why = refused(
        schema_format(&json!({"type": "no-such-type"})),
        "response_format",
    );
    assert!(why.contains("no-such-type"), "{why}");
    refused(
        schema_format(
            &json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}),
        ),
        "response_format",
    );
    refused(json!({"type": "yaml"}), "response_format.type");
    refused(json!("json_object"), "response_format");
    refused(
        json!({"type": "json_schema"}),
        "response_format.json_schema",
    );
    refused(
        json!({"type": "json_schema", "json_schema": {"schema": {}}}),
        "response_format.json_schema.name",
    );
    // A tool choice that requires a call and a JSON format cannot both hold.
    let mut body = chat(json!({"type": "json_object"}), 0, 10);
    body["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    body["tool_choice"] = json!("required");
    let r = server.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "tool_choice");

    let schema = json!({"type": "object", "properties": {"word": {"type": "string", "minLength": 20}},
                        "required": ["word"], "additionalProperties": false});
    for seed in 0..3 {
        let (text, finish) = answer(&server, &chat(schema_format(&schema), seed, 10));
        assert_eq!(finish, "length", "{text:?}");
        assert!(text.starts_with("{\"word\": \""), "{text:?}");
        assert!(serde_json::from_str::<Value>(&text).is_err(), "{text:?}");
    }
    // The mask's cost is on /metrics.
    let metrics = server.get("/metrics").text();
    assert!(
        metrics.contains("quench_grammar_mask_seconds_count"),
        "{metrics}"
    );
    server.stop();
}

/// `response_format: {"type": "grammar"}` holds a reply to a Lark grammar (here a choice
/// of words and a bounded number, which random weights never write unasked); a grammar
/// that does not compile is refused naming the field.
#[test]
fn a_lark_grammar_is_followed_and_a_bad_one_refused() {
    let server = TestServer::start(config());
    let grammar = "start: (\"yes\" | \"no\") \", \" NUM\nNUM: /[1-9][0-9]?/\n";
    let format = json!({"type": "grammar", "grammar": grammar});
    for seed in 0..6 {
        let (text, finish) = answer(&server, &chat(format.clone(), seed, 20));
        let (word, num) = text.split_once(", ").unwrap_or_else(|| panic!("{text:?}"));
        assert!(word == "yes" || word == "no", "{text:?}");
        assert!(
            num.parse::<u32>().is_ok_and(|n| (1..100).contains(&n)),
            "{text:?}"
        );
        assert_eq!(finish, "stop", "{text:?}");
    }
    for (bad, param) in [
        (
            json!({"type": "grammar", "grammar": "start: undefined_rule"}),
            "response_format",
        ),
        (
            json!({"type": "grammar", "grammar": ""}),
            "response_format.grammar",
        ),
        (json!({"type": "grammar"}), "response_format.grammar"),
    ] {
        let r = server.post("/v1/chat/completions", &chat(bad.clone(), 0, 5));
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{}", r.text());
    }
    server.stop();
}
