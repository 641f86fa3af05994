//! The one error type of quench-engine.

use std::path::PathBuf;

/// Why a model could not be found, loaded or run. Every message names the file, field or
/// setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{}: no such file or directory", path.display())]
    NotFound { path: PathBuf },

    #[error(
        "{}: not a model: expected a GGUF file or a Hugging Face directory with config.json \
         ({reason})",
        path.display()
    )]
    NotAModel { path: PathBuf, reason: String },

    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// An error met while reading the model at `path`.
    #[error("{}: {source}", path.display())]
    InModel {
        path: PathBuf,
        #[source]
        source: Box<EngineError>,
    },

    #[error(transparent)]
    Checkpoint(#[from] quench_models::ModelError),

    #[error(transparent)]
    Arch(#[from] quench_models::arch::ArchError),

    #[error(transparent)]
    Run(#[from] quench_cpu::CpuError),

    #[error("no tokens given")]
    NoTokens,

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

    /// An output format that cannot be compiled or followed.
    #[error(transparent)]
    Constrain(#[from] crate::generate::ConstrainError),

    #[error(
        "an embedding holds NaN or infinite values: the model's weights hold such values or \
         overflow"
    )]
    BadEmbedding,

    #[error("the model returned no logits for a sequence it was fed")]
    NoLogits,

    #[error("{what}: {source}")]
    Text {
        what: String,
        #[source]
        source: quench_text::TextError,
    },

    #[error("{what} is not supported: {reason}")]
    Unsupported { what: String, reason: String },

    /// Putting a model on a GPU, or running it there, failed (boxed: it names a whole
    /// runtime error).
    #[error(transparent)]
    Gpu(Box<crate::gpu::GpuError>),

    #[error("this model has no chat template (GGUF tokenizer.chat_template, or chat_template in tokenizer_config.json)")]
    NoChatTemplate,

    #[error("{} is {found}; {expected}", path.display())]
    WrongKind {
        path: PathBuf,
        found: &'static str,
        expected: &'static str,
    },

    #[error("this session was made by another model")]
    ForeignSession,
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

impl EngineError {
    pub(crate) fn in_model(self, path: &std::path::Path) -> Self {
        EngineError::InModel {
            path: path.to_owned(),
            source: Box::new(self),
        }
    }

    pub(crate) fn text(what: impl Into<String>, source: quench_text::TextError) -> Self {
        EngineError::Text {
            what: what.into(),
            source,
        }
    }
}
