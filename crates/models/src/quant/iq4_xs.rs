//! Quantization to IQ4_XS without importance data, judged by its error (see the tests):
//! the `gguf` package has no IQ4_XS quantizer to match bit for bit.
//!
//! A super-block of 256 elements is 8 sub-blocks of 32, each `x ≈ s·level[q]` with `q` an
//! index into the 16 fixed non-linear levels ([`IQ4_LEVELS`], −127 … 113). Each
//! sub-block's `s` (signed) is the least-squares scale for the indices that the best of a
//! few candidate grids gives: grids that put the sub-block's largest magnitude at or near
//! the level −127 (the wider end), and at or near 113. The eight `s` are stored as 6-bit
//! signed multiples (−32..=31) of the f16 factor `d = s_max / −32`, `s_max` the scale of
//! largest magnitude, and the indices are chosen against the scales as stored.
//!
//! Layout (136 bytes): `d` (f16), the scales' high bits (u16, 2 per sub-block), their low
//! nibbles (4 bytes, sub-block `2j` low, `2j + 1` high), then per sub-block 16 bytes of
//! indices (byte `j`: element `j` low, `j + 16` high), each scale stored plus 32.

use crate::dequant::{f16_to_f32, f32_to_f16, IQ4_LEVELS, IQ4_XS_BYTES, QK_K};

use super::q6_k::round;

/// Offsets tried around each end's grid, in level units (the levels lie 10–26 apart).
const GRID_TRIES: std::ops::RangeInclusive<i32> = -7..=7;

/// The midpoints between neighbouring levels: they split the line into the 16 indices.
const MIDPOINTS: [f32; 15] = {
    let mut m = [0.0; 15];
    let mut i = 0;
    while i < 15 {
        m[i] = (IQ4_LEVELS[i] as f32 + IQ4_LEVELS[i + 1] as f32) * 0.5;
        i += 1;
    }
    m
};

/// The level index nearest `v` (in level units), by a binary search of [`MIDPOINTS`].
fn nearest(v: f32) -> usize {
    let mut i = 0;
    for half in [8, 4, 2, 1] {
        // Without a branch: which way the search goes is as random as the data.
        i += half * usize::from(v > MIDPOINTS[i + half - 1]);
    }
    i
}

/// The least-squares scale of one sub-block: for each candidate grid, the indices, then
/// `s = Σ x·L / Σ L²`, keeping the one that explains most of the sub-block
/// (`(Σ x·L)² / Σ L²`, which minimizes the squared error at the fitted scale).
fn fit_sub_block(xs: &[f32]) -> f32 {
    let peak = xs
        .iter()
        .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
    if peak == 0.0 {
        return 0.0;
    }
    let ends = [f32::from(IQ4_LEVELS[0]), f32::from(IQ4_LEVELS[15])];
    // The best candidate's `(Σ x·L)²` and `Σ L²` (an empty start explains nothing).
    let mut best = (0.0f32, 1.0f32);
    let mut fit = 0.0f32;
    for end in ends {
        for t in GRID_TRIES {
            let inv = (end + t as f32) / peak;
            let (mut xl, mut ll) = (0.0f32, 0.0f32);
            for &x in xs {
                let l = f32::from(IQ4_LEVELS[nearest(x * inv)]);
                xl += x * l;
                ll += l * l;
            }
            // Compared as `xl²/ll` without dividing: `ll` > 0 (no level is 0).
            if xl * xl * best.1 > best.0 * ll {
                best = (xl * xl, ll);
                fit = xl / ll;
            }
        }
    }
    fit
}

/// The stored scale (−32..=31, a multiple of `d`) of a sub-block whose fitted scale is
/// `fit`, and its indices against it: of the nearest multiple and its two neighbours, the
/// one with the least squared error (a 6-bit scale is coarse for a sub-block far smaller
/// than the super-block's largest).
fn stored_scale(xs: &[f32], fit: f32, d: f32) -> (i32, [u8; 32]) {
    if d == 0.0 {
        return (0, [0; 32]);
    }
    let r = round(fit / d) as i32;
    let mut best = (f64::INFINITY, 0, [0u8; 32]);
    for ls in [r, r - 1, r + 1] {
        let ls = ls.clamp(-32, 31);
        // The product the dequantizer forms, so the indices are chosen against it.
        let step = d * ls as f32;
        let inv = if step == 0.0 { 0.0 } else { 1.0 / step };
        let mut qs = [0u8; 32];
        let mut err = 0.0f64;
        for (q, &x) in qs.iter_mut().zip(xs) {
            *q = nearest(x * inv) as u8;
            err += f64::from(step * f32::from(IQ4_LEVELS[*q as usize]) - x).powi(2);
        }
        if err < best.0 {
            best = (err, ls, qs);
        }
    }
    (best.1, best.2)
}

