//! The residual add fused with the normalization that follows it:
//! `h = x + residual` (written back as the new residual), then
//! - RMSNorm: `y = (h · r) · w` with `r = 1 / sqrt(mean(h²) + eps)` (llama, qwen), or
//! - LayerNorm: `y = ((h − μ) · r) · w + b` with `μ = mean(h)`,
//!   `r = 1 / sqrt(mean((h − μ)²) + eps)` (bert).
//!
//! **Layout**: `x`, `residual` `[rows, cols]` f32 row-major (the residual stream is f32);
//! `w`, `b` `[cols]` f32 (norm weights are kept in f32: GGUF stores them so, and widening
//! bf16 ones is exact); `y` `[rows, cols]` f32, bf16 or f16 (a 16-bit type feeds the next projection's
//! tensor cores);
//! `eps` an f32 argument. `cols` a multiple of 4: groups of 4 f32 (16 bytes) walked by
//! [`crate::rows::RowWalk`], one block per row (grid = rows).
//!
//! **Arithmetic**: IEEE operations only, in a fixed order — per-thread partial sums in
//! walk order (`fma(h, h, acc)` for RMS, `acc + h` then `fma(d, d, acc)` with `d = h − μ`
//! for LayerNorm), block all-reductions ([`crate::lanes::emit_block_allreduce`]),
//! `mean = sum · fl(1/cols)`, `r = rcp.rn(sqrt.rn(mean + eps))`. The passes after the
//! first read `h` back from `residual` (each thread reads exactly what it wrote). The
//! reference repeats the order, so it matches bit for bit.

use quench_ir::{Builder, Function, Scalar, Type, Value};
use quench_rt::{Arg, Launch};

use crate::case::{Buffer, CaseArg, Check, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{
    block_allreduce, emit_block_allreduce, emit_pack_bf16x2, emit_pack_f16x2, gptr, round_bf16,
    wide_mul, Combine,
};
use crate::rows::{self, RowWalk};

/// Which normalization follows the residual add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Norm {
    Rms,
    Layer,
}

/// The element type of the normalized output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutType {
    F32,
    BF16,
}

/// The element type of a normalized output: f32, or a 16-bit type the next
/// projection's tensor cores read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormOut {
    F32,
    BF16,
    /// f16, the prompt path's activations: an 11-bit significand, ±65504 at most.
    F16,
}

impl NormOut {
    pub fn scalar(self) -> Scalar {
        match self {
            NormOut::F32 => Scalar::F32,
            NormOut::BF16 => Scalar::BF16,
            NormOut::F16 => Scalar::F16,
        }
    }
}

