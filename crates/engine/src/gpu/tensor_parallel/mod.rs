//! Tensor parallelism: one decoder across several devices, each **rank** holding a share
//! of every layer ([`shard`]): q|k|v and gate|up by output rows (whole heads, the KV
//! cache's heads with them), the output and down projections by input columns, the token
//! embedding and the LM head by vocabulary rows.
//!
//! Each rank runs the decode step of its share ([`GpuDecoder`] built as a rank: the step
//! of the narrower model, stopping where the ranks' rows meet). At each stop the ranks'
//! rows are combined and every rank goes on with the same residual stream:
//!
//! ```text
//! embed (own vocabulary rows)      → gather: each row from its token's rank
//! per layer:
//!   norm, q|k|v, RoPE/append, attention over the rank's heads, W_o share → sum
//!   norm, gate/up + SwiGLU share, W_down share                           → sum
//! norm, LM head (own vocabulary rows)  → the logits, concatenated in rank order
//! ```
//!
//! A sum adds the ranks' products to the residual in rank order, in f32, so results
//! repeat bit for bit. The ranks' rows meet on the host (each rank's executor reads and
//! writes its buffers): any executor takes part, the interpreter included, and a degree
//! of 1 runs the same code path on one device.

mod shard;

use std::any::Any;
use std::sync::Mutex;

use quench_models::arch::{ModelConfig, Naming};
use quench_rt::Executor;

use super::decoder::{GpuDecoder, GpuOptions, GpuSummary, RankBuffer};
use super::error::GpuError;
use super::graph::Reduction;
use super::kv::GpuSession;
use super::stored::StoredTensors;
use crate::backend::{own, Decode, Rows, Sequence};
use crate::error::{EngineError, Result};

pub(crate) use shard::check_degree;

/// A decoder split across ranks, each on its own executor.
pub struct TensorParallel {
    /// The whole model's config.
    config: ModelConfig,
    ranks: Vec<GpuDecoder>,
    reductions: Vec<Reduction>,
    /// One step at a time across all ranks.
    stepping: Mutex<()>,
}

impl std::fmt::Debug for TensorParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorParallel")
            .field("arch", &self.config.arch)
            .field("ranks", &self.ranks.len())
            .finish_non_exhaustive()
    }
}

/// One sequence's KV state: its share on each rank.
#[derive(Debug)]
pub struct TpSession {
    ranks: Vec<GpuSession>,
}

impl TensorParallel {
    /// Splits the decoder `config` describes across one rank per executor: checks that its
    /// heads, kv heads, FFN width and vocabulary divide by the degree, cuts each rank's
    /// share from `src` and puts it on its executor (`available`: the bytes it offers).
    pub fn new(
        config: ModelConfig,
        src: &dyn StoredTensors,
        naming: Naming,
        executors: Vec<(Box<dyn Executor + Send>, Option<u64>)>,
        options: &GpuOptions,
    ) -> Result<TensorParallel, GpuError> {
        config.validate()?;
        let n = executors.len();
        check_degree(&config, n)?;
        let share = shard::share_config(&config, n);
        // The prompt path is not split: prompts take the rank's decode step a token at a
        // time, launched dispatch by dispatch between the stops.
        let rank_options = GpuOptions {
            capture: false,
            prefill_chunk: 0,
            max_batch: 1,
            ..options.clone()
        };
        let mut ranks = Vec::with_capacity(n);
        for (r, (exec, available)) in executors.into_iter().enumerate() {
            let cut = shard::Shard::new(src, &config, naming, r, n)?;
            let rank = true;
            let decoder = GpuDecoder::build(
                share.clone(),
                &cut,
                naming,
                exec,
                available,
                &rank_options,
                rank,
            )
            .map_err(|e| GpuError::Unsupported {
                what: format!("tensor-parallel rank {r} of {n}"),
                reason: e.to_string(),
            })?;
            ranks.push(decoder);
        }
        let reductions = ranks[0].reductions();
        Ok(TensorParallel {
            config,
            ranks,
            reductions,
            stepping: Mutex::new(()),
        })
    }

    /// The number of ranks.
    pub fn degree(&self) -> usize {
        self.ranks.len()
    }

