//! The CPU decoders (quench-cpu's f64 reference and f32) as a backend of the engine.
//!
//! Each sequence is computed on its own, one after another: a row's arithmetic does not
//! depend on the other rows, so an item's logits are the same whatever the feed holds.

use std::any::Any;

use quench_cpu::{Decoder, KvCache, Logits, Real};

use crate::backend::{own, Decode, Rows, Sequence};
use crate::error::Result;

impl<T: Real + Send + Sync + 'static> Sequence for KvCache<T> {
    fn len(&self) -> usize {
        KvCache::len(self)
    }

    fn limit(&self) -> usize {
        KvCache::limit(self)
    }

    fn truncate(&mut self, len: usize) {
        KvCache::truncate(self, len)
    }

    /// A copy: the CPU cache lives in one allocation per sequence.
    fn fork(&self) -> Box<dyn Sequence> {
        Box::new(self.clone())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

impl<T: Real + Send + Sync + 'static> Decode for Decoder<T> {
    fn context_limit(&self) -> usize {
        self.config().max_positions
    }

    fn new_sequence(&self, limit: usize) -> Box<dyn Sequence> {
        Box::new(self.new_cache_with_limit(limit))
    }

    fn max_batch(&self) -> usize {
        1
    }

    fn feed(&self, items: &mut [Rows<'_>]) -> Vec<Result<Vec<f32>>> {
        items
            .iter_mut()
            .map(|item| {
                let cache = own::<KvCache<T>>(item.sequence)?;
                let logits = self.forward(cache, item.tokens, Logits::Last)?;
                Ok(logits.row(0).iter().map(|v| v.to_f32()).collect())
            })
            .collect()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
