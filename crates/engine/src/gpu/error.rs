//! Why a model could not be put on, or run on, a GPU. Every message names the tensor,
//! kernel, setting or amount at fault.

use quench_kernels::KernelError;
use quench_rt::RtError;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// A weight stored in a format no GPU kernel reads.
    #[error("{tensor} is stored as {format}; quench's GPU kernels read {supported}")]
    Format {
        tensor: String,
        format: String,
        supported: &'static str,
    },

    /// A tensor whose shape differs from what the model's config calls for.
    #[error("{tensor} has shape {found:?}, but this model needs {expected:?}")]
    Shape {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    /// Something about the model the GPU path does not run (an architecture, a shape).
    #[error("{what} is not supported on the GPU: {reason}")]
    Unsupported { what: String, reason: String },

    /// A library kernel refused the shape it was asked to build for.
    #[error("{part}: {source}")]
    Kernel {
        part: String,
        #[source]
        source: Box<KernelError>,
    },

    /// The model, its KV cache and its activations together exceed the device memory.
    #[error(
        "the model does not fit on {device}: it needs {} ({breakdown}), and {} are available",
        size(*needed),
        size(*available)
    )]
    DoesNotFit {
        device: String,
        needed: u64,
        available: u64,
        breakdown: String,
    },

    /// More positions than the KV cache holds.
    #[error(
        "context full: {used} positions in use plus {added} more exceed the {limit} positions \
         the GPU KV cache holds (raise the context limit when loading)"
    )]
    ContextFull {
        limit: usize,
        used: usize,
        added: usize,
    },

    /// Every block of the shared KV cache belongs to some session.
    #[error(
        "the GPU KV cache is full: all {blocks} blocks of 16 positions are in use by other \
         sessions (end some sessions or load with more sessions)"
    )]
    CacheFull { blocks: usize },

    /// More sessions in one step than the decoder was loaded for.
    #[error(
        "{rows} sequences in one decode step, but this model was loaded for at most {max} \
         (raise the batch size when loading)"
    )]
    BatchTooLarge { rows: usize, max: usize },

    /// A decode step shared with other sequences failed as a whole.
    #[error("a decode step shared with other sequences failed: {reason}")]
    BatchFailed { reason: String },

    #[error("token id {token} is outside the vocabulary of {vocab} tokens")]
    Token { token: u32, vocab: usize },

    #[error("no tokens given")]
    NoTokens,

    #[error("this session was made by another GPU model")]
    ForeignSession,

    #[error("row {row}'s logits hold no number to pick the largest of (NaN everywhere)")]
    BadLogits { row: usize },

    /// One rank of a tensor-parallel model failed; the step failed on every rank.
    #[error("tensor-parallel rank {rank} of {ranks}: {source}")]
    Rank {
        rank: usize,
        ranks: usize,
        #[source]
        source: Box<GpuError>,
    },
    /// A case the decoder's own wiring should never reach.
    #[error("internal error: {0} (a bug in quench; please report it)")]
    Internal(String),

    /// A runtime call failed; `during` says what the engine was doing (which kernel of
    /// which layer, the upload of which tensor, ...).
    #[error("{during}: {source}")]
    Runtime {
        during: String,
        #[source]
        source: Box<RtError>,
    },

    /// Reading a weight from the checkpoint failed.
    #[error(transparent)]
    Weights(#[from] quench_models::arch::ArchError),

    #[error(transparent)]
    Checkpoint(#[from] quench_models::ModelError),
}

impl GpuError {
    pub(crate) fn runtime(during: impl Into<String>) -> impl FnOnce(RtError) -> GpuError {
        let during = during.into();
        move |source| GpuError::Runtime {
            during,
            source: Box::new(source),
        }
    }

    pub(crate) fn kernel(part: impl Into<String>) -> impl FnOnce(KernelError) -> GpuError {
        let part = part.into();
        move |source| GpuError::Kernel {
            part,
            source: Box::new(source),
        }
    }
}

/// Bytes in binary units with two decimals: "16.02 GiB", "183.50 MiB", "12.25 KiB".
pub(crate) fn size(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        b30 if b30 >= 1 << 30 => format!("{:.2} GiB", b / (1u64 << 30) as f64),
        b20 if b20 >= 1 << 20 => format!("{:.2} MiB", b / (1u64 << 20) as f64),
        _ => format!("{:.2} KiB", b / 1024.0),
    }
}
