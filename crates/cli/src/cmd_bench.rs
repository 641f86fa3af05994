//! `quench bench`: prefill and decode speed with a receipt. On the CPU (a GGUF model),
//! optionally beside llama.cpp on the same machine, model, prompt length and thread count in
//! the same run; on the GPU ([`crate::bench_gpu`]), against the copy bandwidth measured in
//! the same run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use quench_cpu::{Decoder, Logits};
use quench_engine::generate::argmax;
use quench_models::arch::{ModelConfig, Naming};
use quench_models::GgufFile;
use serde_json::{json, Value};

use crate::cmd_pull;
use crate::model_args::{CodegenArg, DeviceArg, KvCacheArg, RuntimeArg};
use crate::receipt;

/// The decode speed quench's CPU path aims at, as a fraction of llama.cpp's on the same
/// machine: at least as fast.
const TARGET_RATIO: f64 = 1.0;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Where the model runs.
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// A pulled model's name or the path of a GGUF file (on the GPU also a Hugging Face
    /// checkpoint directory) [default: smollm2].
    #[arg(long, short = 'm', value_name = "NAME|PATH")]
    pub model: Option<String>,
    /// The model cache pulled models are found in (as for `quench pull --cache`).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Prompt length fed in one prefill.
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// Tokens generated greedily, the first from the prompt's logits (at least 2).
    #[arg(long, default_value_t = 64)]
    pub gen_tokens: usize,
    /// The GPU to run on (`--device cuda`).
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
    /// Fail unless decode reaches this many tokens/s (`--device cuda`; recorded in the
    /// receipt).
    #[arg(long, value_name = "TOKENS_PER_S")]
    pub target_tokens_per_s: Option<f64>,
    /// Fail unless the weight bytes read per second at the decode rate reach this
    /// percentage of the copy bandwidth (`--device cuda`; recorded in the receipt).
    #[arg(long, value_name = "PERCENT")]
    pub target_percent: Option<f64>,
    /// CPU threads, for quench and llama.cpp alike.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Timed runs of each engine after a warm-up, taken in turns; rates are medians.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Also time llama.cpp (through llama-cpp-python) on the same workload (CPU only).
    #[arg(long)]
    pub vs_llama_cpp: bool,
    /// Python interpreter that has llama-cpp-python installed.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The llama.cpp timing script.
    #[arg(long, default_value = "scripts/bench/llama_cpp_bench.py")]
    pub llama_cpp_script: PathBuf,
    /// Where to write the receipt [default: receipts/cpu-bench.json, or
    /// receipts/gpu-bench.json with `--device cuda`].
    #[arg(long)]
    pub receipt: Option<PathBuf>,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// With `--device cuda`: time decode steps whose bf16 products run on the tensor cores
    /// (as `quench serve` runs them) instead of the matrix–vector kernels.
    #[arg(long)]
    pub tensor_core_decode: bool,
    /// With `--device cuda`: the element type of the KV cache.
    #[arg(long, value_enum, default_value = "f16")]
    pub kv_cache: KvCacheArg,
    /// With `--device cuda`: most prompt tokens one pass of the prompt path takes
    /// (longer chunks multiply larger matrices and take more activation memory; 0 feeds
    /// the prompt one token a step).
    #[arg(long, default_value_t = quench_engine::gpu::DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    /// With `--device cuda`: where the kernels' machine code comes from.
    #[arg(long, value_enum, default_value = "ptx")]
    pub codegen: CodegenArg,
    /// With `--device cuda`: which runtime drives the GPU.
    #[arg(long, value_enum, default_value = "cuda")]
    pub backend: RuntimeArg,
    /// With `--device cuda`: split the model across N GPUs (from --gpu on), each holding a
    /// share of every layer; the ranks' rows meet in host memory twice a layer. The copy
    /// bandwidth is then the GPUs' sum.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub tensor_parallel: Option<u32>,
}

/// One timed run: seconds from its start to the end of prefill and to each generated token.
struct Run {
    prefill_s: f64,
    token_times_s: Vec<f64>,
}

