//! Quantization to Q4_K and Q5_K, the k-quants with an affine map per 32-element sub-block.
//! The `gguf` package has no quantizer for them to match, so these are judged by their
//! error (see the tests), not by bits.
//!
//! Each 32-element sub-block gets the affine map `x ≈ s·q − o` (`q` in 0..=15 for Q4_K,
//! 0..=31 for Q5_K; `s, o ≥ 0`) with the least squared error that a few rounds of "round to the grid, refit `s` and `o` by
//! least squares" find, starting from the min/max map. The eight `s` and `o` are then stored
//! as 6-bit multiples of the f16 super-block factors `d = max s / 63` and `dmin = max o / 63`,
//! and the quants are chosen against the scales as stored.

use crate::dequant::{f16_to_f32, f32_to_f16, Q4_K_BYTES, Q5_K_BYTES, QK_K};

const REFINE_ROUNDS: usize = 6;

/// An affine map `x ≈ scale·q − offset` onto the quants 0..=`top`.
#[derive(Clone, Copy)]
pub(super) struct Affine {
    pub(super) scale: f32,
    pub(super) offset: f32,
    pub(super) top: f32,
}

impl Affine {
    pub(super) fn quant(self, x: f32) -> u8 {
        if self.scale == 0.0 {
            return 0;
        }
        let v = ((x + self.offset) / self.scale).clamp(0.0, self.top);
        // Adding 1.5·2²³ leaves the nearest integer (ties to even) in the low mantissa bits,
        // exactly for 0 ≤ v ≤ 31; `round` would be a libm call on baseline x86-64, and this
        // is the innermost loop of the fit.
        ((v + 12_582_912.0).to_bits() & 0x3f) as u8
    }

    /// Assigns each of `xs` its quant under this map, into `qs`, and returns the squared
    /// error. (The quants are kept: the next refit starts from them.)
    fn assign(self, xs: &[f32], qs: &mut [u8]) -> f64 {
        let mut err = 0.0;
        for (q, &x) in qs.iter_mut().zip(xs) {
            *q = self.quant(x);
            let r = f64::from(self.scale * f32::from(*q) - self.offset - x);
            err += r * r;
        }
        err
    }
}

/// The least-squares `(scale, offset)` for the quants `qs` of `xs`, with the offset held at
/// zero when the free fit would make it negative.
fn refit(xs: &[f32], qs: &[u8], top: f32) -> Option<Affine> {
    let n = xs.len() as f64;
    let (mut sq, mut sqq, mut sx, mut sqx) = (0.0, 0.0, 0.0, 0.0);
    for (&q, &x) in qs.iter().zip(xs) {
        let (q, x) = (f64::from(q), f64::from(x));
        sq += q;
        sqq += q * q;
        sx += x;
        sqx += q * x;
    }
    let det = n * sqq - sq * sq;
    if det <= 0.0 {
        return None;
    }
    let mut scale = (n * sqx - sq * sx) / det;
    let mut offset = (scale * sq - sx) / n;
    if offset < 0.0 {
        offset = 0.0;
        scale = sqx / sqq;
    }
    (scale > 0.0).then_some(Affine {
        scale: scale as f32,
        offset: offset as f32,
        top,
    })
}

/// The map of one sub-block (of up to 32 elements) onto 0..=`top`.
pub(super) fn fit_sub_block(xs: &[f32], top: f32) -> Affine {
    let lo = xs.iter().fold(0.0f32, |m, &x| m.min(x));
    let hi = xs.iter().fold(lo, |m, &x| m.max(x));
    let mut best = Affine {
        scale: (hi - lo) / top,
        offset: -lo,
        top,
    };
    let mut qs = [0u8; 32];
    let qs = &mut qs[..xs.len()];
    let mut best_err = best.assign(xs, qs);
    for _ in 0..REFINE_ROUNDS {
        let Some(next) = refit(xs, qs, top) else {
            break;
        };
        let err = next.assign(xs, qs);
        if err < best_err {
            best = next;
            best_err = err;
        }
    }
    best
}

