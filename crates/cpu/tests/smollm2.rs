//! SmolLM2-135M-Instruct from a real GGUF file, when `QUENCH_SMOLLM2_GGUF` names one.

mod common;
#[path = "common/gguf_vocab.rs"]
mod gguf_vocab;

use common::logit_violations;
use quench_cpu::{Decoder, Logits, Session};
use quench_models::arch::{ModelConfig, Naming, RopeStyle};
use quench_engine::generate::{generate, GenerateOptions, SamplingParams};
use quench_models::GgufFile;
use quench_text::{ChatTemplate, Message};

#[test]
fn smollm2_answers_greedily_and_passes_the_fp64_check() {
    let Ok(path) = std::env::var("QUENCH_SMOLLM2_GGUF") else {
        eprintln!("QUENCH_SMOLLM2_GGUF is not set; skipping the SmolLM2 check");
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
    let options = GenerateOptions {
        max_new_tokens: 12,
        sampling: SamplingParams::greedy(),
        stop_strings: vec![],
        eos_ids: tokenizer.eos_id().into_iter().collect(),
    };
    let detokenize = |t: &[u32]| tokenizer.decode(t, true).unwrap();
    let g = generate(
        &mut Session::new(&fast),
        &detokenize,
        &prompt,
        &options,
        &mut |_, _| {},
    )
    .unwrap();
    eprintln!("SmolLM2: {:?} ({:?})", g.text, g.finish);
    assert!(g.text.contains("Paris"), "answer: {:?}", g.text);

    // Teacher-forced: the f64 reference over prompt + answer, against f32 logits, every
    // logit within the bound and the same top-1 token at every position.
    let tokens: Vec<u32> = prompt.iter().chain(&g.tokens).copied().collect();
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
        let argmax = |row: &[f64]| {
            row.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, _)| i as u32)
        };
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
