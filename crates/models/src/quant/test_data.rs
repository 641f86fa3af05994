//! What the quantizers' tests share: Gaussian weights and the relative error of a round trip.

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::dequant::QK_K;

/// A super-block of Gaussian weights of standard deviation `scale` (Box–Muller).
pub(super) fn gaussian(rng: &mut ChaCha8Rng, scale: f32) -> [f32; QK_K] {
    std::array::from_fn(|_| {
        let (u, v): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen());
        scale * (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    })
}

/// RMS of `back − x` over RMS of `x`.
pub(super) fn relative_rms(x: &[f32; QK_K], back: &[f32; QK_K]) -> f64 {
    let err: f64 = x
        .iter()
        .zip(back)
        .map(|(&a, &b)| f64::from(a - b).powi(2))
        .sum();
    let norm: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
    (err / norm).sqrt()
}
