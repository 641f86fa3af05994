//! `quench info MODEL`: what a model is and what running it needs, from its headers.

use clap::Args;
use quench_engine::{inspect, Format, ModelKind};

use crate::model_args::{bytes, count, ModelArgs};

#[derive(Args)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A pulled model's name or a GGUF file / Hugging Face directory (same as --model).
    #[arg(value_name = "MODEL", conflicts_with = "model")]
    pub target: Option<String>,
    /// Print the GPU plan instead: every kernel dispatch of a decode step, with its
    /// launch and arguments (no GPU needed).
    #[arg(long)]
    pub dispatches: bool,
    /// With --dispatches: the step of this many rows (sequences).
    #[arg(long, default_value_t = 1, value_name = "N", requires = "dispatches")]
    pub rows: u32,
    /// With --dispatches: the step built for up to this many rows [default: --rows].
    #[arg(long, value_name = "N", requires = "dispatches")]
    pub max_batch: Option<usize>,
}

pub fn run(args: &InfoArgs) -> Result<(), String> {
    let given = args.target.as_deref().or(args.model.model.as_deref());
    let Some(given) = given else {
        return Err(
            "which model? `quench info smollm2`, or a GGUF file or checkpoint directory".into(),
        );
    };
    let path = crate::cmd_pull::resolve(Some(given), given, args.model.cache.as_deref())?;
    let mut options = args.model.load_options();
    if args.dispatches {
        if args.rows == 0 {
            return Err("--rows takes at least 1".into());
        }
        // With --prefill-chunk N, a prompt chunk of N tokens is listed too.
        let chunk = match args.model.prefill_chunk {
            None | Some(0) => None,
            Some(n) => {
                Some(u32::try_from(n).map_err(|_| format!("--prefill-chunk {n}: too large"))?)
            }
        };
        options.max_batch = Some(args.max_batch.unwrap_or(1).max(args.rows as usize));
        let lines = quench_engine::gpu::dispatch_listing(&path, &options, args.rows, chunk)
            .map_err(|e| e.to_string())?;
        for l in lines {
            println!("{l}");
        }
        return Ok(());
    }
    let info = inspect(&path, &options).map_err(|e| e.to_string())?;
    let c = &info.config;
    let format = match info.format {
        Format::Gguf => "GGUF",
        Format::HuggingFace => "Hugging Face (safetensors)",
        Format::InMemory => "built in memory",
    };
    let kind = match info.kind {
        ModelKind::Causal => "text generation",
        ModelKind::Embedding => "embeddings",
    };
    let types: Vec<String> = info
        .tensor_types
        .iter()
        .map(|(t, n)| format!("{t} × {n}"))
        .collect();
    let precision = if args.model.f64 { "f64" } else { "f32" };
    println!("model:        {}", info.path.display());
    println!("format:       {format}");
    println!("architecture: {} ({kind})", c.arch.name());
    println!(
        "parameters:   {} ({})",
        count(info.parameters),
        info.parameters
    );
    println!("tensors:      {}", types.join(", "));
    println!(
        "shape:        {} layers, hidden {}, {} heads ({} key/value) of {}, feed-forward {}, \
         vocabulary {}",
        c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab
    );
    println!(
        "context:      {} tokens trained, {} allowed",
        info.context_length, info.context_limit
    );
    println!("file:         {} of tensor data", bytes(info.file_bytes));
    match info.kind {
        ModelKind::Causal => println!(
            "memory:       {} = weights {} ({precision}) + KV cache {} at {} tokens",
            bytes(info.memory_bytes()),
            bytes(info.weight_bytes),
            bytes(info.kv_cache_bytes),
            info.context_limit
        ),
        ModelKind::Embedding => println!(
            "memory:       {} of weights ({precision})",
            bytes(info.weight_bytes)
        ),
    }
    if info.kind == ModelKind::Causal {
        println!("gpu:          {}", gpu_line(&path));
        if let Some(n) = args.model.tensor_parallel {
            println!(
                "split:        {}",
                split_line(c, n as usize, info.file_bytes)
            );
        }
    }
    Ok(())
}

/// What each GPU holds with the model split across `ranks` of them (`--tensor-parallel`),
/// or why it cannot be split so.
fn split_line(c: &quench_models::arch::ModelConfig, ranks: usize, file_bytes: u64) -> String {
    match quench_engine::gpu::tensor_parallel_share(c, ranks) {
        Ok(s) => format!(
            "{ranks} GPUs, each {} heads ({} key/value), feed-forward {}, vocabulary {} and \
             about {} of the tensor data (norms whole on every GPU)",
            s.heads,
            s.kv_heads,
            s.ffn,
            s.vocab,
            bytes(file_bytes / ranks as u64)
        ),
        Err(e) => format!("does not split: {e}"),
    }
}

/// How the GPU engine would take the model: every weight as stored, some expanded to f16
/// (which types, how many tensors), or refused (why).
fn gpu_line(path: &std::path::Path) -> String {
    let catalog = match quench_engine::gpu::gpu_catalog(path) {
        Ok(c) => c,
        Err(e) => return format!("does not run: {e}"),
    };
    if catalog.widened.is_empty() {
        return "every weight read as stored".into();
    }
    format!(
        "runs, expanding to F16 what it cannot read as stored: {}",
        crate::model_args::widened_list(&catalog.widened)
    )
}
