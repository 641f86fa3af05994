//! Loading a checkpoint into a runnable model.

use std::path::Path;
use std::sync::Mutex;

use quench_cpu::{Decoder, Encoder};
use quench_models::arch::ModelConfig;
use serde_json::Value;

use crate::backend::Decode;
use crate::causal::CausalModel;
use crate::checkpoint::{self, Checkpoint};
use crate::embedding::{EmbeddingModel, Encoders, Pooling};
use crate::error::{EngineError, Result};
use crate::gpu::{self, encoder::GpuEncoder};
use crate::info::ModelInfo;
use crate::options::{Arithmetic, Device, LoadOptions, Precision};
use crate::text;
use crate::Model;

/// Describes the model at `path` from its headers, without reading its weights.
pub fn inspect(path: &Path, options: &LoadOptions) -> Result<ModelInfo> {
    let checkpoint = checkpoint::open(path)?;
    let (config, embedding) = describe(&checkpoint)?;
    Ok(info(&checkpoint, config, embedding.as_ref(), options))
}

/// Loads the model at `path` (a GGUF file or a Hugging Face checkpoint directory) with its
/// tokenizer and chat template, on the device and with the choices `options` names. The
/// checkpoint is opened and its config read once.
pub fn load(path: &Path, options: &LoadOptions) -> Result<Model> {
    let checkpoint = checkpoint::open(path)?;
    let (config, embedding) = describe(&checkpoint)?;
    if options.arithmetic != Arithmetic::F32
        && (options.device != Device::Cpu
            || options.precision != Precision::F32
            || embedding.is_some())
    {
        return Err(EngineError::Unsupported {
            what: format!("{:?} arithmetic", options.arithmetic),
            reason: "it applies to text models on the CPU in f32 only".into(),
        });
    }
    // describe() sets up pooling exactly for the encoders.
    match embedding {
        None => causal(&checkpoint, config, options).map(Model::Causal),
        Some(setup) => embedder(&checkpoint, config, setup, options).map(Model::Embedding),
    }
}

fn causal(
    checkpoint: &Checkpoint,
    config: ModelConfig,
    options: &LoadOptions,
) -> Result<CausalModel> {
    let in_model = |e: EngineError| e.in_model(checkpoint.path());
    let text = text::read(checkpoint).map_err(in_model)?;
    let mut info = info(checkpoint, config.clone(), None, options);
    let (src, naming) = (checkpoint.tensors(), checkpoint.naming());
    if options.device == Device::Cpu && options.tensor_parallel.is_some() {
        return Err(EngineError::Unsupported {
            what: "tensor parallelism".into(),
            reason: "it splits quench's kernels across GPUs, not the CPU decoder".into(),
        });
    }
    let backend: Box<dyn Decode> = match (options.device, options.precision) {
        (Device::Cpu, Precision::F32) => {
            let d = Decoder::<f32>::load_with_arithmetic(config, src, naming, options.arithmetic)?;
            info.weight_bytes = d.weight_bytes() as u64;
            Box::new(d)
        }
        (Device::Cpu, Precision::F64) => {
            let d = Decoder::<f64>::load(config, src, naming)?;
            info.weight_bytes = d.weight_bytes() as u64;
            Box::new(d)
        }
        // The GPU kernels have their own precision.
        (Device::Cuda | Device::Interp, _) => {
            let gpu_options = gpu::gpu_options(options);
            let backend = gpu::backend_of(options);
            let (decoder, summary): (Box<dyn Decode>, _) = match options.tensor_parallel {
                Some(ranks) => {
                    let tp =
                        gpu::tensor_parallel_from(checkpoint, config, backend, ranks, &gpu_options)
                            .map_err(in_model)?;
                    let summary = tp.summary();
                    (Box::new(tp), summary)
                }
                None => {
                    let decoder = gpu::decoder_from(checkpoint, config, backend, &gpu_options)
                        .map_err(in_model)?;
                    let summary = decoder.summary().clone();
                    (Box::new(decoder), summary)
                }
            };
            info.context_limit = summary.context;
            info.weight_bytes = summary.weight_bytes;
            info.kv_cache_bytes = summary.kv_cache_bytes;
            info.widened = summary.widened;
            decoder
        }
    };
    Ok(CausalModel::new(
        backend,
        text.tokenizer,
        text.template,
        text.eos_ids,
        info,
    ))
}

fn embedder(
    checkpoint: &Checkpoint,
    config: ModelConfig,
    setup: EmbeddingSetup,
    options: &LoadOptions,
) -> Result<EmbeddingModel> {
    if options.device.runs_kernels() {
        return embedding_on(checkpoint, config, setup, gpu::backend_of(options), options);
    }
    let info = info(checkpoint, config.clone(), Some(&setup), options);
    let in_model = |e: EngineError| e.in_model(checkpoint.path());
    let text = text::read(checkpoint).map_err(in_model)?;
    let (src, naming) = (checkpoint.tensors(), checkpoint.naming());
    let encoder = match options.precision {
        Precision::F32 => Encoders::F32(Encoder::load(config, src, naming)?),
        Precision::F64 => Encoders::F64(Encoder::load(config, src, naming)?),
    };
    Ok(EmbeddingModel::new(
        encoder,
        text.tokenizer,
        setup.pooling,
        setup.normalize,
        info,
    ))
}

