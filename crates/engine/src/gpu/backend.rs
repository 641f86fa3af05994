//! The GPU decoder as a backend of the engine: a feed of one sequence goes through
//! [`GpuDecoder::feed`] (the prompt path where the load asked for it), a feed of several
//! through [`GpuDecoder::feed_batch`] in groups of up to `max_batch` sequences, every step
//! a token of each sequence that has one left.

use std::any::Any;

use super::decoder::GpuDecoder;
use super::error::GpuError;
use super::kv::GpuSession;
use crate::backend::{own, Decode, Rows, Sequence};
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
        if let [item] = items {
            let result = own::<GpuSession>(item.sequence).and_then(|session| {
                GpuDecoder::feed(self, session, item.tokens).map_err(EngineError::from)
            });
            return vec![result];
        }
        let mut out = Vec::with_capacity(items.len());
        for group in items.chunks_mut(GpuDecoder::max_batch(self).max(1)) {
            out.extend(feed_group(self, group));
        }
        out
    }

    /// On the device: the mask applied and the token picked there, one index read back.
    fn feed_greedy(
        &self,
        sequence: &mut dyn Sequence,
        tokens: &[u32],
        mask: &dyn Fn() -> Option<Vec<u32>>,
    ) -> Result<u32> {
        let session = own::<GpuSession>(sequence)?;
        GpuDecoder::feed_greedy_masked(self, session, tokens, mask).map_err(EngineError::from)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// One [`GpuDecoder::feed_batch`] over `group` (at most the decoder's batch). A step that
/// fails as a whole fails every sequence it was running.
fn feed_group(decoder: &GpuDecoder, group: &mut [Rows<'_>]) -> Vec<Result<Vec<f32>>> {
    let mut out: Vec<Option<Result<Vec<f32>>>> = Vec::with_capacity(group.len());
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
    match decoder.feed_batch(&mut rows) {
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
