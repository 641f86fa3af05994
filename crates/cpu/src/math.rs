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
