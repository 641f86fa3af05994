//! The decoder-only transformers: llama, qwen2 and qwen3.

use crate::arithmetic::Arithmetic;
use crate::attention::{attention, AttentionShape};
use crate::error::{CpuError, Result};
use crate::f16_attention::attention_f16;
use crate::ggml_math;
use crate::kv_cache::{KvCache, LayerCache};
use crate::load;
use crate::math::{rms_norm, silu};
use crate::matrix::Matrix;
use crate::q8::round_f16;
use crate::real::Real;
use crate::rope::RopeTable;
use crate::weight::Weight;
use quench_models::arch::rope_frequencies;
use quench_models::arch::ArchError;
use quench_models::arch::ModelConfig;
use quench_models::arch::TensorSource;
use quench_models::arch::{DecoderLayerTensor as L, DecoderTensor, Naming};

/// Which positions [`Decoder::forward`] returns logits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token fed (what decoding needs).
    Last,
    /// Every token fed (what teacher-forced checking needs).
    All,
}

/// A decoder model with its weights in memory as `T`.
pub struct Decoder<T> {
    config: ModelConfig,
    token_embedding: Weight<T>,
    layers: Vec<Layer<T>>,
    output_norm: Vec<T>,
    /// `None` when tied to the token embedding.
    output: Option<Weight<T>>,
    rope_freqs: Vec<f64>,
    /// A GGUF `rope_freqs.weight` (already applied to `rope_freqs`); ggml's angles divide by
    /// them.
    rope_factors: Option<Vec<f32>>,
    arithmetic: Arithmetic,
}

/// One transformer block's weights.
pub(crate) struct Layer<T> {
    attn_norm: Vec<T>,
    q: Weight<T>,
    k: Weight<T>,
    v: Weight<T>,
    qkv_bias: Option<[Vec<T>; 3]>,
    qk_norm: Option<[Vec<T>; 2]>,
    attn_output: Weight<T>,
    ffn_norm: Vec<T>,
    gate: Weight<T>,
    up: Weight<T>,
    down: Weight<T>,
}

pub(crate) fn name(t: DecoderTensor, naming: Naming) -> String {
    t.name(naming)
        .expect("every decoder tensor but RopeFreqs has a name in both namings")
}

impl<T: Real> Decoder<T> {
    /// Reads every weight the config calls for, checking each shape.
    ///
    /// The output projection is read when present and `config.tied_embeddings` is false;
    /// otherwise the token embedding serves as output. A GGUF `rope_freqs.weight` (Llama 3
    /// scaling, precomputed) is applied when present.
    pub fn load(config: ModelConfig, src: &dyn TensorSource, naming: Naming) -> Result<Self> {
        Self::load_as(config, src, naming, Arithmetic::F32)
    }

    fn load_as(
        config: ModelConfig,
        src: &dyn TensorSource,
        naming: Naming,
        arithmetic: Arithmetic,
    ) -> Result<Self> {
        check_decoder_config(&config)?;
        let c = &config;
        let check = |t: DecoderTensor| load::check_arithmetic(src, &name(t, naming), arithmetic);
        check(if c.tied_embeddings {
            DecoderTensor::TokenEmbedding
        } else {
            DecoderTensor::Output
        })?;
        for n in 0..c.layers {
            for t in [L::Q, L::K, L::V, L::AttnOutput, L::Gate, L::Up, L::Down] {
                check(DecoderTensor::Layer(n, t))?;
            }
        }
        let dim = c.hidden;
        let token_embedding = load::weight(
            src,
            &name(DecoderTensor::TokenEmbedding, naming),
            c.vocab,
            dim,
        )?;
        let output_name = name(DecoderTensor::Output, naming);
        let output = if c.tied_embeddings {
            None
        } else {
            Some(load::weight(src, &output_name, c.vocab, dim)?)
        };
        let rope_factors = rope_factors(c, src, naming)?;
        let rope_freqs = rope_frequencies(c, rope_factors.as_deref());
        let layers = (0..c.layers)
            .map(|n| Layer::load(c, src, naming, n))
            .collect::<Result<Vec<_>>>()?;
        let output_norm = load::vector(src, &name(DecoderTensor::OutputNorm, naming), dim)?;
        Ok(Decoder {
            config,
            token_embedding,
            layers,
            output_norm,
            output,
            rope_freqs,
            rope_factors: rope_factors.map(|f| f.into_iter().map(|v| v as f32).collect()),
            arithmetic,
        })
    }

