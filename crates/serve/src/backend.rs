//! What the server needs from a model, whatever runs it.
//!
//! The scheduler drives a [`CausalBackend`] one step at a time: every sequence in the batch
//! feeds some tokens (a prefill chunk, or the one token just drawn) after those its cache
//! holds and gets the logits of the last one. An [`EmbeddingBackend`] turns token ids into
//! one vector per text. quench-cpu's f32 decoder implements the first here.

use quench_cpu::{Decoder, KvCache, Logits};

/// A failure of the model itself (not of the request that asked for it).
#[derive(Debug, thiserror::Error)]
#[error("the model failed: {0}")]
pub struct BackendError(pub String);

/// One sequence's share of a scheduler step.
pub struct StepItem<'a, C> {
    pub cache: &'a mut C,
    /// Tokens to feed after those in `cache` (never empty).
    pub tokens: &'a [u32],
}

/// A decoder-only language model with a KV cache per sequence.
pub trait CausalBackend: Send + Sync + 'static {
    type Cache: Send + 'static;

    /// Most positions one sequence can hold.
    fn context_limit(&self) -> usize;
    fn new_cache(&self) -> Self::Cache;
    /// Positions held by `cache`.
    fn cache_len(&self, cache: &Self::Cache) -> usize;
    /// Forgets every position of `cache` from `len` on.
    fn truncate(&self, cache: &mut Self::Cache, len: usize);
    /// Feeds each item's tokens after its cache and returns, per item in order, the logits
    /// of its last token. A backend may run the items as one batch; the result of an item
    /// must not depend on the other items.
    fn step(&self, items: &mut [StepItem<'_, Self::Cache>]) -> Vec<Result<Vec<f32>, BackendError>>;
}

/// One text's embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedded {
    pub vector: Vec<f32>,
    /// Tokens the model read.
    pub tokens: usize,
}

/// A model that maps each text to one embedding vector.
pub trait EmbeddingBackend: Send + Sync + 'static {
    fn dimensions(&self) -> usize;
    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedded>, BackendError>;
}

/// On the CPU each sequence is computed on its own: a row's arithmetic does not depend on
/// the other rows, so outputs are the same whatever the batch holds.
impl CausalBackend for Decoder<f32> {
    type Cache = KvCache<f32>;

    fn context_limit(&self) -> usize {
        self.config().max_positions
    }

    fn new_cache(&self) -> KvCache<f32> {
        Decoder::new_cache(self)
    }

    fn cache_len(&self, cache: &KvCache<f32>) -> usize {
        cache.len()
    }

    fn truncate(&self, cache: &mut KvCache<f32>, len: usize) {
        cache.truncate(len);
    }

    fn step(
        &self,
        items: &mut [StepItem<'_, KvCache<f32>>],
    ) -> Vec<Result<Vec<f32>, BackendError>> {
        items
            .iter_mut()
            .map(|item| {
                self.forward(item.cache, item.tokens, Logits::Last)
                    .map(|m| m.row(0).to_vec())
                    .map_err(|e| BackendError(e.to_string()))
            })
            .collect()
    }
}
