//! Quantization to Q6_K, judged by its error (see the tests): the `gguf` package has no
//! Q6_K quantizer to match bit for bit.
//!
//! A super-block of 256 elements is 16 groups of 16, each `x ≈ s·q` with `q` in −32..=31.
//! Each group's `s` is the least-squares scale for the quants that the best of a few
//! candidate grids gives (the grid that puts the group's largest magnitude at −32, as the
//! type's asymmetric range allows, and grids a little wider or narrower). The sixteen `s`
//! are stored as signed 8-bit multiples of the f16 factor `d = max |s| / 127`, and the
//! quants are chosen against the scales as stored.
//!
//! Layout (210 bytes): `ql[128]` (low nibbles), `qh[64]` (high two bits), `scales[16]`
//! (i8), `d` (f16). Element `i` (`h = i / 128`, `e = i mod 128`) keeps its low nibble in
//! nibble `e / 64` of `ql[64h + e mod 64]` and its high bits in bits `2·(e / 32)` of
//! `qh[32h + i mod 32]`.

use crate::dequant::{f16_to_f32, f32_to_f16, Q6_K_BYTES, QK_K};

/// Offsets from the group's own grid tried, in tenths of a quant step.
const GRID_TRIES: std::ops::RangeInclusive<i32> = -9..=9;

/// `v` rounded to the nearest integer (ties to even), for `|v| < 2²²`: adding and taking
/// away 1.5·2²³ leaves it rounded; `round` would be a libm call on baseline x86-64.
pub(super) fn round(v: f32) -> f32 {
    (v + 12_582_912.0) - 12_582_912.0
}

/// Signed quants `−low..=low − 1`: Q6_K's −32..=31, Q3_K's −4..=3.
#[derive(Clone, Copy)]
pub(super) struct Levels {
    pub(super) low: i32,
}

impl Levels {
    const Q6_K: Levels = Levels { low: 32 };

    /// The quant of `x` on the grid of step `1 / inv`.
    pub(super) fn quant(self, x: f32, inv: f32) -> i8 {
        round(x * inv).clamp(-self.low as f32, (self.low - 1) as f32) as i8
    }
}

/// The least-squares scale of one group of 16 on `levels`: for each candidate grid, the
/// quants, then `s = Σ x·q / Σ q²`, keeping the one that explains most of the group
/// (`(Σ x·q)² / Σ q²`, which minimizes the squared error at the fitted scale).
pub(super) fn fit_group(xs: &[f32], levels: Levels) -> f32 {
    let peak = xs
        .iter()
        .fold(0.0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
    if peak == 0.0 {
        return 0.0;
    }
    let mut best = (0.0f64, 0.0f32);
    for t in GRID_TRIES {
        let inv = -(levels.low as f32 + 0.1 * t as f32) / peak;
        let (mut xq, mut qq) = (0.0f64, 0.0f64);
        for &x in xs {
            let q = f64::from(levels.quant(x, inv));
            xq += f64::from(x) * q;
            qq += q * q;
        }
        if qq > 0.0 && xq * xq / qq > best.0 {
            best = (xq * xq / qq, (xq / qq) as f32);
        }
    }
    best.1
}

/// Quantizes one super-block. Inputs must be finite; the caller checks that `d` came out
/// finite.
pub fn quantize_q6_k(x: &[f32; QK_K], out: &mut [u8; Q6_K_BYTES]) {
    let scales: [f32; 16] =
        std::array::from_fn(|g| fit_group(&x[16 * g..16 * g + 16], Levels::Q6_K));
    let max = scales.iter().fold(0.0f32, |m, s| m.max(s.abs()));
    let d_bits = f32_to_f16(max / 127.0);
    let d = f16_to_f32(d_bits);
    let stored: [i8; 16] = std::array::from_fn(|g| {
        if d == 0.0 {
            0
        } else {
            round(scales[g] / d).clamp(-128.0, 127.0) as i8
        }
    });

    out.fill(0);
    for (i, &v) in x.iter().enumerate() {
        // The product the dequantizer forms, so `q` is chosen against the stored scale.
        let step = d * f32::from(stored[i / 16]);
        let q = if step == 0.0 {
            0
        } else {
            Levels::Q6_K.quant(v, 1.0 / step)
        };
        let q = (q + 32) as u8;
        let (h, e) = (i / 128, i % 128);
        out[64 * h + e % 64] |= (q & 0x0f) << (4 * (e / 64));
        out[128 + 32 * h + i % 32] |= (q >> 4) << (2 * (e / 32));
    }
    for (o, s) in out[192..208].iter_mut().zip(stored) {
        *o = s as u8;
    }
    out[208..210].copy_from_slice(&d_bits.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dequant::dequant_q6_k;
    use crate::quant::test_data::{gaussian, relative_rms};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// RMS of the round trip's error over RMS of the data.
    fn relative_error(x: &[f32; QK_K]) -> f64 {
        let mut q = [0u8; Q6_K_BYTES];
        quantize_q6_k(x, &mut q);
        stored_error(x, &q)
    }

    /// RMS of the error of the stored block `q` against `x`, over RMS of `x`.
    fn stored_error(x: &[f32; QK_K], q: &[u8; Q6_K_BYTES]) -> f64 {
        let mut back = [0f32; QK_K];
        dequant_q6_k(q, &mut back);
        relative_rms(x, &back)
    }

    /// Six bits with a scale per 16 elements: a quant step of about a 32nd of a group's
    /// largest magnitude (~1.8 standard deviations for 16 Gaussian weights), so an error
    /// of ~1.6% of the data's RMS, a little more where the stored scales round. (Far
    /// smaller weights, RMS ~1e-3 and below, lose more: `d` falls among f16's subnormals.)
    #[test]
    fn the_round_trip_is_close_for_weights_of_any_scale() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        for scale in [0.005, 0.02, 1.0, 300.0] {
            for _ in 0..50 {
                let x = gaussian(&mut rng, scale);
                let e = relative_error(&x);
                assert!(e < 0.025, "scale {scale}: relative error {e}");
            }
        }
    }

    /// A wrong layout round-trips badly: the dequantizer is independent of the quantizer,
    /// so the test above fails for it.
    #[test]
    fn a_swapped_high_bit_layout_is_caught() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let x = gaussian(&mut rng, 1.0);
        let mut q = [0u8; Q6_K_BYTES];
        quantize_q6_k(&x, &mut q);
        // Swap the high bits of the first two 32-element runs.
        for b in &mut q[128..192] {
            let (a, c) = (*b & 3, (*b >> 2) & 3);
            *b = (*b & 0xf0) | (a << 2) | c;
        }
        assert!(stored_error(&x, &q) > 0.2);
    }

    #[test]
    fn zeros_and_lone_values_survive() {
        let mut x = [0f32; QK_K];
        let mut q = [0u8; Q6_K_BYTES];
        quantize_q6_k(&x, &mut q);
        let mut back = [1f32; QK_K];
        dequant_q6_k(&q, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
        x[37] = -5.0;
        x[200] = 0.25;
        quantize_q6_k(&x, &mut q);
        dequant_q6_k(&q, &mut back);
        assert!((back[37] + 5.0).abs() < 0.05 && (back[200] - 0.25).abs() < 0.01);
        assert!(back
            .iter()
            .enumerate()
            .all(|(i, &v)| i == 37 || i == 200 || v == 0.0));
    }
}
