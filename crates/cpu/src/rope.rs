//! Rotary position embedding.

use crate::real::Real;
use quench_models::arch::RopeStyle;

/// Cosines and sines for a run of consecutive positions, computed in f64.
pub(crate) struct RopeTable<T> {
    half: usize,
    cos: Vec<T>,
    sin: Vec<T>,
    /// Rotate as ggml's compiled code does: `a·cos − b·sin` and `a·sin + b·cos`, each with
    /// its `a` product fused (the other rounded first).
    fused: bool,
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
        RopeTable {
            half,
            cos,
            sin,
            fused: false,
        }
    }

    /// The table as ggml computes it ([`crate::Arithmetic::GgmlRounding`]): all in f32, the
    /// angle of pair `i` at position `p` is `p·s^i` with `s = base^(−2/head_dim)`, the power
    /// built by repeated multiplication, divided by the pair's frequency factor when the
    /// model has them.
    pub(crate) fn ggml(
        base: f32,
        head_dim: usize,
        factors: Option<&[f32]>,
        start: usize,
        count: usize,
    ) -> Self {
        let half = head_dim / 2;
        let step = base.powf(-2.0 / head_dim as f32);
        let mut cos = Vec::with_capacity(count * half);
        let mut sin = Vec::with_capacity(count * half);
        for p in start..start + count {
            let mut theta = p as f32;
            for i in 0..half {
                let angle = factors.map_or(theta, |f| theta / f[i]);
                cos.push(T::from_f32(angle.cos()));
                sin.push(T::from_f32(angle.sin()));
                theta *= step;
            }
        }
        RopeTable {
            half,
            cos,
            sin,
            fused: true,
        }
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
            if self.fused {
                let (a, b, c, s) = (a.to_f32(), b.to_f32(), cos[i].to_f32(), sin[i].to_f32());
                head[ia] = T::from_f32(a.mul_add(c, -(b * s)));
                head[ib] = T::from_f32(a.mul_add(s, b * c));
            } else {
                head[ia] = a * cos[i] - b * sin[i];
                head[ib] = a * sin[i] + b * cos[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quench_models::arch::{rope_frequencies, Arch, ModelConfig};

    fn plain_config() -> ModelConfig {
        ModelConfig {
            arch: Arch::Llama,
            hidden: 1024,
            layers: 1,
            heads: 16,
            kv_heads: 4,
            head_dim: 64,
            ffn: 4096,
            vocab: 1000,
            max_positions: 4096,
            norm_eps: 1e-5,
            rope_theta: 100_000.0,
            rope_scaling: None,
            rope_style: RopeStyle::Adjacent,
            tied_embeddings: false,
            qkv_bias: false,
            qk_norm: false,
            type_vocab: 0,
        }
    }

    /// ggml's f32 angles (repeated products) stay within f32 rounding of the f64 ones, and
    /// its rotation within a few ulp of the plain one.
    #[test]
    fn ggml_angles_and_rotation_are_f32_roundings_of_the_exact_ones() {
        let config = plain_config();
        let exact = RopeTable::<f64>::new(&rope_frequencies(&config, None), 0, 256);
        let ggml = RopeTable::<f32>::ggml(100_000.0, 64, None, 0, 256);
        let plain = RopeTable::<f32>::new(&rope_frequencies(&config, None), 0, 256);
        for (i, (e, g)) in exact.cos.iter().zip(&ggml.cos).enumerate() {
            // The angle's relative error grows by an ulp a pair: ≤ 33·2⁻²⁴·255.
            assert!((e - f64::from(*g)).abs() <= 5e-4, "cos {i}: {e} vs {g}");
        }
        assert_ne!(ggml.cos, plain.cos, "ggml's angles are the f64 ones");
        let head: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut a, mut b) = (head.clone(), head);
        let mut plain_at = RopeTable::<f32>::ggml(100_000.0, 64, None, 200, 1);
        plain_at.fused = false;
        RopeTable::<f32>::ggml(100_000.0, 64, None, 200, 1).rotate(&mut a, 0, RopeStyle::Adjacent);
        plain_at.rotate(&mut b, 0, RopeStyle::Adjacent);
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= 4.0 * f32::EPSILON, "{x} vs {y}");
        }
    }

    #[test]
    fn both_pairings_rotate_by_the_same_angles() {
        let freqs = [1.0, 0.1];
        let table = RopeTable::<f64>::new(&freqs, 3, 2);
        // Position 4 (offset 1): angles 4 and 0.4.
        let mut half = [1.0, 2.0, 3.0, 4.0]; // pairs (1, 3) and (2, 4)
        let mut adjacent = [1.0, 3.0, 2.0, 4.0]; // the same pairs, adjacent
        table.rotate(&mut half, 1, RopeStyle::HalfSplit);
        table.rotate(&mut adjacent, 1, RopeStyle::Adjacent);
        let rot = |a: f64, b: f64, t: f64| (a * t.cos() - b * t.sin(), a * t.sin() + b * t.cos());
        let (a0, b0) = rot(1.0, 3.0, 4.0);
        let (a1, b1) = rot(2.0, 4.0, 0.4);
        assert_eq!(half, [a0, a1, b0, b1]);
        assert_eq!(adjacent, [a0, b0, a1, b1]);
    }
}
