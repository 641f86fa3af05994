//! The RMSNorm prologue of the matrix–vector kernels, and the row RMS it is built on
//! (also used per head by [`crate::attention::rope_append`]).
//!
//! A decoder's projections read `x = RMSNorm(R)·w` of the f32 residual stream `R`. The
//! prologue forms `x` inside the GEMV so that the norm needs no dispatch of its own:
//! every block reduces the whole of `R` (a few KiB, read from cache by all blocks),
//! computes `inv = 1 / sqrt(mean(R²) + eps)` and stages `x_i = (R_i · inv) · w_i` in
//! shared memory, where its warps read it instead of a global `x`. The standalone
//! [`crate::rmsnorm_rows`] kernel writes the same values to global memory with the same
//! emitter, for the kernels without a prologue.
//!
//! **Arithmetic**: IEEE operations in a fixed order, as `rmsnorm_residual_f32` computes
//! them: each thread folds `fma(h, h, acc)` over its 16-byte groups of the row
//! ([`RowWalk`] order, four elements a group), the block all-reduces the partials
//! ([`emit_block_allreduce`]), `mean = sum · fl(1/cols)`, `inv = rcp.rn(sqrt.rn(mean +
//! eps))`. [`inv_rms`] and [`normalize`] repeat the order on the host, bit for bit.
//!
//! The sum is walked by at most [`NORM_THREADS`] threads whatever the block's size (the
//! others add zeros to the all-reduction, which changes no bit), so a product's values do
//! not depend on the warps it runs with, and [`crate::rmsnorm_rows`] at that size writes
//! what every product's prologue stages.

use quench_ir::{Builder, Scalar, Type, Value};

use crate::lanes::{block_allreduce, emit_block_allreduce, Combine};
use crate::rows::RowWalk;

/// Most f32 the prologue stages: `4·cols` bytes of shared memory per vector of a pass, at
/// most 44 KiB in all (the static limit is 48 KiB, and the reductions need a few slots).
pub const MAX_COLS: u32 = 11 * 1024;

/// Most threads that walk the row for its sum of squares.
pub const NORM_THREADS: u32 = 128;

/// Four f32 at group `g` (elements `4g..4g + 4`) of `base`.
fn load4(k: &mut Builder, base: Value, g: Value) -> Vec<Value> {
    let at = k.shl_const(g, 2);
    let at = k.ptr_add(base, at);
    let v = k.load(Type::Vec(Scalar::F32, 4), at);
    (0..4).map(|i| k.extract(v, i)).collect()
}

/// `1 / sqrt(mean(row²) + eps)` of the `cols` f32 at `row` (`cols` a multiple of 4,
/// `row` 16-byte aligned), reduced over `threads` threads (a multiple of 32; the first
/// [`NORM_THREADS`] of them walk the row) of which this is thread `tid`; every one of
/// them gets the result. With `threads = 32` the
/// reduction stays within the warp (no barrier); otherwise the whole block must reach it.
/// `name` names the reduction's shared slots.
pub fn emit_inv_rms(
    k: &mut Builder,
    row: Value,
    cols: u32,
    tid: Value,
    threads: u32,
    eps: Value,
    name: &str,
) -> Value {
    let zero = k.const_f32(0.0);
    let walkers = threads.min(NORM_THREADS);
    let walk = RowWalk {
        groups: cols / 4,
        threads: walkers,
    };
    let sum_squares = |k: &mut Builder| {
        walk.emit(k, tid, &[zero], &|k, g, c| {
            let hs = load4(k, row, g);
            vec![hs.iter().fold(c[0], |acc, &h| k.fma(h, h, acc))]
        })
    };
    let acc = if walkers < threads {
        let walkers = k.const_u32(walkers);
        let walks = k.lt(tid, walkers);
        k.if_else(walks, &[Type::F32], sum_squares, |_| vec![zero])
    } else {
        sum_squares(k)
    };
    let sum = emit_block_allreduce(k, acc[0], Combine::Sum, tid, threads, name);
    let inv_cols = k.const_f32(1.0 / cols as f32);
    let mean = k.mul(sum, inv_cols);
    let shifted = k.add(mean, eps);
    let root = k.sqrt(shifted);
    k.rcp(root)
}

