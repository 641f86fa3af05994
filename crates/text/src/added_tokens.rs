//! Added (special) tokens: found in the text before anything else touches it.
//!
//! Matching is leftmost-longest over all added tokens. A token may also take the
//! whitespace on its left (`lstrip`) or right (`rstrip`), or match only as a whole word
//! (`single_word`: no word character right before or after it).

use aho_corasick::{AhoCorasick, MatchKind};

use crate::error::{Result, TextError};

#[derive(Debug, Clone)]
pub(crate) struct AddedToken {
    pub(crate) content: String,
    pub(crate) id: u32,
    pub(crate) lstrip: bool,
    pub(crate) rstrip: bool,
    pub(crate) single_word: bool,
}

impl AddedToken {
    pub(crate) fn plain(content: String, id: u32) -> Self {
        AddedToken {
            content,
            id,
            lstrip: false,
            rstrip: false,
            single_word: false,
        }
    }
}

/// A part of the text: plain text still to encode, or an added token's id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment<'a> {
    Text(&'a str),
    Token(u32),
}

#[derive(Debug, Clone)]
pub(crate) struct AddedTokens {
    matcher: Option<AhoCorasick>,
    tokens: Vec<AddedToken>,
}

/// `\w` of Unicode regexes (what HF checks): alphabetic, marks, decimal numbers,
/// connector punctuation and the joiners.
fn is_word_char(c: char) -> bool {
    use std::sync::OnceLock;
    static WORD: OnceLock<Option<regex::Regex>> = OnceLock::new();
    let word = WORD.get_or_init(|| regex::Regex::new(r"^\w$").ok());
    let mut buf = [0u8; 4];
    word.as_ref()
        .is_some_and(|w| w.is_match(c.encode_utf8(&mut buf)))
}

impl AddedTokens {
    pub(crate) fn new(tokens: Vec<AddedToken>) -> Result<Self> {
        let tokens: Vec<AddedToken> = tokens
            .into_iter()
            .filter(|t| !t.content.is_empty())
            .collect();
        let matcher = if tokens.is_empty() {
            None
        } else {
            let ac = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(tokens.iter().map(|t| t.content.as_str()))
                .map_err(|e| TextError::bad_field("added_tokens", e.to_string()))?;
            Some(ac)
        };
        Ok(AddedTokens { matcher, tokens })
    }

    /// Cuts `text` into plain text and added tokens, in order; empty text parts are left out.
    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<Segment<'a>> {
        let Some(matcher) = &self.matcher else {
            return if text.is_empty() {
                vec![]
            } else {
                vec![Segment::Text(text)]
            };
        };
        let mut out = Vec::new();
        let mut done = 0;
        for m in matcher.find_iter(text) {
            let token = &self.tokens[m.pattern().as_usize()];
            let (mut start, mut end) = (m.start(), m.end());
            if start < done {
                continue;
            }
            if token.single_word {
                let word_before = text[..start].chars().next_back().is_some_and(is_word_char);
                let word_after = text[end..].chars().next().is_some_and(is_word_char);
                if word_before || word_after {
                    continue;
                }
            }
            if token.lstrip {
                let trimmed = text[done..start].trim_end_matches(char::is_whitespace);
                start = done + trimmed.len();
            }
            if token.rstrip {
                end = text.len() - text[end..].trim_start_matches(char::is_whitespace).len();
            }
            if start > done {
                out.push(Segment::Text(&text[done..start]));
            }
            out.push(Segment::Token(token.id));
            done = end;
        }
        if done < text.len() {
            out.push(Segment::Text(&text[done..]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(tokens: Vec<AddedToken>) -> AddedTokens {
        AddedTokens::new(tokens).unwrap()
    }

    #[test]
    fn longest_token_wins() {
        let a = added(vec![
            AddedToken::plain("<|im".into(), 1),
            AddedToken::plain("<|im_start|>".into(), 2),
        ]);
        assert_eq!(
            a.split("x<|im_start|>y"),
            [Segment::Text("x"), Segment::Token(2), Segment::Text("y")]
        );
    }

    #[test]
    fn strips_and_single_word() {
        let mask = AddedToken {
            lstrip: true,
            rstrip: true,
            ..AddedToken::plain("<mask>".into(), 7)
        };
        let word = AddedToken {
            single_word: true,
            ..AddedToken::plain("ok".into(), 8)
        };
        let a = added(vec![mask, word]);
        assert_eq!(
            a.split("a  <mask> b"),
            [Segment::Text("a"), Segment::Token(7), Segment::Text("b")]
        );
        assert_eq!(
            a.split("book ok"),
            [Segment::Text("book "), Segment::Token(8)]
        );
    }
}
