//! The scheduler on the tiny synthetic model: batch-invariant greedy output, preemption,
//! sessions, cancellation and the admission queue.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quench_engine::generate::SamplingParams;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use super::*;
use crate::keys::Caller;
use crate::sessions::{History, SessionStore};
use crate::text::TextSide;
use quench_engine::synth::tiny_chat_model;
use quench_engine::{GenerateOptions, Prompt};

struct Setup {
    engine: EngineHandle,
    model: Arc<CausalModel>,
    text: Arc<dyn TextSide>,
    sessions: Arc<SessionStore>,
}

fn start(config: EngineConfig) -> Setup {
    let model = Arc::new(tiny_chat_model(7).unwrap());
    let text: Arc<dyn TextSide> = model.clone();
    let sessions = SessionStore::new(16, 16);
    let engine =
        EngineHandle::start("t", model.clone(), text.clone(), config, sessions.clone()).unwrap();
    Setup {
        engine,
        model,
        text,
        sessions,
    }
}

fn job(
    prompt: Vec<u32>,
    max_tokens: usize,
    session: Option<&str>,
) -> (Job, UnboundedReceiver<Event>) {
    let (events, rx) = unbounded_channel();
    let job = Job {
        request_id: String::new(),
        prompt,
        session: session.map(str::to_owned),
        max_tokens,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        logprobs: None,
        ignore_eos: false,
        constraint: None,
        events,
        arrived: Instant::now(),
        siblings: Vec::new(),
    };
    (job, rx)
}

/// The tokens and the end of one job.
fn collect(mut rx: UnboundedReceiver<Event>) -> (Vec<u32>, Done) {
    let mut tokens = Vec::new();
    loop {
        match rx.blocking_recv() {
            Some(Event::Token(t)) => tokens.push(t.token),
            Some(Event::Done(d)) => return (tokens, d),
            Some(Event::Failed(why)) => panic!("job failed: {why}"),
            Some(Event::Cancelled) => panic!("job cancelled"),
            None => panic!("engine closed the channel"),
        }
    }
}

/// Greedy decoding of one sequence alone, by the engine's generation loop.
fn reference(model: &CausalModel, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let options = GenerateOptions {
        max_tokens,
        ..GenerateOptions::default()
    };
    let mut session = model.new_session();
    model
        .generate(&mut session, Prompt::Tokens(prompt), &options, &mut |_| {})
        .unwrap()
        .tokens
}

fn random_prompts(
    rng: &mut ChaCha8Rng,
    n: usize,
    lengths: std::ops::Range<usize>,
) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| {
            let len = rng.gen_range(lengths.clone());
            (0..len).map(|_| rng.gen_range(32..127)).collect()
        })
        .collect()
}

#[test]
fn greedy_output_does_not_depend_on_the_batch_or_on_preemption() {
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let s = start(EngineConfig {
        max_batch: 8,
        kv_blocks: 16,
        queue: 64,
        prefill_chunk: 16,
        prefix_cache: true,
    });
    let max_tokens = 60;
    // Short prompts whose answers run to max_tokens fill the batch first; as they grow past
    // a block each, the 16 blocks run out and the youngest are paused. Long prompts behind
    // them are prefilled in several chunks beside the others' decoding.
    let mut prompts = Vec::new();
    for _ in 0..1000 {
        let p = random_prompts(&mut rng, 1, 1..12).remove(0);
        if reference(&s.model, &p, max_tokens).len() == max_tokens {
            prompts.push(p);
        }
        if prompts.len() == 9 {
            break;
        }
    }
    assert_eq!(prompts.len(), 9, "too few prompts with long answers");
    prompts.extend(random_prompts(&mut rng, 3, 40..150));
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (j, rx) = job(p.clone(), max_tokens, None);
            s.engine.submit(j).unwrap();
            rx
        })
        .collect();
    let mut lengths = Vec::new();
    for (p, rx) in prompts.iter().zip(receivers) {
        let (tokens, done) = collect(rx);
        lengths.push((p.len(), tokens.len()));
        assert_eq!(
            tokens,
            reference(&s.model, p, max_tokens),
            "prompt of {} tokens",
            p.len()
        );
        assert_eq!(done.prompt_tokens, p.len());
        assert_eq!(done.completion_tokens, tokens.len());
    }
    assert!(
        s.engine.stats.preemptions.load(Ordering::Relaxed) > 0,
        "the test meant to force preemption; (prompt, answer) lengths: {lengths:?}"
    );
    wait_for(|| s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) == 0);
}

