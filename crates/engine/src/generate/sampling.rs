//! Choosing the next token from logits.
//!
//! The order of operations is that of Hugging Face transformers: repetition penalty, then
//! temperature, top-k, softmax, top-p, min-p, and a draw from what is left. OpenAI's
//! adjustments (a bias per token, the presence and frequency penalties over the tokens
//! drawn so far) come first, after the repetition penalty.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{EngineError, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 picks the most likely token (greedy); otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the fewest most likely tokens whose probabilities add up to at least `top_p`;
    /// 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Above 1, discourages tokens already present in the context: a positive logit is
    /// divided by it, a negative one multiplied. 1 leaves logits alone.
    pub repetition_penalty: f32,
    /// Added to the logits of the tokens named (OpenAI's `logit_bias`, each in [-100, 100];
    /// -100 in effect bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Subtracted from the logit of every token drawn so far (OpenAI's, in [-2, 2]).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was drawn so far (in [-2, 2]).
    pub frequency_penalty: f32,
    /// Seed of the random draws: the same seed, logits and history give the same tokens.
    pub seed: u64,
}

impl SamplingParams {
    /// Always the most likely token.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }

    /// Greedy with nothing that changes the logits first (no penalty, no bias): the next
    /// token is the largest logit's index, which a device can pick itself.
    pub fn picks_largest_logit(&self) -> bool {
        self.temperature == 0.0
            && self.repetition_penalty == 1.0
            && self.logit_bias.is_empty()
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |param, reason: String| Err(EngineError::Sampling { param, reason });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", format!("{} is not ≥ 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} is not in (0, 1]", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return bad("min_p", format!("{} is not in [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(
                "repetition_penalty",
                format!("{} is not > 0", self.repetition_penalty),
            );
        }
        for (param, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(param, format!("{v} is not in [-2, 2]"));
            }
        }
        if let Some((token, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return bad(
                "logit_bias",
                format!("token {token}'s {b} is not in [-100, 100]"),
            );
        }
        Ok(())
    }
}

/// The index of the largest logit; the lowest index among equals. NaN is no number to
/// pick: it is passed over (a NaN first would otherwise win, no value comparing above it),
/// and logits that are all NaN (or none) give `None`.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// Divides positive logits of tokens in `history` by `penalty` and multiplies negative ones
/// (each token once, however often it occurs). Ids outside `logits` are ignored.
pub fn apply_repetition_penalty(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen = vec![false; logits.len()];
    for &t in history {
        let t = t as usize;
        if t < logits.len() && !seen[t] {
            seen[t] = true;
            let v = &mut logits[t];
            *v = if *v > 0.0 { *v / penalty } else { *v * penalty };
        }
    }
}

/// A candidate token and its probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub token: u32,
    pub prob: f64,
}

/// Keeps the `k` most likely candidates of a list sorted most likely first; 0 keeps all.
pub fn top_k_filter(sorted: &mut Vec<Candidate>, k: usize) {
    if k > 0 {
        sorted.truncate(k);
    }
}

/// Keeps the shortest prefix of a list sorted most likely first whose probabilities add up
/// to at least `p` of the list's total (at least one candidate).
pub fn top_p_filter(sorted: &mut Vec<Candidate>, p: f64) {
    let total: f64 = sorted.iter().map(|c| c.prob).sum();
    let mut sum = 0.0;
    for (i, c) in sorted.iter().enumerate() {
        sum += c.prob;
        if sum >= p * total {
            sorted.truncate(i + 1);
            return;
        }
    }
}

/// Drops candidates whose probability is below `min_p` times the largest (which always stays).
pub fn min_p_filter(sorted: &mut Vec<Candidate>, min_p: f64) {
    let Some(top) = sorted.first().map(|c| c.prob) else {
        return;
    };
    sorted.retain(|c| c.prob >= min_p * top);
}

/// Draws tokens according to [`SamplingParams`] with its own seeded random stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// How often each token was drawn, for the presence and frequency penalties.
    drawn: HashMap<u32, u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Ok(Sampler {
            params,
            rng,
            drawn: HashMap::new(),
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token given the logits of the last position and the tokens of the context
    /// (for the repetition penalty).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        let token = self.draw(logits, history)?;
        *self.drawn.entry(token).or_default() += 1;
        Ok(token)
    }

    fn draw(&mut self, logits: &[f32], history: &[u32]) -> Result<u32> {
        let candidates = self.distribution(logits, history)?;
        if candidates.len() == 1 {
            return Ok(candidates[0].token);
        }
        let u: f64 = self.rng.gen();
        let mut sum = 0.0;
        for c in &candidates {
            sum += c.prob;
            if u < sum {
                return Ok(c.token);
            }
        }
        // Rounding can leave the probabilities summing to just under u.
        Ok(candidates[candidates.len() - 1].token)
    }

    /// OpenAI's adjustments: the bias per token, then the penalties for the tokens drawn.
    /// Ids outside `logits` are ignored.
    fn adjust(&self, logits: &mut [f32]) {
        let p = &self.params;
        for &(token, bias) in &p.logit_bias {
            if let Some(v) = logits.get_mut(token as usize) {
                *v += bias;
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&token, &count) in &self.drawn {
                if let Some(v) = logits.get_mut(token as usize) {
                    *v -= p.presence_penalty + p.frequency_penalty * count as f32;
                }
            }
        }
    }

    /// The tokens a draw chooses among, most likely first, with probabilities that sum to 1.
    /// Greedy sampling gives the single most likely token.
    pub fn distribution(&self, logits: &[f32], history: &[u32]) -> Result<Vec<Candidate>> {
        if logits.iter().any(|v| v.is_nan()) {
            return Err(EngineError::BadLogits { what: "NaN" });
        }
        if logits.contains(&f32::INFINITY) {
            return Err(EngineError::BadLogits { what: "+infinity" });
        }
        let p = &self.params;
        let mut logits = logits.to_vec();
        apply_repetition_penalty(&mut logits, history, p.repetition_penalty);
        self.adjust(&mut logits);
        if logits.iter().all(|&v| v == f32::NEG_INFINITY) {
            return Err(EngineError::BadLogits {
                what: "no finite value",
            });
        }
        if p.temperature == 0.0 {
            let token = argmax(&logits).expect("logits are not empty");
            return Ok(vec![Candidate { token, prob: 1.0 }]);
        }
        let t = p.temperature as f64;
        let max = logits
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let mut candidates: Vec<Candidate> = logits
            .iter()
            .enumerate()
            .filter(|(_, &v)| v != f32::NEG_INFINITY)
            .map(|(i, &v)| Candidate {
                token: i as u32,
                prob: ((v as f64 - max) / t).exp(),
            })
            .collect();
        // Most likely first; equal probabilities by token id, so top-k = 1 is argmax.
        candidates.sort_by(|a, b| b.prob.total_cmp(&a.prob).then(a.token.cmp(&b.token)));
        top_k_filter(&mut candidates, p.top_k);
        normalize(&mut candidates);
        top_p_filter(&mut candidates, p.top_p as f64);
        min_p_filter(&mut candidates, p.min_p as f64);
        normalize(&mut candidates);
        Ok(candidates)
    }
}

fn normalize(candidates: &mut [Candidate]) {
    let total: f64 = candidates.iter().map(|c| c.prob).sum();
    for c in candidates {
        c.prob /= total;
    }
}
