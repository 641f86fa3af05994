//! The paged KV cache on the host side: a pool of 16-position blocks shared by all
//! sessions of a model, and each session's block table.
//!
//! A session takes a block when its length crosses a multiple of 16 and gives blocks back
//! when it is truncated or dropped, so sessions of different lengths share the cache
//! without reserving a whole context each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use quench_kernels::attention::BLOCK_TOKENS;

use super::error::GpuError;

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// The physical blocks not held by any session.
#[derive(Debug)]
pub(crate) struct BlockPool {
    free: Vec<u32>,
    total: usize,
}

impl BlockPool {
    pub fn new(blocks: u32) -> Arc<Mutex<BlockPool>> {
        // Handed out lowest first: a lone session's blocks are consecutive.
        Arc::new(Mutex::new(BlockPool {
            free: (0..blocks).rev().collect(),
            total: blocks as usize,
        }))
    }
}

/// Locks the pool; a panic elsewhere cannot leave the list of free blocks inconsistent
/// (every change is one push or pop), so a poisoned lock is still usable.
fn lock(pool: &Mutex<BlockPool>) -> MutexGuard<'_, BlockPool> {
    pool.lock().unwrap_or_else(|e| e.into_inner())
}

/// The KV cache of one conversation on the GPU: the positions it holds and the blocks
/// they live in. Made by [`super::GpuDecoder::new_session`]; dropping it frees its blocks.
#[derive(Debug)]
pub struct GpuSession {
    pub(crate) id: u64,
    pub(crate) model: u64,
    pub(crate) blocks: Vec<u32>,
    /// Changes whenever `blocks` does, so the device copy of the table can be checked.
    pub(crate) version: u64,
    len: usize,
    limit: usize,
    pool: Arc<Mutex<BlockPool>>,
}

impl GpuSession {
    pub(crate) fn new(model: u64, limit: usize, pool: Arc<Mutex<BlockPool>>) -> GpuSession {
        GpuSession {
            id: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            model,
            blocks: vec![],
            version: 0,
            len: 0,
            limit,
            pool,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions this session holds (its model's context limit).
    pub fn context_limit(&self) -> usize {
        self.limit
    }

    /// Forgets every position from `len` on, giving back the blocks no longer needed.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        self.len = len;
        let keep = len.div_ceil(BLOCK_TOKENS as usize);
        if keep < self.blocks.len() {
            let mut pool = lock(&self.pool);
            pool.free.extend(self.blocks.drain(keep..).rev());
            self.version += 1;
        }
    }

    /// Makes room for position `len` (taking a block at a block boundary) and returns it.
    pub(crate) fn reserve_next(&mut self) -> Result<usize, GpuError> {
        let pos = self.len;
        if pos / BLOCK_TOKENS as usize == self.blocks.len() {
            let mut pool = lock(&self.pool);
            let total = pool.total;
            let block = pool
                .free
                .pop()
                .ok_or(GpuError::CacheFull { blocks: total })?;
            self.blocks.push(block);
            self.version += 1;
        }
        Ok(pos)
    }

    /// Records that position `len` now holds keys and values.
    pub(crate) fn advance(&mut self) {
        self.len += 1;
    }
}

impl Drop for GpuSession {
    fn drop(&mut self) {
        let mut pool = lock(&self.pool);
        pool.free.append(&mut self.blocks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_take_blocks_at_boundaries_and_give_them_back() {
        let pool = BlockPool::new(3);
        let mut a = GpuSession::new(1, 100, pool.clone());
        for _ in 0..17 {
            a.reserve_next().unwrap();
            a.advance();
        }
        assert_eq!(a.blocks, [0, 1]);
        let mut b = GpuSession::new(1, 100, pool.clone());
        b.reserve_next().unwrap();
        b.advance();
        assert_eq!(b.blocks, [2]);
        // All three blocks are taken: b's 17th position needs a fourth.
        for _ in 1..16 {
            b.reserve_next().unwrap();
            b.advance();
        }
        assert!(matches!(
            b.reserve_next(),
            Err(GpuError::CacheFull { blocks: 3 })
        ));
        let v = a.version;
        a.truncate(16);
        assert_eq!((a.len(), a.blocks.len()), (16, 1));
        assert_ne!(a.version, v, "a changed table must be rewritten");
        b.reserve_next().unwrap();
        assert_eq!(b.blocks, [2, 1]);
        drop(b);
        assert_eq!(lock(&pool).free.len(), 2);
    }
}
