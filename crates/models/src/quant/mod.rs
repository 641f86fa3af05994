//! Quantization of f32 data to ggml types: Q8_0 and Q4_0 bit-exact with the `gguf` package,
//! Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS by this crate's own least-squares fits, and the plain
//! F32/F16/BF16 conversions; and [`activations`], the 16-bit integer form of activations
//! that the integer products of quantized weights take.

pub mod activations;
mod affine_k;
mod iq4_xs;
mod legacy;
mod low_k;
mod q6_k;
#[cfg(test)]
mod test_data;

pub use affine_k::{quantize_q4_k, quantize_q5_k};
pub use iq4_xs::quantize_iq4_xs;
pub use legacy::{quantize_q4_0, quantize_q8_0};
pub use low_k::{quantize_q2_k, quantize_q3_k};
pub use q6_k::quantize_q6_k;

use crate::dequant::{f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::{GgmlType, ModelError};

/// Quantizes `x` to `ggml_type`. The length must be a whole number of blocks; block types
/// refuse non-finite input, and values too large for the type's f16 scales.
pub fn quantize(ggml_type: GgmlType, x: &[f32]) -> Result<Vec<u8>, ModelError> {
    let size = ggml_type
        .bytes_for(x.len() as u64)
        .ok_or_else(|| not_whole_blocks(ggml_type, x.len()))?;
    let mut out = vec![0u8; size as usize];
    quantize_into(ggml_type, x, &mut out)?;
    Ok(out)
}

fn not_whole_blocks(ggml_type: GgmlType, n: usize) -> ModelError {
    ModelError::Quantize {
        ggml_type: ggml_type.name(),
        reason: format!("{n} elements are not a whole number of blocks"),
    }
}

/// As [`quantize`], into `out`, which must be exactly the size of `x` in `ggml_type`.
pub fn quantize_into(ggml_type: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), ModelError> {
    let err = |reason: String| ModelError::Quantize {
        ggml_type: ggml_type.name(),
        reason,
    };
    let size = ggml_type
        .bytes_for(x.len() as u64)
        .ok_or_else(|| not_whole_blocks(ggml_type, x.len()))?;
    if size != out.len() as u64 {
        return Err(ModelError::SizeMismatch {
            what: format!("{ggml_type} output for {} elements", x.len()),
            expected: size,
            actual: out.len() as u64,
        });
    }
    match ggml_type {
        GgmlType::F32 => elements(x, out, f32::to_le_bytes),
        GgmlType::F16 => elements(x, out, |v| f32_to_f16(v).to_le_bytes()),
        GgmlType::BF16 => elements(x, out, |v| f32_to_bf16(v).to_le_bytes()),
        // The offsets are those of each block's f16 scale fields.
        GgmlType::Q8_0 => blocks(x, out, quantize_q8_0, &[0]).map_err(err)?,
        GgmlType::Q4_0 => blocks(x, out, quantize_q4_0, &[0]).map_err(err)?,
        GgmlType::Q4_K => blocks(x, out, quantize_q4_k, &[0, 2]).map_err(err)?,
        GgmlType::Q5_K => blocks(x, out, quantize_q5_k, &[0, 2]).map_err(err)?,
        GgmlType::Q6_K => blocks(x, out, quantize_q6_k, &[208]).map_err(err)?,
        GgmlType::Q3_K => blocks(x, out, quantize_q3_k, &[108]).map_err(err)?,
        GgmlType::Q2_K => blocks(x, out, quantize_q2_k, &[80, 82]).map_err(err)?,
        GgmlType::IQ4_XS => blocks(x, out, quantize_iq4_xs, &[0]).map_err(err)?,
        other => {
            return Err(ModelError::Unsupported {
                what: format!("quantization to ggml type {other}"),
            })
        }
    }
    Ok(())
}

fn elements<const B: usize>(x: &[f32], out: &mut [u8], convert: impl Fn(f32) -> [u8; B]) {
    for (o, &v) in out.as_chunks_mut::<B>().0.iter_mut().zip(x) {
        *o = convert(v);
    }
}

/// Quantizes block by block; refuses non-finite input, and blocks whose f16 scales (at
/// `scale_fields`) overflow.
fn blocks<const N: usize, const B: usize>(
    x: &[f32],
    out: &mut [u8],
    quant: fn(&[f32; N], &mut [u8; B]),
    scale_fields: &[usize],
) -> Result<(), String> {
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(format!("element {i} is {}", x[i]));
    }
    for (b, (block, o)) in x
        .as_chunks::<N>()
        .0
        .iter()
        .zip(out.as_chunks_mut::<B>().0)
        .enumerate()
    {
        quant(block, o);
        for &at in scale_fields {
            if !f16_to_f32(u16::from_le_bytes([o[at], o[at + 1]])).is_finite() {
                return Err(format!(
                    "block {b} holds values too large for its f16 scale"
                ));
            }
        }
    }
    Ok(())
}
