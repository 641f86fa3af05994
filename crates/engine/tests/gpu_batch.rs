//! Batched decode on the kernel interpreter: sequences at different positions stepped
//! together (joining and leaving the batch, changing rows from step to step) get logits
//! with the same bits as each stepped alone, on the same decoder and on one loaded for
//! single steps; for a fused q|k|v projection (llama), q/k/v biases and a tied head
//! (qwen2), per-head q/k norms (qwen3) and separate quantized q, k and v projections.
//! Steps of several rows normalize each row with a dispatch of its own and multiply
//! the rows without the products' RMSNorm prologue (which a one-row step keeps): the
//! plans and kernels of both kinds of step are checked. Batches past the limit, and rows
//! that cannot be fed, are refused without disturbing the others.
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else at random,
//! and is printed so that a failure can be replayed.

use std::path::PathBuf;

use quench_engine::gpu::{
    load_decoder, Backend, DecodeGraph, GpuDecoder, GpuError, GpuOptions, GpuSession, GpuSummary,
    StepShape,
};
use quench_engine::synth::{synthesize, SynthArch, SynthDtype, SynthOptions, SynthShape};
use quench_engine::KvCache;
use quench_models::arch::{ModelConfig, Naming};
use quench_models::{GgmlType, GgufFile};
use quench_rt::InterpExecutor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::{bits, gguf, seed, step_graph, LayerFormats, Shape, Tiny};

const CONTEXT: usize = 32;

/// Decode steps only: prompts fed a token per step (the prompt path's batching is
/// tested in `gpu_prefill.rs`).
fn options(max_batch: usize) -> GpuOptions {
    GpuOptions {
        context: Some(CONTEXT),
        prefill_chunk: 0,
        sessions: 4,
        max_batch,
        ..GpuOptions::default()
    }
}

/// A synthetic Hugging Face checkpoint of the tiny shape (bf16: q, k and v in one
/// projection), under the target's temporary folder.
fn synth(arch: SynthArch, seed: u64) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("gpu-batch-{}-{seed:x}", arch.name()));
    let options = SynthOptions {
        arch,
        shape: SynthShape::Tiny,
        seed,
        dtype: SynthDtype::Bf16,
        max_shard_bytes: SynthOptions::DEFAULT_SHARD_BYTES,
    };
    synthesize(&dir, &options, &mut |_| {}).expect("synthesizes");
    dir
}

const VOCAB: usize = 64;

/// A tiny qwen2 GGUF whose q, k and v are stored in different formats (three projections,
/// each with its bias): two heads over one kv head, one layer. Its residual stream is 576
/// wide (SmolLM2's): 144 groups of 4 over the norms' 128 threads, so that every warp sums
/// a part of each row and the order of the norms' reductions shows in the bits.
fn separate_qkv(rng: &mut ChaCha8Rng) -> GgufFile {
    let m = Tiny {
        arch: "qwen2",
        shape: Shape {
            hidden: 576,
            heads: 2,
            kv_heads: 1,
            head_dim: 32,
            ffn: 128,
            vocab: VOCAB,
            context: 256,
            eps: 1e-6,
        },
        layers: vec![LayerFormats {
            q: GgmlType::Q8_0,
            k: GgmlType::Q4_1,
            v: GgmlType::F16,
            o: GgmlType::Q4_1,
            gate_up: GgmlType::Q8_0,
            down: GgmlType::Q4_1,
        }],
        embedding: GgmlType::Q8_0,
        output: Some(GgmlType::Q4_1),
    };
    gguf(&m, rng)
}

fn gguf_decoder(file: &GgufFile, options: &GpuOptions) -> GpuDecoder {
    let config = ModelConfig::from_gguf(file).expect("config");
    GpuDecoder::new(
        config,
        file,
        Naming::Gguf,
        Box::new(InterpExecutor::new()),
        None,
        options,
    )
    .expect("loads")
}

