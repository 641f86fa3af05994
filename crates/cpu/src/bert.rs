//! BERT encoders and sentence embeddings.

use crate::attention::{attention, AttentionShape};
use crate::error::{CpuError, Result};
use crate::load;
use crate::math::{gelu, layer_norm};
use crate::matrix::{linear, Matrix};
use crate::real::Real;
use quench_models::arch::ArchError;
use quench_models::arch::TensorSource;
use quench_models::arch::{Arch, ModelConfig};
use quench_models::arch::{BertLayerTensor as L, BertTensor, Naming};

/// A BERT encoder with its weights in memory as `T`.
pub struct Encoder<T> {
    config: ModelConfig,
    word_embedding: Matrix<T>,
    position_embedding: Matrix<T>,
    type_embedding: Matrix<T>,
    embedding_norm: Norm<T>,
    layers: Vec<Layer<T>>,
}

struct Norm<T> {
    weight: Vec<T>,
    bias: Vec<T>,
}

struct Dense<T> {
    weight: Matrix<T>,
    bias: Vec<T>,
}

struct Layer<T> {
    q: Dense<T>,
    k: Dense<T>,
    v: Dense<T>,
    attn_output: Dense<T>,
    attn_norm: Norm<T>,
    up: Dense<T>,
    down: Dense<T>,
    output_norm: Norm<T>,
}

