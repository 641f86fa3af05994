//! Quantization: Q8_0, Q4_0, F16 and BF16 bit-exact with `gguf.quants.quantize`; Q4_K (which
//! the package does not implement) judged by its error.

mod common;

use common::read_qfx;
use quench_models::dequant::{dequantize, f16_to_f32, unpack_k_scales};
use quench_models::quant::quantize;
use quench_models::{GgmlType, ModelError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[test]
fn matches_the_gguf_package_byte_for_byte() {
    for name in ["Q8_0", "Q4_0", "F16", "BF16"] {
        let fx = read_qfx(&format!("quant/{name}.qfx"));
        // Block types refuse non-finite input; those fixtures have none.
        let got = quantize(fx.ggml_type, &fx.values).unwrap();
        assert_eq!(got.len(), fx.bytes.len(), "{name}");
        let bs = fx.ggml_type.type_size() as usize;
        for (b, (g, w)) in got.chunks(bs).zip(fx.bytes.chunks(bs)).enumerate() {
            assert_eq!(g, w, "{name}: block {b} differs");
        }
    }
}

#[test]
fn a_changed_input_is_detected() {
    let fx = read_qfx("quant/Q8_0.qfx");
    let mut x = fx.values.clone();
    x[100] = x[100] * 0.5 + 1e-3;
    assert_ne!(quantize(GgmlType::Q8_0, &x).unwrap(), fx.bytes);
}

fn gaussian(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    // Box–Muller; plenty for a test distribution.
    (0..n)
        .map(|_| {
            let (u, v): (f64, f64) = (rng.gen_range(1e-12..1.0), rng.gen());
            ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
        })
        .collect()
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
}

/// Mean and largest relative RMS error per super-block of `ty`'s round trip over weights of
/// varied magnitudes, some offset.
fn k_quant_error(ty: GgmlType) -> (f64, f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let mut x = gaussian(&mut rng, 256 * 64);
    // Give every super-block its own magnitude and some an offset, as real weights have.
    for (b, block) in x.chunks_mut(256).enumerate() {
        let scale = 10f32.powf(rng.gen_range(-3.0..1.0));
        let shift = if b % 4 == 0 { 2.0 * scale } else { 0.0 };
        block.iter_mut().for_each(|v| *v = *v * scale + shift);
    }
    let q = quantize(ty, &x).unwrap();
    let y = dequantize(ty, &q, x.len()).unwrap();
    let rel: Vec<f64> = x
        .chunks(256)
        .zip(y.chunks(256))
        .map(|(xb, yb)| {
            let err: Vec<f32> = xb.iter().zip(yb).map(|(a, b)| a - b).collect();
            rms(&err) / rms(xb)
        })
        .collect();
    let mean = rel.iter().sum::<f64>() / rel.len() as f64;
    let max = rel.iter().fold(0.0f64, |m, &r| m.max(r));
    (mean, max)
}

#[test]
fn q4_k_error_is_small() {
    let (mean, max) = k_quant_error(GgmlType::Q4_K);
    // On this data the least-squares fit gives mean 0.0636, max 0.0807 (relative RMS error per
    // super-block); the min/max map it starts from gives 0.0681 and 0.0878, and a layout bug
    // gives errors near 1. The bounds sit between the fit and its starting point.
    assert!(
        mean < 0.066 && max < 0.085,
        "relative RMS error: mean {mean:.4}, max {max:.4}"
    );
}

#[test]
fn q5_k_error_is_small() {
    let (mean, max) = k_quant_error(GgmlType::Q5_K);
    // Twice Q4_K's levels, about half its error: mean 0.0321, max 0.0414 on this data (a
    // layout bug gives errors near 1).
    assert!(
        mean < 0.034 && max < 0.044,
        "relative RMS error: mean {mean:.4}, max {max:.4}"
    );
}

#[test]
fn q4_k_and_q5_k_pick_the_nearest_grid_point_of_the_stored_scales() {
    for (ty, bytes, levels) in [(GgmlType::Q4_K, 144, 16u8), (GgmlType::Q5_K, 176, 32)] {
        nearest_grid_point(ty, bytes, levels);
    }
}

fn nearest_grid_point(ty: GgmlType, bytes: usize, levels: u8) {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let x = gaussian(&mut rng, 256 * 8);
    let q = quantize(ty, &x).unwrap();
    let y = dequantize(ty, &q, x.len()).unwrap();
    for (b, block) in q.chunks(bytes).enumerate() {
        let f16 = |at: usize| f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]));
        let (d, dmin) = (f16(0), f16(2));
        let (scales, mins) = unpack_k_scales(block[4..16].try_into().unwrap());
        for i in 0..256 {
            let (xi, yi) = (x[256 * b + i], y[256 * b + i]);
            let (s, m) = (
                d * f32::from(scales[i / 32]),
                dmin * f32::from(mins[i / 32]),
            );
            let best = (0..levels)
                .map(|q| (s * f32::from(q) - m - xi).abs())
                .fold(f32::INFINITY, f32::min);
            assert!(
                (yi - xi).abs() <= best * (1.0 + 1e-6),
                "{ty} block {b} element {i}: x {xi}, got {yi}, nearest is {best} away"
            );
        }
    }
}

#[test]
fn q4_k_reproduces_its_own_grid() {
    // Values already on a Q4_K grid quantize back (near-)exactly.
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let x = gaussian(&mut rng, 256 * 4);
    let y = dequantize(
        GgmlType::Q4_K,
        &quantize(GgmlType::Q4_K, &x).unwrap(),
        x.len(),
    )
    .unwrap();
    let z = dequantize(
        GgmlType::Q4_K,
        &quantize(GgmlType::Q4_K, &y).unwrap(),
        y.len(),
    )
    .unwrap();
    let err: Vec<f32> = y.iter().zip(&z).map(|(a, b)| a - b).collect();
    assert!(
        rms(&err) / rms(&y) < 0.02,
        "requantization drifted: {}",
        rms(&err) / rms(&y)
    );
}

#[test]
fn zeros_and_constants() {
    for ty in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ] {
        let n = ty.block_size() as usize;
        for c in [0.0f32, 1.5, -2.0] {
            let x = vec![c; n];
            let y = dequantize(ty, &quantize(ty, &x).unwrap(), n).unwrap();
            for v in &y {
                assert!(
                    (v - c).abs() <= c.abs() * 0.01,
                    "{ty} constant {c}: got {v}"
                );
            }
        }
    }
}

#[test]
fn bad_input_is_refused() {
    let mut x = vec![0.5f32; 256];
    x[17] = f32::NAN;
    let err = quantize(GgmlType::Q4_K, &x).unwrap_err();
    assert!(
        matches!(err, ModelError::Quantize { .. }) && err.to_string().contains("element 17"),
        "{err}"
    );
    let err = quantize(GgmlType::Q8_0, &[1e9; 32]).unwrap_err();
    assert!(err.to_string().contains("too large"), "{err}");
    let err = quantize(GgmlType::Q4_0, &[0.0; 31]).unwrap_err();
    assert!(err.to_string().contains("whole number of blocks"), "{err}");
    let err = quantize(GgmlType::IQ2_XXS, &[0.0; 256]).unwrap_err();
    assert!(
        matches!(err, ModelError::Unsupported { .. }) && err.to_string().contains("IQ2_XXS"),
        "{err}"
    );
}
