//! A model on quench's GPU engine (run by the kernel interpreter) behind the server's
//! traits: one scheduler step feeds every sequence through shared decode steps (as many
//! steps as the longest sequence has tokens, not one per token of every sequence), with
//! logits bit for bit those of each sequence stepped alone; and the scheduler's greedy
//! answers to concurrent requests are those of each request generated alone, with the bf16
//! products on the matrix–vector kernels and on the tensor cores.
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else at random,
//! and is printed so that a failure can be replayed.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use quench_engine::generate::{OutputFormat, SamplingParams};
use quench_engine::gpu::profile::{self, Mode, ProfileOptions};
use quench_engine::gpu::GpuDecoder;
use quench_engine::synth::{synthesize, SynthArch, SynthDtype, SynthOptions, SynthShape};
use quench_engine::{BatchItem, CausalModel, Device, GenerateOptions, LoadOptions, Model, Prompt};
use quench_serve::scheduler::{EngineConfig, EngineHandle, Event, Job};
use quench_serve::sessions::SessionStore;
use quench_serve::text::TextSide;
use quench_testkit::seed;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The profiler that counts decode steps is the process's own: the tests that step a model
/// take turns, so that one test's count holds only its own steps.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The tiny bf16 llama on the interpreter, its bf16 products on the tensor cores at every
/// step where `tensor_core_decode` (as `quench serve` loads bf16 models by default).
fn load(seed: u64, tensor_core_decode: bool) -> (TempDir, CausalModel) {
    let dir = TempDir(std::env::temp_dir().join(format!(
        "quench-serve-gpu-{seed:x}-{}",
        u8::from(tensor_core_decode)
    )));
    let options = SynthOptions {
        arch: SynthArch::Llama,
        shape: SynthShape::Tiny,
        seed,
        dtype: SynthDtype::Bf16,
        max_shard_bytes: SynthOptions::DEFAULT_SHARD_BYTES,
    };
    synthesize(&dir.0, &options, &mut |_| {}).expect("synthesizes");
    let options = LoadOptions {
        device: Device::Interp,
        context_limit: Some(64),
        sessions: Some(4),
        max_batch: Some(4),
        tensor_core_decode,
        ..LoadOptions::default()
    };
    match quench_engine::load(&dir.0, &options).expect("loads") {
        Model::Causal(model) => (dir, model),
        Model::Embedding(_) => panic!("the tiny llama loaded as an embedding model"),
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// One scheduler step of `feeds` (the tokens each sequence feeds) on fresh caches, then
/// one more of token `then[i]` each; the logits of both.
fn two_steps(model: &CausalModel, feeds: &[Vec<u32>], then: &[u32]) -> Vec<Vec<u32>> {
    let mut caches: Vec<_> = feeds.iter().map(|_| model.new_session()).collect();
    let mut out = vec![];
    for round in 0..2 {
        let next: Vec<Vec<u32>> = feeds
            .iter()
            .zip(then)
            .map(|(f, &t)| if round == 0 { f.clone() } else { vec![t] })
            .collect();
        let mut items: Vec<BatchItem<'_>> = caches
            .iter_mut()
            .zip(&next)
            .map(|(session, tokens)| BatchItem { session, tokens })
            .collect();
        for r in model.step(&mut items) {
            out.push(bits(&r.expect("the step runs")));
        }
    }
    out
}

#[test]
fn the_gpu_engine_steps_sequences_together() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let s = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(s);

    // Loaded while profiling, so that every decode step is counted.
    profile::start(ProfileOptions {
        mode: Mode::Dispatches,
        ceilings: None,
    })
    .expect("profiling was off");
    let (_dir, model) = load(s, false);
    let feeds: Vec<Vec<u32>> = [5, 2, 3]
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(0..256)).collect())
        .collect();
    let then: Vec<u32> = feeds.iter().map(|_| rng.gen_range(0..256)).collect();
    let together = two_steps(&model, &feeds, &then);
    let p = profile::finish().expect("profiling was on");
    let summary = model
        .backend::<GpuDecoder>()
        .expect("on the GPU engine")
        .summary();
    let several = summary
        .batch_dispatches_per_step
        .expect("steps of several rows") as u64;
    // Each prompt in a chunk of its own through the prompt path (whose launches the
    // decode-step profile does not count), then one decode step of the three sequences'
    // next tokens.
    assert!(summary.prefill_chunk > 0, "the prompt path is on");
    assert_eq!(p.submitted, several, "one decode step for all three");

    // Each sequence alone: its own steps, the same bits.
    for (i, feed) in feeds.iter().enumerate() {
        let alone = two_steps(&model, std::slice::from_ref(feed), &then[i..=i]);
        for (step, (a, t)) in [
            (&alone[0], &together[i]),
            (&alone[1], &together[feeds.len() + i]),
        ]
        .into_iter()
        .enumerate()
        {
            let differ = a.iter().zip(t).filter(|(x, y)| x != y).count();
            assert!(
                a.len() == t.len() && differ == 0,
                "sequence {i}, step {step}: {differ} logits differ from the sequence alone"
            );
        }
    }

    scheduler_answers_as_alone(model, &mut rng);

    // The same with the bf16 products on the tensor cores, as `quench serve` loads bf16
    // models (in this test, not one beside it: profiling above counts every step of the
    // process).
    let (_dir, model) = load(s, true);
    let summary = model
        .backend::<GpuDecoder>()
        .expect("on the GPU engine")
        .summary();
    assert!(summary.tensor_core_products > 0, "{summary:?}");
    scheduler_answers_as_alone(model, &mut rng);
}

