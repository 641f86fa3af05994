//! Attention over keys and values held in f16, as llama.cpp's CPU path computes it without
//! flash attention ([`crate::Arithmetic::GgmlRounding`]).
//!
//! ggml multiplies an f16 matrix by f32 activations by first rounding the activations to f16:
//! the query before `K·q`, and the softmax row before it weighs `V`. Products are summed in f32
//! lanes, in one order for a single query (`ggml_vec_dot_f16`) and in another for several
//! (the tiled matrix product llama.cpp uses for a prompt); the softmax runs in f32 with its
//! sum kept in f64. How many lanes, and how they are added, depends on the build
//! ([`GgmlKernels`]).

use rayon::prelude::*;

use crate::arithmetic::GgmlKernels;
use crate::attention::AttentionShape;
use crate::ggml_math::{self, sum_lanes};
use crate::matrix::Matrix;
use crate::q8::round_f16;
use crate::real::Real;

/// `q` is `[tokens, heads·head_dim]`, its row `t` at position `causal_start + t`; `keys` and
/// `values` hold the rows of every position up to the last query's, already rounded to f16.
/// Query head `h` reads key/value head `h / (heads / kv_heads)`.
pub(crate) fn attention_f16<T: Real>(
    q: &Matrix<T>,
    keys: &[T],
    values: &[T],
    shape: &AttentionShape,
    kernels: GgmlKernels,
) -> Matrix<T> {
    let job = Heads {
        q,
        keys,
        values,
        shape,
        start: shape.causal_start.expect("decoder attention is causal"),
        kernels,
    };
    let mut out = Matrix::zeros(q.rows(), shape.heads * shape.head_dim);
    out.as_mut_slice()
        .par_chunks_mut(shape.head_dim)
        .enumerate()
        .for_each(|(i, out_head)| simd::one_head(&job, i, out_head));
    out
}

struct Heads<'a, T> {
    q: &'a Matrix<T>,
    keys: &'a [T],
    values: &'a [T],
    shape: &'a AttentionShape,
    start: usize,
    kernels: GgmlKernels,
}

/// Output head `i` (token `i / heads`, head `i mod heads`) into `out`.
#[inline(always)]
fn one_head<T: Real>(job: &Heads<'_, T>, i: usize, out: &mut [T]) {
    let &AttentionShape {
        heads,
        kv_heads,
        head_dim: hd,
        ..
    } = job.shape;
    let (t, h) = (i / heads, i % heads);
    let kv_width = kv_heads * hd;
    let kv_at = (h / (heads / kv_heads)) * hd;
    let scale = 1.0 / (hd as f32).sqrt();
    let single = job.q.rows() == 1;
    let lanes = job.kernels.lanes();
    let dot = |a: &[f32], b: &[f32]| {
        if single {
            dot_f16_single(a, b, lanes)
        } else {
            dot_f16_tiled(a, b, lanes)
        }
    };
    let q_head: Vec<f32> = job.q.row(t)[h * hd..(h + 1) * hd]
        .iter()
        .map(|v| round_f16(v.to_f32()))
        .collect();
    let seen = job.start + t + 1;
    let mut key = vec![0.0f32; hd];
    let mut weights: Vec<f32> = (0..seen)
        .map(|j| {
            let at = j * kv_width + kv_at;
            for (k, v) in key.iter_mut().zip(&job.keys[at..at + hd]) {
                *k = v.to_f32();
            }
            dot(&q_head, &key) * scale
        })
        .collect();
    softmax_f64_sum(&mut weights, job.kernels);
    for w in &mut weights {
        *w = round_f16(*w);
    }
    let mut column = vec![0.0f32; seen];
    for (d, o) in out.iter_mut().enumerate() {
        for (j, c) in column.iter_mut().enumerate() {
            *c = job.values[j * kv_width + kv_at + d].to_f32();
        }
        *o = T::from_f32(dot(&weights, &column));
    }
}

/// `Σ a·b` as `ggml_vec_dot_f16` sums it, in registers of `lanes` f32 (8 for AVX2, 16 for
/// AVX-512): element `i` goes to lane `i mod lanes` of accumulator `(i mod 4·lanes) / lanes`,
/// added fused; the four accumulators are added lane by lane as `(a0 + a2) + (a1 + a3)`, then
/// the lanes: AVX2 with horizontal adds, `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`;
/// AVX-512 as [`sum_lanes`].
///
/// llama.cpp pads the cache to a multiple of 256 positions with zero weights, so every element
/// goes through the lanes (none through its scalar tail).
#[inline(always)]
fn dot_f16_single(a: &[f32], b: &[f32], lanes: usize) -> f32 {
    let mut acc = [[0.0f32; 16]; 4];
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        let lane = &mut acc[(i % (4 * lanes)) / lanes][i % lanes];
        *lane = x.mul_add(y, *lane);
    }
    let mut sum = [0.0f32; 16];
    for (l, s) in sum.iter_mut().enumerate() {
        *s = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    if lanes == 8 {
        let h: [f32; 4] = std::array::from_fn(|l| sum[l] + sum[l + 4]);
        (h[0] + h[1]) + (h[2] + h[3])
    } else {
        sum_lanes(&sum[..lanes])
    }
}

