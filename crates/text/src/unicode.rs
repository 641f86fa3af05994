//! Character classes used by BERT-style normalization and pre-tokenization.
//!
//! The general categories come from `unicode_categories`, the tables Hugging Face
//! `tokenizers` uses, so that both agree on every character.

use unicode_categories::UnicodeCategories;

/// Whitespace for BERT: tab, newline and carriage return plus Unicode `White_Space`.
pub(crate) fn is_bert_whitespace(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || c.is_whitespace()
}

/// Control characters BERT deletes: the "Other" categories, except tab/newline/CR.
pub(crate) fn is_bert_control(c: char) -> bool {
    !matches!(c, '\t' | '\n' | '\r') && c.is_other()
}

/// Punctuation for BERT: all ASCII symbols (`$`, `+`, `^`, ... included) and Unicode `P*`.
pub(crate) fn is_bert_punctuation(c: char) -> bool {
    c.is_ascii_punctuation() || c.is_punctuation()
}

pub(crate) fn is_nonspacing_mark(c: char) -> bool {
    c.is_mark_nonspacing()
}

/// The CJK Unified Ideograph blocks BERT surrounds with spaces.
pub(crate) fn is_cjk_ideograph(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert!(is_bert_punctuation('$') && is_bert_punctuation('、') && !is_bert_punctuation('a'));
        assert!(is_bert_control('\u{200d}') && !is_bert_control('\n'));
        assert!(is_bert_whitespace('\u{3000}'));
        assert!(is_cjk_ideograph('你') && !is_cjk_ideograph('の'));
        assert!(is_nonspacing_mark('\u{301}'));
    }
}