/// Fails with the number of logits whose bits differ, and the first of them.
fn same(got: &[u32], want: &[u32], what: impl FnOnce() -> String) {
    if got != want {
        let diff: Vec<usize> = (0..got.len().max(want.len()))
            .filter(|&i| got.get(i) != want.get(i))
            .collect();
        let i = diff[0];
        panic!(
            "{}: {} of {} logits differ; the first, {i}: {:?} vs {:?} alone",
            what(),
            diff.len(),
            want.len(),
            got.get(i).map(|&b| f32::from_bits(b)),
            want.get(i).map(|&b| f32::from_bits(b)),
        );
    }
}

/// The logits after each token of `tokens`, stepped alone from an empty session.
fn alone(decoder: &GpuDecoder, tokens: &[u32]) -> Vec<Vec<u32>> {
    let mut s = decoder.new_session();
    tokens
        .iter()
        .map(|&t| bits(&decoder.feed(&mut s, &[t]).expect("steps")))
        .collect()
}

/// Three sequences stepped together: a prompt each through `feed_batch` (lengths 4, 1
/// and 6: the rows share the first step and leave one by one), then single tokens with
/// `step_batch` where the third sequence sits out a step and the rows come in a
/// different order every step. Every logit is compared, bit for bit, with the sequence
/// stepped alone on the same decoder and on `single` (loaded for one row a step).
fn check_batched(what: &str, decoder: &GpuDecoder, single: &GpuDecoder, rng: &mut ChaCha8Rng) {
    let vocab = decoder.config().vocab as u32;
    let lens = [4, 1, 6];
    let total = [9, 7, 10];
    let seqs: Vec<Vec<u32>> = total
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(0..vocab)).collect())
        .collect();
    let want: Vec<Vec<Vec<u32>>> = seqs.iter().map(|t| alone(decoder, t)).collect();
    for (i, row) in alone(single, &seqs[0]).iter().enumerate() {
        same(row, &want[0][i], || {
            format!("{what}: position {i} on the one-row decoder")
        });
    }

    let mut sessions: Vec<GpuSession> = (0..3).map(|_| decoder.new_session()).collect();
    let mut fed = lens.to_vec();
    {
        let mut rows: Vec<(&mut GpuSession, &[u32])> = sessions
            .iter_mut()
            .zip(&seqs)
            .zip(lens)
            .map(|((s, t), n)| (s, &t[..n]))
            .collect();
        let got = decoder.feed_batch(&mut rows).expect("the batch runs");
        for (i, l) in got.into_iter().enumerate() {
            let l = l.unwrap_or_else(|e| panic!("{what}: row {i}: {e}"));
            same(&bits(&l), &want[i][lens[i] - 1], || {
                format!("{what}: sequence {i}'s prompt")
            });
        }
    }
    for step in 0.. {
        // Rotate the order; the third sequence skips step 1.
        let order: Vec<usize> = (0..3)
            .map(|k| (k + step) % 3)
            .filter(|&i| fed[i] < total[i] && !(i == 2 && step == 1))
            .collect();
        if order.is_empty() {
            break;
        }
        let mut picked: Vec<Option<&mut GpuSession>> = sessions.iter_mut().map(Some).collect();
        let mut rows: Vec<(&mut GpuSession, u32)> = order
            .iter()
            .map(|&i| (picked[i].take().expect("once"), seqs[i][fed[i]]))
            .collect();
        let got = decoder.step_batch(&mut rows).expect("the step runs");
        for (&i, l) in order.iter().zip(&got) {
            same(&bits(l), &want[i][fed[i]], || {
                format!(
                    "{what}: sequence {i} at position {} (step {step} of {} rows)",
                    fed[i],
                    order.len()
                )
            });
            fed[i] += 1;
        }
    }
    assert_eq!(fed, total);
}