/// Through the scheduler: concurrent greedy requests, prefilled in chunks of 4 beside
/// the others' decoding, answer as each does alone. Every other request is held to a JSON
/// grammar, its masks applied and its tokens picked on the device; alone, it generates
/// with its logits kept, which reads them back and masks and picks on the host.
fn scheduler_answers_as_alone(model: CausalModel, rng: &mut ChaCha8Rng) {
    let model = Arc::new(model);
    let text: Arc<dyn TextSide> = model.clone();
    let engine = EngineHandle::start(
        "gpu",
        model.clone(),
        text,
        EngineConfig {
            max_batch: 4,
            kv_blocks: 16,
            queue: 16,
            prefill_chunk: 4,
            prefix_cache: true,
        },
        SessionStore::new(8, 8),
    )
    .expect("the engine starts");
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|_| {
            let n = rng.gen_range(1..12);
            (0..n).map(|_| rng.gen_range(0..256)).collect()
        })
        .collect();
    let grammars = model.grammars().expect("the model has a tokenizer");
    let json = || {
        let format = OutputFormat::JsonObject;
        Box::new(grammars.constraint(&format).expect("the grammar compiles"))
    };
    let receivers: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let (mut job, rx) = greedy_job(prompt.clone(), 5);
            job.constraint = (i % 2 == 1).then(json);
            engine.submit(job).expect("queued");
            rx
        })
        .collect();
    for (i, (prompt, mut rx)) in prompts.iter().zip(receivers).enumerate() {
        let mut got = vec![];
        loop {
            match rx.blocking_recv() {
                Some(Event::Token(t)) => got.push(t.token),
                Some(Event::Done(_)) => break,
                other => panic!("{other:?}"),
            }
        }
        let mut constraint = (i % 2 == 1).then(json);
        let options = GenerateOptions {
            max_tokens: 5,
            ignore_eos: true,
            keep_logits: constraint.is_some(),
            ..GenerateOptions::default()
        };
        let alone = model
            .generate_constrained(
                &mut model.new_session(),
                Prompt::Tokens(prompt),
                &options,
                constraint.as_deref_mut(),
                &mut |_| {},
            )
            .expect("generates");
        assert_eq!(got, alone.tokens, "prompt {prompt:?}");
    }
    engine.shutdown(Instant::now());
}

/// A greedy job of `max_tokens` that goes on past end-of-sequence tokens.
fn greedy_job(
    prompt: Vec<u32>,
    max_tokens: usize,
) -> (Job, tokio::sync::mpsc::UnboundedReceiver<Event>) {
    let (events, rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        request_id: String::new(),
        prompt,
        session: None,
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        logprobs: None,
        ignore_eos: true,
        constraint: None,
        events,
        arrived: Instant::now(),
        siblings: Vec::new(),
    };
    (job, rx)
}

