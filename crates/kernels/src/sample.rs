//! Sampling the next token on the GPU: temperature, top-k and top-p (nucleus), each row
//! with its own settings (a batch of requests), from a uniform number the host draws.
//!
//! **Layout**: `logits` `[rows, cols]` f32, `cols` a multiple of 4 (fixed in the kernel);
//! per row: `temperature` f32 (> 0; greedy rows use `top_k = 1`), `top_k` u32 (0: off),
//! `top_p` f32 (1: off), `uniform` f32 in [0, 1); `out` `[rows]` u32. One block per row.
//!
//! **Method** — integers wherever an order could matter, so the result is deterministic:
//! 1. `m = max(logits)`; each token's weight `w = ex2.approx((l − m)·fl(log2 e / T))`,
//!    as an integer mass `⌊w·2^24⌋` (tokens below 2^-24 of the top one get none);
//! 2. top-k: the k-th largest logit `τ_k` by radix selection over order-preserving 32-bit
//!    keys, four 8-bit passes with integer histograms in shared memory (atomic adds of
//!    integers commute); tokens at `τ_k` and above are kept, ties included;
//! 3. top-p: of those, the fewest top tokens whose mass reaches `⌈p·W⌉` (W their total),
//!    by the same selection weighted by mass: tokens at `τ_p` and above are kept;
//! 4. thread `t` sums the kept mass of its contiguous share of the row; an exclusive scan
//!    over threads and the draw `⌊u·W'⌋` find the share, then the token, in index order.
//!
//! NaN logits get no mass; a row without mass gives `u32::MAX`. Only the masses are
//! approximate (`ex2.approx`): cases draw `u` and `p` away from the boundaries they
//! decide, so the expected token is exact.

use quench_ir::{AtomOp, Builder, CacheOp, Function, Ordering, Round, Scalar, Scope, Type, Value};
use quench_rt::Launch;

use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{emit_block_allreduce, gptr, wide_mul, Combine};
use crate::rows::{self, RowWalk};

pub const NAME: &str = "sample_f32";

/// Weights are scaled by 2^24 into integer masses.
const MASS_ONE: f32 = 16_777_216.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleParams {
    pub cols: u32,
    /// Threads per block: a multiple of 32 in 256..=1024.
    pub threads: u32,
}

impl SampleParams {
    fn walk(&self) -> RowWalk {
        RowWalk {
            groups: self.cols / 4,
            threads: self.threads,
        }
    }

    pub fn launch(&self, rows: u32) -> Launch {
        Launch::linear(rows, self.threads)
    }

    /// Elements of each thread's contiguous share in the final scan.
    fn share(&self) -> u32 {
        self.cols.div_ceil(self.threads)
    }
}

/// The shared arrays of the selections.
struct Scratch {
    hist: Value,
    groups: Value,
    digit: Value,
    above: Value,
    total: Value,
}

/// Per-row values every pass needs.
struct RowCtx {
    row: Value,
    m: Value,
    c: Value,
}

/// Order-preserving key of an f32: larger values give larger keys.
fn emit_key(k: &mut Builder, l: Value) -> Value {
    let bits = k.bitcast(Type::U32, l);
    let neg = k.shr_const(bits, 31);
    let zero = k.const_u32(0);
    let is_neg = k.ne(neg, zero);
    let flipped = k.not(bits);
    let top = k.const_u32(0x8000_0000);
    let set = k.or(bits, top);
    k.select(is_neg, flipped, set)
}

/// The integer mass `⌊ex2.approx((l − m)·c)·2^24⌋` (0 for NaN) as u64.
fn emit_mass(k: &mut Builder, rc: &RowCtx, l: Value) -> Value {
    let x = k.sub(l, rc.m);
    let x = k.mul(x, rc.c);
    let w = k.ex2_approx(x);
    let one = k.const_f32(MASS_ONE);
    let w = k.mul(w, one);
    let w = k.cvt_rnd(Scalar::U32, Some(Round::Rz), false, w);
    k.cvt(Scalar::U64, w)
}

