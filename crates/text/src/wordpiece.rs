//! WordPiece (BERT): greedy longest-match-first over each pre-token.
//!
//! From the start of a word the longest prefix in the vocabulary is taken, then the longest
//! continuation written with the `##` prefix, and so on. A word with a part that matches
//! nothing, or longer than `max_chars` characters, becomes the unknown token as a whole.

use crate::vocab::Vocab;

#[derive(Debug, Clone)]
pub(crate) struct WordPiece {
    unk: u32,
    prefix: String,
    max_chars: usize,
}

impl WordPiece {
    pub(crate) fn new(unk: u32, prefix: String, max_chars: usize) -> Self {
        WordPiece {
            unk,
            prefix,
            max_chars,
        }
    }

    pub(crate) fn encode_word(&self, vocab: &Vocab, word: &str, out: &mut Vec<u32>) {
        if word.chars().count() > self.max_chars {
            out.push(self.unk);
            return;
        }
        let mut pieces = Vec::new();
        let mut start = 0;
        let mut candidate = String::new();
        while start < word.len() {
            let mut end = word.len();
            let found = loop {
                candidate.clear();
                if start > 0 {
                    candidate.push_str(&self.prefix);
                }
                candidate.push_str(&word[start..end]);
                if let Some(id) = vocab.id(&candidate) {
                    break Some(id);
                }
                match word[start..end].char_indices().next_back() {
                    Some((last, _)) if last > 0 => end = start + last,
                    _ => break None,
                }
            };
            match found {
                Some(id) => pieces.push(id),
                None => {
                    out.push(self.unk);
                    return;
                }
            }
            start = end;
        }
        out.extend(pieces);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> (Vocab, WordPiece) {
        let tokens = ["[UNK]", "un", "##aff", "##able", "##a", "aff"]
            .map(String::from)
            .to_vec();
        (
            Vocab::new(tokens).unwrap(),
            WordPiece::new(0, "##".into(), 10),
        )
    }

    fn encode(word: &str) -> Vec<u32> {
        let (vocab, wp) = toy();
        let mut out = Vec::new();
        wp.encode_word(&vocab, word, &mut out);
        out
    }

    #[test]
    fn longest_match_first_with_continuations() {
        assert_eq!(encode("unaffable"), [1, 2, 3]);
        assert_eq!(encode("affa"), [5, 4]);
    }

    #[test]
    fn unmatched_part_or_long_word_is_unknown() {
        assert_eq!(encode("unx"), [0]);
        assert_eq!(encode("unaffableaffable"), [0]);
    }
}
