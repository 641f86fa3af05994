//! Building a tokenizer from the `tokenizer.ggml.*` metadata of a GGUF file.
//!
//! The caller reads the file (quench-text knows nothing of the GGUF format;
//! `quench_models::GgufFile::tokenizer_vocab` reads it into a [`GgufVocab`]); this module
//! turns it into the same pipeline the Hugging Face tokenizer of that model runs.

use crate::added_tokens::AddedToken;
use crate::bpe::Bpe;
use crate::decode::Decoder;
use crate::error::{Result, TextError};
use crate::normalize::{Normalizer, METASPACE};
use crate::pretokenize::{gguf_pre_ignores_merges, PreTokenizer, Step};
use crate::sentencepiece::SentencePiece;
use crate::tokenizer::{AddedTokenSpec, Model, Parts, Tokenizer};
use crate::vocab::Vocab;
use crate::wordpiece::WordPiece;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_USER_DEFINED: i32 = 4;

/// BERT's word length limit; longer words become `[UNK]`.
const WORDPIECE_MAX_CHARS: usize = 100;

/// The tokenizer metadata of a GGUF file, under the names of its keys.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE), "llama" (SentencePiece), "bert" (WordPiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of a "gpt2" vocabulary; absent means "default".
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, in id order.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (required for "llama").
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`, each "left right" (required for "gpt2").
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (BERT's [SEP]).
    pub sep_id: Option<u32>,
    /// `tokenizer.ggml.cls_token_id` (BERT's [CLS]).
    pub cls_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; default true for "llama" and "bert", false for "gpt2".
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; default true for "bert" (its [SEP]), false otherwise.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`; default true ("llama" only).
    pub add_space_prefix: Option<bool>,
}

impl GgufVocab {
    fn check_id(&self, vocab: &Vocab, key: &'static str, id: Option<u32>) -> Result<Option<u32>> {
        id.map(|id| vocab.check_id(key, u64::from(id))).transpose()
    }

    /// Added tokens from the token types: unknown/control tokens are special, user-defined
    /// ones are matched in text but kept by `decode(.., true)`. Without types, the named
    /// special ids are the special tokens.
    fn added_tokens(&self, tokens: &[String]) -> Result<Vec<AddedTokenSpec>> {
        let spec = |id: usize, special: bool| AddedTokenSpec {
            token: AddedToken::plain(tokens[id].clone(), id as u32),
            normalized: false,
            special,
        };
        match &self.token_types {
            Some(types) => {
                if types.len() != tokens.len() {
                    return Err(TextError::LengthMismatch {
                        field: "tokenizer.ggml.token_type",
                        got: types.len(),
                        expected: tokens.len(),
                    });
                }
                Ok(types
                    .iter()
                    .enumerate()
                    .filter_map(|(id, &ty)| match ty {
                        TYPE_UNKNOWN | TYPE_CONTROL => Some(spec(id, true)),
                        TYPE_USER_DEFINED => Some(spec(id, false)),
                        _ => None,
                    })
                    .collect())
            }
            None => {
                let mut ids: Vec<u32> = [
                    self.bos_id,
                    self.eos_id,
                    self.unk_id,
                    self.pad_id,
                    self.sep_id,
                    self.cls_id,
                ]
                .into_iter()
                .flatten()
                .filter(|&id| (id as usize) < tokens.len())
                .collect();
                ids.sort_unstable();
                ids.dedup();
                Ok(ids.into_iter().map(|id| spec(id as usize, true)).collect())
            }
        }
    }
}

