//! Weights as the checkpoint stores them: the bytes the GPU kernels read directly (GGUF
//! blocks, bf16/f16 rows), never expanded on the way.

use quench_models::arch::TensorSource;
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
