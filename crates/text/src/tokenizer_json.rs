//! Building a tokenizer from a Hugging Face `tokenizer.json`.
//!
//! Supported: a byte-level BPE model (a `ByteLevel` pre-tokenizer, possibly after `Split`
//! and `Digits` steps) and a WordPiece model (`BertNormalizer`, `BertPreTokenizer`), with
//! their added tokens, post-processor and decoder. Anything else is refused by name.
//! `truncation` and `padding` are the caller's business and are not read.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Map, Value};

use crate::added_tokens::AddedToken;
use crate::bpe::Bpe;
use crate::decode::Decoder;
use crate::error::{Result, TextError};
use crate::normalize::Normalizer;
use crate::pretokenize::{PreTokenizer, SplitBehavior, Step};
use crate::tokenizer::{AddedTokenSpec, Model, Parts, Tokenizer};
use crate::vocab::Vocab;
use crate::wordpiece::WordPiece;

/// A JSON object with the path it was found at, for error messages.
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn new(path: impl Into<String>, value: &'a Value) -> Result<Self> {
        let path = path.into();
        let map = value
            .as_object()
            .ok_or_else(|| TextError::bad_field(&path, "expected an object"))?;
        Ok(Obj { path, map })
    }

    fn field_path(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn req(&self, key: &str) -> Result<&'a Value> {
        self.get(key)
            .ok_or_else(|| TextError::bad_field(self.field_path(key), "missing"))
    }

    fn str(&self, key: &str) -> Result<&'a str> {
        self.req(key)?
            .as_str()
            .ok_or_else(|| TextError::bad_field(self.field_path(key), "expected a string"))
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| TextError::bad_field(self.field_path(key), "expected a string"))
            })
            .transpose()
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| {
                TextError::bad_field(self.field_path(key), "expected true or false")
            }),
        }
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool().ok_or_else(|| {
                    TextError::bad_field(self.field_path(key), "expected true or false")
                })
            })
            .transpose()
    }

    fn u32(&self, key: &str) -> Result<u32> {
        self.req(key)?
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| {
                TextError::bad_field(
                    self.field_path(key),
                    "expected an id (a non-negative 32-bit integer)",
                )
            })
    }

    fn array(&self, key: &str) -> Result<&'a Vec<Value>> {
        self.req(key)?
            .as_array()
            .ok_or_else(|| TextError::bad_field(self.field_path(key), "expected an array"))
    }

    fn kind(&self) -> Result<&'a str> {
        self.str("type")
    }
}

fn unsupported(kind: &'static str, name: &str) -> TextError {
    TextError::Unsupported {
        kind,
        name: name.to_string(),
    }
}

impl Tokenizer {
    /// Reads a `tokenizer.json` file.
    pub fn from_tokenizer_json(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TextError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Tokenizer::from_tokenizer_json_str(&text)
    }

