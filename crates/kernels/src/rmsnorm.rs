//! RMS normalization, `y = x / sqrt(mean(x²) + eps) · w`, bf16 in and out, f32 math.
//!
//! **Layout**: `x`, `y` row-major `[rows, cols]` bf16, `w` `[cols]` bf16, `cols` a
//! multiple of 8 (16-byte rows); `eps` is an f32 argument. One block per row (grid =
//! rows).
//!
//! **Arithmetic**: each thread accumulates `fma(x, x, acc)` over its groups of the row
//! ([`crate::rows::RowWalk`]), element by element; the block combines the partials with
//! [`crate::lanes::emit_block_allreduce`]; then `ms = ss · fl(1/cols)`,
//! `r = rcp.rn(sqrt.rn(ms + eps))` and `y = bf16((x · r) · w)`. Every operation is IEEE
//! with a fixed order, so the reference matches bit for bit.

use half::bf16;
use quench_ir::{Builder, Function, Scalar, Type};
use quench_rt::{Arg, Launch};

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{
    block_allreduce, emit_block_allreduce, emit_pack_bf16x2, emit_unpack_bf16x2, gptr, round_bf16,
    wide_mul, words, Combine,
};
use crate::rows::{self, RowWalk};

pub const NAME: &str = "rmsnorm_bf16";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormParams {
    pub cols: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl RmsNormParams {
    fn walk(&self) -> RowWalk {
        RowWalk {
            groups: self.cols / 8,
            threads: self.threads,
        }
    }

    pub fn launch(&self, rows: u32) -> Launch {
        Launch::linear(rows, self.threads)
    }

    /// `fl(1/cols)`, the constant the mean is taken with.
    fn inv_cols(&self) -> f32 {
        1.0 / self.cols as f32
    }
}

/// `rmsnorm_bf16(x, w, y, eps)`, launched with one block per row.
pub fn build(p: &RmsNormParams) -> Result<Function, KernelError> {
    rows::check(NAME, p.cols, 8, p.threads)?;
    let mut k = Builder::new(NAME, p.threads);
    let x = k.param("x", gptr(Scalar::BF16));
    let w = k.param("w", gptr(Scalar::BF16));
    let y = k.param("y", gptr(Scalar::BF16));
    let eps = k.param("eps", Type::F32);
    let row = k.ctaid_x();
    let tid = k.tid_x();
    // Row start in 32-bit words (two bf16 each).
    let start = wide_mul(&mut k, row, p.cols / 2);
    let xw = words(&mut k, x);
    let xr = k.ptr_add(xw, start);
    let yw = words(&mut k, y);
    let yr = k.ptr_add(yw, start);
    let ww = words(&mut k, w);
    let vec4 = Type::Vec(Scalar::U32, 4);

    let zero = k.const_f32(0.0);
    let acc = p.walk().emit(&mut k, tid, &[zero], &|k, g, c| {
        let at = k.mul_const(g, 4);
        let at = k.ptr_add(xr, at);
        let v = k.load(vec4, at);
        let mut acc = c[0];
        for i in 0..4 {
            let word = k.extract(v, i);
            for e in emit_unpack_bf16x2(k, word) {
                acc = k.fma(e, e, acc);
            }
        }
        vec![acc]
    });
    let ss = emit_block_allreduce(&mut k, acc[0], Combine::Sum, tid, p.threads, "partials");
    let inv_cols = k.const_f32(p.inv_cols());
    let ms = k.mul(ss, inv_cols);
    let ms_eps = k.add(ms, eps);
    let root = k.sqrt(ms_eps);
    let r = k.rcp(root);

    p.walk().emit(&mut k, tid, &[], &|k, g, _| {
        let at = k.mul_const(g, 4);
        let xa = k.ptr_add(xr, at);
        let wa = k.ptr_add(ww, at);
        let ya = k.ptr_add(yr, at);
        let vx = k.load(vec4, xa);
        let vw = k.load(vec4, wa);
        let out: Vec<_> = (0..4)
            .map(|i| {
                let wx = k.extract(vx, i);
                let ww = k.extract(vw, i);
                let xs = emit_unpack_bf16x2(k, wx);
                let ws = emit_unpack_bf16x2(k, ww);
                let [lo, hi] = [0, 1].map(|j| {
                    let xr = k.mul(xs[j], r);
                    k.mul(xr, ws[j])
                });
                emit_pack_bf16x2(k, lo, hi)
            })
            .collect();
        let v = k.pack(vec4, &out);
        k.store(ya, v);
        vec![]
    });
    Ok(k.finish()?)
}

/// The kernel's arithmetic, in its order.
pub fn reference(p: &RmsNormParams, x: &[bf16], w: &[bf16], eps: f32) -> Vec<bf16> {
    let walk = p.walk();
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks_exact(p.cols as usize) {
        let partials: Vec<f32> = (0..p.threads)
            .map(|t| {
                walk.groups_of(t)
                    .flat_map(|g| &row[g as usize * 8..g as usize * 8 + 8])
                    .fold(0.0f32, |acc, e| {
                        let e = e.to_f32();
                        e.mul_add(e, acc)
                    })
            })
            .collect();
        let ss = block_allreduce(&partials, Combine::Sum);
        let r = 1.0 / (ss * p.inv_cols() + eps).sqrt();
        y.extend(
            row.iter()
                .zip(w)
                .map(|(x, w)| round_bf16(x.to_f32() * r * w.to_f32())),
        );
    }
    y
}

/// A case of `rows` rows: activations in ±[2^-6, 4], weights in [0.25, 2], eps = 1e-6.
pub fn case(p: &RmsNormParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let n = rows as usize * p.cols as usize;
    let x = data::to_bf16(&data::signed(&mut rng, n, 0.015625, 4.0));
    let w = data::to_bf16(&data::uniform(&mut rng, p.cols as usize, 0.25, 2.0));
    let eps = 1e-6f32;
    let want = reference(p, &x, &w, eps);
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{rows}x{}", p.cols),
        kernel,
        launch: p.launch(rows),
        buffers: vec![
            Buffer::input("x", data::bf16_bytes(&x)),
            Buffer::input("w", data::bf16_bytes(&w)),
            Buffer::output("y", n * 2),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::F32(eps)),
        ],
        expected: vec![Expected {
            buffer: 2,
            data: data::bf16_bytes(&want),
            elem: Scalar::BF16,
            check: Check::Exact,
        }],
        controls: vec![],
        bytes_moved: (2 * n + p.cols as usize) as u64 * 2,
        flops: 4 * n as u64,
    })
}
