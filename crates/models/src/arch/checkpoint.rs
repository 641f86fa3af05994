//! Model configs read from GGUF metadata and Hugging Face `config.json`; GGUF files and
//! Hugging Face checkpoints as tensor sources.

use crate::{GgufFile, HfCheckpoint, HfConfig, ModelError, SharedBytes};

use super::config::{Arch, Llama3Scaling, ModelConfig, RopeStyle};
use super::error::{ArchError, Result};
use super::names::{DecoderLayerTensor, DecoderTensor, Naming};
use super::source::{RawTensor, TensorSource};

fn tensor_error(name: &str, e: ModelError) -> ArchError {
    match e.kind() {
        ModelError::MissingTensor { .. } => ArchError::MissingTensor {
            name: name.to_owned(),
        },
        _ => ArchError::Tensor {
            name: name.to_owned(),
            source: Box::new(e),
        },
    }
}

impl TensorSource for GgufFile {
    /// Dequantizes the tensor; its ggml dimensions (innermost first) are reversed.
    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let view = self.tensor(name).map_err(|e| tensor_error(name, e))?;
        let dims = view.dims.iter().rev().map(|&d| d as usize).collect();
        let data = view.to_f32().map_err(|e| tensor_error(name, e))?;
        Ok((dims, data))
    }

    fn contains(&self, name: &str) -> bool {
        self.tensor_infos().iter().any(|t| t.name == name)
    }

    fn raw(&self, name: &str) -> Result<Option<RawTensor<'_>>> {
        let view = self.tensor(name).map_err(|e| tensor_error(name, e))?;
        Ok(Some(RawTensor {
            ggml_type: view.ggml_type,
            dims: view.dims.iter().rev().map(|&d| d as usize).collect(),
            bytes: view.bytes,
        }))
    }

    fn shared(&self, name: &str) -> Result<Option<SharedBytes>> {
        let bytes = self.shared_bytes(name).map_err(|e| tensor_error(name, e))?;
        Ok(Some(bytes))
    }

    fn release(&self, name: &str) {
        GgufFile::release(self, name);
    }
}

impl TensorSource for HfCheckpoint {
    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let view = self.tensor(name).map_err(|e| tensor_error(name, e))?;
        let dims = view.shape.iter().map(|&d| d as usize).collect();
        Ok((dims, view.to_f32()))
    }

    fn contains(&self, name: &str) -> bool {
        self.info(name).is_some()
    }
}

impl ModelConfig {
    /// The model described by a Hugging Face `config.json`, in Hugging Face layout
    /// ([`RopeStyle::HalfSplit`]). Defaults for absent fields are those of transformers.
    pub fn from_hf_config(hf: &HfConfig) -> Result<ModelConfig> {
        let model_type = hf.model_type.as_deref().unwrap_or("(none)");
        let arch = match model_type {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "bert" => Arch::Bert,
            other => {
                return Err(ArchError::UnsupportedArch {
                    arch: format!("model_type {other}"),
                    what: "quench's CPU forward",
                })
            }
        };
        let act = hf.hidden_act.as_deref();
        let expected_act = if arch == Arch::Bert { "gelu" } else { "silu" };
        if act.is_some_and(|a| a != expected_act) {
            return Err(ArchError::Config {
                field: "hidden_act",
                reason: format!(
                    "{:?} is not supported (only {expected_act:?})",
                    act.unwrap_or("")
                ),
            });
        }
        if arch == Arch::Llama && hf.attention_bias == Some(true) {
            return Err(ArchError::Config {
                field: "attention_bias",
                reason: "true (biases on llama attention projections) is not supported".into(),
            });
        }
        let rope_scaling = hf.llama3_rope_scaling()?.map(|s| Llama3Scaling {
            factor: s.factor,
            low_freq_factor: s.low_freq_factor,
            high_freq_factor: s.high_freq_factor,
            original_max_positions: s.original_max_position_embeddings,
        });
        // transformers' defaults per configuration class.
        let default_positions = match arch {
            Arch::Llama => 2048,
            Arch::Qwen2 | Arch::Qwen3 => 32768,
            Arch::Bert => 512,
        };
        let config = ModelConfig {
            arch,
            hidden: hf.hidden_size,
            layers: hf.num_hidden_layers,
            heads: hf.num_attention_heads,
            kv_heads: hf.num_kv_heads(),
            head_dim: hf.head_dim(),
            ffn: hf.intermediate_size,
            vocab: hf.vocab_size,
            max_positions: hf.max_position_embeddings.unwrap_or(default_positions),
            norm_eps: if arch == Arch::Bert {
                hf.layer_norm_eps.unwrap_or(1e-12)
            } else {
                hf.rms_norm_eps.unwrap_or(1e-6)
            },
            rope_theta: hf.rope_theta.unwrap_or(10_000.0),
            rope_scaling,
            rope_style: RopeStyle::HalfSplit,
            tied_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2,
            qk_norm: arch == Arch::Qwen3,
            type_vocab: hf.type_vocab_size.unwrap_or(2),
        };
        config.validate()?;
        Ok(config)
    }

