//! The names checkpoints give to each weight.

/// Which naming scheme a checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    /// llama.cpp's GGUF names: `token_embd.weight`, `blk.0.attn_q.weight`, …
    Gguf,
    /// Hugging Face transformers names: `model.embed_tokens.weight`,
    /// `model.layers.0.self_attn.q_proj.weight`, … (BERT: `embeddings.word_embeddings.weight`,
    /// `encoder.layer.0.attention.self.query.weight`, …).
    HuggingFace,
}

/// A weight of a decoder (llama, qwen2, qwen3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderTensor {
    TokenEmbedding,
    OutputNorm,
    /// The output projection; absent when tied to the token embedding.
    Output,
    /// Per-frequency RoPE divisors (GGUF's form of Llama 3 scaling); optional.
    RopeFreqs,
    Layer(usize, DecoderLayerTensor),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecoderLayerTensor {
    AttnNorm,
    Q,
    K,
    V,
    QBias,
    KBias,
    VBias,
    QNorm,
    KNorm,
    AttnOutput,
    FfnNorm,
    Gate,
    Up,
    Down,
}

impl DecoderTensor {
    /// The tensor's name in a checkpoint of the given naming, or `None` where that naming has
    /// no such tensor.
    pub fn name(self, naming: Naming) -> Option<String> {
        use DecoderLayerTensor as L;
        let gguf = naming == Naming::Gguf;
        Some(match self {
            DecoderTensor::TokenEmbedding if gguf => "token_embd.weight".into(),
            DecoderTensor::TokenEmbedding => "model.embed_tokens.weight".into(),
            DecoderTensor::OutputNorm if gguf => "output_norm.weight".into(),
            DecoderTensor::OutputNorm => "model.norm.weight".into(),
            DecoderTensor::Output if gguf => "output.weight".into(),
            DecoderTensor::Output => "lm_head.weight".into(),
            DecoderTensor::RopeFreqs if gguf => "rope_freqs.weight".into(),
            DecoderTensor::RopeFreqs => return None,
            DecoderTensor::Layer(n, t) if gguf => {
                let suffix = match t {
                    L::AttnNorm => "attn_norm.weight",
                    L::Q => "attn_q.weight",
                    L::K => "attn_k.weight",
                    L::V => "attn_v.weight",
                    L::QBias => "attn_q.bias",
                    L::KBias => "attn_k.bias",
                    L::VBias => "attn_v.bias",
                    L::QNorm => "attn_q_norm.weight",
                    L::KNorm => "attn_k_norm.weight",
                    L::AttnOutput => "attn_output.weight",
                    L::FfnNorm => "ffn_norm.weight",
                    L::Gate => "ffn_gate.weight",
                    L::Up => "ffn_up.weight",
                    L::Down => "ffn_down.weight",
                };
                format!("blk.{n}.{suffix}")
            }
            DecoderTensor::Layer(n, t) => {
                let suffix = match t {
                    L::AttnNorm => "input_layernorm.weight",
                    L::Q => "self_attn.q_proj.weight",
                    L::K => "self_attn.k_proj.weight",
                    L::V => "self_attn.v_proj.weight",
                    L::QBias => "self_attn.q_proj.bias",
                    L::KBias => "self_attn.k_proj.bias",
                    L::VBias => "self_attn.v_proj.bias",
                    L::QNorm => "self_attn.q_norm.weight",
                    L::KNorm => "self_attn.k_norm.weight",
                    L::AttnOutput => "self_attn.o_proj.weight",
                    L::FfnNorm => "post_attention_layernorm.weight",
                    L::Gate => "mlp.gate_proj.weight",
                    L::Up => "mlp.up_proj.weight",
                    L::Down => "mlp.down_proj.weight",
                };
                format!("model.layers.{n}.{suffix}")
            }
        })
    }
}

/// A weight of a BERT encoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BertTensor {
    WordEmbedding,
    PositionEmbedding,
    TypeEmbedding,
    EmbeddingNormWeight,
    EmbeddingNormBias,
    Layer(usize, BertLayerTensor),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BertLayerTensor {
    Q,
    QBias,
    K,
    KBias,
    V,
    VBias,
    AttnOutput,
    AttnOutputBias,
    AttnNormWeight,
    AttnNormBias,
    Up,
    UpBias,
    Down,
    DownBias,
    OutputNormWeight,
    OutputNormBias,
}

impl BertTensor {
    /// The tensor's name in a checkpoint of the given naming. Hugging Face BERT checkpoints
    /// saved from a task model put `bert.` before every name; pass that as `prefix`.
    pub fn name(self, naming: Naming, prefix: &str) -> String {
        use BertLayerTensor as L;
        if naming == Naming::Gguf {
            return match self {
                BertTensor::WordEmbedding => "token_embd.weight".into(),
                BertTensor::PositionEmbedding => "position_embd.weight".into(),
                BertTensor::TypeEmbedding => "token_types.weight".into(),
                BertTensor::EmbeddingNormWeight => "token_embd_norm.weight".into(),
                BertTensor::EmbeddingNormBias => "token_embd_norm.bias".into(),
                BertTensor::Layer(n, t) => {
                    let suffix = match t {
                        L::Q => "attn_q.weight",
                        L::QBias => "attn_q.bias",
                        L::K => "attn_k.weight",
                        L::KBias => "attn_k.bias",
                        L::V => "attn_v.weight",
                        L::VBias => "attn_v.bias",
                        L::AttnOutput => "attn_output.weight",
                        L::AttnOutputBias => "attn_output.bias",
                        L::AttnNormWeight => "attn_output_norm.weight",
                        L::AttnNormBias => "attn_output_norm.bias",
                        L::Up => "ffn_up.weight",
                        L::UpBias => "ffn_up.bias",
                        L::Down => "ffn_down.weight",
                        L::DownBias => "ffn_down.bias",
                        L::OutputNormWeight => "layer_output_norm.weight",
                        L::OutputNormBias => "layer_output_norm.bias",
                    };
                    format!("blk.{n}.{suffix}")
                }
            };
        }
        let name = match self {
            BertTensor::WordEmbedding => "embeddings.word_embeddings.weight".into(),
            BertTensor::PositionEmbedding => "embeddings.position_embeddings.weight".into(),
            BertTensor::TypeEmbedding => "embeddings.token_type_embeddings.weight".into(),
            BertTensor::EmbeddingNormWeight => "embeddings.LayerNorm.weight".into(),
            BertTensor::EmbeddingNormBias => "embeddings.LayerNorm.bias".into(),
            BertTensor::Layer(n, t) => {
                let suffix = match t {
                    L::Q => "attention.self.query.weight",
                    L::QBias => "attention.self.query.bias",
                    L::K => "attention.self.key.weight",
                    L::KBias => "attention.self.key.bias",
                    L::V => "attention.self.value.weight",
                    L::VBias => "attention.self.value.bias",
                    L::AttnOutput => "attention.output.dense.weight",
                    L::AttnOutputBias => "attention.output.dense.bias",
                    L::AttnNormWeight => "attention.output.LayerNorm.weight",
                    L::AttnNormBias => "attention.output.LayerNorm.bias",
                    L::Up => "intermediate.dense.weight",
                    L::UpBias => "intermediate.dense.bias",
                    L::Down => "output.dense.weight",
                    L::DownBias => "output.dense.bias",
                    L::OutputNormWeight => "output.LayerNorm.weight",
                    L::OutputNormBias => "output.LayerNorm.bias",
                };
                format!("encoder.layer.{n}.{suffix}")
            }
        };
        format!("{prefix}{name}")
    }
}
