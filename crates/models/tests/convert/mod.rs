//! Small Hugging Face checkpoints written from code for the converter's tests: config.json,
//! seeded random weights (single file or shards), and a byte-level BPE tokenizer.
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::BTreeMap;
use std::path::Path;

use quench_models::dequant::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use quench_models::safetensors::{Dtype, SafetensorsWriter};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

#[derive(Clone, Debug)]
pub struct Shape {
    pub arch: &'static str,
    pub hidden: usize,
    pub ffn: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub tied: bool,
}

impl Shape {
    /// Rows of 256 (whole Q4_K blocks) except the down projection's 288 (Q8_0 blocks only).
    pub fn wide(arch: &'static str) -> Shape {
        Shape {
            arch,
            hidden: 256,
            ffn: 288,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            vocab: 320,
            tied: arch == "qwen2",
        }
    }

    /// Rows of 64 (no Q4_K block) and a down projection of 80 (no Q8_0 block either).
    pub fn narrow(arch: &'static str) -> Shape {
        Shape {
            arch,
            hidden: 64,
            ffn: 80,
            layers: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            vocab: 300,
            tied: false,
        }
    }

    /// Every tensor's Hugging Face name and shape, in checkpoint order.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut out = vec![(
            "model.embed_tokens.weight".to_owned(),
            vec![self.vocab, self.hidden],
        )];
        for l in 0..self.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            out.push((p("input_layernorm.weight"), vec![self.hidden]));
            out.push((p("self_attn.q_proj.weight"), vec![q, self.hidden]));
            out.push((p("self_attn.k_proj.weight"), vec![kv, self.hidden]));
            out.push((p("self_attn.v_proj.weight"), vec![kv, self.hidden]));
            if self.arch == "qwen2" {
                out.push((p("self_attn.q_proj.bias"), vec![q]));
                out.push((p("self_attn.k_proj.bias"), vec![kv]));
                out.push((p("self_attn.v_proj.bias"), vec![kv]));
            }
            if self.arch == "qwen3" {
                out.push((p("self_attn.q_norm.weight"), vec![self.head_dim]));
                out.push((p("self_attn.k_norm.weight"), vec![self.head_dim]));
            }
            out.push((p("self_attn.o_proj.weight"), vec![self.hidden, q]));
            out.push((p("post_attention_layernorm.weight"), vec![self.hidden]));
            out.push((p("mlp.gate_proj.weight"), vec![self.ffn, self.hidden]));
            out.push((p("mlp.up_proj.weight"), vec![self.ffn, self.hidden]));
            out.push((p("mlp.down_proj.weight"), vec![self.hidden, self.ffn]));
        }
        out.push(("model.norm.weight".to_owned(), vec![self.hidden]));
        if !self.tied {
            out.push(("lm_head.weight".to_owned(), vec![self.vocab, self.hidden]));
        }
        out
    }

    pub fn config(&self) -> Value {
        let arch_class = match self.arch {
            "llama" => "LlamaForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            _ => "Qwen3ForCausalLM",
        };
        json!({
            "architectures": [arch_class],
            "model_type": self.arch,
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "tie_word_embeddings": self.tied,
            "vocab_size": self.vocab,
            "bos_token_id": BOS,
            "eos_token_id": EOS,
            "torch_dtype": "bfloat16",
        })
    }
}

/// The weights as stored (after rounding to the checkpoint's dtype), by name: shape and values.
pub type Weights = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

fn encode(dtype: Dtype, v: f32) -> (f32, Vec<u8>) {
    match dtype {
        Dtype::BF16 => {
            let b = f32_to_bf16(v);
            (bf16_to_f32(b), b.to_le_bytes().to_vec())
        }
        Dtype::F16 => {
            let h = f32_to_f16(v);
            (f16_to_f32(h), h.to_le_bytes().to_vec())
        }
        _ => (v, v.to_le_bytes().to_vec()),
    }
}

