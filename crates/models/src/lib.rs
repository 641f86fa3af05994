//! quench-models: reading the world's checkpoints.
//!
//! - [`arch`]: what a model is — architecture, shape, tensor names, tensor sources — for
//!   every backend that runs one.
//! - [`gguf`]: GGUF v2/v3 files (llama.cpp), memory-mapped, every metadata type, tensor views.
//! - [`dequant`] / [`quant`]: ggml block formats to and from f32, bit-exact with the `gguf`
//!   Python package where it implements them.
//! - [`safetensors`], [`HfConfig`], [`HfCheckpoint`]: Hugging Face checkpoints, single-file or
//!   sharded, and their `config.json`.
//! - [`read_optional_json`], [`chat_template_source`]: the optional files beside a Hugging
//!   Face checkpoint (`tokenizer_config.json`, `generation_config.json`, the chat template).
//! - [`hf_to_gguf`]: Hugging Face checkpoints converted to GGUF with quantized weights.
//!
//! Nothing read from a file is trusted: sizes and counts are checked against the file before
//! anything is allocated or sliced, and every failure is a [`ModelError`] naming the file,
//! tensor or field.

pub mod arch;
pub mod dequant;
mod error;
mod ggml_type;
pub mod gguf;
mod hf_checkpoint;
mod hf_config;
mod hf_files;
pub mod hf_to_gguf;
pub mod quant;
pub mod safetensors;
mod storage;

pub use error::ModelError;
pub use ggml_type::GgmlType;
pub use gguf::{GgufFile, TensorView};
pub use hf_checkpoint::HfCheckpoint;
pub use hf_config::{HfConfig, Llama3RopeScaling, RopeScaling, TokenIds};
pub use hf_files::{chat_template_source, read_optional_json, HfFileError};
pub use storage::SharedBytes;
