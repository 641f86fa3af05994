//! A tiny chat model with seeded random weights, built in memory: llama-style, loads in
//! milliseconds, answers fast and deterministically (meaninglessly), for trying a server
//! without a checkpoint and for tests.

use quench_cpu::Decoder;
use quench_models::arch::{
    Arch, DecoderLayerTensor as L, DecoderTensor, MemorySource, ModelConfig, Naming, RopeStyle,
};
use quench_text::{ChatTemplate, Tokenizer};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use crate::error::{EngineError, Result};
use crate::info::ModelInfo;
use crate::CausalModel;

/// ChatML, as SmolLM2 and Qwen write their conversations.
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' \
                      + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}\
                      {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const CHAT_SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// The shape of the tiny chat model: llama-style, 2 layers, 64 wide, 2,048 positions, a
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
        max_positions: 2048,
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

/// The tiny chat model with weights drawn from `seed`, on the CPU in f32, with its text side
/// (byte-level BPE without merges, a ChatML template, `<|im_end|>` and `<|endoftext|>`
/// ending replies).
pub fn tiny_chat_model(seed: u64) -> Result<CausalModel> {
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
    let decoder = Decoder::<f32>::load(config.clone(), &src, Naming::HuggingFace)?;

    let tokenizer = Tokenizer::from_tokenizer_json_str(&byte_level_tokenizer_json().to_string())
        .map_err(|e| EngineError::text("the tiny chat model's tokenizer", e))?;
    let template = ChatTemplate::new(CHATML, "", CHAT_SPECIALS[0])
        .map_err(|e| EngineError::text("the tiny chat model's template", e))?;
    let stop_ids = [CHAT_SPECIALS[0], CHAT_SPECIALS[2]]
        .iter()
        .filter_map(|t| tokenizer.token_to_id(t))
        .collect();
    let info = ModelInfo::in_memory(config, src.parameters());
    Ok(CausalModel::new(
        Box::new(decoder),
        tokenizer,
        Some(template),
        stop_ids,
        info,
    ))
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
