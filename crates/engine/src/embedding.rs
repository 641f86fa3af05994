//! Sentence embeddings: a BERT encoder (on the CPU, or on a device), its tokenizer and its
//! pooling.

use std::sync::Mutex;

use quench_cpu::{Encoder, Real};
use quench_text::Tokenizer;

use crate::gpu::encoder::GpuEncoder;

use crate::error::{EngineError, Result};
use crate::info::ModelInfo;

pub(crate) enum Encoders {
    F32(Encoder<f32>),
    F64(Encoder<f64>),
    /// On a device: the texts of one call run together, padded to the longest.
    Gpu(Box<Mutex<GpuEncoder>>),
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
        let tokenized = texts
            .iter()
            .map(|text| self.tokenize(text))
            .collect::<Result<Vec<_>>>()?;
        let vectors: Vec<Vec<f32>> = match &self.encoder {
            Encoders::F32(e) => tokenized
                .iter()
                .map(|(tokens, _)| self.pool_cpu(e, tokens))
                .collect::<Result<_>>()?,
            Encoders::F64(e) => tokenized
                .iter()
                .map(|(tokens, _)| self.pool_cpu(e, tokens))
                .collect::<Result<_>>()?,
            Encoders::Gpu(e) => {
                let tokens: Vec<Vec<u32>> = tokenized.iter().map(|(t, _)| t.clone()).collect();
                // A poisoned lock means a pass panicked midway; the weights are unchanged.
                let mut encoder = e.lock().unwrap_or_else(|p| p.into_inner());
                let states = encoder.hidden_states(&tokens)?;
                let width = encoder.config().hidden;
                states
                    .iter()
                    .map(|s| {
                        self.pool(
                            s.chunks_exact(width)
                                .map(|row| row.iter().map(|&v| v as f64)),
                        )
                    })
                    .collect()
            }
        };
        // A number that cannot be trusted is refused, never returned as a vector.
        if vectors.iter().flatten().any(|x| !x.is_finite()) {
            return Err(EngineError::BadEmbedding);
        }
        Ok(tokenized
            .into_iter()
            .zip(vectors)
            .map(|((tokens, truncated_from), vector)| Embedding {
                vector,
                tokens: tokens.len(),
                truncated_from,
            })
            .collect())
    }

    /// The device the encoder runs on: `"cpu"`, or the device's name and backend.
    pub fn device(&self) -> String {
        match &self.encoder {
            Encoders::F32(_) | Encoders::F64(_) => "cpu".into(),
            Encoders::Gpu(e) => e.lock().unwrap_or_else(|p| p.into_inner()).device(),
        }
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

    fn pool_cpu<T: Real>(&self, encoder: &Encoder<T>, tokens: &[u32]) -> Result<Vec<f32>> {
        let states = encoder.hidden_states(tokens, None)?;
        Ok(self.pool((0..states.rows()).map(|t| states.row(t).iter().map(|v| v.to_f64()))))
    }

    /// Pools token states (rows, in order) into one vector, normalized if the model asks.
    fn pool<R: Iterator<Item = f64>>(&self, rows: impl Iterator<Item = R>) -> Vec<f32> {
        let mut pooled: Vec<f64> = vec![];
        let mut count = 0usize;
        for row in rows {
            if count == 0 {
                pooled = row.collect();
            } else if self.pooling == Pooling::Mean {
                pooled.iter_mut().zip(row).for_each(|(p, v)| *p += v);
            }
            count += 1;
        }
        if self.pooling == Pooling::Mean && count > 0 {
            pooled.iter_mut().for_each(|p| *p /= count as f64);
        }
        if self.normalize {
            // As torch.nn.functional.normalize: the norm is clamped below at 1e-12.
            let norm = pooled.iter().map(|p| p * p).sum::<f64>().sqrt().max(1e-12);
            pooled.iter_mut().for_each(|p| *p /= norm);
        }
        pooled.into_iter().map(|p| p as f32).collect()
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
