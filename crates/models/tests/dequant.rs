//! Dequantization against the `gguf` Python package, bit for bit (fixtures from
//! scripts/fixtures/gguf/make_fixtures.py: seeded random bytes with finite block scales).

mod common;

use common::{assert_bits_eq, read_qfx};
use quench_models::dequant::{dequant_q4_k, dequantize, dequantize_into, Q4_K_BYTES};
use quench_models::{GgmlType, ModelError};

const TYPES: [&str; 22] = [
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
    "Q6_K", "IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M",
];

#[test]
fn every_type_matches_the_gguf_package_bit_for_bit() {
    for name in TYPES {
        let fx = read_qfx(&format!("dequant/{name}.qfx"));
        assert_eq!(fx.ggml_type.name(), name);
        assert!(fx.values.len() >= 2048, "{name}: fixture too small");
        let got = dequantize(fx.ggml_type, &fx.bytes, fx.values.len()).unwrap();
        assert_bits_eq(name, &got, &fx.values);
    }
}

#[test]
fn plain_fixtures_include_nan_payloads() {
    // The F16 and BF16 fixtures are raw random bits, so they exercise NaN payload handling.
    for name in ["F16", "BF16", "F32"] {
        let fx = read_qfx(&format!("dequant/{name}.qfx"));
        assert!(
            fx.values.iter().any(|v| v.is_nan()),
            "{name}: no NaN in fixture"
        );
    }
}

#[test]
fn a_single_flipped_bit_is_detected() {
    // Control: the comparison above must be able to fail.
    let fx = read_qfx("dequant/Q4_K.qfx");
    let mut bytes = fx.bytes.clone();
    bytes[Q4_K_BYTES + 40] ^= 0x10; // a nibble in the second block
    let got = dequantize(GgmlType::Q4_K, &bytes, fx.values.len()).unwrap();
    let differing = got
        .iter()
        .zip(&fx.values)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differing, 1);
}

#[test]
fn block_functions_agree_with_the_dispatcher() {
    let fx = read_qfx("dequant/Q4_K.qfx");
    let block: &[u8; Q4_K_BYTES] = fx.bytes[..Q4_K_BYTES].try_into().unwrap();
    let mut out = [0f32; 256];
    dequant_q4_k(block, &mut out);
    assert_bits_eq("Q4_K block 0", &out, &fx.values[..256]);
}

#[test]
fn sizes_are_checked() {
    let fx = read_qfx("dequant/Q8_0.qfx");
    let err = dequantize(GgmlType::Q8_0, &fx.bytes[1..], fx.values.len()).unwrap_err();
    assert!(matches!(err, ModelError::SizeMismatch { .. }), "{err}");
    let err = dequantize(GgmlType::Q8_0, &fx.bytes, 33).unwrap_err();
    assert!(matches!(err, ModelError::BadShape { .. }), "{err}");
    // An absurd element count is refused before anything is allocated.
    let err = dequantize(GgmlType::F32, &[], usize::MAX / 8).unwrap_err();
    assert!(matches!(err, ModelError::SizeMismatch { .. }), "{err}");
    let mut out = vec![0f32; 31];
    assert!(dequantize_into(GgmlType::Q4_0, &[0; 18], &mut out).is_err());
}

#[test]
fn unsupported_types_are_refused_by_name() {
    let err = dequantize(GgmlType::TQ1_0, &[0u8; 54], 256).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ModelError::Unsupported { .. }));
    assert!(msg.contains("TQ1_0") && msg.contains("34"), "{msg}");
}

#[test]
fn a_stored_sign_bit_flips_its_weight_and_the_implied_eighth() {
    // Control for the i-quants' seven stored signs per eight weights: flipping stored sign
    // bit 2 of IQ2_XXS's first group changes weight 2 and weight 7 (whose sign keeps the
    // count of minus signs even), and nothing else.
    let fx = read_qfx("dequant/IQ2_XXS.qfx");
    let mut bytes = fx.bytes.clone();
    bytes[2 + 4] ^= 1 << 2; // the first sub-block's sign word, group 0, bit 2
    let got = dequantize(GgmlType::IQ2_XXS, &bytes, fx.values.len()).unwrap();
    let differing: Vec<usize> = (0..got.len())
        .filter(|&i| got[i].to_bits() != fx.values[i].to_bits())
        .collect();
    assert_eq!(differing, [2, 7]);
    assert_eq!(got[2], -fx.values[2]);
    assert_eq!(got[7], -fx.values[7]);
}
