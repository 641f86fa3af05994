//! Byte-pair encoding with ranked merges (GPT-2 style).
//!
//! A pre-token starts as one symbol per character; then, repeatedly, the adjacent pair
//! whose merge has the lowest rank (the earliest in the merges list) is joined, the
//! leftmost first when the same rank appears twice, until no adjacent pair has a merge.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::error::{Result, TextError};
use crate::vocab::Vocab;

#[derive(Debug, Clone, Copy)]
struct Merge {
    rank: u32,
    result: u32,
}

#[derive(Debug, Clone)]
pub(crate) struct Bpe {
    merges: HashMap<(u32, u32), Merge>,
    /// Look a whole pre-token up before merging (Llama 3's `ignore_merges`).
    ignore_merges: bool,
    unk: Option<u32>,
    fuse_unk: bool,
}

/// One symbol of the word being merged, in a doubly linked list over a vector.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    alive: bool,
}

impl Bpe {
    /// `merges` in rank order, each the pair of token texts it joins.
    pub(crate) fn new(
        vocab: &Vocab,
        merges: impl IntoIterator<Item = (String, String)>,
        ignore_merges: bool,
        unk: Option<u32>,
        fuse_unk: bool,
    ) -> Result<Self> {
        let mut table = HashMap::new();
        for (rank, (left, right)) in merges.into_iter().enumerate() {
            let bad = |reason| TextError::BadMerge {
                index: rank,
                merge: format!("{left} {right}"),
                reason,
            };
            let l = vocab
                .id(&left)
                .ok_or_else(|| bad("left part is not in the vocabulary"))?;
            let r = vocab
                .id(&right)
                .ok_or_else(|| bad("right part is not in the vocabulary"))?;
            let result = vocab
                .id(&format!("{left}{right}"))
                .ok_or_else(|| bad("merged token is not in the vocabulary"))?;
            let rank = u32::try_from(rank).map_err(|_| bad("more than 2^32 merges"))?;
            table.entry((l, r)).or_insert(Merge { rank, result });
        }
        Ok(Bpe {
            merges: table,
            ignore_merges,
            unk,
            fuse_unk,
        })
    }

    /// Appends the ids of one pre-token (already in the vocabulary's alphabet).
    pub(crate) fn encode_word(&self, vocab: &Vocab, word: &str, out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(id) = vocab.id(word) {
                out.push(id);
                return;
            }
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        let mut buf = [0u8; 4];
        let mut last_was_unk = false;
        for c in word.chars() {
            let id = match vocab.id(c.encode_utf8(&mut buf)) {
                Some(id) => {
                    last_was_unk = false;
                    id
                }
                None => match self.unk {
                    Some(_) if self.fuse_unk && last_was_unk => continue,
                    Some(unk) => {
                        last_was_unk = true;
                        unk
                    }
                    None => continue,
                },
            };
            let i = symbols.len();
            symbols.push(Symbol {
                id,
                prev: i.checked_sub(1),
                next: None,
                alive: true,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }

        // Candidate merges: (rank, left position), smallest first; stale ones are skipped.
        let mut heap = BinaryHeap::new();
        let candidate =
            |symbols: &[Symbol], left: usize| -> Option<Reverse<(u32, usize, u32, u32)>> {
                let right = symbols[left].next?;
                let (l, r) = (symbols[left].id, symbols[right].id);
                self.merges
                    .get(&(l, r))
                    .map(|m| Reverse((m.rank, left, l, r)))
            };
        for i in 0..symbols.len() {
            heap.extend(candidate(&symbols, i));
        }
        while let Some(Reverse((_, left, l, r))) = heap.pop() {
            let Some(right) = symbols[left].next else {
                continue;
            };
            if !symbols[left].alive || symbols[left].id != l || symbols[right].id != r {
                continue;
            }
            let Some(merge) = self.merges.get(&(l, r)) else {
                continue;
            };
            symbols[left].id = merge.result;
            symbols[right].alive = false;
            let after = symbols[right].next;
            symbols[left].next = after;
            if let Some(a) = after {
                symbols[a].prev = Some(left);
            }
            if let Some(p) = symbols[left].prev {
                heap.extend(candidate(&symbols, p));
            }
            heap.extend(candidate(&symbols, left));
        }
        out.extend(symbols.iter().filter(|s| s.alive).map(|s| s.id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> (Vocab, Bpe) {
        let tokens = ["a", "b", "c", "ab", "bc", "abc", "aa"]
            .map(String::from)
            .to_vec();
        let vocab = Vocab::new(tokens).unwrap();
        let merges = [("a", "b"), ("ab", "c"), ("b", "c"), ("a", "a")]
            .map(|(l, r)| (l.to_string(), r.to_string()));
        let bpe = Bpe::new(&vocab, merges, false, None, false).unwrap();
        (vocab, bpe)
    }

    fn encode(vocab: &Vocab, bpe: &Bpe, word: &str) -> Vec<u32> {
        let mut out = Vec::new();
        bpe.encode_word(vocab, word, &mut out);
        out
    }

    #[test]
    fn lowest_rank_first() {
        let (vocab, bpe) = toy();
        // "ab" (rank 0) beats "bc" (rank 2), then "ab"+"c" (rank 1).
        assert_eq!(encode(&vocab, &bpe, "abc"), [5]);
        // "bc" alone when no "a" precedes.
        assert_eq!(encode(&vocab, &bpe, "bca"), [4, 0]);
    }

    #[test]
    fn equal_ranks_merge_leftmost_first() {
        let (vocab, bpe) = toy();
        assert_eq!(encode(&vocab, &bpe, "aaa"), [6, 0]);
    }

    #[test]
    fn unknown_chars_are_dropped_without_unk() {
        let (vocab, bpe) = toy();
        assert_eq!(encode(&vocab, &bpe, "axb"), [3]);
    }

    #[test]
    fn merge_outside_vocab_is_refused() {
        let vocab = Vocab::new(vec!["a".into(), "b".into()]).unwrap();
        let err = Bpe::new(
            &vocab,
            [("a".to_string(), "b".to_string())],
            false,
            None,
            false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("merged token"), "{err}");
    }
}
