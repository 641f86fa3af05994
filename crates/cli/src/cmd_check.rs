//! `quench check`: generate on a device, then judge the run with the f64 CPU reference,
//! teacher-forced on the device's tokens: every logit of every step within
//! `0.05 + 0.003·|ref|` and the same top token (or, at a near-tie, a token the reference
//! puts less than 1e-3 below its top). The bound is a constant of the engine,
//! written into the receipt before anything is dispatched; failures are recorded too.

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use quench_cpu::{StreamProgress, StreamStats};
use quench_engine::gpu::check::{judge_generation, LogitBound, Reference, StepVerdict};
use quench_engine::gpu::{DecodeTiming, GpuDecoder, GpuSummary, TensorParallel};
use quench_engine::{Device, GenerateOptions, LoadOptions, Prompt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::cmd_pull::{self, SMOLLM2};
use crate::model_args::{CodegenArg, KvCacheArg, RuntimeArg};
use crate::receipt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CheckDevice {
    /// An NVIDIA GPU.
    Cuda,
    /// quench's kernel interpreter on the CPU (the same kernels; slow, for small models).
    Interp,
}

#[derive(Args)]
pub struct CheckArgs {
    /// A pulled model's name or the path of a GGUF file or Hugging Face checkpoint
    /// directory [default: smollm2].
    #[arg(long, short = 'm', value_name = "NAME|PATH")]
    pub model: Option<String>,
    /// Where the generation runs.
    #[arg(long, value_enum, default_value = "cuda")]
    pub device: CheckDevice,
    /// The CUDA device.
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
    /// Prompts, one per line (blank lines skipped) [default: 8 built-in prompts, and on a
    /// GPU a table of at least 1,000 tokens where the context holds it].
    #[arg(long, value_name = "FILE")]
    pub prompts: Option<PathBuf>,
    /// Tokens generated (greedily) per prompt, each judged.
    #[arg(long, default_value_t = 64)]
    pub tokens: usize,
    /// Most positions of context the device's KV cache holds [default: the model's, at
    /// most 8192].
    #[arg(long, value_name = "TOKENS")]
    pub context: Option<usize>,
    /// The element type of the device's KV cache.
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_cache: KvCacheArg,
    /// Most prompt tokens one pass of the device's prompt path takes [default: 512]; 0
    /// feeds prompts one token per decode step.
    #[arg(long, value_name = "TOKENS")]
    pub prefill_chunk: Option<usize>,
    /// Where the kernels' machine code comes from.
    #[arg(long, value_enum, default_value = "ptx")]
    pub codegen: CodegenArg,
    /// With `--device cuda`: which runtime drives the GPU.
    #[arg(long, value_enum, default_value = "cuda")]
    pub backend: RuntimeArg,
    /// Split the model across N GPUs (from --gpu on) or N interpreters, each holding a
    /// share of every layer (its heads, FFN width and vocabulary must divide by N); the
    /// ranks' rows meet in host memory twice a layer.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub tensor_parallel: Option<u32>,
    /// After the check, time this many greedy decode steps (0: no timing).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub time_tokens: usize,
    /// The timed decode's prompt length (token ids (i·7919 + 13) mod vocab).
    #[arg(long, value_name = "N", default_value_t = 128)]
    pub time_prompt: usize,
    /// The model cache pulled models are found in (as for `quench pull --cache`).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Where to write the receipt.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "receipts/engine-check.json"
    )]
    pub receipt: PathBuf,
}

/// Prompts of different kinds (prose, lists, code, dialogue, numbers) for the default check.
const DEFAULT_PROMPTS: [&str; 8] = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here are three tips for staying healthy:\n1.",
    "Q: What is 17 multiplied by 23?\nA:",
    "The mitochondria is the powerhouse of the cell because",
    "User: Can you recommend a good book about space?\nAssistant:",
    "In 1969, the Apollo 11 mission",
];

/// The fewest tokens of the built-in long prompt: long enough that the prompt path
/// multiplies matrices of many rows and attends over a long causal span.
const LONG_PROMPT_TOKENS: usize = 1000;