/// The plan of a step of several rows: each `<norm> + <product>` of the one-row plan
/// becomes the norm's own dispatch (once per norm) followed by the product; two norms a
/// layer and the output norm are the dispatches added. Decoders of one row a step have
/// no such plan.
fn check_plans(what: &str, s: &GpuSummary, layers: usize) {
    if s.max_batch == 1 {
        assert_eq!(
            (s.batch_dispatches_per_step, s.batch_layer_plan.len()),
            (None, 0),
            "{what}"
        );
        return;
    }
    let mut want: Vec<String> = vec![];
    for label in &s.layer_plan {
        let norm = ["attention norm", "ffn norm"].into_iter().find_map(|n| {
            label
                .strip_prefix(&format!("{n} + "))
                .map(|product| (n, product))
        });
        match norm {
            Some((n, product)) => {
                if !want.iter().any(|w| w == n) {
                    want.push(n.into());
                }
                want.push(product.into());
            }
            None => want.push(label.clone()),
        }
    }
    assert_eq!(s.batch_layer_plan, want, "{what}");
    assert_eq!(
        s.batch_dispatches_per_step,
        Some(s.dispatches_per_token + 2 * layers + 1),
        "{what}"
    );
}

#[test]
fn sequences_stepped_together_match_each_stepped_alone() {
    let s = seed();
    for arch in [SynthArch::Llama, SynthArch::Qwen2, SynthArch::Qwen3] {
        let dir = synth(arch, s);
        let decoder = load_decoder(&dir, Backend::Interp, &options(4)).expect("loads");
        assert_eq!(decoder.max_batch(), 4);
        let single = load_decoder(&dir, Backend::Interp, &options(1)).expect("loads");
        let layers = decoder.config().layers;
        check_plans(arch.name(), decoder.summary(), layers);
        check_plans(arch.name(), single.summary(), layers);
        let mut rng = ChaCha8Rng::seed_from_u64(s ^ 7);
        check_batched(arch.name(), &decoder, &single, &mut rng);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let file = separate_qkv(&mut rng);
    let decoder = gguf_decoder(&file, &options(3));
    assert_eq!(decoder.summary().layer_dispatches, [8]);
    check_plans("separate q, k, v", decoder.summary(), 1);
    let single = gguf_decoder(&file, &options(1));
    check_batched("qwen2 with separate q, k, v", &decoder, &single, &mut rng);
    // Replaying captured steps and launching every dispatch agree.
    let direct = gguf_decoder(
        &file,
        &GpuOptions {
            capture: false,
            ..options(3)
        },
    );
    check_batched("launched directly", &direct, &single, &mut rng);
}

#[test]
fn steps_of_several_rows_normalize_apart() {
    let file = separate_qkv(&mut ChaCha8Rng::seed_from_u64(seed()));
    let shape = StepShape {
        context: CONTEXT,
        sessions: 1,
        max_batch: 8,
        kv: KvCache::F16,
    };
    let (config, catalog, graph) = step_graph(&file, shape);
    let kernels = |rows: u32| -> Vec<&str> {
        graph
            .step(rows)
            .map(|d| graph.kernels[d.kernel].name.as_str())
            .collect()
    };
    let count = |names: &[&str], f: &dyn Fn(&str) -> bool| names.iter().filter(|n| f(n)).count();
    let (one, many) = (kernels(1), kernels(8));
    let prologue = |n: &str| n.contains("gemv") && n.contains("_rmsnorm_");
    let apart = |n: &str| n == "rmsnorm_rows_f32";
    // q, k, v, gate/up and the LM head read the norms: inside the products at one row…
    assert_eq!(
        (count(&one, &prologue), count(&one, &apart)),
        (5, 0),
        "{one:?}"
    );
    // …and from the norms' own dispatches, one per norm, in steps of several rows.
    assert_eq!(
        (count(&many, &prologue), count(&many, &apart)),
        (0, 3),
        "{many:?}"
    );
    assert_eq!(many.len(), one.len() + 3);
    // Every row count between takes the several-row step.
    for rows in 2..8 {
        assert_eq!(kernels(rows), many);
    }
    // A decoder of one row a step has only the one-row dispatches.
    let single = DecodeGraph::assemble(
        &config,
        &catalog,
        &file,
        Naming::Gguf,
        StepShape {
            max_batch: 1,
            ..shape
        },
    )
    .expect("a step");
    assert_eq!(single.dispatches.len(), one.len());
    assert!(single.dispatches.iter().all(|d| d.rows.includes(1)));
}

#[test]
fn greedy_steps_take_each_rows_largest_logit() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = separate_qkv(&mut rng);
    let decoder = gguf_decoder(&file, &options(3));
    let mut a: Vec<GpuSession> = (0..3).map(|_| decoder.new_session()).collect();
    let mut b: Vec<GpuSession> = (0..3).map(|_| decoder.new_session()).collect();
    let tokens: Vec<u32> = (0..3).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let mut rows: Vec<(&mut GpuSession, u32)> = a.iter_mut().zip(tokens.clone()).collect();
    let logits = decoder.step_batch(&mut rows).expect("steps");
    let mut rows: Vec<(&mut GpuSession, u32)> = b.iter_mut().zip(tokens).collect();
    let next = decoder.step_batch_greedy(&mut rows).expect("steps");
    let host: Vec<u32> = logits
        .iter()
        .map(|l| quench_engine::generate::argmax(l).expect("a largest logit"))
        .collect();
    assert_eq!(next, host);
}