/// `sample_f32(logits, temperature, top_k, top_p, uniform, out)`, one block per row.
pub fn build(p: &SampleParams) -> Result<Function, KernelError> {
    rows::check(NAME, p.cols, 4, p.threads)?;
    if p.threads < 256 {
        return Err(KernelError::unsupported(
            NAME,
            format!("threads = {} must be at least 256", p.threads),
        ));
    }
    let t = p.threads;
    let mut k = Builder::new(NAME, t);
    let logits = k.param("logits", gptr(Scalar::F32));
    let temps = k.param("temperature", gptr(Scalar::F32));
    let top_ks = k.param("top_k", gptr(Scalar::U32));
    let top_ps = k.param("top_p", gptr(Scalar::F32));
    let uniforms = k.param("uniform", gptr(Scalar::F32));
    let out = k.param("out", gptr(Scalar::U32));
    let sc = Scratch {
        hist: k.shared_array("hist", Scalar::U64, 256, 16),
        groups: k.shared_array("groups", Scalar::U64, 32, 16),
        digit: k.shared_array("digit", Scalar::U32, 1, 4),
        above: k.shared_array("above", Scalar::U64, 1, 8),
        total: k.shared_array("total", Scalar::U64, 1, 8),
    };
    let shares = k.shared_array("shares", Scalar::U64, t, 16);
    let r = k.ctaid_x();
    let tid = k.tid_x();
    let start = wide_mul(&mut k, r, p.cols);
    let row = k.ptr_add(logits, start);
    let per_row = |k: &mut Builder, ptr: Value, ty: Type| {
        let at = k.ptr_add(ptr, r);
        k.load_with(ty, at, CacheOp::Nc)
    };
    let temp = per_row(&mut k, temps, Type::F32);
    let top_k = per_row(&mut k, top_ks, Type::U32);
    let top_p = per_row(&mut k, top_ps, Type::F32);
    let u = per_row(&mut k, uniforms, Type::F32);

    // 1. The maximum and the exponent's factor.
    let neg_inf = k.const_f32(f32::NEG_INFINITY);
    let walk = p.walk();
    let mx = walk.emit(&mut k, tid, &[neg_inf], &|k, g, c| {
        let v = load4(k, row, g);
        let mut m = c[0];
        for x in v {
            m = k.max(m, x);
        }
        vec![m]
    });
    let m = emit_block_allreduce(&mut k, mx[0], Combine::Max, tid, t, "max");
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let c = k.div(log2e, temp);
    let rc = RowCtx { row, m, c };

    // 2. top-k by count (k = 0 or k ≥ cols: an unreachable need, so nothing is cut).
    let zero64 = k.const_u64(0);
    let all = k.const_u32(0);
    let kk = k.cvt(Scalar::U64, top_k);
    let off = k.eq(kk, zero64);
    let never = k.const_u64(u64::MAX);
    let need_k = k.select(off, never, kk);
    let tau_k = emit_select(
        &mut k,
        p,
        &sc,
        &rc,
        need_k,
        &|k, _l, _key, nan| {
            let one = k.const_u64(1);
            let none = k.const_u64(0);
            k.select(nan, none, one)
        },
        all,
    );

    // 3. top-p by mass among the top-k.
    let kept_mass = |k: &mut Builder, l: Value, key: Value, tau: Value| {
        let mass = emit_mass(k, &rc, l);
        let kept = k.ge(key, tau);
        let none = k.const_u64(0);
        k.select(kept, mass, none)
    };
    let wk = {
        let part = walk.emit(&mut k, tid, &[zero64], &|k, g, cv| {
            let mut s = cv[0];
            for l in load4(k, row, g) {
                let key = emit_key(k, l);
                let km = kept_mass(k, l, key, tau_k);
                s = k.add(s, km);
            }
            vec![s]
        });
        emit_block_sum(&mut k, &sc, tid, part[0])
    };
    let wkf = k.cvt(Scalar::F64, wk);
    let pf = k.cvt(Scalar::F64, top_p);
    let need = k.mul(wkf, pf);
    let need = k.cvt_rnd(Scalar::U64, Some(Round::Rp), false, need);
    let one64 = k.const_u64(1);
    let need_p = k.max(need, one64);
    let tau_p = emit_select(
        &mut k,
        p,
        &sc,
        &rc,
        need_p,
        &|k, l, key, _nan| kept_mass(k, l, key, tau_k),
        all,
    );
    let tau = k.max(tau_k, tau_p);

    // 4. The kept mass of this thread's share, the scan, the draw, the token.
    let share = p.share();
    let first = k.mul_const(tid, share);
    let cols = k.const_u32(p.cols);
    let end = k.add_const(first, share);
    let end = k.min(end, cols);
    let first = k.min(first, cols);
    let one = k.const_u32(1);
    let mine = k.for_range(first, end, one, &[zero64], |k, i, cv| {
        let at = k.ptr_add(row, i);
        let l = k.load_with(Type::F32, at, CacheOp::Nc);
        let key = emit_key(k, l);
        let km = kept_mass(k, l, key, tau);
        vec![k.add(cv[0], km)]
    })[0];
    let at = k.ptr_add(shares, tid);
    k.store(at, mine);
    k.barrier();
    let per_group = t / 32;
    let lanes = k.const_u32(32);
    let is_lead = k.lt(tid, lanes);
    k.if_then(is_lead, |k| {
        let base = k.mul_const(tid, per_group);
        let s = sum_range(k, shares, base, per_group);
        let at = k.ptr_add(sc.groups, tid);
        k.store(at, s);
    });
    k.barrier();
    let gi = k.shr_const(tid, 5);
    let gi = if per_group == 32 {
        gi
    } else {
        let pg = k.const_u32(per_group);
        k.div(tid, pg)
    };
    let before_groups = sum_dynamic(&mut k, sc.groups, gi);
    let gstart = k.mul_const(gi, per_group);
    let within = k.sub(tid, gstart);
    let gshares = k.ptr_add(shares, gstart);
    let before_mine = sum_dynamic(&mut k, gshares, within);
    let prefix = k.add(before_groups, before_mine);
    let thirty_two = k.const_u32(32);
    let total = sum_dynamic(&mut k, sc.groups, thirty_two);
    let wf = k.cvt(Scalar::F64, total);
    let uf = k.cvt(Scalar::F64, u);
    let target = k.mul(wf, uf);
    let target = k.cvt_rnd(Scalar::U64, Some(Round::Rz), false, target);
    let some = k.gt(total, zero64);
    let last = k.sub(total, one64);
    let capped = k.min(target, last);
    let target = k.select(some, capped, zero64);
    let ends = k.add(prefix, mine);
    let from = k.le(prefix, target);
    let upto = k.lt(target, ends);
    let hit = k.and(from, upto);
    k.if_then(hit, |k| {
        let none = k.const_u32(u32::MAX);
        let found = k.for_range(first, end, one, &[prefix, none], |k, i, cv| {
            let at = k.ptr_add(row, i);
            let l = k.load_with(Type::F32, at, CacheOp::Nc);
            let key = emit_key(k, l);
            let km = kept_mass(k, l, key, tau);
            let run = k.add(cv[0], km);
            let past = k.gt(run, target);
            let unset = k.eq(cv[1], none);
            let take = k.and(past, unset);
            vec![run, k.select(take, i, cv[1])]
        });
        let at = k.ptr_add(out, r);
        k.store(at, found[1]);
    });
    let zero = k.const_u32(0);
    let first_thread = k.eq(tid, zero);
    let empty = k.eq(total, zero64);
    let write_none = k.and(first_thread, empty);
    k.if_then(write_none, |k| {
        let none = k.const_u32(u32::MAX);
        let at = k.ptr_add(out, r);
        k.store(at, none);
    });
    Ok(k.finish()?)
}

