//! The automatic prefix cache: the KV caches of finished prompts, kept so that a later
//! request whose prompt starts the same way computes only the rest.
//!
//! An entry holds a session cut to whole blocks of [`BLOCK_TOKENS`] prompt positions. It is
//! found through the hash of each block-long prefix of its tokens (a chain: the hash of
//! block `k` covers blocks `0..=k`), so a lookup walks the new prompt's blocks and stops at
//! the first prefix no entry holds; the tokens are then compared, so a hash collision
//! costs a shorter reuse, never a wrong one. A hit forks the entry's session: on the GPU
//! the fork shares the entry's blocks instead of copying them.
//!
//! Only prompt positions are kept. Their keys and values come from the prompt path, which
//! gives each position the same bits however the prompt is cut into chunks (two tokens or
//! more each: the scheduler never feeds a prompt's token alone but its only one), so a
//! request that starts from an entry gets the same bits as it would computing its prompt
//! itself. Generated positions come from decode steps, whose rounding differs.
//!
//! Memory is counted in blocks, as the scheduler's budget counts it. An entry made from a
//! request that started from another entry shares that entry's first blocks and counts
//! only its own; it keeps its parent alive (a parent is never evicted before its
//! children). A running request that started from an entry counts only the blocks it
//! added, and keeps the entry alive until it ends. Entries nobody uses are evicted least
//! recently used first when the budget needs room.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use quench_engine::Session;

use super::blocks::BLOCK_TOKENS;

/// A request's (or an entry's) claim on an entry: the entry stays while it is held, and
/// its first `shared` blocks are counted by the entry, not by the holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Pin {
    pub entry: u64,
    pub shared: usize,
}

struct Entry {
    cache: Session,
    /// Whole blocks of prompt tokens, as many as `cache` holds.
    tokens: Vec<u32>,
    /// The chain hash of each block-long prefix of `tokens`.
    chain: Vec<u64>,
    /// The entry whose first blocks this one shares.
    parent: Option<Pin>,
    /// Requests and entries holding a pin on this one.
    users: usize,
    last_used: u64,
}

impl Entry {
    /// Blocks counted for this entry: those it does not share with its parent.
    fn own_blocks(&self) -> usize {
        self.chain.len() - self.parent.map_or(0, |p| p.shared)
    }
}

/// What [`PrefixCache::lookup`] found: a fork of an entry's session holding the first
/// `pin.shared` blocks of the prompt, and the pin that keeps that entry alive.
pub(super) struct Hit {
    pub cache: Session,
    pub pin: Pin,
}

#[derive(Default)]
pub(super) struct PrefixCache {
    entries: HashMap<u64, Entry>,
    /// Chain hash → the entries whose tokens start with that prefix.
    index: HashMap<u64, Vec<u64>>,
    next_id: u64,
    /// Blocks counted by all entries.
    blocks: usize,
}

/// The chain hash of each whole block of `tokens`.
fn chain(tokens: &[u32]) -> Vec<u64> {
    let mut hasher = DefaultHasher::new();
    tokens
        .chunks_exact(BLOCK_TOKENS)
        .map(|block| {
            block.hash(&mut hasher);
            hasher.finish()
        })
        .collect()
}

impl PrefixCache {
    /// Blocks the entries count.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The longest prefix of `prompt`'s first `usable` positions that an entry holds, in
    /// whole blocks: a fork of that entry's session cut to it, and a pin on the entry.
    pub fn lookup(&mut self, prompt: &[u32], usable: usize, order: u64) -> Option<Hit> {
        let usable = usable.min(prompt.len());
        let want = chain(&prompt[..usable]);
        let mut deepest = want
            .iter()
            .take_while(|h| self.index.contains_key(h))
            .count();
        while deepest > 0 {
            let len = deepest * BLOCK_TOKENS;
            let found = self.index[&want[deepest - 1]]
                .iter()
                .copied()
                .find(|id| self.entries[id].tokens[..len] == prompt[..len]);
            if let Some(id) = found {
                let entry = self.entries.get_mut(&id).expect("indexed entries exist");
                let mut cache = entry.cache.fork();
                cache.truncate(len);
                if cache.tokens().len() != len {
                    return None;
                }
                entry.users += 1;
                entry.last_used = order;
                let pin = Pin {
                    entry: id,
                    shared: deepest,
                };
                return Some(Hit { cache, pin });
            }
            // A hash collision: try a shorter prefix.
            deepest -= 1;
        }
        None
    }

    /// Lets go of a pin; returns the blocks freed by entries this makes redundant (an entry
    /// nobody uses whose tokens another entry holds too).
    #[must_use]
    pub fn release(&mut self, pin: Pin) -> usize {
        let Some(entry) = self.entries.get_mut(&pin.entry) else {
            return 0;
        };
        entry.users = entry.users.saturating_sub(1);
        if entry.users == 0 && self.covered(pin.entry) {
            return self.remove(pin.entry);
        }
        0
    }