/// Rates of one engine over the timed runs.
struct Summary {
    prefill_tokens_per_s: f64,
    /// `(N − 1) / (t(N) − t(1))`: generated tokens after the first, over the time they took.
    decode_tokens_per_s: f64,
    ms_per_token_p50: f64,
    ms_per_token_p90: f64,
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Nearest-rank percentile of a non-empty sample.
pub(crate) fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Every run has at least two token times (checked on the arguments).
fn summarize(runs: &[Run], prompt_tokens: usize) -> Summary {
    let decode = runs.iter().map(|r| {
        let t = &r.token_times_s;
        (t.len() - 1) as f64 / (t[t.len() - 1] - t[0])
    });
    let steps_ms: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.token_times_s.windows(2).map(|w| (w[1] - w[0]) * 1e3))
        .collect();
    Summary {
        prefill_tokens_per_s: median(
            runs.iter()
                .map(|r| prompt_tokens as f64 / r.prefill_s)
                .collect(),
        ),
        decode_tokens_per_s: median(decode.collect()),
        ms_per_token_p50: percentile(steps_ms.clone(), 50.0),
        ms_per_token_p90: percentile(steps_ms, 90.0),
    }
}

fn summary_json(s: &Summary) -> Value {
    json!({
        "prefill_tokens_per_s": s.prefill_tokens_per_s,
        "decode_tokens_per_s": s.decode_tokens_per_s,
        "ms_per_token_p50": s.ms_per_token_p50,
        "ms_per_token_p90": s.ms_per_token_p90,
    })
}

/// A fixed prompt of `n` ids spread over the vocabulary (the speed does not depend on which
/// tokens they are, only on how many).
pub(crate) fn prompt_ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

/// quench's f32 CPU decoder: prefill the prompt, then greedy decode, timed per token.
fn time_quench(decoder: &Decoder<f32>, prompt: &[u32], gen_tokens: usize) -> Result<Run, String> {
    let mut cache = decoder.new_cache_with_limit(prompt.len() + gen_tokens);
    let start = Instant::now();
    let mut logits = decoder
        .forward(&mut cache, prompt, Logits::Last)
        .map_err(|e| format!("prefill: {e}"))?;
    let prefill_s = start.elapsed().as_secs_f64();
    let mut token_times_s = Vec::with_capacity(gen_tokens);
    for k in 0..gen_tokens {
        if k > 0 {
            let token = argmax(logits.row(0)).ok_or("the model returned no logits, or only NaN")?;
            logits = decoder
                .forward(&mut cache, &[token], Logits::Last)
                .map_err(|e| format!("decode step {k}: {e}"))?;
        }
        token_times_s.push(start.elapsed().as_secs_f64());
    }
    // The last token is picked too, as llama.cpp's timing script does.
    argmax(logits.row(0)).ok_or("the model returned no logits, or only NaN")?;
    Ok(Run {
        prefill_s,
        token_times_s,
    })
}

/// llama.cpp's timings from the script, which prints them as one JSON object.
fn time_llama_cpp(
    a: &BenchArgs,
    model: &Path,
    prompt: &[u32],
) -> Result<(Vec<Run>, Value), String> {
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let out = Command::new(&a.python)
        .arg(&a.llama_cpp_script)
        .arg("--model")
        .arg(model)
        .args(["--prompt-ids", &ids.join(",")])
        .args(["--gen-tokens", &a.gen_tokens.to_string()])
        .args(["--threads", &a.threads.to_string()])
        .args(["--repeats", "1"])
        .output()
        .map_err(|e| {
            format!(
                "cannot run {} {}: {e}",
                a.python,
                a.llama_cpp_script.display()
            )
        })?;
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}): {}",
            a.llama_cpp_script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{} printed no JSON: {e}", a.llama_cpp_script.display()))?;
    let bad = || format!("{} printed unexpected JSON", a.llama_cpp_script.display());
    let mut runs = Vec::new();
    for r in v["runs"].as_array().ok_or_else(bad)? {
        let times = r["token_times_s"].as_array().ok_or_else(bad)?;
        let token_times_s = times
            .iter()
            .map(|t| t.as_f64().ok_or_else(bad))
            .collect::<Result<Vec<f64>, String>>()?;
        if token_times_s.len() != a.gen_tokens {
            return Err(bad());
        }
        runs.push(Run {
            prefill_s: r["prefill_s"].as_f64().ok_or_else(bad)?,
            token_times_s,
        });
    }
    if runs.len() != 1 {
        return Err(bad());
    }
    let about = json!({
        "llama_cpp_python_version": v["llama_cpp_python_version"],
        "system_info": v["system_info"],
    });
    Ok((runs, about))
}

