//! What a model is and what running it costs, read from its headers alone.

use std::collections::BTreeMap;
use std::path::PathBuf;

use quench_models::arch::ModelConfig;

use crate::checkpoint::Checkpoint;
use crate::options::{Device, LoadOptions, Precision};
use quench_cpu::held_bytes;

/// The file format a model was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gguf,
    HuggingFace,
    /// Built in memory (the synthetic models), read from no file.
    InMemory,
}

/// What a model does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// A decoder that continues text (llama, qwen2, qwen3).
    Causal,
    /// An encoder that turns text into a vector (BERT).
    Embedding,
}

/// A model's description: architecture, size, storage types and memory needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// The GGUF file or checkpoint directory.
    pub path: PathBuf,
    pub format: Format,
    pub kind: ModelKind,
    /// The shape of the network, as quench runs it.
    pub config: ModelConfig,
    /// Elements of every floating-point or quantized tensor in the checkpoint.
    pub parameters: u64,
    /// How many tensors are stored in each type (`Q4_1`, `F32`, `BF16`, …), by type name.
    pub tensor_types: BTreeMap<String, usize>,
    /// Bytes of tensor data in the checkpoint.
    pub file_bytes: u64,
    /// The longest context the model was trained for.
    pub context_length: usize,
    /// The context this load allows: [`LoadOptions::context_limit`] capped at
    /// `context_length` (and, for sentence embedders, at their `max_seq_length`).
    pub context_limit: usize,
    /// Bytes the weights take in memory at the load's precision.
    pub weight_bytes: u64,
    /// Bytes of one session's KV cache when it holds `context_limit` positions.
    pub kv_cache_bytes: u64,
    /// On the GPU, the tensors expanded to f16 as they were uploaded.
    pub widened: Vec<crate::gpu::Widened>,
}

impl ModelInfo {
    /// Memory needed to run one session at the full context limit.
    pub fn memory_bytes(&self) -> u64 {
        self.weight_bytes + self.kv_cache_bytes
    }

    /// A model built in memory with `parameters` f32 weights, at its full context (on the
    /// CPU, in f32).
    pub(crate) fn in_memory(config: ModelConfig, parameters: u64) -> ModelInfo {
        let context_limit = config.max_positions;
        let (kind, kv_cache_bytes) = kind_and_kv_bytes(&config, context_limit, 4);
        ModelInfo {
            path: PathBuf::new(),
            format: Format::InMemory,
            kind,
            parameters,
            tensor_types: BTreeMap::from([("F32".to_owned(), 1)]),
            file_bytes: 0,
            context_length: context_limit,
            context_limit,
            weight_bytes: parameters * 4,
            kv_cache_bytes,
            widened: vec![],
            config,
        }
    }

    pub(crate) fn new(
        checkpoint: &Checkpoint,
        config: ModelConfig,
        model_limit: usize,
        options: &LoadOptions,
    ) -> ModelInfo {
        let mut tensor_types = BTreeMap::new();
        let (mut parameters, mut file_bytes) = (0u64, 0u64);
        let element = options.precision.bytes();
        // What the weights take once loaded, where it is not every parameter at the load's
        // precision: a decoder on the CPU keeps a GGUF file's quantized and 16-bit matrices
        // in their stored types.
        let mut held = None;
        match checkpoint {
            Checkpoint::Gguf { file, .. } => {
                for t in file.tensor_infos() {
                    *tensor_types
                        .entry(t.ggml_type.name().to_owned())
                        .or_insert(0) += 1;
                    parameters += t.n_elements();
                    file_bytes += t.size;
                }
                if options.device == Device::Cpu && config.arch.is_decoder() {
                    let held_of = match options.precision {
                        Precision::F32 => held_bytes::<f32>,
                        Precision::F64 => held_bytes::<f64>,
                    };
                    let infos = file.tensor_infos().iter();
                    held = Some(
                        infos
                            .map(|t| {
                                held_of(t.ggml_type, t.dims.len() == 2, t.n_elements(), t.size)
                            })
                            .sum(),
                    );
                }
            }
            Checkpoint::HuggingFace { checkpoint, .. } => {
                for t in checkpoint.tensor_infos() {
                    file_bytes += t.end - t.start;
                    // Integer tensors are buffers (BERT's position_ids), not parameters.
                    if t.dtype.is_supported() {
                        *tensor_types.entry(t.dtype.name().to_owned()).or_insert(0) += 1;
                        parameters += t.shape.iter().product::<u64>();
                    }
                }
            }
        }
        let context_length = config.max_positions;
        let context_limit = options
            .context_limit
            .unwrap_or(model_limit)
            .min(model_limit)
            .max(1);
        let (kind, kv_cache_bytes) = kind_and_kv_bytes(&config, context_limit, element);
        ModelInfo {
            path: checkpoint.path().to_owned(),
            format: match checkpoint {
                Checkpoint::Gguf { .. } => Format::Gguf,
                Checkpoint::HuggingFace { .. } => Format::HuggingFace,
            },
            kind,
            parameters,
            tensor_types,
            file_bytes,
            context_length,
            context_limit,
            weight_bytes: held.unwrap_or(parameters * element),
            kv_cache_bytes,
            widened: vec![],
            config,
        }
    }
}

/// What the model does, and the bytes of one session's KV cache at `context_limit`
/// positions of `element`-byte keys and values (none for encoders).
fn kind_and_kv_bytes(config: &ModelConfig, context_limit: usize, element: u64) -> (ModelKind, u64) {
    if config.arch.is_decoder() {
        let elements = 2 * config.layers * config.kv_heads * config.head_dim * context_limit;
        (ModelKind::Causal, elements as u64 * element)
    } else {
        (ModelKind::Embedding, 0)
    }
}
