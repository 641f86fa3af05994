//! `quench quantize`: a Hugging Face checkpoint directory to a GGUF file with Q8_0, Q4_0 or
//! Q4_K weights, or one of llama.cpp's mixes (the k-quant ones and IQ4_XS), which quench
//! and llama.cpp load.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use quench_models::hf_to_gguf::{convert, ConvertOptions, Progress, TargetType};

use crate::model_args::{bytes, count};

#[derive(Args)]
pub struct QuantizeArgs {
    /// Weight type: q8_0, q4_0 or q4_k (every matrix in that type, the token embedding and
    /// LM head in Q8_0), or one of llama.cpp's mixes with its per-tensor rules: q4_k_m, q5_k_m,
    /// q6_k, q3_k_m, q2_k, iq4_xs.
    #[arg(long = "type", value_name = "TYPE")]
    pub target: String,
    /// Replace OUTPUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Threads quantizing (default: one per core).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
    /// The checkpoint directory: config.json, model.safetensors (or shards with
    /// model.safetensors.index.json), tokenizer.json, tokenizer_config.json.
    pub input: PathBuf,
    /// The GGUF file to write.
    pub output: PathBuf,
}

pub fn run(args: &QuantizeArgs) -> Result<(), String> {
    let target = TargetType::from_name(&args.target).ok_or_else(|| {
        let names: Vec<&str> = TargetType::ALL.iter().map(|t| t.name()).collect();
        format!(
            "unknown type {:?}; types: {}",
            args.target,
            names.join(", ")
        )
    })?;
    if args.output.exists() && !args.force {
        return Err(format!(
            "{} exists; pass --force to replace it",
            args.output.display()
        ));
    }
    let options = ConvertOptions {
        target,
        threads: args.threads,
    };
    let start = Instant::now();
    let summary = convert(&args.input, &args.output, &options, &mut |p| match p {
        Progress::Note(note) => eprintln!("note: {note}"),
        Progress::Tensor {
            index,
            count,
            name,
            ggml_type,
            dims,
            read,
            written,
        } => eprintln!(
            "[{index:>width$}/{count}] {name:<28} {:<5} {dims:?}  {} -> {}",
            ggml_type.name(),
            bytes(read),
            bytes(written),
            width = count.to_string().len(),
        ),
    })
    .map_err(|e| e.to_string())?;
    let types: Vec<String> = summary
        .tensor_types
        .iter()
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    eprintln!(
        "wrote {}: {} {} parameters in {} tensors ({}), {} from {} in {:.1} s",
        args.output.display(),
        summary.arch.gguf_name(),
        count(summary.parameters),
        summary.tensor_types.values().sum::<usize>(),
        types.join(", "),
        bytes(summary.file_bytes),
        bytes(summary.bytes_read),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