    /// Rank `r`'s decoder: its share's kernels, weights and KV cache.
    pub fn rank(&self, r: usize) -> Option<&GpuDecoder> {
        self.ranks.get(r)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// What was put on the devices: rank 0's summary (its dispatches, kernels and plans;
    /// every rank's are alike) with the byte counts of all ranks together.
    pub fn summary(&self) -> GpuSummary {
        let mut total = self.ranks[0].summary().clone();
        for rank in &self.ranks[1..] {
            let s = rank.summary();
            total.weight_bytes += s.weight_bytes;
            total.weight_bytes_per_token += s.weight_bytes_per_token;
            total.arena_bytes += s.arena_bytes;
            total.activation_bytes += s.activation_bytes;
            total.kv_cache_bytes += s.kv_cache_bytes;
        }
        total.max_batch = 1;
        total
    }

    /// Most positions one session holds.
    pub fn context_limit(&self) -> usize {
        self.ranks[0].context_limit()
    }

    /// An empty session.
    pub fn new_session(&self) -> TpSession {
        TpSession {
            ranks: self.ranks.iter().map(GpuDecoder::new_session).collect(),
        }
    }

    /// Feeds `tokens` after the positions `session` holds, one step each, and returns the
    /// logits of the last. On error the session keeps the positions whose steps completed.
    pub fn feed(&self, session: &mut TpSession, tokens: &[u32]) -> Result<Vec<f32>, GpuError> {
        let (last, before) = tokens.split_last().ok_or(GpuError::NoTokens)?;
        let limit = self.context_limit();
        if session.len() + tokens.len() > limit {
            return Err(GpuError::ContextFull {
                limit,
                used: session.len(),
                added: tokens.len(),
            });
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.config.vocab) {
            return Err(GpuError::Token {
                token,
                vocab: self.config.vocab,
            });
        }
        for &token in before {
            self.step(session, token, false)?;
        }
        self.step(session, *last, true)?
            .ok_or_else(|| GpuError::Internal("a step read back no logits".into()))
    }

    /// One step of `session` taking `token`; the logits where `logits` asks for them.
    fn step(
        &self,
        session: &mut TpSession,
        token: u32,
        logits: bool,
    ) -> Result<Option<Vec<f32>>, GpuError> {
        if session.ranks.len() != self.ranks.len() {
            return Err(GpuError::ForeignSession);
        }
        let _one = self.stepping.lock().unwrap_or_else(|e| e.into_inner());
        let share = (self.config.vocab / self.ranks.len()) as u32;
        for (r, (rank, s)) in self.ranks.iter().zip(&mut session.ranks).enumerate() {
            rank.rank_begin(&mut [(s, token)], r as u32 * share)?;
        }
        for k in 0..=self.reductions.len() {
            for rank in &self.ranks {
                rank.rank_segment(k, 1)?;
            }
            if let Some(&reduction) = self.reductions.get(k) {
                self.combine(reduction, &[token])?;
            }
        }
        let out = match logits {
            true => {
                let mut all = Vec::with_capacity(self.config.vocab);
                for rank in &self.ranks {
                    all.extend(rank.rank_logits(1)?.concat());
                }
                Some(all)
            }
            false => None,
        };
        for s in &mut session.ranks {
            s.advance();
        }
        Ok(out)
    }

    /// Combines the ranks' rows of a step whose rows take `tokens`, as `reduction` says,
    /// and gives every rank the residual stream that results.
    fn combine(&self, reduction: Reduction, tokens: &[u32]) -> Result<(), GpuError> {
        let rows = tokens.len();
        let hidden = self.config.hidden;
        let residual = match reduction {
            Reduction::Gather => {
                let share = self.config.vocab / self.ranks.len();
                let mut residual = vec![0f32; rows * hidden];
                for (i, &token) in tokens.iter().enumerate() {
                    let owner = &self.ranks[token as usize / share];
                    let theirs = owner.rank_read(RankBuffer::Residual, i + 1)?;
                    let row = i * hidden..(i + 1) * hidden;
                    residual[row.clone()].copy_from_slice(&theirs[row]);
                }
                residual
            }
            Reduction::Sum => {
                let mut residual = self.ranks[0].rank_read(RankBuffer::Residual, rows)?;
                for rank in &self.ranks {
                    let partial = rank.rank_read(RankBuffer::Partial, rows)?;
                    for (r, p) in residual.iter_mut().zip(partial) {
                        *r += p;
                    }
                }
                residual
            }
        };
        for rank in &self.ranks {
            rank.rank_write(RankBuffer::Residual, &residual)?;
        }
        Ok(())
    }
}

impl TpSession {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.ranks.first().map_or(0, GpuSession::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Sequence for TpSession {
    fn len(&self) -> usize {
        TpSession::len(self)
    }

    fn limit(&self) -> usize {
        self.ranks.first().map_or(0, GpuSession::context_limit)
    }

    fn truncate(&mut self, len: usize) {
        for s in &mut self.ranks {
            s.truncate(len);
        }
    }

    fn fork(&self) -> Box<dyn Sequence> {
        Box::new(TpSession {
            ranks: self.ranks.iter().map(GpuSession::fork).collect(),
        })
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Decode for TensorParallel {
    fn context_limit(&self) -> usize {
        TensorParallel::context_limit(self)
    }

    fn new_sequence(&self, _limit: usize) -> Box<dyn Sequence> {
        Box::new(self.new_session())
    }

    fn max_batch(&self) -> usize {
        1
    }

    /// Each item in turn, a step per token.
    fn feed(&self, items: &mut [Rows<'_>]) -> Vec<Result<Vec<f32>>> {
        items
            .iter_mut()
            .map(|item| {
                let session = own::<TpSession>(item.sequence)?;
                TensorParallel::feed(self, session, item.tokens).map_err(EngineError::from)
            })
            .collect()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
