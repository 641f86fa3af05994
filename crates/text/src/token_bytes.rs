//! Each token's raw bytes on its own: what a constrained decoder matches grammars against.
//!
//! Decoding a sequence (see `decode.rs`) joins tokens and repairs their spacing; here every
//! token stands alone: byte-level tokens go back through GPT-2's byte alphabet,
//! SentencePiece's '▁' is a space and `<0xNN>` the byte it names, a WordPiece continuation
//! loses its `##` and any other WordPiece token gains the space it is joined with.

use crate::byte_level::chars_to_bytes;
use crate::decode::Decoder;
use crate::normalize::METASPACE;
use crate::sentencepiece::parse_byte_token;

impl Decoder {
    /// The bytes `token` contributes to the text, as if it were in the middle of a reply
    /// (no leading space is dropped).
    pub(crate) fn token_bytes(&self, token: &str) -> Vec<u8> {
        match self {
            // A token outside the byte alphabet (an added token with a space, say) stands
            // for its own UTF-8, as in decoding.
            Decoder::ByteLevel => chars_to_bytes(token).unwrap_or_else(|| token.as_bytes().into()),
            Decoder::SentencePiece { .. } => match parse_byte_token(token) {
                Some(b) => vec![b],
                None => token
                    .chars()
                    .map(|c| if c == METASPACE { ' ' } else { c })
                    .collect::<String>()
                    .into_bytes(),
            },
            Decoder::WordPiece { prefix, .. } => match token.strip_prefix(prefix.as_str()) {
                Some(rest) => rest.as_bytes().into(),
                None => format!(" {token}").into_bytes(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;

    #[test]
    fn byte_level_undoes_the_byte_alphabet() {
        let d = Decoder::ByteLevel;
        assert_eq!(d.token_bytes("Ġcaf"), b" caf");
        // "é" is C3 A9: each half is a token of its own, not valid UTF-8 alone.
        assert_eq!(d.token_bytes("Ã"), vec![0xC3]);
        assert_eq!(d.token_bytes("©"), vec![0xA9]);
        assert_eq!(d.token_bytes("Ċ"), b"\n");
        // Outside the alphabet: its own UTF-8.
        assert_eq!(d.token_bytes("<|im end|>"), b"<|im end|>");
    }

    #[test]
    fn sentencepiece_spaces_and_byte_tokens() {
        let d = Decoder::SentencePiece {
            strip_leading_space: true,
        };
        assert_eq!(d.token_bytes("▁Hi"), b" Hi");
        assert_eq!(d.token_bytes("<0x0A>"), b"\n");
        assert_eq!(d.token_bytes("<0xC3>"), vec![0xC3]);
        assert_eq!(d.token_bytes("a▁b"), b"a b");
    }

    #[test]
    fn wordpiece_continuations_and_words() {
        let d = Decoder::WordPiece {
            prefix: "##".into(),
            cleanup: true,
        };
        assert_eq!(d.token_bytes("##ing"), b"ing");
        assert_eq!(d.token_bytes("run"), b" run");
    }

    #[test]
    fn tokenizer_gives_bytes_and_marks_specials() {
        let json = r#"{
            "added_tokens": [{"id": 3, "content": "<|end|>", "special": true,
                "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}],
            "normalizer": null,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false,
                "trim_offsets": true, "use_regex": true},
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true,
                "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "vocab": {"a": 0, "Ġ": 1, "Ġa": 2, "<|end|>": 3},
                "merges": ["Ġ a"]}
        }"#;
        let tok = Tokenizer::from_tokenizer_json_str(json).unwrap();
        assert_eq!(tok.token_bytes(0), Some(b"a".to_vec()));
        assert_eq!(tok.token_bytes(2), Some(b" a".to_vec()));
        assert_eq!(tok.token_bytes(3), Some(b"<|end|>".to_vec()));
        assert!(tok.is_special(3) && !tok.is_special(2));
        assert_eq!(tok.token_bytes(4), None);
    }
}
