//! A small BERT encoder with seeded random weights, built in memory: for embedding without a
//! checkpoint (a demo server, tests of the encoder paths).

use quench_models::arch::{
    Arch, BertLayerTensor as BL, BertTensor, MemorySource, ModelConfig, Naming, RopeStyle,
};
use rand::Rng;

use crate::error::Result;

/// The sizes of a small BERT encoder: LayerNorm epsilon 1e-12, two token types, and as many
/// key/value heads as query heads, each `hidden / heads` wide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TinyBert {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub max_positions: usize,
}

impl TinyBert {
    pub fn config(&self) -> ModelConfig {
        ModelConfig {
            arch: Arch::Bert,
            hidden: self.hidden,
            layers: self.layers,
            heads: self.heads,
            kv_heads: self.heads,
            head_dim: self.hidden / self.heads.max(1),
            ffn: self.ffn,
            vocab: self.vocab,
            max_positions: self.max_positions,
            norm_eps: 1e-12,
            rope_theta: 10_000.0,
            rope_scaling: None,
            rope_style: RopeStyle::HalfSplit,
            tied_embeddings: false,
            qkv_bias: false,
            qk_norm: false,
            type_vocab: 2,
        }
    }

    /// Weights drawn from `rng` at transformers' scale, under Hugging Face's names: linear
    /// layers uniform with variance 1/cols, embeddings uniform within ±1 (words) and ±0.3
    /// (positions, token types), biases and norm shifts within ±0.1, norm scales 1 ± 0.1.
    pub fn weights<R: Rng + ?Sized>(&self, rng: &mut R) -> Result<MemorySource> {
        let c = self.config();
        let mut src = MemorySource::new();
        let hf = |t: BertTensor| t.name(Naming::HuggingFace, "");
        let mut put = |name: String, dims: Vec<usize>, center: f32, spread: f32| {
            let n: usize = dims.iter().product();
            let data = (0..n)
                .map(|_| center + spread * rng.gen_range(-1.0f32..=1.0))
                .collect();
            src.insert(&name, dims, data)
        };
        let (d, ffn) = (c.hidden, c.ffn);
        put(hf(BertTensor::WordEmbedding), vec![c.vocab, d], 0.0, 1.0)?;
        put(
            hf(BertTensor::PositionEmbedding),
            vec![c.max_positions, d],
            0.0,
            0.3,
        )?;
        put(
            hf(BertTensor::TypeEmbedding),
            vec![c.type_vocab, d],
            0.0,
            0.3,
        )?;
        put(hf(BertTensor::EmbeddingNormWeight), vec![d], 1.0, 0.1)?;
        put(hf(BertTensor::EmbeddingNormBias), vec![d], 0.0, 0.1)?;
        // Uniform within ±sqrt(3/cols): variance 1/cols.
        let w = |cols: usize| (3.0 / cols as f32).sqrt();
        for n in 0..c.layers {
            let t = |t| hf(BertTensor::Layer(n, t));
            for (weight, bias, rows, cols) in [
                (BL::Q, BL::QBias, d, d),
                (BL::K, BL::KBias, d, d),
                (BL::V, BL::VBias, d, d),
                (BL::AttnOutput, BL::AttnOutputBias, d, d),
                (BL::Up, BL::UpBias, ffn, d),
                (BL::Down, BL::DownBias, d, ffn),
            ] {
                put(t(weight), vec![rows, cols], 0.0, w(cols))?;
                put(t(bias), vec![rows], 0.0, 0.1)?;
            }
            for (weight, bias) in [
                (BL::AttnNormWeight, BL::AttnNormBias),
                (BL::OutputNormWeight, BL::OutputNormBias),
            ] {
                put(t(weight), vec![d], 1.0, 0.1)?;
                put(t(bias), vec![d], 0.0, 0.1)?;
            }
        }
        Ok(src)
    }
}
