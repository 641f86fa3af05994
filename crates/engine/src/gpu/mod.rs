//! Decoders on a GPU (or on quench's kernel interpreter, which runs the same kernels on
//! the CPU).
//!
//! - [`Catalog`]: which library kernel runs each part of the model, from its config and
//!   the stored format of each weight (bf16, f16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K;
//!   anything else is refused by name).
//! - [`DecodeGraph`]: the dispatch list of one decode step, with fused residual adds,
//!   q/k/v in one product and gate/up in one SwiGLU kernel; its activations share one
//!   arena ([`arena`]), planned before anything is allocated.
//! - [`GpuDecoder`]: weights uploaded as stored (never expanded), a paged KV cache shared
//!   by its [`GpuSession`]s, the step captured once per row count and replayed with only
//!   the rows' token ids, positions and (every 16 positions, or when a session takes
//!   another row) block tables written by the host. One step decodes a token for each of
//!   up to `max_batch` sessions ([`GpuDecoder::step_batch`]), each weight read once for
//!   all of them, and a session's logits have the same bits whichever sessions share its
//!   steps. A session's prompt ([`GpuDecoder::feed`], and each row of
//!   [`GpuDecoder::feed_batch`], from [`GpuOptions::prefill_min_tokens`] tokens on) goes
//!   through the prompt path ([`prefill`]) in chunks of up to
//!   [`GpuOptions::prefill_chunk`] tokens: tensor-core GEMMs over the chunk's rows with f16
//!   operands, its keys and values written into the same cache. Single tokens, and prompts
//!   where the chunk is 0, are fed through the decode step (rows at different positions
//!   share steps).
//! - [`check`]: the FP64 check of a device generation against the CPU reference.
//! - [`profile`]: GPU times of every dispatch of every step, switched on for the process.
//!
//! - [`encoder`]: sentence embedders (BERT) on a device: padded batches through the
//!   tensor-core GEMMs, bidirectional attention, pooling on the host.

pub mod arena;
mod backend;
mod catalog;
pub mod check;
mod decoder;
pub mod encoder;
mod error;
mod graph;
mod kv;
mod listing;
mod masking;
mod plan;
pub mod prefill;
pub mod profile;
mod stored;
pub mod tensor_parallel;
mod timing;
mod weights;

use std::path::Path;

pub use catalog::{weight_format, Catalog, LayerKernels, Qkv, Widened};
pub use decoder::{
    Backend, GpuDecoder, GpuOptions, GpuSummary, DEFAULT_CONTEXT, DEFAULT_PREFILL_CHUNK,
    DEFAULT_PREFILL_MIN_TOKENS,
};
pub use error::GpuError;
pub use graph::{DecodeGraph, Dispatch, KvLayout, Products, Reduction, Rows, StepShape};
pub use kv::GpuSession;
pub use listing::{dispatch_listing, gpu_catalog};
pub use prefill::{matrix_params, PrefillPlan};
pub use stored::{StoredTensor, StoredTensors};
pub use tensor_parallel::{TensorParallel, TpSession};
pub use timing::DecodeTiming;

use crate::checkpoint::{self, Checkpoint};
use crate::error::Result;
use crate::options::{Device, LoadOptions, Runtime};

/// The executor `options.device` names: a GPU or quench's interpreter.
pub(crate) fn backend_of(options: &LoadOptions) -> Backend {
    match options.device {
        Device::Interp => Backend::Interp,
        Device::Cuda | Device::Cpu => match options.runtime {
            Runtime::Cuda => Backend::Cuda {
                ordinal: options.gpu,
                codegen: options.codegen,
            },
            Runtime::Native => Backend::Native {
                ordinal: options.gpu,
                codegen: options.codegen,
            },
        },
    }
}

/// The decoder options a load's options ask for.
pub(crate) fn gpu_options(options: &LoadOptions) -> GpuOptions {
    GpuOptions {
        context: options.context_limit,
        sessions: options.sessions.unwrap_or(1).max(1),
        max_batch: options.max_batch.unwrap_or(1).max(1),
        prefill_chunk: options.prefill_chunk.unwrap_or(DEFAULT_PREFILL_CHUNK),
        tensor_core_decode: options.tensor_core_decode,
        kv_cache: options.kv_cache,
        ..GpuOptions::default()
    }
}

/// Puts the decoder at `path` (a GGUF file or Hugging Face directory) on `backend`.
pub fn load_decoder(path: &Path, backend: Backend, options: &GpuOptions) -> Result<GpuDecoder> {
    let ckpt = checkpoint::open(path)?;
    let config = ckpt.config().map_err(|e| e.in_model(ckpt.path()))?;
    decoder_from(&ckpt, config, backend, options).map_err(|e| e.in_model(ckpt.path()))
}

/// The checkpoint's tensors as stored, for uploading without expanding them.
fn stored(ckpt: &Checkpoint) -> &dyn StoredTensors {
    match ckpt {
        Checkpoint::Gguf { file, .. } => file,
        Checkpoint::HuggingFace { checkpoint, .. } => checkpoint,
    }
}

/// Puts the decoder of the open checkpoint `ckpt`, whose config is `config`, on `backend`.
pub(crate) fn decoder_from(
    ckpt: &Checkpoint,
    config: quench_models::arch::ModelConfig,
    backend: Backend,
    options: &GpuOptions,
) -> Result<GpuDecoder> {
    let (exec, available) = decoder::open(backend)?;
    Ok(GpuDecoder::new(
        config,
        stored(ckpt),
        ckpt.naming(),
        exec,
        available,
        options,
    )?)
}

/// The narrower model each of `ranks` GPUs runs when `config`'s model is split across them
/// (`--tensor-parallel`), or why the model does not divide by `ranks`.
pub fn tensor_parallel_share(
    config: &quench_models::arch::ModelConfig,
    ranks: usize,
) -> std::result::Result<quench_models::arch::ModelConfig, GpuError> {
    tensor_parallel::check_degree(config, ranks)?;
    Ok(tensor_parallel::share_config(config, ranks))
}

/// Puts the decoder of the open checkpoint `ckpt` on `ranks` devices, a share on each
/// ([`TensorParallel`]): GPUs `ordinal .. ordinal + ranks` of `backend`, or as many
/// interpreters.
pub(crate) fn tensor_parallel_from(
    ckpt: &Checkpoint,
    config: quench_models::arch::ModelConfig,
    backend: Backend,
    ranks: usize,
    options: &GpuOptions,
) -> Result<TensorParallel> {
    tensor_parallel::check_degree(&config, ranks)?;
    let rank_backend = |r: u32| match backend {
        Backend::Cuda { ordinal, codegen } => Backend::Cuda {
            ordinal: ordinal + r,
            codegen,
        },
        Backend::Native { ordinal, codegen } => Backend::Native {
            ordinal: ordinal + r,
            codegen,
        },
        Backend::Interp => Backend::Interp,
    };
    if let Backend::Cuda { ordinal, .. } = backend {
        let found = quench_rt::list_devices().map_or(0, |d| d.len());
        if ordinal as usize + ranks > found {
            return Err(GpuError::Unsupported {
                what: format!("tensor parallelism over {ranks} GPUs"),
                reason: format!(
                    "it needs GPUs {ordinal} to {}, and the driver reports {found}",
                    ordinal as usize + ranks - 1
                ),
            }
            .into());
        }
    }
    let mut executors = Vec::with_capacity(ranks);
    for r in 0..ranks {
        executors.push(decoder::open(rank_backend(r as u32))?);
    }
    Ok(TensorParallel::new(
        config,
        stored(ckpt),
        ckpt.naming(),
        executors,
        options,
    )?)
}
