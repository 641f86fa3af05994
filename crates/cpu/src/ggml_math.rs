//! f32 functions as llama.cpp's CPU path (ggml's x86 AVX2 build) evaluates them, for
//! [`crate::Arithmetic::GgmlRounding`]: where its results differ from the plain formulas in
//! the last bits, they are reproduced, since the 8-bit rounding of the next product can turn
//! one bit into a different quantized value.

use crate::real::Real;

/// `e^x` as ggml's vector code approximates it (within 1.5 ulp of the exact value): with
/// `n = round(x·log2 e)`, `b = x − n·ln 2` (ln 2 in two parts), `e^b ≈ 1 + c0·b + c1·b² + … +
/// c4·b⁵` and the result `2ⁿ·e^b`, built from the exponent bits; `|n| > 126` scales in two
/// steps, `|n| > 192` saturates to 0 or infinity.
pub(crate) fn exp(x: f32) -> f32 {
    // 1.5·2²³: adding it rounds a float below 2²² to an integer, left in the low bits.
    let shift = f32::from_bits(0x4b40_0000);
    let log2_e = f32::from_bits(0x3fb8_aa3b);
    let ln2_hi = f32::from_bits(0x3f31_7200);
    let ln2_lo = f32::from_bits(0x35bf_be8e);
    let c = [
        0x3f7f_fff6,
        0x3eff_fedb,
        0x3e2a_af33,
        0x3d2b_9f17,
        0x3c07_2010,
    ]
    .map(f32::from_bits);

    let z = x.mul_add(log2_e, shift);
    let n = z - shift;
    let b = (-n).mul_add(ln2_lo, (-n).mul_add(ln2_hi, x));
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let j = c[4]
        .mul_add(b, c[3])
        .mul_add(u, c[2].mul_add(b, c[1]))
        .mul_add(u, c[0] * b);
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `gate ← silu(gate)·up`, as ggml's `swiglu`: eight elements at a time with [`exp`], the
/// remainder with the C library's `expf`.
pub(crate) fn swiglu<T: Real>(gate: &mut [T], up: &[T]) {
    let vectored = gate.len() - gate.len() % 8;
    for (i, (g, u)) in gate.iter_mut().zip(up).enumerate() {
        let x = g.to_f32();
        let e = if i < vectored {
            exp(0.0 - x)
        } else {
            (-x).exp()
        };
        *g = T::from_f32(x / (1.0 + e) * u.to_f32());
    }
}

/// RMSNorm as ggml computes it: the f32 squares summed in f64, their mean rounded to f32,
/// `scale = 1/sqrt(mean + eps)` in f32, then `(x·scale)·weight`.
pub(crate) fn rms_norm<T: Real>(x: &mut [T], weight: &[T], eps: f64) {
    let sum: f64 = x
        .iter()
        .map(|v| {
            let v = v.to_f32();
            f64::from(v * v)
        })
        .sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps as f32).sqrt();
    for (v, w) in x.iter_mut().zip(weight) {
        *v = T::from_f32(v.to_f32() * scale * w.to_f32());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within 2 ulp of `e^x` (1.45 for the approximation, 0.5 for rounding) over f32's
    /// normal range, 0 far below it and infinity far above.
    #[test]
    fn exp_is_close_to_the_exact_exponential() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = f64::from(exp(x));
            let ulp = 2f64.powi(want.log2().floor() as i32 - 23);
            assert!(
                (got - want).abs() <= 2.0 * ulp,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(200.0), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }
}
