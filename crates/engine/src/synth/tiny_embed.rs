//! A tiny sentence embedder with seeded random weights, built in memory (BERT, WordPiece):
//! for trying a server without a checkpoint and for tests.

use quench_cpu::Encoder;
use quench_models::arch::{ModelConfig, Naming};
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
fn with_weights(src: quench_models::arch::MemorySource) -> Result<EmbeddingModel> {
    let shape = tiny_embedder();
    let encoder = Encoder::<f32>::load(shape.config(), &src, Naming::HuggingFace)?;

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
    let tokenizer = Tokenizer::from_tokenizer_json_str(&json.to_string())
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
