//! Decoders on a GPU (or on quench's kernel interpreter, which runs the same kernels on
//! the CPU).
//!
//! - [`Catalog`]: which library kernel runs each part of the model, from its config and
//!   the stored format of each weight (bf16, f16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K; anything
//!   else is refused by name).
//! - [`DecodeGraph`]: the dispatch list of one decode step, with fused residual adds,
//!   q/k/v in one product and gate/up in one SwiGLU kernel; its activations share one
//!   arena ([`arena`]), planned before anything is allocated.
//! - [`GpuDecoder`]: weights uploaded as stored (never expanded), a paged KV cache shared
//!   by its [`GpuSession`]s, the step captured once per row count and replayed with only
//!   the rows' token ids, positions and (every 16 positions, or when a session takes
//!   another row) block tables written by the host. One step decodes a token for each of
//!   up to `max_batch` sessions ([`GpuDecoder::step_batch`]), each weight read once for
//!   all of them, and a session's logits have the same bits whichever sessions share its
//!   steps. Prompts are fed through the same step, one token at a time (prompts at
//!   different positions share steps: [`GpuDecoder::feed_batch`]) — or, where
//!   [`GpuOptions::prefill_chunk`] is set, a session's prompt ([`GpuDecoder::feed`], from
//!   [`GpuOptions::prefill_min_tokens`] tokens on) goes through the prompt path
//!   ([`prefill`]) in chunks: tensor-core GEMMs over the chunk's rows, its keys and values
//!   written into the same cache. Its bf16 activations do not yet hold the FP64 check's
//!   bound on real checkpoints, so it is off unless asked for (`quench bench` asks).
//! - [`check`]: the FP64 check of a device generation against the CPU reference.
//! - [`profile`]: GPU times of every dispatch of every step, switched on for the process.
//!
//! - [`encoder`]: sentence embedders (BERT) on a device: padded batches through the
//!   tensor-core GEMMs, bidirectional attention, pooling on the host.

pub mod arena;
mod catalog;
pub mod check;
mod decoder;
pub mod encoder;
mod error;
mod feeder;
mod graph;
mod kv;
pub mod prefill;
pub mod profile;
mod stored;
mod timing;

use std::path::Path;

pub use catalog::{weight_format, Catalog, LayerKernels, Qkv};
pub use decoder::{
    Backend, GpuDecoder, GpuOptions, GpuSummary, DEFAULT_CONTEXT, DEFAULT_PREFILL_CHUNK,
    DEFAULT_PREFILL_MIN_TOKENS,
};
pub use error::GpuError;
pub use graph::{DecodeGraph, Dispatch, KvLayout, Products, Rows, StepShape};
pub use kv::GpuSession;
pub use prefill::{matrix_params, PrefillPlan};
pub use stored::{StoredTensor, StoredTensors};
pub use timing::DecodeTiming;

pub(crate) use feeder::Feeder;

use crate::causal::{CausalModel, Weights};
use crate::checkpoint::{self, Checkpoint};
use crate::error::Result;
use crate::info::ModelInfo;
use crate::options::LoadOptions;
use crate::text;

/// Loads the decoder at `path` with its tokenizer and chat template, its weights on
/// `backend` (`quench_engine::load` with [`crate::Device::Cuda`] is this with CUDA device 0).
/// `options.context_limit` sizes the KV cache ([`DEFAULT_CONTEXT`] positions when unset),
/// `options.max_batch` the activations of a step; `options.precision` does not apply (the
/// GPU kernels have their own).
/// [`CausalModel::gpu_decoder`] reaches the decoder (what was put on the device, timing).
pub fn load_causal(path: &Path, backend: Backend, options: &LoadOptions) -> Result<CausalModel> {
    load_causal_with_prefill(path, backend, options, 0)
}

/// As [`load_causal`], feeding prompts of [`DEFAULT_PREFILL_MIN_TOKENS`] tokens or more
/// through the prompt path in chunks of up to `prefill_chunk` tokens (0: one decode step
/// per token). The prompt path's bf16 activations put logits further from the f64
/// reference than the decode step's f32 ones (see [`prefill`]).
pub fn load_causal_with_prefill(
    path: &Path,
    backend: Backend,
    options: &LoadOptions,
    prefill_chunk: usize,
) -> Result<CausalModel> {
    let ckpt = checkpoint::open(path)?;
    let in_model = |e: crate::EngineError| e.in_model(ckpt.path());
    let config = ckpt.config().map_err(in_model)?;
    let side = text::read(&ckpt).map_err(in_model)?;
    let gpu_options = GpuOptions {
        context: options.context_limit,
        sessions: options.sessions.unwrap_or(1).max(1),
        max_batch: options.max_batch.unwrap_or(1).max(1),
        prefill_chunk,
        tensor_core_decode: options.tensor_core_decode,
        kv_cache: options.kv_cache,
        ..GpuOptions::default()
    };
    let decoder = decoder_from(&ckpt, backend, &gpu_options).map_err(in_model)?;
    let summary = decoder.summary();
    let mut info = ModelInfo::new(&ckpt, config.clone(), config.max_positions, options);
    info.context_limit = summary.context;
    info.weight_bytes = summary.weight_bytes;
    info.kv_cache_bytes = summary.kv_cache_bytes;
    Ok(CausalModel::new(
        Weights::Gpu(Box::new(decoder)),
        side.tokenizer,
        side.template,
        side.eos_ids,
        info,
    ))
}

/// Puts the decoder at `path` (a GGUF file or Hugging Face directory) on `backend`.
pub fn load_decoder(path: &Path, backend: Backend, options: &GpuOptions) -> Result<GpuDecoder> {
    let ckpt = checkpoint::open(path)?;
    decoder_from(&ckpt, backend, options).map_err(|e| e.in_model(ckpt.path()))
}

pub(crate) fn decoder_from(
    ckpt: &Checkpoint,
    backend: Backend,
    options: &GpuOptions,
) -> Result<GpuDecoder> {
    let config = ckpt.config()?;
    let (exec, available) = decoder::open(backend)?;
    let (src, naming): (&dyn StoredTensors, _) = match ckpt {
        Checkpoint::Gguf { file, .. } => (file, quench_cpu::Naming::Gguf),
        Checkpoint::HuggingFace { checkpoint, .. } => (checkpoint, quench_cpu::Naming::HuggingFace),
    };
    Ok(GpuDecoder::new(
        config, src, naming, exec, available, options,
    )?)
}
