//! Structured output on a real tokenizer and model (`QUENCH_SMOLLM2_GGUF`, the SmolLM2-135M
//! Instruct GGUF: 49,152 byte-level BPE tokens): greedy decoding under a schema's mask gives
//! JSON that validates, and the mask's cost per token is measured and bounded.

use std::time::Instant;

use quench_engine::generate::{argmax, OutputFormat};
use quench_engine::{load, BatchItem, LoadOptions, Message, Prompt};
use serde_json::{json, Value};

#[test]
fn smollm2_answers_a_schema_and_the_mask_is_cheap() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let loaded = load(&path, &LoadOptions::default()).unwrap();
    let model = loaded.causal().unwrap();
    let built = Instant::now();
    let grammars = model.grammars().unwrap();
    let trie_ms = built.elapsed().as_secs_f64() * 1e3;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "colour": {"enum": ["black", "white", "ginger"]},
            "indoor": {"type": "boolean"}
        },
        "required": ["name", "age", "colour", "indoor"],
        "additionalProperties": false
    });
    let compiled = Instant::now();
    let mut constraint = grammars
        .constraint(&OutputFormat::JsonSchema {
            schema,
            strict: true,
        })
        .unwrap();
    let compile_ms = compiled.elapsed().as_secs_f64() * 1e3;

    let chat = [Message::new(
        "user",
        "Describe a cat as JSON with its name, age, colour and whether it lives indoors.",
    )];
    let mut tokens = model.prompt_tokens(Prompt::Chat(&chat)).unwrap();
    let prompt_len = tokens.len();
    let mut session = model.new_session();
    let mut worst = 0.0f64;
    for _ in 0..120 {
        let mut items = [BatchItem {
            session: &mut session,
            tokens: &tokens,
        }];
        let mut logits = model.step(&mut items).remove(0).unwrap();
        let spent = constraint.mask(&mut logits).unwrap();
        worst = worst.max(spent.as_secs_f64());
        let token = argmax(&logits).unwrap();
        if model.eos_ids().contains(&token) {
            break;
        }
        constraint.commit(token).unwrap();
        tokens.push(token);
        if constraint.finished() {
            break;
        }
    }
    assert!(constraint.finished(), "the reply did not finish");
    let text = model
        .tokenizer()
        .decode(&tokens[prompt_len..], true)
        .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(
        v["name"].as_str().is_some_and(|s| s.chars().count() <= 20),
        "{v}"
    );
    assert!((0..=30).contains(&v["age"].as_i64().unwrap_or(-1)), "{v}");
    assert!(
        ["black", "white", "ginger"].contains(&v["colour"].as_str().unwrap_or("")),
        "{v}"
    );
    assert!(v["indoor"].is_boolean(), "{v}");
    assert_eq!(v.as_object().map(|o| o.len()), Some(4), "{v}");

    let cost = constraint.mask_cost();
    let (steps, total) = (cost.masks, cost.computed);
    let mean_us = total.as_secs_f64() * 1e6 / steps as f64;
    eprintln!(
        "structured output on SmolLM2 ({} tokens): trie {trie_ms:.1} ms, schema {compile_ms:.2} \
         ms, {steps} masks, mean {mean_us:.1} µs, worst {:.1} µs; reply {text}",
        model.tokenizer().vocab_size(),
        worst * 1e6
    );
    // Generous for unoptimized test builds on a busy machine; see the log line for the cost.
    assert!(mean_us < 20_000.0, "mean mask {mean_us:.0} µs");
}
