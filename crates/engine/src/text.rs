//! A checkpoint's tokenizer, chat template and end-of-sequence tokens.

use std::path::Path;

use quench_models::{chat_template_source, read_optional_json, GgufFile, HfConfig, HfFileError};
use quench_text::{ChatTemplate, Tokenizer};
use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::error::{EngineError, Result};

/// Tokens that end a turn in common chat formats. When one of them is a special token of the
/// vocabulary, drawing it ends generation, as llama.cpp and chat servers do: a model that
/// closes its turn has finished answering even where the checkpoint names another EOS.
const END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "</s>",
];

pub(crate) struct TextSide {
    pub(crate) tokenizer: Tokenizer,
    pub(crate) template: Option<ChatTemplate>,
    /// Token ids that end generation, sorted, without repeats.
    pub(crate) eos_ids: Vec<u32>,
}

pub(crate) fn read(checkpoint: &Checkpoint) -> Result<TextSide> {
    let mut side = match checkpoint {
        Checkpoint::Gguf { file, .. } => from_gguf(file)?,
        Checkpoint::HuggingFace { dir, checkpoint } => from_hf(dir, checkpoint.config())?,
    };
    for marker in END_OF_TURN {
        if let Some(id) = side.tokenizer.token_to_id(marker) {
            if side.tokenizer.is_special(id) {
                side.eos_ids.push(id);
            }
        }
    }
    side.eos_ids.sort_unstable();
    side.eos_ids.dedup();
    Ok(side)
}

fn from_gguf(file: &GgufFile) -> Result<TextSide> {
    let vocab = file.tokenizer_vocab()?;
    let tokenizer = Tokenizer::from_gguf_vocab(&vocab)
        .map_err(|e| EngineError::text("tokenizer (tokenizer.ggml.*)", e))?;
    let special = |id: Option<u32>| {
        id.and_then(|i| tokenizer.id_to_token(i))
            .unwrap_or("")
            .to_owned()
    };
    let template = match file.get_str("tokenizer.chat_template") {
        Ok(source) => Some(
            ChatTemplate::new(source, &special(vocab.bos_id), &special(vocab.eos_id))
                .map_err(|e| EngineError::text("tokenizer.chat_template", e))?,
        ),
        Err(_) => None,
    };
    let eos_ids = ["eos_token_id", "eot_token_id", "eom_token_id"]
        .into_iter()
        .filter_map(|k| file.get_u32(&format!("tokenizer.ggml.{k}")).ok())
        .collect();
    Ok(TextSide {
        tokenizer,
        template,
        eos_ids,
    })
}

/// An optional JSON file of the checkpoint.
fn read_json(path: &Path) -> Result<Option<Value>> {
    read_optional_json(path).map_err(engine_error)
}

fn engine_error(e: HfFileError) -> EngineError {
    match e {
        HfFileError::Io { path, source } => EngineError::Io { path, source },
        HfFileError::Json { path, source } => EngineError::Json { path, source },
    }
}

/// A special token as `tokenizer_config.json` writes it: a string or `{"content": ...}`.
fn token_text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

fn from_hf(dir: &Path, config: &HfConfig) -> Result<TextSide> {
    let tokenizer_path = dir.join("tokenizer.json");
    if !tokenizer_path.is_file() {
        return Err(EngineError::NotAModel {
            path: dir.to_owned(),
            reason: "the directory has no tokenizer.json".into(),
        });
    }
    let tokenizer = Tokenizer::from_tokenizer_json(&tokenizer_path)
        .map_err(|e| EngineError::text("tokenizer.json", e))?;
    let tokenizer_config = read_json(&dir.join("tokenizer_config.json"))?;
    let generation_config = read_json(&dir.join("generation_config.json"))?;
    let special = |name: &str, fallback: Option<u32>| {
        token_text(tokenizer_config.as_ref().and_then(|c| c.get(name)))
            .or_else(|| fallback.and_then(|id| tokenizer.id_to_token(id).map(str::to_owned)))
    };
    let bos = special("bos_token", tokenizer.bos_id());
    let eos = special("eos_token", tokenizer.eos_id());
    let source = chat_template_source(dir, tokenizer_config.as_ref()).map_err(engine_error)?;
    let template = match source {
        Some(source) => Some(
            ChatTemplate::new(
                &source,
                bos.as_deref().unwrap_or(""),
                eos.as_deref().unwrap_or(""),
            )
            .map_err(|e| EngineError::text("chat_template", e))?,
        ),
        None => None,
    };
    let mut eos_ids: Vec<u32> = config
        .eos_token_id
        .iter()
        .flat_map(|ids| ids.0.iter().copied())
        .collect();
    let generation_eos = generation_config
        .as_ref()
        .and_then(|g| g.get("eos_token_id"))
        .map(|v| match v {
            Value::Array(list) => list.iter().filter_map(Value::as_u64).collect(),
            other => other.as_u64().into_iter().collect::<Vec<_>>(),
        })
        .unwrap_or_default();
    eos_ids.extend(
        generation_eos
            .into_iter()
            .filter_map(|v| u32::try_from(v).ok()),
    );
    eos_ids.extend(eos.as_deref().and_then(|t| tokenizer.token_to_id(t)));
    eos_ids.extend(tokenizer.eos_id());
    Ok(TextSide {
        tokenizer,
        template,
        eos_ids,
    })
}