impl<T: Real> Encoder<T> {
    /// Reads every weight, checking each shape. Hugging Face checkpoints whose names start
    /// with `bert.` (saved from a task model) are read as well.
    pub fn load(config: ModelConfig, src: &dyn TensorSource, naming: Naming) -> Result<Self> {
        if config.arch != Arch::Bert {
            return Err(CpuError::from(ArchError::UnsupportedArch {
                arch: config.arch.name().into(),
                what: "the BERT encoder",
            }));
        }
        config.validate()?;
        let c = &config;
        let prefix = match naming {
            Naming::HuggingFace
                if !src.contains(&BertTensor::WordEmbedding.name(naming, ""))
                    && src.contains(&BertTensor::WordEmbedding.name(naming, "bert.")) =>
            {
                "bert."
            }
            _ => "",
        };
        let name = |t: BertTensor| t.name(naming, prefix);
        let dim = c.hidden;
        let norm = |w, b| -> Result<Norm<T>> {
            Ok(Norm {
                weight: load::vector(src, &name(w), dim)?,
                bias: load::vector(src, &name(b), dim)?,
            })
        };
        let dense = |w, b, rows, cols| -> Result<Dense<T>> {
            Ok(Dense {
                weight: load::matrix(src, &name(w), rows, cols)?,
                bias: load::vector(src, &name(b), rows)?,
            })
        };
        let mut layers = Vec::with_capacity(c.layers);
        for n in 0..c.layers {
            let t = |t| BertTensor::Layer(n, t);
            layers.push(Layer {
                q: dense(t(L::Q), t(L::QBias), dim, dim)?,
                k: dense(t(L::K), t(L::KBias), dim, dim)?,
                v: dense(t(L::V), t(L::VBias), dim, dim)?,
                attn_output: dense(t(L::AttnOutput), t(L::AttnOutputBias), dim, dim)?,
                attn_norm: norm(t(L::AttnNormWeight), t(L::AttnNormBias))?,
                up: dense(t(L::Up), t(L::UpBias), c.ffn, dim)?,
                down: dense(t(L::Down), t(L::DownBias), dim, c.ffn)?,
                output_norm: norm(t(L::OutputNormWeight), t(L::OutputNormBias))?,
            });
        }
        Ok(Encoder {
            word_embedding: load::matrix(src, &name(BertTensor::WordEmbedding), c.vocab, dim)?,
            position_embedding: load::matrix(
                src,
                &name(BertTensor::PositionEmbedding),
                c.max_positions,
                dim,
            )?,
            type_embedding: load::matrix(src, &name(BertTensor::TypeEmbedding), c.type_vocab, dim)?,
            embedding_norm: norm(
                BertTensor::EmbeddingNormWeight,
                BertTensor::EmbeddingNormBias,
            )?,
            layers,
            config,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The last layer's hidden states, `[tokens, hidden]`, for one unpadded sequence.
    /// `token_types` defaults to all zeros.
    pub fn hidden_states(&self, tokens: &[u32], token_types: Option<&[u32]>) -> Result<Matrix<T>> {
        let c = &self.config;
        if tokens.is_empty() {
            return Err(CpuError::NoTokens);
        }
        if tokens.len() > c.max_positions {
            return Err(CpuError::ContextOverflow {
                limit: c.max_positions,
                used: 0,
                added: tokens.len(),
            });
        }
        if let Some(types) = token_types {
            if types.len() != tokens.len() {
                return Err(CpuError::TokenTypeCount {
                    given: types.len(),
                    tokens: tokens.len(),
                });
            }
        }
        let mut x = Matrix::zeros(tokens.len(), c.hidden);
        for (t, &token) in tokens.iter().enumerate() {
            let word = usize::try_from(token).ok().filter(|&r| r < c.vocab).ok_or(
                CpuError::TokenOutOfRange {
                    token,
                    vocab: c.vocab,
                },
            )?;
            let token_type = token_types.map_or(0, |types| types[t]);
            let ty = usize::try_from(token_type)
                .ok()
                .filter(|&r| r < c.type_vocab)
                .ok_or(CpuError::TokenTypeOutOfRange {
                    token_type,
                    types: c.type_vocab,
                })?;
            let row = x.row_mut(t);
            let sources = [
                self.word_embedding.row(word),
                self.position_embedding.row(t),
                self.type_embedding.row(ty),
            ];
            for (i, v) in row.iter_mut().enumerate() {
                *v = sources[0][i] + sources[1][i] + sources[2][i];
            }
            layer_norm(
                row,
                &self.embedding_norm.weight,
                &self.embedding_norm.bias,
                c.norm_eps,
            );
        }
        for layer in &self.layers {
            self.layer(layer, &mut x);
        }
        Ok(x)
    }

    /// The sentence embedding: hidden states averaged over tokens, scaled to unit length
    /// (sentence-transformers' mean pooling followed by its Normalize module).
    pub fn embed(&self, tokens: &[u32], token_types: Option<&[u32]>) -> Result<Vec<T>> {
        let h = self.hidden_states(tokens, token_types)?;
        let mut pooled = vec![T::ZERO; self.config.hidden];
        for t in 0..h.rows() {
            for (p, v) in pooled.iter_mut().zip(h.row(t)) {
                *p += *v;
            }
        }
        let count = T::from_f64(h.rows() as f64);
        let mut norm_sq = T::ZERO;
        for p in pooled.iter_mut() {
            *p = *p / count;
            norm_sq += *p * *p;
        }
        // As torch.nn.functional.normalize: the norm is clamped below at 1e-12.
        let norm = norm_sq.sqrt().max(T::from_f64(1e-12));
        Ok(pooled.into_iter().map(|p| p / norm).collect())
    }

    /// Post-LayerNorm block: `x = LN(x + attn(x))`, then `x = LN(x + down(gelu(up(x))))`.
    fn layer(&self, layer: &Layer<T>, x: &mut Matrix<T>) {
        let c = &self.config;
        let dense = |d: &Dense<T>, input: &Matrix<T>| linear(input, &d.weight, Some(&d.bias));
        let shape = AttentionShape {
            heads: c.heads,
            kv_heads: c.heads,
            head_dim: c.head_dim,
            causal_start: None,
        };
        let (q, k, v) = (dense(&layer.q, x), dense(&layer.k, x), dense(&layer.v, x));
        let attn = attention(&q, k.as_slice(), v.as_slice(), x.rows(), &shape);
        let out = dense(&layer.attn_output, &attn);
        add_and_norm(x, &out, &layer.attn_norm, c.norm_eps);

        let mut up = dense(&layer.up, x);
        for u in up.as_mut_slice() {
            *u = gelu(*u);
        }
        let out = dense(&layer.down, &up);
        add_and_norm(x, &out, &layer.output_norm, c.norm_eps);
    }
}

fn add_and_norm<T: Real>(x: &mut Matrix<T>, residual: &Matrix<T>, norm: &Norm<T>, eps: f64) {
    for t in 0..x.rows() {
        let row = x.row_mut(t);
        for (a, b) in row.iter_mut().zip(residual.row(t)) {
            *a += *b;
        }
        layer_norm(row, &norm.weight, &norm.bias, eps);
    }
}
