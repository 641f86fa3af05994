//! Text generation: a decoder, its tokenizer and chat template, and sessions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quench_cpu::{CausalLm, Decoder, FinishReason, KvCache, Logits, Real, SamplingParams};
use quench_text::{ChatTemplate, Message, Tokenizer};

use crate::error::{EngineError, Result};
use crate::info::ModelInfo;

/// Distinguishes models so that a session is only ever used with the model that made it.
static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) enum Weights {
    F32(Decoder<f32>),
    F64(Decoder<f64>),
    /// Boxed: far larger than the CPU decoders' handles.
    Gpu(Box<crate::gpu::GpuDecoder>),
}

enum Cache {
    F32(KvCache<f32>),
    F64(KvCache<f64>),
    Gpu(crate::gpu::GpuSession),
}

/// A model that continues text: llama, qwen2, qwen3.
///
/// Shared freely across threads (`Send + Sync`, all methods take `&self`); each conversation
/// or request owns a [`Session`].
pub struct CausalModel {
    id: u64,
    weights: Weights,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    eos_ids: Vec<u32>,
    info: ModelInfo,
}

/// The KV cache of one conversation, owned by its caller and used with the model that made
/// it ([`CausalModel::new_session`]).
///
/// It remembers the tokens it holds: [`CausalModel::generate`] reuses the longest prefix the
/// new prompt shares with them and computes only the rest, so a chat that sends the whole
/// conversation each turn pays only for the new turn.
pub struct Session {
    model_id: u64,
    cache: Cache,
    tokens: Vec<u32>,
}

impl Session {
    /// The tokens whose keys and values the cache holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Most positions this session holds.
    pub fn context_limit(&self) -> usize {
        match &self.cache {
            Cache::F32(c) => c.limit(),
            Cache::F64(c) => c.limit(),
            Cache::Gpu(c) => c.context_limit(),
        }
    }

    /// Forgets everything (the memory of a long conversation is kept for reuse).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// After a feed of `tokens` (a prefix of which the session held before): the tokens
    /// list follows the cache, which holds those whose steps completed.
    fn keep_fed(&mut self, tokens: &[u32]) {
        let held = match &self.cache {
            Cache::F32(c) => c.len(),
            Cache::F64(c) => c.len(),
            Cache::Gpu(c) => c.len(),
        };
        self.tokens.clear();
        self.tokens
            .extend_from_slice(&tokens[..held.min(tokens.len())]);
    }

    fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        match &mut self.cache {
            Cache::F32(c) => c.truncate(len),
            Cache::F64(c) => c.truncate(len),
            Cache::Gpu(c) => c.truncate(len),
        }
    }
}

/// What to generate from.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    /// Raw text, tokenized with the tokenizer's framing tokens (BOS where the model adds one).
    Text(&'a str),
    /// Token ids, fed as they are.
    Tokens(&'a [u32]),
    /// A conversation, rendered with the model's chat template and an assistant turn opened.
    Chat(&'a [Message]),
}

impl<'a> From<&'a str> for Prompt<'a> {
    fn from(text: &'a str) -> Self {
        Prompt::Text(text)
    }
}

impl<'a> From<&'a [u32]> for Prompt<'a> {
    fn from(tokens: &'a [u32]) -> Self {
        Prompt::Tokens(tokens)
    }
}

impl<'a> From<&'a [Message]> for Prompt<'a> {
    fn from(messages: &'a [Message]) -> Self {
        Prompt::Chat(messages)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    /// Most tokens to draw.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends when the text contains one of these; the text is cut before it.
    pub stop: Vec<String>,
    /// Keep going past the model's end-of-sequence tokens (they are then drawn as text).
    pub ignore_eos: bool,
    /// Keep the logits of every step in [`Generation::logits`] (for checking against other
    /// implementations).
    pub keep_logits: bool,
}

impl Default for GenerateOptions {
    /// 256 tokens, greedy, no stop strings.
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            ignore_eos: false,
            keep_logits: false,
        }
    }
}

/// The outcome of [`CausalModel::generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The text generated, cut before the stop string if one ended it.
    pub text: String,
    /// The tokens drawn, without the end-of-sequence token.
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Of those, how many the session already held and were not computed again.
    pub reused_tokens: usize,
    /// Time spent computing the prompt (up to the first token's logits).
    pub prefill_time: Duration,
    /// Time spent computing the tokens after the first.
    pub decode_time: Duration,
    /// With [`GenerateOptions::keep_logits`]: the logits each token was drawn from, in order
    /// (the first row is the prompt's last position).
    pub logits: Option<Vec<Vec<f32>>>,
}