fn wait_for(done: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "timed out");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_session_reuses_its_cache_and_answers_as_a_fresh_request_would() {
    let s = start(EngineConfig::default());
    s.sessions
        .claim("a", "t", false, Caller::default())
        .unwrap();
    let first: Vec<u32> = b"Once upon a time".iter().map(|&b| b as u32).collect();
    let (j, rx) = job(first.clone(), 12, Some("a"));
    s.engine.submit(j).unwrap();
    let (answer, done) = collect(rx);
    assert_eq!(done.cached_tokens, 0);
    s.sessions.finish("a", History::Text(String::new()));
    // The cache holds the prompt and the answer, but for its last token when the answer
    // ended at max_tokens (a drawn token is fed only to draw the next).
    let held = s.sessions.list(Caller::default())[0].cached_tokens;
    let full = first.len() + answer.len();
    assert!(
        held == full || (held == full - 1 && answer.len() == 12),
        "{held} of {full}"
    );

    let mut second = first.clone();
    second.extend(&answer);
    second.extend(b" and then".iter().map(|&b| b as u32));
    s.sessions
        .claim("a", "t", false, Caller::default())
        .unwrap();
    let (j, rx) = job(second.clone(), 12, Some("a"));
    s.engine.submit(j).unwrap();
    let (continued, done) = collect(rx);
    assert_eq!(done.cached_tokens, held);
    assert_eq!(continued, reference(&s.model, &second, 12));
    s.sessions.finish("a", History::Text(String::new()));
    assert!(
        s.sessions.list(Caller::default())[0].cached_tokens >= second.len() + continued.len() - 1
    );

    s.engine.drop_session("a");
    wait_for(|| s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) == 0);
}

#[test]
fn idle_session_caches_are_evicted_under_pressure() {
    let s = start(EngineConfig {
        kv_blocks: 12,
        ..EngineConfig::default()
    });
    s.sessions
        .claim("old", "t", false, Caller::default())
        .unwrap();
    let (j, rx) = job(vec![65; 100], 4, Some("old"));
    s.engine.submit(j).unwrap();
    collect(rx);
    assert_eq!(s.sessions.list(Caller::default())[0].kv_blocks, 7);
    // 150 positions need 10 of the 12 blocks: the idle cache must go.
    let (j, rx) = job(vec![66; 150], 4, None);
    s.engine.submit(j).unwrap();
    collect(rx);
    assert_eq!(s.sessions.list(Caller::default())[0].cached_tokens, 0);
    wait_for(|| s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) == 0);
}

#[test]
fn a_client_that_goes_away_frees_its_blocks() {
    let s = start(EngineConfig::default());
    let (mut j, mut rx) = job(vec![70; 200], 300, None);
    j.ignore_eos = true;
    s.engine.submit(j).unwrap();
    match rx.blocking_recv() {
        Some(Event::Token(_)) => {}
        other => panic!("expected a token, got {other:?}"),
    }
    assert!(s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) > 0);
    drop(rx);
    wait_for(|| {
        s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) == 0
            && s.engine.stats.running.load(Ordering::Relaxed) == 0
    });
}

