//! The i-quant formats: IQ4_NL and IQ4_XS (4-bit indices into a fixed non-linear table of
//! 16 levels) and the lattice types below 4 bits (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ1_S, IQ1_M), whose groups of 4 or 8 weights are each one point of a fixed grid
//! ([`super::iq_grids`]), with a sign per weight (IQ1: a shared ± offset instead).
//!
//! Every type but IQ4_NL (32-element blocks) stores 256-element super-blocks, split into
//! eight sub-blocks of 32 that carry a small integer scale. The products below are exact in
//! f32 (their factors have few enough bits), except IQ4_XS's, which multiplies in the
//! `gguf` package's order, `(d·scale)·level`; so the results are bit-identical with it.
//!
//! Signs: IQ2_XXS, IQ2_XS and IQ3_XXS store 7 bits per 8 weights, the eighth making the
//! count of minus signs even ([`even_signs`]); IQ2_S and IQ3_S store all 8.

use super::f16_at;
use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use super::kquants::QK_K;

pub const IQ4_NL_BYTES: usize = 18;
pub const IQ4_XS_BYTES: usize = 136;
pub const IQ3_XXS_BYTES: usize = 98;
pub const IQ3_S_BYTES: usize = 110;
pub const IQ2_XXS_BYTES: usize = 66;
pub const IQ2_XS_BYTES: usize = 74;
pub const IQ2_S_BYTES: usize = 82;
pub const IQ1_S_BYTES: usize = 50;
pub const IQ1_M_BYTES: usize = 56;

/// The 16 levels of IQ4_NL and IQ4_XS.
pub const IQ4_LEVELS: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The ± offset of IQ1_S and IQ1_M points.
pub const IQ1_DELTA: f32 = 0.125;

/// Eight sign bits from seven stored ones: bit 7 set when bits 0..7 hold an odd count.
pub fn even_signs(seven: u32) -> u8 {
    let s = (seven & 0x7f) as u8;
    s | (((s.count_ones() & 1) as u8) << 7)
}

/// Byte `i` (weight `i`) of a grid point.
fn weight(point: u64, i: usize) -> f32 {
    f32::from((point >> (8 * i)) as u8 as i8)
}

/// ±1 for bit `i` of `signs`.
fn sign(signs: u8, i: usize) -> f32 {
    if (signs >> i) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

fn u16_at(block: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([block[at], block[at + 1]])
}

fn u32_at(block: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]])
}

/// Layout: f16 `d`, 16 bytes of nibbles (byte `j`: element `j` low, `j + 16` high).
/// `x = d·level[q]`.
pub fn dequant_iq4_nl(block: &[u8; IQ4_NL_BYTES], out: &mut [f32; 32]) {
    let d = f16_at(block, 0);
    let qs = &block[2..];
    for (i, o) in out.iter_mut().enumerate() {
        let q = (qs[i % 16] >> (4 * (i / 16))) & 0x0f;
        *o = d * f32::from(IQ4_LEVELS[q as usize]);
    }
}

