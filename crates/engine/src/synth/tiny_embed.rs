//! A tiny sentence embedder with seeded random weights, built in memory (BERT, WordPiece):
//! for trying a server without a checkpoint and for tests.

use std::path::Path;

use quench_cpu::Encoder;
use quench_models::arch::{BertTensor, MemorySource, ModelConfig, Naming, TensorSource};
use quench_models::gguf::{GgufWriter, MetadataArray, MetadataValue};
use quench_models::safetensors::{Dtype, SafetensorsWriter};
use quench_models::GgmlType;
use quench_text::Tokenizer;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use super::TinyBert;
use crate::embedding::{EmbeddingModel, Encoders, Pooling};
use crate::error::{EngineError, Result};
use crate::info::ModelInfo;

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

/// The tiny embedder with weights drawn from `seed`, on the CPU in f32, with its WordPiece
/// tokenizer; mean pooling, normalized.
pub fn tiny_embedding_model(seed: u64) -> Result<EmbeddingModel> {
    let src = tiny_embedder().weights(&mut ChaCha8Rng::seed_from_u64(seed))?;
    with_weights(src)
}

/// The tiny embedder with the weights `src`.
fn with_weights(src: MemorySource) -> Result<EmbeddingModel> {
    let shape = tiny_embedder();
    let encoder = Encoder::<f32>::load(shape.config(), &src, Naming::HuggingFace)?;
    let tokenizer = Tokenizer::from_tokenizer_json_str(&tokenizer_json().to_string())
        .map_err(|e| EngineError::text("the tiny embedder's tokenizer", e))?;
    let info = ModelInfo::in_memory(shape.config(), src.parameters());
    Ok(EmbeddingModel::new(
        Encoders::F32(encoder),
        tokenizer,
        Pooling::Mean,
        true,
        info,
    ))
}

/// The tiny embedder's WordPiece tokenizer as `tokenizer.json` writes it.
fn tokenizer_json() -> Value {
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
    json!({
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab}
    })
}

/// The file format [`write_tiny_embedder`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedderFormat {
    /// A directory: `config.json`, `model.safetensors` (f32), `tokenizer.json`.
    HuggingFace,
    /// One GGUF file (f32 tensors, the WordPiece vocabulary as llama.cpp stores it).
    Gguf,
}

/// Writes the tiny embedder with weights drawn from `seed` to `path` in `format`, for tests
/// of the loaders, the CLI and the server on files; it embeds as
/// [`tiny_embedding_model`]`(seed)` does. With `poison`, the first scale of the embeddings'
/// LayerNorm, which every token passes through, is that value instead: a NaN or an
/// infinity there damages every embedding, as a corrupt checkpoint would.
pub fn write_tiny_embedder(
    path: &Path,
    format: EmbedderFormat,
    seed: u64,
    poison: Option<f32>,
) -> Result<()> {
    let shape = tiny_embedder();
    let mut src = shape.weights(&mut ChaCha8Rng::seed_from_u64(seed))?;
    if let Some(value) = poison {
        let name = BertTensor::EmbeddingNormWeight.name(Naming::HuggingFace, "");
        let (dims, mut data) = src.get(&name)?;
        if let Some(first) = data.first_mut() {
            *first = value;
        }
        src.insert(&name, dims, data)?;
    }
    match format {
        EmbedderFormat::HuggingFace => write_hf(path, &shape, &src),
        EmbedderFormat::Gguf => write_gguf(path, &shape, &src),
    }
}

fn f32_bytes(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Every tensor of the encoder, in the order the weights are drawn.
fn bert_tensors(layers: usize) -> Vec<BertTensor> {
    use quench_models::arch::BertLayerTensor as L;
    let mut all = vec![
        BertTensor::WordEmbedding,
        BertTensor::PositionEmbedding,
        BertTensor::TypeEmbedding,
        BertTensor::EmbeddingNormWeight,
        BertTensor::EmbeddingNormBias,
    ];
    for n in 0..layers {
        all.extend(
            [
                L::Q,
                L::QBias,
                L::K,
                L::KBias,
                L::V,
                L::VBias,
                L::AttnOutput,
                L::AttnOutputBias,
                L::AttnNormWeight,
                L::AttnNormBias,
                L::Up,
                L::UpBias,
                L::Down,
                L::DownBias,
                L::OutputNormWeight,
                L::OutputNormBias,
            ]
            .map(|t| BertTensor::Layer(n, t)),
        );
    }
    all
}

/// A tensor as a file stores it: its name, its row-major dims and its f32 bytes.
struct Stored {
    name: String,
    dims: Vec<u64>,
    bytes: Vec<u8>,
}

/// The tensors under `naming`'s names.
fn stored(shape: &TinyBert, src: &MemorySource, naming: Naming) -> Result<Vec<Stored>> {
    bert_tensors(shape.layers)
        .into_iter()
        .map(|t| {
            let (dims, data) = src.get(&t.name(Naming::HuggingFace, ""))?;
            Ok(Stored {
                name: t.name(naming, ""),
                dims: dims.iter().map(|&d| d as u64).collect(),
                bytes: f32_bytes(&data),
            })
        })
        .collect()
}

fn write_hf(dir: &Path, shape: &TinyBert, src: &MemorySource) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| EngineError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let config = json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "intermediate_size": shape.ffn,
        "hidden_act": "gelu",
        "vocab_size": shape.vocab,
        "max_position_embeddings": shape.max_positions,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "torch_dtype": "float32",
    });
    super::write_json(dir, "config.json", &config)?;
    super::write_json(dir, "tokenizer.json", &tokenizer_json())?;
    let tensors = stored(shape, src, Naming::HuggingFace)?;
    let mut w = SafetensorsWriter::new();
    for t in &tensors {
        w.add_tensor(&t.name, Dtype::F32, &t.dims, &t.bytes)?;
    }
    w.write(dir.join("model.safetensors"))?;
    Ok(())
}