#[test]
fn a_full_queue_refuses_and_shutdown_cancels_what_is_left() {
    let s = start(EngineConfig {
        max_batch: 1,
        queue: 2,
        ..EngineConfig::default()
    });
    let mut receivers = Vec::new();
    let mut refused = 0;
    for _ in 0..6 {
        let (mut j, rx) = job(vec![72; 10], 400, None);
        j.ignore_eos = true;
        match s.engine.submit(j) {
            Ok(()) => receivers.push(rx),
            Err(QueueFull(2)) => refused += 1,
            Err(e) => panic!("{e}"),
        }
    }
    // One may have been admitted (leaving the queue) before the others arrived.
    assert!(refused >= 3, "refused {refused}");
    s.engine.shutdown(Instant::now());
    for mut rx in receivers {
        let mut last = None;
        while let Some(e) = rx.blocking_recv() {
            last = Some(e);
        }
        assert!(matches!(last, Some(Event::Cancelled)), "{last:?}");
    }
}

#[test]
fn stop_strings_and_max_tokens_end_generation() {
    let s = start(EngineConfig::default());
    let prompt: Vec<u32> = b"Hello".iter().map(|&b| b as u32).collect();
    let free = reference(&s.model, &prompt, 30);
    let text = s.text.decode(&free);
    assert!(text.len() >= 6, "the tiny model stopped early: {text:?}");
    // Stop at a string that appears after a few characters.
    let stop = text[3..5].to_owned();
    let (mut j, rx) = job(prompt.clone(), 30, None);
    j.stop = vec![stop.clone()];
    s.engine.submit(j).unwrap();
    let (_, done) = collect(rx);
    assert_eq!(done.finish, Finish::Stop);
    assert_eq!(done.text, text[..text.find(&stop).unwrap()]);

    let (j, rx) = job(prompt, 5, None);
    s.engine.submit(j).unwrap();
    let (tokens, done) = collect(rx);
    assert_eq!((tokens.len(), done.finish), (5, Finish::Length));
}

/// A job of `n` choices sampled at temperature 1 from `seed`: its receivers, choice 0's
/// first.
fn sampled_job(
    prompt: &[u32],
    max_tokens: usize,
    seed: u64,
    n: usize,
) -> (Job, Vec<UnboundedReceiver<Event>>) {
    let (mut j, rx) = job(prompt.to_vec(), max_tokens, None);
    // Every answer runs to max_tokens: a drawn end of text would leave answers empty, and
    // empty answers of different seeds are equal.
    j.ignore_eos = true;
    j.sampling = SamplingParams {
        temperature: 1.0,
        seed,
        ..SamplingParams::greedy()
    };
    let (siblings, mut receivers): (Vec<_>, Vec<_>) = (1..n).map(|_| unbounded_channel()).unzip();
    receivers.insert(0, rx);
    j.siblings = siblings;
    (j, receivers)
}

/// Choices of one request: choice k draws what a request of its own with seed + k draws,
/// whether it starts from a fork of the first choice's cache (room in the batch) or waits
/// and computes the prompt again (the batch full); the prompt is counted once.
#[test]
fn several_choices_draw_as_requests_with_their_own_seeds() {
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    for max_batch in [4, 2] {
        let s = start(EngineConfig {
            max_batch,
            kv_blocks: 64,
            queue: 8,
            prefill_chunk: 16,
            prefix_cache: true,
        });
        let prompt = random_prompts(&mut rng, 1, 20..40).remove(0);
        let seed = rng.gen();
        let alone: Vec<Vec<u32>> = (0..3)
            .map(|k| {
                let (j, mut rx) = sampled_job(&prompt, 12, seed + k, 1);
                s.engine.submit(j).unwrap();
                collect(rx.remove(0)).0
            })
            .collect();
        let before = s.engine.stats.prompt_tokens.load(Ordering::Relaxed);
        let (j, receivers) = sampled_job(&prompt, 12, seed, 3);
        s.engine.submit(j).unwrap();
        for (k, rx) in receivers.into_iter().enumerate() {
            let (tokens, done) = collect(rx);
            assert_eq!(tokens, alone[k], "choice {k} with a batch of {max_batch}");
            assert_eq!(done.prompt_tokens, prompt.len());
        }
        assert!(
            alone.iter().any(|a| *a != alone[0]),
            "three seeds drew the same answer: {alone:?}"
        );
        let counted = s.engine.stats.prompt_tokens.load(Ordering::Relaxed) - before;
        assert_eq!(counted, prompt.len() as u64, "the prompt is counted once");
        wait_for(|| s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) == 0);
    }
}

