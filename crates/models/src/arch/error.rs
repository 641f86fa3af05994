//! Why a model's description or weights do not make a model that quench can run.

use crate::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum ArchError {
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

    #[error(transparent)]
    Checkpoint(#[from] ModelError),
}

pub type Result<T, E = ArchError> = std::result::Result<T, E>;
