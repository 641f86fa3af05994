//! Mutations of a byte string: bit flips, boundary integers written over lengths, counts and
//! offsets, decimal boundary numbers written over digits (for text formats), inserted and
//! deleted ranges, splices from another input, and tokens from the target's dictionary.

use crate::rng::Rng;

/// Inputs grow by splicing and inserting; past this they are cut back, so that one input's
/// cost stays small and the run's count is what it says.
pub const MAX_INPUT: usize = 1 << 20;

/// Values that sit on the edges of what a length, count, offset or index can be.
const INTERESTING: [u64; 18] = [
    0,
    1,
    2,
    7,
    8,
    31,
    32,
    255,
    256,
    4095,
    65535,
    65536,
    0x7fff_ffff,
    0x8000_0000,
    u32::MAX as u64,
    1 << 32,
    i64::MAX as u64,
    u64::MAX,
];

/// The same edges as decimal text, for JSON, templates and the IR.
const INTERESTING_TEXT: [&str; 16] = [
    "0",
    "-1",
    "1",
    "255",
    "65536",
    "2147483647",
    "-2147483648",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "1e999",
    "-0.0",
];

/// A position in `len` bytes, biased towards the start, where headers live: half the time
/// anywhere, else within a prefix of a random power-of-two length.
fn position(rng: &mut Rng, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let limit = if rng.one_in(2) {
        len
    } else {
        len.min(1 << (4 + rng.below(12)))
    };
    rng.below(limit)
}

fn range(rng: &mut Rng, len: usize) -> (usize, usize) {
    let start = position(rng, len);
    let max = (len - start).min(1 << rng.below(10));
    (start, start + rng.below(max + 1))
}

fn overwrite(data: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    let end = at + bytes.len();
    if end > data.len() {
        data.resize(end, 0);
    }
    data[at..end].copy_from_slice(bytes);
}

/// Replaces the run of ASCII digits (with a sign) around a random digit by `number`.
fn replace_number(rng: &mut Rng, data: &mut Vec<u8>, number: &str) -> bool {
    let digits: Vec<usize> = (0..data.len().min(1 << 16))
        .filter(|&i| data[i].is_ascii_digit())
        .collect();
    if digits.is_empty() {
        return false;
    }
    let at = *rng.pick(&digits);
    let mut start = at;
    while start > 0 && (data[start - 1].is_ascii_digit() || data[start - 1] == b'-') {
        start -= 1;
    }
    let mut end = at;
    while end < data.len() && (data[end].is_ascii_digit() || matches!(data[end], b'.' | b'e')) {
        end += 1;
    }
    data.splice(start..end, number.bytes());
    true
}

/// Where the words (runs of letters, digits, `_` and `.`) of the first 64 KiB of `data` are.
fn words(data: &[u8]) -> Vec<(usize, usize)> {
    let is_word = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'.';
    let mut out = Vec::new();
    let mut start = None;
    for (i, &b) in data.iter().take(1 << 16).enumerate() {
        match (is_word(b), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, data.len().min(1 << 16)));
    }
    out
}

/// Replaces a word of `data` by a word of `donor` (itself or another input): a type name
/// by another, a value number by another, a key by another, an op by another. The syntax
/// mostly survives, so the checks behind it are reached.
fn swap_word(rng: &mut Rng, data: &mut Vec<u8>, donor: &[u8]) -> bool {
    let here = words(data);
    let there = words(donor);
    if here.is_empty() || there.is_empty() {
        return false;
    }
    let (a, b) = *rng.pick(&here);
    let (c, d) = *rng.pick(&there);
    let word = donor[c..d].to_vec();
    data.splice(a..b, word);
    true
}

/// One mutation of `data`; `other` is another corpus input to splice from, `dict` the
/// target's tokens.
pub fn mutate_once(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8], dict: &[&[u8]]) {
    let len = data.len();
    match rng.below(14) {
        12 | 13 => {
            let donor = if rng.one_in(2) {
                data.clone()
            } else {
                other.to_vec()
            };
            if !swap_word(rng, data, &donor) && len > 0 {
                let at = position(rng, len);
                data[at] ^= 1 << rng.below(8);
            }
        }
        0 if len > 0 => {
            let at = position(rng, len);
            data[at] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let at = position(rng, len);
            data[at] = match rng.below(3) {
                0 => rng.next_u64() as u8,
                1 => *rng.pick(&[0u8, 0x7f, 0x80, 0xff, b'"', b'{', b'}', b'[', b'%']),
                _ => data[at].wrapping_add(rng.below(5) as u8).wrapping_sub(2),
            };
        }
        2 | 3 => {
            // A boundary integer over a length, count or offset: 2, 4 or 8 bytes, little
            // endian, often at an aligned offset as the binary formats lay them out.
            let value = *rng.pick(&INTERESTING);
            let value = match rng.below(4) {
                0 => value.wrapping_sub(1),
                1 => value.wrapping_add(1),
                _ => value,
            };
            let width = *rng.pick(&[2usize, 4, 8, 8]);
            let mut at = position(rng, len);
            if rng.one_in(2) {
                at &= !(width - 1);
            }
            overwrite(data, at, &value.to_le_bytes()[..width]);
        }
        4 => {
            let number = *rng.pick(&INTERESTING_TEXT);
            if !replace_number(rng, data, number) {
                let at = position(rng, len);
                data.splice(at..at, number.bytes());
            }
        }
        5 if len > 0 => {
            let (start, end) = range(rng, len);
            data.drain(start..end);
        }
        6 => {
            let at = position(rng, len);
            let n = 1 + rng.below(16);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(at..at, bytes);
        }
        7 if len > 0 => {
            // Duplicate a range elsewhere: repeated structure (entries, nesting).
            let (start, end) = range(rng, len);
            let chunk = data[start..end].to_vec();
            let at = position(rng, len);
            data.splice(at..at, chunk);
        }
        8 if !other.is_empty() => {
            let (start, end) = range(rng, other.len());
            let at = position(rng, len);
            if rng.one_in(2) {
                data.splice(at..at, other[start..end].iter().copied());
            } else {
                data.truncate(at);
                data.extend_from_slice(&other[start..]);
            }
        }
        9 | 10 if !dict.is_empty() => {
            let token = *rng.pick(dict);
            let at = position(rng, len);
            if rng.one_in(3) {
                overwrite(data, at, token);
            } else {
                data.splice(at..at, token.iter().copied());
            }
        }
        11 if len > 0 => data.truncate(position(rng, len)),
        _ => {
            let at = position(rng, len);
            data.insert(at, rng.next_u64() as u8);
        }
    }
}

/// A mutant of `base`: one to four mutations, sometimes a burst of up to sixteen.
pub fn mutate(rng: &mut Rng, base: &[u8], other: &[u8], dict: &[&[u8]]) -> Vec<u8> {
    let mut data = base.to_vec();
    let n = if rng.one_in(8) {
        1 + rng.below(16)
    } else {
        1 + rng.below(4)
    };
    for _ in 0..n {
        mutate_once(rng, &mut data, other, dict);
    }
    data.truncate(MAX_INPUT);
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutants_are_deterministic_and_differ_from_their_base() {
        let base = b"{\"a\": 12, \"b\": [1, 2, 3]}".to_vec();
        let dict: &[&[u8]] = &[b"null", b"[[[["];
        let run = || {
            (0..200)
                .map(|i| mutate(&mut Rng::for_input(3, i), &base, b"xyz", dict))
                .collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().filter(|m| **m != base).count() > 180);
        assert!(a.iter().all(|m| m.len() <= MAX_INPUT));
    }
}
