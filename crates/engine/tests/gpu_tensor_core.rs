//! Decode steps with the bf16 products on the tensor cores
//! (`GpuOptions::tensor_core_decode`), on the kernel interpreter: a tiny seeded qwen2
//! (q/k/v biases, an untied bf16 head; one layer all bf16, one with q, k and v in three
//! formats and a quantized gate/up, which keep the matrix–vector kernels) generates
//! greedily within the FP64 check's bound of the f64 CPU reference, and a sequence's
//! logits have the same bits stepped alone as with 2 or 5 other sequences.
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else from the
//! clock, and is printed so that a failure can be replayed.

use quench_cpu::{Decoder, ModelConfig, Naming};
use quench_engine::gpu::check::{check_generation, LogitBound, Reference};
use quench_engine::gpu::{GpuDecoder, GpuOptions, GpuSession};
use quench_models::{GgmlType, GgufFile};
use quench_rt::InterpExecutor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::{bits, gguf, seed, LayerFormats, Shape, Tiny};

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

const BF16: LayerFormats = LayerFormats {
    q: GgmlType::BF16,
    k: GgmlType::BF16,
    v: GgmlType::BF16,
    o: GgmlType::BF16,
    gate_up: GgmlType::BF16,
    down: GgmlType::BF16,
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

fn decoder(file: &GgufFile) -> GpuDecoder {
    let options = GpuOptions {
        context: Some(32),
        sessions: 6,
        max_batch: 6,
        tensor_core_decode: true,
        ..GpuOptions::default()
    };
    let config = ModelConfig::from_gguf(file).expect("config");
    GpuDecoder::new(config, file, Naming::Gguf, Box::new(InterpExecutor::new()), None, &options)
        .expect("loads")
}

#[test]
fn tensor_core_steps_match_the_f64_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = model(&mut rng);
    let gpu = decoder(&file);
    let s = gpu.summary();
    // Layer 0: q|k|v, o, gate/up, down; layer 1: q, o, down; the head.
    assert_eq!(s.tensor_core_products, 8, "{s:?}");
    // One-row steps normalize apart too: the norms are dispatches of their own.
    assert!(s.layer_plan.iter().any(|l| l == "attention norm"), "{:?}", s.layer_plan);
    // Layer 0: both norms apart, 8 dispatches; layer 1: the attention norm apart (q is
    // bf16), the ffn norm inside its quantized gate/up product, q, k and v apart: 9.
    assert_eq!(s.layer_dispatches, [8, 9], "{s:?}");
    let config = ModelConfig::from_gguf(&file).expect("config");
    let reference = Reference::from_decoder(Decoder::load(config, &file, Naming::Gguf).expect("loads"));
    let prompt: Vec<u32> = (0..5).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let c = check_generation(&gpu, &reference, LogitBound::FP64_CHECK, &prompt, 4).expect("runs");
    for st in &c.steps {
        eprintln!("position {}: max |error| {:.2e}", st.position, st.max_abs_error);
        assert_eq!(st.outside, 0, "{st:?}");
        assert_eq!(st.device_top1, st.reference_top1, "{st:?}");
    }
}

#[test]
fn a_sequences_logits_are_the_same_alone_and_with_others() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = model(&mut rng);
    let gpu = decoder(&file);
    let seqs: Vec<Vec<u32>> = (0..6).map(|_| (0..4).map(|_| rng.gen_range(0..VOCAB as u32)).collect()).collect();
    let alone: Vec<Vec<Vec<u32>>> = seqs
        .iter()
        .map(|t| {
            let mut s = gpu.new_session();
            t.iter().map(|&tok| bits(&gpu.feed(&mut s, &[tok]).expect("steps"))).collect()
        })
        .collect();
    let mut sessions: Vec<GpuSession> = (0..6).map(|_| gpu.new_session()).collect();
    // Positions 0 and 1: all six in one step; 2 and 3: two steps of three.
    for pos in 0..4 {
        let groups: Vec<Vec<usize>> = if pos < 2 { vec![(0..6).collect()] } else { vec![vec![4, 0, 2], vec![1, 5, 3]] };
        for group in groups {
            let mut picked: Vec<Option<&mut GpuSession>> = sessions.iter_mut().map(Some).collect();
            let mut rows: Vec<(&mut GpuSession, u32)> =
                group.iter().map(|&i| (picked[i].take().expect("once"), seqs[i][pos])).collect();
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
