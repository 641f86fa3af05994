//! The one error type of the crate: every failure names what it was reading or writing.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SassError {
    /// A cubin (or one of its sections or records) is not what it claims to be.
    #[error("{what}: {why}")]
    Malformed { what: String, why: String },
    /// Assembly text that cannot be assembled, with the position of the culprit.
    #[error("line {line}, column {col}: {msg}")]
    Asm {
        line: usize,
        col: usize,
        msg: String,
    },
    /// Machine code that no table entry decodes.
    #[error("at offset {offset:#x}: {msg}")]
    Decode { offset: u64, msg: String },
    /// A kernel the code generator cannot compile: the operation or limit that stops it.
    #[error("kernel {kernel}: {msg}")]
    Codegen { kernel: String, msg: String },
    /// An external tool (nvdisasm, cuobjdump, ptxas) is missing or failed.
    #[error("{tool}: {msg}")]
    Tool { tool: String, msg: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl SassError {
    pub(crate) fn malformed(what: impl Into<String>, why: impl Into<String>) -> SassError {
        SassError::Malformed {
            what: what.into(),
            why: why.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, SassError>;
