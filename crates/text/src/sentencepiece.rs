//! SentencePiece-style BPE over a scored vocabulary (`tokenizer.ggml.model == "llama"`).
//!
//! The normalized text (spaces already '▁') starts as one symbol per character. Repeatedly
//! the adjacent pair whose concatenation is a vocabulary piece with the highest score is
//! joined, the leftmost first among equal scores. A final symbol that is not a piece is
//! spelled with byte tokens `<0xNN>`, or the unknown token when those are missing.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

#[derive(Debug, Clone)]
pub(crate) struct SentencePiece {
    scores: Vec<f32>,
    /// The token for each byte value, when the vocabulary has `<0xNN>` pieces.
    byte_tokens: Vec<Option<u32>>,
    unk: Option<u32>,
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate join: higher score first, then the leftmost.
#[derive(Debug, PartialEq)]
struct Bigram {
    score: f32,
    left: usize,
    len: usize,
}

impl Eq for Bigram {}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The text of the byte token for `b`, as SentencePiece writes it.
pub(crate) fn byte_token_text(b: u8) -> String {
    format!("<0x{b:02X}>")
}

/// The byte a `<0xNN>` token stands for.
pub(crate) fn parse_byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl SentencePiece {
    pub(crate) fn new(vocab: &Vocab, scores: Vec<f32>, unk: Option<u32>) -> Self {
        let byte_tokens = (0..=255u8).map(|b| vocab.id(&byte_token_text(b))).collect();
        SentencePiece {
            scores,
            byte_tokens,
            unk,
        }
    }

    fn score(&self, id: u32) -> f32 {
        self.scores
            .get(id as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY)
    }

    pub(crate) fn encode(&self, vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::new();
        for (start, c) in text.char_indices() {
            let i = symbols.len();
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }

        let mut heap = BinaryHeap::new();
        let bigram = |symbols: &[Symbol], left: usize| -> Option<Bigram> {
            let right = symbols[left].next?;
            let len = symbols[left].len + symbols[right].len;
            let id = vocab.id(&text[symbols[left].start..symbols[left].start + len])?;
            Some(Bigram {
                score: self.score(id),
                left,
                len,
            })
        };
        for i in 0..symbols.len() {
            heap.extend(bigram(&symbols, i));
        }
        while let Some(Bigram { left, len, .. }) = heap.pop() {
            let Some(right) = symbols[left].next else {
                continue;
            };
            // Stale when either side has changed since the candidate was made.
            if symbols[left].len == 0 || symbols[left].len + symbols[right].len != len {
                continue;
            }
            symbols[left].len = len;
            symbols[right].len = 0;
            let after = symbols[right].next;
            symbols[left].next = after;
            if let Some(a) = after {
                symbols[a].prev = Some(left);
            }
            if let Some(p) = symbols[left].prev {
                heap.extend(bigram(&symbols, p));
            }
            heap.extend(bigram(&symbols, left));
        }

        let mut last_was_unk = false;
        for s in symbols.iter().filter(|s| s.len > 0) {
            let piece = &text[s.start..s.start + s.len];
            if let Some(id) = vocab.id(piece) {
                out.push(id);
                last_was_unk = false;
                continue;
            }
            let bytes: Option<Vec<u32>> = piece
                .bytes()
                .map(|b| self.byte_tokens[b as usize])
                .collect();
            match (bytes, self.unk) {
                (Some(ids), _) => {
                    out.extend(ids);
                    last_was_unk = false;
                }
                (None, Some(unk)) if !last_was_unk => {
                    out.push(unk);
                    last_was_unk = true;
                }
                (None, _) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn highest_score_joins_first() {
        let tokens = ["▁", "a", "b", "c", "ab", "bc", "▁a"]
            .map(String::from)
            .to_vec();
        let scores = vec![0.0, 0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let vocab = Vocab::new(tokens).unwrap();
        let sp = SentencePiece::new(&vocab, scores, None);
        let mut out = Vec::new();
        sp.encode(&vocab, "▁abc", &mut out);
        // "bc" (-1) beats "ab" (-2) and "▁a" (-3).
        assert_eq!(out, [6, 5]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "a".into()];
        tokens.extend((0..=255u8).map(byte_token_text));
        let vocab = Vocab::new(tokens).unwrap();
        let sp = SentencePiece::new(&vocab, vec![0.0; vocab.len()], Some(0));
        let mut out = Vec::new();
        sp.encode(&vocab, "aé", &mut out);
        assert_eq!(out, [1, 2 + 0xC3, 2 + 0xA9]);
    }

    #[test]
    fn byte_token_text_round_trips() {
        assert_eq!(parse_byte_token(&byte_token_text(0x0A)), Some(0x0A));
        assert_eq!(parse_byte_token("<0x1>"), None);
    }
}
