//! `quench generate`: continue a raw prompt, streaming the continuation to stdout.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use clap::Args;
use quench_engine::generate::OutputFormat;
use quench_engine::{FinishReason, GenerateOptions, Generation, Prompt, SamplingParams};
use serde_json::json;

use crate::cmd_pull::SMOLLM2;
use crate::model_args::ModelArgs;

/// How tokens are drawn; shared by `generate` and `chat`.
#[derive(Args)]
pub struct SamplingArgs {
    /// 0 always takes the most likely token (greedy, the default: the same prompt gives the
    /// same text); higher values sample more freely.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub top_k: usize,
    /// Sample among the most likely tokens that together hold probability P (1: all).
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0: none).
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub min_p: f32,
    /// Above 1, discourages repeating tokens already in the context.
    #[arg(long, value_name = "R", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Seed of the sampler: the same seed and prompt give the same text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when the text contains STR (not printed); may be given several times.
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    pub fn options(&self, max_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            max_tokens,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repetition_penalty: self.repeat_penalty,
                seed: self.seed,
                ..SamplingParams::greedy()
            },
            stop: self.stop.clone(),
            ..GenerateOptions::default()
        }
    }
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Most tokens to generate.
    #[arg(long, short = 'n', value_name = "N", default_value_t = 128)]
    pub max_tokens: usize,
    /// Keep generating past the model's end-of-sequence tokens (drawn as text) up to
    /// `--max-tokens`, as a benchmark or a comparison with another implementation that
    /// generates a fixed count does.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Write the prompt's tokens, the generated tokens and the logits of every step to FILE
    /// as JSON (for checking quench against other implementations).
    #[arg(long, value_name = "FILE")]
    pub logits_out: Option<PathBuf>,
    /// Hold the output to the JSON Schema in FILE (`{}` for any JSON value): each step draws
    /// only tokens that keep the text valid, and generation ends when the JSON is complete.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
    /// Write a receipt of the run to FILE: the model, device, prompt and output lengths,
    /// the prompt's time and the decode step's, and with `--json-schema` what each token's
    /// mask cost beside the step (bound: at most 5% of it).
    #[arg(long, value_name = "FILE")]
    pub receipt: Option<PathBuf>,
    /// The text to continue, as is (no chat template); `-` or nothing reads it from stdin
    /// (without the final newline).
    pub prompt: Option<String>,
}

/// "12 prompt tokens in 0.05 s, 48 tokens in 1.21 s (39.7 tokens/s), stopped: end of text".
pub fn speed_line(g: &Generation) -> String {
    let decode = g.decode_time.as_secs_f64();
    // The first token comes with the prompt; the others each took one decode step.
    let steps = g.tokens.len().saturating_sub(1).max(1) as f64;
    let finish = match &g.finish {
        FinishReason::Eos(_) => "end of text".to_string(),
        FinishReason::Stop(s) => format!("stop string {s:?}"),
        FinishReason::MaxTokens => "token limit".to_string(),
        FinishReason::ContextFull => "context full".to_string(),
        FinishReason::Complete => "JSON complete".to_string(),
    };
    let reused = if g.reused_tokens > 0 {
        format!(" ({} reused)", g.reused_tokens)
    } else {
        String::new()
    };
    format!(
        "{} prompt tokens{reused} in {:.2} s, {} tokens in {:.2} s ({:.1} tokens/s), stopped: {finish}",
        g.prompt_tokens,
        g.prefill_time.as_secs_f64(),
        g.tokens.len(),
        g.prefill_time.as_secs_f64() + decode,
        if decode > 0.0 { steps / decode } else { 0.0 },
    )
}

