//! Loading a checkpoint into a runnable model.

use std::path::Path;
use std::sync::Mutex;

use quench_cpu::{Decoder, Encoder, ModelConfig};
use serde_json::Value;

use crate::causal::{CausalModel, Weights};
use crate::checkpoint::{self, Checkpoint};
use crate::embedding::{EmbeddingModel, Encoders, Pooling};
use crate::error::{EngineError, Result};
use crate::gpu::encoder::GpuEncoder;
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
/// tokenizer and chat template.
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
    if options.device == Device::Cuda {
        let backend = crate::gpu::Backend::Cuda { ordinal: 0 };
        return match embedding {
            None => crate::gpu::load_causal(path, backend, options).map(Model::Causal),
            Some(setup) => {
                embedding_on(checkpoint, config, setup, backend, options).map(Model::Embedding)
            }
        };
    }
    let info = info(&checkpoint, config.clone(), embedding.as_ref(), options);
    let in_model = |e: EngineError| e.in_model(checkpoint.path());
    let text = text::read(&checkpoint).map_err(in_model)?;
    let (src, naming) = (checkpoint.tensors(), checkpoint.naming());
    // describe() sets up pooling exactly for the encoders.
    let model = match embedding {
        None => {
            let weights = match options.precision {
                Precision::F32 => Weights::F32(Decoder::load_with_arithmetic(
                    config,
                    src,
                    naming,
                    options.arithmetic,
                )?),
                Precision::F64 => Weights::F64(Decoder::load(config, src, naming)?),
            };
            Model::Causal(CausalModel::new(
                weights,
                text.tokenizer,
                text.template,
                text.eos_ids,
                info,
            ))
        }
        Some(setup) => {
            let encoder = match options.precision {
                Precision::F32 => Encoders::F32(Encoder::load(config, src, naming)?),
                Precision::F64 => Encoders::F64(Encoder::load(config, src, naming)?),
            };
            Model::Embedding(EmbeddingModel::new(
                encoder,
                text.tokenizer,
                setup.pooling,
                setup.normalize,
                info,
            ))
        }
    };
    Ok(model)
}

/// Loads the embedding model at `path` (a BERT checkpoint) with its weights on `backend`:
/// what `load` does with [`Device::Cuda`], on any backend (quench's interpreter included).
/// `options.precision` does not apply (the device kernels have their own).
pub fn load_embedding(
    path: &Path,
    backend: crate::gpu::Backend,
    options: &LoadOptions,
) -> Result<EmbeddingModel> {
    let checkpoint = checkpoint::open(path)?;
    let (config, embedding) = describe(&checkpoint)?;
    let Some(setup) = embedding else {
        return Err(EngineError::WrongKind {
            path: checkpoint.path().to_owned(),
            found: "a text generation model",
            expected: "it does not make embeddings",
        });
    };
    embedding_on(checkpoint, config, setup, backend, options)
}

fn embedding_on(
    checkpoint: Checkpoint,
    config: ModelConfig,
    setup: EmbeddingSetup,
    backend: crate::gpu::Backend,
    options: &LoadOptions,
) -> Result<EmbeddingModel> {
    let mut info = info(&checkpoint, config.clone(), Some(&setup), options);
    let in_model = |e: EngineError| e.in_model(checkpoint.path());
    let text = text::read(&checkpoint).map_err(in_model)?;
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
