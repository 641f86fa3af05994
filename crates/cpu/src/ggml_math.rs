//! f32 functions as llama.cpp's CPU path (ggml's x86 AVX2 or AVX-512 build) evaluates them,
//! for [`crate::Arithmetic::GgmlRounding`]: where its results differ from the plain formulas
//! in the last bits, they are reproduced, since the 8-bit rounding of the next product can
//! turn one bit into a different quantized value.

use crate::arithmetic::GgmlKernels;
use crate::blocks::sum_8_lanes;
use crate::real::Real;

/// `e^x` as ggml's vector code of `kernels` approximates it (within 1.5 ulp of the exact
/// value): with `n = round(x·log2 e)`, `b = x − n·ln 2` (ln 2 in two parts), `e^b ≈ 1 + c0·b +
/// c1·b² + … + c4·b⁵` and the result `2ⁿ·e^b`. The two builds round that polynomial and the
/// scaling differently.
pub(crate) fn exp(x: f32, kernels: GgmlKernels) -> f32 {
    let (z, n, b) = exp_reduced(x);
    match kernels {
        GgmlKernels::Avx2 => exp_avx2(z, n, b),
        GgmlKernels::Avx512 => exp_avx512(n, b),
    }
}

/// The polynomial's coefficients `c0 … c4`.
const EXP_C: [u32; 5] = [
    0x3f7f_fff6,
    0x3eff_fedb,
    0x3e2a_af33,
    0x3d2b_9f17,
    0x3c07_2010,
];

/// `z = x·log2 e + 1.5·2²³` (`n` in its low bits), `n = round(x·log2 e)` and `b = x − n·ln 2`,
/// as both builds compute them.
fn exp_reduced(x: f32) -> (f32, f32, f32) {
    // 1.5·2²³: adding it rounds a float below 2²² to an integer, left in the low bits.
    let shift = f32::from_bits(0x4b40_0000);
    let log2_e = f32::from_bits(0x3fb8_aa3b);
    let ln2_hi = f32::from_bits(0x3f31_7200);
    let ln2_lo = f32::from_bits(0x35bf_be8e);
    let z = x.mul_add(log2_e, shift);
    let n = z - shift;
    (z, n, (-n).mul_add(ln2_lo, (-n).mul_add(ln2_hi, x)))
}

/// AVX2: `e^b − 1` as the polynomial without its constant term, and `2ⁿ·(1 + that)` as one
/// fused step from the exponent bits; `|n| > 126` scales in two steps, `|n| > 192` saturates
/// to 0 or infinity.
fn exp_avx2(z: f32, n: f32, b: f32) -> f32 {
    let c = EXP_C.map(f32::from_bits);
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

/// AVX-512: `e^b` as the whole polynomial (its constant term added in the last fused step),
/// then scaled by `2ⁿ` exactly (`vscalefps`, which rounds only a result below f32's normal
/// range); `|n| > 192` saturates to 0 or infinity.
fn exp_avx512(n: f32, b: f32) -> f32 {
    let c = EXP_C.map(f32::from_bits);
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let j = c[4]
        .mul_add(b, c[3])
        .mul_add(u, c[2].mul_add(b, c[1]))
        .mul_add(u, c[0].mul_add(b, 1.0));
    // Exact in f64 (|n| ≤ 192), then rounded once to f32.
    (f64::from(j) * 2f64.powi(n as i32)) as f32
}

/// The sum of one vector register's lanes (8 or 16) as ggml adds them: AVX2's halves, then
/// halves again ([`sum_8_lanes`]); AVX-512's `_mm512_reduce_add_ps` (GCC's), which adds the
/// two 256-bit halves first, then as AVX2 but pairing lanes `j` and `j + 2` last.
pub(crate) fn sum_lanes(l: &[f32]) -> f32 {
    match l.len() {
        8 => sum_8_lanes(l.try_into().expect("8 lanes")),
        16 => {
            let t: [f32; 8] = std::array::from_fn(|i| l[i] + l[i + 8]);
            let u: [f32; 4] = std::array::from_fn(|j| t[j] + t[j + 4]);
            (u[0] + u[2]) + (u[1] + u[3])
        }
        n => unreachable!("{n} lanes"),
    }
}

/// `gate ← silu(gate)·up`, as ggml's `swiglu`: a vector register's width at a time with
/// [`exp`], the remainder with the C library's `expf`.
pub(crate) fn swiglu<T: Real>(gate: &mut [T], up: &[T], kernels: GgmlKernels) {
    let vectored = gate.len() - gate.len() % kernels.lanes();
    for (i, (g, u)) in gate.iter_mut().zip(up).enumerate() {
        let x = g.to_f32();
        let e = if i < vectored {
            exp(0.0 - x, kernels)
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
    /// normal range, 0 far below it and infinity far above; AVX-512's, which rounds the
    /// polynomial with its constant term before scaling, within 3. The two builds' results
    /// differ in the last bit for some inputs (else one of them is not ggml's). AVX-512's was
    /// compared with ggml's own `ggml_v_expf` (compiled with GCC 12) on 2.1 million inputs
    /// from −110 to 100: the same bits everywhere.
    #[test]
    fn exp_is_close_to_the_exact_exponential() {
        for kernels in [GgmlKernels::Avx2, GgmlKernels::Avx512] {
            let mut x = -87.0f32;
            while x < 88.0 {
                let want = (x as f64).exp();
                let got = f64::from(exp(x, kernels));
                let ulp = 2f64.powi(want.log2().floor() as i32 - 23);
                let bound = if kernels == GgmlKernels::Avx2 {
                    2.0
                } else {
                    3.0
                };
                assert!(
                    (got - want).abs() <= bound * ulp,
                    "{kernels:?}: exp({x}) = {got}, want {want}"
                );
                x += 0.0137;
            }
            assert_eq!(exp(0.0, kernels), 1.0);
            assert_eq!(exp(-200.0, kernels), 0.0);
            assert_eq!(exp(200.0, kernels), f32::INFINITY);
            assert_eq!(exp(f32::NEG_INFINITY, kernels), 0.0);
        }
        let differ = (0..10_000)
            .map(|i| -10.0 + i as f32 * 0.002)
            .filter(|&x| exp(x, GgmlKernels::Avx2) != exp(x, GgmlKernels::Avx512))
            .count();
        assert!(differ > 100, "only {differ} of 10000 differ");
    }

    /// Lanes that lose a 1 or keep it depending on the order they are added in (2²⁴ + 1
    /// rounds to 2²⁴): AVX2 adds lane 0 to lane 4, then that to lanes 2 + 6; AVX-512 adds
    /// lane 0 to lane 8 first.
    #[test]
    fn lanes_add_in_each_build_s_order() {
        let big = 16_777_216.0f32;
        let mut l = [0.0f32; 8];
        (l[0], l[1], l[2]) = (big, -big, 1.0);
        assert_eq!(sum_lanes(&l), 0.0);
        (l[1], l[4]) = (0.0, -big);
        assert_eq!(sum_lanes(&l), 1.0);
        let mut l = [0.0f32; 16];
        (l[0], l[4], l[8]) = (big, -big, 1.0);
        assert_eq!(sum_lanes(&l), 0.0);
        (l[4], l[8], l[2]) = (0.0, -big, 1.0);
        assert_eq!(sum_lanes(&l), 1.0);
    }
}
