//! quench-fuzz: seeded, reproducible mutation fuzzing of every parser quench points at
//! untrusted bytes, in-process on stable Rust (no cargo-fuzz, no nightly).
//!
//! A [`Target`] is a parser with a corpus of valid inputs built in code (by the repository's
//! own writers: `GgufWriter`, `SafetensorsWriter`, `quench synth`, the HF→GGUF converter,
//! the IR printer over the kernel library, the cubin writer and disassembler over the sm_90
//! tables; and real shapes: chat templates of the llama3,
//! qwen and smollm families, tokenizer.json, config.json, request bodies), a dictionary of
//! tokens for its format, and a function that parses an input and then uses what parsed
//! (every getter, every tensor, encoding and decoding, rendering). [`driver::run`] feeds
//! it seeded mutants; a panic, or an input slower than a second, is a failure with a
//! reproducer file. `scripts/fuzz.sh` runs ≥ 10^6 inputs per target and writes a receipt.

pub mod driver;
pub mod mutate;
pub mod mutate_json;
pub mod receipt;
pub mod rng;
pub mod targets;

/// What kind of input a target reads, which decides how it is mutated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Binary,
    /// UTF-8 text: most mutants are kept valid UTF-8, so that they reach the parser.
    Text,
    /// JSON text: half the mutants are structural (see [`mutate_json`]), and JSON's tokens
    /// join the dictionary.
    Json,
}

/// One fuzz target.
pub struct Target {
    pub name: &'static str,
    /// What it parses, for `quench-fuzz list` and the receipt.
    pub about: &'static str,
    /// The valid inputs mutation starts from.
    pub seeds: fn() -> Vec<Vec<u8>>,
    /// Tokens of the input's format, inserted by the mutator.
    pub dict: &'static [&'static [u8]],
    pub format: Format,
    /// Parses the input and uses what parsed; `Err` is a refusal (fine), a panic a bug.
    pub run: fn(&[u8]) -> Result<(), String>,
}

/// Every target, in the order the receipt lists them.
pub fn targets() -> Vec<Target> {
    vec![
        targets::gguf::target(),
        targets::safetensors::target(),
        targets::config::target(),
        targets::tokenizer::target(),
        targets::template::target(),
        targets::request::target(),
        targets::ir::target(),
        targets::sass::cubin_target(),
        targets::sass::sass_target(),
    ]
}

pub fn find(name: &str) -> Option<Target> {
    targets().into_iter().find(|t| t.name == name)
}
