//! `quench bench --device cuda`: decode speed of a model on the GPU through quench's own
//! kernels and replayed step graph, against the device-to-device copy bandwidth measured in
//! the same run, with a receipt.
//!
//! Each timed run feeds a fixed prompt, then decodes greedily on the device; the decode
//! rate is `(N − 1) / (t(N) − t(1))` (the first token comes from the prompt), and the
//! bandwidth it achieves counts the weight bytes one step reads. The prompt goes through
//! the prompt path in chunks (tensor-core GEMMs over the chunk's tokens) where the model
//! has one; its rate is also given in TFLOP/s of the layers' matrix products,
//! `2 · matrix weights · prompt tokens / prompt time`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use quench_engine::gpu::{DecodeTiming, GpuDecoder, GpuSummary, TensorParallel};
use quench_engine::{Device, LoadOptions};
use serde_json::{json, Value};

use crate::cmd_bench::{median, percentile, prompt_ids, BenchArgs};
use crate::cmd_check_kernels::copy_bandwidth_gbps;
use crate::model_args::{bytes, summary, RuntimeArg};
use crate::{cmd_pull, receipt};

/// Copies of 1 GiB timed for each bandwidth measurement.
const COPY_REPS: u32 = 20;

/// The rates of the timed runs.
struct Rates {
    prefill_tokens_per_s: f64,
    prefill_tflops: f64,
    decode_tokens_per_s: f64,
    ms_per_token_p50: f64,
    ms_per_token_p90: f64,
    runs: Vec<Value>,
}

fn rates(timings: &[DecodeTiming]) -> Rates {
    let steps: Vec<f64> = timings
        .iter()
        .flat_map(|t| t.step_ms.iter().copied())
        .collect();
    Rates {
        prefill_tokens_per_s: median(
            timings
                .iter()
                .map(DecodeTiming::prefill_tokens_per_second)
                .collect(),
        ),
        prefill_tflops: median(timings.iter().map(DecodeTiming::prefill_tflops).collect()),
        decode_tokens_per_s: median(
            timings
                .iter()
                .map(DecodeTiming::tokens_per_second)
                .collect(),
        ),
        ms_per_token_p50: percentile(steps.clone(), 50.0),
        ms_per_token_p90: percentile(steps, 90.0),
        runs: timings
            .iter()
            .map(|t| {
                json!({
                    "prefill_ms": t.prefill_ms,
                    "prefill_tokens_per_s": t.prefill_tokens_per_second(),
                    "prefill_tflops": t.prefill_tflops(),
                    "decode_tokens_per_s": t.tokens_per_second(),
                    "ms_per_token_p50": t.quantile_ms(0.5),
                    "ms_per_token_p90": t.quantile_ms(0.9),
                })
            })
            .collect(),
    }
}

fn summary_json(s: &GpuSummary) -> Value {
    json!({
        "dispatches_per_token": s.dispatches_per_token,
        "dispatches_per_layer": s.layer_dispatches.first(),
        "layer_plan": s.layer_plan,
        "kernels": s.kernels,
        "weight_bytes": s.weight_bytes,
        "weight_bytes_per_token": s.weight_bytes_per_token,
        "kv_cache_bytes": s.kv_cache_bytes,
        "kv_cache": s.kv_cache.name(),
        "context": s.context,
        "graph_captured": s.graph_captured,
        "decode_products": if s.tensor_core_products > 0 {
            format!("{} products a step on the tensor cores (gemv_tc), the rest matrix–vector kernels", s.tensor_core_products)
        } else {
            "matrix–vector kernels".to_string()
        },
        // Tensors expanded to f16 at upload (none where every weight is read as stored).
        "expanded_to_f16": quench_engine::gpu::Widened::counts(&s.widened),
        "prefill_chunk": s.prefill_chunk,
        "prefill_dispatches_per_chunk": s.prefill_dispatches,
        "prefill_layer_plan": s.prefill_layer_plan,
        "prefill_arena_bytes": s.prefill_arena_bytes,
    })
}

/// The copy bandwidth of GPUs `ordinal .. ordinal + gpus` together (each measured on an
/// executor of its own on `runtime`, freed again before the model's timed runs).
fn copy_bandwidth(ordinal: u32, gpus: u32, runtime: RuntimeArg) -> Result<f64, String> {
    let mut total = 0.0;
    for gpu in ordinal..ordinal + gpus {
        let mut exec = crate::gpu::executor(gpu, runtime)?;
        total += copy_bandwidth_gbps(exec.as_mut(), COPY_REPS)?;
    }
    Ok(total)
}

