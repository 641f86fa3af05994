//! Row softmax, f32: `y[r][c] = e^(x[r][c] − m_r) / Σ_c' e^(x[r][c'] − m_r)` with
//! `m_r = max_c x[r][c]`.
//!
//! **Layout**: `x`, `y` row-major `[rows, cols]` f32 with `cols` a multiple of 4; one
//! block per row (grid = rows). Three walks over the row
//! ([`crate::rows::RowWalk`]): the maximum, the sum of exponentials, and the output
//! (the row is read again rather than kept, which the cache serves).
//!
//! **Arithmetic**: `e = ex2.approx((x − m) · fl(log2 e))`, partial sums per thread in walk
//! order, block all-reductions, `inv = rcp.rn(sum)`, `y = e · inv`. `ex2.approx` makes
//! the check a bound: see [`tolerance`].

use quench_ir::{Builder, Function, Scalar, Type, Value};
use quench_rt::Launch;

use crate::approx::{gamma, EX2_REL, F32_MIN_NORMAL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{emit_block_allreduce, gptr, wide_mul, Combine};
use crate::rows::{self, RowWalk};

pub const NAME: &str = "softmax_f32";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoftmaxParams {
    pub cols: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl SoftmaxParams {
    fn walk(&self) -> RowWalk {
        RowWalk {
            groups: self.cols / 4,
            threads: self.threads,
        }
    }

    pub fn launch(&self, rows: u32) -> Launch {
        Launch::linear(rows, self.threads)
    }

    /// Height of the summation tree: each thread's chain, then two 5-level butterflies.
    fn sum_height(&self) -> u64 {
        4 * self.walk().groups.div_ceil(self.threads) as u64 + 10
    }
}

/// `softmax_f32(x, y)`, launched with one block per row.
pub fn build(p: &SoftmaxParams) -> Result<Function, KernelError> {
    rows::check(NAME, p.cols, 4, p.threads)?;
    let mut k = Builder::new(NAME, p.threads);
    let x = k.param("x", gptr(Scalar::F32));
    let y = k.param("y", gptr(Scalar::F32));
    let row = k.ctaid_x();
    let tid = k.tid_x();
    let start = wide_mul(&mut k, row, p.cols);
    let xr = k.ptr_add(x, start);
    let yr = k.ptr_add(y, start);
    let vec4 = Type::Vec(Scalar::F32, 4);
    let load = |k: &mut Builder, g: Value| {
        let at = k.mul_const(g, 4);
        let at = k.ptr_add(xr, at);
        k.load(vec4, at)
    };

    let lowest = k.const_f32(f32::NEG_INFINITY);
    let m = p.walk().emit(&mut k, tid, &[lowest], &|k, g, c| {
        let v = load(k, g);
        let mut m = c[0];
        for i in 0..4 {
            let e = k.extract(v, i);
            m = k.max(m, e);
        }
        vec![m]
    });
    let m = emit_block_allreduce(&mut k, m[0], Combine::Max, tid, p.threads, "row_max");
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let exp = |k: &mut Builder, v: Value| {
        let d = k.sub(v, m);
        let t = k.mul(d, log2e);
        k.ex2_approx(t)
    };

    let zero = k.const_f32(0.0);
    let s = p.walk().emit(&mut k, tid, &[zero], &|k, g, c| {
        let v = load(k, g);
        let mut s = c[0];
        for i in 0..4 {
            let e = k.extract(v, i);
            let e = exp(k, e);
            s = k.add(s, e);
        }
        vec![s]
    });
    let s = emit_block_allreduce(&mut k, s[0], Combine::Sum, tid, p.threads, "row_sum");
    let inv = k.rcp(s);

    p.walk().emit(&mut k, tid, &[], &|k, g, _| {
        let v = load(k, g);
        let out: Vec<Value> = (0..4)
            .map(|i| {
                let e = k.extract(v, i);
                let e = exp(k, e);
                k.mul(e, inv)
            })
            .collect();
        let o = k.pack(vec4, &out);
        let at = k.mul_const(g, 4);
        let at = k.ptr_add(yr, at);
        k.store(at, o);
        vec![]
    });
    Ok(k.finish()?)
}

/// The exact softmax of each row (in f64), rounded to f32.
pub fn reference(cols: u32, x: &[f32]) -> Vec<f32> {
    map_rows(cols, x, |v| v as f32)
}

/// A deliberately wrong reference: the exact result rounded to bf16 precision, as a
/// kernel that kept its exponentials in bf16 would give.
pub fn reference_bf16_precision(cols: u32, x: &[f32]) -> Vec<f32> {
    map_rows(cols, x, |v| half::bf16::from_f64(v).to_f32())
}

fn map_rows(cols: u32, x: &[f32], round: impl Fn(f64) -> f32) -> Vec<f32> {
    let mut y = Vec::with_capacity(x.len());
    for row in x.chunks_exact(cols as usize) {
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
        y.extend(row.iter().map(|&v| round((v as f64 - m).exp() / s)));
    }
    y
}

/// Per-element tolerance against [`reference()`], and how it follows.
///
/// With `D` the largest `m − x` over the data: the exponent `t = fl(fl(x − m)·fl(log2 e))`
/// carries three roundings, which `2^t` turns into a relative error of at most `3u·D`;
/// `ex2.approx` adds `EX2`, so each exponential is within `α = 3u·D + EX2`. The sum of
/// positive terms along a tree of height `h` is within `γ_h`; the reciprocal and the
/// product add `u` each. So `|y − y*| ≤ (2α + γ_h + 2u)·y*`, plus `u·|y*|` for the
/// reference's own rounding and 2^-126 for flushed subnormals.
pub fn tolerance(p: &SoftmaxParams, x: &[f32], want: &[f32]) -> (Vec<f64>, String) {
    let mut d = 0.0f64;
    for row in x.chunks_exact(p.cols as usize) {
        let m = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let lo = row.iter().fold(f32::INFINITY, |m, &v| m.min(v)) as f64;
        d = d.max(m - lo);
    }
    let alpha = 3.0 * F32_U * d * 1.01 + EX2_REL;
    let h = p.sum_height();
    let rel = (2.0 * alpha + gamma(h) + 2.0 * F32_U) * (1.0 + 2f64.powi(-10)) + F32_U;
    let tol = want
        .iter()
        .map(|w| rel * (*w as f64).abs() + F32_MIN_NORMAL)
        .collect();
    let explain = format!(
        "relative {rel:.3e}·|want| + 2^-126: 2α + γ_h + 3u with α = 3u·D + ex2.approx {EX2_REL:.2e} \
         (D = largest max−x = {d}), summation tree height h = {h}"
    );
    (tol, explain)
}

/// A case of `rows` rows with logits in ±[2^-8, 8].
pub fn case(p: &SoftmaxParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let n = rows as usize * p.cols as usize;
    let x = data::signed(&mut rng, n, 0.00390625, 8.0);
    let want = reference(p.cols, &x);
    let (tol, explain) = tolerance(p, &x, &want);
    let check = Check::Bound { tol, explain };
    let control = Expected {
        buffer: 1,
        data: data::f32_bytes(&reference_bf16_precision(p.cols, &x)),
        elem: Scalar::F32,
        check: check.clone(),
    };
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{rows}x{}", p.cols),
        kernel,
        launch: p.launch(rows),
        buffers: vec![
            Buffer::input("x", data::f32_bytes(&x)),
            Buffer::output("y", n * 4),
        ],
        args: vec![CaseArg::Buffer(0), CaseArg::Buffer(1)],
        expected: vec![Expected {
            buffer: 1,
            data: data::f32_bytes(&want),
            elem: Scalar::F32,
            check,
        }],
        controls: vec![Control {
            what: "result kept at bf16 precision".to_string(),
            expected: control,
        }],
        bytes_moved: 2 * n as u64 * 4,
        flops: 8 * n as u64,
    })
}
