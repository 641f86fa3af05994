//! Greedy decoding's last step: the index of the largest logit of each row.
//!
//! **Layout**: `logits` `[rows, cols]` f32 row-major, `cols` a multiple of 4 (fixed in the
//! kernel); `out` `[rows]` u32. One block per row; the row's 16-byte groups are walked by
//! [`crate::rows::RowWalk`], each thread keeping its best `(value, index)`; warps then
//! blocks combine by butterfly and through shared memory.
//!
//! **Order**: `(v, i)` beats `(w, j)` when `v > w`, or `v = w` and `i < j` — a total order
//! on the candidates (NaN never beats anything, so NaN logits are skipped), so the
//! combining order cannot change the result: ties go to the lowest index, and the
//! reference is a plain scan. A row of NaN only gives `u32::MAX`.

use quench_ir::{Builder, CacheOp, Function, Scalar, Type, Value};
use quench_rt::Launch;

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};
use crate::rows::{self, RowWalk};

pub const NAME: &str = "argmax_f32";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgmaxParams {
    pub cols: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl ArgmaxParams {
    fn walk(&self) -> RowWalk {
        RowWalk {
            groups: self.cols / 4,
            threads: self.threads,
        }
    }

    pub fn launch(&self, rows: u32) -> Launch {
        Launch::linear(rows, self.threads)
    }
}

/// Whether `(ov, oi)` beats `(v, i)`, and the winner.
fn emit_better(
    k: &mut Builder,
    (v, i): (Value, Value),
    (ov, oi): (Value, Value),
) -> (Value, Value) {
    let gt = k.gt(ov, v);
    let eq = k.eq(ov, v);
    let lower = k.lt(oi, i);
    let tie = k.and(eq, lower);
    let wins = k.or(gt, tie);
    (k.select(wins, ov, v), k.select(wins, oi, i))
}

fn emit_warp_best(k: &mut Builder, mut best: (Value, Value)) -> (Value, Value) {
    for m in [16, 8, 4, 2, 1] {
        let ov = k.shfl_bfly(best.0, m);
        let oi = k.shfl_bfly(best.1, m);
        best = emit_better(k, best, (ov, oi));
    }
    best
}

/// `argmax_f32(logits, out)`, one block per row.
pub fn build(p: &ArgmaxParams) -> Result<Function, KernelError> {
    rows::check(NAME, p.cols, 4, p.threads)?;
    let mut k = Builder::new(NAME, p.threads);
    let logits = k.param("logits", gptr(Scalar::F32));
    let out = k.param("out", gptr(Scalar::U32));
    let row = k.ctaid_x();
    let tid = k.tid_x();
    let start = wide_mul(&mut k, row, p.cols);
    let lr = k.ptr_add(logits, start);
    let neg_inf = k.const_f32(f32::NEG_INFINITY);
    let none = k.const_u32(u32::MAX);
    let best = p.walk().emit(&mut k, tid, &[neg_inf, none], &|k, g, c| {
        let first = k.shl_const(g, 2);
        let at = k.ptr_add(lr, first);
        let v = k.load_with(Type::Vec(Scalar::F32, 4), at, CacheOp::Nc);
        let mut best = (c[0], c[1]);
        for e in 0..4 {
            let x = k.extract(v, e);
            let i = k.add_const(first, e);
            best = emit_better(k, best, (x, i));
        }
        vec![best.0, best.1]
    });
    let mut best = emit_warp_best(&mut k, (best[0], best[1]));
    let warps = p.threads / 32;
    if warps > 1 {
        let vs = k.shared_array("values", Scalar::F32, warps, 16);
        let is = k.shared_array("indices", Scalar::U32, warps, 16);
        let lane = k.and_const(tid, 31);
        let warp = k.shr_const(tid, 5);
        let zero = k.const_u32(0);
        let first = k.eq(lane, zero);
        let (bv, bi) = best;
        k.if_then(first, |k| {
            let a = k.ptr_add(vs, warp);
            k.store(a, bv);
            let a = k.ptr_add(is, warp);
            k.store(a, bi);
        });
        k.barrier();
        let nw = k.const_u32(warps);
        let has = k.lt(lane, nw);
        let slot = k.if_else(
            has,
            &[Type::F32, Type::U32],
            |k| {
                let a = k.ptr_add(vs, lane);
                let v = k.load(Type::F32, a);
                let a = k.ptr_add(is, lane);
                vec![v, k.load(Type::U32, a)]
            },
            |k| vec![k.const_f32(f32::NEG_INFINITY), k.const_u32(u32::MAX)],
        );
        best = emit_warp_best(&mut k, (slot[0], slot[1]));
    }
    let zero = k.const_u32(0);
    let writer = k.eq(tid, zero);
    let index = best.1;
    k.if_then(writer, |k| {
        let at = k.ptr_add(out, row);
        k.store(at, index);
    });
    Ok(k.finish()?)
}

/// The index of each row's largest logit: the lowest on ties, NaN skipped, `u32::MAX`
/// for a row of NaN.
pub fn reference(cols: u32, logits: &[f32]) -> Vec<u32> {
    logits
        .chunks_exact(cols as usize)
        .map(|row| {
            let mut best = (f32::NEG_INFINITY, u32::MAX);
            for (i, &v) in row.iter().enumerate() {
                if v > best.0 || (v == best.0 && (i as u32) < best.1) {
                    best = (v, i as u32);
                }
            }
            best.1
        })
        .collect()
}

/// A case of `rows` rows of logits in ±[2^-4, 16], where each row's maximum appears
/// twice (the lower index must win) and a NaN and a −∞ are planted; with three rows or
/// more, the last row is all −∞ but for NaNs (index 0 wins).
pub fn case(p: &ArgmaxParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let cols = p.cols as usize;
    let mut logits = data::signed(&mut rng, rows as usize * cols, 0.0625, 16.0);
    for (r, row) in logits.chunks_exact_mut(cols).enumerate() {
        let pick = |rng: &mut rand_chacha::ChaCha8Rng| data::below(rng, p.cols) as usize;
        let (a, b) = (pick(&mut rng), pick(&mut rng));
        row[a] = 17.0;
        row[b] = 17.0;
        let nan = pick(&mut rng);
        if nan != a && nan != b {
            row[nan] = f32::NAN;
        }
        let low = pick(&mut rng);
        if low != a && low != b {
            row[low] = f32::NEG_INFINITY;
        }
        if rows >= 3 && r == rows as usize - 1 {
            row.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
            row[cols - 1] = f32::NAN;
        }
    }
    let want = reference(p.cols, &logits);
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{rows}x{}", p.cols),
        kernel,
        launch: p.launch(rows),
        buffers: vec![
            Buffer::input("logits", data::f32_bytes(&logits)),
            Buffer::output("out", rows as usize * 4),
        ],
        args: vec![CaseArg::Buffer(0), CaseArg::Buffer(1)],
        expected: vec![Expected {
            buffer: 1,
            data: want.iter().flat_map(|v| v.to_le_bytes()).collect(),
            elem: Scalar::U32,
            check: Check::Exact,
        }],
        controls: vec![],
        bytes_moved: rows as u64 * (p.cols as u64 * 4 + 4),
        flops: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_prefers_the_lowest_index_and_skips_nan() {
        let row = [1.0, f32::NAN, 3.0, 3.0, f32::NEG_INFINITY];
        assert_eq!(reference(5, &row), [2]);
        assert_eq!(reference(2, &[f32::NEG_INFINITY, f32::NEG_INFINITY]), [0]);
        assert_eq!(reference(2, &[f32::NAN, f32::NAN]), [u32::MAX]);
    }
}