pub fn run(args: &GenerateArgs) -> Result<(), String> {
    let prompt = match args.prompt.as_deref() {
        Some(p) if p != "-" => p.to_owned(),
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("reading the prompt from stdin: {e}"))?;
            // The newline that ends the input (`echo`, `<<<`) is not part of the prompt.
            let end = text.strip_suffix('\n').unwrap_or(&text);
            end.strip_suffix('\r').unwrap_or(end).to_owned()
        }
    };
    let loaded = args.model.load(SMOLLM2)?;
    let model = loaded.model.causal().map_err(|e| e.to_string())?;
    let mut options = args.sampling.options(args.max_tokens);
    options.keep_logits = args.logits_out.is_some();
    options.ignore_eos = args.ignore_eos;
    let mut constraint = match &args.json_schema {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--json-schema {}: {e}", path.display()))?;
            let schema: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| format!("--json-schema {}: not JSON: {e}", path.display()))?;
            let format = OutputFormat::JsonSchema {
                schema,
                strict: true,
            };
            let grammars = model.grammars().map_err(|e| e.to_string())?;
            Some(
                grammars
                    .constraint(&format)
                    .map_err(|e| format!("--json-schema {}: {e}", path.display()))?,
            )
        }
        None => None,
    };
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let generation = model
        .generate_constrained(
            &mut model.new_session(),
            Prompt::Text(&prompt),
            &options,
            constraint.as_mut(),
            &mut |piece| {
                if write_error.is_none() {
                    write_error = stdout
                        .write_all(piece.as_bytes())
                        .and_then(|_| stdout.flush())
                        .err();
                }
            },
        )
        .map_err(|e| e.to_string())?;
    if let Some(e) = write_error {
        return Err(format!("writing to stdout: {e}"));
    }
    if stdout.is_terminal() {
        let _ = writeln!(stdout);
    }
    args.model.note(&speed_line(&generation));
    if let Some(c) = &constraint {
        let cost = c.mask_cost();
        let each = |d: std::time::Duration| d.as_secs_f64() * 1e6 / cost.masks.max(1) as f64;
        args.model.note(&format!(
            "{} token masks, {:.1} µs each to compute (beside the model's step), {:.1} µs \
             waited for",
            cost.masks,
            each(cost.computed),
            each(cost.waited)
        ));
    }
    if let Some(path) = &args.receipt {
        write_receipt(args, path, &loaded.name, &generation, constraint.as_ref())?;
    }
    if let Some(path) = &args.logits_out {
        let record = json!({
            "model": loaded.name,
            "prompt": prompt,
            "prompt_tokens": model.prompt_tokens(Prompt::Text(&prompt)).map_err(|e| e.to_string())?,
            "tokens": generation.tokens,
            "text": generation.text,
            "logits": generation.logits,
        });
        std::fs::write(path, record.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Most of a decode step that a token's mask may add to it (the time the step waits for
/// the mask, computed beside the model's step) where a receipt is written.
const MASK_SHARE_BOUND: f64 = 0.05;

/// The receipt of a generation: its speed and, with a schema, its masks' cost beside the
/// decode step (the time the model took for one token, the mask not counted): the time
/// computing each mask took, and the part of it that the generation waited for.
fn write_receipt(
    args: &GenerateArgs,
    path: &std::path::Path,
    model: &str,
    g: &Generation,
    constraint: Option<&quench_engine::generate::Constraint>,
) -> Result<(), String> {
    let device = match args.model.device {
        crate::model_args::DeviceArg::Cuda => {
            crate::gpu::describe_on(args.model.gpu, args.model.backend)?
        }
        crate::model_args::DeviceArg::Cpu => json!({
            "name": "cpu",
            "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
        }),
    };
    let steps = g.tokens.len().saturating_sub(1);
    let step_s = g.decode_time.as_secs_f64() / steps.max(1) as f64;
    let mut outcome = json!({
        "prompt_tokens": g.prompt_tokens,
        "generated_tokens": g.tokens.len(),
        "prefill_s": g.prefill_time.as_secs_f64(),
        "decode_steps": steps,
        "decode_step_ms": step_s * 1e3,
        "decode_tokens_per_s": if step_s > 0.0 { 1.0 / step_s } else { 0.0 },
        "text": g.text,
    });
    let mut bound = json!(null);
    let mut inputs = json!({ "model": model, "max_tokens": args.max_tokens });
    if let (Some(c), Some(schema)) = (constraint, &args.json_schema) {
        let cost = c.mask_cost();
        let per_mask = |d: std::time::Duration| d.as_secs_f64() / cost.masks.max(1) as f64;
        let waited_s = per_mask(cost.waited);
        let share = if step_s > 0.0 {
            waited_s / step_s
        } else {
            f64::INFINITY
        };
        outcome["masks"] = json!(cost.masks);
        outcome["mask_compute_us"] = json!(per_mask(cost.computed) * 1e6);
        outcome["mask_waited_us"] = json!(waited_s * 1e6);
        outcome["mask_share_of_step"] = json!(share);
        outcome["passed"] = json!(share <= MASK_SHARE_BOUND && steps > 0);
        let text = std::fs::read(schema).map_err(|e| format!("{}: {e}", schema.display()))?;
        inputs["json_schema_sha256"] = json!(crate::receipt::sha256_hex(&text));
        inputs["logits_per_step"] = json!(c.logits_len());
        bound = json!({ "mask_share_of_step_max": MASK_SHARE_BOUND });
    }
    let rec = crate::receipt::receipt("generate", device, inputs, bound, outcome);
    crate::receipt::write_json(path, &rec)
}
