//! Tiny models with seeded random weights, built in memory: a chat model and a sentence
//! embedder that load in milliseconds and answer fast, for trying the server without a
//! checkpoint (`--model synthetic:tiny-chat`) and for its tests. Their answers are
//! meaningless but deterministic.

use quench_cpu::{
    Arch, Decoder, DecoderLayerTensor as L, DecoderTensor, Encoder, MemorySource, ModelConfig,
    Naming, RopeStyle,
};
use quench_engine::synth::TinyBert;
use quench_text::{ChatTemplate, Tokenizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use crate::backend::{BackendError, Embedded, EmbeddingBackend};
use crate::text::ModelText;

/// ChatML, as SmolLM2 and Qwen write their conversations.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' \
                      + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}\
                      {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const CHAT_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// A failure to build a synthetic model (a mistake in this module, reported as an error).
#[derive(Debug, thiserror::Error)]
pub enum SyntheticError {
    #[error("synthetic model: {0}")]
    Cpu(#[from] quench_cpu::CpuError),
    #[error("synthetic tokenizer: {0}")]
    Text(#[from] quench_text::TextError),
    #[error("synthetic model: {0}")]
    Weights(#[from] quench_engine::EngineError),
}

/// The shape of the tiny chat model: llama-style, 2 layers, 64 wide, 512 positions, a
/// byte-level vocabulary of 256 bytes and 3 ChatML special tokens.
pub fn tiny_chat_config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        ffn: 128,
        vocab: 256 + CHAT_SPECIALS.len(),
        max_positions: 512,
        norm_eps: 1e-6,
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_style: RopeStyle::HalfSplit,
        tied_embeddings: false,
        qkv_bias: false,
        qk_norm: false,
        type_vocab: 2,
    }
}

/// The tiny chat model with weights drawn from `seed`, and its text side (byte-level BPE
/// without merges, a ChatML template, `<|im_end|>` and `<|endoftext|>` ending replies).
pub fn tiny_chat_model(seed: u64) -> Result<(Decoder<f32>, ModelText), SyntheticError> {
    let config = tiny_chat_config();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut src = MemorySource::new();
    let (d, hd) = (config.hidden, config.head_dim);
    let (qw, kvw, ffn, vocab) = (
        config.heads * hd,
        config.kv_heads * hd,
        config.ffn,
        config.vocab,
    );
    let name = |t: DecoderTensor| t.name(Naming::HuggingFace).unwrap_or_default();
    let mut put =
        |src: &mut MemorySource, name: String, dims: Vec<usize>, gain: f32, center: f32| {
            let n: usize = dims.iter().product();
            let spread = if dims.len() == 2 {
                gain * (3.0 / dims[1] as f32).sqrt()
            } else {
                gain
            };
            let data = (0..n)
                .map(|_| center + spread * rng.gen_range(-1.0f32..=1.0))
                .collect();
            src.insert(&name, dims, data)
        };
    put(
        &mut src,
        name(DecoderTensor::TokenEmbedding),
        vec![vocab, d],
        1.0,
        0.0,
    )?;
    put(&mut src, name(DecoderTensor::OutputNorm), vec![d], 0.2, 1.0)?;
    put(
        &mut src,
        name(DecoderTensor::Output),
        vec![vocab, d],
        4.0,
        0.0,
    )?;
    for n in 0..config.layers {
        let layer = |t| name(DecoderTensor::Layer(n, t));
        put(&mut src, layer(L::AttnNorm), vec![d], 0.2, 1.0)?;
        put(&mut src, layer(L::Q), vec![qw, d], 2.0, 0.0)?;
        put(&mut src, layer(L::K), vec![kvw, d], 2.0, 0.0)?;
        put(&mut src, layer(L::V), vec![kvw, d], 1.0, 0.0)?;
        put(&mut src, layer(L::AttnOutput), vec![d, qw], 1.0, 0.0)?;
        put(&mut src, layer(L::FfnNorm), vec![d], 0.2, 1.0)?;
        put(&mut src, layer(L::Gate), vec![ffn, d], 1.5, 0.0)?;
        put(&mut src, layer(L::Up), vec![ffn, d], 1.0, 0.0)?;
        put(&mut src, layer(L::Down), vec![d, ffn], 1.0, 0.0)?;
    }
    // Silence the output rows of bytes that are not printable ASCII, so that replies read
    // as (random) text rather than broken UTF-8.
    let output = name(DecoderTensor::Output);
    if let Some((dims, mut data)) = src.remove(&output) {
        for byte in (0..256usize).filter(|b| !(32..127).contains(b)) {
            data[byte * d..(byte + 1) * d].fill(0.0);
        }
        src.insert(&output, dims, data)?;
    }
    let decoder = Decoder::load(config, &src, Naming::HuggingFace)?;

    let tokenizer = Tokenizer::from_tokenizer_json_str(&byte_level_tokenizer_json().to_string())?;
    let template = ChatTemplate::new(CHATML, "", CHAT_SPECIALS[0])?;
    let stop_ids = [CHAT_SPECIALS[0], CHAT_SPECIALS[2]]
        .iter()
        .filter_map(|t| tokenizer.token_to_id(t))
        .collect();
    Ok((decoder, ModelText::new(tokenizer, Some(template), stop_ids)))
}

/// GPT-2's map from bytes to printable characters.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut next = 256;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                let c = char::from_u32(next).unwrap_or('?');
                next += 1;
                c
            }
        })
        .collect()
}

