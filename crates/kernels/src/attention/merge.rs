//! The merge kernel of decode attention: combines the splits' partials into each head's
//! output, `out = Σ_s 2^(m_s − M)·o_s / Σ_s 2^(m_s − M)·l_s` with `M = max_s m_s`, in bf16
//! or f32 (the input of the output projection).
//!
//! **Layout**: `part_m`, `part_l` `[rows, n_splits]`, `part_o` `[rows, n_splits,
//! head_dim]` f32 as [`super::decode`] writes them (`rows = n_seqs · n_heads`); `out`
//! `[rows, head_dim]` bf16 or f32 ([`MergeParams::out`]). One block per row, thread `i` owns dimension `i`
//! (`head_dim` threads, a multiple of 32). Empty splits (`m = −∞`) weigh nothing; a row
//! whose splits are all empty gets zeros.
//!
//! **Arithmetic**: `w_s = ex2.approx(m_s − M)`, `L = Σ fma(w_s, l_s)`, `o = Σ fma(w_s,
//! o_s)` in split order (eight splits' loads issued together in this kernel), `out = o / L` (IEEE division), rounded to bf16 for the bf16 form.
//! See [`tolerance`].

use half::bf16;
use quench_ir::{Builder, CacheOp, Function, Scalar, Type, Value};
use quench_rt::Launch;

use super::decode::{div_const, StepBody};
use crate::approx::{gamma, EX2_REL, F32_MIN_NORMAL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};
use crate::norm_residual::OutType;

/// Library names, by output type.
pub const NAME: &str = "attention_merge_bf16";
pub const NAME_F32: &str = "attention_merge_f32";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MergeParams {
    /// Elements per head: the block size, a multiple of 32 in 32..=1024.
    pub head_dim: u32,
    pub n_splits: u32,
    /// The output's element type.
    pub out: OutType,
}

impl MergeParams {
    pub fn name(&self) -> &'static str {
        match self.out {
            OutType::BF16 => NAME,
            OutType::F32 => NAME_F32,
        }
    }

    /// The output's relative rounding unit.
    fn unit(&self) -> f64 {
        match self.out {
            OutType::BF16 => 2f64.powi(-8),
            OutType::F32 => F32_U,
        }
    }

    pub fn launch(&self, rows: u32) -> Launch {
        Launch::linear(rows, self.head_dim)
    }
}

/// `attention_merge_<bf16|f32>(part_m, part_l, part_o, out)`, one block per (sequence,
/// head).
pub fn build(p: &MergeParams) -> Result<Function, KernelError> {
    if !p.head_dim.is_multiple_of(32) || !(32..=1024).contains(&p.head_dim) || p.n_splits == 0 {
        return Err(KernelError::unsupported(
            p.name(),
            format!(
                "head_dim = {} must be a multiple of 32 in 32..=1024, n_splits = {} positive",
                p.head_dim, p.n_splits
            ),
        ));
    }
    let mut k = Builder::new(p.name(), p.head_dim);
    let pm = k.param("part_m", gptr(Scalar::F32));
    let pl = k.param("part_l", gptr(Scalar::F32));
    let po = k.param("part_o", gptr(Scalar::F32));
    let out = k.param("out", gptr(p.out.scalar()));
    let row = k.ctaid_x();
    let d = k.tid_x();
    let first = wide_mul(&mut k, row, p.n_splits);
    let ms = k.ptr_add(pm, first);
    let ls = k.ptr_add(pl, first);
    let ostart = wide_mul(&mut k, row, p.n_splits * p.head_dim);
    let os = k.ptr_add(po, ostart);
    let os = k.ptr_add(os, d);
    let y = emit_merge(
        &mut k,
        &[SplitRow { ms, ls, os }],
        p.n_splits,
        p.head_dim,
        CacheOp::Nc,
    )[0];
    let y = match p.out {
        OutType::BF16 => k.cvt(Scalar::BF16, y),
        OutType::F32 => y,
    };
    let at = wide_mul(&mut k, row, p.head_dim);
    let at = k.ptr_add(out, at);
    let at = k.ptr_add(at, d);
    k.store(at, y);
    Ok(k.finish()?)
}

/// Where one element's partials lie: `ms`, `ls` at its row's split maxima and sums,
/// `os` at the element in split 0's output (splits `head_dim` apart).
#[derive(Clone, Copy, Debug)]
pub(super) struct SplitRow {
    pub ms: Value,
    pub ls: Value,
    pub os: Value,
}