impl CausalModel {
    pub(crate) fn new(
        weights: Weights,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        eos_ids: Vec<u32>,
        info: ModelInfo,
    ) -> Self {
        CausalModel {
            id: NEXT_MODEL_ID.fetch_add(1, Ordering::Relaxed),
            weights,
            tokenizer,
            template,
            eos_ids,
            info,
        }
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Token ids that end generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The decoder on the GPU, when the model runs there.
    pub fn gpu_decoder(&self) -> Option<&crate::gpu::GpuDecoder> {
        match &self.weights {
            Weights::Gpu(d) => Some(d.as_ref()),
            _ => None,
        }
    }

    /// An empty session holding up to the load's context limit.
    pub fn new_session(&self) -> Session {
        let limit = self.info.context_limit;
        let cache = match &self.weights {
            Weights::F32(d) => Cache::F32(d.new_cache_with_limit(limit)),
            Weights::F64(d) => Cache::F64(d.new_cache_with_limit(limit)),
            Weights::Gpu(d) => Cache::Gpu(d.new_session()),
        };
        Session {
            model_id: self.id,
            cache,
            tokens: Vec::new(),
        }
    }

    /// The conversation as the model's chat template writes it; with `add_generation_prompt`,
    /// followed by the opening of an assistant turn.
    pub fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let template = self.template.as_ref().ok_or(EngineError::NoChatTemplate)?;
        template
            .render(messages, add_generation_prompt)
            .map_err(|e| EngineError::text("chat template", e))
    }

    /// The token ids `prompt` stands for.
    pub fn prompt_tokens(&self, prompt: Prompt<'_>) -> Result<Vec<u32>> {
        let tokenize = |text: &str, framing: bool| {
            self.tokenizer
                .encode(text, framing)
                .map_err(|e| EngineError::text("tokenizing the prompt", e))
        };
        match prompt {
            Prompt::Text(text) => tokenize(text, true),
            Prompt::Tokens(tokens) => Ok(tokens.to_vec()),
            // The template writes the framing tokens itself, as transformers'
            // apply_chat_template(tokenize=True) assumes.
            Prompt::Chat(messages) => tokenize(&self.render_chat(messages, true)?, false),
        }
    }

    /// The text of generated tokens. Ids past the tokenizer's vocabulary (padding rows of a
    /// larger embedding) have no text and are left out.
    pub fn detokenize(&self, tokens: &[u32]) -> String {
        let known: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| self.tokenizer.id_to_token(t).is_some())
            .collect();
        self.tokenizer.decode(&known, true).unwrap_or_default()
    }

    /// Continues `prompt` in `session`, calling `on_text` with each piece of text as it
    /// becomes final (never a partial character, never the start of a stop string).
    ///
    /// The prompt is the whole context: what the session holds beyond the longest prefix it
    /// shares with the prompt is dropped, and only the rest of the prompt is computed.
    pub fn generate(
        &self,
        session: &mut Session,
        prompt: Prompt<'_>,
        options: &GenerateOptions,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        if session.model_id != self.id {
            return Err(EngineError::ForeignSession);
        }
        let prompt = self.prompt_tokens(prompt)?;
        let shared = session
            .tokens
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count();
        // At least one prompt token is fed, for the logits of the first draw.
        let reused = shared.min(prompt.len().saturating_sub(1));
        session.truncate(reused);

        let cpu_options = quench_cpu::GenerateOptions {
            max_new_tokens: options.max_tokens,
            sampling: options.sampling.clone(),
            stop_strings: options.stop.clone(),
            eos_ids: if options.ignore_eos {
                Vec::new()
            } else {
                self.eos_ids.clone()
            },
        };
        let mut trace = Trace {
            logits: options.keep_logits.then(Vec::new),
            ..Trace::default()
        };
        let detokenize = |tokens: &[u32]| self.detokenize(tokens);
        let mut on_token = |_: u32, piece: &str| {
            if !piece.is_empty() {
                on_text(piece)
            }
        };
        let Session { cache, tokens, .. } = session;
        let generation = match (&self.weights, cache) {
            (Weights::F32(decoder), Cache::F32(cache)) => {
                let mut feeder = Feeder::new(decoder, cache, tokens, reused, &mut trace);
                quench_cpu::generate(
                    &mut feeder,
                    &detokenize,
                    &prompt,
                    &cpu_options,
                    &mut on_token,
                )
            }
            (Weights::F64(decoder), Cache::F64(cache)) => {
                let mut feeder = Feeder::new(decoder, cache, tokens, reused, &mut trace);
                quench_cpu::generate(
                    &mut feeder,
                    &detokenize,
                    &prompt,
                    &cpu_options,
                    &mut on_token,
                )
            }
            (Weights::Gpu(decoder), Cache::Gpu(cache)) => {
                let mut feeder =
                    crate::gpu::Feeder::new(decoder, cache, tokens, reused, options.keep_logits);
                let result = quench_cpu::generate(
                    &mut feeder,
                    &detokenize,
                    &prompt,
                    &cpu_options,
                    &mut on_token,
                );
                trace.prefill = feeder.prefill;
                trace.decode = feeder.decode;
                trace.logits = feeder.logits.take();
                Ok(feeder.finish(result)?)
            }
            _ => return Err(EngineError::ForeignSession),
        }?;
        Ok(Generation {
            text: generation.text,
            tokens: generation.tokens,
            finish: generation.finish,
            prompt_tokens: prompt.len(),
            reused_tokens: reused,
            prefill_time: trace.prefill,
            decode_time: trace.decode,
            logits: trace.logits,
        })
    }
}

