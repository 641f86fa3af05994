//! Text generation: a decoder, its tokenizer and chat template, and sessions.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use quench_text::{ChatTemplate, Message, Tokenizer, ToolFormat};

use crate::backend::{feed_one, pick_one, Decode, Fed, Masks, Rows, Sequence};
use crate::error::{EngineError, Result};
use crate::generate::{self, CausalLm, ConstrainError, FinishReason, GenerateOptions, Grammars};
use crate::info::ModelInfo;

/// Distinguishes models so that a session is only ever used with the model that made it.
static NEXT_MODEL_ID: AtomicU64 = AtomicU64::new(1);

/// A model that continues text: llama, qwen2, qwen3.
///
/// Shared freely across threads (`Send + Sync`, all methods take `&self`); each conversation
/// or request owns a [`Session`].
pub struct CausalModel {
    id: u64,
    backend: Box<dyn Decode>,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    eos_ids: Vec<u32>,
    info: ModelInfo,
    /// Structured output's token trie, built on the first constrained request.
    grammars: OnceLock<std::result::Result<Grammars, String>>,
}

/// The KV cache of one conversation, owned by its caller and used with the model that made
/// it ([`CausalModel::new_session`]).
///
/// It remembers the tokens it holds: [`CausalModel::generate`] reuses the longest prefix the
/// new prompt shares with them and computes only the rest, so a chat that sends the whole
/// conversation each turn pays only for the new turn.
pub struct Session {
    model_id: u64,
    sequence: Box<dyn Sequence>,
    tokens: Vec<u32>,
}

impl Session {
    /// The tokens whose keys and values the cache holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Most positions this session holds.
    pub fn context_limit(&self) -> usize {
        self.sequence.limit()
    }

    /// Forgets everything (the memory of a long conversation is kept for reuse).
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// After a feed of `tokens` (a prefix of which the session held before): the tokens
    /// list follows the cache, which holds those whose steps completed.
    fn keep_fed(&mut self, tokens: &[u32]) {
        let held = self.sequence.len();
        self.tokens.clear();
        self.tokens
            .extend_from_slice(&tokens[..held.min(tokens.len())]);
    }

    /// Forgets every position from `len` on (and possibly a few before it, where the
    /// cache shares them with a fork: [`Session::tokens`] tells what is held).
    pub fn truncate(&mut self, len: usize) {
        self.sequence.truncate(len);
        self.tokens.truncate(self.sequence.len());
    }

