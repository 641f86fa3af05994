//! The CPU decoder in f32 keeps a GGUF file's quantized and 16-bit matrices as stored
//! (Q4_1 and Q8_0 as blocks, the others packed: a prompt's products expand them a row at a
//! time, one token's read the k-quant, Q4_0/Q5_0/Q5_1 and IQ4 rows as stored, in integers): the
//! memory its headers predict is what it holds, a fraction of the f32 expansion, and its
//! logits stay those of the f64 reference's dense weights, at the prompt and at each
//! decoding step.

mod common;

use common::{gguf, seed, LayerFormats, Shape, Tiny, Q4_K_M};
use quench_cpu::{held_bytes, Decoder, Logits};
use quench_models::arch::{ModelConfig, Naming};
use quench_models::GgmlType;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// llama.cpp's Q4_K_M mix in one layer, the 16-bit and legacy types in the second, the
/// other k-quants and legacy types in the third, IQ4_XS and IQ4_NL in the fourth.
const LAYERS: [LayerFormats; 4] = [
    Q4_K_M,
    LayerFormats {
        q: GgmlType::BF16,
        k: GgmlType::F16,
        v: GgmlType::Q4_1,
        o: GgmlType::Q8_0,
        gate_up: GgmlType::Q4_0,
        down: GgmlType::F16,
    },
    LayerFormats {
        q: GgmlType::Q2_K,
        k: GgmlType::Q3_K,
        v: GgmlType::Q5_0,
        o: GgmlType::Q5_K,
        gate_up: GgmlType::Q5_1,
        down: GgmlType::Q3_K,
    },
    LayerFormats {
        q: GgmlType::IQ4_XS,
        k: GgmlType::IQ4_NL,
        v: GgmlType::IQ4_XS,
        o: GgmlType::IQ4_NL,
        gate_up: GgmlType::IQ4_XS,
        down: GgmlType::IQ4_NL,
    },
];

const SHAPE: Shape = Shape {
    hidden: 256,
    heads: 4,
    kv_heads: 2,
    head_dim: 64,
    ffn: 512,
    vocab: 320,
    context: 64,
    eps: 1e-5,
};

#[test]
fn a_mixed_gguf_is_held_as_stored_and_decodes_as_the_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let m = Tiny {
        arch: "llama",
        shape: SHAPE,
        layers: LAYERS.to_vec(),
        embedding: GgmlType::Q4_K,
        output: Some(GgmlType::Q6_K),
    };
    let file = gguf(&m, &mut rng);
    let config = ModelConfig::from_gguf(&file).unwrap();
    let fast = Decoder::<f32>::load(config.clone(), &file, Naming::Gguf).unwrap();
    let reference = Decoder::<f64>::load(config, &file, Naming::Gguf).unwrap();

    // What each tensor takes: matrices as stored (Q4_1 and Q8_0 blocks with f32 scales,
    // f32 dense), vectors in f32.
    let infos = file.tensor_infos();
    let expected: u64 = infos
        .iter()
        .map(|t| {
            let n = t.n_elements();
            match (t.dims.len(), t.ggml_type) {
                (2, GgmlType::Q4_1) => n / 32 * 24,
                (2, GgmlType::Q8_0) => n / 32 * 36,
                (2, GgmlType::F32) | (1, _) => 4 * n,
                _ => t.size,
            }
        })
        .sum();
    let predicted: u64 = infos
        .iter()
        .map(|t| held_bytes::<f32>(t.ggml_type, t.dims.len() == 2, t.n_elements(), t.size))
        .sum();
    let parameters: u64 = infos.iter().map(|t| t.n_elements()).sum();
    assert_eq!(fast.weight_bytes() as u64, expected);
    assert_eq!(predicted, expected);
    assert_eq!(reference.weight_bytes() as u64, 8 * parameters);
    assert!(
        expected * 3 < parameters * 4,
        "{expected} bytes held for {parameters} parameters"
    );

    // A prompt, then decode steps: every logit near the reference's.
    let tokens: Vec<u32> = (0..6)
        .map(|_| rng.gen_range(0..SHAPE.vocab as u32))
        .collect();
    let (mut a, mut b) = (fast.new_cache(), reference.new_cache());
    for (i, step) in [&tokens[..4], &tokens[4..5], &tokens[5..]]
        .iter()
        .enumerate()
    {
        let got = fast.forward(&mut a, step, Logits::Last).unwrap();
        let want = reference.forward(&mut b, step, Logits::Last).unwrap();
        for (g, w) in got.as_slice().iter().zip(want.as_slice()) {
            let err = (*g as f64 - w).abs();
            assert!(err <= 1e-3 + 1e-3 * w.abs(), "step {i}: {g} against {w}");
        }
    }
}