#[test]
fn batches_past_the_limit_and_rows_that_cannot_run_are_refused() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = separate_qkv(&mut rng);
    let decoder = gguf_decoder(&file, &options(2));
    let mut s: Vec<GpuSession> = (0..3).map(|_| decoder.new_session()).collect();
    let mut rows: Vec<(&mut GpuSession, u32)> = s.iter_mut().map(|s| (s, 1)).collect();
    match decoder.step_batch(&mut rows) {
        Err(e @ GpuError::BatchTooLarge { rows: 3, max: 2 }) => {
            assert!(e.to_string().contains("at most 2"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(s.iter().all(GpuSession::is_empty), "nothing ran");

    // A token outside the vocabulary and an overlong prompt fail their rows only.
    let good: Vec<u32> = (0..3).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let want = alone(&decoder, &good);
    let (mut a, mut b) = (decoder.new_session(), decoder.new_session());
    let bad = [2, VOCAB as u32];
    let mut rows: Vec<(&mut GpuSession, &[u32])> = vec![(&mut a, &good), (&mut b, &bad)];
    let got = decoder.feed_batch(&mut rows).expect("the batch runs");
    same(
        &bits(got[0].as_ref().expect("the good row runs")),
        &want[2],
        || "the good row".into(),
    );
    assert!(
        matches!(got[1], Err(GpuError::Token { .. })),
        "{:?}",
        got[1]
    );
    assert!(b.is_empty());
    let long = vec![1; CONTEXT + 1];
    let mut rows: Vec<(&mut GpuSession, &[u32])> = vec![(&mut b, &long), (&mut a, &[3])];
    let got = decoder.feed_batch(&mut rows).expect("the batch runs");
    assert!(matches!(got[0], Err(GpuError::ContextFull { .. })));
    assert_eq!(got[1].as_ref().map(Vec::len).ok(), Some(VOCAB));
    assert_eq!(a.len(), 4);

    // A shared cache of one session's worth (two blocks of 16): the second row's first
    // position finds no block, the first row runs on.
    let small = gguf_decoder(
        &file,
        &GpuOptions {
            sessions: 1,
            ..options(2)
        },
    );
    let first: Vec<u32> = (0..17).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let want = alone(&small, &first);
    let (mut a, mut b) = (small.new_session(), small.new_session());
    let mut rows: Vec<(&mut GpuSession, &[u32])> = vec![(&mut a, &first[..16])];
    small.feed_batch(&mut rows).expect("runs")[0]
        .as_ref()
        .expect("fits");
    let mut rows: Vec<(&mut GpuSession, &[u32])> = vec![(&mut a, &first[16..]), (&mut b, &[5])];
    let got = small.feed_batch(&mut rows).expect("runs");
    same(
        &bits(got[0].as_ref().expect("the first row runs")),
        &want[16],
        || "the row with blocks".into(),
    );
    match &got[1] {
        Err(e @ GpuError::CacheFull { blocks: 2 }) => eprintln!("{e}"),
        other => panic!("{other:?}"),
    }
}

/// The logits `generate` draws its first token from, for the whole of `tokens`.
fn first_logits(model: &quench_engine::CausalModel, tokens: &[u32]) -> Vec<u32> {
    let options = quench_engine::GenerateOptions {
        max_tokens: 1,
        ignore_eos: true,
        keep_logits: true,
        ..Default::default()
    };
    let g = model
        .generate(
            &mut model.new_session(),
            quench_engine::Prompt::Tokens(tokens),
            &options,
            &mut |_| {},
        )
        .expect("generates");
    bits(&g.logits.expect("kept")[0])
}

#[test]
fn models_feed_sessions_in_batches_as_generate_computes_them() {
    use quench_engine::{BatchItem, Device, LoadOptions};
    let s = seed();
    let dir = synth(SynthArch::Qwen2, s ^ 3);
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let cpu = quench_engine::load(&dir, &LoadOptions::default()).expect("loads");
    // Decode steps only: a prompt path's chunk of several tokens rounds otherwise than
    // the decode steps that fed a session's earlier tokens.
    let gpu_options = LoadOptions {
        device: Device::Cuda,
        context_limit: Some(CONTEXT),
        sessions: Some(3),
        max_batch: Some(2),
        prefill_chunk: Some(0),
        ..LoadOptions::default()
    };
    let gpu = quench_engine::load(
        &dir,
        &quench_engine::LoadOptions {
            device: quench_engine::Device::Interp,
            ..gpu_options.clone()
        },
    )
    .and_then(quench_engine::Model::into_causal)
    .expect("loads");
    for (what, model) in [
        ("cpu", cpu.causal().expect("generates text")),
        ("gpu", &gpu),
    ] {
        let contexts: Vec<Vec<u32>> = [3, 1, 5]
            .iter()
            .map(|&n| (0..n).map(|_| rng.gen_range(0..256)).collect())
            .collect();
        let mut sessions: Vec<_> = (0..3).map(|_| model.new_session()).collect();
        // Three items with a batch of two on the GPU: they run as two batches.
        for round in 0..2 {
            let contexts: Vec<Vec<u32>> = match round {
                0 => contexts.clone(),
                // Grown by a token, and the last cut and continued differently.
                _ => vec![
                    [&contexts[0][..], &[9]].concat(),
                    [&contexts[1][..], &[4]].concat(),
                    [&contexts[2][..2], &[1, 2]].concat(),
                ],
            };
            let mut items: Vec<BatchItem<'_>> = sessions
                .iter_mut()
                .zip(&contexts)
                .map(|(session, tokens)| BatchItem { session, tokens })
                .collect();
            let got = model.feed_batch(&mut items);
            for (i, r) in got.iter().enumerate() {
                let l = r.as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
                same(&bits(l), &first_logits(model, &contexts[i]), || {
                    format!("{what}, round {round}, item {i}")
                });
                assert_eq!(sessions[i].tokens(), &contexts[i][..]);
            }
        }
        // Another model's session fails alone.
        let mut foreign = if what == "gpu" {
            cpu.causal().expect("generates text").new_session()
        } else {
            gpu.new_session()
        };
        let mut mine = model.new_session();
        let mut items = vec![
            BatchItem {
                session: &mut foreign,
                tokens: &[1, 2],
            },
            BatchItem {
                session: &mut mine,
                tokens: &[3],
            },
        ];
        let got = model.feed_batch(&mut items);
        assert!(got[0].is_err() && got[1].is_ok());
    }
}

/// A fork holds its parent's whole 16-position blocks, shared rather than copied: fed the
/// parent's remaining tokens it gets the parent's logits bit for bit. As both go on their
/// own ways, stepped together, and after the parent is dropped, each gets the bits of a
/// session that was never forked: neither writes into the other's keys and values, and a
/// shared block outlives the session that made it.
#[test]
fn a_fork_shares_whole_blocks_and_neither_disturbs_the_other() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = separate_qkv(&mut rng);
    let decoder = gguf_decoder(&file, &options(2));
    let mut draw =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.gen_range(0..VOCAB as u32)).collect() };
    let prompt = draw(21);
    let (mine, theirs) = (draw(6), draw(6));
    let parent_way: Vec<u32> = prompt.iter().chain(&mine).copied().collect();
    let fork_way: Vec<u32> = prompt.iter().chain(&theirs).copied().collect();
    let (want_parent, want_fork) = (alone(&decoder, &parent_way), alone(&decoder, &fork_way));

    let mut parent = decoder.new_session();
    for &t in &prompt {
        decoder.feed(&mut parent, &[t]).expect("steps");
    }
    let mut fork = parent.fork();
    assert_eq!(fork.len(), 16, "the fork holds the one whole block");
    assert_eq!(parent.len(), 21);
    for (i, &t) in prompt[16..].iter().enumerate() {
        let got = bits(&decoder.feed(&mut fork, &[t]).expect("steps"));
        same(&got, &want_parent[16 + i], || {
            format!("the fork at {}", 16 + i)
        });
    }
    for (j, (&a, &b)) in mine[..3].iter().zip(&theirs[..3]).enumerate() {
        let mut rows: Vec<(&mut GpuSession, u32)> = vec![(&mut parent, a), (&mut fork, b)];
        let got = decoder.step_batch(&mut rows).expect("steps");
        let at = prompt.len() + j;
        same(&bits(&got[0]), &want_parent[at], || {
            format!("the parent at {at}")
        });
        same(&bits(&got[1]), &want_fork[at], || {
            format!("the fork at {at}")
        });
    }
    drop(parent);
    // A new session takes the blocks given back first: had the shared one been given
    // back, these would overwrite the fork's keys.
    let mut intruder = decoder.new_session();
    for &t in &draw(17) {
        decoder.feed(&mut intruder, &[t]).expect("steps");
    }
    for (j, &t) in theirs[3..].iter().enumerate() {
        let at = prompt.len() + 3 + j;
        let got = bits(&decoder.feed(&mut fork, &[t]).expect("steps"));
        same(&got, &want_fork[at], || {
            format!("the fork at {at}, its parent gone")
        });
    }

    // Cut back into the shared block, a session lets go of that block's positions too:
    // the next position it writes would land in the other's keys.
    let mut other = fork.fork();
    assert_eq!(other.len(), 16);
    fork.truncate(10);
    assert_eq!(fork.len(), 0, "the shared block is given up whole");
    other.truncate(10);
    assert_eq!(other.len(), 10, "no longer shared, the block is kept");
}

