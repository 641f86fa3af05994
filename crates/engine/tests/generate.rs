//! Generation: stopping, streaming and context limits.

mod common;

use common::{random_decoder, tiny_config, Filler};
use quench_cpu::{CpuError, Decoder, Result, Session};
use quench_models::arch::{Arch, Naming};
use quench_engine::generate::{generate, CausalLm, FinishReason, GenerateOptions, SamplingParams};

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

fn options(max_new_tokens: usize, stops: &[&str]) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens,
        sampling: SamplingParams::greedy(),
        stop_strings: stops.iter().map(|s| s.to_string()).collect(),
        eos_ids: vec![0],
    }
}

fn run(
    script: &[u32],
    limit: usize,
    opts: &GenerateOptions,
) -> (quench_cpu::Generation, Vec<(u32, String)>) {
    let mut model = Scripted::new(script, limit);
    let mut pieces = Vec::new();
    let g = generate(&mut model, &detokenize, &[6, 7], opts, &mut |t, s| {
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
    let config = tiny_config(Arch::Llama);
    let src = random_decoder(&config, 1200);
    let model = Decoder::<f32>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
    let mut session = Session::with_limit(&model, 16);
    let prompt = Filler::new(1201).tokens(17, config.vocab);
    let err = generate(
        &mut session,
        &|_| String::new(),
        &prompt,
        &options(4, &[]),
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(matches!(
        err,
        CpuError::PromptTooLong {
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
    let config = tiny_config(Arch::Qwen3);
    let src = random_decoder(&config, 1300);
    let model = Decoder::<f32>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
    let prompt = Filler::new(1301).tokens(5, config.vocab);
    let opts = GenerateOptions {
        max_new_tokens: 8,
        sampling: SamplingParams {
            temperature: 0.8,
            top_k: 20,
            top_p: 0.9,
            min_p: 0.0,
            repetition_penalty: 1.1,
            seed: 42,
        },
        stop_strings: vec![],
        eos_ids: vec![],
    };
    let text = |t: &[u32]| t.iter().map(|t| format!("<{t}>")).collect::<String>();
    let mut first = Session::new(&model);
    let a = generate(&mut first, &text, &prompt, &opts, &mut |_, _| {}).unwrap();
    // The session holds the prompt and every drawn token but the last.
    assert_eq!(first.position(), prompt.len() + a.tokens.len() - 1);
    let b = generate(
        &mut Session::new(&model),
        &text,
        &prompt,
        &opts,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.text, text(&a.tokens));

    // Continuing a session: feeding the last token then a new turn works like one prompt.
    let mut turn: Vec<u32> = vec![*a.tokens.last().unwrap()];
    turn.extend(Filler::new(1302).tokens(3, config.vocab));
    let greedy = GenerateOptions {
        sampling: SamplingParams::greedy(),
        ..opts.clone()
    };
    let continued = generate(&mut first, &text, &turn, &greedy, &mut |_, _| {}).unwrap();
    let whole: Vec<u32> = prompt
        .iter()
        .chain(&a.tokens[..a.tokens.len() - 1])
        .chain(&turn)
        .copied()
        .collect();
    let fresh = generate(
        &mut Session::new(&model),
        &text,
        &whole,
        &greedy,
        &mut |_, _| {},
    )
    .unwrap();
    assert_eq!(continued.tokens, fresh.tokens);
}
