//! SmolLM2-135M-Instruct from a real GGUF file, when `QUENCH_SMOLLM2_GGUF` names one.

mod common;
#[path = "common/gguf_vocab.rs"]
mod gguf_vocab;

use common::logit_violations;
use quench_cpu::{Decoder, Logits};
use quench_models::arch::{ModelConfig, Naming, RopeStyle};
use quench_models::GgufFile;
use quench_text::{ChatTemplate, Message};

#[test]
fn smollm2_answers_greedily_and_passes_the_fp64_check() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    assert_eq!(
        (
            config.hidden,
            config.layers,
            config.heads,
            config.kv_heads,
            config.head_dim
        ),
        (576, 30, 9, 3, 64)
    );
    assert_eq!(
        (config.vocab, config.rope_style, config.tied_embeddings),
        (49152, RopeStyle::Adjacent, true)
    );
    let tokenizer = gguf_vocab::gguf_tokenizer(&file);
    let special = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i)).unwrap_or("");
    let template = ChatTemplate::new(
        file.get_str("tokenizer.chat_template").unwrap(),
        special(tokenizer.bos_id()),
        special(tokenizer.eos_id()),
    )
    .unwrap();
    let text = template
        .render(
            &[Message::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    let prompt = tokenizer.encode(&text, true).unwrap();

    let fast = Decoder::<f32>::load(config.clone(), &file, Naming::Gguf).unwrap();
    // Greedy, up to 12 tokens or the end of the reply.
    let mut cache = fast.new_cache();
    let mut last = fast.forward(&mut cache, &prompt, Logits::Last).unwrap();
    let mut answer = vec![];
    while answer.len() < 12 {
        let row: Vec<f64> = last.row(0).iter().map(|&v| v as f64).collect();
        let next = argmax(&row).unwrap();
        if Some(next) == tokenizer.eos_id() {
            break;
        }
        answer.push(next);
        last = fast.forward(&mut cache, &[next], Logits::Last).unwrap();
    }
    let text = tokenizer.decode(&answer, true).unwrap();
    eprintln!("SmolLM2: {text:?}");
    assert!(text.contains("Paris"), "answer: {text:?}");

    // Teacher-forced: the f64 reference over prompt + answer, against f32 logits, every
    // logit within the bound and the same top-1 token at every position.
    let tokens: Vec<u32> = prompt.iter().chain(&answer).copied().collect();
    let reference = Decoder::<f64>::load(config, &file, Naming::Gguf).unwrap();
    let want = reference
        .forward(&mut reference.new_cache(), &tokens, Logits::All)
        .unwrap();
    let got = fast
        .forward(&mut fast.new_cache(), &tokens, Logits::All)
        .unwrap();
    let (count, worst) = logit_violations(&want, &got);
    assert_eq!(count, 0, "{count} logits out of bound, worst by {worst}");
    for t in prompt.len() - 1..tokens.len() - 1 {
        let got_row: Vec<f64> = got.row(t).iter().map(|&v| v as f64).collect();
        assert_eq!(
            argmax(want.row(t)),
            argmax(&got_row),
            "top-1 differs at position {t}"
        );
        assert_eq!(
            argmax(want.row(t)),
            Some(tokens[t + 1]),
            "greedy token differs at position {t}"
        );
    }
}

fn argmax(row: &[f64]) -> Option<u32> {
    row.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
}
