//! The frequencies of rotary position embedding, as the model's config defines them.

use super::config::{Llama3Scaling, ModelConfig};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::{Arch, RopeStyle};

    fn llama31_config() -> ModelConfig {
        ModelConfig {
            arch: Arch::Llama,
            hidden: 4096,
            layers: 1,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            ffn: 14336,
            vocab: 128256,
            max_positions: 131072,
            norm_eps: 1e-5,
            rope_theta: 500_000.0,
            rope_scaling: Some(Llama3Scaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_positions: 8192,
            }),
            rope_style: RopeStyle::HalfSplit,
            tied_embeddings: false,
            qkv_bias: false,
            qk_norm: false,
            type_vocab: 0,
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_divides_low_and_blends_between() {
        let scaled_config = llama31_config();
        let plain_config = ModelConfig {
            rope_scaling: None,
            ..scaled_config.clone()
        };
        let scaled = rope_frequencies(&scaled_config, None);
        let plain = rope_frequencies(&plain_config, None);
        assert_eq!(plain.len(), 64);
        assert_eq!(plain[0], 1.0);
        let wavelen = |f: f64| 2.0 * std::f64::consts::PI / f;
        let mut blended = 0;
        for (s, p) in scaled.iter().zip(&plain) {
            let ratio = p / s;
            if wavelen(*p) < 2048.0 {
                assert_eq!(ratio, 1.0);
            } else if wavelen(*p) > 8192.0 {
                assert!((ratio - 8.0).abs() < 1e-12);
            } else {
                assert!(ratio > 1.0 && ratio < 8.0, "ratio {ratio}");
                blended += 1;
            }
        }
        assert!(blended > 0, "no frequency in the blended band");
        // Scaled frequencies still fall monotonically.
        assert!(scaled.windows(2).all(|w| w[0] > w[1]));

        // GGUF's precomputed divisors give the same frequencies.
        let divisors: Vec<f64> = plain.iter().zip(&scaled).map(|(p, s)| p / s).collect();
        let from_divisors = rope_frequencies(&plain_config, Some(&divisors));
        for (a, b) in from_divisors.iter().zip(&scaled) {
            assert!((a - b).abs() <= 1e-15 * b);
        }
    }
}
