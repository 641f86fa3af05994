//! `quench synth`: a seeded random checkpoint in the exact Hugging Face layout of a real
//! model, for testing at real shapes without downloading weights.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use quench_engine::synth::{synthesize, SynthArch, SynthDtype, SynthOptions, SynthShape};

use crate::model_args::{bytes, count};

#[derive(Args)]
pub struct SynthArgs {
    /// llama, qwen2 or qwen3 (implied by a real model's shape).
    #[arg(long)]
    pub arch: Option<String>,
    /// tiny, qwen2.5-0.5b, llama-3.2-1b, llama-3.1-8b, qwen2.5-7b or qwen3-8b.
    #[arg(long)]
    pub shape: String,
    /// Seed of the weights: the same seed gives the same files.
    #[arg(long)]
    pub seed: u64,
    /// bf16, f16 or f32.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// The directory to write (created if missing).
    pub out: PathBuf,
}

pub fn run(args: &SynthArgs) -> Result<(), String> {
    let shape = SynthShape::from_name(&args.shape).ok_or_else(|| {
        let names: Vec<&str> = SynthShape::ALL.iter().map(|s| s.name()).collect();
        format!(
            "unknown shape {:?}; shapes: {}",
            args.shape,
            names.join(", ")
        )
    })?;
    let arch = match (&args.arch, shape.arch()) {
        (Some(name), _) => SynthArch::from_name(name).ok_or_else(|| {
            format!("unknown architecture {name:?}; architectures: llama, qwen2, qwen3")
        })?,
        (None, Some(arch)) => arch,
        (None, None) => return Err("the tiny shape needs --arch llama, qwen2 or qwen3".into()),
    };
    let dtype = SynthDtype::from_name(&args.dtype)
        .ok_or_else(|| format!("unknown dtype {:?}; dtypes: bf16, f16, f32", args.dtype))?;
    let options = SynthOptions {
        arch,
        shape,
        seed: args.seed,
        dtype,
        max_shard_bytes: SynthOptions::DEFAULT_SHARD_BYTES,
    };
    let start = Instant::now();
    let summary = synthesize(&args.out, &options, &mut |line| eprintln!("{line}"))
        .map_err(|e| e.to_string())?;
    eprintln!(
        "{} {} with {} parameters ({} of {}) in {}, {:.1} s",
        arch.name(),
        shape.name(),
        count(summary.parameters),
        bytes(summary.weight_bytes),
        args.dtype,
        args.out.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
