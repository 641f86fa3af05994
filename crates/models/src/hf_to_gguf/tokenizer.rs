//! A Hugging Face byte-level BPE tokenizer (`tokenizer.json`, `tokenizer_config.json`) as
//! GGUF `tokenizer.ggml.*` metadata, for the `gpt2` tokenizer model of llama.cpp.
//!
//! GGUF names the pre-tokenizer (`tokenizer.ggml.pre`) instead of storing it, so the
//! `tokenizer.json` pre-tokenizer must be one of the forms whose names are known: GPT-2's
//! byte-level regex (`gpt-2`), single digits then GPT-2's (`smollm`), Llama 3's split
//! (`llama-bpe`) and Qwen2's (`qwen2`). Anything else is refused by name rather than
//! guessed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::gguf::{MetadataArray, MetadataValue};
use crate::{chat_template_source, read_optional_json, HfConfig, HfFileError};

use super::error::ConvertError;

/// The split regex of Llama 3's `tokenizer.json`.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The split regex of Qwen2's (and Qwen2.5's, Qwen3's) `tokenizer.json`.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The tokenizer's GGUF metadata, and notes on what GGUF could not carry.
pub struct TokenizerKeys {
    pub entries: Vec<(String, MetadataValue)>,
    pub notes: Vec<String>,
}

struct Files {
    tokenizer_json: PathBuf,
}

impl Files {
    fn err(&self, reason: impl Into<String>) -> ConvertError {
        ConvertError::Tokenizer {
            file: self.tokenizer_json.clone(),
            reason: reason.into(),
        }
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, ConvertError> {
    read_optional_json(path).map_err(convert_error)
}

/// A checkpoint file's error as the converter reports it: one that is not JSON is a bad
/// tokenizer file.
fn convert_error(e: HfFileError) -> ConvertError {
    match e {
        HfFileError::Io { path, source } => ConvertError::Io { path, source },
        HfFileError::Json { path, source } => ConvertError::Tokenizer {
            file: path,
            reason: format!("invalid JSON: {source}"),
        },
    }
}

fn type_of(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

fn flag(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// The pre-tokenizer's steps, with sequences flattened.
fn pre_steps<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    if type_of(v) == "Sequence" {
        for step in v
            .get("pretokenizers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            pre_steps(step, out);
        }
    } else {
        out.push(v);
    }
}

/// The `tokenizer.ggml.pre` name of a `tokenizer.json` pre-tokenizer, given whether the BPE
/// model ignores merges for words the vocabulary holds whole (which llama.cpp ties to the
/// name).
fn pre_name(
    files: &Files,
    pre: Option<&Value>,
    ignore_merges: bool,
) -> Result<&'static str, ConvertError> {
    let mut steps = Vec::new();
    if let Some(pre) = pre.filter(|p| !p.is_null()) {
        pre_steps(pre, &mut steps);
    }
    let byte_level = |v: &Value, regex: bool| {
        type_of(v) == "ByteLevel"
            && !flag(v, "add_prefix_space", true)
            && flag(v, "use_regex", true) == regex
    };
    let split = |v: &Value, pattern: &str| {
        type_of(v) == "Split"
            && v.pointer("/pattern/Regex").and_then(Value::as_str) == Some(pattern)
            && v.get("behavior").and_then(Value::as_str) == Some("Isolated")
            && !flag(v, "invert", false)
    };
    let name = match steps[..] {
        [b] if byte_level(b, true) => "gpt-2",
        [d, b]
            if type_of(d) == "Digits"
                && flag(d, "individual_digits", false)
                && byte_level(b, true) =>
        {
            "smollm"
        }
        [s, b] if split(s, LLAMA3_SPLIT) && byte_level(b, false) => "llama-bpe",
        [s, b] if split(s, QWEN2_SPLIT) && byte_level(b, false) => "qwen2",
        _ => {
            let shown = pre.map_or("none".to_owned(), Value::to_string);
            return Err(files.err(format!(
                "pre-tokenizer {shown} has no GGUF name (known: GPT-2's ByteLevel, SmolLM's \
                 Digits + ByteLevel, Llama 3's and Qwen2's Split + ByteLevel)"
            )));
        }
    };
    // llama.cpp looks whole words up first for llama-bpe, and only there.
    let expected = name == "llama-bpe";
    if ignore_merges != expected {
        return Err(files.err(format!(
            "model.ignore_merges is {ignore_merges}, but GGUF's {name} pre-tokenizer implies \
             {expected}"
        )));
    }
    Ok(name)
}

/// A special token as `tokenizer_config.json` writes it: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// The ids a single-sequence post-processor puts before and after the text.
fn post_processor(
    files: &Files,
    p: &Value,
    ids: &HashMap<&str, u32>,
    before: &mut Vec<u32>,
    after: &mut Vec<u32>,
) -> Result<(), ConvertError> {
    match type_of(p) {
        "ByteLevel" => {}
        "Sequence" => {
            for step in p
                .get("processors")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                post_processor(files, step, ids, before, after)?;
            }
        }
        "TemplateProcessing" => {
            let mut seen_text = false;
            for piece in p
                .get("single")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if piece.get("Sequence").is_some() {
                    seen_text = true;
                    continue;
                }
                let name = piece
                    .pointer("/SpecialToken/id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        files.err(format!("post_processor piece {piece} is not understood"))
                    })?;
                let listed = p
                    .pointer(&format!(
                        "/special_tokens/{}",
                        name.replace('~', "~0").replace('/', "~1")
                    ))
                    .and_then(|s| s.get("ids"))
                    .and_then(Value::as_array);
                let found: Vec<u32> = match listed {
                    Some(list) => list
                        .iter()
                        .map(|id| id.as_u64().and_then(|n| u32::try_from(n).ok()))
                        .collect::<Option<_>>()
                        .ok_or_else(|| {
                            files.err(format!("post_processor ids of {name} are not token ids"))
                        })?,
                    None => vec![*ids.get(name).ok_or_else(|| {
                        files.err(format!(
                            "post_processor token {name} is not in the vocabulary"
                        ))
                    })?],
                };
                if seen_text {
                    after.extend(found);
                } else {
                    before.extend(found);
                }
            }
        }
        other => {
            return Err(ConvertError::Unsupported {
                what: format!("tokenizer post-processor {other}"),
            })
        }
    }
    Ok(())
}

