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
//! The prompt path's chunks ([`super::prefill`]) are split the same way and stop at the
//! same places, over the chunk's rows. A sum adds the ranks' products to the residual in
//! rank order, in f32, so results repeat bit for bit (and one rank gives the whole
//! decoder's bits). The ranks' rows meet on the host (each rank's executor reads and
//! writes its buffers): any executor takes part, the interpreter included, and a degree
//! of 1 runs the same code path on one device. Each rank replays its step's segments
//! between the stops, each captured the first time it runs (per row count); a prompt
//! chunk's dispatches are launched.

mod shard;

use std::any::Any;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use quench_models::arch::{ModelConfig, Naming};
use quench_rt::Executor;

use super::decoder::{check_room, GpuDecoder, GpuOptions, GpuSummary, RankBuffer, Stage};
use super::error::GpuError;
use super::graph::Reduction;
use super::kv::GpuSession;
use super::stored::StoredTensors;
use crate::backend::{own, Decode, Rows, Sequence};
use crate::error::{EngineError, Result};

pub(crate) use shard::{check_degree, share_config};

/// A decoder split across ranks, each on its own executor.
pub struct TensorParallel {
    /// The whole model's config.
    config: ModelConfig,
    ranks: Vec<GpuDecoder>,
    reductions: Vec<Reduction>,
    /// One step at a time across all ranks.
    stepping: Mutex<()>,
    stats: Mutex<Combining>,
    /// Feeds of at least this many tokens take the prompt path, where the ranks have it.
    prefill_min_tokens: usize,
}

