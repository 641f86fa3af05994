//! Weights as the checkpoint stores them: the bytes the GPU kernels read directly (GGUF
//! blocks, bf16/f16 rows), never expanded on the way — except a matrix in a ggml type no
//! GPU kernel reads (the i-quants, Q2_K, Q3_K, Q5_0, Q5_1; a table in a type no gather
//! reads), which is expanded to f16 on the host as it is uploaded ([`widened_f16`]) and
//! named when the model loads ([`super::GpuSummary::widened`]).

use quench_models::arch::TensorSource;
use quench_models::dequant::{dequantize_into, dequantizes, f32_to_f16};
use quench_models::safetensors::Dtype;
use quench_models::{GgmlType, GgufFile, HfCheckpoint};

use super::error::GpuError;

/// One stored tensor: its element type (ggml's names, which cover safetensors' float
/// types too), its shape outermost first, and its bytes (row-major, rows back to back).
pub struct StoredTensor<'a> {
    pub ggml_type: GgmlType,
    pub dims: Vec<usize>,
    pub bytes: &'a [u8],
}

/// A checkpoint seen as stored tensors; also a [`TensorSource`], for the small vectors
/// (norm weights, biases) that are read as f32.
pub trait StoredTensors: TensorSource {
    /// Tensor `name` as stored: by default the source's raw tensor (a missing one is an
    /// error naming it).
    fn stored(&self, name: &str) -> Result<StoredTensor<'_>, GpuError> {
        let raw = self
            .raw(name)?
            .ok_or_else(|| quench_models::arch::ArchError::MissingTensor {
                name: name.to_owned(),
            })?;
        Ok(StoredTensor {
            ggml_type: raw.ggml_type,
            dims: raw.dims,
            bytes: raw.bytes,
        })
    }
}

impl StoredTensors for GgufFile {}

impl StoredTensors for HfCheckpoint {
    fn stored(&self, name: &str) -> Result<StoredTensor<'_>, GpuError> {
        let view = self.tensor(name)?;
        let ggml_type = match view.dtype {
            Dtype::BF16 => GgmlType::BF16,
            Dtype::F16 => GgmlType::F16,
            Dtype::F32 => GgmlType::F32,
            other => {
                return Err(GpuError::Format {
                    tensor: name.to_owned(),
                    format: other.name().to_owned(),
                    supported: "BF16, F16 and F32 safetensors",
                })
            }
        };
        Ok(StoredTensor {
            ggml_type,
            dims: view.shape.iter().map(|&d| d as usize).collect(),
            bytes: view.bytes,
        })
    }
}

/// Reads a `[rows, cols]` matrix, refusing another shape by name.
pub(crate) fn matrix<'a>(
    src: &'a dyn StoredTensors,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<StoredTensor<'a>, GpuError> {
    let t = src.stored(name)?;
    if t.dims != [rows, cols] {
        return Err(GpuError::Shape {
            tensor: name.to_owned(),
            expected: vec![rows, cols],
            found: t.dims,
        });
    }
    Ok(t)
}

/// Reads a `[len]` vector as f32 (exact for the f32, bf16 and f16 vectors checkpoints
/// hold).
pub(crate) fn vector(
    src: &dyn StoredTensors,
    name: &str,
    len: usize,
) -> Result<Vec<f32>, GpuError> {
    let (dims, data) = src.get(name)?;
    if dims != [len] {
        return Err(GpuError::Shape {
            tensor: name.to_owned(),
            expected: vec![len],
            found: dims,
        });
    }
    Ok(data)
}

/// Whether a tensor of `ggml_type` that no kernel reads as stored is expanded to f16.
pub(crate) fn widens(ggml_type: GgmlType) -> bool {
    dequantizes(ggml_type) && !matches!(ggml_type, GgmlType::F32 | GgmlType::F16)
}

/// Rows expanded at a time, so that the f32 expansion stays small.
const WIDEN_ROWS: usize = 256;

/// The f16 bytes of `t`, a `[rows, cols]` matrix in a type [`widens`] accepts: each value
/// dequantized exactly (as the f64 reference reads it), then rounded to f16 (relative
/// error at most 2⁻¹¹). A value past f16's range is refused naming the tensor.
pub(crate) fn widened_f16(name: &str, t: &StoredTensor<'_>) -> Result<Vec<u8>, GpuError> {
    let cols = t.dims.last().copied().unwrap_or(0);
    let rows = t.dims.iter().rev().skip(1).product::<usize>();
    let row_bytes = t.bytes.len() / rows.max(1);
    let mut out = Vec::with_capacity(2 * rows * cols);
    let mut f = vec![0f32; WIDEN_ROWS * cols];
    for (i, stored) in t.bytes.chunks(WIDEN_ROWS * row_bytes).enumerate() {
        let f = &mut f[..stored.len() / row_bytes * cols];
        dequantize_into(t.ggml_type, stored, f).map_err(|e| GpuError::Unsupported {
            what: format!("{name} ({}) expanded to f16", t.ggml_type.name()),
            reason: e.to_string(),
        })?;
        for (j, &v) in f.iter().enumerate() {
            if !v.is_finite() || v.abs() > 65504.0 {
                return Err(GpuError::Unsupported {
                    what: format!("{name} ({}) expanded to f16", t.ggml_type.name()),
                    reason: format!(
                        "element {} of row {} is {v}, outside f16's range",
                        j % cols,
                        i * WIDEN_ROWS + j / cols
                    ),
                });
            }
            out.extend_from_slice(&f32_to_f16(v).to_le_bytes());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quench_models::dequant::dequantize;

    /// Four Q5_0 blocks (two rows of 64), each of scale `d` and every quant `q` (values
    /// `d·(q − 16)`).
    fn q5_0(d: f32, q: u8) -> Vec<u8> {
        let mut block = f32_to_f16(d).to_le_bytes().to_vec();
        let qh: u32 = if q & 0x10 == 0 { 0 } else { u32::MAX };
        block.extend_from_slice(&qh.to_le_bytes());
        block.extend(std::iter::repeat_n((q & 0x0f) * 0x11, 16));
        block.repeat(4)
    }

    #[test]
    fn values_are_the_exact_ones_rounded_to_f16_and_out_of_range_ones_refused() {
        let bytes = q5_0(0.1, 27);
        let t = StoredTensor {
            ggml_type: GgmlType::Q5_0,
            dims: vec![2, 64],
            bytes: &bytes,
        };
        let f16 = widened_f16("w", &t).unwrap();
        let exact = dequantize(GgmlType::Q5_0, &bytes, 128).unwrap();
        let want: Vec<u8> = exact
            .iter()
            .flat_map(|&v| f32_to_f16(v).to_le_bytes())
            .collect();
        assert_eq!(f16, want);
        assert!(exact.iter().all(|&v| v == exact[0] && v != 0.0));

        let bytes = q5_0(60000.0, 31);
        let t = StoredTensor { bytes: &bytes, ..t };
        let e = widened_f16("blk.3.ffn_down.weight", &t)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("blk.3.ffn_down.weight (Q5_0)") && e.contains("row 0") && e.contains("f16"),
            "{e}"
        );
    }
}