    /// Builds a tokenizer from the text of a `tokenizer.json`.
    pub fn from_tokenizer_json_str(json: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(json)?;
        let root = Obj::new("tokenizer.json", &root)?;
        let model = Obj::new("model", root.req("model")?)?;

        let normalizer = root
            .get("normalizer")
            .map(|n| normalizer(Obj::new("normalizer", n)?))
            .transpose()?;
        let mut steps = Vec::new();
        let mut byte_level = false;
        if let Some(p) = root.get("pre_tokenizer") {
            pre_tokenizer(Obj::new("pre_tokenizer", p)?, &mut steps, &mut byte_level)?;
        }

        let mut map = vocab_map(&model)?;
        let added = added_tokens(&root, &mut map)?;
        let vocab = Vocab::from_map(map)?;
        let token_id = |text: &str| {
            vocab
                .id(text)
                .ok_or_else(|| TextError::TokenNotInVocab(text.to_string()))
        };

        let model_kind = model.kind()?;
        let model = match model_kind {
            "BPE" => {
                if !byte_level {
                    return Err(unsupported(
                        "BPE model without a ByteLevel pre-tokenizer",
                        "BPE",
                    ));
                }
                for key in ["dropout", "continuing_subword_prefix", "end_of_word_suffix"] {
                    if model.get(key).is_some_and(|v| v.as_str() != Some("")) {
                        return Err(unsupported("BPE option", key));
                    }
                }
                if model.bool_or("byte_fallback", false)? {
                    return Err(unsupported("BPE option", "byte_fallback"));
                }
                let unk = model.opt_str("unk_token")?.map(token_id).transpose()?;
                let merges = merges(&model)?;
                Model::Bpe(Bpe::new(
                    &vocab,
                    merges,
                    model.bool_or("ignore_merges", false)?,
                    unk,
                    model.bool_or("fuse_unk", false)?,
                )?)
            }
            "WordPiece" => {
                let unk = token_id(model.str("unk_token")?)?;
                let prefix = model
                    .opt_str("continuing_subword_prefix")?
                    .unwrap_or("##")
                    .to_string();
                let max_chars = match model.get("max_input_chars_per_word") {
                    None => 100,
                    Some(v) => v
                        .as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| {
                            TextError::bad_field(
                                "model.max_input_chars_per_word",
                                "expected a non-negative integer",
                            )
                        })?,
                };
                Model::WordPiece(WordPiece::new(unk, prefix, max_chars))
            }
            other => return Err(unsupported("model", other)),
        };

        let decoder = match root.get("decoder") {
            None => return Err(TextError::bad_field("decoder", "missing")),
            Some(d) => decoder(Obj::new("decoder", d)?)?,
        };
        match (&model, &decoder) {
            (Model::Bpe(_), Decoder::ByteLevel)
            | (Model::WordPiece(_), Decoder::WordPiece { .. }) => {}
            _ => return Err(unsupported("decoder for this model", model_kind)),
        }

        let (mut prefix, mut suffix) = (Vec::new(), Vec::new());
        if let Some(p) = root.get("post_processor") {
            post_processor(
                Obj::new("post_processor", p)?,
                &mut prefix,
                &mut suffix,
                &token_id,
            )?;
        }

        Tokenizer::assemble(Parts {
            vocab,
            model,
            normalizer,
            pre_tokenizer: PreTokenizer::new(steps, byte_level),
            added,
            prefix,
            suffix,
            decoder,
            bos: None,
            eos: None,
        })
    }
}

fn vocab_map(model: &Obj) -> Result<HashMap<String, u32>> {
    let vocab = Obj::new("model.vocab", model.req("vocab")?)?;
    vocab
        .map
        .iter()
        .map(|(text, id)| {
            let id = id
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    TextError::bad_field(format!("model.vocab[{text:?}]"), "expected an id")
                })?;
            Ok((text.clone(), id))
        })
        .collect()
}

/// The added tokens; those whose id is beyond the model's vocabulary join it.
fn added_tokens(root: &Obj, map: &mut HashMap<String, u32>) -> Result<Vec<AddedTokenSpec>> {
    let Some(list) = root.get("added_tokens") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| TextError::bad_field("added_tokens", "expected an array"))?;
    let model_size = map.len();
    let mut out = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let t = Obj::new(format!("added_tokens[{i}]"), entry)?;
        let id = t.u32("id")?;
        let content = t.str("content")?.to_string();
        let special = t.bool_or("special", false)?;
        if id as usize >= model_size {
            map.insert(content.clone(), id);
        }
        out.push(AddedTokenSpec {
            token: AddedToken {
                content,
                id,
                lstrip: t.bool_or("lstrip", false)?,
                rstrip: t.bool_or("rstrip", false)?,
                single_word: t.bool_or("single_word", false)?,
            },
            normalized: t.bool_or("normalized", !special)?,
            special,
        });
    }
    Ok(out)
}

