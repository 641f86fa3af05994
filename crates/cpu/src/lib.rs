//! quench-cpu: plain CPU forward passes for the models quench runs.
//!
//! Each architecture is written once over [`Real`] and used in two precisions: `f64`, the
//! reference that GPU results are judged against (every operation in double precision), and
//! `f32`, fast enough to chat with small models (matrix products spread over all cores).
//!
//! - [`Decoder`]: llama, qwen2, qwen3, with a [`KvCache`] for prefill then decode. In f32 it
//!   rounds plainly by default, or as llama.cpp's CPU path does ([`Arithmetic`]).
//! - [`StreamedReference`]: the same decoders in f64 for models too large to expand whole,
//!   teacher-forced over a sequence with one layer's weights in memory at a time.
//! - [`Encoder`]: BERT hidden states and sentence embeddings.
//! - [`Sampler`] and [`generate`]: greedy and sampled decoding with stop strings.
//!
//! Weights come from any [`TensorSource`], named as a GGUF or Hugging Face checkpoint names
//! them ([`Naming`]).

mod arithmetic;
mod attention;
mod bert;
mod blocks;
mod checkpoint;
mod config;
mod decoder;
mod error;
mod f16_attention;
mod generate;
mod ggml_math;
mod kv_cache;
mod load;
mod math;
mod matrix;
mod names;
mod q8;
mod real;
mod rope;
mod sampling;
mod source;
mod streamed;
mod weight;

pub use arithmetic::Arithmetic;
pub use bert::Encoder;
pub use config::{Arch, Llama3Scaling, ModelConfig, RopeStyle};
pub use decoder::{Decoder, Logits};
pub use error::{CpuError, Result};
pub use generate::{generate, CausalLm, FinishReason, GenerateOptions, Generation, Session};
pub use kv_cache::KvCache;
pub use math::erf;
pub use matrix::{linear, Matrix};
pub use names::{BertLayerTensor, BertTensor, DecoderLayerTensor, DecoderTensor, Naming};
pub use real::Real;
pub use rope::rope_frequencies;
pub use sampling::{
    apply_repetition_penalty, argmax, min_p_filter, top_k_filter, top_p_filter, Candidate, Sampler,
    SamplingParams,
};
pub use source::{MemorySource, RawTensor, TensorSource};
pub use streamed::{StreamProgress, StreamStats, StreamedLogits, StreamedReference};
