//! Seeds from `quench synth`: a tiny checkpoint of each decoder architecture in the exact
//! Hugging Face layout (config.json, tokenizer.json, tokenizer_config.json with its chat
//! template, safetensors), and the same checkpoint converted to GGUF by the converter
//! `quench quantize` uses. Built once per process, in a temporary directory.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use quench_engine::synth::{synthesize, SynthArch, SynthDtype, SynthOptions, SynthShape};
use quench_models::hf_to_gguf::{convert, ConvertOptions, TargetType};

/// The files of one synthetic checkpoint.
pub struct Checkpoint {
    pub config: Vec<u8>,
    pub tokenizer: Vec<u8>,
    pub tokenizer_config: Vec<u8>,
    pub safetensors: Vec<Vec<u8>>,
    pub gguf: Vec<u8>,
}

/// Removes the directory when done, failure or not.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn build(arch: SynthArch, dtype: SynthDtype, target: TargetType) -> Checkpoint {
    let dir = TempDir(std::env::temp_dir().join(format!(
        "quench-fuzz-{}-{}",
        std::process::id(),
        arch.name()
    )));
    let options = SynthOptions {
        arch,
        shape: SynthShape::Tiny,
        seed: 1,
        dtype,
        max_shard_bytes: SynthOptions::DEFAULT_SHARD_BYTES,
    };
    let summary = synthesize(&dir.0, &options, &mut |_| {})
        .unwrap_or_else(|e| panic!("synthesizing a tiny {} checkpoint: {e}", arch.name()));
    let gguf = dir.0.join("model.gguf");
    let convert_options = ConvertOptions { target, threads: 1 };
    convert(&dir.0, &gguf, &convert_options, &mut |_| {})
        .unwrap_or_else(|e| panic!("converting the tiny {} checkpoint: {e}", arch.name()));
    Checkpoint {
        config: read(&dir.0.join("config.json")),
        tokenizer: read(&dir.0.join("tokenizer.json")),
        tokenizer_config: read(&dir.0.join("tokenizer_config.json")),
        safetensors: summary
            .weight_files
            .iter()
            .map(|f| read(&dir.0.join(f)))
            .collect(),
        gguf: read(&gguf),
    }
}

/// Tiny llama (BF16 weights, Q8_0 GGUF), qwen2 (F16, Q4_0) and qwen3 (F32, Q4_K).
pub fn checkpoints() -> &'static [Checkpoint] {
    static ALL: OnceLock<Vec<Checkpoint>> = OnceLock::new();
    ALL.get_or_init(|| {
        vec![
            build(SynthArch::Llama, SynthDtype::Bf16, TargetType::Q8_0),
            build(SynthArch::Qwen2, SynthDtype::F16, TargetType::Q4_0),
            build(SynthArch::Qwen3, SynthDtype::F32, TargetType::Q4_K),
        ]
    })
}
