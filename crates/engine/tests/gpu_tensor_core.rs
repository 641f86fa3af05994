//! Decode steps with the bf16 products on the tensor cores
//! (`GpuOptions::tensor_core_decode`), on the kernel interpreter: a tiny seeded qwen2
//! (q/k/v biases, an untied bf16 head; one layer all bf16, one with q, k and v in three
//! formats and a quantized gate/up, which keep the matrix–vector kernels) generates
//! greedily within the FP64 check's bound of the f64 CPU reference, and a sequence's
//! logits have the same bits stepped alone as with 2 or 5 other sequences, and as in
//! steps of 3, 9 and 17 rows, which take the products' variants of 8, 16 and 32 rows a
//! pass.
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_cpu::Decoder;
use quench_engine::gpu::check::{check_generation, LogitBound, Reference};
use quench_engine::gpu::{
    Catalog, DecodeGraph, GpuDecoder, GpuOptions, GpuSession, Products, Rows, StepShape,
};
use quench_engine::KvCache;
use quench_models::arch::{ModelConfig, Naming};
use quench_models::{GgmlType, GgufFile};
use quench_rt::InterpExecutor;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::{bits, gguf, seed, LayerFormats, Shape, Tiny, BF16};

const VOCAB: usize = 256;

/// 2 layers, width 128, 4 heads of 32 over 2 kv heads, ffn 256, 256 tokens.
const SHAPE: Shape = Shape {
    hidden: 128,
    heads: 4,
    kv_heads: 2,
    head_dim: 32,
    ffn: 256,
    vocab: VOCAB,
    context: 512,
    eps: 1e-5,
};

/// q, o and down in bf16 (tensor cores); k, v and gate/up in other formats.
const MIXED: LayerFormats = LayerFormats {
    q: GgmlType::BF16,
    k: GgmlType::F16,
    v: GgmlType::Q4_1,
    o: GgmlType::BF16,
    gate_up: GgmlType::Q8_0,
    down: GgmlType::BF16,
};

fn model(rng: &mut ChaCha8Rng) -> GgufFile {
    let m = Tiny {
        arch: "qwen2",
        shape: SHAPE,
        layers: vec![BF16, MIXED],
        embedding: GgmlType::BF16,
        output: Some(GgmlType::BF16),
    };
    gguf(&m, rng)
}

/// A decoder on the interpreter taking steps of up to `max_batch` rows.
fn decoder(file: &GgufFile, max_batch: usize) -> GpuDecoder {
    let options = GpuOptions {
        context: Some(32),
        sessions: max_batch,
        max_batch,
        tensor_core_decode: true,
        ..GpuOptions::default()
    };
    let config = ModelConfig::from_gguf(file).expect("config");
    GpuDecoder::new(
        config,
        file,
        Naming::Gguf,
        Box::new(InterpExecutor::new()),
        None,
        &options,
    )
    .expect("loads")
}

#[test]
fn tensor_core_steps_match_the_f64_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = model(&mut rng);
    let gpu = decoder(&file, 6);
    let s = gpu.summary();
    // Layer 0: q|k|v, o, gate/up, down; layer 1: q, o, down; the head.
    assert_eq!(s.tensor_core_products, 8, "{s:?}");
    // One-row steps normalize apart too: the norms are dispatches of their own.
    assert!(
        s.layer_plan.iter().any(|l| l == "attention norm"),
        "{:?}",
        s.layer_plan
    );
    // Layer 0: both norms apart, 8 dispatches; layer 1: the attention norm apart (q is
    // bf16), the ffn norm inside its quantized gate/up product, q, k and v apart: 9.
    assert_eq!(s.layer_dispatches, [8, 9], "{s:?}");
    let config = ModelConfig::from_gguf(&file).expect("config");
    let reference =
        Reference::from_decoder(Decoder::load(config, &file, Naming::Gguf).expect("loads"));
    let prompt: Vec<u32> = (0..5).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let c = check_generation(&gpu, &reference, LogitBound::FP64_CHECK, &prompt, 4).expect("runs");
    for st in &c.steps {
        eprintln!(
            "position {}: max |error| {:.2e}",
            st.position, st.max_abs_error
        );
        // A different pick is accepted only at a near-tie of the reference (the bound's
        // `near_tie`): seeds exist whose two best logits differ by less than 1e-4.
        assert!(st.passed(), "{st:?}");
    }
}

/// Feeds each of `seqs` alone, then all of them again position by position in the steps
/// `steps[pos]` (each a group of sequence indices), and requires every logit of a sequence
/// to have the same bits both ways.
fn assert_steps_match_alone(gpu: &GpuDecoder, seqs: &[Vec<u32>], steps: &[Vec<Vec<usize>>]) {
    let alone: Vec<Vec<Vec<u32>>> = seqs
        .iter()
        .map(|t| {
            let mut s = gpu.new_session();
            t.iter()
                .map(|&tok| bits(&gpu.feed(&mut s, &[tok]).expect("steps")))
                .collect()
        })
        .collect();
    let mut sessions: Vec<GpuSession> = seqs.iter().map(|_| gpu.new_session()).collect();
    for (pos, groups) in steps.iter().enumerate() {
        for group in groups {
            let mut picked: Vec<Option<&mut GpuSession>> = sessions.iter_mut().map(Some).collect();
            let mut rows: Vec<(&mut GpuSession, u32)> = group
                .iter()
                .map(|&i| (picked[i].take().expect("once"), seqs[i][pos]))
                .collect();
            let got = gpu.step_batch(&mut rows).expect("the step runs");
            for (&i, logits) in group.iter().zip(&got) {
                assert!(
                    bits(logits) == alone[i][pos],
                    "sequence {i} at position {pos}, in a step of {} rows, differs from the sequence alone",
                    group.len()
                );
            }
        }
    }
}

