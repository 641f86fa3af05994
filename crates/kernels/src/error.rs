//! Errors of the kernel library: each names the kernel and what is wrong.

use quench_ir::VerifyError;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// No kernel of that name in the library.
    #[error("no kernel named `{name}` (see the kernel list for what exists)")]
    UnknownKernel { name: String },

    /// A parameter name the kernel does not take.
    #[error("kernel `{kernel}` has no parameter `{key}` (it takes: {known})")]
    UnknownParam {
        kernel: String,
        key: String,
        known: String,
    },

    /// A parameter the kernel needs was not given.
    #[error("kernel `{kernel}` needs parameter `{key}`")]
    MissingParam { kernel: String, key: String },

    /// A `key=value` item that does not parse.
    #[error("kernel `{kernel}`: cannot read `{item}`: {reason}")]
    BadParam {
        kernel: String,
        item: String,
        reason: String,
    },

    /// Parameters that parse but that the kernel cannot be built for.
    #[error("kernel `{kernel}`: {reason}")]
    Unsupported { kernel: String, reason: String },

    /// The built kernel failed verification.
    #[error(transparent)]
    Verify(Box<VerifyError>),
}

impl From<VerifyError> for KernelError {
    fn from(e: VerifyError) -> KernelError {
        KernelError::Verify(Box::new(e))
    }
}

impl KernelError {
    pub(crate) fn unsupported(kernel: &str, reason: impl Into<String>) -> KernelError {
        KernelError::Unsupported {
            kernel: kernel.to_string(),
            reason: reason.into(),
        }
    }
}
