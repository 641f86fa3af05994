//! Seeded random weights in Hugging Face's layout, streamed into safetensors files (one, or
//! shards with an index when the total passes the shard size).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use super::shapes::{Dims, SynthArch};
use crate::error::{EngineError, Result};

/// The element type weights are stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthDtype {
    Bf16,
    F16,
    F32,
}

impl SynthDtype {
    pub fn from_name(name: &str) -> Option<SynthDtype> {
        match name {
            "bf16" => Some(SynthDtype::Bf16),
            "f16" => Some(SynthDtype::F16),
            "f32" => Some(SynthDtype::F32),
            _ => None,
        }
    }

    fn bytes(self) -> u64 {
        match self {
            SynthDtype::F32 => 4,
            SynthDtype::Bf16 | SynthDtype::F16 => 2,
        }
    }

    fn safetensors_name(self) -> &'static str {
        match self {
            SynthDtype::Bf16 => "BF16",
            SynthDtype::F16 => "F16",
            SynthDtype::F32 => "F32",
        }
    }

    /// The name of the type in `config.json`'s `torch_dtype`.
    pub(crate) fn torch_name(self) -> &'static str {
        match self {
            SynthDtype::Bf16 => "bfloat16",
            SynthDtype::F16 => "float16",
            SynthDtype::F32 => "float32",
        }
    }

    fn encode(self, v: f32, out: &mut Vec<u8>) {
        match self {
            SynthDtype::F32 => out.extend_from_slice(&v.to_le_bytes()),
            SynthDtype::F16 => out.extend_from_slice(&half::f16::from_f32(v).to_le_bytes()),
            SynthDtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
        }
    }
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    /// Uniform with the given standard deviation around 0 (matrices, biases).
    Spread(f32),
    /// Uniform within ±0.1 around 1 (norm weights: near the identity, but not equal to it,
    /// so that a norm applied with the wrong weight shows).
    NearOne,
}

struct Spec {
    name: String,
    shape: Vec<usize>,
    init: Init,
}

impl Spec {
    fn elements(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64
    }
}

fn specs(arch: SynthArch, d: &Dims) -> Vec<Spec> {
    // transformers' initializer_range for matrices; biases smaller.
    let (matrix, bias) = (Init::Spread(0.02), Init::Spread(0.01));
    let spec = |name: String, shape: Vec<usize>, init| Spec { name, shape, init };
    let (q, kv) = (d.heads * d.head_dim, d.kv_heads * d.head_dim);
    let mut out = vec![spec(
        "model.embed_tokens.weight".into(),
        vec![d.vocab, d.hidden],
        matrix,
    )];
    for l in 0..d.layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        out.push(spec(
            p("input_layernorm.weight"),
            vec![d.hidden],
            Init::NearOne,
        ));
        out.push(spec(
            p("self_attn.q_proj.weight"),
            vec![q, d.hidden],
            matrix,
        ));
        out.push(spec(
            p("self_attn.k_proj.weight"),
            vec![kv, d.hidden],
            matrix,
        ));
        out.push(spec(
            p("self_attn.v_proj.weight"),
            vec![kv, d.hidden],
            matrix,
        ));
        if arch == SynthArch::Qwen2 {
            out.push(spec(p("self_attn.q_proj.bias"), vec![q], bias));
            out.push(spec(p("self_attn.k_proj.bias"), vec![kv], bias));
            out.push(spec(p("self_attn.v_proj.bias"), vec![kv], bias));
        }
        if arch == SynthArch::Qwen3 {
            out.push(spec(
                p("self_attn.q_norm.weight"),
                vec![d.head_dim],
                Init::NearOne,
            ));
            out.push(spec(
                p("self_attn.k_norm.weight"),
                vec![d.head_dim],
                Init::NearOne,
            ));
        }
        out.push(spec(
            p("self_attn.o_proj.weight"),
            vec![d.hidden, q],
            matrix,
        ));
        out.push(spec(
            p("post_attention_layernorm.weight"),
            vec![d.hidden],
            Init::NearOne,
        ));
        out.push(spec(
            p("mlp.gate_proj.weight"),
            vec![d.ffn, d.hidden],
            matrix,
        ));
        out.push(spec(p("mlp.up_proj.weight"), vec![d.ffn, d.hidden], matrix));
        out.push(spec(
            p("mlp.down_proj.weight"),
            vec![d.hidden, d.ffn],
            matrix,
        ));
    }
    out.push(spec(
        "model.norm.weight".into(),
        vec![d.hidden],
        Init::NearOne,
    ));
    if !d.tied {
        out.push(spec(
            "lm_head.weight".into(),
            vec![d.vocab, d.hidden],
            matrix,
        ));
    }
    out
}

