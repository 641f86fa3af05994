//! The paged KV cache on the host side: a pool of 16-position blocks shared by all
//! sessions of a model, and each session's block table.
//!
//! A session takes a block when its length crosses a multiple of 16 and gives blocks back
//! when it is truncated or dropped, so sessions of different lengths share the cache
//! without reserving a whole context each. A session forked from another
//! ([`GpuSession::fork`]) holds the other's whole blocks too: a block returns to the pool
//! when its last holder lets go of it. Nobody writes into a block that another session
//! holds: a fork takes only whole blocks, and positions are written only past a session's
//! length, which never ends inside a shared block ([`GpuSession::truncate`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use quench_kernels::attention::BLOCK_TOKENS;

use super::error::GpuError;

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// The physical blocks: those not held by any session, and how many sessions hold each.
#[derive(Debug)]
pub(crate) struct BlockPool {
    free: Vec<u32>,
    holders: Vec<u32>,
    total: usize,
}

impl BlockPool {
    pub fn new(blocks: u32) -> Arc<Mutex<BlockPool>> {
        // Handed out lowest first: a lone session's blocks are consecutive.
        Arc::new(Mutex::new(BlockPool {
            free: (0..blocks).rev().collect(),
            holders: vec![0; blocks as usize],
            total: blocks as usize,
        }))
    }

    /// A free block, now held by one session.
    fn take(&mut self) -> Option<u32> {
        let block = self.free.pop()?;
        self.holders[block as usize] = 1;
        Some(block)
    }

    /// One holder lets go of each of `blocks`, last first; a block nobody holds is free.
    fn release(&mut self, blocks: &[u32]) {
        for &block in blocks.iter().rev() {
            let holders = &mut self.holders[block as usize];
            *holders = holders.saturating_sub(1);
            if *holders == 0 {
                self.free.push(block);
            }
        }
    }

    fn shared(&self, block: u32) -> bool {
        self.holders[block as usize] > 1
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

    /// Forgets every position from `len` on, giving back the blocks no longer needed. Where
    /// `len` ends inside a block that another session holds too, the positions of that
    /// block are forgotten as well (the next one written would land in the other session's
    /// keys): [`GpuSession::len`] tells what is held.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let block = BLOCK_TOKENS as usize;
        let mut pool = lock(&self.pool);
        let mut keep = len.div_ceil(block);
        let mut len = len;
        if !len.is_multiple_of(block) && pool.shared(self.blocks[keep - 1]) {
            keep -= 1;
            len = keep * block;
        }
        self.len = len;
        if keep < self.blocks.len() {
            pool.release(&self.blocks[keep..]);
            self.blocks.truncate(keep);
            self.version += 1;
        }
    }

    /// A new session holding this one's whole blocks, shared: the positions up to the last
    /// multiple of 16 this session holds, without copying their keys and values. The rest,
    /// if any, is for the new session to compute again.
    pub fn fork(&self) -> GpuSession {
        let whole = self.len / BLOCK_TOKENS as usize;
        let blocks = self.blocks[..whole].to_vec();
        let mut pool = lock(&self.pool);
        for &b in &blocks {
            pool.holders[b as usize] += 1;
        }
        drop(pool);
        GpuSession {
            id: NEXT_SESSION.fetch_add(1, Ordering::Relaxed),
            model: self.model,
            blocks,
            version: 0,
            len: whole * BLOCK_TOKENS as usize,
            limit: self.limit,
            pool: self.pool.clone(),
        }
    }

    /// Makes room for position `len` (taking a block at a block boundary) and returns it.
    pub(crate) fn reserve_next(&mut self) -> Result<usize, GpuError> {
        let pos = self.len;
        if pos / BLOCK_TOKENS as usize == self.blocks.len() {
            let mut pool = lock(&self.pool);
            let total = pool.total;
            let block = pool.take().ok_or(GpuError::CacheFull { blocks: total })?;
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
        lock(&self.pool).release(&self.blocks);
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

    #[test]
    fn a_shared_block_is_free_once_its_last_holder_lets_go() {
        let pool = BlockPool::new(4);
        let mut a = GpuSession::new(1, 100, pool.clone());
        for _ in 0..20 {
            a.reserve_next().unwrap();
            a.advance();
        }
        let b = a.fork();
        assert_eq!((b.len(), b.blocks.as_slice()), (16, &[0][..]));
        assert_eq!(lock(&pool).holders[..2], [2, 1]);
        drop(a);
        assert_eq!(lock(&pool).free.len(), 3, "block 0 is still b's");
        drop(b);
        assert_eq!(lock(&pool).free.len(), 4);
    }
}
