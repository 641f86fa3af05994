//! `quench embed`: sentence embeddings, as vectors, OpenAI-style JSON or a similarity matrix.

use std::io::{BufRead, IsTerminal};

use clap::Args;
use quench_engine::Embedding;
use serde::Serialize;

use crate::cmd_pull::MINILM;
use crate::model_args::ModelArgs;

#[derive(Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print the OpenAI embeddings response: {"object": "list", "data": [...], ...}.
    #[arg(long, conflicts_with = "similarity")]
    pub json: bool,
    /// Print the cosine similarity of every pair of texts instead of the vectors.
    #[arg(long)]
    pub similarity: bool,
    /// Also embed the texts with the f64 CPU reference and require every vector within
    /// cosine 0.999 of it (fails otherwise); prints a receipt.
    #[arg(long)]
    pub check: bool,
    /// With --check: write the receipt to this file as well.
    #[arg(long, value_name = "PATH", requires = "check")]
    pub receipt: Option<std::path::PathBuf>,
    /// The texts; without any, each line of stdin is one.
    pub texts: Vec<String>,
}

/// The bound of `--check`, fixed before anything runs.
const CHECK_MIN_COSINE: f64 = 0.999;

/// The OpenAI embeddings response. Vectors are written as f32 (shortest round-trip digits).
#[derive(Serialize)]
struct Response<'a> {
    object: &'static str,
    data: Vec<Datum<'a>>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Datum<'a> {
    object: &'static str,
    index: usize,
    embedding: &'a [f32],
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

fn to_json(value: &impl Serialize) -> String {
    serde_json::to_string(value).expect("embeddings serialize")
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b)).max(1e-300)
}

/// The first characters of a text, for a table row.
fn label(text: &str, width: usize) -> String {
    let mut chars = text.chars();
    let head: String = chars.by_ref().take(width).collect();
    if chars.next().is_some() {
        format!("{}…", head.chars().take(width - 1).collect::<String>())
    } else {
        head
    }
}

pub fn run(args: &EmbedArgs) -> Result<(), String> {
    let texts: Vec<String> = if args.texts.is_empty() {
        if std::io::stdin().is_terminal() {
            return Err("no text given: pass texts as arguments or lines on stdin".into());
        }
        std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("reading stdin: {e}"))?
            .into_iter()
            .filter(|l| !l.trim().is_empty())
            .collect()
    } else {
        args.texts.clone()
    };
    if texts.is_empty() {
        return Err("no text given".into());
    }
    let loaded = args.model.load(MINILM)?;
    let model = loaded.model.embedding().map_err(|e| e.to_string())?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let start = std::time::Instant::now();
    let embeddings: Vec<Embedding> = model.embed(&refs).map_err(|e| e.to_string())?;
    let seconds = start.elapsed().as_secs_f64();
    if args.check {
        check(args, model, &refs, &embeddings, seconds)?;
    }
    for (i, e) in embeddings.iter().enumerate() {
        if let Some(full) = e.truncated_from {
            eprintln!(
                "note: text {} has {full} tokens; only its first {} were read (the model's limit)",
                i + 1,
                e.tokens
            );
        }
    }
    if args.json {
        let tokens: usize = embeddings.iter().map(|e| e.tokens).sum();
        let response = Response {
            object: "list",
            data: embeddings
                .iter()
                .enumerate()
                .map(|(index, e)| Datum {
                    object: "embedding",
                    index,
                    embedding: &e.vector,
                })
                .collect(),
            model: &loaded.name,
            usage: Usage {
                prompt_tokens: tokens,
                total_tokens: tokens,
            },
        };
        println!("{}", to_json(&response));
    } else if args.similarity {
        let width = 24;
        print!("{:width$}", "");
        for j in 0..texts.len() {
            print!(" {:>6}", format!("[{}]", j + 1));
        }
        println!();
        for (i, a) in embeddings.iter().enumerate() {
            print!(
                "{:width$}",
                format!("[{}] {}", i + 1, label(&texts[i], width - 5))
            );
            for b in &embeddings {
                print!(" {:>6.3}", cosine(&a.vector, &b.vector));
            }
            println!();
        }
    } else {
        for e in &embeddings {
            println!("{}", to_json(&e.vector));
        }
    }
    Ok(())
}

/// `--check`: the same texts through the f64 CPU reference, cosine per text against
/// [`CHECK_MIN_COSINE`], a receipt on stderr (and in `--receipt`); an error if any fails.
fn check(
    args: &EmbedArgs,
    model: &quench_engine::EmbeddingModel,
    texts: &[&str],
    got: &[Embedding],
    seconds: f64,
) -> Result<(), String> {
    let mut options = args.model.load_options();
    options.device = quench_engine::Device::Cpu;
    options.precision = quench_engine::Precision::F64;
    let path = &model.info().path;
    let reference = quench_engine::load(path, &options).map_err(|e| e.to_string())?;
    let want = reference
        .embedding()
        .map_err(|e| e.to_string())?
        .embed(texts)
        .map_err(|e| e.to_string())?;
    let cosines: Vec<f64> = got
        .iter()
        .zip(&want)
        .map(|(g, w)| cosine(&g.vector, &w.vector))
        .collect();
    let worst = cosines.iter().cloned().fold(f64::INFINITY, f64::min);
    let passed =
        worst >= CHECK_MIN_COSINE && got.iter().zip(&want).all(|(g, w)| g.tokens == w.tokens);
    let similarity: Vec<Vec<f64>> = got
        .iter()
        .map(|a| got.iter().map(|b| cosine(&a.vector, &b.vector)).collect())
        .collect();
    let v = crate::receipt::receipt(
        "embed-check",
        serde_json::json!({ "embedder": model.device() }),
        serde_json::json!({
            "model": path.display().to_string(),
            "texts": texts,
            "tokens": got.iter().map(|e| e.tokens).collect::<Vec<_>>(),
        }),
        serde_json::json!({ "cosine_to_f64_at_least": CHECK_MIN_COSINE }),
        serde_json::json!({
            "passed": passed,
            "cosine_to_f64": cosines,
            "worst_cosine": worst,
            "similarity": similarity,
            "embed_seconds": seconds,
        }),
    );
    eprintln!(
        "{}",
        serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
    );
    if let Some(p) = &args.receipt {
        crate::receipt::write_json(p, &v)?;
    }
    if passed {
        Ok(())
    } else {
        Err(format!(
            "embedding check failed: worst cosine to the f64 reference {worst:.6} (bound {CHECK_MIN_COSINE})"
        ))
    }
}
