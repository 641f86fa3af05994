//! Dequantization of ggml tensor data to f32, bit-exact with the `gguf` Python package.

mod floats;
mod iq_grids;
mod iquants;
mod kquants;
mod legacy;

pub use floats::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
pub use iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
pub use iquants::{
    dequant_iq1_m, dequant_iq1_s, dequant_iq2_s, dequant_iq2_xs, dequant_iq2_xxs, dequant_iq3_s,
    dequant_iq3_xxs, dequant_iq4_nl, dequant_iq4_xs, even_signs, IQ1_DELTA, IQ1_M_BYTES,
    IQ1_S_BYTES, IQ2_S_BYTES, IQ2_XS_BYTES, IQ2_XXS_BYTES, IQ3_S_BYTES, IQ3_XXS_BYTES, IQ4_LEVELS,
    IQ4_NL_BYTES, IQ4_XS_BYTES,
};
pub use kquants::{
    dequant_q2_k, dequant_q3_k, dequant_q4_k, dequant_q5_k, dequant_q6_k, unpack_k_scales,
    unpack_q3_k_scales, Q2_K_BYTES, Q3_K_BYTES, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, QK_K,
};
pub use legacy::{
    dequant_q4_0, dequant_q4_1, dequant_q5_0, dequant_q5_1, dequant_q8_0, Q4_0_BYTES, Q4_1_BYTES,
    Q5_0_BYTES, Q5_1_BYTES, Q8_0_BYTES,
};

use crate::{GgmlType, ModelError};

/// The f16 stored little-endian at `block[at..at + 2]`, as f32.
fn f16_at(block: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([block[at], block[at + 1]]))
}

/// Dequantizes `n` elements of `ggml_type` stored in `bytes`, which must be exactly their size.
pub fn dequantize(ggml_type: GgmlType, bytes: &[u8], n: usize) -> Result<Vec<f32>, ModelError> {
    // Validate before allocating: `n` may come from a file.
    check_size(ggml_type, bytes, n)?;
    let mut out = vec![0.0; n];
    dequantize_into(ggml_type, bytes, &mut out)?;
    Ok(out)
}

/// Dequantizes into `out`; `bytes` must be exactly the size of `out.len()` elements.
pub fn dequantize_into(
    ggml_type: GgmlType,
    bytes: &[u8],
    out: &mut [f32],
) -> Result<(), ModelError> {
    check_size(ggml_type, bytes, out.len())?;
    let expand = expander(ggml_type).ok_or_else(|| ModelError::Unsupported {
        what: format!(
            "dequantization of ggml type {ggml_type} (id {})",
            ggml_type.id()
        ),
    })?;
    expand(bytes, out);
    Ok(())
}

/// Whether [`dequantize_into`] expands tensors of `ggml_type`.
pub fn dequantizes(ggml_type: GgmlType) -> bool {
    expander(ggml_type).is_some()
}

/// Expands a type's bytes into f32, sizes checked by the caller.
type Expand = fn(&[u8], &mut [f32]);

/// How a type's bytes become f32; `None` for types quench does not dequantize.
fn expander(ggml_type: GgmlType) -> Option<Expand> {
    Some(match ggml_type {
        GgmlType::F32 => |b, o| elements(b, o, |b: [u8; 4]| f32::from_le_bytes(b)),
        GgmlType::F16 => |b, o| elements(b, o, |b: [u8; 2]| f16_to_f32(u16::from_le_bytes(b))),
        GgmlType::BF16 => |b, o| elements(b, o, |b: [u8; 2]| bf16_to_f32(u16::from_le_bytes(b))),
        GgmlType::Q4_0 => |b, o| blocks(b, o, dequant_q4_0),
        GgmlType::Q4_1 => |b, o| blocks(b, o, dequant_q4_1),
        GgmlType::Q5_0 => |b, o| blocks(b, o, dequant_q5_0),
        GgmlType::Q5_1 => |b, o| blocks(b, o, dequant_q5_1),
        GgmlType::Q8_0 => |b, o| blocks(b, o, dequant_q8_0),
        GgmlType::Q2_K => |b, o| blocks(b, o, dequant_q2_k),
        GgmlType::Q3_K => |b, o| blocks(b, o, dequant_q3_k),
        GgmlType::Q4_K => |b, o| blocks(b, o, dequant_q4_k),
        GgmlType::Q5_K => |b, o| blocks(b, o, dequant_q5_k),
        GgmlType::Q6_K => |b, o| blocks(b, o, dequant_q6_k),
        GgmlType::IQ4_NL => |b, o| blocks(b, o, dequant_iq4_nl),
        GgmlType::IQ4_XS => |b, o| blocks(b, o, dequant_iq4_xs),
        GgmlType::IQ3_XXS => |b, o| blocks(b, o, dequant_iq3_xxs),
        GgmlType::IQ3_S => |b, o| blocks(b, o, dequant_iq3_s),
        GgmlType::IQ2_XXS => |b, o| blocks(b, o, dequant_iq2_xxs),
        GgmlType::IQ2_XS => |b, o| blocks(b, o, dequant_iq2_xs),
        GgmlType::IQ2_S => |b, o| blocks(b, o, dequant_iq2_s),
        GgmlType::IQ1_S => |b, o| blocks(b, o, dequant_iq1_s),
        GgmlType::IQ1_M => |b, o| blocks(b, o, dequant_iq1_m),
        _ => return None,
    })
}

fn check_size(ggml_type: GgmlType, bytes: &[u8], n: usize) -> Result<(), ModelError> {
    let expected = ggml_type
        .bytes_for(n as u64)
        .ok_or_else(|| ModelError::BadShape {
            dims: vec![n as u64],
            reason: format!(
                "not a whole number of {ggml_type} blocks ({})",
                ggml_type.block_size()
            ),
        })?;
    if expected != bytes.len() as u64 {
        return Err(ModelError::SizeMismatch {
            what: format!("{n} elements of {ggml_type}"),
            expected,
            actual: bytes.len() as u64,
        });
    }
    Ok(())
}

/// Applies a per-element conversion; sizes were checked by the caller.
fn elements<const B: usize>(bytes: &[u8], out: &mut [f32], convert: impl Fn([u8; B]) -> f32) {
    for (chunk, o) in bytes.as_chunks::<B>().0.iter().zip(out) {
        *o = convert(*chunk);
    }
}

/// Applies a per-block dequantizer; sizes were checked by the caller.
fn blocks<const B: usize, const N: usize>(
    bytes: &[u8],
    out: &mut [f32],
    dequant: fn(&[u8; B], &mut [f32; N]),
) {
    for (block, o) in bytes
        .as_chunks::<B>()
        .0
        .iter()
        .zip(out.as_chunks_mut::<N>().0)
    {
        dequant(block, o);
    }
}
