//! A decoder's weight matrix as it is held: dense in the element type, or (in the f32
//! decoder) in the format the checkpoint stores it in: Q4_1 and Q8_0 as blocks multiplied
//! as they are, the other ggml types packed: one token's products read the k-quant and
//! Q4_0/Q5_0/Q5_1 rows as stored ([`packed_dot`](crate::packed_dot)), other products expand
//! a row at a time.

use crate::arithmetic::Arithmetic;
use crate::blocks::{block_sums, BlockMatrix};
use crate::matrix::{by_weight_rows, linear, Matrix, Rows};
use crate::packed::PackedMatrix;
use crate::packed_dot::Activations;
use crate::q8::{quantize_row, Q8Row};
use crate::real::Real;

pub(crate) enum Weight<T> {
    Dense(Matrix<T>),
    Blocks(BlockMatrix),
    Packed(PackedMatrix),
}

impl<T: Real> Weight<T> {
    /// `y[t][o] = bias[o] + Σ_i x[t][i] · w[o][i]`, as [`linear`].
    ///
    /// Block weights meet f32 activations: one token at a time (decoding), each row is
    /// multiplied block by block as stored; for several tokens (prefill), each row is expanded
    /// once (exactly as loading it dense would) and multiplied with every token.
    ///
    /// With [`Arithmetic::GgmlRounding`], block weights meet each token's activations rounded
    /// to 8-bit blocks, as llama.cpp's CPU path multiplies them.
    pub(crate) fn apply(
        &self,
        x: &Matrix<T>,
        bias: Option<&[T]>,
        arithmetic: Arithmetic,
    ) -> Matrix<T> {
        let w = match self {
            Weight::Dense(w) => return linear(x, w, bias),
            Weight::Packed(w) if x.rows() == 1 && w.multiplies_as_stored() => {
                return packed_one_token(w, x, bias)
            }
            Weight::Packed(w) => return linear(x, w, bias),
            Weight::Blocks(w) => w,
        };
        assert_eq!(
            x.cols(),
            w.cols(),
            "apply: input width differs from weight width"
        );
        if let Some(b) = bias {
            assert_eq!(
                b.len(),
                w.rows(),
                "apply: bias length differs from weight rows"
            );
        }
        let bias_at = |o: usize| bias.map_or(T::ZERO, |b| b[o]);
        let n = x.rows();
        let xf: Vec<f32> = x.as_slice().iter().map(|v| v.to_f32()).collect();
        if matches!(arithmetic, Arithmetic::GgmlRounding(_)) {
            let kind = w.activation_kind();
            let rows: Vec<Q8Row> = xf
                .chunks_exact(w.cols())
                .map(|row| quantize_row(row, kind))
                .collect();
            return by_weight_rows(n, w.rows(), |first, out: &mut [T]| {
                let mut y = vec![0.0f32; out.len() / n];
                for (t, row) in rows.iter().enumerate() {
                    w.dot_rows_q8(first, row, &mut y);
                    for (r, &v) in y.iter().enumerate() {
                        out[r * n + t] = T::from_f32(v) + bias_at(first + r);
                    }
                }
            });
        }
        if n == 1 {
            let sums = block_sums(&xf);
            return by_weight_rows(1, w.rows(), |first, out: &mut [T]| {
                let mut y = vec![0.0f32; out.len()];
                w.dot_rows(first, &xf, &sums, &mut y);
                for (i, (o, v)) in out.iter_mut().zip(y).enumerate() {
                    *o = T::from_f32(v) + bias_at(first + i);
                }
            });
        }
        by_weight_rows(n, w.rows(), |first, out: &mut [T]| {
            let mut y = vec![0.0f32; out.len()];
            w.dot_rows_tokens(first, &xf, n, &mut y);
            for (i, (o, v)) in out.iter_mut().zip(y).enumerate() {
                *o = T::from_f32(v) + bias_at(first + i / n);
            }
        })
    }

    /// Bytes the matrix holds, in the form it is kept in.
    pub(crate) fn held_bytes(&self) -> usize {
        match self {
            Weight::Dense(m) => m.rows() * m.cols() * std::mem::size_of::<T>(),
            Weight::Blocks(b) => b.held_bytes(),
            Weight::Packed(p) => p.held_bytes(),
        }
    }

    /// Row `r` (an embedding lookup).
    pub(crate) fn row_into(&self, r: usize, out: &mut [T]) {
        match self {
            Weight::Dense(w) => out.copy_from_slice(w.row(r)),
            // A packed row is expanded into the buffer it is given.
            Weight::Packed(w) => {
                w.row(r, out);
            }
            Weight::Blocks(w) => {
                let mut row = vec![0.0f32; w.cols()];
                w.dequant_row(r, &mut row);
                for (o, v) in out.iter_mut().zip(row) {
                    *o = T::from_f32(v);
                }
            }
        }
    }
}

/// One token's products with a packed matrix read as stored ([`PackedMatrix::dot_rows`]), its
/// activations rounded to 16-bit integers once for all rows.
fn packed_one_token<T: Real>(w: &PackedMatrix, x: &Matrix<T>, bias: Option<&[T]>) -> Matrix<T> {
    let xf: Vec<f32> = x.as_slice().iter().map(|v| v.to_f32()).collect();
    let activations = Activations::of(&xf);
    by_weight_rows(1, Rows::<T>::rows(w), |first, out: &mut [T]| {
        let mut y = vec![0.0f32; out.len()];
        w.dot_rows(first, &activations, &mut y);
        for (i, (o, v)) in out.iter_mut().zip(y).enumerate() {
            *o = T::from_f32(v) + bias.map_or(T::ZERO, |b| b[first + i]);
        }
    })
}