/// Loads of one split's partials in flight per merged element, times the splits merged
/// back to back per loop iteration (their loads are independent, so the compiler can
/// issue them together instead of waiting on each), at most 8 of them.
const MERGE_LOADS: u32 = 32;

/// `body(k, s, carried)` over splits `0..n_splits` in order, `unroll` of them back to
/// back per loop iteration and the rest after the loop.
fn emit_over_splits(
    k: &mut Builder,
    n_splits: u32,
    held: Option<Value>,
    unroll: u32,
    init: &[Value],
    body: StepBody,
) -> Vec<Value> {
    let round = |k: &mut Builder, first: Value, c: &[Value], count: u32| {
        let mut c = c.to_vec();
        for j in 0..count {
            let s = k.add_const(first, j);
            c = body(k, s, &c);
        }
        c
    };
    let rounds = n_splits / unroll;
    let mut c = init.to_vec();
    if rounds > 0 {
        let lo = k.const_u32(0);
        let all = k.const_u32(rounds * unroll);
        // Whole rounds up to the last split holding positions, the rest skipped (only
        // empty splits, which add nothing); the tail after the rounds always runs.
        let hi = match held {
            Some(held) => {
                let up = k.add_const(held, unroll - 1);
                let up = div_const(k, up, unroll);
                let up = k.mul_const(up, unroll);
                k.min(up, all)
            }
            None => all,
        };
        let step = k.const_u32(unroll);
        c = k.for_range(lo, hi, step, &c, |k, first, c| round(k, first, c, unroll));
    }
    let tail = k.const_u32(rounds * unroll);
    round(k, tail, &c, n_splits % unroll)
}

/// Elements of merged rows, in f32, all in one pass over the splits (see [`SplitRow`])
/// after one that finds each row's largest split maximum. Loads use `cache` (the merge
/// kernel reads through the read-only path; a kernel that wrote the partials itself must
/// not). Each element's arithmetic is the same whatever the others are (the unrolling
/// changes no order).
pub(super) fn emit_merge(
    k: &mut Builder,
    rows: &[SplitRow],
    n_splits: u32,
    head_dim: u32,
    cache: CacheOp,
) -> Vec<Value> {
    let unroll = merge_unroll(rows);
    let neg_inf = k.const_f32(f32::NEG_INFINITY);
    let tops = emit_over_splits(
        k,
        n_splits,
        None,
        unroll,
        &vec![neg_inf; rows.len()],
        &|k, s, c| {
            rows.iter()
                .zip(c)
                .map(|(r, &top)| {
                    let at = k.ptr_add(r.ms, s);
                    let m = k.load_with(Type::F32, at, cache);
                    k.max(top, m)
                })
                .collect()
        },
    );
    emit_merge_below(k, rows, &tops, n_splits, None, head_dim, cache)
}

fn merge_unroll(rows: &[SplitRow]) -> u32 {
    (MERGE_LOADS / rows.len().max(1) as u32).clamp(1, 8)
}

/// [`emit_merge`] given each row's largest split maximum `tops[i]` (the maximum is exact
/// in any order: however it was found, the result has the same bits). `held`, where
/// given, counts the splits that hold positions; those after it are empty, add exact
/// zeros, and are mostly skipped.
pub(super) fn emit_merge_below(
    k: &mut Builder,
    rows: &[SplitRow],
    tops: &[Value],
    n_splits: u32,
    held: Option<Value>,
    head_dim: u32,
    cache: CacheOp,
) -> Vec<Value> {
    let unroll = merge_unroll(rows);
    let neg_inf = k.const_f32(f32::NEG_INFINITY);
    let zero = k.const_f32(0.0);
    let sums = emit_over_splits(
        k,
        n_splits,
        held,
        unroll,
        &vec![zero; 2 * rows.len()],
        &|k, s, c| {
            let mut next = Vec::with_capacity(c.len());
            for (i, r) in rows.iter().enumerate() {
                let at = k.ptr_add(r.ms, s);
                let m = k.load_with(Type::F32, at, cache);
                let empty = k.eq(m, neg_inf);
                let x = k.sub(m, tops[i]);
                let w = k.ex2_approx(x);
                let w = k.select(empty, zero, w);
                let at = k.ptr_add(r.ls, s);
                let l = k.load_with(Type::F32, at, cache);
                let od = k.mul_const(s, head_dim);
                let at = k.ptr_add(r.os, od);
                let o = k.load_with(Type::F32, at, cache);
                next.push(k.fma(w, l, c[2 * i]));
                next.push(k.fma(w, o, c[2 * i + 1]));
            }
            next
        },
    );
    sums.chunks_exact(2)
        .map(|lo| {
            let y = k.div(lo[1], lo[0]);
            let some = k.gt(lo[0], zero);
            k.select(some, y, zero)
        })
        .collect()
}

