//! What can go wrong turning a kernel into PTX or assembling it.

use std::path::PathBuf;

/// An error from the PTX emitter or from running `ptxas`.
#[derive(Debug, thiserror::Error)]
pub enum PtxError {
    /// The kernel is not valid IR.
    #[error(transparent)]
    Invalid(#[from] quench_ir::VerifyError),

    /// The kernel uses something PTX cannot express (or the emitter does not support);
    /// `at` names the parameter, shared array or IR value concerned.
    #[error("kernel `{kernel}`, {at}: {msg}")]
    Unsupported {
        kernel: String,
        at: String,
        msg: String,
    },

    /// No `ptxas` could be found.
    #[error(
        "ptxas not found (looked at: {looked}); install it with `quench pull ptxas` or \
         `pip install --no-deps nvidia-cuda-nvcc==13.0.88`, or point QUENCH_PTXAS at a ptxas \
         binary"
    )]
    PtxasNotFound { looked: String },

    /// `ptxas` could not be started or its files could not be written or read.
    #[error("running ptxas `{}`: {source}", path.display())]
    PtxasIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// `ptxas` rejected the module; `line`/`text` locate the first PTX line it named.
    #[error("ptxas rejected the PTX for {arch}: {message}{}", locate(*line, text))]
    PtxasRejected {
        arch: String,
        message: String,
        line: Option<usize>,
        text: Option<String>,
    },

    /// `ptxas` succeeded but its `-v` report did not have the expected form.
    #[error("could not read ptxas's resource report: {0}")]
    PtxasReport(String),
}

fn locate(line: Option<usize>, text: &Option<String>) -> String {
    match (line, text) {
        (Some(l), Some(t)) => format!("\n  at PTX line {l}: {}", t.trim()),
        (Some(l), None) => format!("\n  at PTX line {l}"),
        _ => String::new(),
    }
}