/// The vocabulary in id order with token types: the BPE vocabulary, the added tokens
/// (special ones as control tokens, others as user-defined), and `[PAD<id>]` placeholders
/// (unused) for ids up to `size` that neither names, as the embedding of many checkpoints
/// is larger than their tokenizer.
fn vocabulary(
    files: &Files,
    root: &Value,
    size: usize,
) -> Result<(Vec<String>, Vec<i32>), ConvertError> {
    let vocab = root
        .pointer("/model/vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| files.err("model.vocab is missing"))?;
    let mut slots: Vec<Option<(String, i32)>> = Vec::new();
    let mut put = |id: u64, token: &str, ty: i32| -> Result<(), ConvertError> {
        let id = usize::try_from(id)
            .ok()
            .filter(|&i| i < size)
            .ok_or_else(|| {
                files.err(format!(
                    "token {token:?} has id {id}, past config.json's vocab_size {size}"
                ))
            })?;
        if id >= slots.len() {
            slots.resize(id + 1, None);
        }
        match &slots[id] {
            Some((existing, _)) if existing != token => {
                Err(files.err(format!("id {id} is both {existing:?} and {token:?}")))
            }
            _ => {
                slots[id] = Some((token.to_owned(), ty));
                Ok(())
            }
        }
    };
    for (token, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| files.err(format!("model.vocab id of {token:?} is not an integer")))?;
        put(id, token, NORMAL)?;
    }
    for added in root
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(id), Some(content)) = (
            added.get("id").and_then(Value::as_u64),
            added.get("content").and_then(Value::as_str),
        ) else {
            return Err(files.err(format!("added token {added} needs an id and a content")));
        };
        let ty = if flag(added, "special", false) {
            CONTROL
        } else {
            USER_DEFINED
        };
        put(id, content, ty)?;
    }
    slots.resize(size, None);
    Ok(slots
        .into_iter()
        .enumerate()
        .map(|(id, slot)| slot.unwrap_or_else(|| (format!("[PAD{id}]"), UNUSED)))
        .unzip())
}