#[test]
fn prompt_chunks_never_leave_a_token_alone() {
    assert_eq!(chunk_len(1, 64), 1, "a drawn token, or a prompt of one");
    assert_eq!(chunk_len(64, 64), 64);
    assert_eq!(chunk_len(65, 64), 63, "then 2");
    assert_eq!(chunk_len(2, 64), 2);
    assert_eq!(chunk_len(3, 2), 3, "chunks of 2 would leave one");
    assert_eq!(chunk_len(4, 2), 2);
    assert_eq!(chunk_len(5, 1), 1, "chunks of one are decode steps anyway");
    for limit in 2..20 {
        for remaining in 2..80 {
            let mut left = remaining;
            while left > 0 {
                let n = chunk_len(left, limit);
                assert!(n >= 2 && n <= limit.max(3), "{remaining} by {limit}: {n}");
                left -= n;
            }
        }
    }
}

fn config_with_prefix(kv_blocks: usize, prefix_cache: bool) -> EngineConfig {
    EngineConfig {
        max_batch: 4,
        kv_blocks,
        queue: 64,
        prefill_chunk: 16,
        prefix_cache,
    }
}

fn stat(s: &Setup, read: impl Fn(&EngineStats) -> u64) -> u64 {
    read(&s.engine.stats)
}

/// Requests whose prompts begin with the same 40 tokens: once the first has finished, the
/// others start from its first two whole blocks (the third holds tokens of its own), run
/// together, answer as each does alone, and leave the blocks to the cache.
#[test]
fn requests_sharing_a_prefix_start_from_the_cache_and_answer_as_alone() {
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let s = start(config_with_prefix(64, true));
    let shared = random_prompts(&mut rng, 1, 40..41).remove(0);
    let prompts: Vec<Vec<u32>> = random_prompts(&mut rng, 5, 3..20)
        .into_iter()
        .map(|own| [shared.clone(), own].concat())
        .collect();
    let (j, rx) = job(prompts[0].clone(), 8, None);
    s.engine.submit(j).unwrap();
    let (_, done) = collect(rx);
    assert_eq!(done.cached_tokens, 0);
    wait_for(|| s.engine.stats.kv_blocks_cached.load(Ordering::Relaxed) > 0);
    let receivers: Vec<_> = prompts[1..]
        .iter()
        .map(|p| {
            let (j, rx) = job(p.clone(), 8, None);
            s.engine.submit(j).unwrap();
            rx
        })
        .collect();
    for (p, rx) in prompts[1..].iter().zip(receivers) {
        let (tokens, done) = collect(rx);
        assert_eq!(tokens, reference(&s.model, p, 8));
        assert_eq!(done.cached_tokens, 32, "prompt of {}", p.len());
        assert_eq!(done.prompt_tokens, p.len());
    }
    assert_eq!(stat(&s, |st| st.prefix_hits.load(Ordering::Relaxed)), 4);
    assert_eq!(stat(&s, |st| st.prefix_misses.load(Ordering::Relaxed)), 1);
    assert_eq!(
        stat(&s, |st| st.cached_prompt_tokens.load(Ordering::Relaxed)),
        4 * 32
    );
    wait_for(|| s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) == 0);
    assert!(s.engine.stats.kv_blocks_cached.load(Ordering::Relaxed) >= 3);
}