/// The benchmarked decoder: on one GPU, or split across several.
enum OnGpus<'a> {
    One(&'a GpuDecoder),
    Split(&'a TensorParallel),
}

impl OnGpus<'_> {
    fn summary(&self) -> GpuSummary {
        match self {
            OnGpus::One(d) => d.summary().clone(),
            OnGpus::Split(tp) => tp.summary(),
        }
    }

    fn time_decode(&self, prompt: &[u32], tokens: usize) -> Result<DecodeTiming, String> {
        match self {
            OnGpus::One(d) => d.time_decode(prompt, tokens),
            OnGpus::Split(tp) => tp.time_decode(prompt, tokens),
        }
        .map_err(|e| e.to_string())
    }
}

pub fn run(a: &BenchArgs, receipt_path: &Path) -> Result<(), String> {
    let ordinal = a.gpu;
    let device = crate::gpu::describe_on(ordinal, a.backend)?;
    let path: PathBuf = cmd_pull::resolve(a.model.as_deref(), "smollm2", a.cache.as_deref())?;
    let gpus = a.tensor_parallel.unwrap_or(1);
    let copy_before = copy_bandwidth(ordinal, gpus, a.backend)?;
    eprintln!("device-to-device copy: {copy_before:.0} GB/s");

    let start = Instant::now();
    let options = LoadOptions {
        device: Device::Cuda,
        gpu: ordinal,
        context_limit: Some(a.prompt_tokens + a.gen_tokens),
        tensor_core_decode: a.tensor_core_decode,
        kv_cache: a.kv_cache.into(),
        prefill_chunk: Some(a.prefill_chunk),
        codegen: a.codegen.into(),
        runtime: a.backend.into(),
        tensor_parallel: a.tensor_parallel.map(|n| n as usize),
        ..LoadOptions::default()
    };
    let loaded = quench_engine::load(&path, &options).map_err(|e| e.to_string())?;
    let model = loaded.causal().map_err(|e| e.to_string())?;
    let load_s = start.elapsed().as_secs_f64();
    let info = model.info().clone();
    let decoder = match (
        model.backend::<GpuDecoder>(),
        model.backend::<TensorParallel>(),
    ) {
        (Some(d), _) => OnGpus::One(d),
        (None, Some(tp)) => OnGpus::Split(tp),
        (None, None) => return Err("the model was not put on the GPU".into()),
    };
    let s = decoder.summary();
    eprintln!(
        "loaded {} in {load_s:.1} s: {} dispatches per token, {} of weights read per token",
        summary(&info),
        s.dispatches_per_token,
        bytes(s.weight_bytes_per_token)
    );
    if let Some(note) = crate::model_args::widened_note(&info) {
        eprintln!("{note}");
    }
    let prompt = prompt_ids(a.prompt_tokens, info.config.vocab);
    // Warm-up: compiles nothing new, but settles clocks and caches (the whole prompt, so
    // that the prompt path is warm too), and no more tokens than the timed runs take, which
    // is what the context was sized for.
    decoder.time_decode(&prompt, a.gen_tokens.min(8))?;
    let mut timings = Vec::with_capacity(a.repeats);
    for i in 0..a.repeats {
        let t = decoder.time_decode(&prompt, a.gen_tokens)?;
        eprintln!(
            "run {}/{}: decode {:.1} tokens/s",
            i + 1,
            a.repeats,
            t.tokens_per_second()
        );
        timings.push(t);
    }
    // Host time combining the ranks' rows, over every step taken (warm-up included).
    let split = match decoder {
        OnGpus::One(_) => None,
        OnGpus::Split(tp) => {
            let (steps, combining) = tp.combining();
            Some(json!({
                "ranks": tp.degree(),
                "combine_ms_per_step": combining.as_secs_f64() * 1e3 / steps.max(1) as f64,
                "combine_note": "the ranks' rows meet in host memory: the embedding gather and \
                                 two sums a layer, each a read from every rank and a write to \
                                 every rank",
            }))
        }
    };
    // The weights and KV cache leave the device before the second copy measurement.
    drop(loaded);
    let copy_after = copy_bandwidth(ordinal, gpus, a.backend)?;
    let copy = (copy_before + copy_after) / 2.0;
    let r = rates(&timings);
    let weight_gbps = s.weight_bytes_per_token as f64 * r.decode_tokens_per_s / 1e9;
    let percent = 100.0 * weight_gbps / copy;
    let meets = json!({
        "decode_tokens_per_s": a.target_tokens_per_s.map(|t| r.decode_tokens_per_s >= t),
        "percent_of_copy": a.target_percent.map(|t| percent >= t),
    });
    let prefill_how = match s.prefill_chunk {
        0 => "one decode step per token".to_string(),
        c => format!("chunks of up to {c} tokens"),
    };
    let outcome = json!({
        "prefill_tokens_per_s": r.prefill_tokens_per_s,
        "prefill_tflops": r.prefill_tflops,
        "prefill_note": format!(
            "the prompt is fed in {prefill_how}; TFLOP/s = 2 · {} matrix weights · prompt tokens / prompt time \
             (the time includes attention, norms and reading the next token back)",
            quench_engine::gpu::matrix_params(&info.config)
        ),
        "prefill_precision_note": "the prompt path's matrix products multiply f16 activations and \
                                   weights on the tensor cores, summed in f32 (quench check judges it)",
        "decode_tokens_per_s": r.decode_tokens_per_s,
        "ms_per_token_p50": r.ms_per_token_p50,
        "ms_per_token_p90": r.ms_per_token_p90,
        "weight_gbps": weight_gbps,
        "percent_of_copy_bandwidth": percent,
        "copy_bandwidth_gbps": { "before": copy_before, "after": copy_after, "mean": copy },
        "graph": summary_json(&s),
        "tensor_parallel": split,
        "runs": r.runs,
        "meets_target": meets,
    });
    let model_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let rec = receipt::receipt(
        "gpu-bench",
        device,
        json!({
            "model": model_name,
            "architecture": info.config.arch.name(),
            "parameters": info.parameters,
            "tensor_types": info.tensor_types,
            "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens,
            "repeats_after_warm_up": a.repeats,
            "decoding": match a.tensor_parallel {
                None => "greedy on the device (argmax kernel); prompt ids (i·7919 + 13) mod vocab",
                Some(_) => "greedy on the host from the ranks' gathered logits; prompt ids \
                            (i·7919 + 13) mod vocab",
            },
            "tensor_parallel": a.tensor_parallel,
        }),
        json!({
            "decode_tokens_per_s_at_least": a.target_tokens_per_s,
            "percent_of_copy_at_least": a.target_percent,
            "rule": "rates are medians over the runs; decode rate = (N−1)/(t(N)−t(1)); \
                     percent of copy = weight bytes per token × decode rate / copy bandwidth",
        }),
        outcome.clone(),
    );
    receipt::write_json(receipt_path, &rec)?;
    if a.json {
        receipt::print_json(&outcome)?;
    } else {
        println!(
            "{model_name} on {}: prompt {} tokens, {} generated, median of {}",
            rec["device"]["name"].as_str().unwrap_or("the GPU"),
            a.prompt_tokens,
            a.gen_tokens,
            a.repeats
        );
        println!(
            "prefill {:.1} tokens/s, {:.2} TFLOP/s ({prefill_how}) · decode {:.1} tokens/s · \
             {:.3} ms/token p50, {:.3} p90",
            r.prefill_tokens_per_s,
            r.prefill_tflops,
            r.decode_tokens_per_s,
            r.ms_per_token_p50,
            r.ms_per_token_p90
        );
        println!(
            "{} dispatches per token · {} of weights per token · {weight_gbps:.0} GB/s = \
             {percent:.1}% of the {copy:.0} GB/s copy bandwidth",
            s.dispatches_per_token,
            bytes(s.weight_bytes_per_token)
        );
        println!("receipt: {}", receipt_path.display());
    }
    let missed = [
        a.target_tokens_per_s
            .filter(|t| r.decode_tokens_per_s < *t)
            .map(|t| {
                format!(
                    "decode {:.1} tokens/s is below the target {t}",
                    r.decode_tokens_per_s
                )
            }),
        a.target_percent
            .filter(|t| percent < *t)
            .map(|t| format!("{percent:.1}% of copy is below the target {t}%")),
    ];
    match missed.into_iter().flatten().collect::<Vec<_>>() {
        m if m.is_empty() => Ok(()),
        m => Err(m.join("; ")),
    }
}
