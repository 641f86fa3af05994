//! The shapes `synth` writes: a tiny one for tests, and the published configurations of real
//! checkpoints (their `config.json` values, token ids aside).

use serde_json::{json, Map, Value};

use crate::error::{EngineError, Result};

/// A decoder architecture `synth` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthArch {
    Llama,
    Qwen2,
    Qwen3,
}

impl SynthArch {
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Llama => "llama",
            SynthArch::Qwen2 => "qwen2",
            SynthArch::Qwen3 => "qwen3",
        }
    }

    pub fn from_name(name: &str) -> Option<SynthArch> {
        [SynthArch::Llama, SynthArch::Qwen2, SynthArch::Qwen3]
            .into_iter()
            .find(|a| a.name() == name)
    }
}

/// A model size: `tiny`, or a real model's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthShape {
    /// Two layers of width 64 and a vocabulary of 320: loads and runs in milliseconds.
    Tiny,
    Qwen25_05b,
    Llama32_1b,
    Llama31_8b,
    Qwen25_7b,
    Qwen3_8b,
}

impl SynthShape {
    pub const ALL: [SynthShape; 6] = [
        SynthShape::Tiny,
        SynthShape::Qwen25_05b,
        SynthShape::Llama32_1b,
        SynthShape::Llama31_8b,
        SynthShape::Qwen25_7b,
        SynthShape::Qwen3_8b,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SynthShape::Tiny => "tiny",
            SynthShape::Qwen25_05b => "qwen2.5-0.5b",
            SynthShape::Llama32_1b => "llama-3.2-1b",
            SynthShape::Llama31_8b => "llama-3.1-8b",
            SynthShape::Qwen25_7b => "qwen2.5-7b",
            SynthShape::Qwen3_8b => "qwen3-8b",
        }
    }

    pub fn from_name(name: &str) -> Option<SynthShape> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The architecture of a real model's shape; `None` for `tiny`, which takes any.
    pub fn arch(self) -> Option<SynthArch> {
        match self {
            SynthShape::Tiny => None,
            SynthShape::Qwen25_05b | SynthShape::Qwen25_7b => Some(SynthArch::Qwen2),
            SynthShape::Llama32_1b | SynthShape::Llama31_8b => Some(SynthArch::Llama),
            SynthShape::Qwen3_8b => Some(SynthArch::Qwen3),
        }
    }
}

/// The numbers of a decoder, as `config.json` names them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Dims {
    pub(crate) hidden: usize,
    pub(crate) ffn: usize,
    pub(crate) layers: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) vocab: usize,
    pub(crate) tied: bool,
}

/// The `config.json` of `arch` at `shape` with the given special token ids, and its dims.
pub(crate) fn config(
    arch: SynthArch,
    shape: SynthShape,
    torch_dtype: &str,
    bos: u32,
    eos: u32,
) -> Result<(Value, Dims)> {
    if let Some(required) = shape.arch() {
        if required != arch {
            return Err(EngineError::Unsupported {
                what: format!("shape {} with architecture {}", shape.name(), arch.name()),
                reason: format!("that shape is a {} model", required.name()),
            });
        }
    }
    let mut c = match (arch, shape) {
        (_, SynthShape::Tiny) => tiny(arch),
        (_, SynthShape::Qwen25_05b) => json!({
            "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2,
            "max_position_embeddings": 32768, "max_window_layers": 24,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 32768,
            "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936,
        }),
        (_, SynthShape::Qwen25_7b) => json!({
            "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4,
            "max_position_embeddings": 131072, "max_window_layers": 28,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 131072,
            "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 152064,
        }),
        (_, SynthShape::Llama32_1b) => json!({
            "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"
            },
            "tie_word_embeddings": true, "vocab_size": 128256,
        }),
        (_, SynthShape::Llama31_8b) => json!({
            "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
            "num_attention_heads": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {
                "factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"
            },
            "tie_word_embeddings": false, "vocab_size": 128256,
        }),
        (_, SynthShape::Qwen3_8b) => json!({
            "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 40960, "max_window_layers": 36,
            "rms_norm_eps": 1e-6, "rope_scaling": null, "rope_theta": 1000000.0,
            "sliding_window": null, "tie_word_embeddings": false, "use_sliding_window": false,
            "vocab_size": 151936,
        }),
    };
    let fields = c.as_object_mut().expect("a JSON object literal");
    let common = json!({
        "architectures": [match arch {
            SynthArch::Llama => "LlamaForCausalLM",
            SynthArch::Qwen2 => "Qwen2ForCausalLM",
            SynthArch::Qwen3 => "Qwen3ForCausalLM",
        }],
        "model_type": arch.name(),
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": torch_dtype,
        "use_cache": true,
    });
    for (k, v) in common.as_object().expect("a JSON object literal") {
        fields.insert(k.clone(), v.clone());
    }
    match arch {
        SynthArch::Llama => {
            fields.insert("attention_bias".into(), json!(false));
            fields.insert("mlp_bias".into(), json!(false));
            fields.insert("pretraining_tp".into(), json!(1));
        }
        SynthArch::Qwen3 => {
            fields.insert("attention_bias".into(), json!(false));
        }
        SynthArch::Qwen2 => {}
    }
    let dims = dims(fields);
    Ok((c, dims))
}

/// Small enough for tests; the vocabulary is larger than the synthetic tokenizer's, as real
/// checkpoints pad their embeddings.
fn tiny(arch: SynthArch) -> Value {
    let mut c = json!({
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "tie_word_embeddings": arch == SynthArch::Qwen2, "vocab_size": 320,
    });
    if arch == SynthArch::Qwen3 {
        c["head_dim"] = json!(16);
    }
    c
}

fn dims(c: &Map<String, Value>) -> Dims {
    let int = |k: &str| c.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
    let heads = int("num_attention_heads");
    let hidden = int("hidden_size");
    Dims {
        hidden,
        ffn: int("intermediate_size"),
        layers: int("num_hidden_layers"),
        heads,
        kv_heads: int("num_key_value_heads"),
        head_dim: c
            .get("head_dim")
            .and_then(Value::as_u64)
            .map_or(hidden / heads, |d| d as usize),
        vocab: int("vocab_size"),
        tied: c
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
    }
}
