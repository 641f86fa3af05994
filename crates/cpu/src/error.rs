//! The one error type of this crate.

/// Why a model could not be loaded, run or sampled.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error(
        "tensor {name} {reason}; llama.cpp's rounding (Arithmetic::GgmlRounding) is reproduced \
         for Q4_1 and Q8_0 weights of GGUF files only"
    )]
    GgmlRounding { name: String, reason: String },

    #[error(transparent)]
    Model(#[from] quench_models::arch::ArchError),

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
}

pub type Result<T, E = CpuError> = std::result::Result<T, E>;
