//! The FP64 check's reference loaded from a checkpoint streams its layers: its logits are
//! those of the f64 decoder held in memory, it reports its progress and what it held, and it
//! judges generations as that decoder does.
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else at random,
//! and is printed so that a failure can be replayed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use quench_cpu::{Decoder, StreamProgress};
use quench_engine::gpu::check::{judge_generation, LogitBound, Reference};
use quench_engine::synth::{synthesize, SynthArch, SynthDtype, SynthOptions, SynthShape};
use quench_models::arch::{ModelConfig, Naming};
use quench_models::HfCheckpoint;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::seed;

/// A tiny synthetic checkpoint of `arch` in a fresh directory under the target's temporary
/// folder.
fn tiny_checkpoint(arch: SynthArch, seed: u64) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "streamed-reference-{}-{}-{seed:x}",
        arch.name(),
        std::process::id()
    ));
    let options = SynthOptions {
        arch,
        shape: SynthShape::Tiny,
        seed,
        dtype: SynthDtype::Bf16,
        max_shard_bytes: SynthOptions::DEFAULT_SHARD_BYTES,
    };
    synthesize(&dir, &options, &mut |_| {}).unwrap();
    dir
}

fn in_memory(dir: &Path) -> Reference {
    let checkpoint = HfCheckpoint::open(dir).unwrap();
    let config = ModelConfig::from_hf_config(checkpoint.config()).unwrap();
    Reference::from_decoder(Decoder::load(config, &checkpoint, Naming::HuggingFace).unwrap())
}

#[test]
fn the_streamed_reference_gives_the_in_memory_decoders_logits() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    for arch in [SynthArch::Llama, SynthArch::Qwen2, SynthArch::Qwen3] {
        let dir = tiny_checkpoint(arch, rng.gen());
        let heard = Arc::new(Mutex::new(vec![]));
        let sink = Arc::clone(&heard);
        let streamed = Reference::load(&dir)
            .unwrap()
            .with_progress(move |p| sink.lock().unwrap().push(p));
        let loaded = in_memory(&dir);
        assert_eq!(streamed.config(), loaded.config());
        let (layers, vocab) = (streamed.config().layers, streamed.config().vocab);

        let tokens: Vec<u32> = (0..30).map(|_| rng.gen_range(0..vocab as u32)).collect();
        let from = 17;
        let got = streamed.logits(&tokens, from).unwrap();
        let want = loaded.logits(&tokens, from).unwrap();
        assert_eq!((got.len(), want.len()), (13, 13));
        let mut equal = 0;
        for (t, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.len(), vocab);
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-9 * b.abs(),
                    "{}: position {}, logit {i}: streamed {a} vs in memory {b}",
                    arch.name(),
                    from + t
                );
                equal += usize::from(a.to_bits() == b.to_bits());
            }
        }
        eprintln!(
            "{}: {equal} of {} logits bit-equal",
            arch.name(),
            13 * vocab
        );

        let pass = streamed.last_pass().unwrap();
        assert_eq!((pass.tokens, pass.positions, pass.peak_layers), (30, 13, 1));
        assert!(pass.peak_weight_bytes > 0);
        assert!(loaded.last_pass().is_none());
        let heard = heard.lock().unwrap();
        let layer_events: Vec<StreamProgress> = heard[..layers].to_vec();
        let want_layers: Vec<StreamProgress> = (1..=layers)
            .map(|done| StreamProgress::Layer { done, of: layers })
            .collect();
        assert_eq!(layer_events, want_layers);
        assert_eq!(
            heard.last(),
            Some(&StreamProgress::Head {
                done: vocab,
                of: vocab
            })
        );
    }
}

#[test]
fn the_streamed_reference_judges_a_generation() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let dir = tiny_checkpoint(SynthArch::Qwen3, rng.gen());
    let reference = Reference::load(&dir).unwrap();
    let vocab = reference.config().vocab as u32;
    let prompt: Vec<u32> = (0..9).map(|_| rng.gen_range(0..vocab)).collect();
    // A "device" that reproduces the reference to f32, choosing greedily.
    let mut tokens = vec![];
    let mut rows = vec![];
    for _ in 0..5 {
        let fed: Vec<u32> = prompt.iter().chain(&tokens).copied().collect();
        let row: Vec<f32> = reference.logits(&fed, fed.len() - 1).unwrap()[0]
            .iter()
            .map(|&v| v as f32)
            .collect();
        tokens.push(quench_engine::generate::argmax(&row).unwrap());
        rows.push(row);
    }
    let bound = LogitBound::FP64_CHECK;
    let steps = judge_generation(&reference, bound, &prompt, &tokens, &rows).unwrap();
    assert_eq!(steps.len(), 5);
    assert!(steps.iter().all(|s| s.passed()), "{steps:?}");
    assert_eq!(reference.last_pass().unwrap().tokens, 9 + 4);

    // Control: one logit moved past the bound at step 3 fails that step only.
    let mut bad = rows.clone();
    let moved = rng.gen_range(0..vocab as usize);
    bad[3][moved] += 0.2 + 0.01 * bad[3][moved].abs();
    let steps = judge_generation(&reference, bound, &prompt, &tokens, &bad).unwrap();
    let failed: Vec<usize> = steps
        .iter()
        .filter(|s| !s.passed())
        .map(|s| s.position)
        .collect();
    assert_eq!(failed, [prompt.len() - 1 + 3]);
    assert_eq!(steps[3].outside, 1);
}

/// Times one reference pass over a 128-token prompt and 64 generated tokens on the
/// checkpoint named by `QUENCH_REFERENCE_TIMING` (for instance a `quench synth` model at a
/// real shape).
#[test]
#[ignore = "a timing: run with QUENCH_REFERENCE_TIMING=CHECKPOINT and --ignored"]
fn time_a_reference_pass_when_asked() {
    let path = std::env::var("QUENCH_REFERENCE_TIMING")
        .expect("QUENCH_REFERENCE_TIMING names the checkpoint to time");
    let reference = Reference::load(Path::new(&path))
        .unwrap()
        .with_progress(|p| eprintln!("{p:?}"));
    let vocab = reference.config().vocab as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let tokens: Vec<u32> = (0..192).map(|_| rng.gen_range(0..vocab)).collect();
    let start = Instant::now();
    let rows = reference.logits(&tokens, 127).unwrap();
    let wall = start.elapsed();
    assert_eq!(rows.len(), 65);
    assert!(rows.iter().flatten().all(|v| v.is_finite()));
    let pass = reference.last_pass().unwrap();
    eprintln!(
        "reference over 128 + 64 tokens of {path}: {:.1} s on {} threads; peak weights {:.1} MiB, \
         peak host estimate {:.1} MiB",
        wall.as_secs_f64(),
        rayon_threads(),
        pass.peak_weight_bytes as f64 / (1u64 << 20) as f64,
        pass.peak_host_bytes() as f64 / (1u64 << 20) as f64,
    );
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
