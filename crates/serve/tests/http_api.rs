//! The HTTP API end to end on the synthetic models.

mod common;

use common::{config, TestServer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn random_text(rng: &mut ChaCha8Rng, len: usize) -> String {
    (0..len)
        .map(|_| rng.gen_range(b'a'..=b'z') as char)
        .collect()
}

/// The text of a streamed chat or completion.
fn streamed_text(events: &[String]) -> String {
    events
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|v| {
            let c = v["choices"].get(0)?.clone();
            c["delta"]["content"]
                .as_str()
                .or(c["text"].as_str())
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn models_health_metrics_and_page() {
    let server = TestServer::start(config());
    let models = server.get("/v1/models");
    assert_eq!(models.status, 200);
    let data = models.json()["data"].as_array().unwrap().clone();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tiny-chat", "tiny-embed"]);
    assert_eq!(data[0]["context_length"], 2048);
    assert_eq!(server.get("/v1/models/tiny-embed").json()["dimensions"], 32);
    assert_eq!(server.get("/v1/models/nope").status, 404);

    assert_eq!(server.get("/health").json()["status"], "ok");
    let page = server.get("/");
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(page.text().contains("/v1/chat/completions") && !page.text().contains("http"));

    let reply = server.post(
        "/v1/chat/completions",
        &json!({"model": "tiny-chat", "messages": user("hi"), "max_tokens": 3}),
    );
    assert_eq!(reply.status, 200);
    let metrics = server.get("/metrics").text();
    for family in [
        "quench_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1",
        "quench_queue_depth{model=\"tiny-chat\"}",
        "quench_kv_blocks_used{model=\"tiny-chat\"}",
        "quench_time_to_first_token_seconds_count{model=\"tiny-chat\"} 1",
        "quench_inter_token_latency_seconds_bucket",
        "quench_completion_tokens_total{model=\"tiny-chat\"}",
    ] {
        assert!(metrics.contains(family), "no {family} in\n{metrics}");
    }
}

#[test]
fn chat_streamed_and_whole_agree_and_count_tokens() {
    let server = TestServer::start(config());
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let question = random_text(&mut rng, 20);
    let body = json!({"model": "tiny-chat", "messages": user(&question), "max_tokens": 24,
                      "temperature": 0});
    let whole = server.post("/v1/chat/completions", &body);
    assert_eq!(whole.status, 200, "{}", whole.text());
    assert!(whole.header("x-request-id").is_some());
    let v = whole.json();
    assert_eq!(v["object"], "chat.completion");
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let usage = &v["usage"];
    // "<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n", one token per byte.
    assert_eq!(
        usage["prompt_tokens"],
        1 + 5 + question.len() + 1 + 1 + 1 + 10
    );
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..=24).contains(&completion));
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert_eq!(finish == "length", completion == 24, "{v}");

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    streamed_body["stream_options"] = json!({"include_usage": true});
    let stream = server.post("/v1/chat/completions", &streamed_body);
    assert_eq!(stream.status, 200);
    assert_eq!(stream.header("content-type"), Some("text/event-stream"));
    let events = stream.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed_text(&events), answer);
    let usage_chunk: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    // The same counts, but the second request found the first's prompt in the prefix
    // cache: its whole blocks of 16, all but the last two tokens at most.
    let mut expected = usage.clone();
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    expected["prompt_tokens_details"]["cached_tokens"] = json!((prompt_tokens - 2) / 16 * 16);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(usage_chunk["usage"], expected);
    assert_eq!(usage_chunk["choices"], json!([]));
    let last_choice: Value = serde_json::from_str(&events[events.len() - 3]).unwrap();
    assert_eq!(last_choice["choices"][0]["finish_reason"], finish);
}