/// On the GPU engine, work stops with its client and with the server: a request whose
/// receiver is dropped mid-answer is dropped at the next step and gives its KV blocks
/// back while the others go on; at a shutdown deadline that has passed, what is left is
/// cancelled, every block is free and the engine's thread ends.
#[test]
fn gpu_work_stops_when_its_client_goes_and_at_shutdown() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let seed = seed();
    let (_dir, model) = load(seed, false);
    let model = Arc::new(model);
    let text: Arc<dyn TextSide> = model.clone();
    let engine = EngineHandle::start(
        "gpu",
        model,
        text,
        EngineConfig {
            max_batch: 4,
            kv_blocks: 16,
            queue: 16,
            prefill_chunk: 4,
            prefix_cache: true,
        },
        SessionStore::new(8, 8),
    )
    .expect("the engine starts");
    let used = || {
        engine
            .stats
            .kv_blocks_used
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let mut receivers: Vec<_> = (0..3u32)
        .map(|k| {
            let (job, rx) = greedy_job(vec![k + 1, 7, 9], 60);
            engine.submit(job).expect("queued");
            rx
        })
        .collect();
    // Each has drawn a token: all three run.
    for rx in &mut receivers {
        assert!(matches!(rx.blocking_recv(), Some(Event::Token(_))));
    }
    let with_three = used();
    assert!(with_three >= 3, "{with_three} blocks for three sequences");
    drop(receivers.remove(0));
    let until = Instant::now() + std::time::Duration::from_secs(60);
    while used() >= with_three {
        assert!(
            Instant::now() < until,
            "the dropped request kept its blocks"
        );
        // The others keep drawing meanwhile.
        for rx in &mut receivers {
            assert!(matches!(rx.try_recv(), Ok(Event::Token(_)) | Err(_)));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stopping = Instant::now();
    engine.shutdown(Instant::now());
    assert!(
        stopping.elapsed() < std::time::Duration::from_secs(30),
        "shutdown took {:?}",
        stopping.elapsed()
    );
    for mut rx in receivers {
        let last = std::iter::from_fn(|| rx.blocking_recv()).last();
        assert!(matches!(last, Some(Event::Cancelled)), "{last:?}");
    }
    assert_eq!(used(), 0, "blocks left in use after the shutdown");
}

/// Greedy answers with log-probabilities, one request after another on a fresh engine:
/// per request its tokens, the bits of every reported log-probability, and the prompt
/// tokens it found cached.
fn answers_with_logprobs(
    model: &Arc<CausalModel>,
    prefix_cache: bool,
    prefill_chunk: usize,
    prompts: &[Vec<u32>],
) -> Vec<(Vec<u32>, Vec<u32>, usize)> {
    let text: Arc<dyn TextSide> = model.clone();
    let engine = EngineHandle::start(
        "gpu",
        model.clone(),
        text,
        EngineConfig {
            max_batch: 4,
            kv_blocks: 16,
            queue: 16,
            prefill_chunk,
            prefix_cache,
        },
        SessionStore::new(8, 8),
    )
    .expect("the engine starts");
    let out = prompts
        .iter()
        .map(|prompt| {
            let (mut job, mut rx) = greedy_job(prompt.clone(), 6);
            job.logprobs = Some(3);
            engine.submit(job).expect("queued");
            let (mut tokens, mut logprobs) = (vec![], vec![]);
            loop {
                match rx.blocking_recv() {
                    Some(Event::Token(t)) => {
                        tokens.push(t.token);
                        let (chosen, top) = t.logprobs.expect("log-probabilities asked for");
                        logprobs.extend(
                            std::iter::once(chosen)
                                .chain(top)
                                .map(|l| l.logprob.to_bits()),
                        );
                    }
                    Some(Event::Done(done)) => return (tokens, logprobs, done.cached_tokens),
                    other => panic!("{other:?}"),
                }
            }
        })
        .collect();
    engine.shutdown(Instant::now());
    out
}

/// On the GPU engine a request that starts from the prefix cache gets the bits it gets
/// computing its whole prompt itself: the same tokens and log-probabilities, bit for bit,
/// as on an engine without the cache, though its prompt is cut into chunks at other
/// places.
#[test]
fn a_prefix_from_the_cache_gives_the_bits_of_the_whole_prompt() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (_dir, model) = load(seed, true);
    let model = Arc::new(model);
    let mut random = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.gen_range(0..256)).collect() };
    let shared = random(37);
    let first = [shared.clone(), random(5)].concat();
    let second = [shared, random(9)].concat();
    let cached = answers_with_logprobs(&model, true, 5, &[first, second.clone()]);
    let fresh = answers_with_logprobs(&model, false, 5, std::slice::from_ref(&second));
    assert_eq!(
        cached[1].2, 32,
        "two whole blocks of the shared prompt reused"
    );
    assert_eq!(fresh[0].2, 0);
    assert_eq!(cached[1].0, fresh[0].0, "tokens");
    assert!(
        cached[1].1 == fresh[0].1,
        "log-probabilities differ from the prompt computed whole"
    );
    // Cut into chunks of other sizes (the last of 46 tokens would be one token alone at
    // 3 and 9: the scheduler never feeds it so), the same bits.
    for chunk in [2, 3, 9, 64] {
        let other = answers_with_logprobs(&model, false, chunk, std::slice::from_ref(&second));
        assert!(
            other[0].0 == fresh[0].0 && other[0].1 == fresh[0].1,
            "chunks of {chunk}: the answer differs from chunks of 5"
        );
    }
}