    /// Bytes of the weights this decoder holds, each in the form it is kept in (what
    /// loading it costs in memory, the KV cache apart).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self.layers.iter().map(Layer::held_bytes).sum();
        let vectors = self.output_norm.len() * std::mem::size_of::<T>()
            + self.rope_factors.as_ref().map_or(0, |f| f.len() * 4);
        self.token_embedding.held_bytes()
            + self.output.as_ref().map_or(0, Weight::held_bytes)
            + layers
            + vectors
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn arithmetic(&self) -> Arithmetic {
        self.arithmetic
    }

    /// An empty cache that accepts up to the model's `max_positions` positions.
    pub fn new_cache(&self) -> KvCache<T> {
        self.new_cache_with_limit(self.config.max_positions)
    }

    /// An empty cache that accepts up to `limit` positions (capped at `max_positions`).
    pub fn new_cache_with_limit(&self, limit: usize) -> KvCache<T> {
        let c = &self.config;
        KvCache::new(
            c.layers,
            c.kv_heads * c.head_dim,
            limit.min(c.max_positions),
        )
    }

    /// Feeds `tokens` at the positions after those already in `cache`, appends their keys and
    /// values to it, and returns `[rows, vocab]` logits (one row, or one per token).
    ///
    /// On error the cache is left as it was.
    pub fn forward(
        &self,
        cache: &mut KvCache<T>,
        tokens: &[u32],
        logits: Logits,
    ) -> Result<Matrix<T>> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(CpuError::NoTokens);
        }
        let start = cache.len();
        if start + tokens.len() > cache.limit() {
            return Err(CpuError::ContextOverflow {
                limit: cache.limit(),
                used: start,
                added: tokens.len(),
            });
        }
        if !cache.fits(c.layers, c.kv_heads * c.head_dim) {
            return Err(CpuError::from(ArchError::Config {
                field: "cache",
                reason: "was made for another model; use Decoder::new_cache".into(),
            }));
        }
        let mut x = Matrix::zeros(tokens.len(), c.hidden);
        for (t, &token) in tokens.iter().enumerate() {
            let row = token_row(token, c.vocab)?;
            self.token_embedding.row_into(row, x.row_mut(t));
        }

        let rope = match self.arithmetic {
            Arithmetic::F32 => RopeTable::<T>::new(&self.rope_freqs, start, tokens.len()),
            Arithmetic::GgmlRounding(_) => RopeTable::ggml(
                c.rope_theta as f32,
                c.head_dim,
                self.rope_factors.as_deref(),
                start,
                tokens.len(),
            ),
        };
        let a = self.arithmetic;
        for (layer, layer_cache) in self.layers.iter().zip(&mut cache.layers) {
            layer.attention_block(c, &mut x, &rope, start, layer_cache, a);
            layer.ffn_block(c, &mut x, a);
        }
        cache.advance(tokens.len());

        let mut h = match logits {
            Logits::All => x,
            Logits::Last => {
                let last = x.row(tokens.len() - 1).to_vec();
                Matrix::from_vec(1, c.hidden, last).expect("one row of hidden width")
            }
        };
        for t in 0..h.rows() {
            norm(a, h.row_mut(t), &self.output_norm, c.norm_eps);
        }
        let output = self.output.as_ref().unwrap_or(&self.token_embedding);
        Ok(output.apply(&h, None, a))
    }
}

impl Decoder<f32> {
    /// [`Decoder::load`] with the given arithmetic. [`Arithmetic::GgmlRounding`] refuses
    /// weights it cannot round as llama.cpp does (see there), naming the first.
    pub fn load_with_arithmetic(
        config: ModelConfig,
        src: &dyn TensorSource,
        naming: Naming,
        arithmetic: Arithmetic,
    ) -> Result<Self> {
        Self::load_as(config, src, naming, arithmetic)
    }
}