    /// A new session of the same model holding a prefix of this one's tokens: all of them
    /// on the CPU; on the GPU the whole 16-position blocks, shared with this session rather
    /// than copied. Feeding the rest of the tokens again makes it whole.
    pub fn fork(&self) -> Session {
        let sequence = self.sequence.fork();
        let held = sequence.len().min(self.tokens.len());
        Session {
            model_id: self.model_id,
            sequence,
            tokens: self.tokens[..held].to_vec(),
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
    /// A conversation whose reply may call these tools (OpenAI tool definitions).
    ChatWithTools(&'a [Message], &'a [serde_json::Value]),
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
    /// A model over `backend` with the text side given: for models built in memory (a
    /// checkpoint's own come from [`crate::load`]).
    pub fn new(
        backend: Box<dyn Decode>,
        tokenizer: Tokenizer,
        template: Option<ChatTemplate>,
        eos_ids: Vec<u32>,
        info: ModelInfo,
    ) -> Self {
        CausalModel {
            id: NEXT_MODEL_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            tokenizer,
            template,
            eos_ids,
            info,
            grammars: OnceLock::new(),
        }
    }

    /// The compiler of output grammars over this model's tokens, built on first use (the
    /// token trie takes a moment for a large vocabulary).
    pub fn grammars(&self) -> std::result::Result<&Grammars, ConstrainError> {
        self.grammars
            .get_or_init(|| {
                Grammars::new(&self.tokenizer, &self.eos_ids, self.info.config.vocab).map_err(|e| {
                    match e {
                        ConstrainError::Vocabulary(why) => why,
                        other => other.to_string(),
                    }
                })
            })
            .as_ref()
            .map_err(|e| ConstrainError::Vocabulary(e.clone()))
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

    /// The backend the model runs on, as its own type `B` when it is one (a GPU
    /// decoder's timings and dispatch list, say).
    pub fn backend<B: Decode>(&self) -> Option<&B> {
        self.backend.as_any().downcast_ref::<B>()
    }

    /// An empty session holding up to the load's context limit.
    pub fn new_session(&self) -> Session {
        Session {
            model_id: self.id,
            sequence: self.backend.new_sequence(self.info.context_limit),
            tokens: Vec::new(),
        }
    }

    /// The conversation as the model's chat template writes it; with `add_generation_prompt`,
    /// followed by the opening of an assistant turn.
    pub fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_chat_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`CausalModel::render_chat`] for a reply that may call `tools`.
    pub fn render_chat_with_tools(
        &self,
        messages: &[Message],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.template.as_ref().ok_or(EngineError::NoChatTemplate)?;
        template
            .render_with_tools(messages, tools, add_generation_prompt)
            .map_err(|e| EngineError::text("chat template", e))
    }

    /// The form in which the chat template's replies write tool calls (none without a
    /// template).
    pub fn tool_format(&self) -> Option<ToolFormat> {
        self.template.as_ref().map(ChatTemplate::tool_format)
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
            Prompt::ChatWithTools(messages, tools) => {
                tokenize(&self.render_chat_with_tools(messages, tools, true)?, false)
            }
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
        self.generate_constrained(session, prompt, options, None, on_text)
    }

    /// [`CausalModel::generate`] with the reply held to `constraint` (from
    /// [`CausalModel::grammars`]): it ends with [`FinishReason::Complete`] once complete.
    pub fn generate_constrained(
        &self,
        session: &mut Session,
        prompt: Prompt<'_>,
        options: &GenerateOptions,
        constraint: Option<&mut generate::Constraint>,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation> {
        let prompt = self.prompt_tokens(prompt)?;
        let reused = self.reuse_prefix(session, &prompt)?;
        let mut feeder = Feeder {
            backend: self.backend.as_ref(),
            session,
            reused,
            prefilled: false,
            trace: Trace {
                logits: options.keep_logits.then(Vec::new),
                ..Trace::default()
            },
        };
        let drawn = generate::generate_constrained(
            &mut feeder,
            &|tokens: &[u32]| self.detokenize(tokens),
            &prompt,
            options,
            &self.eos_ids,
            constraint,
            &mut |_, piece: &str| {
                if !piece.is_empty() {
                    on_text(piece)
                }
            },
        )?;
        let trace = feeder.trace;
        Ok(Generation {
            text: drawn.text,
            tokens: drawn.tokens,
            finish: drawn.finish,
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
        let mut out: Vec<Option<Result<Vec<f32>>>> = Vec::with_capacity(items.len());
        let mut fresh = Vec::with_capacity(items.len());
        for item in items.iter_mut() {
            match self.reuse_prefix(item.session, item.tokens) {
                Ok(reused) => {
                    out.push(None);
                    fresh.push(BatchItem {
                        session: &mut *item.session,
                        tokens: &item.tokens[reused..],
                    });
                }
                Err(e) => out.push(Some(Err(e))),
            }
        }
        let mut results = self.step(&mut fresh).into_iter();
        out.into_iter()
            .map(|r| match r {
                Some(refused) => refused,
                None => results.next().unwrap_or(Err(EngineError::NoLogits)),
            })
            .collect()
    }

    /// Feeds each item's `tokens` after the positions its session holds and returns, per
    /// item, the logits of its last token; each session then holds its new tokens too. The
    /// items run together as [`CausalModel::feed_batch`] runs them. A failed item's session
    /// holds the tokens whose steps completed.
    pub fn step(&self, items: &mut [BatchItem<'_>]) -> Vec<Result<Vec<f32>>> {
        self.step_picking(items, &[], &Vec::new)
            .into_iter()
            .map(|r| r.and_then(Fed::into_logits))
            .collect()
    }

    /// As [`CausalModel::step`], where each item with `picks[i]` set gets back only the
    /// next token of greedy decoding under its mask (`masks()[i]`), picked on the device
    /// on a GPU ([`Decode::feed_picking`]).
    pub fn step_picking(
        &self,
        items: &mut [BatchItem<'_>],
        picks: &[bool],
        masks: Masks<'_>,
    ) -> Vec<Result<Fed>> {
        let mut out: Vec<Option<Result<Fed>>> = items
            .iter()
            .map(|item| {
                if item.session.model_id != self.id {
                    Some(Err(EngineError::ForeignSession))
                } else if item.tokens.is_empty() {
                    Some(Err(EngineError::NoTokens))
                } else {
                    None
                }
            })
            .collect();
        let pending: Vec<usize> = (0..items.len()).filter(|&i| out[i].is_none()).collect();
        let mut rows: Vec<Rows<'_>> = items
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| out[*i].is_none())
            .map(|(_, item)| Rows {
                sequence: item.session.sequence.as_mut(),
                tokens: item.tokens,
            })
            .collect();
        let pending_picks: Vec<bool> = pending
            .iter()
            .map(|&i| picks.get(i).copied().unwrap_or(false))
            .collect();
        let pending_masks = || {
            let all = masks();
            pending
                .iter()
                .map(|&i| all.get(i).cloned().flatten())
                .collect()
        };
        let results = self
            .backend
            .feed_picking(&mut rows, &pending_picks, &pending_masks);
        drop(rows);
        for (&i, result) in pending.iter().zip(results) {
            out[i] = Some(result);
        }
        for &i in &pending {
            let item = &mut items[i];
            let mut fed = std::mem::take(&mut item.session.tokens);
            fed.extend_from_slice(item.tokens);
            item.session.keep_fed(&fed);
        }
        out.into_iter()
            .map(|r| r.unwrap_or(Err(EngineError::NoLogits)))
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
        session.truncate(shared.min(tokens.len() - 1));
        Ok(session.tokens.len())
    }
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

/// A session seen as the generation loop's [`CausalLm`], which feeds the whole prompt: the
/// first `reused` prompt tokens are already in the session, so the first feed skips them,
/// and until then the position reported excludes them.
struct Feeder<'a> {
    backend: &'a dyn Decode,
    session: &'a mut Session,
    reused: usize,
    prefilled: bool,
    trace: Trace,
}

impl CausalLm for Feeder<'_> {
    fn position(&self) -> usize {
        self.session.sequence.len() - self.reused
    }

    fn context_limit(&self) -> usize {
        self.session.sequence.limit()
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let row = self.fed(tokens, |backend, sequence, fresh| {
            feed_one(backend, sequence, fresh)
        })?;
        if let Some(kept) = &mut self.trace.logits {
            kept.push(row.clone());
        }
        Ok(row)
    }

    fn feed_greedy(&mut self, tokens: &[u32], mask: &dyn Fn() -> Option<Vec<u32>>) -> Result<u32> {
        self.fed(tokens, |backend, sequence, fresh| {
            pick_one(backend, sequence, fresh, mask)
        })
    }
}

impl Feeder<'_> {
    /// Runs `feed` on the tokens not yet in the session (the first feed skips the reused
    /// ones), keeps the session's token list in step with its sequence and times it.
    fn fed<T>(
        &mut self,
        tokens: &[u32],
        feed: impl FnOnce(&dyn Decode, &mut dyn Sequence, &[u32]) -> Result<T>,
    ) -> Result<T> {
        let first = !self.prefilled;
        let fresh = if first {
            &tokens[self.reused.min(tokens.len())..]
        } else {
            tokens
        };
        let start = Instant::now();
        let result = feed(self.backend, self.session.sequence.as_mut(), fresh);
        // The token list follows the sequence, which holds the positions whose steps
        // completed (all of them, unless the feed failed).
        let (tokens, held) = (&mut self.session.tokens, self.session.sequence.len());
        let before = tokens.len().min(held);
        tokens.truncate(before);
        tokens.extend_from_slice(&fresh[..(held - before).min(fresh.len())]);
        let out = result?;
        let elapsed = start.elapsed();
        if first {
            self.trace.prefill += elapsed;
        } else {
            self.trace.decode += elapsed;
        }
        self.reused = 0;
        self.prefilled = true;
        Ok(out)
    }
}