/// BPE merges in GGUF's form, `"left right"`; `tokenizer.json` writes them so or as pairs.
fn merges(files: &Files, root: &Value) -> Result<Vec<String>, ConvertError> {
    let list = root
        .pointer("/model/merges")
        .and_then(Value::as_array)
        .ok_or_else(|| files.err("model.merges is missing"))?;
    list.iter()
        .enumerate()
        .map(|(i, m)| match m {
            Value::String(s) if s.split(' ').count() == 2 => Ok(s.clone()),
            Value::Array(pair) => match &pair[..] {
                [Value::String(l), Value::String(r)] if !l.contains(' ') && !r.contains(' ') => {
                    Ok(format!("{l} {r}"))
                }
                _ => Err(files.err(format!(
                    "merge {i} ({m}) is not two tokens without spaces, as GGUF stores merges"
                ))),
            },
            _ => Err(files.err(format!("merge {i} ({m}) is not two tokens"))),
        })
        .collect()
}

/// Whether the post-processor adds the `which` (BOS or EOS) token at its edge of the text:
/// GGUF can express one token there, and only the named one (which it names when the
/// tokenizer files do not).
fn added_at_edge(
    files: &Files,
    added: &[u32],
    named: &mut Option<u32>,
    which: &str,
) -> Result<bool, ConvertError> {
    match added {
        [] => Ok(false),
        [id] if named.is_none_or(|n| n == *id) => {
            *named = Some(*id);
            Ok(true)
        }
        _ => Err(files.err(format!(
            "the post-processor adds {added:?} around the text; GGUF can only add the {which} \
             token ({named:?}) there"
        ))),
    }
}

