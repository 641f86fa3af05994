//! Turning token texts back into a string, as each tokenizer family's HF decoder does.

use crate::byte_level::chars_to_bytes;
use crate::normalize::METASPACE;
use crate::sentencepiece::parse_byte_token;

#[derive(Debug, Clone)]
pub(crate) enum Decoder {
    /// Each token's characters back to bytes (a token outside the byte alphabet, such as a
    /// special token with a space, stands for its own UTF-8), then lossy UTF-8.
    ByteLevel,
    /// '▁' back to ' ', runs of `<0xNN>` tokens to the bytes they spell (each token of an
    /// invalid run becomes U+FFFD), and one leading space dropped when the encoder adds it.
    SentencePiece { strip_leading_space: bool },
    /// Tokens joined by spaces except `##` continuations, with BERT's punctuation cleanup.
    WordPiece { prefix: String, cleanup: bool },
}

impl Decoder {
    pub(crate) fn decode(&self, tokens: &[&str]) -> String {
        match self {
            Decoder::ByteLevel => {
                let mut bytes = Vec::new();
                for t in tokens {
                    match chars_to_bytes(t) {
                        Some(b) => bytes.extend(b),
                        None => bytes.extend_from_slice(t.as_bytes()),
                    }
                }
                String::from_utf8_lossy(&bytes).into_owned()
            }
            Decoder::SentencePiece {
                strip_leading_space,
            } => {
                let mut out = String::new();
                let mut run: Vec<u8> = Vec::new();
                for t in tokens {
                    if let Some(b) = parse_byte_token(t) {
                        run.push(b);
                        continue;
                    }
                    flush_byte_run(&mut run, &mut out);
                    out.extend(t.chars().map(|c| if c == METASPACE { ' ' } else { c }));
                }
                flush_byte_run(&mut run, &mut out);
                match out.strip_prefix(' ') {
                    Some(rest) if *strip_leading_space => rest.to_string(),
                    _ => out,
                }
            }
            Decoder::WordPiece { prefix, cleanup } => {
                let mut out = String::new();
                for (i, t) in tokens.iter().enumerate() {
                    let piece = match t.strip_prefix(prefix.as_str()) {
                        _ if i == 0 => t.to_string(),
                        Some(rest) => rest.to_string(),
                        None => format!(" {t}"),
                    };
                    if *cleanup {
                        out.push_str(&wordpiece_cleanup(&piece));
                    } else {
                        out.push_str(&piece);
                    }
                }
                out
            }
        }
    }
}

/// A run of byte tokens: its text when it is valid UTF-8, else one U+FFFD per byte.
fn flush_byte_run(run: &mut Vec<u8>, out: &mut String) {
    if run.is_empty() {
        return;
    }
    match std::str::from_utf8(run) {
        Ok(s) => out.push_str(s),
        Err(_) => out.extend(std::iter::repeat_n(char::REPLACEMENT_CHARACTER, run.len())),
    }
    run.clear();
}

/// BERT's detokenization cleanup, applied to each token with its leading space.
fn wordpiece_cleanup(piece: &str) -> String {
    const RULES: [(&str, &str); 11] = [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" do not", " don't"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ];
    RULES
        .iter()
        .fold(piece.to_string(), |s, (from, to)| s.replace(from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_rejoins_split_characters() {
        // "é" is C3 A9, spelled "Ã" "©" in the byte alphabet.
        assert_eq!(Decoder::ByteLevel.decode(&["Ġcaf", "Ã", "©"]), " café");
        assert_eq!(Decoder::ByteLevel.decode(&["Ã"]), "\u{FFFD}");
    }

    #[test]
    fn sentencepiece_bytes_and_spaces() {
        let d = Decoder::SentencePiece {
            strip_leading_space: true,
        };
        assert_eq!(d.decode(&["▁Hi", "▁", "<0xC3>", "<0xA9>", "!"]), "Hi é!");
        assert_eq!(d.decode(&["<0xC3>", "x"]), "\u{FFFD}x");
    }

    #[test]
    fn wordpiece_joins_continuations() {
        let d = Decoder::WordPiece {
            prefix: "##".into(),
            cleanup: true,
        };
        assert_eq!(
            d.decode(&["un", "##aff", "##able", "thing", ",", "isn", "'", "t", "it", "?"]),
            "unaffable thing, isn ' t it?"
        );
    }
}