/// The 1-, 5- and 15-minute load averages, where the system reports them: other work on the
/// machine slows both engines, and llama.cpp's spinning threads far more when cores are
/// oversubscribed.
fn load_average() -> Option<String> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn check_args(a: &BenchArgs) -> Result<(), String> {
    if a.device == DeviceArg::Cuda && a.vs_llama_cpp {
        return Err("--vs-llama-cpp compares on the CPU; leave it out with --device cuda".into());
    }
    if a.device == DeviceArg::Cpu && (a.target_percent.is_some() || a.target_tokens_per_s.is_some())
    {
        return Err("--target-percent and --target-tokens-per-s apply with --device cuda".into());
    }
    if a.device == DeviceArg::Cpu && a.tensor_parallel.is_some() {
        return Err(
            "--tensor-parallel splits a model across GPUs: use it with --device cuda".into(),
        );
    }
    if a.prompt_tokens == 0 || a.gen_tokens < 2 || a.threads == 0 || a.repeats == 0 {
        return Err(
            "--prompt-tokens, --threads and --repeats must be at least 1, --gen-tokens at \
             least 2"
                .into(),
        );
    }
    Ok(())
}

pub fn run(a: &BenchArgs) -> Result<(), String> {
    check_args(a)?;
    if a.device == DeviceArg::Cuda {
        let receipt = a
            .receipt
            .clone()
            .unwrap_or_else(|| "receipts/gpu-bench.json".into());
        return crate::bench_gpu::run(a, &receipt);
    }
    let receipt_path = a
        .receipt
        .clone()
        .unwrap_or_else(|| "receipts/cpu-bench.json".into());
    let path = cmd_pull::resolve(a.model.as_deref(), "smollm2", a.cache.as_deref())?;
    let model_sha256 = receipt::sha256_file(&path)?;
    let file_bytes = std::fs::metadata(&path).map(|m| m.len()).ok();
    let file = GgufFile::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let model_name = file.get_str("general.name").unwrap_or("unnamed").to_owned();
    let config = ModelConfig::from_gguf(&file).map_err(|e| format!("{}: {e}", path.display()))?;
    let context = a.prompt_tokens + a.gen_tokens;
    if context > config.max_positions {
        return Err(format!(
            "--prompt-tokens + --gen-tokens = {context} exceeds the model's context of {}",
            config.max_positions
        ));
    }
    let prompt = prompt_ids(a.prompt_tokens, config.vocab);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads)
        .build()
        .map_err(|e| format!("cannot start {} threads: {e}", a.threads))?;
    let decoder = Decoder::<f32>::load(config, &file, Naming::Gguf)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    drop(file);
    let load_before = load_average();
    pool.install(|| time_quench(&decoder, &prompt[..prompt.len().min(16)], 4))?;
    // The engines take turns, one run each, so that both meet the same machine load.
    let mut runs = Vec::with_capacity(a.repeats);
    let mut llama_runs = Ok((Vec::with_capacity(a.repeats), Value::Null));
    for _ in 0..a.repeats {
        runs.push(pool.install(|| time_quench(&decoder, &prompt, a.gen_tokens))?);
        if let (true, Ok((all, about))) = (a.vs_llama_cpp, &mut llama_runs) {
            match time_llama_cpp(a, &path, &prompt) {
                Ok((r, info)) => {
                    all.extend(r);
                    *about = info;
                }
                Err(e) => llama_runs = Err(e),
            }
        }
    }
    let load_after = load_average();
    // Everything quench held, the mapped weights included (llama.cpp runs in a child).
    let peak_rss = receipt::peak_rss_bytes();
    drop(decoder);
    let quench = summarize(&runs, a.prompt_tokens);
    let llama = a
        .vs_llama_cpp
        .then(|| llama_runs.map(|(r, about)| (summarize(&r, a.prompt_tokens), about)));
    let ratio = match &llama {
        Some(Ok((l, _))) => Some(quench.decode_tokens_per_s / l.decode_tokens_per_s),
        _ => None,
    };
    let llama_json = match &llama {
        None => Value::Null,
        Some(Ok((s, about))) => json!({ "summary": summary_json(s), "about": about }),
        Some(Err(e)) => json!({ "error": e }),
    };
    let outcome = json!({
        "quench_f32": summary_json(&quench),
        "llama_cpp": llama_json,
        "decode_ratio_quench_over_llama_cpp": ratio,
        "quench_peak_rss_bytes": peak_rss,
        "model_file_bytes": file_bytes,
        "meets_target": ratio.map(|r| r >= TARGET_RATIO),
    });
    let rec = receipt::receipt(
        "cpu-bench",
        json!({
            "kind": "cpu",
            "cpu": cpu_name(),
            "logical_cores": std::thread::available_parallelism().map(|n| n.get()).ok(),
            "load_average_before": load_before,
            "load_average_after": load_after,
        }),
        json!({
            "model_file": path.file_name().map(|n| n.to_string_lossy().into_owned()),
            "model_name": model_name,
            "model_sha256": model_sha256,
            "prompt_tokens": a.prompt_tokens,
            "gen_tokens": a.gen_tokens,
            "threads": a.threads,
            "repeats_after_warm_up": a.repeats,
            "decoding": "greedy; prompt ids (i·7919 + 13) mod vocab",
        }),
        json!(format!(
            "target, fixed before the run: quench decode tokens/s ≥ {TARGET_RATIO}× llama.cpp's \
             (rates are medians over the repeats; decode rate = (N−1)/(t(N)−t(1)))"
        )),
        outcome.clone(),
    );
    receipt::write_json(&receipt_path, &rec)?;

    if a.json {
        receipt::print_json(&outcome)?;
    } else {
        println!(
            "{model_name} on {} ({} threads): prompt {} tokens, {} generated, median of {}",
            cpu_name(),
            a.threads,
            a.prompt_tokens,
            a.gen_tokens,
            a.repeats
        );
        println!(
            "{:<16} {:>14} {:>14} {:>14} {:>14}",
            "", "prefill tok/s", "decode tok/s", "ms/token p50", "ms/token p90"
        );
        let row = |name: &str, s: &Summary| {
            println!(
                "{name:<16} {:>14.1} {:>14.1} {:>14.2} {:>14.2}",
                s.prefill_tokens_per_s,
                s.decode_tokens_per_s,
                s.ms_per_token_p50,
                s.ms_per_token_p90
            )
        };
        row("quench f32", &quench);
        if let Some(Ok((s, _))) = &llama {
            row("llama.cpp", s);
        }
        if let Some(r) = ratio {
            println!("decode speed quench / llama.cpp: {r:.2}× (target ≥ {TARGET_RATIO}×)");
        }
        if let (Some(peak), Some(file)) = (peak_rss, file_bytes) {
            println!(
                "quench's peak memory: {} ({:.2}× the model file's {})",
                crate::model_args::bytes(peak),
                peak as f64 / file as f64,
                crate::model_args::bytes(file)
            );
        }
        println!("receipt: {}", receipt_path.display());
    }
    match llama {
        Some(Err(e)) => Err(format!("llama.cpp: {e}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_rate_leaves_out_the_first_token() {
        // Prefill 0.5 s gives token 1 at 0.5 s; tokens 2..4 follow 0.1 s apart.
        let runs = [Run {
            prefill_s: 0.5,
            token_times_s: vec![0.5, 0.6, 0.7, 0.8],
        }];
        let s = summarize(&runs, 100);
        assert!((s.prefill_tokens_per_s - 200.0).abs() < 1e-9);
        assert!((s.decode_tokens_per_s - 10.0).abs() < 1e-9);
        assert!((s.ms_per_token_p50 - 100.0).abs() < 1e-9);
    }

    #[test]
    fn percentiles_and_medians_use_every_sample() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(v.clone(), 50.0), 5.0);
        assert_eq!(percentile(v.clone(), 90.0), 9.0);
        assert_eq!(percentile(v.clone(), 100.0), 10.0);
        assert_eq!(median(v), 5.5);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn arguments_are_refused_by_name() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let gpu = Cli::parse_from(["bench", "--device", "cuda", "--vs-llama-cpp"]);
        assert!(check_args(&gpu.bench)
            .unwrap_err()
            .contains("--vs-llama-cpp"));
        let cpu_target = Cli::parse_from(["bench", "--target-percent", "50"]);
        assert!(check_args(&cpu_target.bench)
            .unwrap_err()
            .contains("--device cuda"));
        assert!(check_args(&Cli::parse_from(["bench", "--device", "cuda"]).bench).is_ok());
        let short = Cli::parse_from(["bench", "--gen-tokens", "1"]);
        assert!(check_args(&short.bench)
            .unwrap_err()
            .contains("--gen-tokens"));
        assert!(check_args(&Cli::parse_from(["bench"]).bench).is_ok());
    }
}
