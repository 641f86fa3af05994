//! Scaled dot-product attention with grouped key/value heads.

use rayon::prelude::*;

use crate::math::{dot, softmax};
use crate::matrix::Matrix;
use crate::real::Real;

/// The shape of one attention call.
pub(crate) struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// `Some(p)`: causal, and query row `t` sits at position `p + t`, seeing keys `0..=p + t`.
    /// `None`: every query sees every key.
    pub causal_start: Option<usize>,
}

/// `q` is `[tokens, heads·head_dim]`; `keys` and `values` hold `kv_len` rows of
/// `kv_heads·head_dim`. Query head `h` reads key/value head `h / (heads / kv_heads)`.
pub(crate) fn attention<T: Real>(
    q: &Matrix<T>,
    keys: &[T],
    values: &[T],
    kv_len: usize,
    shape: &AttentionShape,
) -> Matrix<T> {
    let AttentionShape {
        heads,
        kv_heads,
        head_dim: hd,
        causal_start,
    } = *shape;
    let group = heads / kv_heads;
    let kv_width = kv_heads * hd;
    let scale = T::from_f64(1.0 / (hd as f64).sqrt());
    let mut out = Matrix::zeros(q.rows(), heads * hd);
    // One task per (token, head): decode has a single token, so heads are the parallelism.
    out.as_mut_slice()
        .par_chunks_mut(hd)
        .enumerate()
        .for_each(|(i, out_head)| {
            let (t, h) = (i / heads, i % heads);
            let kvh = h / group;
            let q_head = &q.row(t)[h * hd..(h + 1) * hd];
            let seen = match causal_start {
                Some(p) => p + t + 1,
                None => kv_len,
            };
            let mut scores: Vec<T> = (0..seen)
                .map(|j| {
                    let k = &keys[j * kv_width + kvh * hd..j * kv_width + (kvh + 1) * hd];
                    dot(q_head, k) * scale
                })
                .collect();
            softmax(&mut scores);
            for (j, w) in scores.iter().enumerate() {
                let v = &values[j * kv_width + kvh * hd..j * kv_width + (kvh + 1) * hd];
                for (o, x) in out_head.iter_mut().zip(v) {
                    *o += *w * *x;
                }
            }
        });
    out
}
