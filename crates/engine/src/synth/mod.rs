//! Synthetic checkpoints: seeded random weights in the exact Hugging Face layout of real
//! models (`config.json`, safetensors, `tokenizer.json`, `tokenizer_config.json` with a chat
//! template), for testing loaders and kernels at real shapes without downloading weights.
//!
//! The weights are drawn at transformers' initialization scale, so every logit is finite but
//! the text is meaningless. The tokenizer is small (byte-level BPE: 256 bytes, a few merges,
//! the special tokens); `vocab_size` keeps the real model's value, the rows past the
//! tokenizer being padding, as in real checkpoints. The special token ids in `config.json`
//! are those of this tokenizer.
//!
//! [`TinyBert`] is a small encoder of the same kind built in memory, with no files;
//! [`tiny_chat_model`] and [`tiny_embedding_model`] are whole models built that way (a chat
//! model and a sentence embedder that load in milliseconds, for trying the server without
//! a checkpoint and for tests). [`write_tiny_embedder`] writes that embedder to files
//! (safetensors or GGUF), optionally with a NaN or infinite weight, for tests of loading
//! and of refusing damaged numbers.

mod shapes;
mod tiny_bert;
mod tiny_chat;
mod tiny_embed;
mod tokenizer;
mod weights;

use std::path::Path;

use serde_json::{json, Value};

pub use shapes::{SynthArch, SynthShape};
pub use tiny_bert::TinyBert;
pub use tiny_chat::{tiny_chat_config, tiny_chat_model};
pub use tiny_embed::{
    tiny_embedding_config, tiny_embedding_model, write_tiny_embedder, EmbedderFormat,
};
pub use weights::SynthDtype;

use crate::error::{EngineError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynthOptions {
    pub arch: SynthArch,
    pub shape: SynthShape,
    pub seed: u64,
    pub dtype: SynthDtype,
    /// Largest safetensors file; past it the weights are sharded with an index, as
    /// transformers saves them.
    pub max_shard_bytes: u64,
}

impl SynthOptions {
    /// Shards of at most 4 GB.
    pub const DEFAULT_SHARD_BYTES: u64 = 4_000_000_000;
}

/// What [`synthesize`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SynthSummary {
    pub parameters: u64,
    /// Bytes of tensor data.
    pub weight_bytes: u64,
    /// The safetensors files, in order.
    pub weight_files: Vec<String>,
}

fn write_json(dir: &Path, name: &str, value: &Value) -> Result<()> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(&path, text + "\n").map_err(|source| EngineError::Io { path, source })
}

/// Writes a synthetic checkpoint into `dir` (created if missing), calling `progress` with a
/// line after each file.
pub fn synthesize(
    dir: &Path,
    options: &SynthOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<SynthSummary> {
    std::fs::create_dir_all(dir).map_err(|source| EngineError::Io {
        path: dir.to_owned(),
        source,
    })?;
    // The tokenizer's ids go into config.json; its size does not depend on the shape.
    let probe = tokenizer::tokenizer(options.arch, 0);
    let (mut config, dims) = shapes::config(
        options.arch,
        options.shape,
        options.dtype.torch_name(),
        probe.bos_id,
        probe.eos_id,
    )?;
    let max_positions = config["max_position_embeddings"].as_u64().unwrap_or(0) as usize;
    let tok = tokenizer::tokenizer(options.arch, max_positions);
    debug_assert!(tok.len <= dims.vocab, "the embedding covers the tokenizer");
    config["transformers_version"] = json!("4.51.0");
    write_json(dir, "config.json", &config)?;
    write_json(
        dir,
        "generation_config.json",
        &json!({"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id}),
    )?;
    write_json(dir, "tokenizer.json", &tok.tokenizer_json)?;
    write_json(dir, "tokenizer_config.json", &tok.tokenizer_config)?;
    progress("wrote config.json, generation_config.json, tokenizer.json, tokenizer_config.json");
    let written = weights::write(
        dir,
        options.arch,
        &dims,
        options.dtype,
        options.seed,
        options.max_shard_bytes,
        progress,
    )?;
    Ok(SynthSummary {
        parameters: written.parameters,
        weight_bytes: written.bytes,
        weight_files: written.files,
    })
}