/// Steps and chunks run, and the host time spent combining the ranks' rows in them.
#[derive(Debug, Default)]
struct Combining {
    steps: u64,
    combining: Duration,
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
        let mut ranks = Vec::with_capacity(n);
        for (r, (exec, available)) in executors.into_iter().enumerate() {
            let cut = shard::Shard::new(src, &config, naming, r, n)?;
            let rank = true;
            let decoder =
                GpuDecoder::build(share.clone(), &cut, naming, exec, available, options, rank)
                    .map_err(in_rank(r, n))?;
            ranks.push(decoder);
        }
        let reductions = ranks[0].reductions();
        let chunk = ranks[0].chunk_reductions();
        if ranks[0].rank_chunk() > 0 && chunk != reductions {
            return Err(GpuError::Internal(
                "a rank's prompt chunk stops elsewhere than its step".into(),
            ));
        }
        let prefill_min_tokens = options.prefill_min_tokens.max(2);
        Ok(TensorParallel {
            config,
            ranks,
            reductions,
            stepping: Mutex::new(()),
            stats: Mutex::default(),
            prefill_min_tokens,
        })
    }

    /// The number of ranks.
    pub fn degree(&self) -> usize {
        self.ranks.len()
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

    /// Feeds `tokens` after the positions `session` holds (through the prompt path's
    /// chunks from [`GpuOptions::prefill_min_tokens`] tokens on, where the ranks have it;
    /// else a step each) and returns the logits of the last. On error the session keeps
    /// the positions whose steps or chunks completed.
    pub fn feed(&self, session: &mut TpSession, tokens: &[u32]) -> Result<Vec<f32>, GpuError> {
        let mut fed = self.feed_batch(&mut [(session, tokens)])?;
        fed.pop()
            .unwrap_or_else(|| Err(GpuError::Internal("a feed gave back nothing".into())))
    }

    /// Feeds each row's tokens after the positions its session holds — a row long enough
    /// for the prompt path alone, in chunks, the others up to [`TensorParallel::max_batch`]
    /// rows a step (a token of each row that has one left) — and returns each row's
    /// logits of its last token. A row that cannot run (no tokens,
    /// another model's session, a full context, a token outside the vocabulary) fails
    /// alone; a failed step fails the rows it held, which keep the positions whose steps
    /// completed.
    pub fn feed_batch(
        &self,
        rows: &mut [(&mut TpSession, &[u32])],
    ) -> Result<Vec<Result<Vec<f32>, GpuError>>, GpuError> {
        if rows.len() > self.max_batch() {
            return Err(GpuError::BatchTooLarge {
                rows: rows.len(),
                max: self.max_batch(),
            });
        }
        let mut out: Vec<Result<Vec<f32>, GpuError>> = rows
            .iter()
            .map(|(s, tokens)| self.check_feed(s, tokens).map(|_| vec![]))
            .collect();
        let chunk = self.ranks[0].rank_chunk();
        let prompted: Vec<bool> = rows
            .iter()
            .map(|(_, t)| chunk > 0 && t.len() >= self.prefill_min_tokens)
            .collect();
        for (i, (session, tokens)) in rows.iter_mut().enumerate() {
            if prompted[i] && out[i].is_ok() {
                out[i] = self.prompt(session, tokens, chunk);
            }
        }
        let longest = rows.iter().map(|(_, t)| t.len()).max().unwrap_or(0);
        for j in 0..longest {
            let live: Vec<usize> = (0..rows.len())
                .filter(|&i| !prompted[i] && out[i].is_ok() && j < rows[i].1.len())
                .collect();
            if live.is_empty() {
                continue;
            }
            let wanted: Vec<bool> = live.iter().map(|&i| j + 1 == rows[i].1.len()).collect();
            let mut step_rows: Vec<(&mut TpSession, u32)> = vec![];
            for (i, (session, tokens)) in rows.iter_mut().enumerate() {
                if live.contains(&i) {
                    step_rows.push((&mut **session, tokens[j]));
                }
            }
            match self.step(&mut step_rows, &wanted) {
                Ok(logits) => {
                    for (&i, l) in live.iter().zip(logits) {
                        if let Some(l) = l {
                            out[i] = Ok(l);
                        }
                    }
                }
                Err(e) if live.len() == 1 => out[live[0]] = Err(e),
                Err(e) => {
                    let reason = e.to_string();
                    for &i in &live {
                        out[i] = Err(GpuError::BatchFailed {
                            reason: reason.clone(),
                        });
                    }
                }
            }
        }
        Ok(out)
    }

    /// Most sequences one step decodes.
    pub fn max_batch(&self) -> usize {
        self.ranks[0].max_batch()
    }

    /// Refuses a feed that cannot run.
    fn check_feed(&self, session: &TpSession, tokens: &[u32]) -> Result<(), GpuError> {
        if tokens.is_empty() {
            return Err(GpuError::NoTokens);
        }
        let ours = self
            .ranks
            .iter()
            .zip(&session.ranks)
            .all(|(r, s)| r.owns(s));
        if session.ranks.len() != self.ranks.len() || !ours {
            return Err(GpuError::ForeignSession);
        }
        check_room(
            tokens,
            session.len(),
            self.context_limit(),
            self.config.vocab,
        )
    }

    /// Feeds `tokens` after the positions `session` holds through the prompt path, chunks
    /// of up to `chunk` tokens, and returns the logits of the last. On error the session
    /// keeps the chunks that completed.
    fn prompt(
        &self,
        session: &mut TpSession,
        tokens: &[u32],
        chunk: usize,
    ) -> Result<Vec<f32>, GpuError> {
        let _one = self.stepping.lock().unwrap_or_else(|e| e.into_inner());
        let share = (self.config.vocab / self.ranks.len()) as u32;
        for piece in tokens.chunks(chunk) {
            let before = session.len();
            let ran = (|| {
                let mut start = 0;
                for (r, (rank, s)) in self.ranks.iter().zip(&mut session.ranks).enumerate() {
                    start = rank
                        .rank_chunk_begin(s, piece, r as u32 * share)
                        .map_err(|e| self.in_rank(r, e))?;
                }
                self.run_segments(Stage::Chunk, piece, |rank, k| {
                    rank.rank_chunk_segment(k, piece.len(), start)
                })
            })();
            if let Err(e) = ran {
                for s in &mut session.ranks {
                    s.truncate(before);
                }
                return Err(e);
            }
        }
        let mut logits = Vec::with_capacity(self.config.vocab);
        for (r, rank) in self.ranks.iter().enumerate() {
            let share = rank.rank_logits(1).map_err(|e| self.in_rank(r, e))?;
            logits.extend(share.concat());
        }
        Ok(logits)
    }

    /// Runs every segment of a step or chunk whose rows take `tokens` on every rank
    /// (`segment(rank, k)` launches one), combining the ranks' rows after each but the
    /// last.
    fn run_segments(
        &self,
        stage: Stage,
        tokens: &[u32],
        segment: impl Fn(&GpuDecoder, usize) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let mut combining = Duration::ZERO;
        // The residual stream the ranks were last given: a rank leaves it as it is between
        // stops (its products go to the partial buffer), so it need not be read back.
        let mut residual = None;
        for k in 0..=self.reductions.len() {
            for (r, rank) in self.ranks.iter().enumerate() {
                segment(rank, k).map_err(|e| self.in_rank(r, e))?;
            }
            if let Some(&reduction) = self.reductions.get(k) {
                let start = Instant::now();
                residual = Some(self.combine(stage, reduction, tokens, residual.take())?);
                combining += start.elapsed();
            }
        }
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        stats.steps += 1;
        stats.combining += combining;
        Ok(())
    }

    /// One step of `rows` (each a session and the token it takes); the logits of the rows
    /// `wanted` marks. No session advances unless the whole step completes.
    fn step(
        &self,
        rows: &mut [(&mut TpSession, u32)],
        wanted: &[bool],
    ) -> Result<Vec<Option<Vec<f32>>>, GpuError> {
        let n = rows.len();
        let _one = self.stepping.lock().unwrap_or_else(|e| e.into_inner());
        let share = (self.config.vocab / self.ranks.len()) as u32;
        let tokens: Vec<u32> = rows.iter().map(|&(_, t)| t).collect();
        for (r, rank) in self.ranks.iter().enumerate() {
            let mut own: Vec<(&mut GpuSession, u32)> = rows
                .iter_mut()
                .map(|(s, t)| (&mut s.ranks[r], *t))
                .collect();
            rank.rank_begin(&mut own, r as u32 * share)
                .map_err(|e| self.in_rank(r, e))?;
        }
        self.run_segments(Stage::Step, &tokens, |rank, k| rank.rank_segment(k, n))?;
        let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
        if wanted.contains(&true) {
            let mut shares = Vec::with_capacity(self.ranks.len());
            for (r, rank) in self.ranks.iter().enumerate() {
                shares.push(rank.rank_logits(n).map_err(|e| self.in_rank(r, e))?);
            }
            for (i, row) in out.iter_mut().enumerate() {
                if wanted.get(i).copied().unwrap_or(false) {
                    *row = Some(shares.iter().flat_map(|s| s[i].iter().copied()).collect());
                }
            }
        }
        for (session, _) in rows.iter_mut() {
            for s in &mut session.ranks {
                s.advance();
            }
        }
        Ok(out)
    }

    /// `e` as rank `r`'s error.
    fn in_rank(&self, r: usize, e: GpuError) -> GpuError {
        in_rank(r, self.ranks.len())(e)
    }

    /// Steps and prompt chunks run so far, and the host time spent combining the ranks'
    /// rows in them.
    pub fn combining(&self) -> (u64, Duration) {
        let stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        (stats.steps, stats.combining)
    }

    /// Combines the ranks' rows of a step whose rows take `tokens`, as `reduction` says,
    /// gives every rank the residual stream that results and returns it. `given` is the
    /// residual the ranks were last given in this step, if any (read from rank 0 if not).
    fn combine(
        &self,
        stage: Stage,
        reduction: Reduction,
        tokens: &[u32],
        given: Option<Vec<f32>>,
    ) -> Result<Vec<f32>, GpuError> {
        let rows = tokens.len();
        let hidden = self.config.hidden;
        let residual = match reduction {
            Reduction::Gather => {
                // Only the ranks holding a row's token are read.
                let share = self.config.vocab / self.ranks.len();
                let mut read: Vec<Option<Vec<f32>>> = vec![None; self.ranks.len()];
                let mut residual = vec![0f32; rows * hidden];
                for (i, &token) in tokens.iter().enumerate() {
                    let r = token as usize / share;
                    let theirs = match &mut read[r] {
                        Some(theirs) => theirs,
                        slot => slot.insert(self.ranks[r].rank_read(
                            stage,
                            RankBuffer::Residual,
                            rows,
                        )?),
                    };
                    let row = i * hidden..(i + 1) * hidden;
                    residual[row.clone()].copy_from_slice(&theirs[row]);
                }
                residual
            }
            Reduction::Sum => {
                let mut residual = match given {
                    Some(residual) => residual,
                    None => self.ranks[0].rank_read(stage, RankBuffer::Residual, rows)?,
                };
                for rank in &self.ranks {
                    let partial = rank.rank_read(stage, RankBuffer::Partial, rows)?;
                    for (r, p) in residual.iter_mut().zip(partial) {
                        *r += p;
                    }
                }
                residual
            }
        };
        for rank in &self.ranks {
            rank.rank_write(stage, RankBuffer::Residual, &residual)?;
        }
        Ok(residual)
    }
}