impl OutType {
    pub fn scalar(self) -> Scalar {
        match self {
            OutType::F32 => Scalar::F32,
            OutType::BF16 => Scalar::BF16,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormResidualParams {
    pub norm: Norm,
    pub out: NormOut,
    pub cols: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl NormResidualParams {
    /// The library name (`rmsnorm_residual_bf16`).
    pub fn name(&self) -> &'static str {
        match (self.norm, self.out) {
            (Norm::Rms, NormOut::F32) => "rmsnorm_residual_f32",
            (Norm::Rms, NormOut::BF16) => "rmsnorm_residual_bf16",
            (Norm::Rms, NormOut::F16) => "rmsnorm_residual_f16",
            (Norm::Layer, NormOut::F32) => "layernorm_residual_f32",
            (Norm::Layer, NormOut::BF16) => "layernorm_residual_bf16",
            (Norm::Layer, NormOut::F16) => "layernorm_residual_f16",
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

    fn inv_cols(&self) -> f32 {
        1.0 / self.cols as f32
    }
}

/// `rmsnorm_residual_<out>(x, residual, w, y, eps)` or
/// `layernorm_residual_<out>(x, residual, w, b, y, eps)`, one block per row.
pub fn build(p: &NormResidualParams) -> Result<Function, KernelError> {
    rows::check(p.name(), p.cols, 4, p.threads)?;
    let mut k = Builder::new(p.name(), p.threads);
    let x = k.param("x", gptr(Scalar::F32));
    let res = k.param("residual", gptr(Scalar::F32));
    let w = k.param("w", gptr(Scalar::F32));
    let b = (p.norm == Norm::Layer).then(|| k.param("b", gptr(Scalar::F32)));
    let y = k.param("y", gptr(p.out.scalar()));
    let eps = k.param("eps", Type::F32);
    let row = k.ctaid_x();
    let tid = k.tid_x();
    let start = wide_mul(&mut k, row, p.cols);
    let xr = k.ptr_add(x, start);
    let rr = k.ptr_add(res, start);
    let yr = k.ptr_add(y, start);
    let vec4 = Type::Vec(Scalar::F32, 4);
    let load4 = |k: &mut Builder, base: Value, g: Value| {
        let at = k.mul_const(g, 4);
        let at = k.ptr_add(base, at);
        let v = k.load(vec4, at);
        (0..4).map(|i| k.extract(v, i)).collect::<Vec<_>>()
    };

    // Pass 1: h = x + residual, stored back; partial sums of h² (RMS) or h (LayerNorm).
    let zero = k.const_f32(0.0);
    let norm = p.norm;
    let acc = p.walk().emit(&mut k, tid, &[zero], &|k, g, c| {
        let xs = load4(k, xr, g);
        let rs = load4(k, rr, g);
        let hs: Vec<Value> = xs.iter().zip(&rs).map(|(&a, &b)| k.add(a, b)).collect();
        let v = k.pack(vec4, &hs);
        let at = k.mul_const(g, 4);
        let at = k.ptr_add(rr, at);
        k.store(at, v);
        let mut acc = c[0];
        for h in hs {
            acc = match norm {
                Norm::Rms => k.fma(h, h, acc),
                Norm::Layer => k.add(acc, h),
            };
        }
        vec![acc]
    });
    let inv_cols = k.const_f32(p.inv_cols());
    let sum = emit_block_allreduce(&mut k, acc[0], Combine::Sum, tid, p.threads, "sum");
    let (mean, sq) = match p.norm {
        Norm::Rms => (None, sum),
        Norm::Layer => {
            // Pass 2: the centred sum of squares.
            let mean = k.mul(sum, inv_cols);
            let acc = p.walk().emit(&mut k, tid, &[zero], &|k, g, c| {
                let hs = load4(k, rr, g);
                let mut acc = c[0];
                for h in hs {
                    let d = k.sub(h, mean);
                    acc = k.fma(d, d, acc);
                }
                vec![acc]
            });
            (
                Some(mean),
                emit_block_allreduce(&mut k, acc[0], Combine::Sum, tid, p.threads, "squares"),
            )
        }
    };
    let ms = k.mul(sq, inv_cols);
    let ms_eps = k.add(ms, eps);
    let root = k.sqrt(ms_eps);
    let r = k.rcp(root);

    // Last pass: normalize, scale (and shift), store.
    let out = p.out;
    p.walk().emit(&mut k, tid, &[], &|k, g, _| {
        let hs = load4(k, rr, g);
        let ws = load4(k, w, g);
        let bs = b.map(|b| load4(k, b, g));
        let ys: Vec<Value> = (0..4)
            .map(|i| {
                let centred = match mean {
                    Some(m) => k.sub(hs[i], m),
                    None => hs[i],
                };
                let n = k.mul(centred, r);
                let scaled = k.mul(n, ws[i]);
                match &bs {
                    Some(bs) => k.add(scaled, bs[i]),
                    None => scaled,
                }
            })
            .collect();
        let at = k.mul_const(g, 4);
        match out {
            NormOut::F32 => {
                let v = k.pack(vec4, &ys);
                let at = k.ptr_add(yr, at);
                k.store(at, v);
            }
            NormOut::BF16 | NormOut::F16 => {
                let pack = match out {
                    NormOut::BF16 => emit_pack_bf16x2,
                    _ => emit_pack_f16x2,
                };
                let lo = pack(k, ys[0], ys[1]);
                let hi = pack(k, ys[2], ys[3]);
                let v = k.pack(Type::Vec(Scalar::U32, 2), &[lo, hi]);
                let words = k.ptr_cast(Scalar::U32, yr);
                let at = k.shr_const(at, 1);
                let at = k.ptr_add(words, at);
                k.store(at, v);
            }
        }
        vec![]
    });
    Ok(k.finish()?)
}

/// What the kernel computes, in its order: the new residual `h` and the output `y`
/// (f32 values, to be rounded for a 16-bit output).
pub fn reference(
    p: &NormResidualParams,
    x: &[f32],
    residual: &[f32],
    w: &[f32],
    b: &[f32],
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let walk = p.walk();
    let cols = p.cols as usize;
    let h: Vec<f32> = x.iter().zip(residual).map(|(a, b)| a + b).collect();
    let mut y = Vec::with_capacity(h.len());
    // Each thread's partial over its groups, in walk order, then the block's tree.
    let reduce = |row: &[f32], f: &dyn Fn(f32, f32) -> f32| {
        let partials: Vec<f32> = (0..p.threads)
            .map(|t| {
                walk.groups_of(t)
                    .flat_map(|g| &row[g as usize * 4..g as usize * 4 + 4])
                    .fold(0.0f32, |a, &v| f(a, v))
            })
            .collect();
        block_allreduce(&partials, Combine::Sum)
    };
    for row in h.chunks_exact(cols) {
        let (mean, sq) = match p.norm {
            Norm::Rms => (None, reduce(row, &|a, v| v.mul_add(v, a))),
            Norm::Layer => {
                let mean = reduce(row, &|a, v| a + v) * p.inv_cols();
                (
                    Some(mean),
                    reduce(row, &|a, v| (v - mean).mul_add(v - mean, a)),
                )
            }
        };
        let r = 1.0 / (sq * p.inv_cols() + eps).sqrt();
        for (i, &v) in row.iter().enumerate() {
            let centred = mean.map_or(v, |m| v - m);
            let scaled = centred * r * w[i];
            y.push(if p.norm == Norm::Layer {
                scaled + b[i]
            } else {
                scaled
            });
        }
    }
    (h, y)
}

/// A case of `rows` rows: `x` and the residual in ±[2^-6, 4], `w` in [0.25, 2], `b` in
/// ±[2^-6, 1]; eps = 1e-6 (RMS) or 1e-12 (LayerNorm, bert's).
pub fn case(p: &NormResidualParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let n = rows as usize * p.cols as usize;
    let cols = p.cols as usize;
    let x = data::signed(&mut rng, n, 0.015625, 4.0);
    let residual = data::signed(&mut rng, n, 0.015625, 4.0);
    let w = data::uniform(&mut rng, cols, 0.25, 2.0);
    let b = data::signed(&mut rng, cols, 0.015625, 1.0);
    let eps = if p.norm == Norm::Rms { 1e-6f32 } else { 1e-12 };
    let (h, y) = reference(p, &x, &residual, &w, &b, eps);
    let (y_bytes, y_elem) = match p.out {
        NormOut::F32 => (data::f32_bytes(&y), Scalar::F32),
        NormOut::BF16 => (
            data::bf16_bytes(&y.iter().map(|&v| round_bf16(v)).collect::<Vec<_>>()),
            Scalar::BF16,
        ),
        NormOut::F16 => (data::f16_bytes(&y), Scalar::F16),
    };
    let mut buffers = vec![
        Buffer::input("x", data::f32_bytes(&x)),
        Buffer::in_out("residual", data::f32_bytes(&residual)),
        Buffer::input("w", data::f32_bytes(&w)),
    ];
    if p.norm == Norm::Layer {
        buffers.push(Buffer::input("b", data::f32_bytes(&b)));
    }
    let yi = buffers.len();
    buffers.push(Buffer::output("y", y_bytes.len()));
    let mut args: Vec<CaseArg> = (0..buffers.len()).map(CaseArg::Buffer).collect();
    args.push(CaseArg::Scalar(Arg::F32(eps)));
    let out_bytes = (p.out.scalar().bytes() as usize * n) as u64;
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!("{rows}x{}", p.cols),
        kernel,
        launch: p.launch(rows),
        buffers,
        args,
        expected: vec![
            Expected {
                buffer: 1,
                data: data::f32_bytes(&h),
                elem: Scalar::F32,
                check: Check::Exact,
            },
            Expected {
                buffer: yi,
                data: y_bytes,
                elem: y_elem,
                check: Check::Exact,
            },
        ],
        controls: vec![],
        bytes_moved: 3 * 4 * n as u64
            + out_bytes
            + if p.norm == Norm::Layer { 8 } else { 4 } * cols as u64,
        flops: if p.norm == Norm::Layer { 8 } else { 5 } * n as u64,
    })
}