/// BERT vocabularies in GGUF mark word starts with '▁' and drop the `##` of continuations;
/// this restores the `tokenizer.json` spelling (bracketed tokens are left alone).
fn unphantom_wordpiece(token: &str) -> String {
    if let Some(word) = token.strip_prefix(METASPACE) {
        word.to_string()
    } else if token.starts_with('[') && token.ends_with(']') {
        token.to_string()
    } else {
        format!("##{token}")
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by GGUF tokenizer metadata.
    pub fn from_gguf_vocab(v: &GgufVocab) -> Result<Self> {
        if v.tokens.is_empty() {
            return Err(TextError::NoVocab);
        }
        let tokens = match v.model.as_str() {
            "gpt2" | "llama" => v.tokens.clone(),
            "bert" => v.tokens.iter().map(|t| unphantom_wordpiece(t)).collect(),
            other => return Err(TextError::UnknownModel(other.to_string())),
        };
        let added = v.added_tokens(&tokens)?;
        let vocab = Vocab::new(tokens)?;
        let bos = v.check_id(&vocab, "tokenizer.ggml.bos_token_id", v.bos_id)?;
        let eos = v.check_id(&vocab, "tokenizer.ggml.eos_token_id", v.eos_id)?;
        let unk = v.check_id(&vocab, "tokenizer.ggml.unknown_token_id", v.unk_id)?;
        let sep = v.check_id(&vocab, "tokenizer.ggml.seperator_token_id", v.sep_id)?;
        let cls = v.check_id(&vocab, "tokenizer.ggml.cls_token_id", v.cls_id)?;

        let (model, normalizer, pre_tokenizer, decoder, first, last) = match v.model.as_str() {
            "gpt2" => {
                let merges = v
                    .merges
                    .as_ref()
                    .ok_or(TextError::Missing("tokenizer.ggml.merges"))?;
                let pre = v.pre.as_deref().unwrap_or("default");
                let pairs = merges
                    .iter()
                    .enumerate()
                    .map(|(index, m)| {
                        m.split_once(' ')
                            .map(|(l, r)| (l.to_string(), r.to_string()))
                            .ok_or_else(|| TextError::BadMerge {
                                index,
                                merge: m.clone(),
                                reason: "no space between the two parts",
                            })
                    })
                    .collect::<Result<Vec<_>>>()?;
                let bpe = Bpe::new(&vocab, pairs, gguf_pre_ignores_merges(pre), None, false)?;
                let first = if v.add_bos.unwrap_or(false) {
                    bos
                } else {
                    None
                };
                let last = if v.add_eos.unwrap_or(false) {
                    eos
                } else {
                    None
                };
                (
                    Model::Bpe(bpe),
                    None,
                    PreTokenizer::from_gguf_pre(pre)?,
                    Decoder::ByteLevel,
                    first,
                    last,
                )
            }
            "llama" => {
                let scores = v
                    .scores
                    .clone()
                    .ok_or(TextError::Missing("tokenizer.ggml.scores"))?;
                if scores.len() != vocab.len() {
                    return Err(TextError::LengthMismatch {
                        field: "tokenizer.ggml.scores",
                        got: scores.len(),
                        expected: vocab.len(),
                    });
                }
                let space = v.add_space_prefix.unwrap_or(true);
                let first = if v.add_bos.unwrap_or(true) { bos } else { None };
                let last = if v.add_eos.unwrap_or(false) {
                    eos
                } else {
                    None
                };
                (
                    Model::SentencePiece(SentencePiece::new(&vocab, scores, unk)),
                    Some(Normalizer::Metaspace { prepend: space }),
                    PreTokenizer::new(Vec::new(), false),
                    Decoder::SentencePiece {
                        strip_leading_space: space,
                    },
                    first,
                    last,
                )
            }
            "bert" => {
                let unk = unk.ok_or(TextError::Missing("tokenizer.ggml.unknown_token_id"))?;
                let first = if v.add_bos.unwrap_or(true) {
                    cls.or(bos)
                } else {
                    None
                };
                let last = if v.add_eos.unwrap_or(true) {
                    sep.or(eos)
                } else {
                    None
                };
                let normalizer = Normalizer::Bert {
                    clean_text: true,
                    handle_chinese_chars: true,
                    strip_accents: true,
                    lowercase: true,
                };
                (
                    Model::WordPiece(WordPiece::new(unk, "##".to_string(), WORDPIECE_MAX_CHARS)),
                    Some(normalizer),
                    PreTokenizer::new(vec![Step::BertBasic], false),
                    Decoder::WordPiece {
                        prefix: "##".to_string(),
                        cleanup: true,
                    },
                    first,
                    last,
                )
            }
            other => return Err(TextError::UnknownModel(other.to_string())),
        };
        Tokenizer::assemble(Parts {
            vocab,
            model,
            normalizer,
            pre_tokenizer,
            added,
            prefix: first.into_iter().collect(),
            suffix: last.into_iter().collect(),
            decoder,
            bos,
            eos,
        })
    }
}
