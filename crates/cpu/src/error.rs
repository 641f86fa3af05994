//! The one error type of this crate.

/// Why a model could not be loaded, run or sampled.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("model configuration: {field} {reason}")]
    Config { field: &'static str, reason: String },

    #[error("{arch} models are not supported by {what}")]
    UnsupportedArch { arch: String, what: &'static str },

    #[error("tensor {name} not found")]
    MissingTensor { name: String },

    #[error("tensor {name} has shape {found:?}, but this model needs {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    #[error("tensor {name}: {source}")]
    Tensor {
        name: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    #[error(
        "tensor {name} {reason}; llama.cpp's rounding (Arithmetic::GgmlRounding) is reproduced \
         for Q4_1 and Q8_0 weights of GGUF files only"
    )]
    GgmlRounding { name: String, reason: String },

    #[error(transparent)]
    Checkpoint(#[from] quench_models::ModelError),

    #[error("no tokens given")]
    NoTokens,

    #[error("positions {start}..{end} are not a non-empty range within the {tokens} tokens fed")]
    Positions {
        start: usize,
        end: usize,
        tokens: usize,
    },

    #[error("token id {token} is outside the vocabulary of {vocab} tokens")]
    TokenOutOfRange { token: u32, vocab: usize },

    #[error("token type {token_type} is outside the {types} token types of this model")]
    TokenTypeOutOfRange { token_type: u32, types: usize },

    #[error("{given} token types for {tokens} tokens")]
    TokenTypeCount { given: usize, tokens: usize },

    #[error(
        "context overflow: {used} positions already used plus {added} new tokens exceed \
         the context limit of {limit} tokens"
    )]
    ContextOverflow {
        limit: usize,
        used: usize,
        added: usize,
    },

    #[error(
        "prompt of {prompt_len} tokens does not fit the context limit of {limit} tokens \
         ({used} positions already used)"
    )]
    PromptTooLong {
        prompt_len: usize,
        limit: usize,
        used: usize,
    },

    #[error("sampling parameter {param} {reason}")]
    Sampling { param: &'static str, reason: String },

    #[error("logits contain {what}")]
    BadLogits { what: &'static str },
}

pub type Result<T, E = CpuError> = std::result::Result<T, E>;
