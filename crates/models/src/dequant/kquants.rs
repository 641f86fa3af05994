//! The k-quant formats: 256-element super-blocks split into sub-blocks that carry their own
//! small integer scales (and for Q2_K, Q4_K, Q5_K, mins), themselves scaled by f16 super-block
//! factors `d` (and `dmin`).
//!
//! The bit layouts, by element index `i` within the super-block:
//! - 2-bit fields (Q2_K quants, Q3_K low bits, Q6_K high bits) come in 32-byte groups per half
//!   (`h = i / 128`): element `i` is bits `2g..2g+2` of byte `32h + i % 32`, `g = (i % 128) / 32`.
//! - Q4_K/Q5_K nibbles: element `i` is nibble `(i / 32) % 2` of byte `32·(i / 64) + i % 32`.
//! - single high bits (Q3_K `hmask`, Q5_K `qh`): element `i` is bit `i / 32` of byte `i % 32`.
//!
//! As in the legacy types, arithmetic follows the `gguf` package's f32 evaluation order.

use super::f16_at;

pub const QK_K: usize = 256;
pub const Q2_K_BYTES: usize = 84;
pub const Q3_K_BYTES: usize = 110;
pub const Q4_K_BYTES: usize = 144;
pub const Q5_K_BYTES: usize = 176;
pub const Q6_K_BYTES: usize = 210;

/// Element `i`'s 2-bit field from 64 bytes of 2-bit groups.
fn crumb(q: &[u8], i: usize) -> u8 {
    let (h, g, l) = (i / 128, (i % 128) / 32, i % 32);
    (q[32 * h + l] >> (2 * g)) & 3
}

/// Element `i`'s bit from 32 bytes of bit planes.
fn plane_bit(bits: &[u8], i: usize) -> u8 {
    (bits[i % 32] >> (i / 32)) & 1
}

/// Element `i`'s nibble from 128 bytes of Q4_K-style nibbles.
fn k_nibble(qs: &[u8], i: usize) -> u8 {
    (qs[32 * (i / 64) + i % 32] >> (4 * ((i / 32) % 2))) & 0x0f
}

