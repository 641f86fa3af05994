//! The GPU decoder as a backend of the engine: a feed of one sequence goes through
//! [`GpuDecoder::feed`] (the prompt path where the load asked for it), a feed of several
//! through [`GpuDecoder::feed_batch`] in groups of up to `max_batch` sequences, every step
//! a token of each sequence that has one left.

use std::any::Any;

use super::decoder::GpuDecoder;
use super::error::GpuError;
use super::kv::GpuSession;
use crate::backend::{own, Decode, Fed, Masks, Rows, Sequence};
use crate::error::{EngineError, Result};

impl Sequence for GpuSession {
    fn len(&self) -> usize {
        GpuSession::len(self)
    }

    fn limit(&self) -> usize {
        self.context_limit()
    }

    fn truncate(&mut self, len: usize) {
        GpuSession::truncate(self, len)
    }

    fn fork(&self) -> Box<dyn Sequence> {
        Box::new(GpuSession::fork(self))
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl Decode for GpuDecoder {
    fn context_limit(&self) -> usize {
        GpuDecoder::context_limit(self)
    }

    /// A session of the decoder's context, whatever `limit` says: the KV cache was sized
    /// for that context at load.
    fn new_sequence(&self, _limit: usize) -> Box<dyn Sequence> {
        Box::new(self.new_session())
    }

    fn max_batch(&self) -> usize {
        GpuDecoder::max_batch(self)
    }

    fn feed(&self, items: &mut [Rows<'_>]) -> Vec<Result<Vec<f32>>> {
        self.feed_picking(items, &[], &Vec::new)
            .into_iter()
            .map(|r| r.and_then(Fed::into_logits))
            .collect()
    }

    /// On the device: each picked item's mask applied and its token picked there, one
    /// index read back.
    fn feed_picking(
        &self,
        items: &mut [Rows<'_>],
        picks: &[bool],
        masks: Masks<'_>,
    ) -> Vec<Result<Fed>> {
        let picked = |i: usize| picks.get(i).copied().unwrap_or(false);
        if let [item] = items {
            let result = own::<GpuSession>(item.sequence).and_then(|session| {
                let fed = match picked(0) {
                    true => {
                        let mask = || masks().into_iter().next().flatten();
                        self.feed_greedy_masked(session, item.tokens, &mask)
                            .map(Fed::Token)
                    }
                    false => GpuDecoder::feed(self, session, item.tokens).map(Fed::Logits),
                };
                fed.map_err(EngineError::from)
            });
            return vec![result];
        }
        let size = GpuDecoder::max_batch(self).max(1);
        let mut out = Vec::with_capacity(items.len());
        for (g, group) in items.chunks_mut(size).enumerate() {
            let range = g * size..g * size + group.len();
            let group_picks: Vec<bool> = range.clone().map(picked).collect();
            let group_masks = || {
                let all = masks();
                range
                    .clone()
                    .map(|i| all.get(i).cloned().flatten())
                    .collect()
            };
            out.extend(feed_group(self, group, &group_picks, &group_masks));
        }
        out
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One [`GpuDecoder::feed_batch_picking`] over `group` (at most the decoder's batch). A
/// step that fails as a whole fails every sequence it was running.
fn feed_group(
    decoder: &GpuDecoder,
    group: &mut [Rows<'_>],
    picks: &[bool],
    masks: Masks<'_>,
) -> Vec<Result<Fed>> {
    let mut out: Vec<Option<Result<Fed>>> = Vec::with_capacity(group.len());
    let mut members = vec![];
    let mut rows = vec![];
    for (i, item) in group.iter_mut().enumerate() {
        match own::<GpuSession>(item.sequence) {
            Ok(session) => {
                rows.push((session, item.tokens));
                members.push(i);
                out.push(None);
            }
            Err(e) => out.push(Some(Err(e))),
        }
    }
    let member_picks: Vec<bool> = members.iter().map(|&i| picks[i]).collect();
    let member_masks = || {
        let all = masks();
        members
            .iter()
            .map(|&i| all.get(i).cloned().flatten())
            .collect()
    };
    match decoder.feed_batch_picking(&mut rows, &member_picks, &member_masks) {
        Ok(results) => {
            for (&i, r) in members.iter().zip(results) {
                out[i] = Some(r.map_err(EngineError::from));
            }
        }
        Err(e) => {
            let reason = e.to_string();
            for &i in &members {
                let failed = GpuError::BatchFailed {
                    reason: reason.clone(),
                };
                out[i] = Some(Err(failed.into()));
            }
        }
    }
    out.into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                let reason = "the batch returned no logits for this sequence".into();
                Err(GpuError::BatchFailed { reason }.into())
            })
        })
        .collect()
}