    /// The model described by a GGUF file's metadata (`general.architecture` and its
    /// `ARCH.*` keys), in llama.cpp's layout: llama's q/k rows are permuted for
    /// [`RopeStyle::Adjacent`], qwen2/qwen3 use [`RopeStyle::HalfSplit`]. The output
    /// projection is tied when the file has no `output.weight`.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let arch_name = file.get_str("general.architecture")?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "bert" => Arch::Bert,
            other => {
                return Err(ArchError::UnsupportedArch {
                    arch: format!("GGUF architecture {other}"),
                    what: "quench's CPU forward",
                })
            }
        };
        let key = |k: &str| format!("{arch_name}.{k}");
        let int = |k: &str| -> Result<usize> { Ok(file.get_u64(&key(k))? as usize) };
        let opt_int = |k: &str| -> Result<Option<usize>> {
            match file.metadata(&key(k)) {
                Some(_) => int(k).map(Some),
                None => Ok(None),
            }
        };
        let float = |k: &str| -> Result<Option<f64>> {
            let Some(v) = file.metadata(&key(k)) else {
                return Ok(None);
            };
            v.as_f64().map(Some).ok_or_else(|| {
                ModelError::MetadataType {
                    key: key(k),
                    expected: "a float",
                    found: v.type_description(),
                }
                .into()
            })
        };
        if let Ok(kind) = file.get_str(&key("rope.scaling.type")) {
            if kind != "none" {
                return Err(ArchError::Config {
                    field: "rope_scaling",
                    reason: format!("type {kind:?} is not supported"),
                });
            }
        }
        let hidden = int("embedding_length")?;
        let heads = int("attention.head_count")?;
        let head_dim = opt_int("attention.key_length")?.unwrap_or(hidden / heads.max(1));
        if let Some(rotary) = opt_int("rope.dimension_count")? {
            if arch != Arch::Bert && rotary != head_dim {
                return Err(ArchError::Config {
                    field: "rope.dimension_count",
                    reason: format!(
                        "{rotary} differs from the head size {head_dim}; partial RoPE is not \
                         supported"
                    ),
                });
            }
        }
        let vocab = match opt_int("vocab_size")? {
            Some(v) => v,
            None => file.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let eps_key = if arch == Arch::Bert {
            "attention.layer_norm_epsilon"
        } else {
            "attention.layer_norm_rms_epsilon"
        };
        let bias_name = DecoderTensor::Layer(0, DecoderLayerTensor::QBias).name(Naming::Gguf);
        let has = |n: Option<String>| n.is_some_and(|n| file.contains(&n));
        if arch == Arch::Llama && has(bias_name) {
            return Err(ArchError::Config {
                field: "attention bias",
                reason: "llama models with attention biases are not supported".into(),
            });
        }
        let type_vocab = match file
            .tensor_infos()
            .iter()
            .find(|t| t.name == "token_types.weight")
        {
            Some(t) => t.dims.get(1).copied().unwrap_or(1) as usize,
            None => 2,
        };
        let config = ModelConfig {
            arch,
            hidden,
            layers: int("block_count")?,
            heads,
            kv_heads: opt_int("attention.head_count_kv")?.unwrap_or(heads),
            head_dim,
            ffn: int("feed_forward_length")?,
            vocab,
            max_positions: int("context_length")?,
            norm_eps: float(eps_key)?
                .ok_or_else(|| ModelError::MissingMetadata { key: key(eps_key) })?,
            rope_theta: float("rope.freq_base")?.unwrap_or(10_000.0),
            rope_scaling: None,
            rope_style: if arch == Arch::Llama {
                RopeStyle::Adjacent
            } else {
                RopeStyle::HalfSplit
            },
            tied_embeddings: !has(DecoderTensor::Output.name(Naming::Gguf)),
            qkv_bias: arch == Arch::Qwen2,
            qk_norm: arch == Arch::Qwen3,
            type_vocab,
        };
        config.validate()?;
        Ok(config)
    }
}