/// Rows of weight-like values: each row its own scale, norm weights near one.
fn values(name: &str, shape: &[usize], rng: &mut ChaCha8Rng) -> Vec<f32> {
    let n: usize = shape.iter().product();
    if name.ends_with("norm.weight") {
        return (0..n).map(|_| 1.0 + rng.gen_range(-0.1..0.1)).collect();
    }
    let cols = *shape.last().unwrap();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n / cols {
        let scale = 10f32.powf(rng.gen_range(-2.0..-1.0));
        out.extend((0..cols).map(|_| {
            // A sum of uniforms: bell-shaped, with the occasional larger value.
            let u: f32 = (0..3).map(|_| rng.gen_range(-1.0f32..1.0)).sum();
            u * scale
        }));
    }
    out
}

/// Writes `config.json`, the tokenizer files and the weights into `dir`; with `shards`, the
/// weights go into that many files listed by `model.safetensors.index.json`.
pub fn write_checkpoint(
    dir: &Path,
    shape: &Shape,
    dtype: Dtype,
    shards: usize,
    rng: &mut ChaCha8Rng,
) -> Weights {
    std::fs::create_dir_all(dir).unwrap();
    write_json(&dir.join("config.json"), &shape.config());
    write_json(&dir.join("tokenizer.json"), &tokenizer_json());
    write_json(&dir.join("tokenizer_config.json"), &tokenizer_config());
    let mut weights = Weights::new();
    let mut encoded = Vec::new();
    for (name, dims) in shape.tensors() {
        let (stored, bytes): (Vec<f32>, Vec<Vec<u8>>) = values(&name, &dims, rng)
            .into_iter()
            .map(|v| encode(dtype, v))
            .unzip();
        encoded.push((name.clone(), dims.clone(), bytes.concat()));
        weights.insert(name, (dims, stored));
    }
    let per_shard = encoded.len().div_ceil(shards.max(1));
    let groups: Vec<_> = encoded.chunks(per_shard).collect();
    let mut weight_map = serde_json::Map::new();
    for (i, group) in groups.iter().enumerate() {
        let file = if shards <= 1 {
            "model.safetensors".to_owned()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", i + 1, groups.len())
        };
        let mut w = SafetensorsWriter::new();
        for (name, dims, bytes) in group.iter() {
            let shape: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
            w.add_tensor(name, dtype, &shape, bytes).unwrap();
            weight_map.insert(name.clone(), json!(file));
        }
        w.write(dir.join(&file)).unwrap();
    }
    if shards > 1 {
        write_json(
            &dir.join("model.safetensors.index.json"),
            &json!({"metadata": {}, "weight_map": weight_map}),
        );
    }
    weights
}

pub fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// GPT-2's printable stand-in for each byte.
pub fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let mut next = 0x100;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

pub const MERGES: &[(&str, &str)] = &[
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("Ã", "©"),
];
/// Ids of the special tokens, after the bytes and the merges.
pub const BOS: u32 = 263;
pub const EOS: u32 = 264;
pub const SPECIALS: &[&str] = &["<|begin|>", "<|end|>"];
/// A non-special added token.
pub const ADDED: &str = "<tool>";

pub fn tokenizer_json() -> Value {
    let mut vocab = serde_json::Map::new();
    for (b, c) in byte_chars().iter().enumerate() {
        vocab.insert(c.to_string(), json!(b));
    }
    for (l, r) in MERGES {
        let id = vocab.len();
        vocab.insert(format!("{l}{r}"), json!(id));
    }
    let mut added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({"id": BOS as usize + i, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    added.push(
        json!({"id": EOS + 1, "content": ADDED, "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": false}),
    );
    json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                          "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false,
                           "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                    "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false,
                  "byte_fallback": false, "ignore_merges": false, "vocab": vocab,
                  "merges": MERGES.iter().map(|(l, r)| format!("{l} {r}")).collect::<Vec<_>>()}
    })
}

pub const TEMPLATE: &str = "{% for m in messages %}<|begin|>{{ m['content'] }}<|end|>{% endfor %}";

pub fn tokenizer_config() -> Value {
    json!({
        "bos_token": SPECIALS[0],
        "eos_token": {"content": SPECIALS[1], "special": true},
        "chat_template": TEMPLATE,
    })
}
