//! What a model is, below every backend that runs it: its architecture and shape
//! ([`ModelConfig`], read from GGUF metadata or a Hugging Face `config.json`), the names
//! its checkpoints give each weight ([`Naming`]), where the weights come from
//! ([`TensorSource`]) and the RoPE frequencies its config defines.

mod checkpoint;
mod config;
mod error;
mod names;
mod rope;
mod source;

pub use config::{Arch, Llama3Scaling, ModelConfig, RopeStyle};
pub use error::{ArchError, Result};
pub use names::{BertLayerTensor, BertTensor, DecoderLayerTensor, DecoderTensor, Naming};
pub use rope::rope_frequencies;
pub use source::{MemorySource, RawTensor, TensorSource};