/// The built-in long prompt: a table of products, one per line, grown until the model's
/// tokenizer makes at least [`LONG_PROMPT_TOKENS`] tokens of it, then a question about
/// it; with its tokens (`tokenize` gives a text's).
fn long_prompt(
    tokenize: &dyn Fn(&str) -> Result<Vec<u32>, String>,
) -> Result<(String, Vec<u32>), String> {
    const QUESTION: &str = "\nQ: According to the table, what is 7 × 12?\nA:";
    let mut table = String::from("A table of products, one per line:\n");
    // The count is checked every 12 lines (one multiplicand).
    let mut a = 2u32;
    loop {
        for b in 2..=13u32 {
            table.push_str(&format!("{a} × {b} = {}\n", a * b));
        }
        let prompt = format!("{table}{QUESTION}");
        let tokens = tokenize(&prompt)?;
        if tokens.len() >= LONG_PROMPT_TOKENS {
            return Ok((prompt, tokens));
        }
        a += 1;
    }
}

/// What the device produced for one prompt.
struct DeviceRun {
    prompt: String,
    prompt_tokens: Vec<u32>,
    outcome: Result<Generated, String>,
}

struct Generated {
    tokens: Vec<u32>,
    text: String,
    logits: Vec<Vec<f32>>,
    prefill_ms: f64,
    decode_ms: f64,
}

fn read_prompts(a: &CheckArgs) -> Result<Vec<String>, String> {
    let Some(path) = &a.prompts else {
        return Ok(DEFAULT_PROMPTS.iter().map(|p| p.to_string()).collect());
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let prompts: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.replace("\\n", "\n"))
        .collect();
    if prompts.is_empty() {
        return Err(format!("{}: no prompts (one per line)", path.display()));
    }
    Ok(prompts)
}