/// Reads the tokenizer files of the checkpoint in `dir` and returns their GGUF metadata.
pub fn convert(dir: &Path, config: &HfConfig) -> Result<TokenizerKeys, ConvertError> {
    let files = Files {
        tokenizer_json: dir.join("tokenizer.json"),
    };
    let root = read_json(&files.tokenizer_json)?.ok_or_else(|| ConvertError::NotACheckpoint {
        path: dir.to_owned(),
        reason: "it has no tokenizer.json (the GGUF file carries the tokenizer)".into(),
    })?;
    let tokenizer_config = read_json(&dir.join("tokenizer_config.json"))?;
    let mut notes = Vec::new();

    let model = root
        .get("model")
        .ok_or_else(|| files.err("model is missing"))?;
    if type_of(model) != "BPE" {
        return Err(ConvertError::Unsupported {
            what: format!(
                "tokenizer model {:?} (the converter writes byte-level BPE tokenizers)",
                type_of(model)
            ),
        });
    }
    if flag(model, "byte_fallback", false) {
        return Err(ConvertError::Unsupported {
            what: "BPE with byte_fallback (SentencePiece-style tokenizers)".into(),
        });
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if let Some(v) = model
            .get(key)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
        {
            return Err(ConvertError::Unsupported {
                what: format!("BPE {key} {v:?}"),
            });
        }
    }
    match root.get("decoder") {
        Some(d) if type_of(d) == "ByteLevel" => {}
        other => {
            return Err(ConvertError::Unsupported {
                what: format!(
                    "tokenizer decoder {} (byte-level BPE decodes with ByteLevel)",
                    other.map_or("none".to_owned(), |d| type_of(d).to_owned())
                ),
            })
        }
    }
    match root.get("normalizer").filter(|n| !n.is_null()) {
        None => {}
        Some(n) if type_of(n) == "NFC" => notes.push(
            "tokenizer.json normalizes text to NFC, which GGUF does not record; text already \
             in NFC (nearly all text) encodes the same"
                .into(),
        ),
        Some(n) => {
            return Err(ConvertError::Unsupported {
                what: format!("tokenizer normalizer {}", type_of(n)),
            })
        }
    }
    let pre = pre_name(
        &files,
        root.get("pre_tokenizer"),
        flag(model, "ignore_merges", false),
    )?;

    let (tokens, token_types) = vocabulary(&files, &root, config.vocab_size)?;
    let merges = merges(&files, &root)?;
    let ids: HashMap<&str, u32> = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.as_str(), id as u32))
        .collect();

    // Special tokens: tokenizer_config.json names them; config.json has ids as a fallback.
    let special = |name: &str, fallback: Option<u32>, notes: &mut Vec<String>| {
        let config = tokenizer_config.as_ref();
        if let Some(text) = token_text(config.and_then(|c| c.get(name))) {
            match ids.get(text) {
                Some(&id) => return Some(id),
                None => notes.push(format!(
                    "tokenizer_config.json's {name} {text:?} is not in the vocabulary"
                )),
            }
        }
        fallback.filter(|&id| (id as usize) < tokens.len())
    };
    let first = |ids: &Option<crate::TokenIds>| ids.as_ref().and_then(|t| t.0.first().copied());
    let mut bos = special("bos_token", first(&config.bos_token_id), &mut notes);
    let mut eos = special("eos_token", first(&config.eos_token_id), &mut notes);
    let pad = special("pad_token", first(&config.pad_token_id), &mut notes);
    let unk = match model.get("unk_token").and_then(Value::as_str) {
        Some(text) => Some(*ids.get(text).ok_or_else(|| {
            files.err(format!("model.unk_token {text:?} is not in the vocabulary"))
        })?),
        None => None,
    };

    // What encoding adds around the text: GGUF can say "BOS first" and "EOS last".
    let (mut before, mut after) = (Vec::new(), Vec::new());
    if let Some(p) = root.get("post_processor").filter(|p| !p.is_null()) {
        post_processor(&files, p, &ids, &mut before, &mut after)?;
    }
    let add_bos = added_at_edge(&files, &before, &mut bos, "BOS")?;
    let add_eos = added_at_edge(&files, &after, &mut eos, "EOS")?;

    let key = |k: &str| format!("tokenizer.ggml.{k}");
    let mut entries = vec![
        (key("model"), MetadataValue::String("gpt2".into())),
        (key("pre"), MetadataValue::String(pre.into())),
        (
            key("tokens"),
            MetadataValue::Array(MetadataArray::String(tokens)),
        ),
        (
            key("token_type"),
            MetadataValue::Array(MetadataArray::I32(token_types)),
        ),
        (
            key("merges"),
            MetadataValue::Array(MetadataArray::String(merges)),
        ),
    ];
    for (name, id) in [
        ("bos_token_id", bos),
        ("eos_token_id", eos),
        ("unknown_token_id", unk),
        ("padding_token_id", pad),
    ] {
        if let Some(id) = id {
            entries.push((key(name), MetadataValue::U32(id)));
        }
    }
    entries.push((key("add_bos_token"), MetadataValue::Bool(add_bos)));
    entries.push((key("add_eos_token"), MetadataValue::Bool(add_eos)));
    if let Some(template) =
        chat_template_source(dir, tokenizer_config.as_ref()).map_err(convert_error)?
    {
        entries.push((
            "tokenizer.chat_template".into(),
            MetadataValue::String(template),
        ));
    }
    Ok(TokenizerKeys { entries, notes })
}
