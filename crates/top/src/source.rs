//! Where readings come from: NVML on a real machine, a scripted source in tests.

use crate::sample::Snapshot;

/// Something that reads every GPU once per call.
pub trait SampleSource {
    fn sample(&mut self) -> Result<Snapshot, SourceError>;
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SourceError {
    /// `reason` is the loader's message, which names the file.
    #[error(
        "cannot load the NVIDIA management library: {reason} (is the NVIDIA driver installed?)"
    )]
    LibraryNotLoaded { library: String, reason: String },
    #[error("the NVIDIA management library lacks {symbol}; the installed driver is too old")]
    MissingSymbol { symbol: &'static str },
    #[error("{call} failed: {message}")]
    Call { call: &'static str, message: String },
    #[error("no GPU: the NVIDIA driver reports no devices")]
    NoGpu,
    #[error("the scripted sample source has no readings left")]
    Exhausted,
}