/// The 6-bit multiplier of `factor` closest to `value`.
fn six_bit(value: f32, factor: f32) -> u8 {
    if factor == 0.0 {
        return 0;
    }
    (value / factor).round().clamp(0.0, 63.0) as u8
}

/// Packs eight 6-bit scales and mins into 12 bytes; the inverse of
/// [`crate::dequant::unpack_k_scales`].
fn pack_k_scales(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = scales[j] | ((scales[j + 4] >> 4) << 6);
        s[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6);
        s[j + 8] = (scales[j + 4] & 0x0f) | ((mins[j + 4] & 0x0f) << 4);
    }
    s
}

/// A super-block's stored maps: the f16 factors, the 6-bit scales and minimums (packed as
/// the format stores them), and each sub-block's map as the dequantizer forms it.
struct SuperBlock {
    d_bits: u16,
    dmin_bits: u16,
    packed: [u8; 12],
    stored: [Affine; 8],
}

/// Fits the eight sub-blocks of `x` onto 0..=`top` and stores their maps.
fn fit_super_block(x: &[f32; QK_K], top: f32) -> SuperBlock {
    let subs = x.as_chunks::<32>().0;
    let fits: [Affine; 8] = std::array::from_fn(|j| fit_sub_block(&subs[j], top));
    let max_scale = fits.iter().fold(0.0f32, |m, f| m.max(f.scale));
    let max_offset = fits.iter().fold(0.0f32, |m, f| m.max(f.offset));
    let d_bits = f32_to_f16(max_scale / 63.0);
    let dmin_bits = f32_to_f16(max_offset / 63.0);
    let (d, dmin) = (f16_to_f32(d_bits), f16_to_f32(dmin_bits));
    let scales: [u8; 8] = std::array::from_fn(|j| six_bit(fits[j].scale, d));
    let mins: [u8; 8] = std::array::from_fn(|j| six_bit(fits[j].offset, dmin));
    // The same products the dequantizer forms, so the quants are chosen against the maps
    // as stored.
    let stored = std::array::from_fn(|j| Affine {
        scale: d * f32::from(scales[j]),
        offset: dmin * f32::from(mins[j]),
        top,
    });
    SuperBlock {
        d_bits,
        dmin_bits,
        packed: pack_k_scales(&scales, &mins),
        stored,
    }
}

impl SuperBlock {
    /// The header both formats open with: `d`, `dmin`, the packed scales.
    fn write_header(&self, out: &mut [u8]) {
        out[0..2].copy_from_slice(&self.d_bits.to_le_bytes());
        out[2..4].copy_from_slice(&self.dmin_bits.to_le_bytes());
        out[4..16].copy_from_slice(&self.packed);
    }
}

/// Quantizes one Q4_K super-block. Inputs must be finite; the caller checks that `d` and
/// `dmin` came out finite.
pub fn quantize_q4_k(x: &[f32; QK_K], out: &mut [u8; Q4_K_BYTES]) {
    let block = fit_super_block(x, 15.0);
    block.write_header(out);
    let qs = &mut out[16..];
    qs.fill(0);
    for (i, &v) in x.iter().enumerate() {
        let j = i / 32;
        qs[32 * (i / 64) + i % 32] |= block.stored[j].quant(v) << (4 * (j % 2));
    }
}

/// Quantizes one Q5_K super-block: Q4_K's nibbles, and each quant's fifth bit in bit
/// `i / 32` of `qh[i mod 32]`. Inputs must be finite; the caller checks that `d` and `dmin`
/// came out finite.
pub fn quantize_q5_k(x: &[f32; QK_K], out: &mut [u8; Q5_K_BYTES]) {
    let block = fit_super_block(x, 31.0);
    block.write_header(out);
    out[16..].fill(0);
    for (i, &v) in x.iter().enumerate() {
        let j = i / 32;
        let q = block.stored[j].quant(v);
        out[16 + i % 32] |= (q >> 4) << j;
        out[48 + 32 * (i / 64) + i % 32] |= (q & 0x0f) << (4 * (j % 2));
    }
}