#[test]
fn a_sequences_logits_are_the_same_alone_and_with_others() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = model(&mut rng);
    let gpu = decoder(&file, 6);
    let seqs: Vec<Vec<u32>> = (0..6)
        .map(|_| (0..4).map(|_| rng.gen_range(0..VOCAB as u32)).collect())
        .collect();
    // Positions 0 and 1: all six in one step; 2 and 3: two steps of three.
    let steps: Vec<Vec<Vec<usize>>> = (0..4)
        .map(|pos| {
            if pos < 2 {
                vec![(0..6).collect()]
            } else {
                vec![vec![4, 0, 2], vec![1, 5, 3]]
            }
        })
        .collect();
    assert_steps_match_alone(&gpu, &seqs, &steps);
}

/// The tensor-core dispatches of a step of `rows` rows in the graph for `max_batch`.
fn tensor_core_kernels(graph: &DecodeGraph, rows: u32) -> Vec<usize> {
    graph
        .step(rows)
        .filter(|d| graph.kernels[d.kernel].name.starts_with("gemv_tc_"))
        .map(|d| d.kernel)
        .collect()
}

#[test]
fn each_row_count_takes_the_narrowest_variant_that_holds_it() {
    let file = model(&mut ChaCha8Rng::seed_from_u64(seed()));
    let config = ModelConfig::from_gguf(&file).expect("config");
    let catalog = Catalog::choose(&config, &file, Naming::Gguf).expect("kernels");
    // (max_batch, the row counts served by each variant built: 8, 16, 32, 64 rows a pass)
    for (max_batch, classes) in [
        (6usize, vec![1..=6u32]),
        (8, vec![1..=8]),
        (17, vec![1..=8, 9..=16, 17..=17]),
        (64, vec![1..=8, 9..=16, 17..=32, 33..=64]),
        (100, vec![1..=8, 9..=16, 17..=32, 33..=100]),
    ] {
        let shape = StepShape {
            context: 32,
            sessions: max_batch,
            max_batch,
            kv: KvCache::F16,
        };
        let graph = DecodeGraph::assemble_with(
            &config,
            &catalog,
            &file,
            Naming::Gguf,
            shape,
            132,
            Products::TensorCore,
        )
        .expect("a step");
        let tc: Vec<_> = graph
            .dispatches
            .iter()
            .filter(|d| graph.kernels[d.kernel].name.starts_with("gemv_tc_"))
            .collect();
        // 8 products, a dispatch per variant each.
        assert_eq!(tc.len(), 8 * classes.len(), "max_batch {max_batch}");
        if classes.len() == 1 {
            assert!(
                tc.iter().all(|d| d.rows == Rows::Any),
                "max_batch {max_batch}"
            );
        }
        let mut seen = vec![];
        for class in &classes {
            let first = tensor_core_kernels(&graph, *class.start());
            assert_eq!(
                first.len(),
                8,
                "max_batch {max_batch}, {} rows",
                class.start()
            );
            for n in class.clone() {
                assert_eq!(
                    tensor_core_kernels(&graph, n),
                    first,
                    "max_batch {max_batch}: {n} rows take another variant"
                );
            }
            assert!(
                first.iter().all(|k| !seen.contains(k)),
                "max_batch {max_batch}: two classes share a variant"
            );
            seen.extend(first);
        }
    }
}

#[test]
fn a_sequences_logits_are_the_same_in_every_variant() {
    const N: usize = 17;
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = model(&mut rng);
    let gpu = decoder(&file, N);
    let seqs: Vec<Vec<u32>> = (0..N)
        .map(|_| (0..3).map(|_| rng.gen_range(0..VOCAB as u32)).collect())
        .collect();
    // Each position splits the sequences, in a fresh order, into steps of these sizes: the
    // variants of 32, 16 and 8 rows a pass.
    let splits: [&[usize]; 3] = [&[17], &[9, 3, 5], &[3, 9, 5]];
    let steps: Vec<Vec<Vec<usize>>> = splits
        .iter()
        .map(|sizes| {
            let mut order: Vec<usize> = (0..N).collect();
            order.shuffle(&mut rng);
            let mut rest = &order[..];
            sizes
                .iter()
                .map(|&size| {
                    let (group, after) = rest.split_at(size);
                    rest = after;
                    group.to_vec()
                })
                .collect()
        })
        .collect();
    assert_steps_match_alone(&gpu, &seqs, &steps);
}
