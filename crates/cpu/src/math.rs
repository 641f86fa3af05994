//! Elementwise and row operations shared by every architecture.

use crate::real::Real;

/// Dot product with eight independent partial sums, so that the compiler can keep them in
/// vector registers (a single running sum forbids the reordering that vectorizing needs).
pub fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    assert_eq!(a.len(), b.len(), "dot: lengths differ");
    let mut acc = [T::ZERO; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = T::ZERO;
    for (x, y) in ra.iter().zip(rb) {
        tail += *x * *y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `a` dotted with each of four vectors at once, each summed in [`dot`]'s order (the same
/// bits). A dot product's eight partial sums form one chain of dependent additions, which
/// leaves the vector units waiting on their own latency; four independent chains keep them
/// busy, and `a` is read once for all four. Lengths must be equal.
pub fn dot4<T: Real>(a: &[T], bs: [&[T]; 4]) -> [T; 4] {
    for b in bs {
        assert_eq!(a.len(), b.len(), "dot4: lengths differ");
    }
    if let (Some(a), [Some(b0), Some(b1), Some(b2), Some(b3)]) = (T::as_f32(a), bs.map(T::as_f32)) {
        if let Some(sums) = simd::dot4_f32(a, [b0, b1, b2, b3]) {
            return sums.map(T::from_f32);
        }
    }
    bs.map(|b| dot(a, b))
}

/// [`dot4`] in AVX, where the CPU has it.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    /// `None` where the CPU lacks AVX. Lengths are equal (checked by the caller).
    pub(super) fn dot4_f32(a: &[f32], bs: [&[f32]; 4]) -> Option<[f32; 4]> {
        if !is_x86_feature_detected!("avx") {
            return None;
        }
        // SAFETY: the CPU has AVX, the only requirement of the function.
        Some(unsafe { dot4_avx(a, bs) })
    }

    #[target_feature(enable = "avx")]
    fn dot4_avx(a: &[f32], bs: [&[f32]; 4]) -> [f32; 4] {
        let whole = a.len() - a.len() % 8;
        let mut acc = [_mm256_setzero_ps(); 4];
        for i in (0..whole).step_by(8) {
            // SAFETY: `i + 8 <= whole <= len` for `a` and every `b` (equal lengths); the
            // loads are unaligned.
            unsafe {
                let x = _mm256_loadu_ps(a.as_ptr().add(i));
                for (acc, b) in acc.iter_mut().zip(bs) {
                    let product = _mm256_mul_ps(x, _mm256_loadu_ps(b.as_ptr().add(i)));
                    *acc = _mm256_add_ps(*acc, product);
                }
            }
        }
        let mut out = [0.0f32; 4];
        for ((o, acc), b) in out.iter_mut().zip(acc).zip(bs) {
            let mut l = [0.0f32; 8];
            // SAFETY: `l` holds 8 f32, as an unaligned 256-bit store writes.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), acc) };
            let mut tail = 0.0f32;
            for (x, y) in a[whole..].iter().zip(&b[whole..]) {
                tail += *x * *y;
            }
            *o = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7])) + tail;
        }
        out
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod simd {
    pub(super) fn dot4_f32(_: &[f32], _: [&[f32]; 4]) -> Option<[f32; 4]> {
        None
    }
}

/// `x ← x / sqrt(mean(x²) + eps) · weight`.
pub fn rms_norm<T: Real>(x: &mut [T], weight: &[T], eps: f64) {
    let n = T::from_f64(x.len() as f64);
    let mean_sq = dot(x, x) / n;
    let scale = T::ONE / (mean_sq + T::from_f64(eps)).sqrt();
    for (v, w) in x.iter_mut().zip(weight) {
        *v = *v * scale * *w;
    }
}

/// `x ← (x − mean) / sqrt(var + eps) · weight + bias`, with the biased variance.
pub fn layer_norm<T: Real>(x: &mut [T], weight: &[T], bias: &[T], eps: f64) {
    let n = T::from_f64(x.len() as f64);
    let mut mean = T::ZERO;
    for v in x.iter() {
        mean += *v;
    }
    mean = mean / n;
    let mut var = T::ZERO;
    for v in x.iter() {
        let d = *v - mean;
        var += d * d;
    }
    var = var / n;
    let scale = T::ONE / (var + T::from_f64(eps)).sqrt();
    for ((v, w), b) in x.iter_mut().zip(weight).zip(bias) {
        *v = (*v - mean) * scale * *w + *b;
    }
}

/// Numerically stable softmax in place.
pub fn softmax<T: Real>(x: &mut [T]) {
    let mut max = x[0];
    for v in x.iter() {
        max = max.max(*v);
    }
    let mut sum = T::ZERO;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v = *v / sum;
    }
}

/// `x · sigmoid(x)`.
pub fn silu<T: Real>(x: T) -> T {
    x / (T::ONE + (-x).exp())
}

/// The exact GELU, `x/2 · (1 + erf(x/√2))`, evaluated in f64 for both precisions.
pub fn gelu<T: Real>(x: T) -> T {
    let x = x.to_f64();
    T::from_f64(0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)))
}

/// The error function to about 1e-15 relative accuracy.
///
/// Uses `erf(x) = 2/√π · e^(−x²) · Σₙ 2ⁿ x^(2n+1) / (1·3·…·(2n+1))`, whose terms are all of
/// one sign, so nothing cancels; past |x| = 6, erf is ±1 to within 2e-17.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    while term.abs() > 1e-17 * sum.abs() {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 / std::f64::consts::PI.sqrt() * (-x2).exp() * sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// One vector against four at once gives four [`dot`]s bit for bit, at every length
    /// (whole vectors of eight and tails), with values of many magnitudes so that the order
    /// shows.
    #[test]
    fn dot4_sums_in_dot_s_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let value =
            |rng: &mut ChaCha8Rng| rng.gen_range(-1.0f32..1.0) * 10f32.powi(rng.gen_range(-6..6));
        for n in 0..70 {
            let v: Vec<Vec<f32>> = (0..5)
                .map(|_| (0..n).map(|_| value(&mut rng)).collect())
                .collect();
            let bs: [&[f32]; 4] = std::array::from_fn(|k| v[k + 1].as_slice());
            let want = bs.map(|b| dot(&v[0], b).to_bits());
            assert_eq!(dot4(&v[0], bs).map(f32::to_bits), want, "length {n}");
        }
    }

    #[test]
    fn erf_matches_known_values() {
        // Values of erf from its definition, to 16 digits.
        let known = [
            (0.0, 0.0),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (-1.5, -0.9661051464753108),
        ];
        for (x, want) in known {
            let got = erf(x);
            assert!((got - want).abs() <= 1e-15, "erf({x}) = {got}, want {want}");
        }
        assert_eq!(erf(7.0), 1.0);
        assert_eq!(erf(-7.0), -1.0);
    }
}
