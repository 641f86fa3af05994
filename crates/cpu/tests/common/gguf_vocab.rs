//! The tokenizer a GGUF file stores (its `tokenizer.ggml.*` metadata, read by quench-models).

use quench_models::GgufFile;
use quench_text::Tokenizer;

pub fn gguf_tokenizer(file: &GgufFile) -> Tokenizer {
    Tokenizer::from_gguf_vocab(&file.tokenizer_vocab().expect("tokenizer metadata"))
        .expect("a tokenizer")
}