fn load4(k: &mut Builder, row: Value, g: Value) -> Vec<Value> {
    let first = k.shl_const(g, 2);
    let at = k.ptr_add(row, first);
    let v = k.load_with(Type::Vec(Scalar::F32, 4), at, CacheOp::Nc);
    (0..4).map(|i| k.extract(v, i)).collect()
}

/// `Σ arr[base .. base + n]` (u64, `n` a constant), in order.
fn sum_range(k: &mut Builder, arr: Value, base: Value, n: u32) -> Value {
    let mut s = k.const_u64(0);
    for i in 0..n {
        let at = k.add_const(base, i);
        let at = k.ptr_add(arr, at);
        let v = k.load(Type::U64, at);
        s = k.add(s, v);
    }
    s
}

/// `Σ arr[0 .. n]` (u64) for a runtime `n`, in order.
fn sum_dynamic(k: &mut Builder, arr: Value, n: Value) -> Value {
    let lo = k.const_u32(0);
    let one = k.const_u32(1);
    let zero = k.const_u64(0);
    k.for_range(lo, n, one, &[zero], |k, i, cv| {
        let at = k.ptr_add(arr, i);
        let v = k.load(Type::U64, at);
        vec![k.add(cv[0], v)]
    })[0]
}

/// The block's total of a u64 value (an integer sum: any order gives the same).
fn emit_block_sum(k: &mut Builder, sc: &Scratch, tid: Value, v: Value) -> Value {
    let zero = k.const_u32(0);
    let first = k.eq(tid, zero);
    k.if_then(first, |k| {
        let z = k.const_u64(0);
        k.store(sc.total, z);
    });
    k.barrier();
    k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Cta, sc.total, v);
    k.barrier();
    k.load(Type::U64, sc.total)
}

