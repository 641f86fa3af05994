//! KV memory counted in fixed-size blocks of positions.

/// Positions per KV block.
pub const BLOCK_TOKENS: usize = 16;

/// Blocks needed to hold `positions` positions.
pub fn blocks_for(positions: usize) -> usize {
    positions.div_ceil(BLOCK_TOKENS)
}

/// The server's KV budget: how many blocks exist and how many are handed out.
#[derive(Debug)]
pub struct BlockPool {
    total: usize,
    used: usize,
}

impl BlockPool {
    pub fn new(total: usize) -> Self {
        BlockPool { total, used: 0 }
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn used(&self) -> usize {
        self.used
    }

    pub fn free(&self) -> usize {
        self.total - self.used
    }

    /// Takes `count` blocks if that many are free.
    pub fn try_take(&mut self, count: usize) -> bool {
        if count > self.free() {
            return false;
        }
        self.used += count;
        true
    }

    pub fn give_back(&mut self, count: usize) {
        debug_assert!(count <= self.used, "giving back blocks that were not taken");
        self.used -= count.min(self.used);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_up_to_whole_blocks() {
        assert_eq!(blocks_for(0), 0);
        assert_eq!(blocks_for(1), 1);
        assert_eq!(blocks_for(16), 1);
        assert_eq!(blocks_for(17), 2);
    }

    #[test]
    fn pool_refuses_more_than_it_has() {
        let mut pool = BlockPool::new(5);
        assert!(pool.try_take(3));
        assert!(!pool.try_take(3));
        assert!(pool.try_take(2));
        assert_eq!(pool.free(), 0);
        pool.give_back(4);
        assert_eq!((pool.used(), pool.free()), (1, 4));
    }
}
