//! Greedy or sampled generation from a GGUF model on the CPU, with timings.
//!
//! `cargo run --release -p quench-cpu --example generate -- MODEL.gguf "prompt" [max_tokens] [f32|f64]`
//! The prompt is wrapped in the model's chat template when the file has one.

#[path = "../tests/common/gguf_vocab.rs"]
mod gguf_vocab;

use std::io::Write;
use std::time::Instant;

use quench_cpu::{
    generate, CausalLm, Decoder, GenerateOptions, ModelConfig, Naming, Real, SamplingParams,
    Session,
};
use quench_models::GgufFile;
use quench_text::{ChatTemplate, Message};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: generate MODEL.gguf PROMPT [MAX_TOKENS] [f32|f64]";
    let path = args.get(1).ok_or(usage)?;
    let prompt = args.get(2).ok_or(usage)?;
    let max_new_tokens = args.get(3).map_or(Ok(64), |s| s.parse())?;
    match args.get(4).map(String::as_str) {
        None | Some("f32") => run::<f32>(path, prompt, max_new_tokens),
        Some("f64") => run::<f64>(path, prompt, max_new_tokens),
        Some(other) => Err(format!("unknown precision {other}; {usage}").into()),
    }
}

fn run<T: Real>(
    path: &str,
    prompt: &str,
    max_new_tokens: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let t0 = Instant::now();
    let file = GgufFile::open(path)?;
    let config = ModelConfig::from_gguf(&file)?;
    let tokenizer = gguf_vocab::gguf_tokenizer(&file);
    let model = Decoder::<T>::load(config, &file, Naming::Gguf)?;
    eprintln!("loaded in {:.2} s", t0.elapsed().as_secs_f64());

    let text = match file.get_str("tokenizer.chat_template") {
        Ok(source) => {
            let token = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i)).unwrap_or("");
            let template =
                ChatTemplate::new(source, token(tokenizer.bos_id()), token(tokenizer.eos_id()))?;
            template.render(&[Message::new("user", prompt)], true)?
        }
        Err(_) => prompt.to_owned(),
    };
    let prompt_tokens = tokenizer.encode(&text, true)?;
    let options = GenerateOptions {
        max_new_tokens,
        sampling: SamplingParams::greedy(),
        stop_strings: vec![],
        eos_ids: tokenizer.eos_id().into_iter().collect(),
    };
    let mut session = Session::new(&model);
    let detokenize = |t: &[u32]| tokenizer.decode(t, true).unwrap_or_default();
    let start = Instant::now();
    let mut first_token = None;
    let g = generate(
        &mut session,
        &detokenize,
        &prompt_tokens,
        &options,
        &mut |_, piece| {
            first_token.get_or_insert_with(Instant::now);
            print!("{piece}");
            let _ = std::io::stdout().flush();
        },
    )?;
    let end = Instant::now();
    println!();
    let prefill = first_token.map_or(0.0, |t| (t - start).as_secs_f64());
    let decode = first_token.map_or(0.0, |t| (end - t).as_secs_f64());
    eprintln!(
        "prompt {} tokens, prefill {:.3} s; {} tokens generated ({:?}); decode {:.1} tokens/s; context {}",
        prompt_tokens.len(),
        prefill,
        g.tokens.len(),
        g.finish,
        (g.tokens.len().saturating_sub(1)) as f64 / decode.max(1e-9),
        session.position(),
    );
    Ok(())
}
