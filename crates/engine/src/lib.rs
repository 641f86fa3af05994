//! quench-engine: models from files to answers.
//!
//! [`load`] opens a GGUF file or a Hugging Face checkpoint directory (`config.json`,
//! safetensors, `tokenizer.json`, `tokenizer_config.json`), finds its architecture, tokenizer,
//! chat template and end-of-sequence tokens, and reads its weights for the chosen
//! [`Device`] and [`Precision`]. [`inspect`] describes a model from its headers alone.
//!
//! ```no_run
//! use quench_engine::{load, GenerateOptions, LoadOptions, Message, Prompt};
//! # fn main() -> Result<(), quench_engine::EngineError> {
//! let model = load("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), &LoadOptions::default())?;
//! let model = model.causal()?;
//! let mut session = model.new_session();
//! let chat = [Message::new("user", "What is the capital of France?")];
//! let answer = model.generate(
//!     &mut session,
//!     Prompt::Chat(&chat),
//!     &GenerateOptions::default(),
//!     &mut |piece| print!("{piece}"),
//! )?;
//! eprintln!("{} tokens", answer.tokens.len());
//! # Ok(())
//! # }
//! ```
//!
//! A [`Model`] is `Send + Sync`: load it once, share it behind an `Arc`, and give each
//! conversation or request its own [`Session`].

pub mod backend;
mod causal;
mod checkpoint;
pub mod cpu;
mod embedding;
mod error;
pub mod generate;
pub mod gpu;
mod info;
mod load;
mod options;
pub mod synth;
mod text;

pub use backend::{Decode, Fed, Masks, Rows, Sequence};
pub use causal::{BatchItem, CausalModel, Generation, Prompt, Session};
pub use embedding::{Embedding, EmbeddingModel, Pooling};
pub use error::{EngineError, Result};
pub use generate::{argmax, FinishReason, GenerateOptions, Sampler, SamplingParams, TextStream};
pub use info::{Format, ModelInfo, ModelKind};
pub use load::{inspect, load};
pub use options::{
    Arithmetic, Codegen, Device, GgmlKernels, KvCache, LoadOptions, Precision, Runtime,
};
pub use quench_models::arch::{Arch, ModelConfig};
pub use quench_text::Message;

/// A loaded model: one that generates text or one that embeds it.
// One exists per loaded model, so the size of the smaller variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Model {
    Causal(CausalModel),
    Embedding(EmbeddingModel),
}

impl Model {
    pub fn info(&self) -> &ModelInfo {
        match self {
            Model::Causal(m) => m.info(),
            Model::Embedding(m) => m.info(),
        }
    }

    /// The model as a text generator, or an error saying it only embeds.
    pub fn causal(&self) -> Result<&CausalModel> {
        match self {
            Model::Causal(m) => Ok(m),
            Model::Embedding(m) => Err(EngineError::WrongKind {
                path: m.info().path.clone(),
                found: "an embedding model",
                expected: "it cannot generate text",
            }),
        }
    }

    /// The model as a text generator, owned, or an error saying it only embeds.
    pub fn into_causal(self) -> Result<CausalModel> {
        match self {
            Model::Causal(m) => Ok(m),
            Model::Embedding(m) => Err(EngineError::WrongKind {
                path: m.info().path.clone(),
                found: "an embedding model",
                expected: "it cannot generate text",
            }),
        }
    }

    /// The model as an embedder, or an error saying it generates text.
    pub fn embedding(&self) -> Result<&EmbeddingModel> {
        match self {
            Model::Embedding(m) => Ok(m),
            Model::Causal(m) => Err(EngineError::WrongKind {
                path: m.info().path.clone(),
                found: "a text generation model",
                expected: "it does not make embeddings",
            }),
        }
    }
}
