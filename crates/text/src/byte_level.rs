//! GPT-2's reversible map between bytes and printable characters.
//!
//! Byte-level BPE works on text whose every byte has been replaced by one printable
//! character: the bytes that are printable Latin-1 characters (`!`..=`~`, `¡`..=`¬`,
//! `®`..=`ÿ`) stand for themselves, and the remaining 68 bytes take the characters from
//! U+0100 upward, in byte order (so a space becomes `Ġ` and a newline `Ċ`).

use std::collections::HashMap;
use std::sync::OnceLock;

struct ByteMap {
    to_char: [char; 256],
    to_byte: HashMap<char, u8>,
}

fn stands_for_itself(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

fn byte_map() -> &'static ByteMap {
    static MAP: OnceLock<ByteMap> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut to_char = ['\0'; 256];
        let mut next_shifted = 256u32;
        for b in 0..=255u8 {
            to_char[b as usize] = if stands_for_itself(b) {
                char::from(b)
            } else {
                let c = char::from_u32(next_shifted).unwrap_or(char::REPLACEMENT_CHARACTER);
                next_shifted += 1;
                c
            };
        }
        let to_byte = (0..=255u8).map(|b| (to_char[b as usize], b)).collect();
        ByteMap { to_char, to_byte }
    })
}

/// The text with each UTF-8 byte replaced by its printable character.
pub(crate) fn bytes_to_chars(text: &str) -> String {
    let map = byte_map();
    text.bytes().map(|b| map.to_char[b as usize]).collect()
}

/// The bytes a byte-level token stands for, or `None` when one of its characters is not
/// in the map (an added token written in plain text).
pub(crate) fn chars_to_bytes(token: &str) -> Option<Vec<u8>> {
    let map = byte_map();
    token
        .chars()
        .map(|c| map.to_byte.get(&c).copied())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_and_newline_map_like_gpt2() {
        assert_eq!(bytes_to_chars(" \n\tA"), "ĠĊĉA");
        assert_eq!(bytes_to_chars("é"), "Ã©");
    }

    #[test]
    fn every_byte_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        let map = byte_map();
        let text: String = all.iter().map(|&b| map.to_char[b as usize]).collect();
        assert_eq!(chars_to_bytes(&text), Some(all));
        assert_eq!(map.to_byte.len(), 256);
    }

    #[test]
    fn plain_space_is_not_a_byte_char() {
        assert_eq!(chars_to_bytes("a b"), None);
    }
}