fn write_gguf(path: &Path, shape: &TinyBert, src: &MemorySource) -> Result<()> {
    let tensors = stored(shape, src, Naming::Gguf)?;
    let mut w = GgufWriter::new();
    let text = |s: &str| MetadataValue::String(s.to_owned());
    let int = |n: usize| MetadataValue::U32(n as u32);
    // llama.cpp's BERT vocabulary: a word's first piece marked with '▁', continuations
    // without their "##", bracketed special tokens as they are.
    let vocab = wordpiece_vocab();
    let tokens: Vec<String> = vocab
        .iter()
        .map(|t| match t.strip_prefix("##") {
            Some(rest) => rest.to_owned(),
            None if t.starts_with('[') => t.clone(),
            None => format!("\u{2581}{t}"),
        })
        .collect();
    // Unknown (2) for [UNK], control (3) for the other bracketed ones, normal (1) else.
    let types: Vec<i32> = vocab
        .iter()
        .map(|t| match t.as_str() {
            "[UNK]" => 2,
            t if t.starts_with('[') => 3,
            _ => 1,
        })
        .collect();
    let metadata = [
        ("general.architecture", text("bert")),
        ("general.name", text("tiny-embed")),
        ("bert.embedding_length", int(shape.hidden)),
        ("bert.block_count", int(shape.layers)),
        ("bert.attention.head_count", int(shape.heads)),
        ("bert.feed_forward_length", int(shape.ffn)),
        ("bert.context_length", int(shape.max_positions)),
        (
            "bert.attention.layer_norm_epsilon",
            MetadataValue::F32(1e-12),
        ),
        ("bert.pooling_type", int(1)),
        ("tokenizer.ggml.model", text("bert")),
        (
            "tokenizer.ggml.tokens",
            MetadataValue::Array(MetadataArray::String(tokens)),
        ),
        (
            "tokenizer.ggml.token_type",
            MetadataValue::Array(MetadataArray::I32(types)),
        ),
        ("tokenizer.ggml.padding_token_id", int(0)),
        ("tokenizer.ggml.unknown_token_id", int(1)),
        ("tokenizer.ggml.cls_token_id", int(2)),
        ("tokenizer.ggml.seperator_token_id", int(3)),
    ];
    for (key, value) in metadata {
        w.add_metadata(key, value)?;
    }
    for t in &tensors {
        // ggml orders dims from the row length out.
        let dims: Vec<u64> = t.dims.iter().rev().copied().collect();
        w.add_tensor(&t.name, &dims, GgmlType::F32, &t.bytes)?;
    }
    w.write(path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{tiny_chat_model, tiny_embedding_model};
    use super::{tiny_embedder, with_weights, ChaCha8Rng, SeedableRng};
    use crate::error::EngineError;
    use quench_text::Message;

    #[test]
    fn an_embedder_with_a_nan_weight_refuses_to_answer() {
        let mut src = tiny_embedder()
            .weights(&mut ChaCha8Rng::seed_from_u64(3))
            .unwrap();
        let name = src
            .names()
            .find(|n| n.contains("word_embeddings"))
            .unwrap()
            .to_owned();
        let (dims, mut data) = src.remove(&name).unwrap();
        data.iter_mut().for_each(|v| *v = f32::NAN);
        src.insert(&name, dims, data).unwrap();
        let model = with_weights(src).unwrap();
        let err = model.embed(&["fine", "hello"]).unwrap_err();
        assert!(matches!(err, EngineError::BadEmbedding), "{err}");
        assert!(tiny_embedding_model(3).unwrap().embed(&["hello"]).is_ok());
    }

    #[test]
    fn tiny_chat_model_round_trips_text_and_stops_at_end_of_turn() {
        let model = tiny_chat_model(1).unwrap();
        let tok = model.tokenizer();
        let s = "Hello, wörld! <|im_end|>";
        let ids = tok.encode(s, false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), s);
        assert_eq!(*ids.last().unwrap(), 258);
        assert_eq!(model.eos_ids(), [256, 258]);
        let prompt = model
            .prompt_tokens(crate::Prompt::Chat(&[Message::new("user", "hi")]))
            .unwrap();
        assert_eq!(
            tok.decode(&prompt, false).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(model.info().config.vocab, tok.vocab_size());
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
