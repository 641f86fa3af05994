//! `quench top`: a GPU monitor over NVML.
//!
//! A [`SampleSource`] reads every GPU into a [`Snapshot`] ([`NvmlSource`] through the
//! driver's `libnvidia-ml.so.1`, loaded at run time; [`fake::FakeSource`] from a script
//! in tests). The readings feed two renderers: [`json::report`] (one object per reading,
//! units in the field names, `null` for what the driver does not expose) and the
//! terminal view ([`render::render`] over an [`App`], which keeps 60 seconds of history).
//! A quench server's Prometheus `/metrics` ([`server`]) is shown beside the GPU.

pub mod app;
pub mod fake;
mod format;
pub mod history;
pub mod http;
pub mod json;
pub mod modes;
mod nvml;
pub mod prom;
pub mod render;
pub mod sample;
pub mod server;
pub mod source;

pub use app::{App, Key};
pub use modes::TopError;
pub use nvml::{NvmlSource, LIBRARY as NVML_LIBRARY};
pub use sample::{GpuSample, ProcessKind, ProcessSample, Snapshot};
pub use server::{ServerPoller, ServerSample};
pub use source::{SampleSource, SourceError};
