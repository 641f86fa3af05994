//! Decode timing: a prompt (through the prompt path in chunks where the decoder has one,
//! else one decode step per token), then greedy steps, each a full round trip (token
//! written, graph replayed, next token read back), timed on the host.

use std::time::Instant;

use quench_models::arch::ModelConfig;

use super::decoder::{GpuDecoder, GpuSummary};
use super::tensor_parallel::TensorParallel;
use crate::backend::{pick_one, Decode};
use crate::error::Result;

/// How fast greedy decoding ran.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodeTiming {
    pub prompt_tokens: usize,
    /// Milliseconds of the whole prompt, up to its next token read back.
    pub prefill_ms: f64,
    /// Tokens per prompt chunk; 0 where the prompt was fed one decode step per token.
    pub prefill_chunk: usize,
    /// Weights of the layers' matrices ([`super::matrix_params`]).
    pub matrix_params: u64,
    /// Milliseconds of each step after the first token, in order.
    pub step_ms: Vec<f64>,
    /// Weight bytes one step reads (every weight once; activations and the KV cache not
    /// counted).
    pub weight_bytes_per_token: u64,
    pub dispatches_per_token: usize,
}

impl DecodeTiming {
    /// The `q`-quantile (0..=1) of the step times.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let mut v = self.step_ms.clone();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => f64::NAN,
            n => v[((n - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize],
        }
    }

    /// Tokens per second after the first: `(N − 1) / (t(N) − t(1))`.
    pub fn tokens_per_second(&self) -> f64 {
        let total: f64 = self.step_ms.iter().sum();
        if total > 0.0 {
            self.step_ms.len() as f64 / (total / 1e3)
        } else {
            f64::NAN
        }
    }

    /// Prompt tokens per second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / (self.prefill_ms * 1e-3)
    }

    /// The prompt's matrix products in TFLOP/s (10^12): `2 · matrix_params · tokens`
    /// over the prompt's time (which includes its attention, norms and the host's writes).
    pub fn prefill_tflops(&self) -> f64 {
        2.0 * self.matrix_params as f64 * self.prompt_tokens as f64
            / (self.prefill_ms * 1e-3)
            / 1e12
    }

    /// Weight bytes read per second at the median step, in GB/s (10^9 bytes).
    pub fn weight_gbps(&self) -> f64 {
        self.weight_bytes_per_token as f64 / (self.quantile_ms(0.5) * 1e-3) / 1e9
    }
}

impl GpuDecoder {
    /// Feeds `prompt`, then draws `tokens` tokens greedily (the device's argmax), timing
    /// each step after the first token.
    pub fn time_decode(&self, prompt: &[u32], tokens: usize) -> Result<DecodeTiming> {
        time(self, self.summary(), self.config(), prompt, tokens)
    }
}

impl TensorParallel {
    /// As [`GpuDecoder::time_decode`], every step across all ranks (the next token picked
    /// on the host from the gathered logits).
    pub fn time_decode(&self, prompt: &[u32], tokens: usize) -> Result<DecodeTiming> {
        time(self, &self.summary(), self.config(), prompt, tokens)
    }
}

/// Times `decoder`, which `s` describes: `prompt`, then `tokens` greedy tokens.
fn time(
    decoder: &dyn Decode,
    s: &GpuSummary,
    config: &ModelConfig,
    prompt: &[u32],
    tokens: usize,
) -> Result<DecodeTiming> {
    let mut session = decoder.new_sequence(decoder.context_limit());
    let no_mask = || None;
    let start = Instant::now();
    let mut next = pick_one(decoder, &mut *session, prompt, &no_mask)?;
    let prefill_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut step_ms = Vec::with_capacity(tokens.saturating_sub(1));
    for _ in 1..tokens {
        let start = Instant::now();
        next = pick_one(decoder, &mut *session, &[next], &no_mask)?;
        step_ms.push(start.elapsed().as_secs_f64() * 1e3);
    }
    Ok(DecodeTiming {
        prompt_tokens: prompt.len(),
        prefill_ms,
        prefill_chunk: s.prefill_chunk,
        matrix_params: super::matrix_params(config),
        step_ms,
        weight_bytes_per_token: s.weight_bytes_per_token,
        dispatches_per_token: s.dispatches_per_token,
    })
}
