//! The tokenizer: added tokens, normalization, pre-tokenization and a model, as one pipeline.

use std::collections::HashSet;

use crate::added_tokens::{AddedToken, AddedTokens, Segment};
use crate::bpe::Bpe;
use crate::decode::Decoder;
use crate::error::{Result, TextError};
use crate::normalize::Normalizer;
use crate::pretokenize::PreTokenizer;
use crate::sentencepiece::SentencePiece;
use crate::vocab::Vocab;
use crate::wordpiece::WordPiece;

#[derive(Debug, Clone)]
pub(crate) enum Model {
    Bpe(Bpe),
    SentencePiece(SentencePiece),
    WordPiece(WordPiece),
}

/// An added token as a loader describes it.
#[derive(Debug, Clone)]
pub(crate) struct AddedTokenSpec {
    pub(crate) token: AddedToken,
    /// Matched in the normalized text instead of the raw text.
    pub(crate) normalized: bool,
    /// Left out by `decode(.., skip_special_tokens = true)`.
    pub(crate) special: bool,
}

/// What a loader (GGUF metadata, tokenizer.json) hands over to build a tokenizer.
pub(crate) struct Parts {
    pub(crate) vocab: Vocab,
    pub(crate) model: Model,
    pub(crate) normalizer: Option<Normalizer>,
    pub(crate) pre_tokenizer: PreTokenizer,
    pub(crate) added: Vec<AddedTokenSpec>,
    /// Ids put before / after the text when special tokens are added.
    pub(crate) prefix: Vec<u32>,
    pub(crate) suffix: Vec<u32>,
    pub(crate) decoder: Decoder,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
}

/// A text ↔ token-id converter that matches Hugging Face `tokenizers` token for token.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    model: Model,
    normalizer: Option<Normalizer>,
    pre_tokenizer: PreTokenizer,
    added_raw: AddedTokens,
    added_normalized: AddedTokens,
    special: HashSet<u32>,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    decoder: Decoder,
    bos: Option<u32>,
    eos: Option<u32>,
}

impl Tokenizer {
    pub(crate) fn assemble(parts: Parts) -> Result<Self> {
        let vocab = parts.vocab;
        for spec in &parts.added {
            vocab.check_id("an added token's id", u64::from(spec.token.id))?;
        }
        for &id in parts.prefix.iter().chain(&parts.suffix) {
            vocab.check_id("a post-processor token", u64::from(id))?;
        }
        let special = parts
            .added
            .iter()
            .filter(|s| s.special)
            .map(|s| s.token.id)
            .collect();
        let (normalized, raw): (Vec<_>, Vec<_>) =
            parts.added.into_iter().partition(|s| s.normalized);
        Ok(Tokenizer {
            vocab,
            model: parts.model,
            normalizer: parts.normalizer,
            pre_tokenizer: parts.pre_tokenizer,
            added_raw: AddedTokens::new(raw.into_iter().map(|s| s.token).collect())?,
            added_normalized: AddedTokens::new(normalized.into_iter().map(|s| s.token).collect())?,
            special,
            prefix: parts.prefix,
            suffix: parts.suffix,
            decoder: parts.decoder,
            bos: parts.bos,
            eos: parts.eos,
        })
    }

    /// The token ids of `text`. Added and special tokens written in the text are always
    /// recognized; `add_special_tokens` adds the model's framing tokens (BOS, [CLS]/[SEP]...).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        if add_special_tokens {
            ids.extend_from_slice(&self.prefix);
        }
        for segment in self.added_raw.split(text) {
            match segment {
                Segment::Token(id) => ids.push(id),
                Segment::Text(raw) => {
                    let normalized = match &self.normalizer {
                        Some(n) => n.normalize(raw),
                        None => raw.to_string(),
                    };
                    for part in self.added_normalized.split(&normalized) {
                        match part {
                            Segment::Token(id) => ids.push(id),
                            Segment::Text(t) => self.encode_plain(t, &mut ids)?,
                        }
                    }
                }
            }
        }
        if add_special_tokens {
            ids.extend_from_slice(&self.suffix);
        }
        Ok(ids)
    }

    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>) -> Result<()> {
        for piece in self.pre_tokenizer.pieces(text)? {
            match &self.model {
                Model::Bpe(bpe) => bpe.encode_word(&self.vocab, &piece, ids),
                Model::SentencePiece(sp) => sp.encode(&self.vocab, &piece, ids),
                Model::WordPiece(wp) => wp.encode_word(&self.vocab, &piece, ids),
            }
        }
        Ok(())
    }

    /// The text of `ids`. Bytes that do not form UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let mut tokens = Vec::with_capacity(ids.len());
        for &id in ids {
            if skip_special_tokens && self.special.contains(&id) {
                continue;
            }
            tokens.push(self.vocab.token(id).ok_or(TextError::UnknownId(id))?);
        }
        Ok(self.decoder.decode(&tokens))
    }

    /// An incremental decoder for generated ids (see [`DecodeStream`]).
    pub fn decode_stream(&self, skip_special_tokens: bool) -> DecodeStream<'_> {
        DecodeStream {
            tokenizer: self,
            skip_special_tokens,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_ids: 0,
        }
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.vocab.token(id)
    }

    /// The raw bytes token `id` stands for on its own (byte-level BPE through GPT-2's byte
    /// alphabet, SentencePiece's '▁' as a space and `<0xNN>` as its byte), for matching
    /// tokens against a grammar. A special token gives its text: tell it apart with
    /// [`Tokenizer::is_special`]. `None` past the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        self.vocab.token(id).map(|t| self.decoder.token_bytes(t))
    }

    /// Whether `decode(.., skip_special_tokens = true)` leaves `id` out.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }
}

/// Decodes ids one at a time and returns text only once it is final: never a partial
/// UTF-8 sequence (a trailing U+FFFD waits for the next id), and with the spacing the
/// whole sequence would get (SentencePiece's dropped first space, WordPiece joins).
///
/// It keeps the ids since the last emitted text plus those of the emission before, as
/// context, and emits what decoding them adds to the context's own text.
pub struct DecodeStream<'t> {
    tokenizer: &'t Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// The text of `ids[..prefix_ids]`, already emitted.
    prefix: String,
    prefix_ids: usize,
}

impl DecodeStream<'_> {
    /// Adds one id; returns the text it completes, if any.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if text.len() <= self.prefix.len() || text.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(None);
        }
        Ok(Some(self.emit(text)?))
    }

    /// Whatever is still held back (incomplete UTF-8 at the end of generation), as U+FFFD.
    pub fn finish(mut self) -> Result<Option<String>> {
        let text = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        if text.len() <= self.prefix.len() {
            return Ok(None);
        }
        Ok(Some(self.emit(text)?))
    }

    fn emit(&mut self, text: String) -> Result<String> {
        let new = match text.strip_prefix(self.prefix.as_str()) {
            Some(rest) => rest.to_string(),
            None => {
                // The context decodes differently now: emit past the common prefix.
                let common = text
                    .char_indices()
                    .zip(self.prefix.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(self.prefix.len().min(text.len()), |((i, _), _)| i);
                text.get(common..).unwrap_or_default().to_string()
            }
        };
        self.ids.drain(..self.prefix_ids);
        self.prefix = self.tokenizer.decode(&self.ids, self.skip_special_tokens)?;
        self.prefix_ids = self.ids.len();
        Ok(new)
    }
}