/// Greedy decoding under a grammar's mask, the mask applied and the token picked on the
/// device: the same token as the logits read back, masked and picked on the host, after
/// a prompt chunk (the prompt path) and after decode steps. Each mask bans the token the
/// unmasked logits would pick, so a device that ignored it would fail; a row without a
/// mask picks as plain greedy decoding.
#[test]
fn masks_applied_on_the_device_pick_as_the_host_does() {
    use quench_engine::generate::argmax;
    use quench_engine::generate::constrain::apply_mask;
    let s = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let dir = synth(SynthArch::Llama, s ^ 5);
    let options = GpuOptions {
        context: Some(CONTEXT),
        sessions: 2,
        max_batch: 1,
        prefill_chunk: 8,
        prefill_min_tokens: 2,
        ..GpuOptions::default()
    };
    let decoder = load_decoder(&dir, Backend::Interp, &options).expect("loads");
    assert!(decoder.summary().prefill_chunk > 0, "the prompt path is on");
    let vocab = decoder.config().vocab;
    let (mut host, mut device) = (decoder.new_session(), decoder.new_session());
    let mut tokens: Vec<u32> = (0..6).map(|_| rng.gen_range(0..vocab as u32)).collect();
    for step in 0..4 {
        let fed = if step == 0 {
            &tokens[..]
        } else {
            &tokens[tokens.len() - 1..]
        };
        let logits = decoder.feed(&mut host, fed).expect("feeds");
        let best = argmax(&logits).expect("finite logits");
        // A random half of the words allow about a quarter of their tokens; never `best`.
        let mut mask: Vec<u32> = (0..vocab.div_ceil(32))
            .map(|_| match rng.gen_range(0..2) {
                0 => 0,
                _ => rng.gen::<u32>() & rng.gen::<u32>(),
            })
            .collect();
        mask[best as usize / 32] &= !(1 << (best % 32));
        let other = (best as usize / 32 + 1) % mask.len();
        mask[other] |= 1;
        let mut masked = logits.clone();
        assert!(apply_mask(&mask, &mut masked));
        let want = argmax(&masked).expect("an allowed token");
        assert_ne!(want, best);
        // The last step without a mask: plain greedy decoding.
        let (given, want) = match step {
            3 => (None, best),
            _ => (Some(mask), want),
        };
        let got = decoder
            .feed_greedy_masked(&mut device, fed, &|| given.clone())
            .expect("feeds");
        assert_eq!(got, want, "step {step} (seed {s})");
        tokens.push(got);
    }
    assert_eq!(host.len(), device.len());
}

