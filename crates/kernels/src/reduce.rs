//! Row reductions, sum or max, f32: `y[r] = Σ_c x[r][c]` or `max_c x[r][c]`.
//!
//! **Layout**: `x` is row-major `[rows, cols]` f32 with `cols` a multiple of 4 (so that
//! every row starts 16-byte aligned), `y` is `[rows]` f32. One block per row (grid =
//! rows). Each thread folds its groups of the row ([`crate::rows::RowWalk`]), element by
//! element, into one partial; the block then combines the partials with
//! [`crate::lanes::emit_block_allreduce`]. That order is fixed, and the reference
//! follows it, so sums match bit for bit.

use quench_ir::{Builder, Function, Scalar, Type};
use quench_rt::Launch;

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{block_allreduce, emit_block_allreduce, gptr, wide_mul, Combine};
use crate::rows::{self, RowWalk};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceParams {
    pub op: Combine,
    pub cols: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl ReduceParams {
    pub fn name(&self) -> &'static str {
        match self.op {
            Combine::Sum => "reduce_sum_f32",
            Combine::Max => "reduce_max_f32",
        }
    }

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

/// `reduce_{sum,max}_f32(x, y)`, launched with one block per row.
pub fn build(p: &ReduceParams) -> Result<Function, KernelError> {
    rows::check(p.name(), p.cols, 4, p.threads)?;
    let op = p.op;
    let mut k = Builder::new(p.name(), p.threads);
    let x = k.param("x", gptr(Scalar::F32));
    let y = k.param("y", gptr(Scalar::F32));
    let row = k.ctaid_x();
    let tid = k.tid_x();
    let start = wide_mul(&mut k, row, p.cols);
    let xr = k.ptr_add(x, start);
    let init = k.const_f32(op.identity());
    let acc = p.walk().emit(&mut k, tid, &[init], &|k, g, c| {
        let at = k.mul_const(g, 4);
        let at = k.ptr_add(xr, at);
        let v = k.load(Type::Vec(Scalar::F32, 4), at);
        let mut acc = c[0];
        for i in 0..4 {
            let e = k.extract(v, i);
            acc = op.emit(k, acc, e);
        }
        vec![acc]
    });
    let total = emit_block_allreduce(&mut k, acc[0], op, tid, p.threads, "partials");
    let zero = k.const_u32(0);
    let first = k.eq(tid, zero);
    k.if_then(first, |k| {
        let at = k.ptr_add(y, row);
        k.store(at, total);
    });
    Ok(k.finish()?)
}

/// The reduction of each row in the kernel's order.
pub fn reference(p: &ReduceParams, x: &[f32]) -> Vec<f32> {
    let walk = p.walk();
    x.chunks_exact(p.cols as usize)
        .map(|row| {
            let partials: Vec<f32> = (0..p.threads)
                .map(|t| {
                    walk.groups_of(t)
                        .flat_map(|g| &row[g as usize * 4..g as usize * 4 + 4])
                        .fold(p.op.identity(), |acc, &e| p.op.apply(acc, e))
                })
                .collect();
            block_allreduce(&partials, p.op)
        })
        .collect()
}

/// A case of `rows` rows, values of magnitude in [2^-8, 16].
pub fn case(p: &ReduceParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let x = data::signed(&mut rng, rows as usize * p.cols as usize, 0.00390625, 16.0);
    let want = reference(p, &x);
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!("{rows}x{}", p.cols),
        kernel,
        launch: p.launch(rows),
        buffers: vec![
            Buffer::input("x", data::f32_bytes(&x)),
            Buffer::output("y", rows as usize * 4),
        ],
        args: vec![CaseArg::Buffer(0), CaseArg::Buffer(1)],
        expected: vec![Expected {
            buffer: 1,
            data: data::f32_bytes(&want),
            elem: Scalar::F32,
            check: Check::Exact,
        }],
        controls: vec![],
        bytes_moved: (x.len() as u64 + rows as u64) * 4,
        flops: x.len() as u64,
    })
}