/// RMSNorm in the rounding of `arithmetic`.
fn norm<T: Real>(arithmetic: Arithmetic, x: &mut [T], weight: &[T], eps: f64) {
    match arithmetic {
        Arithmetic::F32 => rms_norm(x, weight, eps),
        Arithmetic::GgmlRounding(_) => ggml_math::rms_norm(x, weight, eps),
    }
}

/// Checks that `config` describes a decoder this crate runs.
pub(crate) fn check_decoder_config(config: &ModelConfig) -> Result<()> {
    if !config.arch.is_decoder() {
        return Err(CpuError::from(ArchError::UnsupportedArch {
            arch: config.arch.name().into(),
            what: "the decoder",
        }));
    }
    Ok(config.validate()?)
}

/// The embedding row of `token`, refused when outside the vocabulary.
pub(crate) fn token_row(token: u32, vocab: usize) -> Result<usize> {
    usize::try_from(token)
        .ok()
        .filter(|&r| r < vocab)
        .ok_or(CpuError::TokenOutOfRange { token, vocab })
}

/// The RoPE frequencies of the model, with a GGUF `rope_freqs.weight` applied when present.
pub(crate) fn rope_freqs(
    c: &ModelConfig,
    src: &dyn TensorSource,
    naming: Naming,
) -> Result<Vec<f64>> {
    Ok(rope_frequencies(
        c,
        rope_factors(c, src, naming)?.as_deref(),
    ))
}

/// A GGUF `rope_freqs.weight` (Llama 3 scaling, precomputed), when the model has one.
fn rope_factors(
    c: &ModelConfig,
    src: &dyn TensorSource,
    naming: Naming,
) -> Result<Option<Vec<f64>>> {
    match DecoderTensor::RopeFreqs.name(naming) {
        Some(n) if src.contains(&n) => Ok(Some(load::vector::<f64>(src, &n, c.head_dim / 2)?)),
        _ => Ok(None),
    }
}

impl<T: Real> Layer<T> {
    /// Reads the weights of layer `n`, checking each shape.
    pub(crate) fn load(
        c: &ModelConfig,
        src: &dyn TensorSource,
        naming: Naming,
        n: usize,
    ) -> Result<Self> {
        let (dim, hd) = (c.hidden, c.head_dim);
        let (q_width, kv_width) = (c.heads * hd, c.kv_heads * hd);
        let ln = |t| name(DecoderTensor::Layer(n, t), naming);
        let qkv_bias = if c.qkv_bias {
            Some([
                load::vector(src, &ln(L::QBias), q_width)?,
                load::vector(src, &ln(L::KBias), kv_width)?,
                load::vector(src, &ln(L::VBias), kv_width)?,
            ])
        } else {
            None
        };
        let qk_norm = if c.qk_norm {
            Some([
                load::vector(src, &ln(L::QNorm), hd)?,
                load::vector(src, &ln(L::KNorm), hd)?,
            ])
        } else {
            None
        };
        Ok(Layer {
            attn_norm: load::vector(src, &ln(L::AttnNorm), dim)?,
            q: load::weight(src, &ln(L::Q), q_width, dim)?,
            k: load::weight(src, &ln(L::K), kv_width, dim)?,
            v: load::weight(src, &ln(L::V), kv_width, dim)?,
            qkv_bias,
            qk_norm,
            attn_output: load::weight(src, &ln(L::AttnOutput), dim, q_width)?,
            ffn_norm: load::vector(src, &ln(L::FfnNorm), dim)?,
            gate: load::weight(src, &ln(L::Gate), c.ffn, dim)?,
            up: load::weight(src, &ln(L::Up), c.ffn, dim)?,
            down: load::weight(src, &ln(L::Down), dim, c.ffn)?,
        })
    }

