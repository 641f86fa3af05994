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
//!
//! Weights come from any `quench_models::arch::TensorSource`, named as a GGUF or Hugging
//! Face checkpoint names them (`quench_models::arch::Naming`).

mod arithmetic;
mod attention;
mod bert;
mod blocks;
mod decoder;
mod error;
mod f16_attention;
mod ggml_math;
mod kv_cache;
mod load;
mod math;
mod matrix;
mod packed;
mod packed_dot;
mod prefetch;
mod q8;
mod real;
mod rope;
mod streamed;
mod weight;

pub use arithmetic::{Arithmetic, GgmlKernels};
pub use bert::Encoder;
pub use decoder::{Decoder, Logits};
pub use error::{CpuError, Result};
pub use kv_cache::KvCache;
pub use load::held_bytes;
pub use math::erf;
pub use matrix::Matrix;
pub use real::Real;
pub use streamed::{StreamProgress, StreamStats, StreamedLogits, StreamedReference};