/// One element's amount in a selection: `(builder, logit, key, is NaN) -> u64`.
type Amount<'a> = &'a dyn Fn(&mut Builder, Value, Value, Value) -> Value;

/// The largest key `τ` with `Σ_{key ≥ τ} amount ≥ need` (0 when no key reaches it), by
/// four 8-bit radix passes from the top digit: each pass histograms the amounts of the
/// elements sharing the digits chosen so far, then picks the digit at which the running
/// total from the top reaches `need`.
fn emit_select(
    k: &mut Builder,
    p: &SampleParams,
    sc: &Scratch,
    rc: &RowCtx,
    need: Value,
    amount: Amount,
    start: Value,
) -> Value {
    let t = p.threads;
    let tid = k.tid_x();
    let mut prefix = start;
    let mut above = k.const_u64(0);
    for pass in 0..4u32 {
        let shift = 24 - 8 * pass;
        // Clear the histogram; the default choice (digit 0, nothing above) is set before
        // the barrier that precedes the choosing, so it can only be overwritten.
        let limit = k.const_u32(256);
        for j in 0..256u32.div_ceil(t) {
            let b = k.add_const(tid, j * t);
            let inside = k.lt(b, limit);
            k.if_then(inside, |k| {
                let at = k.ptr_add(sc.hist, b);
                let z = k.const_u64(0);
                k.store(at, z);
            });
        }
        let zero = k.const_u32(0);
        let first = k.eq(tid, zero);
        let above_now = above;
        k.if_then(first, |k| {
            let z = k.const_u32(0);
            k.store(sc.digit, z);
            k.store(sc.above, above_now);
        });
        k.barrier();
        let pre = prefix;
        p.walk().emit(k, tid, &[], &|k, g, _| {
            for l in load4(k, rc.row, g) {
                let key = emit_key(k, l);
                let nan = k.ne(l, l);
                let amt = amount(k, l, key, nan);
                let matches = if pass == 0 {
                    k.const_pred(true)
                } else {
                    let hi = k.shr_const(key, shift + 8);
                    let want = k.shr_const(pre, shift + 8);
                    k.eq(hi, want)
                };
                let z = k.const_u64(0);
                let some = k.ne(amt, z);
                let add = k.and(matches, some);
                k.if_then(add, |k| {
                    let d = k.shr_const(key, shift);
                    let d = k.and_const(d, 255);
                    let at = k.ptr_add(sc.hist, d);
                    k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Cta, at, amt);
                });
            }
            vec![]
        });
        k.barrier();
        // Sums of 8 bins each, then each bin's total from the top (bins ≥ b).
        let thirty_two = k.const_u32(32);
        let lead = k.lt(tid, thirty_two);
        k.if_then(lead, |k| {
            let base = k.shl_const(tid, 3);
            let s = sum_range(k, sc.hist, base, 8);
            let at = k.ptr_add(sc.groups, tid);
            k.store(at, s);
        });
        k.barrier();
        let bin = k.lt(tid, limit);
        let above_now = above;
        k.if_then(bin, |k| {
            let g = k.shr_const(tid, 3);
            let lo = k.add_const(g, 1);
            let hi = k.const_u32(32);
            let one = k.const_u32(1);
            let zero64 = k.const_u64(0);
            let groups_above = k.for_range(lo, hi, one, &[zero64], |k, i, cv| {
                let at = k.ptr_add(sc.groups, i);
                let v = k.load(Type::U64, at);
                vec![k.add(cv[0], v)]
            })[0];
            let gend = k.shl_const(g, 3);
            let gend = k.add_const(gend, 8);
            let from_bin = k.for_range(tid, gend, one, &[zero64], |k, i, cv| {
                let at = k.ptr_add(sc.hist, i);
                let v = k.load(Type::U64, at);
                vec![k.add(cv[0], v)]
            })[0];
            let at = k.ptr_add(sc.hist, tid);
            let own = k.load(Type::U64, at);
            let from_b = k.add(groups_above, from_bin);
            let reach = k.add(above_now, from_b);
            let strictly = k.sub(reach, own);
            let enough = k.ge(reach, need);
            let short = k.lt(strictly, need);
            let chosen = k.and(enough, short);
            k.if_then(chosen, |k| {
                k.store(sc.digit, tid);
                k.store(sc.above, strictly);
            });
        });
        k.barrier();
        let digit = k.load(Type::U32, sc.digit);
        above = k.load(Type::U64, sc.above);
        let d = k.shl_const(digit, shift);
        prefix = k.or(prefix, d);
        // Everyone has read the choice before the next pass resets it.
        k.barrier();
    }
    prefix
}

