//! The generation loop: feed a prompt, then draw one token at a time until an
//! end-of-sequence token, a stop string, the token budget or the context ends it.

use super::constrain::Constraint;
use super::sampling::{Sampler, SamplingParams};
use super::text_stream::TextStream;
use crate::backend::{feed_one, host_greedy, pick_one, Decode, Sequence};
use crate::error::{EngineError, Result};

/// A model that takes tokens and gives the logits of the last one.
pub trait CausalLm {
    /// Positions fed so far.
    fn position(&self) -> usize;
    /// Most positions that can be fed.
    fn context_limit(&self) -> usize;
    /// Feeds `tokens` after those already fed; the logits of the last of them.
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// Feeds `tokens` after those already fed; the next token of greedy decoding under
    /// `mask` (as [`Decode::feed_picking`]). By default from [`CausalLm::feed`]'s logits,
    /// masked and picked on the host.
    fn feed_greedy(&mut self, tokens: &[u32], mask: &dyn Fn() -> Option<Vec<u32>>) -> Result<u32> {
        let logits = self.feed(tokens)?;
        host_greedy(logits, mask().as_deref())
    }
}

/// A backend and one sequence of it, seen as a [`CausalLm`].
pub struct Continuation<'a> {
    backend: &'a dyn Decode,
    sequence: Box<dyn Sequence>,
}

impl<'a> Continuation<'a> {
    /// An empty sequence of `backend` holding up to `limit` positions.
    pub fn new(backend: &'a dyn Decode, limit: usize) -> Self {
        Continuation {
            backend,
            sequence: backend.new_sequence(limit),
        }
    }
}

impl CausalLm for Continuation<'_> {
    fn position(&self) -> usize {
        self.sequence.len()
    }

    fn context_limit(&self) -> usize {
        self.sequence.limit()
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        feed_one(self.backend, self.sequence.as_mut(), tokens)
    }

    fn feed_greedy(&mut self, tokens: &[u32], mask: &dyn Fn() -> Option<Vec<u32>>) -> Result<u32> {
        pick_one(self.backend, self.sequence.as_mut(), tokens, mask)
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
    /// Keep the logits of every step in [`crate::Generation::logits`] (for checking
    /// against other implementations).
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Eos(u32),
    Stop(String),
    MaxTokens,
    /// The context limit was reached.
    ContextFull,
    /// The output format's grammar is complete (see [`generate_constrained`]).
    Complete,
}

/// What one generation drew.
#[derive(Clone, Debug, PartialEq)]
pub struct Drawn {
    /// The tokens drawn, without the end-of-sequence token.
    pub tokens: Vec<u32>,
    /// Their text, cut before the stop string if one ended the generation.
    pub text: String,
    pub finish: FinishReason,
}

/// Feeds `prompt` to `model` after whatever it already holds, then draws up to
/// `options.max_tokens` tokens; a token of `eos_ids` ends the generation unless
/// `options.ignore_eos`.
///
/// `detokenize` turns generated tokens into text. `on_token` is called once per drawn token,
/// the end-of-sequence token included, with the text that became final with it: possibly
/// empty while a multi-byte character is incomplete or the text could still turn into a stop
/// string. Concatenated, those pieces are [`Drawn::text`].
pub fn generate(
    model: &mut dyn CausalLm,
    detokenize: &dyn Fn(&[u32]) -> String,
    prompt: &[u32],
    options: &GenerateOptions,
    eos_ids: &[u32],
    on_token: &mut dyn FnMut(u32, &str),
) -> Result<Drawn> {
    generate_constrained(model, detokenize, prompt, options, eos_ids, None, on_token)
}

/// [`generate`] with each step's logits masked to what `constraint` allows (an output
/// format's grammar); the generation ends with [`FinishReason::Complete`] once the grammar
/// is complete.
pub fn generate_constrained(
    model: &mut dyn CausalLm,
    detokenize: &dyn Fn(&[u32]) -> String,
    prompt: &[u32],
    options: &GenerateOptions,
    eos_ids: &[u32],
    mut constraint: Option<&mut Constraint>,
    on_token: &mut dyn FnMut(u32, &str),
) -> Result<Drawn> {
    let mut sampler = Sampler::new(options.sampling.clone())?;
    if prompt.is_empty() {
        return Err(EngineError::NoTokens);
    }
    let (used, limit) = (model.position(), model.context_limit());
    if used + prompt.len() > limit {
        return Err(EngineError::PromptTooLong {
            prompt_len: prompt.len(),
            limit,
            used,
        });
    }
    let ends = |token: u32| !options.ignore_eos && eos_ids.contains(&token);
    let mut text = TextStream::new(&options.stop);
    let mut history = prompt.to_vec();
    let mut tokens = Vec::new();
    if options.max_tokens == 0 {
        return Ok(text.finish(tokens, FinishReason::MaxTokens));
    }
    // Plain greedy decoding lets the backend mask the logits and pick the token itself (on
    // a device: no logits read back); otherwise the logits come back to be sampled.
    let picks = options.sampling.picks_largest_logit() && !options.keep_logits;
    let mut next = feed(model, picks, prompt, constraint.as_deref_mut())?;
    loop {
        let token = match next {
            Next::Token(token) => token,
            Next::Logits(mut logits) => {
                if let Some(c) = constraint.as_deref_mut() {
                    c.mask(&mut logits)?;
                }
                sampler.sample(&logits, &history)?
            }
        };
        if ends(token) {
            on_token(token, &text.release_all());
            return Ok(text.finish(tokens, FinishReason::Eos(token)));
        }
        if let Some(c) = constraint.as_deref_mut() {
            c.commit(token)?;
        }
        history.push(token);
        tokens.push(token);
        text.set(detokenize(&tokens));
        if let Some(stop) = text.cut_at_stop() {
            on_token(token, &text.release_all());
            return Ok(text.finish(tokens, FinishReason::Stop(stop)));
        }
        let finish = if constraint.as_deref().is_some_and(Constraint::finished) {
            Some(FinishReason::Complete)
        } else if tokens.len() == options.max_tokens {
            Some(FinishReason::MaxTokens)
        } else if model.position() >= model.context_limit() {
            Some(FinishReason::ContextFull)
        } else {
            None
        };
        match finish {
            Some(reason) => {
                on_token(token, &text.release_all());
                return Ok(text.finish(tokens, reason));
            }
            None => on_token(token, &text.release_final()),
        }
        next = feed(model, picks, &[token], constraint.as_deref_mut())?;
    }
}

/// What a feed gave: the logits to sample from, or the token the backend picked.
enum Next {
    Logits(Vec<f32>),
    Token(u32),
}

/// Feeds `tokens`: where `picks`, the model masks and picks the next token itself,
/// else its logits come back. A grammar's next mask is computed while the model reads
/// the tokens.
fn feed(
    model: &mut dyn CausalLm,
    picks: bool,
    tokens: &[u32],
    constraint: Option<&mut Constraint>,
) -> Result<Next> {
    Ok(match (picks, constraint) {
        (true, Some(c)) => Next::Token(c.overlap_pick(|mask| model.feed_greedy(tokens, mask))?),
        (true, None) => Next::Token(model.feed_greedy(tokens, &|| None)?),
        (false, Some(c)) => Next::Logits(c.overlap(|| model.feed(tokens))?),
        (false, None) => Next::Logits(model.feed(tokens)?),
    })
}