#[test]
fn completions_with_stop_strings_and_logprobs() {
    let server = TestServer::start(config());
    let free = server.post(
        "/v1/completions",
        &json!({"prompt": "Once upon", "max_tokens": 30, "temperature": 0, "logprobs": 3}),
    );
    assert_eq!(free.status, 200, "{}", free.text());
    let v = free.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap().to_owned();
    let lp = &v["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let joined: String = tokens.iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(joined, text);
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the chosen token is the most likely one.
        let best = top
            .values()
            .map(|x| x.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        assert!((best - chosen).abs() < 1e-6 && chosen <= 0.0);
    }
    assert!(text.len() >= 4, "the tiny model stopped at once: {text:?}");

    let stop = text[2..4].to_owned();
    for stream in [false, true] {
        let r = server.post(
            "/v1/completions",
            &json!({"prompt": "Once upon", "max_tokens": 30, "temperature": 0,
                    "stop": [stop, "\u{1}never"], "stream": stream}),
        );
        let got = if stream {
            streamed_text(&r.events())
        } else {
            r.json()["choices"][0]["text"].as_str().unwrap().to_owned()
        };
        assert_eq!(got, text[..text.find(&stop).unwrap()], "stream: {stream}");
    }
}

#[test]
fn sampling_with_a_seed_repeats() {
    let server = TestServer::start(config());
    let body = json!({"prompt": "abc", "max_tokens": 20, "temperature": 1.5, "top_p": 0.9,
                      "seed": 1234});
    let a = server.post("/v1/completions", &body).json();
    let b = server.post("/v1/completions", &body).json();
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
}

/// `n` choices: each drawn as a request of its own with the seed plus its index (so the
/// first is the one-choice answer), whole and streamed alike; usage counts the prompt
/// once and every choice's tokens.
#[test]
fn several_choices_are_drawn_with_seeds_of_their_own() {
    let server = TestServer::start(config());
    let ask = |n: u64, seed: u64, stream: bool| {
        let body = json!({"messages": user("tell me something"), "max_tokens": 12,
                          "temperature": 1.0, "seed": seed, "n": n, "stream": stream,
                          "stream_options": {"include_usage": true}});
        server.post("/v1/chat/completions", &body)
    };
    let alone: Vec<Value> = (0..3).map(|k| ask(1, 40 + k, false).json()).collect();
    let texts: Vec<&str> = alone
        .iter()
        .map(|a| a["choices"][0]["message"]["content"].as_str().unwrap())
        .collect();
    assert!(texts.iter().any(|t| *t != texts[0]), "{texts:?}");

    let whole = ask(3, 40, false).json();
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (k, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], k);
        assert_eq!(c["message"]["content"], texts[k], "choice {k}");
    }
    let completion: u64 = alone
        .iter()
        .map(|a| a["usage"]["completion_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(
        whole["usage"]["prompt_tokens"],
        alone[0]["usage"]["prompt_tokens"]
    );
    assert_eq!(whole["usage"]["completion_tokens"], completion);

    let events = ask(3, 40, true).events();
    let mut streamed = vec![String::new(); 3];
    let mut finished = [false; 3];
    let mut usage = None;
    for e in events.iter().filter(|e| e.as_str() != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(c) = v["choices"].get(0) {
            let k = c["index"].as_u64().unwrap() as usize;
            streamed[k].push_str(c["delta"]["content"].as_str().unwrap_or(""));
            finished[k] |= !c["finish_reason"].is_null();
        } else {
            usage = Some(v["usage"].clone());
        }
    }
    assert_eq!(streamed, texts);
    assert_eq!(finished, [true; 3]);
    assert_eq!(usage.unwrap()["completion_tokens"], completion);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
}

