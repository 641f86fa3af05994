//! Tiny seeded random models built in memory, in Hugging Face and GGUF layouts.
#![allow(dead_code)] // each test binary uses a different part

use quench_cpu::Matrix;
use quench_models::arch::{
    Arch, DecoderLayerTensor as L, DecoderTensor, MemorySource, ModelConfig, Naming, RopeStyle,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub fn tiny_config(arch: Arch) -> ModelConfig {
    ModelConfig {
        arch,
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: if arch == Arch::Bert { 4 } else { 2 },
        // qwen3 decouples head_dim from hidden / heads; make it differ to test that.
        head_dim: if arch == Arch::Qwen3 { 12 } else { 8 },
        ffn: 48,
        vocab: 61,
        max_positions: 40,
        norm_eps: if arch == Arch::Bert { 1e-12 } else { 1e-6 },
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_style: RopeStyle::HalfSplit,
        tied_embeddings: arch == Arch::Qwen2,
        qkv_bias: arch == Arch::Qwen2,
        qk_norm: arch == Arch::Qwen3,
        type_vocab: 2,
    }
}

pub struct Filler(ChaCha8Rng);

impl Filler {
    pub fn new(seed: u64) -> Self {
        Filler(ChaCha8Rng::seed_from_u64(seed))
    }

    /// Uniform in `[center − spread, center + spread]`.
    pub fn values(&mut self, n: usize, center: f32, spread: f32) -> Vec<f32> {
        (0..n)
            .map(|_| center + spread * self.0.gen_range(-1.0f32..=1.0))
            .collect()
    }

    pub fn tokens(&mut self, n: usize, vocab: usize) -> Vec<u32> {
        (0..n).map(|_| self.0.gen_range(0..vocab as u32)).collect()
    }
}

/// A random decoder checkpoint with Hugging Face names. Scales are chosen so that attention
/// is far from uniform and logits spread over several units, so that mistakes show.
pub fn random_decoder(c: &ModelConfig, seed: u64) -> MemorySource {
    let mut f = Filler::new(seed);
    let mut src = MemorySource::new();
    let hf = |t: DecoderTensor| t.name(Naming::HuggingFace).unwrap();
    let put = |src: &mut MemorySource, name: String, dims: Vec<usize>, v: Vec<f32>| {
        src.insert(&name, dims, v).unwrap();
    };
    let (d, hd) = (c.hidden, c.head_dim);
    let (qw, kvw) = (c.heads * hd, c.kv_heads * hd);
    let lin = |f: &mut Filler, rows: usize, cols: usize, gain: f32| {
        f.values(rows * cols, 0.0, gain * (3.0 / cols as f32).sqrt())
    };
    let v = lin(&mut f, c.vocab, d, 1.0);
    put(
        &mut src,
        hf(DecoderTensor::TokenEmbedding),
        vec![c.vocab, d],
        v,
    );
    if !c.tied_embeddings {
        let v = lin(&mut f, c.vocab, d, 3.0);
        put(&mut src, hf(DecoderTensor::Output), vec![c.vocab, d], v);
    }
    let v = f.values(d, 1.0, 0.2);
    put(&mut src, hf(DecoderTensor::OutputNorm), vec![d], v);
    for n in 0..c.layers {
        let name = |t| hf(DecoderTensor::Layer(n, t));
        let mut layer = vec![
            (L::AttnNorm, vec![d], f.values(d, 1.0, 0.2)),
            (L::Q, vec![qw, d], lin(&mut f, qw, d, 2.5)),
            (L::K, vec![kvw, d], lin(&mut f, kvw, d, 2.5)),
            (L::V, vec![kvw, d], lin(&mut f, kvw, d, 1.0)),
            (L::AttnOutput, vec![d, qw], lin(&mut f, d, qw, 1.0)),
            (L::FfnNorm, vec![d], f.values(d, 1.0, 0.2)),
            (L::Gate, vec![c.ffn, d], lin(&mut f, c.ffn, d, 1.5)),
            (L::Up, vec![c.ffn, d], lin(&mut f, c.ffn, d, 1.0)),
            (L::Down, vec![d, c.ffn], lin(&mut f, d, c.ffn, 1.0)),
        ];
        if c.qkv_bias {
            layer.push((L::QBias, vec![qw], f.values(qw, 0.0, 0.5)));
            layer.push((L::KBias, vec![kvw], f.values(kvw, 0.0, 0.5)));
            layer.push((L::VBias, vec![kvw], f.values(kvw, 0.0, 0.5)));
        }
        if c.qk_norm {
            layer.push((L::QNorm, vec![hd], f.values(hd, 1.5, 0.3)));
            layer.push((L::KNorm, vec![hd], f.values(hd, 1.5, 0.3)));
        }
        for (t, dims, v) in layer {
            put(&mut src, name(t), dims, v);
        }
    }
    src
}

/// The same checkpoint as llama.cpp's converter would write it: GGUF names and, for llama,
/// the rows of q and k permuted within each head so that adjacent-pair RoPE gives the
/// result of half-split RoPE. (Shapes stay outermost first, as a GGUF adapter reports them.)
pub fn to_gguf_layout(hf: &MemorySource, c: &ModelConfig, permute: bool) -> MemorySource {
    let mut out = MemorySource::new();
    let mut tensors = vec![
        DecoderTensor::TokenEmbedding,
        DecoderTensor::Output,
        DecoderTensor::OutputNorm,
    ];
    let layer_tensors = [
        L::AttnNorm,
        L::Q,
        L::K,
        L::V,
        L::QBias,
        L::KBias,
        L::VBias,
        L::QNorm,
        L::KNorm,
        L::AttnOutput,
        L::FfnNorm,
        L::Gate,
        L::Up,
        L::Down,
    ];
    for n in 0..c.layers {
        tensors.extend(layer_tensors.iter().map(|&t| DecoderTensor::Layer(n, t)));
    }
    for t in tensors {
        let hf_name = t.name(Naming::HuggingFace).unwrap();
        if !quench_models::arch::TensorSource::contains(hf, &hf_name) {
            continue;
        }
        let (dims, mut data) = quench_models::arch::TensorSource::get(hf, &hf_name).unwrap();
        let heads = match t {
            DecoderTensor::Layer(_, L::Q | L::QBias) => Some(c.heads),
            DecoderTensor::Layer(_, L::K | L::KBias) => Some(c.kv_heads),
            _ => None,
        };
        if let (Some(heads), true) = (heads, permute) {
            let cols = if dims.len() == 2 { dims[1] } else { 1 };
            data = permute_rows(&data, heads, c.head_dim, cols);
        }
        out.insert(&t.name(Naming::Gguf).unwrap(), dims, data)
            .unwrap();
    }
    out
}

/// Within each head, row `half·(d/2) + j` moves to row `2j + half`.
fn permute_rows(data: &[f32], heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; data.len()];
    for h in 0..heads {
        for half in 0..2 {
            for j in 0..hd / 2 {
                let from = h * hd + half * hd / 2 + j;
                let to = h * hd + 2 * j + half;
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&data[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

/// A random BERT checkpoint with Hugging Face names.
pub fn random_bert(c: &ModelConfig, seed: u64, prefix: &str) -> MemorySource {
    use quench_models::arch::{BertLayerTensor as B, BertTensor};
    let mut f = Filler::new(seed);
    let mut src = MemorySource::new();
    let d = c.hidden;
    let lin = |f: &mut Filler, rows: usize, cols: usize, gain: f32| {
        f.values(rows * cols, 0.0, gain * (3.0 / cols as f32).sqrt())
    };
    let mut tensors = vec![
        (
            BertTensor::WordEmbedding,
            vec![c.vocab, d],
            f.values(c.vocab * d, 0.0, 1.0),
        ),
        (
            BertTensor::PositionEmbedding,
            vec![c.max_positions, d],
            f.values(c.max_positions * d, 0.0, 0.5),
        ),
        (
            BertTensor::TypeEmbedding,
            vec![c.type_vocab, d],
            f.values(c.type_vocab * d, 0.0, 0.5),
        ),
        (
            BertTensor::EmbeddingNormWeight,
            vec![d],
            f.values(d, 1.0, 0.2),
        ),
        (
            BertTensor::EmbeddingNormBias,
            vec![d],
            f.values(d, 0.0, 0.2),
        ),
    ];
    for n in 0..c.layers {
        let t = |t| BertTensor::Layer(n, t);
        tensors.extend([
            (t(B::Q), vec![d, d], lin(&mut f, d, d, 2.5)),
            (t(B::QBias), vec![d], f.values(d, 0.0, 0.3)),
            (t(B::K), vec![d, d], lin(&mut f, d, d, 2.5)),
            (t(B::KBias), vec![d], f.values(d, 0.0, 0.3)),
            (t(B::V), vec![d, d], lin(&mut f, d, d, 1.0)),
            (t(B::VBias), vec![d], f.values(d, 0.0, 0.3)),
            (t(B::AttnOutput), vec![d, d], lin(&mut f, d, d, 1.0)),
            (t(B::AttnOutputBias), vec![d], f.values(d, 0.0, 0.3)),
            (t(B::AttnNormWeight), vec![d], f.values(d, 1.0, 0.2)),
            (t(B::AttnNormBias), vec![d], f.values(d, 0.0, 0.2)),
            (t(B::Up), vec![c.ffn, d], lin(&mut f, c.ffn, d, 1.5)),
            (t(B::UpBias), vec![c.ffn], f.values(c.ffn, 0.0, 0.3)),
            (t(B::Down), vec![d, c.ffn], lin(&mut f, d, c.ffn, 1.0)),
            (t(B::DownBias), vec![d], f.values(d, 0.0, 0.3)),
            (t(B::OutputNormWeight), vec![d], f.values(d, 1.0, 0.2)),
            (t(B::OutputNormBias), vec![d], f.values(d, 0.0, 0.2)),
        ]);
    }
    for (t, dims, v) in tensors {
        src.insert(&t.name(Naming::HuggingFace, prefix), dims, v)
            .unwrap();
    }
    src
}

/// The FP64 check of DESIGN.md: every logit within `0.05 + 0.003·|ref|` of the reference.
/// Returns how many logits break the bound and the largest excess.
pub fn logit_violations(reference: &Matrix<f64>, got: &Matrix<f32>) -> (usize, f64) {
    assert_eq!(
        (reference.rows(), reference.cols()),
        (got.rows(), got.cols())
    );
    let mut count = 0;
    let mut worst = 0.0f64;
    for (r, g) in reference.as_slice().iter().zip(got.as_slice()) {
        let err = (*g as f64 - r).abs();
        let bound = 0.05 + 0.003 * r.abs();
        // A NaN error must count as a violation.
        if err.is_nan() || err > bound {
            count += 1;
            worst = worst.max(err - bound);
        }
    }
    (count, worst)
}

/// Largest `|a − b| / (1 + |a|)` over all elements.
pub fn max_rel_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (x - y).abs() / (1.0 + x.abs());
            if d.is_nan() {
                f64::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f64::max)
}

/// The index of the largest logit (the first of equal ones), as greedy decoding picks.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}
