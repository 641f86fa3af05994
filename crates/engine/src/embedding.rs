//! Sentence embeddings: a BERT encoder, its tokenizer and its pooling.

use quench_cpu::{Encoder, Real};
use quench_text::Tokenizer;

use crate::error::{EngineError, Result};
use crate::info::ModelInfo;

pub(crate) enum Encoders {
    F32(Encoder<f32>),
    F64(Encoder<f64>),
}

/// How token states become one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The average over all tokens (sentence-transformers' `pooling_mode_mean_tokens`).
    Mean,
    /// The state of the first token ([CLS]).
    Cls,
}

/// A model that turns text into vectors (BERT sentence embedders such as all-MiniLM-L6-v2).
/// `Send + Sync`: share it behind an `Arc`.
pub struct EmbeddingModel {
    encoder: Encoders,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    info: ModelInfo,
}

/// One text's embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    pub vector: Vec<f32>,
    /// Tokens read (after truncation).
    pub tokens: usize,
    /// Set when the text was longer than the model reads: its length in tokens. Only the
    /// first [`ModelInfo::context_limit`] tokens (framing tokens kept) were read.
    pub truncated_from: Option<usize>,
}

impl EmbeddingModel {
    pub(crate) fn new(
        encoder: Encoders,
        tokenizer: Tokenizer,
        pooling: Pooling,
        normalize: bool,
        info: ModelInfo,
    ) -> Self {
        EmbeddingModel {
            encoder,
            tokenizer,
            pooling,
            normalize,
            info,
        }
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether vectors are scaled to unit length.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// Width of the vectors.
    pub fn dimensions(&self) -> usize {
        self.info.config.hidden
    }

    /// One embedding per text, in order.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Embedding>> {
        texts.iter().map(|text| self.embed_one(text)).collect()
    }

    fn embed_one(&self, text: &str) -> Result<Embedding> {
        let (tokens, truncated_from) = self.tokenize(text)?;
        let vector = match &self.encoder {
            Encoders::F32(e) => self.pool(e, &tokens)?,
            Encoders::F64(e) => self.pool(e, &tokens)?,
        };
        Ok(Embedding {
            vector,
            tokens: tokens.len(),
            truncated_from,
        })
    }

    /// The text's tokens with the model's framing ([CLS] … [SEP]); a text too long loses
    /// tokens from its end, its framing kept, as sentence-transformers truncates.
    fn tokenize(&self, text: &str) -> Result<(Vec<u32>, Option<usize>)> {
        let encode = |text: &str, framing: bool| {
            self.tokenizer
                .encode(text, framing)
                .map_err(|e| EngineError::text("tokenizing the text", e))
        };
        let full = encode(text, true)?;
        let limit = self.info.context_limit;
        if full.len() <= limit {
            return Ok((full, None));
        }
        let plain = encode(text, false)?;
        let framing = encode("", true)?;
        // full = framing[..split] + plain + framing[split..]
        let split = (0..=framing.len())
            .find(|&s| {
                full.len() == plain.len() + framing.len()
                    && full[..s] == framing[..s]
                    && full[s + plain.len()..] == framing[s..]
            })
            .unwrap_or(0);
        let keep = limit.saturating_sub(framing.len()).min(plain.len());
        let mut tokens = framing[..split].to_vec();
        tokens.extend_from_slice(&plain[..keep]);
        tokens.extend_from_slice(&framing[split..]);
        tokens.truncate(limit);
        Ok((tokens, Some(full.len())))
    }

    fn pool<T: Real>(&self, encoder: &Encoder<T>, tokens: &[u32]) -> Result<Vec<f32>> {
        let states = encoder.hidden_states(tokens, None)?;
        let width = states.cols();
        let mut pooled = vec![0f64; width];
        match self.pooling {
            Pooling::Mean => {
                for t in 0..states.rows() {
                    for (p, v) in pooled.iter_mut().zip(states.row(t)) {
                        *p += v.to_f64();
                    }
                }
                let count = states.rows() as f64;
                pooled.iter_mut().for_each(|p| *p /= count);
            }
            Pooling::Cls => {
                for (p, v) in pooled.iter_mut().zip(states.row(0)) {
                    *p = v.to_f64();
                }
            }
        }
        if self.normalize {
            // As torch.nn.functional.normalize: the norm is clamped below at 1e-12.
            let norm = pooled.iter().map(|p| p * p).sum::<f64>().sqrt().max(1e-12);
            pooled.iter_mut().for_each(|p| *p /= norm);
        }
        Ok(pooled.into_iter().map(|p| p as f32).collect())
    }
}

impl std::fmt::Debug for EmbeddingModel {
    /// A summary: the weights are large.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingModel")
            .field("path", &self.info.path)
            .field("pooling", &self.pooling)
            .field("normalize", &self.normalize)
            .finish_non_exhaustive()
    }
}