/// `Σ a·b` as llama.cpp's tiled matrix product for several queries sums it: element `i` goes
/// to lane `i mod lanes` of one accumulator, added fused; the lanes are then added as
/// [`sum_lanes`].
#[inline(always)]
fn dot_f16_tiled(a: &[f32], b: &[f32], lanes: usize) -> f32 {
    let mut acc = [0.0f32; 16];
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        acc[i % lanes] = x.mul_add(y, acc[i % lanes]);
    }
    sum_lanes(&acc[..lanes])
}

/// Softmax as ggml computes it: `exp(x − max)` in f32 (ggml's approximation), summed a
/// register at a time in f32 ([`sum_lanes`]) and those sums added in f64; each value then
/// multiplied by `1/sum` rounded to f32.
#[inline(always)]
fn softmax_f64_sum(x: &mut [f32], kernels: GgmlKernels) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // The cache's padding makes every group a full vector, all through ggml's `exp`.
    for v in x.iter_mut() {
        *v = ggml_math::exp(*v - max, kernels);
    }
    let lanes = kernels.lanes();
    let mut sum = 0.0f64;
    for chunk in x.chunks(lanes) {
        let mut register = [0.0f32; 16];
        register[..chunk.len()].copy_from_slice(chunk);
        sum += f64::from(sum_lanes(&register[..lanes]));
    }
    let inverse = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inverse;
    }
}

/// [`one_head`] compiled for FMA where the CPU has it: its fused products are a library call
/// otherwise (same results, slower).
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{Heads, Real};

    #[target_feature(enable = "fma")]
    fn one_head_fma<T: Real>(job: &Heads<'_, T>, i: usize, out: &mut [T]) {
        super::one_head(job, i, out)
    }

    pub(super) fn one_head<T: Real>(job: &Heads<'_, T>, i: usize, out: &mut [T]) {
        if is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA, the only requirement of the function.
            unsafe { one_head_fma(job, i, out) }
        } else {
            super::one_head(job, i, out)
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod simd {
    pub(super) use super::one_head;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::attention;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// `2²⁴ + 1` rounds back to `2²⁴` in f32, so where the 1 joins decides the sum: one
    /// accumulator (the tiled order) loses it; four accumulators, added `(a0 + a2) + (a1 + a3)`,
    /// keep it.
    #[test]
    fn the_two_summation_orders_are_ggml_s() {
        let ones = [1.0f32; 64];
        let mut b = [0.0f32; 64];
        b[0] = 16_777_216.0;
        b[8] = 1.0;
        b[16] = -16_777_216.0;
        assert_eq!(dot_f16_tiled(&ones, &b, 8), 0.0);
        assert_eq!(dot_f16_single(&ones, &b, 8), 1.0);
        // AVX-512's 16 lanes keep elements 0 and 16 in one lane, 8 in another.
        assert_eq!(dot_f16_tiled(&ones, &b, 16), 1.0);
        let mut b = [0.0f32; 64];
        b[0] = 16_777_216.0;
        b[16] = 1.0;
        b[32] = -16_777_216.0;
        assert_eq!(dot_f16_tiled(&ones, &b, 16), 0.0);
        assert_eq!(dot_f16_single(&ones, &b, 16), 1.0);
    }

    /// Against attention in f64 over the same f16 keys and values: within what rounding the
    /// query and the weights to f16 can move it; and not equal to plain f32 attention.
    #[test]
    fn rounds_query_and_weights_to_f16() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let shape = |start| AttentionShape {
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            causal_start: Some(start),
        };
        let f16 = |n: usize, rng: &mut ChaCha8Rng| -> Vec<f32> {
            (0..n)
                .map(|_| round_f16(rng.gen_range(-2.0f32..2.0)))
                .collect()
        };
        let (positions, width) = (13, 2 * 16);
        let keys = f16(positions * width, &mut rng);
        let values = f16(positions * width, &mut rng);
        // A prompt of 3 (tiled sums) at positions 10..13, and one query at 12.
        for (start, rows) in [(10, 3), (12, 1)] {
            let qv: Vec<f32> = (0..rows * 64)
                .map(|_| rng.gen_range(-2.0f32..2.0))
                .collect();
            let q = Matrix::from_vec(rows, 64, qv).unwrap();
            let got = attention_f16(&q, &keys, &values, &shape(start), GgmlKernels::Avx2);
            let widen = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
            let q64 = Matrix::from_vec(rows, 64, widen(q.as_slice())).unwrap();
            let want = attention(
                &q64,
                &widen(&keys),
                &widen(&values),
                start + rows,
                &shape(start),
            );
            let plain = attention(&q, &keys, &values, start + rows, &shape(start));
            let mut differs = 0;
            for ((g, w), p) in got
                .as_slice()
                .iter()
                .zip(want.as_slice())
                .zip(plain.as_slice())
            {
                // Scores move by ≤ 2⁻¹¹·Σ|q·k|/4 ≤ 0.06, weights by 2⁻¹¹ relative; |v| ≤ 2.
                assert!((f64::from(*g) - w).abs() <= 0.15, "{g} vs {w}");
                differs += usize::from(g != p);
            }
            assert!(
                differs > got.as_slice().len() / 2,
                "only {differs} differ from f32"
            );
        }
    }
}