fn embedding_on(
    checkpoint: &Checkpoint,
    config: ModelConfig,
    setup: EmbeddingSetup,
    backend: crate::gpu::Backend,
    options: &LoadOptions,
) -> Result<EmbeddingModel> {
    let mut info = info(checkpoint, config.clone(), Some(&setup), options);
    let in_model = |e: EngineError| e.in_model(checkpoint.path());
    let text = text::read(checkpoint).map_err(in_model)?;
    let encoder = GpuEncoder::on(backend, config, checkpoint.tensors(), checkpoint.naming())
        .map_err(|e| in_model(e.into()))?;
    info.weight_bytes = encoder.weight_bytes();
    Ok(EmbeddingModel::new(
        Encoders::Gpu(Box::new(Mutex::new(encoder))),
        text.tokenizer,
        setup.pooling,
        setup.normalize,
        info,
    ))
}

/// How an encoder turns token states into one vector, and how many tokens it reads.
struct EmbeddingSetup {
    pooling: Pooling,
    normalize: bool,
    max_tokens: Option<usize>,
}

fn describe(checkpoint: &Checkpoint) -> Result<(ModelConfig, Option<EmbeddingSetup>)> {
    let in_model = |e: EngineError| e.in_model(checkpoint.path());
    let config = checkpoint.config().map_err(in_model)?;
    let embedding = if config.arch.is_decoder() {
        None
    } else {
        Some(embedding_setup(checkpoint).map_err(in_model)?)
    };
    Ok((config, embedding))
}

fn info(
    checkpoint: &Checkpoint,
    config: ModelConfig,
    embedding: Option<&EmbeddingSetup>,
    options: &LoadOptions,
) -> ModelInfo {
    let model_limit = embedding
        .and_then(|e| e.max_tokens)
        .unwrap_or(config.max_positions)
        .min(config.max_positions);
    ModelInfo::new(checkpoint, config, model_limit, options)
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| EngineError::Json {
                path: path.to_owned(),
                source,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(EngineError::Io {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Pooling from sentence-transformers' `modules.json` and its Pooling module's config, or
/// GGUF `bert.pooling_type`. Without either: mean pooling, normalized.
fn embedding_setup(checkpoint: &Checkpoint) -> Result<EmbeddingSetup> {
    let unsupported = |reason: String| EngineError::Unsupported {
        what: "pooling".into(),
        reason,
    };
    match checkpoint {
        Checkpoint::Gguf { file, .. } => {
            let pooling = match file.get_u32("bert.pooling_type").ok() {
                None | Some(1) => Pooling::Mean,
                Some(2) => Pooling::Cls,
                Some(other) => {
                    return Err(unsupported(format!(
                        "bert.pooling_type {other} (quench pools by mean (1) or CLS (2))"
                    )))
                }
            };
            Ok(EmbeddingSetup {
                pooling,
                normalize: true,
                max_tokens: None,
            })
        }
        Checkpoint::HuggingFace { dir, .. } => {
            let max_tokens = read_json(&dir.join("sentence_bert_config.json"))?
                .and_then(|c| c.get("max_seq_length")?.as_u64())
                .map(|n| n as usize);
            let Some(modules) = read_json(&dir.join("modules.json"))? else {
                return Ok(EmbeddingSetup {
                    pooling: Pooling::Mean,
                    normalize: true,
                    max_tokens,
                });
            };
            let modules = modules.as_array().cloned().unwrap_or_default();
            let module_type = |m: &Value| {
                m.get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned()
            };
            let normalize = modules
                .iter()
                .any(|m| module_type(m).ends_with(".Normalize"));
            let pooling = match modules
                .iter()
                .find(|m| module_type(m).ends_with(".Pooling"))
            {
                None => Pooling::Mean,
                Some(m) => {
                    let sub = m.get("path").and_then(Value::as_str).unwrap_or("");
                    let config = read_json(&dir.join(sub).join("config.json"))?;
                    let mode = |key: &str| {
                        config
                            .as_ref()
                            .and_then(|c| c.get(key)?.as_bool())
                            .unwrap_or(false)
                    };
                    if mode("pooling_mode_cls_token") {
                        Pooling::Cls
                    } else if mode("pooling_mode_mean_tokens") || config.is_none() {
                        Pooling::Mean
                    } else {
                        return Err(unsupported(format!(
                            "{}/config.json asks for a pooling mode other than mean or CLS",
                            sub
                        )));
                    }
                }
            };
            Ok(EmbeddingSetup {
                pooling,
                normalize,
                max_tokens,
            })
        }
    }
}