/// A batch whose rows want different things: a prompt chunk picked under a mask, decode
/// rows picked under masks or without one, and rows whose logits are read back. Each
/// picked row gets the token the host picks from the same batch's logits under the same
/// mask (each mask bans the unmasked choice), and the other rows' logits keep their bits.
#[test]
fn a_batch_mixes_rows_picked_on_the_device_and_rows_read_back() {
    use quench_engine::generate::argmax;
    use quench_engine::generate::constrain::apply_mask;
    use quench_engine::Fed;
    let s = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let dir = synth(SynthArch::Qwen2, s ^ 7);
    let options = GpuOptions {
        context: Some(CONTEXT),
        sessions: 10,
        max_batch: 4,
        prefill_chunk: 8,
        prefill_min_tokens: 4,
        ..GpuOptions::default()
    };
    let decoder = load_decoder(&dir, Backend::Interp, &options).expect("loads");
    let vocab = decoder.config().vocab as u32;
    // Row 0 a prompt chunk (the prompt path), the others decode steps of 1–3 tokens.
    let feeds: Vec<Vec<u32>> = [6, 1, 3, 2]
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(0..vocab)).collect())
        .collect();
    let fresh = |n: usize| -> Vec<GpuSession> { (0..n).map(|_| decoder.new_session()).collect() };
    let mut host = fresh(4);
    let mut rows: Vec<_> = host
        .iter_mut()
        .zip(&feeds)
        .map(|(s, f)| (s, &f[..]))
        .collect();
    let logits: Vec<Vec<f32>> = decoder
        .feed_batch(&mut rows)
        .expect("steps")
        .into_iter()
        .map(|r| r.expect("feeds"))
        .collect();
    let picks = [true, true, false, true];
    let masks: Vec<Option<Vec<u32>>> = logits
        .iter()
        .enumerate()
        .map(|(i, l)| {
            // Row 3 picks without a mask; row 2 is read back, its mask ignored.
            (i != 3).then(|| {
                let best = argmax(l).expect("finite logits");
                let mut mask: Vec<u32> = (0..vocab.div_ceil(32)).map(|_| rng.gen()).collect();
                mask[best as usize / 32] &= !(1 << (best % 32));
                mask
            })
        })
        .collect();
    let mut device = fresh(4);
    let mut rows: Vec<_> = device
        .iter_mut()
        .zip(&feeds)
        .map(|(s, f)| (s, &f[..]))
        .collect();
    let fed = decoder
        .feed_batch_picking(&mut rows, &picks, &|| masks.clone())
        .expect("steps");
    for (i, got) in fed.into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("row {i}: {e}"));
        let mut want = logits[i].clone();
        match (picks[i], &masks[i]) {
            (true, Some(mask)) => {
                apply_mask(mask, &mut want);
                let token = argmax(&want).expect("an allowed token");
                assert_ne!(
                    Some(token),
                    argmax(&logits[i]),
                    "row {i}: the mask bans the best"
                );
                assert_eq!(got, Fed::Token(token), "row {i} (seed {s})");
            }
            (true, None) => assert_eq!(got, Fed::Token(argmax(&want).unwrap()), "row {i}"),
            (false, _) => match got {
                Fed::Logits(l) => same(&bits(&l), &bits(&want), || format!("row {i}")),
                Fed::Token(t) => panic!("row {i} was picked ({t}), not read back"),
            },
        }
    }
}