/// An error of rank `rank` of `ranks`.
fn in_rank(rank: usize, ranks: usize) -> impl FnOnce(GpuError) -> GpuError {
    move |e| GpuError::Rank {
        rank,
        ranks,
        source: Box::new(e),
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
        TensorParallel::max_batch(self)
    }

    /// In groups of up to [`TensorParallel::max_batch`] items, a step per token.
    fn feed(&self, items: &mut [Rows<'_>]) -> Vec<Result<Vec<f32>>> {
        let mut out = Vec::with_capacity(items.len());
        for group in items.chunks_mut(self.max_batch().max(1)) {
            let mut results: Vec<Option<Result<Vec<f32>>>> = vec![];
            let mut rows = vec![];
            for item in group.iter_mut() {
                match own::<TpSession>(item.sequence) {
                    Ok(session) => {
                        rows.push((session, item.tokens));
                        results.push(None);
                    }
                    Err(e) => results.push(Some(Err(e))),
                }
            }
            let mut fed = match self.feed_batch(&mut rows) {
                Ok(fed) => fed.into_iter(),
                Err(e) => {
                    let reason = e.to_string();
                    let failed = (0..rows.len()).map(|_| {
                        Err(GpuError::BatchFailed {
                            reason: reason.clone(),
                        })
                    });
                    failed.collect::<Vec<_>>().into_iter()
                }
            };
            for r in results {
                out.push(match r {
                    Some(failed) => failed,
                    None => fed
                        .next()
                        .unwrap_or_else(|| Err(GpuError::Internal("a row went unfed".into())))
                        .map_err(EngineError::from),
                });
            }
        }
        out
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