/// Merges as "left right" strings or as [left, right] pairs.
fn merges(model: &Obj) -> Result<Vec<(String, String)>> {
    model
        .array("merges")?
        .iter()
        .enumerate()
        .map(|(index, m)| {
            let bad = |reason| TextError::BadMerge {
                index,
                merge: m.to_string(),
                reason,
            };
            match m {
                Value::String(s) => s
                    .split_once(' ')
                    .map(|(l, r)| (l.to_string(), r.to_string()))
                    .ok_or_else(|| bad("no space between the two parts")),
                Value::Array(pair) => match pair.as_slice() {
                    [Value::String(l), Value::String(r)] => Ok((l.clone(), r.clone())),
                    _ => Err(bad("expected two strings")),
                },
                _ => Err(bad("expected a string or a pair of strings")),
            }
        })
        .collect()
}

fn normalizer(n: Obj) -> Result<Normalizer> {
    Ok(match n.kind()? {
        "BertNormalizer" => {
            let lowercase = n.bool_or("lowercase", true)?;
            Normalizer::Bert {
                clean_text: n.bool_or("clean_text", true)?,
                handle_chinese_chars: n.bool_or("handle_chinese_chars", true)?,
                strip_accents: n.opt_bool("strip_accents")?.unwrap_or(lowercase),
                lowercase,
            }
        }
        "Lowercase" => Normalizer::Lowercase,
        "NFC" => Normalizer::Nfc,
        "NFD" => Normalizer::Nfd,
        "NFKC" => Normalizer::Nfkc,
        "NFKD" => Normalizer::Nfkd,
        "Sequence" => Normalizer::Sequence(
            n.array("normalizers")?
                .iter()
                .enumerate()
                .map(|(i, v)| normalizer(Obj::new(format!("{}.normalizers[{i}]", n.path), v)?))
                .collect::<Result<_>>()?,
        ),
        other => return Err(unsupported("normalizer", other)),
    })
}

fn pre_tokenizer(p: Obj, steps: &mut Vec<Step>, byte_level: &mut bool) -> Result<()> {
    let kind = p.kind()?;
    if *byte_level && kind != "Sequence" {
        return Err(unsupported("pre-tokenizer after ByteLevel", kind));
    }
    match kind {
        "ByteLevel" => {
            steps.extend(Step::byte_level(
                p.bool_or("add_prefix_space", true)?,
                p.bool_or("use_regex", true)?,
            )?);
            *byte_level = true;
        }
        "BertPreTokenizer" => steps.push(Step::BertBasic),
        "Digits" => steps.push(Step::Digits {
            individual: p.bool_or("individual_digits", false)?,
        }),
        "Split" => {
            if p.bool_or("invert", false)? {
                return Err(unsupported("Split option", "invert"));
            }
            let pattern = Obj::new(p.field_path("pattern"), p.req("pattern")?)?;
            let regex = match (pattern.opt_str("Regex")?, pattern.opt_str("String")?) {
                (Some(r), _) => r.to_string(),
                (None, Some(s)) => fancy_regex::escape(s).into_owned(),
                (None, None) => {
                    return Err(TextError::bad_field(
                        pattern.path,
                        "expected Regex or String",
                    ))
                }
            };
            let behavior = match p.str("behavior")? {
                "Isolated" => SplitBehavior::Isolated,
                "Removed" => SplitBehavior::Removed,
                other => return Err(unsupported("Split behavior", other)),
            };
            steps.push(Step::split(&regex, behavior)?);
        }
        "Sequence" => {
            for (i, v) in p.array("pretokenizers")?.iter().enumerate() {
                pre_tokenizer(
                    Obj::new(format!("{}.pretokenizers[{i}]", p.path), v)?,
                    steps,
                    byte_level,
                )?;
            }
        }
        other => return Err(unsupported("pre-tokenizer", other)),
    }
    Ok(())
}

