//! The real models quench pulls, when their paths are given: `QUENCH_SMOLLM2_GGUF` (the
//! SmolLM2-135M-Instruct Q4_1 GGUF file) and `QUENCH_MINILM_DIR` (the all-MiniLM-L6-v2
//! checkpoint directory). Without one, a test fails in CI and reports NOT RUN elsewhere
//! (quench-testkit).

use quench_engine::{
    load, Format, GenerateOptions, LoadOptions, Message, ModelKind, Prompt, SamplingParams,
};

#[test]
fn smollm2_answers_a_chat_and_reuses_its_session() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let model = load(&path, &LoadOptions::default()).unwrap();
    let info = model.info();
    assert_eq!((info.format, info.kind), (Format::Gguf, ModelKind::Causal));
    assert_eq!(info.config.arch.name(), "llama");
    assert!(
        (130_000_000..140_000_000).contains(&info.parameters),
        "{}",
        info.parameters
    );
    assert!(
        info.tensor_types.contains_key("Q4_1"),
        "{:?}",
        info.tensor_types
    );
    let model = model.causal().unwrap();
    let mut session = model.new_session();
    let mut chat = vec![Message::new("user", "What is the capital of France?")];
    let mut streamed = String::new();
    let options = GenerateOptions {
        max_tokens: 24,
        ..GenerateOptions::default()
    };
    let first = model
        .generate(&mut session, Prompt::Chat(&chat), &options, &mut |p| {
            streamed.push_str(p)
        })
        .unwrap();
    eprintln!("SmolLM2: {:?} ({:?})", first.text, first.finish);
    assert_eq!(streamed, first.text);
    assert!(first.text.contains("Paris"), "{:?}", first.text);
    assert_eq!(first.reused_tokens, 0);

    chat.push(Message::new("assistant", first.text.clone()));
    chat.push(Message::new("user", "And of Germany?"));
    let second = model
        .generate(&mut session, Prompt::Chat(&chat), &options, &mut |_| {})
        .unwrap();
    eprintln!("SmolLM2: {:?} ({:?})", second.text, second.finish);
    assert!(second.reused_tokens >= first.prompt_tokens, "{second:?}");
    assert!(second.text.contains("Berlin"), "{:?}", second.text);

    // The same prompt in a fresh session gives the same greedy answer.
    let mut fresh = model.new_session();
    let again = model
        .generate(&mut fresh, Prompt::Chat(&chat), &options, &mut |_| {})
        .unwrap();
    assert_eq!(again.tokens, second.tokens);

    let sampled = GenerateOptions {
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.1,
            seed: 7,
            ..SamplingParams::greedy()
        },
        ..options
    };
    let a = model
        .generate(
            &mut model.new_session(),
            Prompt::Text("Once upon a time"),
            &sampled,
            &mut |_| {},
        )
        .unwrap();
    let b = model
        .generate(
            &mut model.new_session(),
            Prompt::Text("Once upon a time"),
            &sampled,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(a.tokens, b.tokens, "same seed, same tokens");
}

#[test]
fn minilm_embeds_similar_sentences_close() {
    let Some(dir) = quench_testkit::minilm_dir() else {
        return;
    };
    let model = load(&dir, &LoadOptions::default()).unwrap();
    assert_eq!(model.info().kind, ModelKind::Embedding);
    assert_eq!(
        model.info().context_limit,
        256,
        "sentence_bert_config max_seq_length"
    );
    let model = model.embedding().unwrap();
    let texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
    ];
    let e = model.embed(&texts).unwrap();
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    for v in &e {
        assert_eq!(v.vector.len(), 384);
        assert!((dot(&v.vector, &v.vector) - 1.0).abs() < 1e-4);
    }
    assert!(dot(&e[0].vector, &e[1].vector) > 0.6);
    assert!(dot(&e[0].vector, &e[2].vector) < 0.3);

    let long = "word ".repeat(400);
    let t = model.embed(&[long.as_str()]).unwrap();
    assert_eq!(t[0].tokens, 256);
    assert_eq!(t[0].truncated_from, Some(402));
}
