//! The targets, one module each: seeds, dictionary and the function under test.

pub mod config;
pub mod gguf;
pub mod ir;
pub mod request;
pub mod safetensors;
pub mod sass;
pub mod template;
pub mod tokenizer;

mod synth;

/// Input bytes as text: the text formats refuse bytes that are not UTF-8 as their readers
/// do (`read_to_string`).
pub(crate) fn text(bytes: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))
}

/// JSON tokens for the JSON formats.
pub const JSON_DICT: &[&[u8]] = &[
    b"null",
    b"true",
    b"false",
    b"{}",
    b"[]",
    b"[[[[[[[[",
    b"{\"a\":",
    b"\"\"",
    b"\"\\u0000\"",
    b"\"\\ud800\"",
    b",",
    b":",
    b"-",
    b"1e-400",
    b"0.5",
    b"NaN",
];