/// The prologue: `x = (R · inv) · w` of the f32 row `r` and norm weight `w` (`cols` f32
/// each), written to `dst` (`cols` f32, 16-byte aligned: the shared array the pass's
/// warps read, or a global row for [`crate::rmsnorm_rows`]). The whole
/// block (`threads` threads, this one `tid`) must reach it; `name` names the reduction's
/// shared slots. It does not end with a barrier: the caller puts one after the last row
/// it stages, before any thread reads them.
#[allow(clippy::too_many_arguments)]
pub fn emit_stage_normalized(
    k: &mut Builder,
    r: Value,
    w: Value,
    eps: Value,
    cols: u32,
    tid: Value,
    threads: u32,
    dst: Value,
    name: &str,
) {
    let inv = emit_inv_rms(k, r, cols, tid, threads, eps, name);
    // Each thread normalizes the groups it summed: the row is read from global memory
    // once more (from cache), the weight once.
    let walk = RowWalk {
        groups: cols / 4,
        threads,
    };
    walk.emit(k, tid, &[], &|k, g, _| {
        let hs = load4(k, r, g);
        let ws = load4(k, w, g);
        let ys: Vec<Value> = hs
            .iter()
            .zip(&ws)
            .map(|(&h, &wi)| {
                let n = k.mul(h, inv);
                k.mul(n, wi)
            })
            .collect();
        let v = k.pack(Type::Vec(Scalar::F32, 4), &ys);
        let at = k.shl_const(g, 2);
        let at = k.ptr_add(dst, at);
        k.store(at, v);
        vec![]
    });
}

/// Host twin of [`emit_inv_rms`].
pub fn inv_rms(row: &[f32], threads: u32, eps: f32) -> f32 {
    let walk = RowWalk {
        groups: row.len() as u32 / 4,
        threads: threads.min(NORM_THREADS),
    };
    let partials: Vec<f32> = (0..threads)
        .map(|t| {
            if t >= walk.threads {
                return 0.0;
            }
            walk.groups_of(t)
                .flat_map(|g| &row[g as usize * 4..g as usize * 4 + 4])
                .fold(0.0f32, |acc, &h| h.mul_add(h, acc))
        })
        .collect();
    let sum = block_allreduce(&partials, Combine::Sum);
    1.0 / (sum * (1.0 / row.len() as f32) + eps).sqrt()
}

/// Host twin of [`emit_stage_normalized`]: `(row_i · inv) · w_i`.
pub fn normalize(row: &[f32], w: &[f32], threads: u32, eps: f32) -> Vec<f32> {
    let inv = inv_rms(row, threads, eps);
    row.iter().zip(w).map(|(&h, &wi)| h * inv * wi).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data;
    use crate::norm_residual::{self, Norm, NormOut, NormResidualParams};

    /// The prologue computes what `rmsnorm_residual_f32` computes from a zero `x` at the
    /// same block size (at most [`NORM_THREADS`]), bit for bit: fusing the norm into the
    /// projections changes no value, and neither does a larger block.
    #[test]
    fn matches_the_standalone_norm() {
        let mut rng = data::rng(data::test_seed());
        for (cols, threads) in [(576, 128), (128, 32), (2048, 256)] {
            let r = data::signed(&mut rng, cols, 0.015625, 4.0);
            let w = data::uniform(&mut rng, cols, 0.25, 2.0);
            let standalone = threads.min(NORM_THREADS);
            let p = NormResidualParams {
                norm: Norm::Rms,
                out: NormOut::F32,
                cols: cols as u32,
                threads: standalone,
            };
            let (_, want) = norm_residual::reference(&p, &vec![0.0; cols], &r, &w, &[], 1e-5);
            let got = normalize(&r, &w, threads, 1e-5);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "cols {cols}"
            );
        }
    }
}
