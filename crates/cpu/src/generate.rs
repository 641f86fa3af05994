//! Generating text: prefill a prompt, then sample one token at a time.

use crate::decoder::{Decoder, Logits};
use crate::error::{CpuError, Result};
use crate::kv_cache::KvCache;
use crate::real::Real;
use crate::sampling::{Sampler, SamplingParams};

/// A model that takes tokens and gives the logits of the last one.
pub trait CausalLm {
    /// Positions fed so far.
    fn position(&self) -> usize;
    /// Most positions that can be fed.
    fn context_limit(&self) -> usize;
    /// Feeds `tokens` after those already fed; the logits of the last of them.
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
}

/// A decoder together with the KV cache of one conversation.
pub struct Session<'m, T> {
    decoder: &'m Decoder<T>,
    cache: KvCache<T>,
}

impl<'m, T: Real> Session<'m, T> {
    pub fn new(decoder: &'m Decoder<T>) -> Self {
        Session {
            decoder,
            cache: decoder.new_cache(),
        }
    }

    /// A session whose context holds at most `limit` tokens (capped at the model's own).
    pub fn with_limit(decoder: &'m Decoder<T>, limit: usize) -> Self {
        Session {
            decoder,
            cache: decoder.new_cache_with_limit(limit),
        }
    }

    pub fn cache(&self) -> &KvCache<T> {
        &self.cache
    }

    /// Forgets every position from `position` on.
    pub fn rewind(&mut self, position: usize) {
        self.cache.truncate(position);
    }
}

impl<T: Real> CausalLm for Session<'_, T> {
    fn position(&self) -> usize {
        self.cache.len()
    }

    fn context_limit(&self) -> usize {
        self.cache.limit()
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let logits = self
            .decoder
            .forward(&mut self.cache, tokens, Logits::Last)?;
        Ok(logits.row(0).iter().map(|v| v.to_f32()).collect())
    }
}

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends when the text contains one of these; the text is cut before it.
    pub stop_strings: Vec<String>,
    /// Generation ends when one of these tokens is drawn; it is not part of the result.
    pub eos_ids: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Eos(u32),
    Stop(String),
    MaxTokens,
    /// The context limit was reached.
    ContextFull,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The tokens drawn, without the end-of-sequence token.
    pub tokens: Vec<u32>,
    /// Their text, cut before the stop string if one ended the generation.
    pub text: String,
    pub finish: FinishReason,
}

/// Feeds `prompt` to `model` after whatever it already holds, then draws up to
/// `options.max_new_tokens` tokens.
///
/// `detokenize` turns generated tokens into text. `on_token` is called once per drawn token,
/// the end-of-sequence token included, with the text that became final with it: possibly
/// empty while a multi-byte character is incomplete or the text could still turn into a stop
/// string. Concatenated, those pieces are [`Generation::text`].
pub fn generate(
    model: &mut dyn CausalLm,
    detokenize: &dyn Fn(&[u32]) -> String,
    prompt: &[u32],
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(u32, &str),
) -> Result<Generation> {
    let mut sampler = Sampler::new(options.sampling.clone())?;
    if prompt.is_empty() {
        return Err(CpuError::NoTokens);
    }
    let (used, limit) = (model.position(), model.context_limit());
    if used + prompt.len() > limit {
        return Err(CpuError::PromptTooLong {
            prompt_len: prompt.len(),
            limit,
            used,
        });
    }
    let mut text = TextStream::new(&options.stop_strings);
    let mut history = prompt.to_vec();
    let mut tokens = Vec::new();
    if options.max_new_tokens == 0 {
        return Ok(text.finish(tokens, FinishReason::MaxTokens));
    }
    let mut logits = model.feed(prompt)?;
    loop {
        let token = sampler.sample(&logits, &history)?;
        if options.eos_ids.contains(&token) {
            on_token(token, &text.release_all());
            return Ok(text.finish(tokens, FinishReason::Eos(token)));
        }
        history.push(token);
        tokens.push(token);
        text.set(detokenize(&tokens));
        if let Some(stop) = text.cut_at_stop() {
            on_token(token, &text.release_all());
            return Ok(text.finish(tokens, FinishReason::Stop(stop)));
        }
        let finish = if tokens.len() == options.max_new_tokens {
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
        logits = model.feed(&[token])?;
    }
}

/// Turns the growing decoded text into pieces that are final.
struct TextStream<'a> {
    stops: &'a [String],
    /// The whole decoded text so far (cut at a stop string once one appears).
    decoded: String,
    /// How much of `decoded` has been handed out.
    released: usize,
}

impl<'a> TextStream<'a> {
    fn new(stops: &'a [String]) -> Self {
        TextStream {
            stops,
            decoded: String::new(),
            released: 0,
        }
    }

    /// Takes the decoded text of all tokens generated so far.
    fn set(&mut self, decoded: String) {
        self.decoded = decoded;
    }

    /// Cuts the text before the earliest stop string in it and returns that string.
    fn cut_at_stop(&mut self) -> Option<String> {
        let (at, stop) = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.decoded.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at)?;
        self.decoded.truncate(at);
        Some(stop.clone())
    }

    /// The text not handed out yet that later tokens cannot change: without a trailing
    /// replacement character (an incomplete multi-byte character) or a tail that is the
    /// start of a stop string.
    fn release_final(&mut self) -> String {
        let text = self.decoded.trim_end_matches('\u{FFFD}');
        let held = text
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&text[i..])))
            .unwrap_or(text.len());
        self.release_to(held)
    }

    /// All the text not handed out yet.
    fn release_all(&mut self) -> String {
        self.release_to(self.decoded.len())
    }

    /// Text handed out is never taken back: if the detokenizer rewrote earlier text, what
    /// follows continues after the part already handed out.
    fn release_to(&mut self, end: usize) -> String {
        let piece = self
            .decoded
            .get(self.released..end)
            .unwrap_or("")
            .to_owned();
        self.released = self.released.max(end);
        piece
    }

    fn finish(self, tokens: Vec<u32>, finish: FinishReason) -> Generation {
        Generation {
            tokens,
            text: self.decoded,
            finish,
        }
    }
}
