//! Rotary position embedding.

use crate::config::{Llama3Scaling, ModelConfig, RopeStyle};
use crate::real::Real;

/// The rotation frequency of each pair of a head, `θ^(−2i/d)` for `i < d/2`, after Llama 3
/// scaling when the config has it, and divided by `freq_factors` when given (GGUF stores
/// Llama 3 scaling precomputed as such factors in the `rope_freqs.weight` tensor).
pub fn rope_frequencies(config: &ModelConfig, freq_factors: Option<&[f64]>) -> Vec<f64> {
    let d = config.head_dim;
    (0..d / 2)
        .map(|i| {
            let base = config.rope_theta.powf(-2.0 * i as f64 / d as f64);
            let scaled = match &config.rope_scaling {
                Some(s) => llama3_scale(base, s),
                None => base,
            };
            match freq_factors {
                Some(f) => scaled / f[i],
                None => scaled,
            }
        })
        .collect()
}

/// Llama 3 keeps high frequencies, divides low ones by `factor`, and interpolates between the
/// two in the band whose wavelength lies between the two cut-offs.
fn llama3_scale(freq: f64, s: &Llama3Scaling) -> f64 {
    let original = s.original_max_positions as f64;
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    let low_freq_wavelen = original / s.low_freq_factor;
    let high_freq_wavelen = original / s.high_freq_factor;
    if wavelen < high_freq_wavelen {
        freq
    } else if wavelen > low_freq_wavelen {
        freq / s.factor
    } else {
        let smooth =
            (original / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * freq / s.factor + smooth * freq
    }
}

/// Cosines and sines for a run of consecutive positions, computed in f64.
pub(crate) struct RopeTable<T> {
    half: usize,
    cos: Vec<T>,
    sin: Vec<T>,
}

impl<T: Real> RopeTable<T> {
    pub(crate) fn new(freqs: &[f64], start: usize, count: usize) -> Self {
        let half = freqs.len();
        let mut cos = Vec::with_capacity(count * half);
        let mut sin = Vec::with_capacity(count * half);
        for p in start..start + count {
            for f in freqs {
                let angle = p as f64 * f;
                cos.push(T::from_f64(angle.cos()));
                sin.push(T::from_f64(angle.sin()));
            }
        }
        RopeTable { half, cos, sin }
    }

    /// Rotates one head of the token at offset `t` of this table's run.
    pub(crate) fn rotate(&self, head: &mut [T], t: usize, style: RopeStyle) {
        let cos = &self.cos[t * self.half..(t + 1) * self.half];
        let sin = &self.sin[t * self.half..(t + 1) * self.half];
        for i in 0..self.half {
            let (ia, ib) = match style {
                RopeStyle::HalfSplit => (i, i + self.half),
                RopeStyle::Adjacent => (2 * i, 2 * i + 1),
            };
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * cos[i] - b * sin[i];
            head[ib] = a * sin[i] + b * cos[i];
        }
    }
}