/// SHA-256 of each file of the checkpoint: the GGUF file, or a directory's JSON and
/// safetensors files.
fn checkpoint_hashes(path: &Path) -> Result<Value, String> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "json" || x == "safetensors")
            })
            .collect();
        v.sort();
        v
    } else {
        vec![path.to_owned()]
    };
    let mut out = serde_json::Map::new();
    for f in files {
        let mut file = std::fs::File::open(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = file
                .read(&mut buf)
                .map_err(|e| format!("{}: {e}", f.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let hex: String = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        out.insert(name, json!(hex));
    }
    Ok(Value::Object(out))
}

fn summary_json(s: &GpuSummary) -> Value {
    json!({
        "backend": s.backend,
        "dispatches_per_token": s.dispatches_per_token,
        "dispatches_per_layer": s.layer_dispatches,
        "layer_plan": s.layer_plan,
        "kernels_compiled": s.kernels,
        "weight_bytes": s.weight_bytes,
        "weight_bytes_per_token": s.weight_bytes_per_token,
        "arena_bytes": s.arena_bytes,
        "activation_bytes_unshared": s.activation_bytes,
        "kv_cache_bytes": s.kv_cache_bytes,
        "kv_cache": s.kv_cache.name(),
        "context": s.context,
        "graph_captured": s.graph_captured,
    })
}

fn timing_json(t: &DecodeTiming) -> Value {
    json!({
        "prompt_tokens": t.prompt_tokens,
        "prefill_ms_token_by_token": t.prefill_ms,
        "decode_steps": t.step_ms.len(),
        "ms_per_token_p50": t.quantile_ms(0.5),
        "ms_per_token_p90": t.quantile_ms(0.9),
        "tokens_per_s": t.tokens_per_second(),
        "weight_bytes_per_token": t.weight_bytes_per_token,
        "weight_gb_per_s_at_p50": t.weight_gbps(),
        "dispatches_per_token": t.dispatches_per_token,
        "method": "host wall time per greedy step: step record written, graph replayed, \
                   argmax read back; rate = (N−1)/(t(N)−t(1))",
    })
}

/// One failing step for the receipt.
fn failure_json(s: &StepVerdict) -> Value {
    json!({
        "position": s.position,
        "logits_outside": s.outside,
        "device_top1": s.device_top1,
        "reference_top1": s.reference_top1,
        "reference_gap": s.reference_gap,
        "worst": {
            "token": s.worst.token,
            "device": s.worst.device,
            "reference": s.worst.reference,
            "excess_over_bound": s.worst.excess,
        },
    })
}

/// What one reference pass took, for the receipt.
fn pass_json(p: &StreamStats) -> Value {
    json!({
        "tokens": p.tokens,
        "wall_ms": p.elapsed.as_secs_f64() * 1e3,
        "peak_weight_bytes": p.peak_weight_bytes,
        "peak_host_bytes_estimate": p.peak_host_bytes(),
    })
}

/// Shows a reference pass's progress on one line of stderr, rewritten in place.
fn report_progress(p: StreamProgress) {
    match p {
        StreamProgress::Layer { done, of } => eprint!("\r  layer {done}/{of}"),
        StreamProgress::Head { done, of } if done == of => {
            eprintln!("\r  layers done; output projection {done}/{of} rows")
        }
        StreamProgress::Head { done, of } => {
            eprint!("\r  layers done; output projection {done}/{of} rows")
        }
    }
}

/// Greedy generation on the device for every prompt — and, with the built-in prompts,
/// the long one where the context holds it. Every prompt is tokenized and measured
/// against the context before anything is generated.
fn generate_on_device(
    a: &CheckArgs,
    path: &Path,
    device: Device,
    mut prompts: Vec<String>,
) -> Result<(Vec<DeviceRun>, GpuSummary, Option<DecodeTiming>), String> {
    let options = LoadOptions {
        device,
        gpu: a.gpu,
        context_limit: a.context,
        kv_cache: a.kv_cache.into(),
        prefill_chunk: a.prefill_chunk,
        codegen: a.codegen.into(),
        runtime: a.backend.into(),
        tensor_parallel: a.tensor_parallel.map(|n| n as usize),
        ..LoadOptions::default()
    };
    let model = quench_engine::load(path, &options).map_err(|e| e.to_string())?;
    let model = model.causal().map_err(|e| e.to_string())?;
    let decoder = model.backend::<GpuDecoder>();
    let summary = match (decoder, model.backend::<TensorParallel>()) {
        (Some(d), _) => d.summary().clone(),
        (None, Some(tp)) => {
            eprintln!(
                "split across {} ranks (byte counts below are their totals)",
                tp.degree()
            );
            tp.summary()
        }
        (None, None) => return Err("the model was not put on the device".into()),
    };
    eprintln!(
        "on {}: {} dispatches per token ({:?} per layer), {} kernels, weights {:.1} MiB, \
         arena {:.1} KiB, KV cache {:.1} MiB ({}) for {} positions",
        summary.device,
        summary.dispatches_per_token,
        summary.layer_dispatches.first().copied().unwrap_or(0),
        summary.kernels,
        summary.weight_bytes as f64 / (1u64 << 20) as f64,
        summary.arena_bytes as f64 / 1024.0,
        summary.kv_cache_bytes as f64 / (1u64 << 20) as f64,
        summary.kv_cache.name(),
        summary.context
    );
    if let Some(note) = crate::model_args::widened_note(model.info()) {
        eprintln!("{note}");
    }
    let generate = GenerateOptions {
        max_tokens: a.tokens,
        keep_logits: true,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let tokenize = |p: &str| {
        model
            .prompt_tokens(Prompt::Text(p))
            .map_err(|e| format!("tokenizing a prompt: {e}"))
    };
    let context = summary.context;
    let mut tokenized = Vec::with_capacity(prompts.len() + 1);
    for (i, p) in prompts.iter().enumerate() {
        let t = tokenize(p)?;
        if t.len() + a.tokens > context {
            return Err(format!(
                "prompt {} has {} tokens: with --tokens {} it needs {} positions, but the \
                 context holds {context} (--context)",
                i + 1,
                t.len(),
                a.tokens,
                t.len() + a.tokens
            ));
        }
        tokenized.push(t);
    }
    if a.prompts.is_none() && device == Device::Interp {
        eprintln!("the built-in long prompt is left out on the interpreter (hours of work there)");
    } else if a.prompts.is_none() {
        let (long, tokens) = long_prompt(&tokenize)?;
        let n = tokens.len();
        if n + a.tokens <= context {
            prompts.push(long);
            tokenized.push(tokens);
        } else {
            eprintln!(
                "the built-in long prompt ({n} tokens) and {} generated tokens do not fit the \
                 context of {context} positions; it is left out",
                a.tokens
            );
        }
    }
    let mut runs = Vec::with_capacity(prompts.len());
    for (p, prompt_tokens) in prompts.iter().zip(tokenized) {
        eprintln!(
            "generating after a prompt of {} tokens",
            prompt_tokens.len()
        );
        let outcome = model
            .generate(
                &mut model.new_session(),
                Prompt::Tokens(&prompt_tokens),
                &generate,
                &mut |_| {},
            )
            .map_err(|e| e.to_string())
            .map(|g| Generated {
                text: g.text,
                tokens: g.tokens,
                logits: g.logits.unwrap_or_default(),
                prefill_ms: g.prefill_time.as_secs_f64() * 1e3,
                decode_ms: g.decode_time.as_secs_f64() * 1e3,
            });
        if let Err(e) = &outcome {
            eprintln!("generation failed for {p:?}: {e}");
        }
        runs.push(DeviceRun {
            prompt: p.clone(),
            prompt_tokens,
            outcome,
        });
    }
    // run() refuses --time-tokens with --tensor-parallel.
    let timing = match (a.time_tokens, decoder) {
        (0, _) | (_, None) => None,
        (n, Some(decoder)) => {
            let vocab = decoder.config().vocab as u64;
            let prompt: Vec<u32> = (0..a.time_prompt.max(1) as u64)
                .map(|i| ((i * 7919 + 13) % vocab) as u32)
                .collect();
            Some(decoder.time_decode(&prompt, n).map_err(|e| e.to_string())?)
        }
    };
    Ok((runs, summary, timing))
}

pub fn run(a: &CheckArgs) -> Result<(), String> {
    if a.tokens == 0 {
        return Err("--tokens must be at least 1".into());
    }
    if a.time_tokens > 0 && a.tensor_parallel.is_some() {
        return Err(
            "--time-tokens times a decoder on one device; leave out --tensor-parallel \
                    (or time it with quench bench)"
                .into(),
        );
    }
    // The bound is fixed here, before anything runs, and recorded as such.
    let bound = LogitBound::FP64_CHECK;
    let path = cmd_pull::resolve(a.model.as_deref(), SMOLLM2, a.cache.as_deref())?;
    let (backend, device) = match a.device {
        CheckDevice::Cuda => (Device::Cuda, crate::gpu::describe_on(a.gpu, a.backend)?),
        CheckDevice::Interp => (
            Device::Interp,
            json!({ "name": "quench kernel interpreter (sm_90 model)", "backend": "interp" }),
        ),
    };
    let hashes = checkpoint_hashes(&path)?;

    let (runs, summary, timing) = generate_on_device(a, &path, backend, read_prompts(a)?)?;
    let prompts: Vec<&str> = runs.iter().map(|r| r.prompt.as_str()).collect();
    eprintln!("judging with the f64 CPU reference, streamed a layer at a time ...");
    let reference = Reference::load(&path)
        .map_err(|e| e.to_string())?
        .with_progress(report_progress);
    let mut reference_ms = 0.0f64;
    let mut reference_peak_bytes = 0usize;

    let mut all_passed = true;
    let (mut steps_total, mut steps_failed) = (0usize, 0usize);
    let mut per_prompt = Vec::with_capacity(runs.len());
    for (i, run) in runs.iter().enumerate() {
        let g = match &run.outcome {
            Ok(g) => g,
            Err(e) => {
                all_passed = false;
                println!("prompt {}: FAILED to generate: {e}", i + 1);
                per_prompt.push(json!({ "prompt": run.prompt, "passed": false, "error": e }));
                continue;
            }
        };
        eprintln!(
            "reference for prompt {}: {} tokens",
            i + 1,
            run.prompt_tokens.len() + g.tokens.len() - 1
        );
        let verdicts =
            judge_generation(&reference, bound, &run.prompt_tokens, &g.tokens, &g.logits)
                .map_err(|e| e.to_string())?;
        let pass = reference.last_pass();
        if let Some(p) = &pass {
            reference_ms += p.elapsed.as_secs_f64() * 1e3;
            reference_peak_bytes = reference_peak_bytes.max(p.peak_host_bytes());
        }
        let failed: Vec<&StepVerdict> = verdicts.iter().filter(|s| !s.passed()).collect();
        let passed = failed.is_empty() && g.tokens.len() == a.tokens;
        all_passed &= passed;
        steps_total += verdicts.len();
        steps_failed += failed.len();
        let max_err = verdicts.iter().map(|s| s.max_abs_error).fold(0.0, f64::max);
        let worst = verdicts
            .iter()
            .map(|s| s.worst.excess)
            .fold(f64::NEG_INFINITY, f64::max);
        let top1 = verdicts
            .iter()
            .filter(|s| s.device_top1 == s.reference_top1)
            .count();
        let near_ties: Vec<&StepVerdict> = verdicts.iter().filter(|s| s.near_tie).collect();
        println!(
            "prompt {}: {} tokens, max |error| {max_err:.3e}, worst logit {worst:+.3e} past the \
             bound, top-1 {top1}/{}{}: {}",
            i + 1,
            g.tokens.len(),
            verdicts.len(),
            match near_ties.len() {
                0 => String::new(),
                n => format!(" ({n} near-tie{})", if n == 1 { "" } else { "s" }),
            },
            if passed { "pass" } else { "FAIL" }
        );
        per_prompt.push(json!({
            "prompt": run.prompt,
            "prompt_tokens": run.prompt_tokens,
            "tokens": g.tokens,
            "text": g.text,
            "passed": passed,
            "steps": verdicts.len(),
            "steps_failed": failed.len(),
            "top1_agreements": top1,
            "near_ties": near_ties.iter().map(|s| failure_json(s)).collect::<Vec<_>>(),
            "max_abs_error": max_err,
            "worst_excess_over_bound": worst,
            "max_abs_error_per_step": verdicts.iter().map(|s| s.max_abs_error).collect::<Vec<_>>(),
            "failures": failed.iter().take(16).map(|s| failure_json(s)).collect::<Vec<_>>(),
            "prefill_ms": g.prefill_ms,
            "decode_ms": g.decode_ms,
            "reference": pass.as_ref().map(pass_json),
        }));
    }
    if let Some(t) = &timing {
        println!(
            "decode: {:.3} ms/token p50, {:.3} p90, {:.1} tokens/s, {:.0} GB/s of weights, {} \
             dispatches per token",
            t.quantile_ms(0.5),
            t.quantile_ms(0.9),
            t.tokens_per_second(),
            t.weight_gbps(),
            t.dispatches_per_token
        );
    }
    let outcome = json!({
        "passed": all_passed,
        "steps": steps_total,
        "steps_failed": steps_failed,
        "prompts": per_prompt,
        "device_run": summary_json(&summary),
        "decode_timing": timing.as_ref().map(timing_json),
        "reference": {
            "wall_ms_total": reference_ms,
            "peak_host_bytes_estimate": reference_peak_bytes,
            "method": "one teacher-forced f64 pass per prompt over prompt and generated tokens; \
                       one layer's weights expanded at a time, the output projection in chunks \
                       of rows; host memory estimated from the weights held, the largest f32 \
                       tensor read whole and the activations (the mapped checkpoint aside)",
        },
    });
    let rec = receipt::receipt(
        "engine-check",
        device,
        json!({
            "model": path.display().to_string(),
            "checkpoint_sha256": hashes,
            "prompts": prompts,
            "tokens_per_prompt": a.tokens,
            "tensor_parallel": a.tensor_parallel,
            "decoding": "greedy on the device, end-of-sequence ignored",
            "reference": "quench-cpu f64 decoder streamed a layer at a time, teacher-forced \
                          on the device's tokens",
        }),
        json!({
            "logit_abs": bound.abs,
            "logit_rel": bound.rel,
            "near_tie_below": bound.near_tie,
            "rule": "for every step and every logit |device − f64| ≤ 0.05 + 0.003·|f64|, and \
                     the device's top token is the f64 reference's, or one whose f64 logit is \
                     less than near_tie_below under the reference's top (a near-tie, listed); \
                     fixed before dispatch",
        }),
        outcome,
    );
    receipt::write_json(&a.receipt, &rec)?;
    eprintln!("receipt: {}", a.receipt.display());
    if all_passed {
        println!("check passed: {steps_total} steps");
        Ok(())
    } else {
        Err(format!(
            "the check failed: {steps_failed} of {steps_total} steps outside the bound or with \
             another top token (details in {})",
            a.receipt.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table grows until the tokenizer given makes enough tokens of it, whatever it
    /// makes per line, and ends with its question.
    #[test]
    fn the_long_prompt_grows_to_the_tokens_asked_for() {
        for chars_per_token in [1, 4, 9] {
            let tokenize = |t: &str| Ok(vec![0u32; t.chars().count() / chars_per_token]);
            let (text, tokens) = long_prompt(&tokenize).expect("a prompt");
            assert!(tokens.len() >= LONG_PROMPT_TOKENS, "{chars_per_token}");
            let shorter = text.chars().count() / chars_per_token;
            assert!(
                shorter < LONG_PROMPT_TOKENS + 12 * 20,
                "grown much past the count"
            );
            assert!(text.ends_with("what is 7 × 12?\nA:"));
            assert_eq!(tokens, tokenize(&text).expect("tokens"));
        }
    }
}
