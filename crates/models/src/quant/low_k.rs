//! Quantization to Q3_K and Q2_K, the k-quants below 4 bits, judged by their error (see
//! the tests): the `gguf` package has no quantizer for them to match bit for bit.
//!
//! Both split a 256-element super-block into 16 groups of 16.
//! - **Q3_K**: each group `x ≈ s·q`, `q` in −4..=3, fitted as Q6_K's groups are
//!   ([`super::q6_k::fit_group`]); the sixteen `s` stored as signed 6-bit multiples of the
//!   f16 factor `d = max |s| / 31`.
//! - **Q2_K**: each group `x ≈ s·q − o`, `q` in 0..=3, fitted as Q4_K's sub-blocks are
//!   ([`super::affine_k::fit_sub_block`]); `s` and `o` stored as 4-bit multiples of the
//!   f16 factors `d = max s / 15` and `dmin = max o / 15`.
//!
//! In both, the quants are chosen against the scales as stored. The layouts are those
//! [`crate::dequant::dequant_q3_k`] and [`crate::dequant::dequant_q2_k`] read.

use super::affine_k::{fit_sub_block, Affine};
use super::q6_k::{fit_group, round, Levels};
use crate::dequant::{f16_to_f32, f32_to_f16, Q2_K_BYTES, Q3_K_BYTES, QK_K};

const Q3_K_LEVELS: Levels = Levels { low: 4 };

/// Sets element `i`'s 2-bit field in 64 bytes of 2-bit groups (bits `2g` of byte
/// `32h + i mod 32`, `h = i / 128`, `g = (i mod 128) / 32`).
fn set_crumb(q: &mut [u8], i: usize, v: u8) {
    let (h, g, l) = (i / 128, (i % 128) / 32, i % 32);
    q[32 * h + l] |= (v & 3) << (2 * g);
}

/// Quantizes one Q3_K super-block. Inputs must be finite; the caller checks that `d` came
/// out finite.
pub fn quantize_q3_k(x: &[f32; QK_K], out: &mut [u8; Q3_K_BYTES]) {
    let scales: [f32; 16] =
        std::array::from_fn(|g| fit_group(&x[16 * g..16 * g + 16], Q3_K_LEVELS));
    let max = scales.iter().fold(0.0f32, |m, s| m.max(s.abs()));
    let d_bits = f32_to_f16(max / 31.0);
    let d = f16_to_f32(d_bits);
    let stored: [i8; 16] = std::array::from_fn(|g| {
        if d == 0.0 {
            0
        } else {
            round(scales[g] / d).clamp(-32.0, 31.0) as i8
        }
    });
    out.fill(0);
    let (hmask, rest) = out.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    for (i, &v) in x.iter().enumerate() {
        // The product the dequantizer forms, so `q` is chosen against the stored scale.
        let step = d * f32::from(stored[i / 16]);
        let q = if step == 0.0 {
            0
        } else {
            Q3_K_LEVELS.quant(v, 1.0 / step)
        };
        // Stored as `low − 4` with the high bit clear, `low` with it set.
        if q >= 0 {
            hmask[i % 32] |= 1 << (i / 32);
        }
        set_crumb(qs, i, (q + 4) as u8);
    }
    // Scale j (plus 32): low nibble in nibble j / 8 of byte j mod 8, top two bits in bits
    // 2·(j / 4) of byte 8 + j mod 4.
    let sc = &mut rest[..12];
    for (j, &s) in stored.iter().enumerate() {
        let v = (i32::from(s) + 32) as u8;
        sc[j % 8] |= (v & 0x0f) << (4 * (j / 8));
        sc[8 + j % 4] |= (v >> 4) << (2 * (j / 4));
    }
    rest[12..14].copy_from_slice(&d_bits.to_le_bytes());
}

/// The 4-bit multiplier of `factor` closest to `value`.
fn four_bit(value: f32, factor: f32) -> u8 {
    if factor == 0.0 {
        return 0;
    }
    (value / factor).round().clamp(0.0, 15.0) as u8
}

