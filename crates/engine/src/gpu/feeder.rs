//! A GPU session seen as quench-cpu's [`CausalLm`], so that text generation (sampling,
//! stop strings, streaming) is the same code on every device.

use std::time::{Duration, Instant};

use quench_cpu::{CausalLm, CpuError};

use super::decoder::GpuDecoder;
use super::error::GpuError;
use super::kv::GpuSession;

/// Feeds a prompt and the drawn tokens to a [`GpuDecoder`]. The first `reused` prompt
/// tokens are already in the session, so the first feed skips them, and until then the
/// position reported excludes them (quench-cpu's generator counts the whole prompt).
pub(crate) struct Feeder<'a> {
    decoder: &'a GpuDecoder,
    session: &'a mut GpuSession,
    tokens: &'a mut Vec<u32>,
    reused: usize,
    prefilled: bool,
    pub prefill: Duration,
    pub decode: Duration,
    /// The logits of every feed, when kept.
    pub logits: Option<Vec<Vec<f32>>>,
    /// The GPU error behind a failed feed (quench-cpu's trait speaks only its own errors).
    error: Option<GpuError>,
}

impl<'a> Feeder<'a> {
    pub fn new(
        decoder: &'a GpuDecoder,
        session: &'a mut GpuSession,
        tokens: &'a mut Vec<u32>,
        reused: usize,
        keep_logits: bool,
    ) -> Self {
        Feeder {
            decoder,
            session,
            tokens,
            reused,
            prefilled: false,
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
            logits: keep_logits.then(Vec::new),
            error: None,
        }
    }

    /// The generator's result, with a failed feed's GPU error in place of its stand-in.
    pub fn finish<T>(&mut self, result: quench_cpu::Result<T>) -> crate::Result<T> {
        match (result, self.error.take()) {
            (Ok(v), _) => Ok(v),
            (Err(_), Some(e)) => Err(e.into()),
            (Err(e), None) => Err(e.into()),
        }
    }
}

impl CausalLm for Feeder<'_> {
    fn position(&self) -> usize {
        self.session.len() - self.reused
    }

    fn context_limit(&self) -> usize {
        self.decoder.context_limit()
    }

    fn feed(&mut self, tokens: &[u32]) -> quench_cpu::Result<Vec<f32>> {
        let first = !self.prefilled;
        let fresh = if first {
            &tokens[self.reused.min(tokens.len())..]
        } else {
            tokens
        };
        let start = Instant::now();
        let logits = match self.decoder.feed(self.session, fresh) {
            Ok(l) => l,
            Err(e) => {
                // Positions whose steps completed stay in the session; keep the token
                // list in step with it.
                let held = self.session.len();
                self.tokens.truncate(held.min(self.tokens.len()));
                let done = held.saturating_sub(self.tokens.len());
                self.tokens
                    .extend_from_slice(&fresh[..done.min(fresh.len())]);
                self.error = Some(e);
                return Err(CpuError::BadLogits {
                    what: "no values: the GPU step failed",
                });
            }
        };
        let elapsed = start.elapsed();
        if first {
            self.prefill += elapsed;
        } else {
            self.decode += elapsed;
        }
        self.reused = 0;
        self.prefilled = true;
        self.tokens.extend_from_slice(fresh);
        if let Some(kept) = &mut self.logits {
            kept.push(logits.clone());
        }
        Ok(logits)
    }
}
