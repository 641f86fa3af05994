//! What a model is, independent of where it was read from and of what runs it.

use super::error::{ArchError, Result};

/// The architectures this crate runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3 and relatives (SmolLM2, TinyLlama): RMSNorm, RoPE, GQA, SwiGLU.
    Llama,
    /// As Llama, with biases on the q, k and v projections.
    Qwen2,
    /// As Llama, with an RMSNorm over each head of q and k before RoPE.
    Qwen3,
    /// BERT encoders (sentence embedders such as all-MiniLM-L6-v2).
    Bert,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Bert => "bert",
        }
    }

    pub fn is_decoder(self) -> bool {
        !matches!(self, Arch::Bert)
    }
}

/// Which elements RoPE rotates together within a head of size `d`.
///
/// Both are the same rotation of the same frequencies; they differ in where the pairs sit.
/// Hugging Face checkpoints use [`RopeStyle::HalfSplit`]. llama.cpp's converter permutes the
/// rows of a llama model's q and k projections so that [`RopeStyle::Adjacent`] gives the same
/// result on GGUF files; it leaves qwen2/qwen3 unpermuted (HalfSplit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(i, i + d/2)` ("rotate half", llama.cpp's NEOX rope type).
    HalfSplit,
    /// Pairs `(2i, 2i + 1)` (llama.cpp's NORM rope type).
    Adjacent,
}

/// Llama 3's frequency-dependent RoPE scaling (`rope_type: "llama3"`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_positions: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    /// Width of the residual stream (`hidden_size`, `embedding_length`).
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Width of the feed-forward layer (`intermediate_size`, `feed_forward_length`).
    pub ffn: usize,
    pub vocab: usize,
    /// Longest sequence the model was trained for; also the default KV cache limit.
    pub max_positions: usize,
    /// Epsilon of the RMSNorm (decoders) or LayerNorm (BERT).
    pub norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Scaling>,
    pub rope_style: RopeStyle,
    /// The output projection is the token embedding.
    pub tied_embeddings: bool,
    /// q, k and v projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (qwen3).
    pub qk_norm: bool,
    /// Token type (segment) vocabulary, BERT only.
    pub type_vocab: usize,
}

impl ModelConfig {
    /// Checks that the numbers describe a model this crate can run.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("hidden", self.hidden),
            ("layers", self.layers),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("ffn", self.ffn),
            ("vocab", self.vocab),
            ("max_positions", self.max_positions),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(ArchError::Config {
                    field,
                    reason: "is 0".into(),
                });
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ArchError::Config {
                field: "kv_heads",
                reason: format!("{} does not divide heads = {}", self.kv_heads, self.heads),
            });
        }
        if self.vocab > u32::MAX as usize {
            return Err(ArchError::Config {
                field: "vocab",
                reason: format!("{} does not fit token ids of 32 bits", self.vocab),
            });
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return Err(ArchError::Config {
                field: "norm_eps",
                reason: format!("{} is not a non-negative number", self.norm_eps),
            });
        }
        if self.arch == Arch::Bert {
            // Both numbers come from the file: their product may not fit.
            if self.heads.checked_mul(self.head_dim) != Some(self.hidden) {
                return Err(ArchError::Config {
                    field: "head_dim",
                    reason: format!(
                        "{} × {} heads differs from hidden = {}",
                        self.head_dim, self.heads, self.hidden
                    ),
                });
            }
            if self.type_vocab == 0 {
                return Err(ArchError::Config {
                    field: "type_vocab",
                    reason: "is 0".into(),
                });
            }
        } else {
            if !self.head_dim.is_multiple_of(2) {
                return Err(ArchError::Config {
                    field: "head_dim",
                    reason: format!("{} is odd; RoPE rotates pairs", self.head_dim),
                });
            }
            if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
                return Err(ArchError::Config {
                    field: "rope_theta",
                    reason: format!("{} is not a number above 1", self.rope_theta),
                });
            }
            if let Some(s) = &self.rope_scaling {
                let ok = s.factor > 0.0
                    && s.low_freq_factor > 0.0
                    && s.high_freq_factor > s.low_freq_factor
                    && s.original_max_positions > 0;
                if !ok {
                    return Err(ArchError::Config {
                        field: "rope_scaling",
                        reason: format!(
                            "{s:?} needs factor > 0, 0 < low_freq_factor < high_freq_factor \
                             and original_max_positions > 0"
                        ),
                    });
                }
            }
        }
        self.check_sizes()
    }

    /// Every size a backend forms from these numbers must fit in a `usize`: the widths of
    /// the projections, the element counts of the largest weights and of a full KV cache.
    /// The numbers come from a file, so their products may not (and a product that wraps
    /// could pass a shape check it should fail).
    fn check_sizes(&self) -> Result<()> {
        let product = |field: &'static str, factors: &[(&str, usize)]| -> Result<usize> {
            factors
                .iter()
                .try_fold(1usize, |acc, &(_, n)| acc.checked_mul(n))
                .ok_or_else(|| ArchError::Config {
                    field,
                    reason: format!(
                        "{} overflows",
                        factors
                            .iter()
                            .map(|(name, n)| format!("{name} {n}"))
                            .collect::<Vec<_>>()
                            .join(" × ")
                    ),
                })
        };
        let q_width = product(
            "head_dim",
            &[("heads", self.heads), ("head_dim", self.head_dim)],
        )?;
        let kv_width = product(
            "head_dim",
            &[("kv_heads", self.kv_heads), ("head_dim", self.head_dim)],
        )?;
        product("vocab", &[("vocab", self.vocab), ("hidden", self.hidden)])?;
        product("ffn", &[("ffn", self.ffn), ("hidden", self.hidden)])?;
        product(
            "hidden",
            &[("heads × head_dim", q_width), ("hidden", self.hidden)],
        )?;
        product(
            "max_positions",
            &[
                ("layers", self.layers),
                ("kv_heads × head_dim", kv_width),
                ("max_positions", self.max_positions),
            ],
        )?;
        Ok(())
    }
}