/// The exact merge of every row (f64), and `B = Σ w_s|o_s| / L` per element (the scale of
/// the rounding errors).
pub fn reference(p: &MergeParams, m: &[f32], l: &[f32], o: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let (ns, d) = (p.n_splits as usize, p.head_dim as usize);
    let mut out = Vec::with_capacity(m.len() / ns * d);
    let mut scale = Vec::with_capacity(out.capacity());
    for (r, mr) in m.chunks_exact(ns).enumerate() {
        let top = mr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let w: Vec<f64> = mr
            .iter()
            .map(|&x| {
                if x == f32::NEG_INFINITY {
                    0.0
                } else {
                    (x as f64 - top).exp2()
                }
            })
            .collect();
        let total: f64 = w
            .iter()
            .zip(&l[r * ns..(r + 1) * ns])
            .map(|(w, &l)| w * l as f64)
            .sum();
        for i in 0..d {
            let (mut acc, mut abs) = (0.0, 0.0);
            for (s, w) in w.iter().enumerate() {
                let v = o[(r * ns + s) * d + i] as f64;
                acc += w * v;
                abs += w * v.abs();
            }
            out.push(if total > 0.0 { acc / total } else { 0.0 });
            scale.push(if total > 0.0 { abs / total } else { 0.0 });
        }
    }
    (out, scale)
}

/// `v` rounded to the output type.
pub fn round_out(p: &MergeParams, v: f64) -> f64 {
    match p.out {
        OutType::BF16 => bf16::from_f64(v).to_f64(),
        OutType::F32 => v as f32 as f64,
    }
}

/// Output values (exactly representable) as the output type's bytes.
fn out_bytes(p: &MergeParams, v: &[f64]) -> Vec<u8> {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    match p.out {
        OutType::BF16 => data::bf16_bytes(&data::to_bf16(&f)),
        OutType::F32 => data::f32_bytes(&f),
    }
}

/// A deliberately wrong merge: the splits summed without rescaling to a common maximum.
pub fn reference_unscaled(p: &MergeParams, m: &[f32], l: &[f32], o: &[f32]) -> Vec<f64> {
    let (ns, d) = (p.n_splits as usize, p.head_dim as usize);
    let mut out = vec![];
    for r in 0..m.len() / ns {
        let total: f64 = l[r * ns..(r + 1) * ns].iter().map(|&x| x as f64).sum();
        for i in 0..d {
            let acc: f64 = (0..ns).map(|s| o[(r * ns + s) * d + i] as f64).sum();
            out.push(round_out(p, if total > 0.0 { acc / total } else { 0.0 }));
        }
    }
    out
}

/// Per-element tolerance of an attention output `want` rounded with relative unit `unit`
/// (`2^-8` for bf16, `2^-24` for f32), given `κ` — the relative error of every weight
/// including the summations' — and `B = Σ w|v| / Σ w` per element.
///
/// With the total weight within `κ` relative and the weighted sum within `κ·B·L`, the f32
/// quotient is within `2κ/(1 − κ)·B`, the division adds `u·B`, and the two roundings to
/// the output type (the kernel's and the reference's) add `unit` of each value:
/// `2·unit·|want|` and a margin. Results below 2^-126 may be flushed.
pub fn tolerance(kappa: f64, scale: &[f64], want: &[f64], unit: f64) -> Vec<f64> {
    scale
        .iter()
        .zip(want)
        .map(|(&b, w)| {
            (2.0 * kappa / (1.0 - kappa) + F32_U) * b * 1.01
                + 2.0 * unit * w.abs() * 1.01
                + F32_MIN_NORMAL
        })
        .collect()
}

/// `κ` of this kernel for split maxima within `span` of their row's largest: each weight
/// `ex2.approx(fl(m_s − M))` is within `2^(u·span)·(1 + EX2) − 1`, and the sums over
/// `n_splits` positive terms add `γ_n`.
pub fn kappa(p: &MergeParams, span: f64) -> f64 {
    let rho = (F32_U * span).exp2() * (1.0 + EX2_REL) - 1.0;
    (1.0 + rho) * (1.0 + gamma(p.n_splits as u64)) - 1.0
}