    /// Bytes of the weights the layer holds, each in the form it is kept in.
    pub(crate) fn held_bytes(&self) -> usize {
        let vectors: usize = [&self.attn_norm, &self.ffn_norm]
            .into_iter()
            .chain(self.qkv_bias.iter().flatten())
            .chain(self.qk_norm.iter().flatten())
            .map(Vec::len)
            .sum();
        let weights: usize = [
            &self.q,
            &self.k,
            &self.v,
            &self.attn_output,
            &self.gate,
            &self.up,
            &self.down,
        ]
        .into_iter()
        .map(Weight::held_bytes)
        .sum();
        vectors * std::mem::size_of::<T>() + weights
    }

    /// `x += o_proj(attention(rope(q), rope(k), v))` over the normed `x`, appending this
    /// run's keys and values to the layer's cache first.
    pub(crate) fn attention_block(
        &self,
        c: &ModelConfig,
        x: &mut Matrix<T>,
        rope: &RopeTable<T>,
        start: usize,
        cache: &mut LayerCache<T>,
        a: Arithmetic,
    ) {
        let hd = c.head_dim;
        let mut h = x.clone();
        for t in 0..h.rows() {
            norm(a, h.row_mut(t), &self.attn_norm, c.norm_eps);
        }
        let bias = |i: usize| self.qkv_bias.as_ref().map(|b| b[i].as_slice());
        let mut q = self.q.apply(&h, bias(0), a);
        let mut k = self.k.apply(&h, bias(1), a);
        let mut v = self.v.apply(&h, bias(2), a);
        for t in 0..h.rows() {
            for head in q.row_mut(t).chunks_mut(hd) {
                if let Some([q_norm, _]) = &self.qk_norm {
                    rms_norm(head, q_norm, c.norm_eps);
                }
                rope.rotate(head, t, c.rope_style);
            }
            for head in k.row_mut(t).chunks_mut(hd) {
                if let Some([_, k_norm]) = &self.qk_norm {
                    rms_norm(head, k_norm, c.norm_eps);
                }
                rope.rotate(head, t, c.rope_style);
            }
        }
        if matches!(a, Arithmetic::GgmlRounding(_)) {
            // llama.cpp's cache holds f16.
            for e in k.as_mut_slice().iter_mut().chain(v.as_mut_slice()) {
                *e = T::from_f32(round_f16(e.to_f32()));
            }
        }
        let LayerCache { keys, values } = cache;
        keys.extend_from_slice(k.as_slice());
        values.extend_from_slice(v.as_slice());
        let shape = AttentionShape {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: hd,
            causal_start: Some(start),
        };
        let attn = match a {
            Arithmetic::F32 => attention(&q, keys, values, start + h.rows(), &shape),
            Arithmetic::GgmlRounding(kernels) => attention_f16(&q, keys, values, &shape, kernels),
        };
        let out = self.attn_output.apply(&attn, None, a);
        for (a, b) in x.as_mut_slice().iter_mut().zip(out.as_slice()) {
            *a += *b;
        }
    }

    /// `x += down(silu(gate(h)) · up(h))` with `h` the normed `x`.
    pub(crate) fn ffn_block(&self, c: &ModelConfig, x: &mut Matrix<T>, a: Arithmetic) {
        let mut h = x.clone();
        for t in 0..h.rows() {
            norm(a, h.row_mut(t), &self.ffn_norm, c.norm_eps);
        }
        let mut gate = self.gate.apply(&h, None, a);
        let up = self.up.apply(&h, None, a);
        match a {
            Arithmetic::F32 => {
                for (g, u) in gate.as_mut_slice().iter_mut().zip(up.as_slice()) {
                    *g = silu(*g) * *u;
                }
            }
            Arithmetic::GgmlRounding(kernels) => {
                for t in 0..gate.rows() {
                    ggml_math::swiglu(gate.row_mut(t), up.row(t), kernels);
                }
            }
        }
        let out = self.down.apply(&gate, None, a);
        for (a, b) in x.as_mut_slice().iter_mut().zip(out.as_slice()) {
            *a += *b;
        }
    }
}
