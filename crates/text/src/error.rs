//! The one error type of quench-text: every variant names what was missing or refused.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum TextError {
    #[error("vocabulary is empty: no tokens given")]
    NoVocab,
    #[error("unknown tokenizer model {0:?} (tokenizer.ggml.model); supported: \"gpt2\", \"llama\", \"bert\"")]
    UnknownModel(String),
    #[error("unknown pre-tokenizer {0:?} (tokenizer.ggml.pre); supported: {1}")]
    UnknownPreTokenizer(String, &'static str),
    #[error("{field}: has {got} entries but the vocabulary has {expected}")]
    LengthMismatch {
        field: &'static str,
        got: usize,
        expected: usize,
    },
    #[error("{0} is required for this tokenizer but was not given")]
    Missing(&'static str),
    #[error("token id {id} given as {what} is outside the vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        what: &'static str,
        id: u64,
        vocab_size: usize,
    },
    #[error("merge {index} ({merge:?}): {reason}")]
    BadMerge {
        index: usize,
        merge: String,
        reason: &'static str,
    },
    #[error("token {0:?} is not in the vocabulary")]
    TokenNotInVocab(String),
    #[error("vocabulary has no token with id {0} (ids must be contiguous from 0)")]
    VocabHole(u32),
    #[error("tokenizer.json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("tokenizer.json: field {field}: {reason}")]
    BadField { field: String, reason: String },
    #[error("tokenizer.json: {kind} {name:?} is not supported")]
    Unsupported { kind: &'static str, name: String },
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("pre-tokenizer regex {pattern:?}: {reason}")]
    Regex { pattern: String, reason: String },
    #[error("decode: token id {0} is not in the vocabulary")]
    UnknownId(u32),
    #[error("chat template syntax error at line {line}: {message}")]
    TemplateSyntax { line: usize, message: String },
    #[error("chat template: {0}")]
    TemplateRender(String),
    #[error("chat template: {0}")]
    TemplateLimit(String),
}

pub type Result<T> = std::result::Result<T, TextError>;

impl TextError {
    pub(crate) fn bad_field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        TextError::BadField {
            field: field.into(),
            reason: reason.into(),
        }
    }
}