fn decoder(d: Obj) -> Result<Decoder> {
    Ok(match d.kind()? {
        "ByteLevel" => Decoder::ByteLevel,
        "WordPiece" => Decoder::WordPiece {
            prefix: d.opt_str("prefix")?.unwrap_or("##").to_string(),
            cleanup: d.bool_or("cleanup", true)?,
        },
        other => return Err(unsupported("decoder", other)),
    })
}

/// The ids a single-sequence post-processor puts around the text.
fn post_processor(
    p: Obj,
    prefix: &mut Vec<u32>,
    suffix: &mut Vec<u32>,
    token_id: &dyn Fn(&str) -> Result<u32>,
) -> Result<()> {
    match p.kind()? {
        "ByteLevel" => {}
        "BertProcessing" | "RobertaProcessing" => {
            let pair_id = |key: &str| -> Result<u32> {
                match p.req(key)?.as_array().map(Vec::as_slice) {
                    Some([Value::String(_), id]) => id
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            TextError::bad_field(p.field_path(key), "expected [token, id]")
                        }),
                    _ => Err(TextError::bad_field(
                        p.field_path(key),
                        "expected [token, id]",
                    )),
                }
            };
            prefix.push(pair_id("cls")?);
            suffix.push(pair_id("sep")?);
        }
        "TemplateProcessing" => {
            let specials = Obj::new(p.field_path("special_tokens"), p.req("special_tokens")?)?;
            let mut seen_sequence = false;
            for (i, piece) in p.array("single")?.iter().enumerate() {
                let piece = Obj::new(format!("{}.single[{i}]", p.path), piece)?;
                if let Some(seq) = piece.get("Sequence") {
                    let seq = Obj::new(piece.field_path("Sequence"), seq)?;
                    if seq.str("id")? != "A" {
                        return Err(TextError::bad_field(
                            seq.path,
                            "a single-sequence template uses $A",
                        ));
                    }
                    seen_sequence = true;
                    continue;
                }
                let special =
                    Obj::new(piece.field_path("SpecialToken"), piece.req("SpecialToken")?)?;
                let name = special.str("id")?;
                let ids = match specials.get(name) {
                    Some(entry) => Obj::new(specials.field_path(name), entry)?
                        .array("ids")?
                        .iter()
                        .map(|id| {
                            id.as_u64()
                                .and_then(|n| u32::try_from(n).ok())
                                .ok_or_else(|| {
                                    TextError::bad_field(specials.field_path(name), "expected ids")
                                })
                        })
                        .collect::<Result<Vec<_>>>()?,
                    None => vec![token_id(name)?],
                };
                if seen_sequence {
                    suffix.extend(ids)
                } else {
                    prefix.extend(ids)
                }
            }
        }
        "Sequence" => {
            for (i, v) in p.array("processors")?.iter().enumerate() {
                post_processor(
                    Obj::new(format!("{}.processors[{i}]", p.path), v)?,
                    prefix,
                    suffix,
                    token_id,
                )?;
            }
        }
        other => return Err(unsupported("post-processor", other)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// String-form merges, an `lstrip` added token and a BertProcessing post-processor.
    #[test]
    fn string_merges_and_stripping_added_token() {
        let json = r#"{
            "added_tokens": [{"id": 4, "content": "<mask>", "special": true, "lstrip": true,
                              "rstrip": false, "single_word": false, "normalized": false}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
            "post_processor": {"type": "BertProcessing", "sep": ["b", 1], "cls": ["a", 0]},
            "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "<mask>": 4},
                      "merges": ["a b"]}
        }"#;
        let tok = Tokenizer::from_tokenizer_json_str(json).unwrap();
        assert_eq!(tok.encode("ab  <mask>", false).unwrap(), [2, 4]);
        assert_eq!(tok.encode("ab", true).unwrap(), [0, 2, 1]);
        assert_eq!(tok.decode(&[2, 3, 4], true).unwrap(), "ab ");
    }

    #[test]
    fn tokenizers_and_templates_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Tokenizer>();
        shareable::<crate::ChatTemplate>();
    }
}
