//! Normalization: the text rewrites applied to each segment before pre-tokenization.

use unicode_normalization::UnicodeNormalization;

use crate::unicode::{is_bert_control, is_bert_whitespace, is_cjk_ideograph, is_nonspacing_mark};

/// SentencePiece's visible space.
pub(crate) const METASPACE: char = '\u{2581}';

#[derive(Debug, Clone)]
pub(crate) enum Normalizer {
    /// BERT: delete controls and map whitespace to ' ', pad CJK ideographs with spaces,
    /// strip accents (NFD minus nonspacing marks), lowercase; each step optional.
    Bert {
        clean_text: bool,
        handle_chinese_chars: bool,
        strip_accents: bool,
        lowercase: bool,
    },
    Lowercase,
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
    /// SentencePiece: spaces become '▁', and a non-empty segment gets one in front.
    Metaspace {
        prepend: bool,
    },
    Sequence(Vec<Normalizer>),
}

impl Normalizer {
    pub(crate) fn normalize(&self, text: &str) -> String {
        match self {
            Normalizer::Bert {
                clean_text,
                handle_chinese_chars,
                strip_accents,
                lowercase,
            } => {
                let mut s = text.to_string();
                if *clean_text {
                    s = s
                        .chars()
                        .filter(|&c| {
                            c != '\0' && c != char::REPLACEMENT_CHARACTER && !is_bert_control(c)
                        })
                        .map(|c| if is_bert_whitespace(c) { ' ' } else { c })
                        .collect();
                }
                if *handle_chinese_chars {
                    let mut padded = String::with_capacity(s.len());
                    for c in s.chars() {
                        if is_cjk_ideograph(c) {
                            padded.push(' ');
                            padded.push(c);
                            padded.push(' ');
                        } else {
                            padded.push(c);
                        }
                    }
                    s = padded;
                }
                if *strip_accents {
                    s = s.nfd().filter(|&c| !is_nonspacing_mark(c)).collect();
                }
                if *lowercase {
                    s = s.chars().flat_map(char::to_lowercase).collect();
                }
                s
            }
            Normalizer::Lowercase => text.chars().flat_map(char::to_lowercase).collect(),
            Normalizer::Nfc => text.nfc().collect(),
            Normalizer::Nfd => text.nfd().collect(),
            Normalizer::Nfkc => text.nfkc().collect(),
            Normalizer::Nfkd => text.nfkd().collect(),
            Normalizer::Metaspace { prepend } => {
                let mut s = String::with_capacity(text.len() + 3);
                if *prepend && !text.is_empty() {
                    s.push(METASPACE);
                }
                s.extend(text.chars().map(|c| if c == ' ' { METASPACE } else { c }));
                s
            }
            Normalizer::Sequence(parts) => {
                parts.iter().fold(text.to_string(), |s, n| n.normalize(&s))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bert() -> Normalizer {
        Normalizer::Bert {
            clean_text: true,
            handle_chinese_chars: true,
            strip_accents: true,
            lowercase: true,
        }
    }

    #[test]
    fn bert_uncased() {
        assert_eq!(
            bert().normalize("Café\tNAÏVE\u{1}你好"),
            "cafe naive 你  好 "
        );
    }

    #[test]
    fn metaspace_only_prepends_to_nonempty_text() {
        let n = Normalizer::Metaspace { prepend: true };
        assert_eq!(n.normalize("a b"), "▁a▁b");
        assert_eq!(n.normalize(""), "");
    }
}
