//! RMS normalization of rows of the f32 residual stream into f32 activations,
//! `y = RMSNorm(x)·w` per row, for the matrix–vector kernels without a prologue.
//!
//! It computes what the matrix–vector kernels' RMSNorm prologue stages in shared memory,
//! with the same emitter ([`prologue::emit_stage_normalized`], here storing to global
//! memory): at the prologue's block size a row has the same bits either way. A decode
//! step of several rows normalizes each row once with this kernel and then multiplies
//! 8 vectors a pass, where the prologue could stage only as many normalized rows as
//! its shared memory holds ([`crate::qgemv::widest_batch`]: two at 4096 columns).
//!
//! **Layout**: `x`, `y` `[rows, cols]` f32 row-major, `w` `[cols]` f32, `cols` a multiple
//! of 4 (16-byte rows); `eps` an f32 argument. One block per row (grid = rows); `y` must
//! not alias `x`.
//!
//! **Arithmetic**: the prologue's ([`prologue`]): IEEE operations in a fixed order that
//! depends on `cols` and the block size only; [`reference`] repeats it bit for bit.

use quench_ir::{Builder, Function, Scalar, Type};
use quench_rt::{Arg, Launch};

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};
use crate::qgemv::prologue;
use crate::rows;

pub const NAME: &str = "rmsnorm_rows_f32";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormRowsParams {
    pub cols: u32,
    /// Threads per block: a multiple of 32, at most 1024. The bits match the prologue of
    /// a matrix–vector kernel with as many threads (`warps · 32`).
    pub threads: u32,
}

impl RmsNormRowsParams {
    pub fn launch(&self, rows: u32) -> Launch {
        Launch::linear(rows, self.threads)
    }
}

/// `rmsnorm_rows_f32(x, w, y, eps)`, launched with one block per row.
pub fn build(p: &RmsNormRowsParams) -> Result<Function, KernelError> {
    rows::check(NAME, p.cols, 4, p.threads)?;
    let mut k = Builder::new(NAME, p.threads);
    let x = k.param("x", gptr(Scalar::F32));
    let w = k.param("w", gptr(Scalar::F32));
    let y = k.param("y", gptr(Scalar::F32));
    let eps = k.param("eps", Type::F32);
    let row = k.ctaid_x();
    let tid = k.tid_x();
    let start = wide_mul(&mut k, row, p.cols);
    let xr = k.ptr_add(x, start);
    let yr = k.ptr_add(y, start);
    prologue::emit_stage_normalized(&mut k, xr, w, eps, p.cols, tid, p.threads, yr, "rms");
    Ok(k.finish()?)
}

/// The kernel's arithmetic, in its order: each row of `x` normalized.
pub fn reference(p: &RmsNormRowsParams, x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    x.chunks_exact(p.cols as usize)
        .flat_map(|row| prologue::normalize(row, w, p.threads, eps))
        .collect()
}

/// A case of `rows` rows: the residual stream in ±[2^-6, 4], the weight in [0.5, 1.5],
/// eps 1e-5 (the ranges of the matrix–vector kernels' prologue cases).
pub fn case(p: &RmsNormRowsParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let mut rng = data::rng(seed);
    let n = rows as usize * p.cols as usize;
    let x = data::signed(&mut rng, n, 0.015625, 4.0);
    let w = data::uniform(&mut rng, p.cols as usize, 0.5, 1.5);
    case_on(p, &x, &w, 1e-5)
}

/// The case of normalizing the rows of `x` (`[rows, cols]`) with weight `w` (`[cols]`)
/// and `eps`, checked bit for bit against [`reference`].
pub fn case_on(
    p: &RmsNormRowsParams,
    x: &[f32],
    w: &[f32],
    eps: f32,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let (n, cols) = (x.len(), p.cols as usize);
    if w.len() != cols || n % cols != 0 {
        let reason = format!(
            "{n} inputs and a weight of {} do not make rows of {cols}",
            w.len()
        );
        return Err(KernelError::unsupported(NAME, reason));
    }
    let rows = n / cols;
    let want = reference(p, x, w, eps);
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{rows}x{}", p.cols),
        kernel,
        launch: p.launch(rows as u32),
        buffers: vec![
            Buffer::input("x", data::f32_bytes(x)),
            Buffer::input("w", data::f32_bytes(w)),
            Buffer::output("y", n * 4),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::F32(eps)),
        ],
        expected: vec![Expected {
            buffer: 2,
            data: data::f32_bytes(&want),
            elem: Scalar::F32,
            check: Check::Exact,
        }],
        controls: vec![],
        // x read (its second read hits the cache), y written, w read.
        bytes_moved: (2 * n + p.cols as usize) as u64 * 4,
        flops: 4 * n as u64,
    })
}
