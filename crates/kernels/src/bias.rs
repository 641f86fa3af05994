//! `bias_rows_f32`: every row of `y` set to the bias, `y[r, c] = b[c]` — the start of a
//! linear layer with a bias: the matrix product then adds `A·Bᵀ` in place
//! (`gemm_bf16_residual`), so the bias costs one write of `C` and no extra pass.
//!
//! **Layout**: `b` `[cols]` f32, `y` `[rows, cols]` f32 row-major, `cols` a launch
//! argument (one kernel for every width), `rows` the grid: one block per row, threads
//! striding over the columns. Exact: the reference is the copy.

use quench_ir::{Builder, Function, Scalar, Type};
use quench_rt::{Arg, Launch};

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::gptr;

pub const NAME: &str = "bias_rows_f32";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BiasRowsParams {
    /// Threads per block.
    pub threads: u32,
}

impl BiasRowsParams {
    pub fn launch(&self, rows: u32) -> Launch {
        Launch::linear(rows, self.threads)
    }
}

/// `bias_rows_f32(b, y, cols)`, one block per row.
pub fn build(p: &BiasRowsParams) -> Result<Function, KernelError> {
    let mut k = Builder::new(NAME, p.threads);
    let b = k.param("b", gptr(Scalar::F32));
    let y = k.param("y", gptr(Scalar::F32));
    let cols = k.param("cols", Type::U32);
    let row = k.ctaid_x();
    let row64 = k.cvt(Scalar::U64, row);
    let cols64 = k.cvt(Scalar::U64, cols);
    let start = k.mul(row64, cols64);
    let yr = k.ptr_add(y, start);
    let tid = k.tid_x();
    let step = k.const_u32(p.threads);
    k.for_range(tid, cols, step, &[], |k, c, _| {
        let src = k.ptr_add(b, c);
        let v = k.load(Type::F32, src);
        let dst = k.ptr_add(yr, c);
        k.store(dst, v);
        vec![]
    });
    Ok(k.finish()?)
}

/// `rows` copies of `b`, back to back.
pub fn reference(b: &[f32], rows: usize) -> Vec<f32> {
    b.repeat(rows)
}

/// A case of `rows` rows of `cols` columns, the bias in ±[2^-6, 4].
pub fn case(
    p: &BiasRowsParams,
    rows: u32,
    cols: u32,
    seed: u64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let b = data::signed(&mut rng, cols as usize, 0.015625, 4.0);
    let want = reference(&b, rows as usize);
    let bytes = want.len() * 4;
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{rows}x{cols}"),
        kernel,
        launch: p.launch(rows),
        buffers: vec![
            Buffer::input("b", data::f32_bytes(&b)),
            Buffer::output("y", bytes),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Scalar(Arg::U32(cols)),
        ],
        expected: vec![Expected {
            buffer: 1,
            data: data::f32_bytes(&want),
            elem: Scalar::F32,
            check: Check::Exact,
        }],
        controls: vec![],
        bytes_moved: bytes as u64 + cols as u64 * 4,
        flops: 0,
    })
}
