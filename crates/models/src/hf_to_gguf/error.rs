//! What can go wrong converting a checkpoint.

use std::path::PathBuf;

use crate::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{}: not a Hugging Face checkpoint: {reason}", path.display())]
    NotACheckpoint { path: PathBuf, reason: String },

    #[error("{what} is not supported by the GGUF converter")]
    Unsupported { what: String },

    #[error("{}: {reason}", file.display())]
    Tokenizer { file: PathBuf, reason: String },

    #[error("tensor {name}: {reason}")]
    Tensor { name: String, reason: String },

    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Model(#[from] ModelError),
}
