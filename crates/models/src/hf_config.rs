//! A Hugging Face `config.json`, with the fields the llama, qwen2, qwen3 and bert families
//! need. Unknown fields are ignored (configs carry many); fields a family may omit are
//! `Option`s, with accessors for the defaults transformers applies.

use std::path::Path;

use serde::Deserialize;

use crate::ModelError;

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct HfConfig {
    #[serde(default)]
    pub architectures: Vec<String>,
    pub model_type: Option<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Absent for multi-head attention (and BERT); see [`HfConfig::num_kv_heads`].
    pub num_key_value_heads: Option<usize>,
    /// Absent (or null) when it is `hidden_size / num_attention_heads`; see [`HfConfig::head_dim`].
    pub head_dim: Option<usize>,
    pub hidden_act: Option<String>,
    pub rms_norm_eps: Option<f64>,
    pub layer_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<RopeScaling>,
    pub vocab_size: usize,
    /// BERT's token-type (segment) vocabulary.
    pub type_vocab_size: Option<usize>,
    pub max_position_embeddings: Option<usize>,
    /// Absent means the architecture's default (false for llama and qwen).
    pub tie_word_embeddings: Option<bool>,
    pub bos_token_id: Option<TokenIds>,
    pub eos_token_id: Option<TokenIds>,
    pub pad_token_id: Option<TokenIds>,
    pub torch_dtype: Option<String>,
    /// Bias on the q/k/v/o projections (llama); qwen2 has q/k/v biases regardless.
    pub attention_bias: Option<bool>,
}

/// `rope_scaling` as written; [`HfConfig::llama3_rope_scaling`] interprets it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RopeScaling {
    pub rope_type: Option<String>,
    /// The older spelling of `rope_type`; some configs carry both.
    #[serde(rename = "type")]
    pub legacy_type: Option<String>,
    pub factor: Option<f64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub original_max_position_embeddings: Option<usize>,
}

impl RopeScaling {
    pub fn kind(&self) -> Option<&str> {
        self.rope_type.as_deref().or(self.legacy_type.as_deref())
    }
}

/// The parameters of llama 3's frequency-dependent RoPE scaling, all present.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

/// Token ids that configs write either as one integer or as a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

impl<'de> Deserialize<'de> for TokenIds {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<TokenIds, D::Error> {
        struct Ids;
        impl<'de> serde::de::Visitor<'de> for Ids {
            type Value = TokenIds;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a token id or a list of token ids")
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<TokenIds, E> {
                let id = u32::try_from(v)
                    .map_err(|_| E::custom(format!("token id {v} out of range")))?;
                Ok(TokenIds(vec![id]))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<TokenIds, A::Error> {
                let mut ids = Vec::new();
                while let Some(id) = seq.next_element()? {
                    ids.push(id);
                }
                Ok(TokenIds(ids))
            }
        }
        deserializer.deserialize_any(Ids)
    }
}

impl HfConfig {
    /// Parses and validates `config.json` text.
    pub fn from_json(text: &str) -> Result<HfConfig, ModelError> {
        let mut json = serde_json::Deserializer::from_str(text);
        let config: HfConfig = serde_path_to_error::deserialize(&mut json).map_err(|e| {
            // Name the field where there is one ("." is the top level: syntax, missing fields).
            let field = e.path().to_string();
            match field.as_str() {
                "." => ModelError::Json {
                    source: e.into_inner(),
                },
                _ => ModelError::Config {
                    field,
                    reason: e.into_inner().to_string(),
                },
            }
        })?;
        json.end().map_err(|source| ModelError::Json { source })?;
        config.validate()?;
        Ok(config)
    }

    pub fn from_file(path: impl AsRef<Path>) -> Result<HfConfig, ModelError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            file: path.to_owned(),
            source,
        })?;
        HfConfig::from_json(&text).map_err(|e| e.in_file(path))
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |field: &str, reason: String| {
            Err(ModelError::Config {
                field: field.to_owned(),
                reason,
            })
        };
        for (field, value) in [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("vocab_size", self.vocab_size),
        ] {
            if value == 0 {
                return bad(field, "must not be zero".to_owned());
            }
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(
                "hidden_size",
                format!(
                    "{} is not divisible by num_attention_heads {}",
                    self.hidden_size, self.num_attention_heads
                ),
            );
        }
        if self.head_dim == Some(0) {
            return bad("head_dim", "must not be zero".to_owned());
        }
        let kv = self.num_kv_heads();
        if kv == 0 || !self.num_attention_heads.is_multiple_of(kv) {
            return bad(
                "num_key_value_heads",
                format!(
                    "{kv} does not divide num_attention_heads {}",
                    self.num_attention_heads
                ),
            );
        }
        Ok(())
    }

    /// The first of `architectures` (e.g. `LlamaForCausalLM`).
    pub fn architecture(&self) -> Option<&str> {
        self.architectures.first().map(String::as_str)
    }

    /// Key/value heads; equal to the attention heads when the config does not say.
    pub fn num_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// Llama 3 RoPE scaling when the config asks for it; `None` when it asks for none (absent,
    /// or type `default`). Any other scaling type is refused by name, as are missing parameters.
    pub fn llama3_rope_scaling(&self) -> Result<Option<Llama3RopeScaling>, ModelError> {
        let Some(scaling) = &self.rope_scaling else {
            return Ok(None);
        };
        match scaling.kind() {
            Some("default") => Ok(None),
            Some("llama3") => {
                let missing = |field: &str| ModelError::Config {
                    field: format!("rope_scaling.{field}"),
                    reason: "missing for rope_type llama3".to_owned(),
                };
                Ok(Some(Llama3RopeScaling {
                    factor: scaling.factor.ok_or_else(|| missing("factor"))?,
                    low_freq_factor: scaling
                        .low_freq_factor
                        .ok_or_else(|| missing("low_freq_factor"))?,
                    high_freq_factor: scaling
                        .high_freq_factor
                        .ok_or_else(|| missing("high_freq_factor"))?,
                    original_max_position_embeddings: scaling
                        .original_max_position_embeddings
                        .ok_or_else(|| missing("original_max_position_embeddings"))?,
                }))
            }
            other => Err(ModelError::Unsupported {
                what: format!("rope_scaling type {}", other.unwrap_or("(none given)")),
            }),
        }
    }
}
