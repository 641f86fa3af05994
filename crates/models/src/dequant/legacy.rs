//! The 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Every block starts with an f16 scale `d` (and for the `_1` types an f16 offset `m`). In the
//! 4- and 5-bit types, byte `j` of the nibble array holds element `j` in its low nibble and
//! element `j + 16` in its high nibble; the 5-bit types keep each element's fifth bit in a
//! little-endian u32 (`qh`, bit `i` for element `i`). The arithmetic is written in the order
//! the `gguf` package evaluates it in f32, which makes the results bit-identical.

use super::f16_at;

pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;
pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;
pub const Q8_0_BYTES: usize = 34;

/// The 4-bit value of element `i` from a 16-byte nibble array.
fn nibble(qs: &[u8], i: usize) -> u8 {
    (qs[i % 16] >> (4 * (i / 16))) & 0x0f
}

/// Element `i`'s fifth bit, shifted into place.
fn fifth_bit(qh: u32, i: usize) -> u8 {
    (((qh >> i) & 1) as u8) << 4
}

/// `x = d·(q − 8)`.
pub fn dequant_q4_0(block: &[u8; Q4_0_BYTES], out: &mut [f32; 32]) {
    let d = f16_at(block, 0);
    let qs = &block[2..];
    for (i, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(qs, i) as i8 - 8);
    }
}

/// `x = d·q + m`.
pub fn dequant_q4_1(block: &[u8; Q4_1_BYTES], out: &mut [f32; 32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    let qs = &block[4..];
    for (i, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(qs, i)) + m;
    }
}

/// `x = d·(q − 16)` with a 5-bit `q`.
pub fn dequant_q5_0(block: &[u8; Q5_0_BYTES], out: &mut [f32; 32]) {
    let d = f16_at(block, 0);
    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
    let qs = &block[6..];
    for (i, o) in out.iter_mut().enumerate() {
        let q = nibble(qs, i) | fifth_bit(qh, i);
        *o = d * f32::from(q as i8 - 16);
    }
}

/// `x = d·q + m` with a 5-bit `q`.
pub fn dequant_q5_1(block: &[u8; Q5_1_BYTES], out: &mut [f32; 32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    let qh = u32::from_le_bytes([block[4], block[5], block[6], block[7]]);
    let qs = &block[8..];
    for (i, o) in out.iter_mut().enumerate() {
        let q = nibble(qs, i) | fifth_bit(qh, i);
        *o = d * f32::from(q) + m;
    }
}

/// `x = q·d` with a signed byte `q`.
pub fn dequant_q8_0(block: &[u8; Q8_0_BYTES], out: &mut [f32; 32]) {
    let d = f16_at(block, 0);
    for (o, &q) in out.iter_mut().zip(&block[2..]) {
        *o = f32::from(q as i8) * d;
    }
}