    /// Whether entry `id`'s tokens are a proper prefix of another entry's.
    fn covered(&self, id: u64) -> bool {
        let entry = &self.entries[&id];
        let Some(last) = entry.chain.last() else {
            return false;
        };
        self.index[last].iter().any(|other| {
            let o = &self.entries[other];
            *other != id
                && o.tokens.len() > entry.tokens.len()
                && o.tokens.starts_with(&entry.tokens)
        })
    }

    /// Blocks a new entry of `tokens` would count, made from a request holding `pin` (if
    /// any); 0 where no entry is needed (no whole block, or an entry holds them already).
    pub fn blocks_to_add(&self, tokens: &[u32], pin: Option<Pin>) -> usize {
        let whole = tokens.len() / BLOCK_TOKENS;
        if whole == 0 || self.holds(tokens) {
            return 0;
        }
        whole - pin.map_or(0, |p| p.shared.min(whole))
    }

    /// Whether an entry holds all of `tokens` (whole blocks).
    fn holds(&self, tokens: &[u32]) -> bool {
        let want = chain(tokens);
        let Some(last) = want.last() else {
            return true;
        };
        self.index.get(last).is_some_and(|ids| {
            ids.iter()
                .any(|id| self.entries[id].tokens.starts_with(tokens))
        })
    }

    /// Keeps `cache`, which holds `tokens` (whole blocks) and was forked from the entry
    /// `pin` names, if any: the new entry holds that pin from now on, as its parent. The
    /// caller has counted [`PrefixCache::blocks_to_add`] blocks for it. Returns the blocks
    /// freed by entries the new one makes redundant (shorter ones nobody uses).
    #[must_use]
    pub fn insert(
        &mut self,
        cache: Session,
        tokens: Vec<u32>,
        pin: Option<Pin>,
        order: u64,
    ) -> usize {
        let chain = chain(&tokens);
        let parent = pin.map(|p| Pin {
            entry: p.entry,
            shared: p.shared.min(chain.len()),
        });
        let id = self.next_id;
        self.next_id += 1;
        for h in &chain {
            self.index.entry(*h).or_default().push(id);
        }
        let entry = Entry {
            cache,
            tokens,
            chain,
            parent,
            users: 0,
            last_used: order,
        };
        self.blocks += entry.own_blocks();
        self.entries.insert(id, entry);
        // Every entry sharing a prefix with the new one is indexed under its first block.
        let covered: Vec<u64> = self.entries[&id]
            .chain
            .first()
            .map_or(&[][..], |h| &self.index[h][..])
            .iter()
            .copied()
            .filter(|&other| other != id && self.entries[&other].users == 0 && self.covered(other))
            .collect();
        covered.into_iter().map(|other| self.remove(other)).sum()
    }

    /// The last use of the least recently used entry that nobody uses.
    pub fn oldest(&self) -> Option<u64> {
        self.entries
            .values()
            .filter(|e| e.users == 0)
            .map(|e| e.last_used)
            .min()
    }

    /// Drops the least recently used entry that nobody uses; the blocks freed (0 if none).
    pub fn evict(&mut self) -> usize {
        let Some((&id, _)) = self
            .entries
            .iter()
            .filter(|(_, e)| e.users == 0)
            .min_by_key(|(_, e)| e.last_used)
        else {
            return 0;
        };
        self.remove(id)
    }

