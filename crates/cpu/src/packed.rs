//! Weight matrices kept in the ggml type the checkpoint stores them in (the k-quants, the
//! i-quants, the other legacy block types, f16, bf16) and expanded one row at a time as they are
//! multiplied.
//!
//! A row's values are those loading it dense would give (quench-models' dequantization,
//! bit for bit) and its products are computed by the same [`linear`](crate::matrix::linear)
//! as a dense matrix's, so the results are the same bits while the process holds only the
//! stored bytes: a Q4_K matrix takes a seventh of its f32 expansion. From a memory-mapped
//! GGUF file those bytes are the mapping's own ([`SharedBytes`]), not a copy. One token's
//! products with Q4_K, Q5_K, Q6_K, Q4_0, Q5_0 and Q5_1 rows read them as stored instead, in
//! integers ([`packed_dot`]).

use quench_models::arch::ArchError;
use quench_models::dequant::{dequantize_into, dequantizes};
use quench_models::{GgmlType, SharedBytes};

use crate::error::{CpuError, Result};
use crate::matrix::Rows;
use crate::packed_dot::{self, Activations};
use crate::real::Real;

/// A `[rows, cols]` weight matrix in a ggml type, as stored.
#[derive(Clone, Debug)]
pub(crate) struct PackedMatrix {
    ggml_type: GgmlType,
    rows: usize,
    cols: usize,
    /// Bytes of one row.
    row_bytes: usize,
    bytes: SharedBytes,
}

impl PackedMatrix {
    /// The tensor `name` of ggml type `ty` kept as stored, or `None` when `ty` is f32 (kept
    /// dense) or not a type quench expands. `bytes` must hold exactly `rows · cols`
    /// elements, in whole blocks per row.
    pub(crate) fn from_ggml(
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: SharedBytes,
    ) -> Result<Option<Self>> {
        if !Self::keeps(ty) {
            return Ok(None);
        }
        let bad = |reason: String| {
            CpuError::from(ArchError::Tensor {
                name: name.to_owned(),
                source: reason.into(),
            })
        };
        let row_bytes = ty.bytes_for(cols as u64).ok_or_else(|| {
            bad(format!(
                "rows of {cols} elements are not whole {} blocks of {}",
                ty.name(),
                ty.block_size()
            ))
        })? as usize;
        if Some(bytes.len()) != rows.checked_mul(row_bytes) {
            return Err(bad(format!(
                "{} bytes of {} do not make [{rows}, {cols}]",
                bytes.len(),
                ty.name()
            )));
        }
        Ok(Some(PackedMatrix {
            ggml_type: ty,
            rows,
            cols,
            row_bytes,
            bytes,
        }))
    }

    /// Whether matrices of `ty` are kept packed: every type quench expands but f32.
    pub(crate) fn keeps(ty: GgmlType) -> bool {
        ty != GgmlType::F32 && dequantizes(ty)
    }

    /// The bytes held: those stored (in the file's mapping where it is mapped).
    pub(crate) fn held_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Whether one token's products read the rows as stored ([`Self::dot_rows`]) rather than
    /// expanding each row first.
    pub(crate) fn multiplies_as_stored(&self) -> bool {
        packed_dot::multiplies(self.ggml_type)
    }

    /// `out[i] = Σ_k w[first + i][k]·x[k]`, read as stored, with `x` rounded to 16-bit
    /// integers ([`Activations`]); only where [`Self::multiplies_as_stored`].
    pub(crate) fn dot_rows(&self, first: usize, x: &Activations, out: &mut [f32]) {
        assert_eq!(x.len(), self.cols, "dot_rows: input width");
        assert!(
            first + out.len() <= self.rows,
            "dot_rows: rows out of range"
        );
        // The rest of the matrix goes along, for the next rows to be fetched ahead.
        let rows = &self.bytes[first * self.row_bytes..];
        packed_dot::dot_rows(self.ggml_type, rows, self.row_bytes, x, out)
    }
}