/// The cache only uses blocks nobody needs: a request that needs them all evicts it, and
/// without the cache nothing is kept.
#[test]
fn the_prefix_cache_gives_way_and_can_be_turned_off() {
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let s = start(config_with_prefix(12, true));
    for p in random_prompts(&mut rng, 3, 40..60) {
        let (j, rx) = job(p, 4, None);
        s.engine.submit(j).unwrap();
        collect(rx);
    }
    let cached = || s.engine.stats.kv_blocks_cached.load(Ordering::Relaxed);
    wait_for(|| cached() >= 6);
    // 180 positions need all 12 blocks.
    let big = random_prompts(&mut rng, 1, 175..176).remove(0);
    let (j, rx) = job(big.clone(), 4, None);
    s.engine.submit(j).unwrap();
    let (tokens, done) = collect(rx);
    assert_eq!(tokens, reference(&s.model, &big, 4));
    assert_eq!(done.cached_tokens, 0);
    wait_for(|| s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) == 0);
    assert_eq!(cached(), 175 / 16, "the big prompt's own whole blocks");

    let s = start(config_with_prefix(64, false));
    let p = random_prompts(&mut rng, 1, 40..60).remove(0);
    for _ in 0..2 {
        let (j, rx) = job(p.clone(), 4, None);
        s.engine.submit(j).unwrap();
        assert_eq!(collect(rx).1.cached_tokens, 0);
    }
    let st = &s.engine.stats;
    assert_eq!(st.kv_blocks_cached.load(Ordering::Relaxed), 0);
    assert_eq!(st.prefix_hits.load(Ordering::Relaxed), 0);
    assert_eq!(st.prefix_misses.load(Ordering::Relaxed), 0);
}

/// A session's first turn starts from the prefix cache; its cache then stays the
/// session's (its answer's positions are not offered to other requests), and dropping the
/// session gives every block it counted back.
#[test]
fn a_session_starts_from_the_prefix_cache() {
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let s = start(config_with_prefix(64, true));
    let shared = random_prompts(&mut rng, 1, 48..49).remove(0);
    let (j, rx) = job(shared.clone(), 4, None);
    s.engine.submit(j).unwrap();
    collect(rx);
    wait_for(|| s.engine.stats.kv_blocks_cached.load(Ordering::Relaxed) == 3);
    s.sessions
        .claim("a", "t", false, Caller::default())
        .unwrap();
    let first = [shared.clone(), vec![70, 71, 72]].concat();
    let (j, rx) = job(first.clone(), 6, Some("a"));
    s.engine.submit(j).unwrap();
    let (answer, done) = collect(rx);
    assert_eq!(done.cached_tokens, 48);
    assert_eq!(answer, reference(&s.model, &first, 6));
    s.sessions.finish("a", History::Text(String::new()));
    wait_for(|| s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) > 0);
    assert_eq!(s.engine.stats.kv_blocks_cached.load(Ordering::Relaxed), 3);

    let second = [first.clone(), answer.clone(), vec![73, 74]].concat();
    s.sessions
        .claim("a", "t", false, Caller::default())
        .unwrap();
    let (j, rx) = job(second.clone(), 6, Some("a"));
    s.engine.submit(j).unwrap();
    let (continued, done) = collect(rx);
    assert!(done.cached_tokens > 48, "{}", done.cached_tokens);
    assert_eq!(continued, reference(&s.model, &second, 6));
    s.sessions.finish("a", History::Text(String::new()));
    s.engine.drop_session("a");
    wait_for(|| s.engine.stats.kv_blocks_used.load(Ordering::Relaxed) == 0);
    assert_eq!(s.engine.stats.kv_blocks_cached.load(Ordering::Relaxed), 3);
}

/// A client that goes away while its long prompt is still being fed gives its blocks back
/// at the next step.
#[test]
fn a_client_that_goes_away_mid_prompt_frees_its_blocks() {
    let s = start(EngineConfig {
        prefill_chunk: 2,
        prefix_cache: false,
        ..EngineConfig::default()
    });
    let used = || s.engine.stats.kv_blocks_used.load(Ordering::Relaxed);
    let (j, rx) = job(vec![71; 1500], 4, None);
    s.engine.submit(j).unwrap();
    // Admitted: its blocks are taken; 750 steps of 2 tokens follow.
    wait_for(|| used() > 0);
    drop(rx);
    wait_for(|| used() == 0 && s.engine.stats.running.load(Ordering::Relaxed) == 0);
    // No token was drawn: it went before its prompt was fed.
    assert_eq!(s.engine.stats.completion_tokens.load(Ordering::Relaxed), 0);
}