/// A stable 64-bit hash (FNV-1a), so that each tensor's values depend only on the seed and
/// its name, not on the order or sharding it is written in.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn io_error(path: &Path, source: std::io::Error) -> EngineError {
    EngineError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What [`write`] wrote.
pub(crate) struct Written {
    pub(crate) parameters: u64,
    pub(crate) bytes: u64,
    pub(crate) files: Vec<String>,
}

/// Writes every weight of the model into `dir`, calling `progress` after each file.
pub(crate) fn write(
    dir: &Path,
    arch: SynthArch,
    dims: &Dims,
    dtype: SynthDtype,
    seed: u64,
    max_shard_bytes: u64,
    progress: &mut dyn FnMut(&str),
) -> Result<Written> {
    let specs = specs(arch, dims);
    let size = |s: &Spec| s.elements() * dtype.bytes();
    let mut shards: Vec<Vec<&Spec>> = vec![Vec::new()];
    let mut shard_bytes = 0;
    for s in &specs {
        let last = shards.last_mut().expect("at least one shard");
        if !last.is_empty() && shard_bytes + size(s) > max_shard_bytes {
            shards.push(vec![s]);
            shard_bytes = size(s);
        } else {
            last.push(s);
            shard_bytes += size(s);
        }
    }
    let count = shards.len();
    let names: Vec<String> = if count == 1 {
        vec!["model.safetensors".into()]
    } else {
        (1..=count)
            .map(|i| format!("model-{i:05}-of-{count:05}.safetensors"))
            .collect()
    };
    let mut weight_map = BTreeMap::new();
    let total: u64 = specs.iter().map(size).sum();
    for (shard, file) in shards.iter().zip(&names) {
        write_shard(&dir.join(file), shard, dtype, seed)?;
        for s in shard {
            weight_map.insert(s.name.clone(), json!(file));
        }
        progress(&format!("wrote {file}"));
    }
    if count > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join("model.safetensors.index.json");
        let text = serde_json::to_string_pretty(&index).expect("JSON values serialize");
        std::fs::write(&path, text).map_err(|e| io_error(&path, e))?;
    }
    Ok(Written {
        parameters: specs.iter().map(Spec::elements).sum(),
        bytes: total,
        files: names,
    })
}

fn write_shard(path: &Path, specs: &[&Spec], dtype: SynthDtype, seed: u64) -> Result<()> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0u64;
    for s in specs {
        let end = offset + s.elements() * dtype.bytes();
        header.insert(
            s.name.clone(),
            json!({"dtype": dtype.safetensors_name(), "shape": s.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    // The data section starts 8-byte aligned; the header is padded with spaces.
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let file = File::create(path).map_err(|e| io_error(path, e))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut put = |bytes: &[u8]| out.write_all(bytes).map_err(|e| io_error(path, e));
    put(&(text.len() as u64).to_le_bytes())?;
    put(&text)?;
    let mut chunk = Vec::with_capacity(1 << 20);
    for s in specs {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ name_hash(&s.name));
        let mut left = s.elements();
        while left > 0 {
            chunk.clear();
            let n = left.min(1 << 18);
            for _ in 0..n {
                let u: f32 = rng.gen_range(-1.0..1.0);
                let v = match s.init {
                    // A uniform variable on [-a, a] has standard deviation a/√3.
                    Init::Spread(std) => u * std * 3f32.sqrt(),
                    Init::NearOne => 1.0 + 0.1 * u,
                };
                dtype.encode(v, &mut chunk);
            }
            put(&chunk)?;
            left -= n;
        }
    }
    out.flush().map_err(|e| io_error(path, e))
}
