//! Quantization to Q8_0 and Q4_0, bit-exact with the `gguf` package (which follows ggml's
//! reference quantizers): the scale is computed in f32 and stored rounded to f16, while the
//! quants are computed with the unrounded f32 inverse scale.

use crate::dequant::{f32_to_f16, Q4_0_BYTES, Q8_0_BYTES};

/// The inverse scale, zero for an all-zero block.
fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// `d = max|x| / 127`, `q = round(x / d)` with ties away from zero.
pub fn quantize_q8_0(x: &[f32; 32], out: &mut [u8; Q8_0_BYTES]) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse(d);
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    for (o, &v) in out[2..].iter_mut().zip(x) {
        *o = (v * id).round() as i8 as u8;
    }
}

/// `d = x[k] / −8` for the first `k` of largest magnitude (so that element maps to 0), then
/// `q = min(15, trunc(x / d + 8.5))`.
pub fn quantize_q4_0(x: &[f32; 32], out: &mut [u8; Q4_0_BYTES]) {
    let max = x[1..]
        .iter()
        .fold(x[0], |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -8.0;
    let id = inverse(d);
    out[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
    let q = |v: f32| ((v * id + 8.5).trunc() as u8).min(15);
    for j in 0..16 {
        out[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}
