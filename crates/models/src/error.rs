//! The one error type of this crate.
//!
//! Leaf variants describe what is wrong; two context variants say where: [`ModelError::InFile`]
//! names the file and [`ModelError::InTensor`] the tensor. Parsers produce leaf errors and the
//! layer that knows the file or tensor wraps them, so every message reads like
//! `model.gguf: tensor blk.0.attn_q.weight: data [96, 2400) runs past the end (2000 bytes)`.
//! Use [`ModelError::kind`] to match on the leaf without caring about the context.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: {source}", file.display())]
    InFile {
        file: PathBuf,
        #[source]
        source: Box<ModelError>,
    },

    #[error("tensor {name}: {source}")]
    InTensor {
        name: String,
        #[source]
        source: Box<ModelError>,
    },

    #[error("bad magic {found:02x?}: not a {format} file")]
    BadMagic {
        format: &'static str,
        found: Vec<u8>,
    },

    #[error("{format} version {version} is not supported (supported: {supported})")]
    UnsupportedVersion {
        format: &'static str,
        version: u32,
        supported: &'static str,
    },

    #[error("{what} at offset {offset} needs {needed} bytes but only {available} remain")]
    Truncated {
        what: String,
        offset: u64,
        needed: u64,
        available: u64,
    },

    #[error("{what} {count} is absurd (limit {limit})")]
    AbsurdCount {
        what: String,
        count: u64,
        limit: u64,
    },

    #[error("{what} is not valid UTF-8")]
    InvalidUtf8 { what: String },

    #[error("duplicate {kind} {name:?}")]
    Duplicate { kind: &'static str, name: String },

    #[error("metadata {key}: unknown value type id {type_id}")]
    UnknownValueType { key: String, type_id: u32 },

    #[error("metadata {key}: {reason}")]
    BadMetadata { key: String, reason: String },

    #[error("metadata key {key} is missing")]
    MissingMetadata { key: String },

    #[error("metadata {key}: expected {expected}, found {found}")]
    MetadataType {
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("unknown ggml type id {id}")]
    UnknownGgmlType { id: u32 },

    #[error("bad shape {dims:?}: {reason}")]
    BadShape { dims: Vec<u64>, reason: String },

    #[error("data offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned { offset: u64, alignment: u64 },

    #[error("data [{start}, {end}) runs past the end of the data section ({len} bytes)")]
    OutOfBounds { start: u64, end: u64, len: u64 },

    #[error("data [{start}, {end}) overlaps tensor {other}")]
    Overlap { start: u64, end: u64, other: String },

    #[error("{what}: {actual} bytes, but {expected} expected")]
    SizeMismatch {
        what: String,
        expected: u64,
        actual: u64,
    },

    #[error("{what} is not supported")]
    Unsupported { what: String },

    #[error("tensor {name} not found")]
    MissingTensor { name: String },

    #[error("bad header: {reason}")]
    BadHeader { reason: String },

    #[error("invalid JSON: {source}")]
    Json {
        #[source]
        source: serde_json::Error,
    },

    #[error("config field {field}: {reason}")]
    Config { field: String, reason: String },

    #[error("cannot quantize to {ggml_type}: {reason}")]
    Quantize {
        ggml_type: &'static str,
        reason: String,
    },
}

impl ModelError {
    /// The innermost error, with the file and tensor context stripped.
    pub fn kind(&self) -> &ModelError {
        match self {
            ModelError::InFile { source, .. } | ModelError::InTensor { source, .. } => {
                source.kind()
            }
            other => other,
        }
    }

    pub(crate) fn in_file(self, file: impl Into<PathBuf>) -> ModelError {
        ModelError::InFile {
            file: file.into(),
            source: Box::new(self),
        }
    }

    pub(crate) fn in_tensor(self, name: &str) -> ModelError {
        ModelError::InTensor {
            name: name.to_owned(),
            source: Box::new(self),
        }
    }
}