/// One sequence's part in [`CausalModel::feed_batch`].
pub struct BatchItem<'a> {
    pub session: &'a mut Session,
    /// The whole context, as a prompt of [`CausalModel::generate`]: the session keeps the
    /// longest prefix it shares with it and computes the rest (at least the last token).
    pub tokens: &'a [u32],
}

impl CausalModel {
    /// The logits after the last token of each item's `tokens`, each item's session left
    /// holding all of them.
    ///
    /// On a GPU the items run as batches of up to the `max_batch` given at load: every
    /// decode step takes the next token of each item that has one left, so prompts of
    /// different lengths and single drawn tokens share steps. An item's logits have the
    /// same bits whichever items it runs with. On the CPU the items run one after another.
    ///
    /// An item that cannot run (another model's session, no tokens, a full context, a
    /// token outside the vocabulary, no free KV block) fails alone; a GPU step that fails
    /// as a whole fails the items it was running. A failed item's session holds the
    /// tokens whose steps completed.
    pub fn feed_batch(&self, items: &mut [BatchItem<'_>]) -> Vec<Result<Vec<f32>>> {
        // What each item computes: its tokens from `from[i]` on.
        let mut from = vec![0; items.len()];
        let mut out: Vec<Option<Result<Vec<f32>>>> = Vec::with_capacity(items.len());
        for (i, item) in items.iter_mut().enumerate() {
            match self.reuse_prefix(item.session, item.tokens) {
                Ok(reused) => {
                    from[i] = reused;
                    out.push(None);
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let pending: Vec<usize> = (0..items.len()).filter(|&i| out[i].is_none()).collect();
        match &self.weights {
            Weights::Gpu(decoder) => {
                for group in pending.chunks(decoder.max_batch().max(1)) {
                    feed_gpu_group(decoder, items, &from, group, &mut out);
                }
            }
            weights => {
                for &i in &pending {
                    let item = &mut items[i];
                    let fresh = &item.tokens[from[i]..];
                    let result = match (weights, &mut item.session.cache) {
                        (Weights::F32(d), Cache::F32(c)) => last_logits(d, c, fresh),
                        (Weights::F64(d), Cache::F64(c)) => last_logits(d, c, fresh),
                        _ => Err(EngineError::ForeignSession),
                    };
                    item.session.keep_fed(item.tokens);
                    out[i] = Some(result);
                }
            }
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(EngineError::ForeignSession)))
            .collect()
    }

    /// Cuts `session` to the longest prefix it shares with `tokens` (leaving at least the
    /// last token to compute) and returns that prefix's length.
    fn reuse_prefix(&self, session: &mut Session, tokens: &[u32]) -> Result<usize> {
        if session.model_id != self.id {
            return Err(EngineError::ForeignSession);
        }
        if tokens.is_empty() {
            return Err(EngineError::Unsupported {
                what: "feeding a sequence no tokens".into(),
                reason: "each sequence needs at least one token".into(),
            });
        }
        let shared = session
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        let reused = shared.min(tokens.len() - 1);
        session.truncate(reused);
        Ok(reused)
    }
}

/// Feeds the items of `group` (at most the decoder's batch), each from `from[i]` on,
/// through one GPU batch.
fn feed_gpu_group(
    decoder: &crate::gpu::GpuDecoder,
    items: &mut [BatchItem<'_>],
    from: &[usize],
    group: &[usize],
    out: &mut [Option<Result<Vec<f32>>>],
) {
    let mut members = vec![];
    let mut rows = vec![];
    for (i, item) in items.iter_mut().enumerate() {
        if !group.contains(&i) {
            continue;
        }
        match &mut item.session.cache {
            Cache::Gpu(c) => {
                rows.push((c, &item.tokens[from[i]..]));
                members.push(i);
            }
            _ => out[i] = Some(Err(EngineError::ForeignSession)),
        }
    }
    match decoder.feed_batch(&mut rows) {
        Ok(results) => {
            for (&i, r) in members.iter().zip(results) {
                out[i] = Some(r.map_err(EngineError::from));
            }
        }
        Err(e) => {
            let reason = e.to_string();
            for &i in &members {
                let failed = crate::gpu::GpuError::BatchFailed {
                    reason: reason.clone(),
                };
                out[i] = Some(Err(failed.into()));
            }
        }
    }
    for &i in &members {
        let item = &mut items[i];
        item.session.keep_fed(item.tokens);
    }
}

/// The logits of the last of `tokens`, fed after `cache`.
fn last_logits<T: Real>(
    decoder: &Decoder<T>,
    cache: &mut KvCache<T>,
    tokens: &[u32],
) -> Result<Vec<f32>> {
    let logits = decoder.forward(cache, tokens, Logits::Last)?;
    Ok(logits.row(0).iter().map(|v| v.to_f32()).collect())
}

impl std::fmt::Debug for CausalModel {
    /// A summary: the weights are large.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CausalModel")
            .field("path", &self.info.path)
            .field("arch", &self.info.config.arch)
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("tokens", &self.tokens.len())
            .field("context_limit", &self.context_limit())
            .finish_non_exhaustive()
    }
}

/// Timings and (optionally) logits collected while generating.
#[derive(Default)]
struct Trace {
    prefill: Duration,
    decode: Duration,
    logits: Option<Vec<Vec<f32>>>,
}

/// A session seen as quench-cpu's [`CausalLm`], which feeds the whole prompt: the first
/// `reused` prompt tokens are already in the cache, so the first feed skips them, and until
/// then the position reported excludes them.
struct Feeder<'a, T> {
    decoder: &'a Decoder<T>,
    cache: &'a mut KvCache<T>,
    tokens: &'a mut Vec<u32>,
    reused: usize,
    prefilled: bool,
    trace: &'a mut Trace,
}

impl<'a, T: Real> Feeder<'a, T> {
    fn new(
        decoder: &'a Decoder<T>,
        cache: &'a mut KvCache<T>,
        tokens: &'a mut Vec<u32>,
        reused: usize,
        trace: &'a mut Trace,
    ) -> Self {
        Feeder {
            decoder,
            cache,
            tokens,
            reused,
            prefilled: false,
            trace,
        }
    }
}

impl<T: Real> CausalLm for Feeder<'_, T> {
    fn position(&self) -> usize {
        self.cache.len() - self.reused
    }

    fn context_limit(&self) -> usize {
        self.cache.limit()
    }

    fn feed(&mut self, tokens: &[u32]) -> quench_cpu::Result<Vec<f32>> {
        let first = !self.prefilled;
        let fresh = if first {
            &tokens[self.reused.min(tokens.len())..]
        } else {
            tokens
        };
        let start = Instant::now();
        let logits = self.decoder.forward(self.cache, fresh, Logits::Last)?;
        let elapsed = start.elapsed();
        if first {
            self.trace.prefill += elapsed;
        } else {
            self.trace.decode += elapsed;
        }
        self.reused = 0;
        self.prefilled = true;
        self.tokens.extend_from_slice(fresh);
        let row: Vec<f32> = logits.row(0).iter().map(|v| v.to_f32()).collect();
        if let Some(kept) = &mut self.trace.logits {
            kept.push(row.clone());
        }
        Ok(row)
    }
}