/// Quantizes one Q2_K super-block. Inputs must be finite; the caller checks that `d` and
/// `dmin` came out finite.
pub fn quantize_q2_k(x: &[f32; QK_K], out: &mut [u8; Q2_K_BYTES]) {
    let fits: [Affine; 16] = std::array::from_fn(|g| fit_sub_block(&x[16 * g..16 * g + 16], 3.0));
    let max_scale = fits.iter().fold(0.0f32, |m, f| m.max(f.scale));
    let max_offset = fits.iter().fold(0.0f32, |m, f| m.max(f.offset));
    let d_bits = f32_to_f16(max_scale / 15.0);
    let dmin_bits = f32_to_f16(max_offset / 15.0);
    let (d, dmin) = (f16_to_f32(d_bits), f16_to_f32(dmin_bits));
    out.fill(0);
    let codes: [(u8, u8); 16] =
        std::array::from_fn(|g| (four_bit(fits[g].scale, d), four_bit(fits[g].offset, dmin)));
    // The maps as the dequantizer forms them, so the quants are chosen against them.
    let stored: [Affine; 16] = std::array::from_fn(|g| Affine {
        scale: d * f32::from(codes[g].0),
        offset: dmin * f32::from(codes[g].1),
        top: 3.0,
    });
    for (o, (sc, m)) in out.iter_mut().zip(codes) {
        *o = sc | (m << 4);
    }
    for (i, &v) in x.iter().enumerate() {
        set_crumb(&mut out[16..80], i, stored[i / 16].quant(v));
    }
    out[80..82].copy_from_slice(&d_bits.to_le_bytes());
    out[82..84].copy_from_slice(&dmin_bits.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::{dequant_q2_k, dequant_q3_k};
    use crate::quant::test_data::{gaussian, relative_rms};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn q3_k_error(x: &[f32; QK_K], q: &[u8; Q3_K_BYTES]) -> f64 {
        let mut back = [0f32; QK_K];
        dequant_q3_k(q, &mut back);
        relative_rms(x, &back)
    }

    fn q2_k_error(x: &[f32; QK_K], q: &[u8; Q2_K_BYTES]) -> f64 {
        let mut back = [0f32; QK_K];
        dequant_q2_k(q, &mut back);
        relative_rms(x, &back)
    }

    /// Gaussian weights: 8 levels a group of 16 leave 14% of the data's RMS (measured: 14.3%
    /// on average, 15.7% at most; the optimal 8-level quantizer of one Gaussian leaves
    /// ~19% of its deviation, a group's own scale does better), 4 affine levels 27% (27.3%,
    /// 30.3%). Bounds with room; a misplaced field more than doubles the error (below).
    #[test]
    fn round_trips_are_as_close_as_their_levels_allow() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let (mut q3, mut q2) = ([0u8; Q3_K_BYTES], [0u8; Q2_K_BYTES]);
        for scale in [0.005, 0.02, 1.0, 300.0] {
            for _ in 0..40 {
                let x = gaussian(&mut rng, scale);
                quantize_q3_k(&x, &mut q3);
                quantize_q2_k(&x, &mut q2);
                let (e3, e2) = (q3_k_error(&x, &q3), q2_k_error(&x, &q2));
                assert!(e3 < 0.18, "Q3_K, scale {scale}: relative error {e3}");
                assert!(e2 < 0.34, "Q2_K, scale {scale}: relative error {e2}");
            }
        }
    }

    /// The dequantizer is independent of the quantizers: a layout written wrong by them
    /// round-trips badly. Here the stored fields are disturbed as a wrong writer would.
    #[test]
    fn misplaced_fields_are_caught() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let x = gaussian(&mut rng, 1.0);
        let mut q3 = [0u8; Q3_K_BYTES];
        quantize_q3_k(&x, &mut q3);
        // The high-bit plane of elements 0..32 and 32..64 swapped.
        for b in &mut q3[..32] {
            let (a, c) = (*b & 1, (*b >> 1) & 1);
            *b = (*b & !3) | (a << 1) | c;
        }
        assert!(q3_k_error(&x, &q3) > 0.4);
        let mut q2 = [0u8; Q2_K_BYTES];
        quantize_q2_k(&x, &mut q2);
        // Each group's scale and min nibbles traded.
        for b in &mut q2[..16] {
            *b = b.rotate_left(4);
        }
        assert!(q2_k_error(&x, &q2) > 0.8);
    }

    #[test]
    fn zeros_stay_zero_and_a_lone_value_survives() {
        let mut x = [0f32; QK_K];
        let (mut q3, mut q2) = ([0u8; Q3_K_BYTES], [0u8; Q2_K_BYTES]);
        let mut back = [1f32; QK_K];
        quantize_q3_k(&x, &mut q3);
        dequant_q3_k(&q3, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        quantize_q2_k(&x, &mut q2);
        dequant_q2_k(&q2, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        x[77] = -3.0;
        quantize_q3_k(&x, &mut q3);
        dequant_q3_k(&q3, &mut back);
        assert!((back[77] + 3.0).abs() < 0.05, "{}", back[77]);
        assert!(back.iter().enumerate().all(|(i, &v)| i == 77 || v == 0.0));
        quantize_q2_k(&x, &mut q2);
        dequant_q2_k(&q2, &mut back);
        assert!((back[77] + 3.0).abs() < 0.05, "{}", back[77]);
    }
}