/// Quantizes one super-block. Inputs must be finite; the caller checks that `d` came out
/// finite.
pub fn quantize_iq4_xs(x: &[f32; QK_K], out: &mut [u8; IQ4_XS_BYTES]) {
    let scales: [f32; 8] = std::array::from_fn(|s| fit_sub_block(&x[32 * s..32 * s + 32]));
    let s_max = scales
        .iter()
        .fold(0.0f32, |m, &s| if s.abs() > m.abs() { s } else { m });
    let d_bits = f32_to_f16(s_max / -32.0);
    let d = f16_to_f32(d_bits);
    out.fill(0);
    out[..2].copy_from_slice(&d_bits.to_le_bytes());
    let mut high = 0u16;
    for (s, &fit) in scales.iter().enumerate() {
        let xs = &x[32 * s..32 * s + 32];
        let (ls, qs) = stored_scale(xs, fit, d);
        let biased = (ls + 32) as u8;
        out[4 + s / 2] |= (biased & 0x0f) << (4 * (s % 2));
        high |= u16::from(biased >> 4) << (2 * s);
        for (i, &q) in qs.iter().enumerate() {
            out[8 + 16 * s + i % 16] |= q << (4 * (i / 16));
        }
    }
    out[2..4].copy_from_slice(&high.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::dequant_iq4_xs;
    use crate::quant::test_data::{gaussian, relative_rms};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// RMS of the error of the stored block `q` against `x`, over RMS of `x`.
    fn stored_error(x: &[f32; QK_K], q: &[u8; IQ4_XS_BYTES]) -> f64 {
        let mut back = [0f32; QK_K];
        dequant_iq4_xs(q, &mut back);
        relative_rms(x, &back)
    }

    #[test]
    fn nearest_picks_the_closest_level() {
        for k in -1500..=1500 {
            let v = k as f32 / 10.0;
            let d = |i: usize| (f32::from(IQ4_LEVELS[i]) - v).abs();
            let best = (0..16).fold(0, |b, i| if d(i) < d(b) { i } else { b });
            assert_eq!(d(nearest(v)), d(best), "{v}");
        }
    }

    /// 16 non-linear levels a sub-block of 32, a 6-bit scale each: about 7–8% of the
    /// data's RMS on Gaussian weights (Q4_K, 16 even levels with an offset: ~7%).
    #[test]
    fn the_round_trip_is_close_for_weights_of_any_scale() {
        let mut rng = ChaCha8Rng::seed_from_u64(44);
        for scale in [0.005, 0.02, 1.0, 300.0] {
            for _ in 0..50 {
                let x = gaussian(&mut rng, scale);
                let mut q = [0u8; IQ4_XS_BYTES];
                quantize_iq4_xs(&x, &mut q);
                let e = stored_error(&x, &q);
                assert!(e < 0.09, "scale {scale}: relative error {e}");
            }
        }
    }

    /// A wrong layout round-trips badly: the dequantizer is independent of the quantizer,
    /// so the test above fails for it.
    #[test]
    fn swapped_scale_bits_or_halves_are_caught() {
        let mut rng = ChaCha8Rng::seed_from_u64(45);
        let x = gaussian(&mut rng, 1.0);
        let mut q = [0u8; IQ4_XS_BYTES];
        quantize_iq4_xs(&x, &mut q);
        let mut halves = q;
        for b in &mut halves[8..] {
            *b = b.rotate_left(4);
        }
        assert!(stored_error(&x, &halves) > 0.5);
        let mut scales = q;
        scales[4..8].iter_mut().for_each(|b| *b = b.rotate_left(4));
        assert!(stored_error(&x, &scales) > 0.1);
    }

    #[test]
    fn zeros_and_lone_values_survive() {
        let mut x = [0f32; QK_K];
        let mut q = [0u8; IQ4_XS_BYTES];
        quantize_iq4_xs(&x, &mut q);
        let mut back = [1f32; QK_K];
        dequant_iq4_xs(&q, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        x[37] = -5.0;
        x[200] = 0.25;
        quantize_iq4_xs(&x, &mut q);
        dequant_iq4_xs(&q, &mut back);
        assert!((back[37] + 5.0).abs() < 0.05 && (back[200] - 0.25).abs() < 0.01);
        // The level nearest zero is 1 (of −127 … 113): a zero next to a large value in
        // its sub-block comes back as one step of that sub-block's scale at most.
        let tiny = (back[37] / 127.0).abs() * 1.01;
        assert!(back
            .iter()
            .enumerate()
            .all(|(i, &v)| i == 37 || i == 200 || v.abs() <= tiny));
    }
}