impl<T: Real> Rows<T> for PackedMatrix {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn row<'a>(&'a self, r: usize, scratch: &'a mut [T]) -> &'a [T] {
        let stored = &self.bytes[r * self.row_bytes..(r + 1) * self.row_bytes];
        let expand = |f: &mut [f32]| {
            dequantize_into(self.ggml_type, stored, f)
                .expect("sizes checked when the matrix was made")
        };
        let out = &mut scratch[..self.cols];
        match T::as_f32_mut(out) {
            Some(f) => expand(f),
            // Only f32 decoders keep weights packed; other element types expand through f32.
            None => {
                let mut f = vec![0.0; self.cols];
                expand(&mut f);
                for (o, v) in out.iter_mut().zip(f) {
                    *o = T::from_f32(v);
                }
            }
        }
        &scratch[..self.cols]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::{linear, Matrix};
    use quench_models::dequant::dequantize;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn packed_products_are_the_dense_expansions_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for (ty, cols) in [
            (GgmlType::Q4_K, 512),
            (GgmlType::Q6_K, 256),
            (GgmlType::Q5_K, 256),
            (GgmlType::Q3_K, 256),
            (GgmlType::Q2_K, 256),
            (GgmlType::Q5_0, 96),
            (GgmlType::Q4_0, 576),
            (GgmlType::F16, 40),
            (GgmlType::BF16, 300),
            (GgmlType::IQ4_NL, 96),
            (GgmlType::IQ4_XS, 256),
            (GgmlType::IQ3_XXS, 256),
            (GgmlType::IQ2_S, 512),
            (GgmlType::IQ1_M, 256),
        ] {
            let rows = 37;
            let bytes = random_blocks(ty, rows * cols, &mut rng);
            let packed = PackedMatrix::from_ggml("w", ty, rows, cols, bytes.clone().into())
                .unwrap()
                .unwrap();
            assert_eq!(packed.held_bytes(), bytes.len());
            let dense =
                Matrix::from_vec(rows, cols, dequantize(ty, &bytes, rows * cols).unwrap()).unwrap();
            for n in [1, 3] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let x = Matrix::from_vec(n, cols, x).unwrap();
                let bias: Vec<f32> = (0..rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
                let want = linear(&x, &dense, Some(&bias));
                let got = linear(&x, &packed, Some(&bias));
                let bits =
                    |m: &Matrix<f32>| m.as_slice().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{ty:?}, {n} tokens");
                // In f64, expanded through f32.
                let wide = |m: &Matrix<f32>| {
                    let v = m.as_slice().iter().map(|&v| f64::from(v)).collect();
                    Matrix::from_vec(m.rows(), m.cols(), v).unwrap()
                };
                let bias: Vec<f64> = bias.iter().map(|&b| f64::from(b)).collect();
                let want = linear(&wide(&x), &wide(&dense), Some(&bias));
                let got = linear(&wide(&x), &packed, Some(&bias));
                assert_eq!(got, want, "{ty:?}, {n} tokens in f64");
            }
        }
    }

    /// `n` elements of `ty` in random blocks, each drawn again until its values are finite
    /// and below 10^6 (random scales may be infinite or NaN, or overflow the products).
    fn random_blocks(ty: GgmlType, n: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
        let (elems, size) = (ty.block_size() as usize, ty.type_size() as usize);
        let mut values = vec![0.0f32; elems];
        let mut out = Vec::with_capacity(n / elems * size);
        for _ in 0..n / elems {
            loop {
                let block: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
                dequantize_into(ty, &block, &mut values).unwrap();
                if values.iter().all(|v| v.abs() < 1e6) {
                    out.extend(block);
                    break;
                }
            }
        }
        out
    }

    #[test]
    fn tensors_of_the_wrong_size_are_refused_by_name() {
        assert!(
            PackedMatrix::from_ggml("w", GgmlType::F32, 1, 4, vec![0; 16].into())
                .unwrap()
                .is_none()
        );
        let err = PackedMatrix::from_ggml(
            "blk.0.ffn_up.weight",
            GgmlType::Q4_K,
            2,
            256,
            vec![0; 144].into(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("blk.0.ffn_up.weight") && err.contains("144 bytes"),
            "{err}"
        );
        let err = PackedMatrix::from_ggml("w", GgmlType::Q6_K, 1, 128, vec![0; 105].into())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not whole Q6_K blocks"), "{err}");
    }
}