/// The eight 6-bit (scale, min) pairs of Q4_K and Q5_K, packed in 12 bytes: pairs 0..4 are
/// the low six bits of bytes 0..4 (scales) and 4..8 (mins); pairs 4..8 keep their low four
/// bits in the nibbles of bytes 8..12 and their top two bits in the top bits of bytes 0..8.
#[inline]
pub fn unpack_k_scales(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    for j in 0..4 {
        scales[j] = s[j] & 0x3f;
        mins[j] = s[j + 4] & 0x3f;
        scales[j + 4] = (s[j + 8] & 0x0f) | ((s[j] >> 2) & 0x30);
        mins[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (scales, mins)
}

fn k_scales(block: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut packed = [0u8; 12];
    packed.copy_from_slice(&block[4..16]);
    unpack_k_scales(&packed)
}

/// Layout: 16 scale bytes (low nibble scale, high nibble min, per 16 elements), 64 bytes of
/// 2-bit quants, f16 `d`, f16 `dmin`. `x = (d·sc)·q − dmin·m`.
pub fn dequant_q2_k(block: &[u8; Q2_K_BYTES], out: &mut [f32; QK_K]) {
    let (scales, qs) = (&block[0..16], &block[16..80]);
    let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
    for (i, o) in out.iter_mut().enumerate() {
        let s = scales[i / 16];
        let dl = d * f32::from(s & 0x0f);
        let ml = dmin * f32::from(s >> 4);
        *o = dl * f32::from(crumb(qs, i)) - ml;
    }
}

/// Layout: 32 bytes `hmask`, 64 bytes of low 2-bit quants, 12 bytes of sixteen 6-bit scales,
/// f16 `d`. The quant is `low − 4` where the hmask bit is clear and `low` where it is set;
/// scales are stored plus 32. `x = (d·(sc − 32))·q`.
pub fn dequant_q3_k(block: &[u8; Q3_K_BYTES], out: &mut [f32; QK_K]) {
    let (hmask, qs, sc) = (&block[0..32], &block[32..96], &block[96..108]);
    let d = f16_at(block, 108);
    let scales = unpack_q3_k_scales(sc.try_into().expect("12 bytes"));
    let dl: [f32; 16] = std::array::from_fn(|j| d * f32::from(scales[j]));
    for (i, o) in out.iter_mut().enumerate() {
        let q = crumb(qs, i) as i8 - (((plane_bit(hmask, i) ^ 1) << 2) as i8);
        *o = dl[i / 16] * f32::from(q);
    }
}

/// Q3_K's sixteen 6-bit scales from their 12 bytes, less the 32 they are stored plus: scale
/// `j` has its low four bits in nibble `j / 8` of byte `j % 8` and its top two in bits
/// `2·(j / 4)` of byte `8 + j % 4`.
#[inline]
pub fn unpack_q3_k_scales(sc: &[u8; 12]) -> [i8; 16] {
    std::array::from_fn(|j| {
        let low = (sc[j % 8] >> (4 * (j / 8))) & 0x0f;
        let high = (sc[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        (low | (high << 4)) as i8 - 32
    })
}

/// Layout: f16 `d`, f16 `dmin`, 12 bytes of packed 6-bit scales and mins (one pair per 32
/// elements), 128 bytes of nibbles. `x = (d·sc)·q − dmin·m`.
pub fn dequant_q4_k(block: &[u8; Q4_K_BYTES], out: &mut [f32; QK_K]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (scales, mins) = k_scales(block);
    let qs = &block[16..144];
    // Sub-block j (32 elements) takes the low (j even) or high nibbles of bytes
    // 32·(j/2) .. 32·(j/2) + 32, as `k_nibble` reads them; written per sub-block so that
    // the loop vectorizes.
    for (j, sub) in out.chunks_exact_mut(32).enumerate() {
        let dl = d * f32::from(scales[j]);
        let ml = dmin * f32::from(mins[j]);
        let (bytes, shift) = (&qs[32 * (j / 2)..32 * (j / 2) + 32], 4 * (j % 2));
        for (o, &b) in sub.iter_mut().zip(bytes) {
            *o = dl * f32::from((b >> shift) & 0x0f) - ml;
        }
    }
}

/// Q4_K with a fifth bit per element: f16 `d`, f16 `dmin`, 12 scale bytes, 32 bytes `qh`,
/// 128 bytes of nibbles.
pub fn dequant_q5_k(block: &[u8; Q5_K_BYTES], out: &mut [f32; QK_K]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (scales, mins) = k_scales(block);
    let (qh, qs) = (&block[16..48], &block[48..176]);
    for (i, o) in out.iter_mut().enumerate() {
        let j = i / 32;
        let dl = d * f32::from(scales[j]);
        let ml = dmin * f32::from(mins[j]);
        let q = k_nibble(qs, i) | (plane_bit(qh, i) << 4);
        *o = dl * f32::from(q) - ml;
    }
}

/// Layout: 128 bytes of low nibbles, 64 bytes of high 2-bit fields, 16 signed 8-bit scales
/// (one per 16 elements), f16 `d`. Within half `h = i / 128`, element `e = i % 128` takes
/// nibble `e / 64` of byte `64h + e % 64`. `x = (d·sc)·(q − 32)`.
pub fn dequant_q6_k(block: &[u8; Q6_K_BYTES], out: &mut [f32; QK_K]) {
    let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
    let d = f16_at(block, 208);
    // Per 16 elements (one scale), as the layout above reads them; written per group so
    // that the loop vectorizes.
    for (g, group) in out.chunks_exact_mut(16).enumerate() {
        let dl = d * f32::from(scales[g] as i8);
        let first = 16 * g;
        let (h, e) = (first / 128, first % 128);
        let low = &ql[64 * h + e % 64..64 * h + e % 64 + 16];
        let shift = 4 * (e / 64);
        for (k, o) in group.iter_mut().enumerate() {
            let q = (((low[k] >> shift) & 0x0f) | (crumb(qh, first + k) << 4)) as i8 - 32;
            *o = dl * f32::from(q);
        }
    }
}
