//! A row-major matrix and the one matrix product every layer uses.

use rayon::prelude::*;

use crate::math::{dot, dot4};
use crate::real::Real;

/// A dense row-major matrix: `rows` rows of `cols` elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix<T> {
    rows: usize,
    cols: usize,
    data: Vec<T>,
}

impl<T: Real> Matrix<T> {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Matrix {
            rows,
            cols,
            data: vec![T::ZERO; rows * cols],
        }
    }

    /// `None` when `data` does not hold exactly `rows * cols` elements.
    pub fn from_vec(rows: usize, cols: usize, data: Vec<T>) -> Option<Self> {
        (rows.checked_mul(cols) == Some(data.len())).then_some(Matrix { rows, cols, data })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn row(&self, i: usize) -> &[T] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    pub fn row_mut(&mut self, i: usize) -> &mut [T] {
        &mut self.data[i * self.cols..(i + 1) * self.cols]
    }

    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }

    pub fn into_vec(self) -> Vec<T> {
        self.data
    }

    /// The matrix with its elements converted to `f32`.
    pub fn to_f32(&self) -> Matrix<f32> {
        Matrix {
            rows: self.rows,
            cols: self.cols,
            data: self.data.iter().map(|v| v.to_f32()).collect(),
        }
    }
}

/// A weight matrix whose rows [`linear`] multiplies: held dense, or expanded a row at a
/// time into `scratch` (at least `cols` long) from a packed form.
pub(crate) trait Rows<T>: Sync {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    fn row<'a>(&'a self, r: usize, scratch: &'a mut [T]) -> &'a [T];
}

impl<T: Real> Rows<T> for Matrix<T> {
    fn rows(&self) -> usize {
        self.rows
    }

    fn cols(&self) -> usize {
        self.cols
    }

    fn row<'a>(&'a self, r: usize, _scratch: &'a mut [T]) -> &'a [T] {
        Matrix::row(self, r)
    }
}

/// How many weight rows one parallel task takes: enough work to amortize scheduling, few enough
/// that a 576-wide projection still spreads over every core.
const ROWS_PER_TASK: usize = 32;

/// `y[t][o] = bias[o] + Σ_i x[t][i] · w[o][i]`: a linear layer with the weight stored as
/// `[out_features, in_features]`, parallel over blocks of weight rows.
///
/// Panics if the shapes disagree; every caller checks shapes when the weights are loaded.
pub(crate) fn linear<T: Real>(x: &Matrix<T>, w: &impl Rows<T>, bias: Option<&[T]>) -> Matrix<T> {
    assert_eq!(
        x.cols,
        w.cols(),
        "linear: input width differs from weight width"
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            w.rows(),
            "linear: bias length differs from weight rows"
        );
    }
    let n = x.rows;
    by_weight_rows(n, w.rows(), |first, out| {
        let mut scratch = vec![T::ZERO; w.cols()];
        for (r, out_row) in out.chunks_mut(n).enumerate() {
            let o = first + r;
            let w_row = w.row(o, &mut scratch);
            let b = bias.map_or(T::ZERO, |b| b[o]);
            // Four tokens at a time where there are four.
            let mut quads = out_row.chunks_exact_mut(4);
            for (q, ys) in (&mut quads).enumerate() {
                let tokens = std::array::from_fn(|k| x.row(4 * q + k));
                for (y, d) in ys.iter_mut().zip(dot4(w_row, tokens)) {
                    *y = d + b;
                }
            }
            let done = n - n % 4;
            for (t, y) in quads.into_remainder().iter_mut().enumerate() {
                *y = dot(w_row, x.row(done + t)) + b;
            }
        }
    })
}

/// The `[n, m]` result of a linear layer with `m` outputs over `n` tokens, filled in parallel
/// by `fill(first, block)`: `block` holds the results of weight rows `first, first + 1, …`,
/// `n` values (one per token) for each row.
///
/// Computed transposed (`[out][token]`) so that each task owns a contiguous block and each
/// weight row is read once for all tokens; one token (decode) needs no transpose.
pub(crate) fn by_weight_rows<T: Real>(
    n: usize,
    m: usize,
    fill: impl Fn(usize, &mut [T]) + Sync,
) -> Matrix<T> {
    let mut yt = vec![T::ZERO; m * n];
    yt.par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .for_each(|(block, out)| fill(block * ROWS_PER_TASK, out));
    if n == 1 {
        return Matrix {
            rows: 1,
            cols: m,
            data: yt,
        };
    }
    let mut y = Matrix::zeros(n, m);
    for o in 0..m {
        for t in 0..n {
            y.data[t * m + o] = yt[o * n + t];
        }
    }
    y
}