/// What the kernel decides, in exact arithmetic (f64 weights): per row, the kept
/// tokens' masses (index order) and the chosen token for a draw `u`.
pub struct Decision {
    /// `(token, mass)` of the kept tokens, in index order.
    pub kept: Vec<(u32, f64)>,
}

fn key_of(l: f32) -> u32 {
    let b = l.to_bits();
    if b >> 31 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// The kept set of one row under the kernel's rules, with masses `⌊w·2^24⌋` of exact
/// weights.
pub fn decide(row: &[f32], temperature: f32, top_k: u32, top_p: f32) -> Decision {
    let m = row.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let c = std::f64::consts::LOG2_E / temperature as f64;
    let mass = |l: f32| {
        if l.is_nan() {
            0.0
        } else {
            (((l - m) as f64 * c).exp2() * MASS_ONE as f64).floor()
        }
    };
    let mut keys: Vec<u32> = row
        .iter()
        .filter(|l| !l.is_nan())
        .map(|&l| key_of(l))
        .collect();
    keys.sort_unstable_by(|a, b| b.cmp(a));
    let tau_k = if top_k == 0 || top_k as usize > keys.len() {
        0
    } else {
        keys[top_k as usize - 1]
    };
    let w_k: f64 = row
        .iter()
        .filter(|&&l| key_of(l) >= tau_k)
        .map(|&l| mass(l))
        .sum();
    let need = (w_k * top_p as f64).ceil().max(1.0);
    let mut by_key: Vec<(u32, f64)> = row
        .iter()
        .filter(|&&l| key_of(l) >= tau_k && mass(l) > 0.0)
        .map(|&l| (key_of(l), mass(l)))
        .collect();
    by_key.sort_unstable_by_key(|k| std::cmp::Reverse(k.0));
    let (mut run, mut tau_p) = (0.0, 0);
    for (i, &(key, w)) in by_key.iter().enumerate() {
        run += w;
        // All tokens sharing the threshold's key are kept.
        let next_differs = by_key.get(i + 1).is_none_or(|n| n.0 != key);
        if run >= need && next_differs {
            tau_p = key;
            break;
        }
    }
    let tau = tau_k.max(tau_p);
    let kept = row
        .iter()
        .enumerate()
        .filter(|(_, &l)| key_of(l) >= tau && mass(l) > 0.0)
        .map(|(i, &l)| (i as u32, mass(l)))
        .collect();
    Decision { kept }
}

impl Decision {
    /// The token drawn by `u`: the first whose running mass exceeds `⌊u·W⌋`.
    pub fn draw(&self, u: f32) -> u32 {
        let total: f64 = self.kept.iter().map(|k| k.1).sum();
        let target = (total * u as f64).floor().min(total - 1.0);
        let mut run = 0.0;
        for &(i, w) in &self.kept {
            run += w;
            if run > target {
                return i;
            }
        }
        u32::MAX
    }

    /// A draw in the middle of token `j`'s (an index into `kept`) interval, far from
    /// either edge.
    pub fn draw_for(&self, j: usize) -> f32 {
        let total: f64 = self.kept.iter().map(|k| k.1).sum();
        let before: f64 = self.kept[..j].iter().map(|k| k.1).sum();
        ((before + self.kept[j].1 / 2.0) / total) as f32
    }
}

/// A case of `rows` rows of roughly normal logits (σ ≈ 3): rows of temperature 3 with
/// top-p placed halfway between two of the largest cumulative masses and top-k 40 or
/// off, rows of temperature 0.3 with top-k 40, the last row of three or more greedy
/// (top-k 1); each row's draw in the middle of a kept token's interval with at least a
/// quarter of the mean mass — so the 2^-21-scale error of the kernel's weights cannot
/// move a decision — preferring tokens where the wrong twins (no temperature, no top-k
/// and top-p) would draw another.
pub fn case(p: &SampleParams, rows: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let cols = p.cols as usize;
    // Roughly normal logits (σ ≈ 3): a sum of four uniforms, centred.
    let parts: Vec<Vec<f32>> = (0..4)
        .map(|_| data::uniform(&mut rng, rows as usize * cols, -3.0, 3.0))
        .collect();
    let logits: Vec<f32> = (0..rows as usize * cols)
        .map(|i| parts.iter().map(|p| p[i]).sum())
        .collect();
    let (mut temps, mut ks, mut ps, mut us, mut want) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut no_temp, mut no_k) = (vec![], vec![]);
    for (r, row) in logits.chunks_exact(cols).enumerate() {
        // Flat rows (T = 3), where top-k and top-p decide most, with top-k 40 or off;
        // sharp rows (T = 0.3) with top-k 40 and top-p off; the last row greedy.
        let (temp, top_k, with_p) = match r % 3 {
            0 => (3.0f32, 40.min(p.cols), true),
            1 => (3.0, 0, true),
            _ if rows >= 3 && r == rows as usize - 1 => (0.3, 1, false),
            _ => (0.3, 40.min(p.cols), false),
        };
        // top-p halfway between the 2nd..6th cumulative masses of the top-k tokens.
        let top_p = if with_p {
            let d = decide(row, temp, top_k, 1.0);
            let mut masses: Vec<f64> = d.kept.iter().map(|k| k.1).collect();
            masses.sort_by(|a, b| b.total_cmp(a));
            let total: f64 = masses.iter().sum();
            let n = masses.len().min(6);
            if n < 2 {
                1.0
            } else {
                let i = 1 + data::below(&mut rng, n as u32 - 1) as usize;
                let cum: f64 = masses[..i].iter().sum();
                ((cum + masses[i] / 2.0) / total) as f32
            }
        } else {
            1.0
        };
        let d = decide(row, temp, top_k, top_p);
        let (d_no_temp, d_no_k) = (decide(row, 1.0, top_k, top_p), decide(row, temp, 0, 1.0));
        let mean = d.kept.iter().map(|k| k.1).sum::<f64>() / d.kept.len() as f64;
        // Among the tokens with room for a draw, those where the wrong twins draw
        // something else (so that they are seen to be wrong), then one at random.
        let big: Vec<usize> = (0..d.kept.len())
            .filter(|&j| d.kept[j].1 >= mean / 4.0)
            .collect();
        let bite = |j: usize| {
            let u = d.draw_for(j);
            let t = d.draw(u);
            (d_no_temp.draw(u) != t) as u32 + (d_no_k.draw(u) != t) as u32
        };
        let best = big.iter().map(|&j| bite(j)).max().unwrap_or(0);
        let sharpest: Vec<usize> = big.into_iter().filter(|&j| bite(j) == best).collect();
        let j = sharpest[data::below(&mut rng, sharpest.len() as u32) as usize];
        let u = d.draw_for(j);
        want.push(d.draw(u));
        no_temp.push(d_no_temp.draw(u));
        no_k.push(d_no_k.draw(u));
        temps.push(temp);
        ks.push(top_k);
        ps.push(top_p);
        us.push(u);
    }
    let u32s = |x: &[u32]| x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let exact = |data: Vec<u8>| Expected {
        buffer: 5,
        data,
        elem: Scalar::U32,
        check: Check::Exact,
    };
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: format!("{rows}x{}", p.cols),
        kernel,
        launch: p.launch(rows),
        buffers: vec![
            Buffer::input("logits", data::f32_bytes(&logits)),
            Buffer::input("temperature", data::f32_bytes(&temps)),
            Buffer::input("top_k", u32s(&ks)),
            Buffer::input("top_p", data::f32_bytes(&ps)),
            Buffer::input("uniform", data::f32_bytes(&us)),
            Buffer::output("out", rows as usize * 4),
        ],
        args: (0..6).map(CaseArg::Buffer).collect(),
        expected: vec![exact(u32s(&want))],
        controls: vec![
            Control {
                what: "temperature ignored".into(),
                expected: exact(u32s(&no_temp)),
            },
            Control {
                what: "top-k and top-p ignored".into(),
                expected: exact(u32s(&no_k)),
            },
        ],
        bytes_moved: rows as u64 * (p.cols as u64 * 4 + 20),
        flops: 0,
    })
}
