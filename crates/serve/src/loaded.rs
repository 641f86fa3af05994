//! Models loaded from files by quench-engine, seen through the server's traits.
//!
//! On a GPU a scheduler step is one [`CausalModel::feed_batch`]: the running sequences'
//! tokens go through batched decode steps together (each step a token of every sequence
//! that has one left, prefill chunks and drawn tokens alike), and a sequence's logits do
//! not depend on the others. On the CPU a step calls the engine once per sequence, each
//! a generation that draws a single token: the engine reuses what the session already
//! holds of the tokens passed and computes only the rest, and the logits of the last
//! position are kept. What the engine drew is ignored; the scheduler draws itself.

use quench_engine::{
    BatchItem, CausalModel, EmbeddingModel, GenerateOptions, Message, Prompt, Session,
};

use crate::backend::{BackendError, CausalBackend, Embedded, EmbeddingBackend, StepItem};
use crate::text::{TextFailure, TextSide};

/// An engine session and the tokens it has been given, in order.
pub struct EngineCache {
    session: Session,
    tokens: Vec<u32>,
}

impl CausalBackend for CausalModel {
    type Cache = EngineCache;

    fn context_limit(&self) -> usize {
        self.info().context_limit
    }

    fn new_cache(&self) -> EngineCache {
        EngineCache {
            session: self.new_session(),
            tokens: Vec::new(),
        }
    }

    fn cache_len(&self, cache: &EngineCache) -> usize {
        cache.tokens.len()
    }

    /// The engine session drops the positions past `len` when it is next given tokens
    /// that differ from what it holds.
    fn truncate(&self, cache: &mut EngineCache, len: usize) {
        cache.tokens.truncate(len);
    }

    fn step(&self, items: &mut [StepItem<'_, EngineCache>]) -> Vec<Result<Vec<f32>, BackendError>> {
        if self.gpu_decoder().is_some() {
            return step_batched(self, items);
        }
        let options = GenerateOptions {
            max_tokens: 1,
            ignore_eos: true,
            keep_logits: true,
            ..GenerateOptions::default()
        };
        items
            .iter_mut()
            .map(|item| {
                let cache = &mut *item.cache;
                let before = cache.tokens.len();
                cache.tokens.extend_from_slice(item.tokens);
                let result = self.generate(
                    &mut cache.session,
                    Prompt::Tokens(&cache.tokens),
                    &options,
                    &mut |_| {},
                );
                match result {
                    Ok(generation) => generation
                        .logits
                        .and_then(|mut rows| (!rows.is_empty()).then(|| rows.swap_remove(0)))
                        .ok_or_else(|| BackendError("the engine returned no logits".into())),
                    Err(e) => {
                        cache.tokens.truncate(before);
                        Err(BackendError(e.to_string()))
                    }
                }
            })
            .collect()
    }
}

/// One step of every item through the engine's batched feed.
fn step_batched(
    model: &CausalModel,
    items: &mut [StepItem<'_, EngineCache>],
) -> Vec<Result<Vec<f32>, BackendError>> {
    let before: Vec<usize> = items.iter().map(|i| i.cache.tokens.len()).collect();
    let mut batch: Vec<BatchItem<'_>> = items
        .iter_mut()
        .map(|item| {
            let cache = &mut *item.cache;
            cache.tokens.extend_from_slice(item.tokens);
            BatchItem {
                session: &mut cache.session,
                tokens: &cache.tokens,
            }
        })
        .collect();
    let results = model.feed_batch(&mut batch);
    drop(batch);
    results
        .into_iter()
        .zip(items.iter_mut().zip(before))
        .map(|(result, (item, before))| {
            result.map_err(|e| {
                item.cache.tokens.truncate(before);
                BackendError(e.to_string())
            })
        })
        .collect()
}

impl TextSide for CausalModel {
    fn chat_prompt(&self, messages: &[Message]) -> Result<Vec<u32>, TextFailure> {
        if !self.has_chat_template() {
            return Err(TextFailure::NoTemplate);
        }
        self.prompt_tokens(Prompt::Chat(messages))
            .map_err(|e| TextFailure::Template(e.to_string()))
    }

    fn text_prompt(&self, text: &str) -> Result<Vec<u32>, TextFailure> {
        self.prompt_tokens(Prompt::Text(text))
            .map_err(|e| TextFailure::Tokenize(e.to_string()))
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.detokenize(ids)
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer().decode(&[id], false).unwrap_or_default()
    }

    fn stop_ids(&self) -> &[u32] {
        self.eos_ids()
    }
}

impl EmbeddingBackend for EmbeddingModel {
    fn dimensions(&self) -> usize {
        EmbeddingModel::dimensions(self)
    }

    /// Texts longer than the model reads are cut, as sentence-transformers cuts them.
    fn embed(&self, texts: &[&str]) -> Result<Vec<Embedded>, BackendError> {
        let out = EmbeddingModel::embed(self, texts).map_err(|e| BackendError(e.to_string()))?;
        Ok(out
            .into_iter()
            .map(|e| Embedded {
                vector: e.vector,
                tokens: e.tokens,
            })
            .collect())
    }
}