fn byte_level_tokenizer_json() -> Value {
    let mut vocab = Map::new();
    for (id, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let added: Vec<Value> = CHAT_SPECIALS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            vocab.insert(t.to_string(), json!(256 + i));
            json!({"id": 256 + i, "content": t, "special": true, "normalized": false,
                   "lstrip": false, "rstrip": false, "single_word": false})
        })
        .collect();
    json!({
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": []}
    })
}

/// The shape of the tiny embedder: BERT, 2 layers, 32 wide, 128 positions.
pub fn tiny_embedding_config() -> ModelConfig {
    tiny_embedder().config()
}

fn tiny_embedder() -> TinyBert {
    TinyBert {
        hidden: 32,
        layers: 2,
        heads: 4,
        ffn: 64,
        vocab: wordpiece_vocab().len(),
        max_positions: 128,
    }
}

fn wordpiece_vocab() -> Vec<String> {
    let mut v: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let chars = ('a'..='z').chain('0'..='9');
    v.extend(chars.clone().map(String::from));
    v.extend(".,!?'-:;()\"".chars().map(String::from));
    v.extend(chars.map(|c| format!("##{c}")));
    v
}

/// A BERT encoder with its tokenizer, embedding texts of up to its context.
pub struct SyntheticEmbedder {
    encoder: Encoder<f32>,
    tokenizer: Tokenizer,
}

impl SyntheticEmbedder {
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }
}

impl EmbeddingBackend for SyntheticEmbedder {
    fn dimensions(&self) -> usize {
        self.encoder.config().hidden
    }

    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedded>, BackendError> {
        texts
            .iter()
            .map(|text| {
                let tokens = self
                    .tokenizer
                    .encode(text, true)
                    .map_err(|e| BackendError(e.to_string()))?;
                let vector = self
                    .encoder
                    .embed(&tokens, None)
                    .map_err(|e| BackendError(e.to_string()))?;
                Ok(Embedded {
                    vector,
                    tokens: tokens.len(),
                })
            })
            .collect()
    }
}

/// The tiny embedder with weights drawn from `seed`, and its WordPiece tokenizer.
pub fn tiny_embedding_model(seed: u64) -> Result<SyntheticEmbedder, SyntheticError> {
    let shape = tiny_embedder();
    let src = shape.weights(&mut ChaCha8Rng::seed_from_u64(seed))?;
    let encoder = Encoder::load(shape.config(), &src, Naming::HuggingFace)?;

    let vocab: Map<String, Value> = wordpiece_vocab()
        .into_iter()
        .enumerate()
        .map(|(id, t)| (t, json!(id)))
        .collect();
    let added: Vec<Value> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
        .iter()
        .enumerate()
        .map(|(id, t)| {
            json!({"id": id, "content": t, "special": true, "normalized": false,
                   "lstrip": false, "rstrip": false, "single_word": false})
        })
        .collect();
    let json = json!({
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab}
    });
    let tokenizer = Tokenizer::from_tokenizer_json_str(&json.to_string())?;
    Ok(SyntheticEmbedder { encoder, tokenizer })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::TextSide;
    use quench_text::Message;

    #[test]
    fn tiny_chat_model_round_trips_text_and_stops_at_end_of_turn() {
        let (decoder, text) = tiny_chat_model(1).unwrap();
        let tok = text.tokenizer();
        let s = "Hello, wörld! <|im_end|>";
        let ids = tok.encode(s, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), s);
        assert_eq!(*ids.last().unwrap(), 258);
        assert_eq!(text.stop_ids(), [256, 258]);
        let prompt = text.chat_prompt(&[Message::new("user", "hi")]).unwrap();
        assert_eq!(
            tok.decode(&prompt, false).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(decoder.config().vocab, tok.vocab_size());
    }

    #[test]
    fn tiny_embedder_gives_unit_vectors_that_differ_by_text() {
        let model = tiny_embedding_model(1).unwrap();
        let a = model.tokenizer().encode("the cat sat", true).unwrap();
        assert_eq!((a[0], *a.last().unwrap()), (2, 3));
        let out = model.embed(&["the cat sat", "a dog ran"]).unwrap();
        assert_eq!(out[0].tokens, a.len());
        let (ea, eb) = (&out[0].vector, &out[1].vector);
        assert_eq!(ea.len(), model.dimensions());
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm(ea) - 1.0).abs() < 1e-5 && (norm(eb) - 1.0).abs() < 1e-5);
        assert!(ea.iter().zip(eb).any(|(x, y)| (x - y).abs() > 1e-3));
    }
}
