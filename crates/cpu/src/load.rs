//! Reading tensors of an expected shape out of a [`TensorSource`].

use quench_models::GgmlType;

use crate::arithmetic::Arithmetic;
use crate::blocks::BlockMatrix;
use crate::error::{CpuError, Result};
use crate::matrix::Matrix;
use crate::packed::PackedMatrix;
use crate::real::Real;
use crate::weight::Weight;
use quench_models::arch::ArchError;
use quench_models::arch::TensorSource;

/// A `[rows, cols]` weight, kept in its stored ggml type where `T` keeps blocks (Q4_1 and
/// Q8_0 as blocks multiplied directly, the other quantized and 16-bit types packed and
/// expanded a row at a time); otherwise, and for f32, as a matrix of `T`.
pub(crate) fn weight<T: Real>(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Weight<T>> {
    if T::KEEPS_BLOCKS {
        if let Some(raw) = src.raw(name)? {
            if raw.dims != [rows, cols] {
                return Err(CpuError::from(ArchError::Shape {
                    name: name.to_owned(),
                    expected: vec![rows, cols],
                    found: raw.dims,
                }));
            }
            if let Some(m) = BlockMatrix::from_ggml(name, raw.ggml_type, rows, cols, raw.bytes)? {
                // Copied into the block layout: the stored pages are not read again.
                src.release(name);
                return Ok(Weight::Blocks(m));
            }
            if PackedMatrix::keeps(raw.ggml_type) {
                // Multiplied as stored: the source's own bytes where it shares them.
                let bytes = match src.shared(name)? {
                    Some(shared) => shared,
                    None => raw.bytes.to_vec().into(),
                };
                if let Some(m) = PackedMatrix::from_ggml(name, raw.ggml_type, rows, cols, bytes)? {
                    return Ok(Weight::Packed(m));
                }
            }
        }
    }
    let dense = matrix(src, name, rows, cols)?;
    src.release(name);
    Ok(Weight::Dense(dense))
}

/// Bytes a decoder over `T` holds for a tensor of `ty`, `elements` elements stored in
/// `stored` bytes: a matrix (`matrix`) as [`weight`] keeps it, anything else as `T`. What
/// loading the decoder will cost, from the checkpoint's headers.
pub fn held_bytes<T: Real>(ty: GgmlType, matrix: bool, elements: u64, stored: u64) -> u64 {
    let dense = elements * std::mem::size_of::<T>() as u64;
    if !(T::KEEPS_BLOCKS && matrix) {
        return dense;
    }
    BlockMatrix::held_bytes_for(ty, elements)
        .or_else(|| PackedMatrix::keeps(ty).then_some(stored))
        .unwrap_or(dense)
}

/// Refuses, under [`Arithmetic::GgmlRounding`], a weight whose product with activations this
/// crate cannot compute as llama.cpp's CPU path does: one not stored as Q4_1 or Q8_0 (kept as
/// blocks, multiplied by 8-bit activation blocks in ggml's order).
pub(crate) fn check_arithmetic(
    src: &dyn TensorSource,
    name: &str,
    arithmetic: Arithmetic,
) -> Result<()> {
    if !matches!(arithmetic, Arithmetic::GgmlRounding(_)) {
        return Ok(());
    }
    let refuse = |reason: String| CpuError::GgmlRounding {
        name: name.to_owned(),
        reason,
    };
    match src.raw(name)? {
        None => Err(refuse("has no stored ggml type".into())),
        Some(raw) => match raw.ggml_type {
            GgmlType::Q4_1 | GgmlType::Q8_0 => Ok(()),
            other => Err(refuse(format!("is {}", other.name()))),
        },
    }
}

/// A `[rows, cols]` tensor as a matrix of `T`.
pub(crate) fn matrix<T: Real>(
    src: &dyn TensorSource,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Matrix<T>> {
    let data = tensor(src, name, &[rows, cols])?;
    Ok(Matrix::from_vec(rows, cols, data).expect("shape checked by tensor()"))
}

/// A `[len]` tensor as a vector of `T`.
pub(crate) fn vector<T: Real>(src: &dyn TensorSource, name: &str, len: usize) -> Result<Vec<T>> {
    tensor(src, name, &[len])
}

fn tensor<T: Real>(src: &dyn TensorSource, name: &str, dims: &[usize]) -> Result<Vec<T>> {
    let (found, data) = src.get(name)?;
    if found != dims || data.len() != dims.iter().product::<usize>() {
        return Err(CpuError::from(ArchError::Shape {
            name: name.to_owned(),
            expected: dims.to_vec(),
            found,
        }));
    }
    Ok(data.into_iter().map(T::from_f32).collect())
}