/// Layout: f16 `d`, u16 of the scales' high bits (2 per sub-block), 4 bytes of the scales'
/// low nibbles (sub-block `2j` low, `2j + 1` high), then per sub-block 16 bytes of nibbles
/// as IQ4_NL. `x = (d·(scale − 32))·level[q]` with 6-bit scales.
pub fn dequant_iq4_xs(block: &[u8; IQ4_XS_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, 0);
    let high = u16_at(block, 2);
    for (s, sub) in out.chunks_exact_mut(32).enumerate() {
        let low = (block[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
        let scale = (low | ((((high >> (2 * s)) & 3) as u8) << 4)) as i32 - 32;
        let dl = d * scale as f32;
        let qs = &block[8 + 16 * s..8 + 16 * (s + 1)];
        for (i, o) in sub.iter_mut().enumerate() {
            let q = (qs[i % 16] >> (4 * (i / 16))) & 0x0f;
            *o = dl * f32::from(IQ4_LEVELS[q as usize]);
        }
    }
}

/// Layout: f16 `d`, 64 grid indices (one per 4 weights), then per sub-block a u32: four
/// 7-bit sign groups and a 4-bit scale on top. `x = d·(0.5 + scale)·0.5·±grid`.
pub fn dequant_iq3_xxs(block: &[u8; IQ3_XXS_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, 0);
    let qs = &block[2..66];
    for (s, sub) in out.chunks_exact_mut(32).enumerate() {
        let aux = u32_at(block, 66 + 4 * s);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, group) in sub.chunks_exact_mut(8).enumerate() {
            let signs = even_signs(aux >> (7 * l));
            for (j, o) in group.iter_mut().enumerate() {
                let point = IQ3XXS_GRID[qs[8 * s + 2 * l + j / 4] as usize];
                *o = db * weight(u64::from(point), j % 4) * sign(signs, j);
            }
        }
    }
}

/// Layout: f16 `d`, 64 low bytes of 9-bit grid indices (one per 4 weights), 8 bytes of
/// their ninth bits (index `i`: bit `i % 8` of byte `i / 8`), 32 sign bytes (one per 8
/// weights), 4 bytes of 4-bit scales (sub-block `2j` low, `2j + 1` high).
/// `x = d·(1 + 2·scale)·±grid`.
pub fn dequant_iq3_s(block: &[u8; IQ3_S_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, 0);
    let (qs, qh, signs, scales) = (
        &block[2..66],
        &block[66..74],
        &block[74..106],
        &block[106..110],
    );
    for (s, sub) in out.chunks_exact_mut(32).enumerate() {
        let scale = (scales[s / 2] >> (4 * (s % 2))) & 0x0f;
        let db = d * (1 + 2 * scale as u32) as f32;
        for (e, o) in sub.iter_mut().enumerate() {
            let (i, g) = (32 * s + e, (32 * s + e) / 4);
            let index = qs[g] as usize | ((((qh[g / 8] >> (g % 8)) & 1) as usize) << 8);
            let point = IQ3S_GRID[index];
            *o = db * weight(u64::from(point), i % 4) * sign(signs[i / 8], i % 8);
        }
    }
}

/// Layout: f16 `d`, then per sub-block two u32: four 8-bit grid indices (one per 8
/// weights), and four 7-bit sign groups with a 4-bit scale on top.
/// `x = d·(0.5 + scale)·0.25·±grid`.
pub fn dequant_iq2_xxs(block: &[u8; IQ2_XXS_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, 0);
    for (s, sub) in out.chunks_exact_mut(32).enumerate() {
        let at = 2 + 8 * s;
        let aux = u32_at(block, at + 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for (l, group) in sub.chunks_exact_mut(8).enumerate() {
            let point = IQ2XXS_GRID[block[at + l] as usize];
            let signs = even_signs(aux >> (7 * l));
            for (j, o) in group.iter_mut().enumerate() {
                *o = db * weight(point, j) * sign(signs, j);
            }
        }
    }
}

/// Layout: f16 `d`, 32 u16 (a 9-bit grid index and 7 sign bits per 8 weights), 8 bytes of
/// 4-bit scales (one per 16 weights: sub-block `s`'s first half low, second high).
/// `x = d·(0.5 + scale)·0.25·±grid`.
pub fn dequant_iq2_xs(block: &[u8; IQ2_XS_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, 0);
    for (g, group) in out.chunks_exact_mut(8).enumerate() {
        let q = u16_at(block, 2 + 2 * g);
        let scale = (block[66 + g / 4] >> (4 * ((g / 2) % 2))) & 0x0f;
        let db = d * (0.5 + scale as f32) * 0.25;
        let point = IQ2XS_GRID[(q & 511) as usize];
        let signs = even_signs(u32::from(q >> 9));
        for (j, o) in group.iter_mut().enumerate() {
            *o = db * weight(point, j) * sign(signs, j);
        }
    }
}

/// Layout: f16 `d`, 32 low bytes of 10-bit grid indices (one per 8 weights), 32 sign bytes,
/// 8 bytes of the indices' top two bits (index `g`: bits `2(g % 4)..` of byte `g / 4`), 8
/// bytes of 4-bit scales as IQ2_XS. `x = d·(0.5 + scale)·0.25·±grid`.
pub fn dequant_iq2_s(block: &[u8; IQ2_S_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, 0);
    let (qs, signs, qh, scales) = (
        &block[2..34],
        &block[34..66],
        &block[66..74],
        &block[74..82],
    );
    for (g, group) in out.chunks_exact_mut(8).enumerate() {
        let scale = (scales[g / 4] >> (4 * ((g / 2) % 2))) & 0x0f;
        let db = d * (0.5 + scale as f32) * 0.25;
        let index = qs[g] as usize | ((((qh[g / 4] >> (2 * (g % 4))) & 3) as usize) << 8);
        let point = IQ2S_GRID[index];
        for (j, o) in group.iter_mut().enumerate() {
            *o = db * weight(point, j) * sign(signs[g], j);
        }
    }
}

/// Layout: f16 `d`, 32 low bytes of 11-bit grid indices (one per 8 weights), then per
/// sub-block a u16: the four indices' top three bits (bits `3l..3l + 3`), a 3-bit scale
/// (bits 12..15) and the offset's sign (bit 15). `x = d·(2·scale + 1)·(grid ± 0.125)`.
pub fn dequant_iq1_s(block: &[u8; IQ1_S_BYTES], out: &mut [f32; QK_K]) {
    let d = f16_at(block, 0);
    for (s, sub) in out.chunks_exact_mut(32).enumerate() {
        let qh = u16_at(block, 34 + 2 * s);
        let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
        let delta = if qh & 0x8000 == 0 {
            IQ1_DELTA
        } else {
            -IQ1_DELTA
        };
        for (l, group) in sub.chunks_exact_mut(8).enumerate() {
            let index = block[2 + 4 * s + l] as usize | ((((qh >> (3 * l)) & 7) as usize) << 8);
            let point = IQ1S_GRID[index];
            for (j, o) in group.iter_mut().enumerate() {
                *o = dl * (weight(point, j) + delta);
            }
        }
    }
}

/// Layout: 32 low bytes of 11-bit grid indices (one per 8 weights), 16 bytes of nibbles
/// (index `g`: nibble `g % 2` of byte `g / 2`; its low three bits are the index's top ones,
/// bit 3 the offset's sign), then four u16 whose low 12 bits hold 3-bit scales (one per 16
/// weights, the `k`-th of u16 `w` at bits `3k`) and whose top nibbles are the f16 `d`
/// (u16 `w`'s nibble at bits `4w..4w + 4` of `d`). `x = d·(2·scale + 1)·(grid ± 0.125)`.
pub fn dequant_iq1_m(block: &[u8; IQ1_M_BYTES], out: &mut [f32; QK_K]) {
    let sc: [u16; 4] = std::array::from_fn(|w| u16_at(block, 48 + 2 * w));
    let d_bits = (0..4).fold(0u16, |d, w| d | ((sc[w] >> 12) << (4 * w)));
    let d = super::f16_to_f32(d_bits);
    for (g, group) in out.chunks_exact_mut(8).enumerate() {
        let half = g / 2; // 16 weights share a scale
        let scale = (sc[half / 4] >> (3 * (half % 4))) & 7;
        let dl = d * (2 * scale + 1) as f32;
        let nib = (block[32 + g / 2] >> (4 * (g % 2))) & 0x0f;
        let index = block[g] as usize | (((nib & 7) as usize) << 8);
        let delta = if nib & 8 == 0 { IQ1_DELTA } else { -IQ1_DELTA };
        let point = IQ1S_GRID[index];
        for (j, o) in group.iter_mut().enumerate() {
            *o = dl * (weight(point, j) + delta);
        }
    }
}