    /// Removes entry `id` (which nobody uses) and returns the blocks freed, its parent's
    /// included where it was the parent's last user and the parent is covered.
    fn remove(&mut self, id: u64) -> usize {
        let Some(entry) = self.entries.remove(&id) else {
            return 0;
        };
        for h in &entry.chain {
            if let Some(ids) = self.index.get_mut(h) {
                ids.retain(|&other| other != id);
                if ids.is_empty() {
                    self.index.remove(h);
                }
            }
        }
        let own = entry.own_blocks();
        self.blocks -= own;
        drop(entry.cache);
        own + entry.parent.map_or(0, |p| self.release(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quench_engine::synth::tiny_chat_model;

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32)
            .map(|i| 32 + (i * 7 + seed * 13) % 90)
            .collect()
    }

    #[test]
    fn entries_share_prefixes_count_blocks_once_and_evict_children_first() {
        let model = tiny_chat_model(3).unwrap();
        let mut cache = PrefixCache::default();
        let a = tokens(40, 1);
        let mut session = fed(&model, &a);
        session.truncate(32);
        assert!(cache.lookup(&a, 38, 1).is_none(), "empty");
        assert_eq!(cache.blocks_to_add(&a[..32], None), 2);
        assert_eq!(cache.insert(session, a[..32].to_vec(), None, 1), 0);
        assert_eq!(cache.blocks(), 2);
        assert_eq!(cache.blocks_to_add(&a[..16], None), 0, "held already");

        // A prompt sharing the first block and a half: one block reused.
        let mut b = a[..24].to_vec();
        b.extend(tokens(30, 2));
        let hit = cache.lookup(&b, b.len() - 2, 2).expect("a hit");
        assert_eq!((hit.pin.shared, hit.cache.tokens().len()), (1, 16));
        assert_eq!(hit.cache.tokens(), &b[..16]);
        assert_eq!(cache.evict(), 0, "the entry is in use");
        // Its request feeds the rest and ends; its prompt's 3 whole blocks become an entry
        // sharing one with the first.
        let mut fork = hit.cache;
        model.feed_batch(&mut [quench_engine::BatchItem {
            session: &mut fork,
            tokens: &b,
        }]);
        fork.truncate(48);
        assert_eq!(cache.blocks_to_add(&b[..48], Some(hit.pin)), 2);
        assert_eq!(cache.insert(fork, b[..48].to_vec(), Some(hit.pin), 3), 0);
        assert_eq!((cache.len(), cache.blocks()), (2, 4));

        // The same prefix again finds the longer entry.
        let hit = cache.lookup(&b, b.len() - 2, 4).expect("a hit");
        assert_eq!(hit.pin.shared, 3);
        assert_eq!(cache.release(hit.pin), 0);
        // The first entry is the second's parent: the second goes first, then the first.
        assert_eq!(cache.evict(), 2);
        assert_eq!(cache.evict(), 2);
        assert_eq!((cache.len(), cache.blocks(), cache.evict()), (0, 0, 0));
        assert!(cache.index.is_empty());
    }

    /// A session of the tiny model holding `tokens`.
    fn fed(model: &quench_engine::CausalModel, tokens: &[u32]) -> Session {
        let mut session = model.new_session();
        model.feed_batch(&mut [quench_engine::BatchItem {
            session: &mut session,
            tokens,
        }]);
        session
    }

    #[test]
    fn a_child_entry_keeps_its_parent_and_a_covered_entry_goes_when_unused() {
        let model = tiny_chat_model(3).unwrap();
        let mut cache = PrefixCache::default();
        let a = tokens(70, 5);
        let mut short = fed(&model, &a[..20]);
        short.truncate(16);
        assert_eq!(cache.insert(short, a[..16].to_vec(), None, 1), 0);
        let hit = cache.lookup(&a, 68, 2).expect("a hit");
        let mut fork = hit.cache;
        model.feed_batch(&mut [quench_engine::BatchItem {
            session: &mut fork,
            tokens: &a,
        }]);
        fork.truncate(64);
        // The new entry holds the request's pin on the short one, its parent: both stay,
        // the short one's block counted once.
        assert_eq!(cache.insert(fork, a[..64].to_vec(), Some(hit.pin), 3), 0);
        assert_eq!((cache.len(), cache.blocks()), (2, 4));

        // Computed apart, a longer entry covers a shorter one: the shorter goes once nobody
        // uses it.
        let mut cache = PrefixCache::default();
        let b = tokens(50, 6);
        let mut short = fed(&model, &b[..16]);
        short.truncate(16);
        assert_eq!(cache.insert(short, b[..16].to_vec(), None, 1), 0);
        let held = cache.lookup(&b[..18], 16, 2).expect("a hit").pin;
        let mut long = fed(&model, &b);
        long.truncate(48);
        assert_eq!(cache.insert(long, b[..48].to_vec(), None, 3), 0, "in use");
        assert_eq!((cache.len(), cache.blocks()), (2, 4));
        assert_eq!(cache.release(held), 1);
        assert_eq!((cache.len(), cache.blocks()), (1, 3));
        assert_eq!(cache.blocks_to_add(&b[..32], None), 0, "held already");
        let mut other = b[..16].to_vec();
        other.extend(tokens(16, 7));
        let session = fed(&model, &other);
        assert_eq!(cache.blocks_to_add(&other, None), 2);
        assert_eq!(cache.insert(session, other, None, 4), 0);
        assert_eq!((cache.len(), cache.blocks()), (2, 5));
    }

    #[test]
    fn a_hash_collision_is_caught_by_comparing_tokens() {
        let model = tiny_chat_model(3).unwrap();
        let mut cache = PrefixCache::default();
        let a = tokens(32, 1);
        assert_eq!(cache.insert(fed(&model, &a), a.clone(), None, 1), 0);
        // Pretend another prompt's first block hashes as `a`'s does.
        let b = tokens(40, 9);
        let h = chain(&b)[0];
        let ids = cache.index[&chain(&a)[0]].clone();
        cache.index.insert(h, ids);
        assert!(cache.lookup(&b, 38, 2).is_none());
    }
}
