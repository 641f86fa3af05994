//! Writes the f64 reference logits of every position of a token sequence, as raw
//! little-endian f64 `[tokens, vocab]`, for comparison with another implementation
//! (see `scripts/numpy_reference.py`).
//!
//! `cargo run --release -p quench-cpu --example logits -- MODEL.gguf OUT.bin TOKEN...`

use std::io::Write;

use quench_cpu::{Decoder, Logits};
use quench_models::arch::{ModelConfig, Naming};
use quench_models::GgufFile;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: logits MODEL.gguf OUT.bin TOKEN...";
    let (path, out) = (args.get(1).ok_or(usage)?, args.get(2).ok_or(usage)?);
    let tokens = args[3..]
        .iter()
        .map(|s| s.parse::<u32>())
        .collect::<Result<Vec<_>, _>>()?;
    let file = GgufFile::open(path)?;
    let model = Decoder::<f64>::load(ModelConfig::from_gguf(&file)?, &file, Naming::Gguf)?;
    let logits = model.forward(&mut model.new_cache(), &tokens, Logits::All)?;
    let mut w = std::io::BufWriter::new(std::fs::File::create(out)?);
    for v in logits.as_slice() {
        w.write_all(&v.to_le_bytes())?;
    }
    w.flush()?;
    Ok(())
}