/// The widest `M − m_s` over the non-empty splits of any row.
pub fn span(p: &MergeParams, m: &[f32]) -> f64 {
    m.chunks_exact(p.n_splits as usize)
        .map(|mr| {
            let top = mr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            mr.iter()
                .filter(|x| x.is_finite())
                .map(|&x| top - x as f64)
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max)
}

/// A case over given partials: the reference is the exact merge, the bound this kernel's
/// own (`extra_kappa` adds the partials' own error, for checking a whole attention);
/// `want` is rounded to the output type.
pub fn case_from(
    p: &MergeParams,
    m: Vec<f32>,
    l: Vec<f32>,
    o: Vec<f32>,
    want: Vec<f64>,
    scale: &[f64],
    extra_kappa: f64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let rows = (m.len() / p.n_splits as usize) as u32;
    let kappa = (1.0 + kappa(p, span(p, &m))) * (1.0 + extra_kappa) - 1.0;
    let tol = tolerance(kappa, scale, &want, p.unit());
    let explain = format!(
        "(2κ/(1−κ) + u)·Σw|o|/Σw + 2·{:.1e}·|want|: κ = {kappa:.3e} (ex2.approx and exponent rounding, \
         sums over {} splits)",
        p.unit(),
        p.n_splits
    );
    let check = Check::Bound { tol, explain };
    let wrong = reference_unscaled(p, &m, &l, &o);
    let n = rows as usize * p.head_dim as usize;
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!("{rows} heads of {}, {} splits", p.head_dim, p.n_splits),
        kernel,
        launch: p.launch(rows),
        buffers: vec![
            Buffer::input("part_m", data::f32_bytes(&m)),
            Buffer::input("part_l", data::f32_bytes(&l)),
            Buffer::input("part_o", data::f32_bytes(&o)),
            Buffer::output("out", n * p.out.scalar().bytes() as usize),
        ],
        args: (0..4).map(CaseArg::Buffer).collect(),
        expected: vec![Expected {
            buffer: 3,
            data: out_bytes(p, &want),
            elem: p.out.scalar(),
            check: check.clone(),
        }],
        controls: vec![Control {
            what: "splits summed without rescaling to the common maximum".into(),
            expected: Expected {
                buffer: 3,
                data: out_bytes(p, &wrong),
                elem: p.out.scalar(),
                check,
            },
        }],
        bytes_moved: (m.len() * 8 + o.len() * 4 + n * p.out.scalar().bytes() as usize) as u64,
        flops: 4 * o.len() as u64,
    })
}

/// A case of `rows` rows of random partials: maxima in [−6, 6] (base 2), each row's first
/// 2 above its others' largest, sums in [1, 64], outputs in ±[2^-6, 1]·sum; the last split
/// of every other row is empty.
pub fn case(p: &MergeParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let mut rng = data::rng(seed);
    let ns = p.n_splits as usize;
    let total = rows as usize * ns;
    let mut m = data::uniform(&mut rng, total, -6.0, 6.0);
    // Each row's first split 2 above its others' largest maximum: where the maxima were
    // close, merging without rescaling (the control) would land inside the bound.
    for row in m.chunks_exact_mut(ns) {
        let others = row[1..].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if others.is_finite() {
            row[0] = others + 2.0;
        }
    }
    let mut l = data::uniform(&mut rng, total, 1.0, 64.0);
    let mut o = data::signed(&mut rng, total * p.head_dim as usize, 0.015625, 1.0);
    for (i, o) in o.chunks_exact_mut(p.head_dim as usize).enumerate() {
        o.iter_mut().for_each(|v| *v *= l[i]);
    }
    if ns >= 2 {
        for r in (1..rows as usize).step_by(2) {
            let i = r * ns + ns - 1;
            m[i] = f32::NEG_INFINITY;
            l[i] = 0.0;
            o[i * p.head_dim as usize..(i + 1) * p.head_dim as usize]
                .iter_mut()
                .for_each(|v| *v = 0.0);
        }
    }
    let (exact, scale) = reference(p, &m, &l, &o);
    let want: Vec<f64> = exact.iter().map(|&v| round_out(p, v)).collect();
    case_from(p, m, l, o, want, &scale, 0.0)
}