#[test]
fn embeddings_by_model_name() {
    let server = TestServer::start(config());
    let r = server.post(
        "/v1/embeddings",
        &json!({"model": "tiny-embed", "input": ["the cat", "a dog ran"]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        let e: Vec<f64> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(e.len(), 32);
        let norm: f64 = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }
    // The tiny vocabulary spells words by letter: [CLS] t ##h ##e c ##a ##t [SEP] (8) and
    // [CLS] a d ##o ##g r ##a ##n [SEP] (9).
    assert_eq!(v["usage"]["prompt_tokens"], 17);
    let single = server.post(
        "/v1/embeddings",
        &json!({"model": "tiny-embed", "input": "the cat"}),
    );
    assert_eq!(single.json()["data"][0]["embedding"], data[0]["embedding"]);
    let wrong = server.post(
        "/v1/embeddings",
        &json!({"model": "tiny-chat", "input": "x"}),
    );
    assert_eq!(
        (wrong.status, wrong.json()["error"]["param"].clone()),
        (400, json!("model"))
    );
}

#[test]
fn a_session_continues_and_a_reset_takes_effect() {
    let server = TestServer::start(config());
    let ask = |messages: Value, session: Option<&str>| {
        let mut body = json!({"messages": messages, "max_tokens": 16, "temperature": 0});
        if let Some(s) = session {
            body["session_id"] = json!(s);
        }
        let r = server.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let first = ask(user("Hello there"), Some("s1"));
    let reply1 = first["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let second = ask(user("And then?"), Some("s1"));
    let reply2 = second["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    // The session kept the first turn: only the new part was computed ...
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= first["usage"]["prompt_tokens"].as_u64().unwrap(),
        "{second}"
    );
    // ... and the answer is what the whole conversation sent at once gives.
    let whole = ask(
        json!([{"role": "user", "content": "Hello there"},
               {"role": "assistant", "content": reply1},
               {"role": "user", "content": "And then?"}]),
        None,
    );
    assert_eq!(whole["choices"][0]["message"]["content"], reply2.as_str());
    assert_eq!(
        whole["usage"]["prompt_tokens"],
        second["usage"]["prompt_tokens"]
    );

    let info = server.get("/v1/sessions/s1").json();
    assert_eq!(info["id"], "s1");
    assert_eq!(info["turns"], 2);
    assert!(info["cached_tokens"].as_u64().unwrap() > 0);

    // The header names a session too; after DELETE the session starts empty.
    assert_eq!(server.delete("/v1/sessions/s1").status, 200);
    assert_eq!(server.delete("/v1/sessions/s1").status, 404);
    assert_eq!(server.get("/v1/sessions/s1").status, 404);
    let r = server.post_raw(
        "/v1/chat/completions",
        &[("X-Session-Id", "s1")],
        json!({"messages": user("And then?"), "max_tokens": 16, "temperature": 0})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.header("x-session-id"), Some("s1"));
    let fresh = ask(user("And then?"), None);
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        fresh["choices"][0]["message"]["content"]
    );
    assert_eq!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
}

/// `/tokenize` gives the ids a completion or a chat would feed, `/detokenize` the text of
/// ids; both refuse what they cannot take by name.
#[test]
fn tokenize_and_detokenize_round_trip() {
    let server = TestServer::start(config());
    let r = server.post("/tokenize", &json!({"prompt": "hello there"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let tokens: Vec<u64> = v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_u64().expect("an id"))
        .collect();
    assert_eq!(v["count"].as_u64(), Some(tokens.len() as u64));
    assert!(v["max_model_len"].as_u64().is_some_and(|n| n > 0), "{v}");
    // The same ids a completion counts as its prompt.
    let c = server.post(
        "/v1/completions",
        &json!({"prompt": "hello there", "max_tokens": 1}),
    );
    assert_eq!(
        c.json()["usage"]["prompt_tokens"].as_u64(),
        Some(tokens.len() as u64)
    );
    let r = server.post("/detokenize", &json!({"tokens": tokens}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.json()["prompt"]
            .as_str()
            .is_some_and(|t| t.contains("hello there")),
        "{}",
        r.text()
    );
    let chat = server.post(
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "hello there"}]}),
    );
    assert_eq!(chat.status, 200, "{}", chat.text());
    assert!(
        chat.json()["count"].as_u64() > Some(tokens.len() as u64),
        "the template adds tokens"
    );
    for (path, body, param) in [
        ("/tokenize", json!({}), "prompt"),
        (
            "/tokenize",
            json!({"prompt": "a", "messages": []}),
            "prompt",
        ),
        (
            "/detokenize",
            json!({"tokens": [1, 4_000_000]}),
            "tokens[1]",
        ),
    ] {
        let r = server.post(path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{path} {body}");
    }
    server.stop();
}

/// `logit_bias` moves the logits of the tokens it names, and the presence and frequency
/// penalties push back tokens already drawn; ids past the vocabulary and values out of
/// range are refused by name.
#[test]
fn logit_bias_and_penalties_are_honoured() {
    let server = TestServer::start(config());
    let text_of = |ids: &[u32]| {
        let r = server.post("/detokenize", &json!({"tokens": ids}));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["prompt"].as_str().unwrap().to_owned()
    };
    let (x, y) = (b'x' as u32, b'y' as u32);
    let complete = |extra: Value| {
        let mut body = json!({"prompt": "Say something:", "max_tokens": 16, "temperature": 0,
                              "ignore_eos": true});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = server.post("/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    let plain = complete(json!({}));
    let forced = complete(json!({"logit_bias": {x.to_string(): 100}}));
    assert_eq!(forced, text_of(&[x; 16]), "plain: {plain:?}");
    // With penalties, the forced token gives way to the next most favoured one.
    let bias = json!({x.to_string(): 100, y.to_string(): 90});
    let penalised = complete(json!({"logit_bias": bias, "presence_penalty": 2,
                                    "frequency_penalty": 2}));
    let (tx, ty) = (text_of(&[x]), text_of(&[y]));
    assert!(penalised.starts_with(&tx), "{penalised:?}");
    assert!(penalised.contains(&ty), "{penalised:?}");
    assert!(penalised.matches(tx.as_str()).count() < 16, "{penalised:?}");
    let unpenalised = complete(json!({"logit_bias": {x.to_string(): 100, y.to_string(): 90}}));
    assert_eq!(unpenalised, forced);
    // A bias of -100 bans the token greedy decoding picks first.
    let first = server.post(
        "/v1/completions",
        &json!({"prompt": "Say something:", "max_tokens": 1, "temperature": 0,
                "ignore_eos": true, "logprobs": 0}),
    );
    let first_text = first.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    let tokens = server.post("/tokenize", &json!({"prompt": first_text}));
    let id = tokens.json()["tokens"][0].as_u64().unwrap();
    let banned = complete(json!({"logit_bias": {id.to_string(): -100}, "max_tokens": 1}));
    assert_ne!(banned, first_text);

    for (body, param) in [
        (
            json!({"logit_bias": {"99999999": 1}}),
            "logit_bias.99999999",
        ),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias.abc"),
        (json!({"logit_bias": {"5": 101}}), "logit_bias.5"),
        (json!({"logit_bias": {"5": "up"}}), "logit_bias.5"),
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
    ] {
        let mut request = body.clone();
        request["prompt"] = json!("hi");
        let r = server.post("/v1/completions", &request);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"]["param"], param, "{body}");
    }
    server.stop();
}
