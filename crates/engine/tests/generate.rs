//! Generation: stopping, streaming and context limits.

use quench_cpu::Decoder;
use quench_engine::generate::{
    generate, CausalLm, Continuation, Drawn, FinishReason, GenerateOptions, SamplingParams,
};
use quench_engine::synth::tiny_chat_model;
use quench_engine::{EngineError, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` random token ids below `vocab`.
fn random_tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

/// A model that always makes the next token of a script the most likely.
struct Scripted {
    script: Vec<u32>,
    fed: Vec<u32>,
    prompt_len: Option<usize>,
    limit: usize,
}

impl Scripted {
    fn new(script: &[u32], limit: usize) -> Self {
        Scripted {
            script: script.to_vec(),
            fed: Vec::new(),
            prompt_len: None,
            limit,
        }
    }
}

impl CausalLm for Scripted {
    fn position(&self) -> usize {
        self.fed.len()
    }
    fn context_limit(&self) -> usize {
        self.limit
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        assert!(
            self.fed.len() + tokens.len() <= self.limit,
            "fed past the limit"
        );
        let prompt_len = *self.prompt_len.get_or_insert(tokens.len());
        self.fed.extend_from_slice(tokens);
        let next = self.script[self.fed.len() - prompt_len];
        let mut logits = vec![0.0; VOCAB.len()];
        logits[next as usize] = 10.0;
        Ok(logits)
    }
}

const VOCAB: [&str; 8] = ["<eos>", "Hel", "lo", " wor", "ld", "\n", "User", ":"];

fn detokenize(tokens: &[u32]) -> String {
    tokens.iter().map(|&t| VOCAB[t as usize]).collect()
}

const EOS: [u32; 1] = [0];

fn options(max_tokens: usize, stops: &[&str]) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        stop: stops.iter().map(|s| s.to_string()).collect(),
        ..GenerateOptions::default()
    }
}

fn run(script: &[u32], limit: usize, opts: &GenerateOptions) -> (Drawn, Vec<(u32, String)>) {
    let mut model = Scripted::new(script, limit);
    let mut pieces = Vec::new();
    let g = generate(&mut model, &detokenize, &[6, 7], opts, &EOS, &mut |t, s| {
        pieces.push((t, s.to_owned()))
    })
    .unwrap();
    let streamed: String = pieces.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(streamed, g.text, "streamed pieces differ from the text");
    (g, pieces)
}

#[test]
fn stops_at_eos_without_including_it() {
    let (g, pieces) = run(&[1, 2, 3, 4, 0, 5], 100, &options(10, &[]));
    assert_eq!(g.tokens, [1, 2, 3, 4]);
    assert_eq!(g.text, "Hello world");
    assert_eq!(g.finish, FinishReason::Eos(0));
    assert_eq!(pieces.len(), 5, "one call per token, EOS included");
    assert_eq!(pieces[4].0, 0);
}

#[test]
fn stop_strings_cut_the_text_and_are_never_streamed() {
    // "Hello world\nUser:" with stop "\nUser:": the "\n" is held back until it turns out
    // to start the stop string.
    let (g, pieces) = run(&[1, 2, 3, 4, 5, 6, 7, 1], 100, &options(10, &["\nUser:"]));
    assert_eq!(g.text, "Hello world");
    assert_eq!(g.finish, FinishReason::Stop("\nUser:".into()));
    assert_eq!(g.tokens, [1, 2, 3, 4, 5, 6, 7]);
    assert!(pieces.iter().all(|(_, s)| !s.contains('\n')));

    // A held-back prefix that does not become the stop string is released.
    let (g, pieces) = run(&[1, 5, 2, 0], 100, &options(10, &["\nUser:"]));
    assert_eq!(g.text, "Hel\nlo");
    assert_eq!(pieces[1], (5, String::new()));
    assert_eq!(pieces[2], (2, "\nlo".to_owned()));

    // The earliest of several stop strings wins.
    let (g, _) = run(&[1, 2, 3, 4, 0], 100, &options(10, &["ld", "lo"]));
    assert_eq!(
        (g.text.as_str(), g.finish),
        ("Hel", FinishReason::Stop("lo".into()))
    );
}

#[test]
fn stops_at_max_tokens_and_at_the_context_limit() {
    let (g, _) = run(&[1, 2, 3, 4, 5], 100, &options(3, &[]));
    assert_eq!((g.tokens.len(), g.finish), (3, FinishReason::MaxTokens));

    // Prompt of 2 in a context of 5: three tokens can be fed, the fourth drawn.
    let (g, _) = run(&[1, 2, 3, 4, 5, 6], 5, &options(10, &[]));
    assert_eq!(g.tokens, [1, 2, 3, 4]);
    assert_eq!(g.finish, FinishReason::ContextFull);

    let (g, pieces) = run(&[1], 100, &options(0, &[]));
    assert!(g.tokens.is_empty() && pieces.is_empty());
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_by_name() {
    let model = tiny_chat_model(1200).unwrap();
    let decoder = model.backend::<Decoder<f32>>().expect("on the CPU");
    let mut session = Continuation::new(decoder, 16);
    let prompt = random_tokens(1201, 17, model.info().config.vocab);
    let err = generate(
        &mut session,
        &|_| String::new(),
        &prompt,
        &options(4, &[]),
        &EOS,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(
        err,
        EngineError::PromptTooLong {
            prompt_len: 17,
            limit: 16,
            used: 0
        }
    ));
    assert_eq!(
        err.to_string(),
        "prompt of 17 tokens does not fit the context limit of 16 tokens (0 positions already used)"
    );
    assert_eq!(session.position(), 0);
}

#[test]
fn sessions_continue_and_seeded_sampling_repeats() {
    let model = tiny_chat_model(1300).unwrap();
    let decoder = model.backend::<Decoder<f32>>().expect("on the CPU");
    let vocab = model.info().config.vocab;
    let limit = model.info().context_limit;
    let prompt = random_tokens(1301, 5, vocab);
    let opts = GenerateOptions {
        max_tokens: 8,
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.0,
            repetition_penalty: 1.1,
            seed: 42,
            ..SamplingParams::greedy()
        },
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let text = |t: &[u32]| t.iter().map(|t| format!("<{t}>")).collect::<String>();
    let mut first = Continuation::new(decoder, limit);
    let a = generate(&mut first, &text, &prompt, &opts, &[], &mut |_, _| {}).unwrap();
    // The session holds the prompt and every drawn token but the last.
    assert_eq!(first.position(), prompt.len() + a.tokens.len() - 1);
    let mut second = Continuation::new(decoder, limit);
    let b = generate(&mut second, &text, &prompt, &opts, &[], &mut |_, _| {}).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.text, text(&a.tokens));

    // Continuing a session: feeding the last token then a new turn works like one prompt.
    let mut turn: Vec<u32> = vec![*a.tokens.last().unwrap()];
    turn.extend(random_tokens(1302, 3, vocab));
    let greedy = GenerateOptions {
        sampling: SamplingParams::greedy(),
        ..opts.clone()
    };
    let continued = generate(&mut first, &text, &turn, &greedy, &[], &mut |_, _| {}).unwrap();
    let whole: Vec<u32> = prompt
        .iter()
        .chain(&a.tokens[..a.tokens.len() - 1])
        .chain(&turn)
        .copied()
        .collect();
    let mut fresh_session = Continuation::new(decoder, limit);
    let fresh = generate(
        &mut fresh_session,
        &text,
        &whole,
        &greedy,
        &[],
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(continued.tokens, fresh.tokens);
}
