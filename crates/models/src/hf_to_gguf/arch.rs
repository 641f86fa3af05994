//! The architecture's GGUF metadata (`llama.*`, `qwen2.*`, `qwen3.*` keys), read from
//! `config.json`, and Llama 3's RoPE scaling in GGUF's form (`rope_freqs.weight`).

use crate::gguf::MetadataValue;
use crate::{HfConfig, Llama3RopeScaling};

use super::error::ConvertError;

/// A decoder architecture the converter writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

impl Arch {
    /// The architecture of a `config.json`, from its `model_type`.
    pub fn of(config: &HfConfig) -> Result<Arch, ConvertError> {
        let arch = match config.model_type.as_deref() {
            Some("llama") => Arch::Llama,
            Some("qwen2") => Arch::Qwen2,
            Some("qwen3") => Arch::Qwen3,
            other => {
                return Err(ConvertError::Unsupported {
                    what: format!(
                        "model_type {} (supported: llama, qwen2, qwen3)",
                        other.unwrap_or("(missing)")
                    ),
                })
            }
        };
        if let Some(act) = config.hidden_act.as_deref().filter(|a| *a != "silu") {
            return Err(ConvertError::Unsupported {
                what: format!("hidden_act {act:?} (these architectures use silu)"),
            });
        }
        Ok(arch)
    }

    /// `general.architecture`, and the prefix of the architecture's keys.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }

    /// Whether llama.cpp stores the q and k projections with each head's rows interleaved
    /// (its "normal" RoPE, rotating adjacent pairs) rather than as Hugging Face does (NeoX
    /// RoPE, rotating each element with the one half a head away). llama.cpp's converter does
    /// this for llama only.
    pub fn interleaves_rope_rows(self) -> bool {
        self == Arch::Llama
    }

    /// transformers' default `max_position_embeddings` for the configuration class.
    fn default_context(self) -> usize {
        match self {
            Arch::Llama => 2048,
            Arch::Qwen2 | Arch::Qwen3 => 32768,
        }
    }
}

fn u32_value(field: &str, v: usize) -> Result<MetadataValue, ConvertError> {
    u32::try_from(v)
        .map(MetadataValue::U32)
        .map_err(|_| ConvertError::Unsupported {
            what: format!("{field} = {v} (GGUF stores it in 32 bits)"),
        })
}

/// The `{arch}.*` keys llama.cpp reads for these architectures.
pub fn metadata(
    arch: Arch,
    config: &HfConfig,
) -> Result<Vec<(String, MetadataValue)>, ConvertError> {
    let key = |k: &str| format!("{}.{k}", arch.gguf_name());
    let head_dim = config.head_dim();
    let context = config
        .max_position_embeddings
        .unwrap_or(arch.default_context());
    let ints = [
        ("context_length", "max_position_embeddings", context),
        ("embedding_length", "hidden_size", config.hidden_size),
        ("block_count", "num_hidden_layers", config.num_hidden_layers),
        (
            "feed_forward_length",
            "intermediate_size",
            config.intermediate_size,
        ),
        (
            "attention.head_count",
            "num_attention_heads",
            config.num_attention_heads,
        ),
        (
            "attention.head_count_kv",
            "num_key_value_heads",
            config.num_kv_heads(),
        ),
        ("attention.key_length", "head_dim", head_dim),
        ("attention.value_length", "head_dim", head_dim),
        ("rope.dimension_count", "head_dim", head_dim),
        ("vocab_size", "vocab_size", config.vocab_size),
    ];
    let mut out = Vec::new();
    for (k, field, v) in ints {
        out.push((key(k), u32_value(field, v)?));
    }
    out.push((
        key("rope.freq_base"),
        MetadataValue::F32(config.rope_theta.unwrap_or(10_000.0) as f32),
    ));
    out.push((
        key("attention.layer_norm_rms_epsilon"),
        MetadataValue::F32(config.rms_norm_eps.unwrap_or(1e-6) as f32),
    ));
    Ok(out)
}

/// Llama 3 RoPE scaling as llama.cpp stores it: one divisor per rotated pair, so that each
/// frequency `θ^(−2i/d)` divided by its factor is the scaled frequency. `None` when the
/// config asks for no scaling; scaling types other than llama3 are refused.
pub fn rope_factors(config: &HfConfig) -> Result<Option<Vec<f32>>, ConvertError> {
    let Some(s) = config.llama3_rope_scaling()? else {
        return Ok(None);
    };
    let d = config.head_dim();
    let theta = config.rope_theta.unwrap_or(10_000.0);
    Ok(Some(
        (0..d / 2)
            .map(|i| {
                let freq = theta.powf(-2.0 * i as f64 / d as f64);
                (freq / llama3_scaled(freq, &s)) as f32
            })
            .collect(),
    ))
}

/// Llama 3 keeps frequencies whose wavelength is below `original / high_freq_factor`,
/// divides those above `original / low_freq_factor` by `factor`, and blends in between.
fn llama3_scaled(freq: f64, s: &Llama3RopeScaling) -> f64 {
    let original = s.original_max_position_embeddings as f64;
    let wavelength = 2.0 * std::f64::consts::PI / freq;
    if wavelength < original / s.high_freq_factor {
        freq
    } else if wavelength > original / s.low_freq_factor {
        freq / s.factor
    } else {
        let smooth =
            (original / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}
