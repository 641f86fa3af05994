//! The split kernel of decode attention: one block per (split, sequence, kv head) works
//! on `split` positions of the context for all the query heads that share the kv head,
//! its warps taking different positions at once so that a short split is not walked
//! serially.
//!
//! **Layout**: see [`super`] for the cache. Grid `[n_splits, n_seqs · n_kv_heads]` with
//! `n_splits = max_blocks · 16 / split`; split `s` of a sequence of `ctx` positions covers
//! positions `s·e .. (s+1)·e` with `e` the fewest positions (a multiple of 16, at most
//! `split`) that spread the context over the splits ([`DecodeParams::split_for`]): none
//! past the context, so a short context takes short splits, and a sequence's splits depend
//! on its own length only. Each phase's loops stop after the split's positions. Outputs,
//! per query head `h` and split: `part_m [n_seqs, n_heads, n_splits]` the largest base-2
//! score (−∞ for an empty split), `part_l` (same shape) `Σ 2^(s_t − m)`, and `part_o
//! [n_seqs, n_heads, n_splits, head_dim]` `Σ 2^(s_t − m)·v_t` (f32, not normalized; zeros
//! for an empty split).
//!
//! **Lanes** ([`Lanes`]): a row of `head_dim` elements is read by a group of `per_pos`
//! lanes (a power of two), each loading `vec` elements (16, 8 or 4 bytes) `chunks` times;
//! a warp thus covers `32 / per_pos` positions at once, and a block of `warps` warps
//! `warps · 32 / per_pos` positions a step. Position `i` of the split (step `j`) is taken
//! by group `i mod (32 / per_pos)` of warp `(i / (32 / per_pos)) mod warps`: consecutive
//! positions, consecutive rows of a cache block, so a warp's loads are contiguous. Every
//! lane holds its elements of the group's queries in registers, and the key and value
//! rows it loads serve all the group's heads.
//!
//! **Phases** (shared memory: a `[group, split]` table of scores, then weights, and a
//! `[warps, group, head_dim]` table of the warps' outputs):
//! 1. per step each lane forms its `vec · chunks` products with each head's queries
//!    (`fma` in element order), the position's group sums them by butterfly
//!    (`per_pos` lanes), `s = dot · fl(scale · log2 e)` goes to the table;
//! 2. block maxima per head; thread `i` turns scores `i, i + threads, …` into weights
//!    `p = ex2.approx(s − m)` and sums them; block sums per head;
//! 3. per step each lane accumulates `fma(p_t, v_t, acc)` for its elements of every head;
//!    the warp sums its position groups by butterfly, the warps' sums meet in shared
//!    memory and are added in warp order: element `e` of the group's `group · head_dim`
//!    outputs by thread `e mod threads`.
//!
//! Every order depends on the kernel's parameters only: a sequence's bits do not depend
//! on the other sequences or on how many there are.
//!
//! **Merged in place** ([`DecodeParams::merge`], the `attention_decode_merge_*` kernels):
//! after writing its partials each block fences them and counts itself on a per-(sequence,
//! kv head) counter in `counters` (`[n_seqs · n_kv_heads]` u32, zero before the launch);
//! the block that counts last merges all splits of its group's heads, in split order
//! exactly as [`super::merge`] does (so the result does not depend on which block came
//! last), writes `out` `[n_seqs, n_heads, head_dim]` f32 and returns its counter to zero,
//! so that the next launch starts clean. Each of its warps finds the group's largest split
//! maxima (a split a lane, then a butterfly), and its thread `i` merges the elements it
//! wrote in phase 3, all of them in one pass over the splits.
//!
//! `ex2.approx` makes the check a bound: see [`tolerances`].

use quench_ir::{AtomOp, Builder, CacheOp, Function, Ordering, Scalar, Scope, Type, Value};
use quench_rt::{Arg, Launch};

use super::append::{emit_row_start, word_of};
use super::merge::{self, emit_merge_below, MergeParams, SplitRow};
use super::{KvElem, PagedCache, BLOCK_TOKENS};
use crate::approx::{gamma, EX2_REL, F32_MIN_NORMAL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{emit_block_allreduce_n, gptr, wide_mul, words, Combine};
use crate::norm_residual::OutType;

/// Library names, by cache element type.
pub const NAME: &str = "attention_decode_bf16";
pub const NAME_F16: &str = "attention_decode_f16";
pub const NAME_F32: &str = "attention_decode_f32";
/// Library names of the kernels that merge their splits themselves.
pub const NAME_MERGE: &str = "attention_decode_merge_bf16";
pub const NAME_MERGE_F16: &str = "attention_decode_merge_f16";
pub const NAME_MERGE_F32: &str = "attention_decode_merge_f32";

/// Most f32 a lane keeps per phase: its elements of the group's queries (phase 1) or of
/// the group's outputs (phase 3), `group · vec · chunks`. More would spill registers.
const MAX_LANE_VALUES: u32 = 64;
/// Most static shared memory the kernel declares (the limit is 48 KiB; the reductions
/// take a few slots more).
const MAX_SHARED_BYTES: u32 = 44 * 1024;
/// Values a lane may have in flight over the steps of a phase emitted back to back
/// (each step's loads are independent of the others', so the compiler can issue them
/// together): a step loads its row pieces and, in phase 3, the group's weights.
const IN_FLIGHT: u32 = 64;
/// Steps emitted back to back at most.
const MOST_UNROLL: u32 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeParams {
    pub head_dim: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    /// Block-table row length: the longest context is `max_blocks · 16` tokens.
    pub max_blocks: u32,
    /// Most positions per split (a multiple of 16 dividing `max_blocks · 16`): the split
    /// of the longest context. A sequence's own is [`DecodeParams::split_for`] its length.
    pub split: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
    /// The cache's element type.
    pub kv: KvElem,
    /// Whether the last split to finish merges the splits into the f32 output.
    pub merge: bool,
    /// Elements from one sequence's queries to the next's; 0 for packed queries
    /// (`n_heads · head_dim` apart). A fused projection's `[n_seqs, q|k|v]` output is
    /// read in place with its row length here (a multiple of 4).
    pub q_stride: u32,
}

/// How the lanes of a warp share a row of the cache (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lanes {
    /// Elements a lane loads at once, 16, 8 or 4 bytes of them: 8, 4 or 2 of a 16-bit
    /// cache, 4, 2 or 1 of an f32 one.
    pub vec: u32,
    /// Lanes per position: a power of two, at most 32.
    pub per_pos: u32,
    /// Loads of `vec` elements per lane and row (more than one past 32 · `vec` elements).
    pub chunks: u32,
}

impl Lanes {
    /// Positions a warp covers at once.
    pub fn positions(&self) -> u32 {
        32 / self.per_pos
    }
}

/// The library name of the kernel over a cache of `kv`, merging its splits or not.
pub fn name(kv: KvElem, merge: bool) -> &'static str {
    match (kv, merge) {
        (KvElem::BF16, false) => NAME,
        (KvElem::F16, false) => NAME_F16,
        (KvElem::BF16, true) => NAME_MERGE,
        (KvElem::F16, true) => NAME_MERGE_F16,
        (KvElem::F32, false) => NAME_F32,
        (KvElem::F32, true) => NAME_MERGE_F32,
    }
}

impl DecodeParams {
    pub fn name(&self) -> &'static str {
        name(self.kv, self.merge)
    }

    pub fn group(&self) -> u32 {
        self.n_heads / self.n_kv_heads
    }

    pub fn n_splits(&self) -> u32 {
        self.max_blocks * BLOCK_TOKENS / self.split
    }

    /// Positions per split of a sequence of `ctx` positions: the fewest (a multiple of 16)
    /// that spread it over the splits, at most [`DecodeParams::split`]. A short context
    /// thus takes many short splits rather than a few long ones, and a sequence's splits
    /// depend on its own length only.
    pub fn split_for(&self, ctx: u32) -> u32 {
        ctx.div_ceil(self.n_splits())
            .next_multiple_of(BLOCK_TOKENS)
            .clamp(BLOCK_TOKENS, self.split)
    }

    /// The positions `lo..hi` that split `sp` of a sequence of `ctx` positions covers;
    /// `None` for an empty split.
    pub fn split_range(&self, ctx: u32, sp: u32) -> Option<(u32, u32)> {
        let each = self.split_for(ctx);
        let lo = sp * each;
        let hi = ctx.min(lo + each);
        (hi > lo).then_some((lo, hi))
    }

    pub fn warps(&self) -> u32 {
        self.threads / 32
    }

    pub fn launch(&self, n_seqs: u32) -> Launch {
        Launch {
            grid: [self.n_splits(), n_seqs * self.n_kv_heads, 1],
            block: [self.threads, 1, 1],
            dynamic_shared_bytes: 0,
        }
    }

    /// The widest loads whose values (`group · vec · chunks` per lane) fit the registers;
    /// `None` when a kv head serves too many query heads for any.
    pub fn lanes(&self) -> Option<Lanes> {
        let g = self.group();
        [16, 8, 4].into_iter().find_map(|bytes| {
            let vec = bytes / self.kv.size();
            let units = self.head_dim / vec;
            let chunks = units.div_ceil(32);
            (g * vec * chunks <= MAX_LANE_VALUES).then(|| Lanes {
                vec,
                per_pos: units.min(32).next_power_of_two(),
                chunks,
            })
        })
    }

    /// Static shared memory: the score table, the warps' outputs, the reductions' slots.
    pub fn shared_bytes(&self) -> u32 {
        let g = self.group();
        4 * g * (self.split + self.warps() * self.head_dim) + 8 * g * self.warps() + 4
    }

    /// The longest split (a multiple of 16, possibly 0) whose scores fit the shared memory
    /// beside the warps' outputs, at this head size, grouping and block size.
    pub fn most_split(&self) -> u32 {
        let g = self.group().max(1);
        let fixed = DecodeParams { split: 0, ..*self }.shared_bytes();
        MAX_SHARED_BYTES.saturating_sub(fixed) / (4 * g) / BLOCK_TOKENS * BLOCK_TOKENS
    }

    fn check(&self) -> Result<(), KernelError> {
        let bad = |m: String| Err(KernelError::unsupported(self.name(), m));
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(8) {
            return bad(format!(
                "head_dim = {} must be a positive multiple of 8",
                self.head_dim
            ));
        }
        if self.n_kv_heads == 0
            || self.n_heads == 0
            || !self.n_heads.is_multiple_of(self.n_kv_heads)
        {
            return bad(format!(
                "n_heads = {} must be a positive multiple of n_kv_heads = {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.threads.is_multiple_of(32) || !(32..=1024).contains(&self.threads) {
            return bad(format!(
                "threads = {} must be a multiple of 32 in 32..=1024",
                self.threads
            ));
        }
        if self.split == 0 || !self.split.is_multiple_of(BLOCK_TOKENS) {
            return bad(format!(
                "split = {} must be a positive multiple of 16",
                self.split
            ));
        }
        if self.max_blocks == 0 || !(self.max_blocks * BLOCK_TOKENS).is_multiple_of(self.split) {
            return bad(format!(
                "max_blocks = {} must be positive, with max_blocks·16 a multiple of split",
                self.max_blocks
            ));
        }
        if self.q_stride != 0
            && (self.q_stride < self.n_heads * self.head_dim || !self.q_stride.is_multiple_of(4))
        {
            return bad(format!(
                "q_stride = {} must be a multiple of 4 and at least a row of {} queries",
                self.q_stride,
                self.n_heads * self.head_dim
            ));
        }
        if self.lanes().is_none() {
            return bad(format!(
                "a kv head serves {} query heads of {}: a lane would hold more than {MAX_LANE_VALUES} of their values",
                self.group(),
                self.head_dim
            ));
        }
        if self.shared_bytes() > MAX_SHARED_BYTES {
            return bad(format!(
                "the scores of a split and the warps' outputs need {} bytes of shared memory (at most {MAX_SHARED_BYTES})",
                self.shared_bytes()
            ));
        }
        Ok(())
    }
}

/// A loop body over steps (or splits): `(builder, index, carried) → next carried`.
pub(super) type StepBody<'a> = &'a dyn Fn(&mut Builder, Value, &[Value]) -> Vec<Value>;

/// `steps` steps of a phase carrying `init`: `body(k, step, carried)` for steps `0, 1,
/// …`, `unroll` of them back to back per loop iteration (steps past `steps` run too, on
/// positions past the split, which `body` must mask). `live`, where given, is the number
/// of loop iterations needed at run time (at most those of `steps`); a single iteration
/// is emitted without a loop and always runs.
fn emit_steps(
    k: &mut Builder,
    steps: u32,
    unroll: u32,
    live: Option<Value>,
    init: &[Value],
    body: StepBody,
) -> Vec<Value> {
    let unroll = unroll.clamp(1, steps.max(1));
    let round = |k: &mut Builder, r: Value, c: &[Value]| {
        let mut c = c.to_vec();
        let first = k.mul_const(r, unroll);
        for j in 0..unroll {
            let step = k.add_const(first, j);
            c = body(k, step, &c);
        }
        c
    };
    let rounds = steps.div_ceil(unroll);
    if rounds == 1 {
        let zero = k.const_u32(0);
        round(k, zero, init)
    } else {
        let lo = k.const_u32(0);
        let hi = live.unwrap_or_else(|| k.const_u32(rounds));
        let one = k.const_u32(1);
        k.for_range(lo, hi, one, init, |k, r, c| round(k, r, c))
    }
}

/// `a / c` for a constant `c`: a shift where `c` is a power of two (a division there keeps
/// ptxas's generic sequence, whose result it may spill).
pub(super) fn div_const(k: &mut Builder, a: Value, c: u32) -> Value {
    if c.is_power_of_two() {
        k.shr_const(a, c.trailing_zeros())
    } else {
        let c = k.const_u32(c);
        k.div(a, c)
    }
}

/// The load type of `n` 32-bit words, and its zero.
fn row_load(k: &mut Builder, n: u32) -> (Type, Value) {
    let zero = k.const_u32(0);
    match n {
        1 => (Type::U32, zero),
        n => {
            let ty = Type::Vec(Scalar::U32, n as u8);
            (ty, k.pack(ty, &vec![zero; n as usize]))
        }
    }
}

/// The f32 elements of a row load of `n` words.
fn unpack_row(k: &mut Builder, kv: KvElem, v: Value, n: u32) -> Vec<Value> {
    if n == 1 {
        return kv.emit_unpack_word(k, v);
    }
    (0..n)
        .flat_map(|i| {
            let w = k.extract(v, i);
            kv.emit_unpack_word(k, w)
        })
        .collect()
}

/// `vec` f32 at `at` (16-byte aligned for `vec ≥ 4`, 8-byte for 2), as loaded with `cache`.
fn load_f32s(k: &mut Builder, at: Value, vec: u32, cache: CacheOp) -> Vec<Value> {
    let width = vec.min(4);
    (0..vec / width)
        .flat_map(|i| {
            let o = k.const_u32(i * width);
            let a = k.ptr_add(at, o);
            if width == 1 {
                return vec![k.load_with(Type::F32, a, cache)];
            }
            let v = k.load_with(Type::Vec(Scalar::F32, width as u8), a, cache);
            (0..width).map(|e| k.extract(v, e)).collect::<Vec<_>>()
        })
        .collect()
}

/// Store `vals` (f32, `vec` of them) at shared `at`, as [`load_f32s`] reads them.
fn store_f32s(k: &mut Builder, at: Value, vals: &[Value]) {
    let width = vals.len().min(4);
    for (i, part) in vals.chunks(width).enumerate() {
        let o = k.const_u32((i * width) as u32);
        let a = k.ptr_add(at, o);
        let v = match part {
            [one] => *one,
            _ => k.pack(Type::Vec(Scalar::F32, width as u8), part),
        };
        k.store(a, v);
    }
}

/// The largest split maximum of each of the `group` heads from `head0` on (`part_m`
/// rows of `n_splits`), in every lane of the warp: lane `l` takes splits `l, l + 32, …`
/// (read past the L1, `.cg`), then a butterfly.
fn emit_group_maxima(
    k: &mut Builder,
    part_m: Value,
    head0: Value,
    lane: Value,
    group: u32,
    n_splits: u32,
) -> Vec<Value> {
    let neg_inf = k.const_f32(f32::NEG_INFINITY);
    let rows: Vec<Value> = (0..group)
        .map(|h| {
            let hh = k.add_const(head0, h);
            let first = wide_mul(k, hh, n_splits);
            k.ptr_add(part_m, first)
        })
        .collect();
    let rounds = n_splits.div_ceil(32);
    let limit = k.const_u32(n_splits);
    let last = k.const_u32(n_splits - 1);
    let body = |k: &mut Builder, round: Value, c: &[Value]| -> Vec<Value> {
        let first = k.mul_const(round, 32);
        let s = k.add(first, lane);
        let inside = k.lt(s, limit);
        let s = k.min(s, last);
        rows.iter()
            .zip(c)
            .map(|(&row, &top)| {
                let at = k.ptr_add(row, s);
                let m = k.load_with(Type::F32, at, CacheOp::Cg);
                let m = k.select(inside, m, neg_inf);
                k.max(top, m)
            })
            .collect()
    };
    let init = vec![neg_inf; group as usize];
    // At most 32 loads in flight a lane.
    let mut tops = emit_steps(k, rounds, (32 / group).max(1), None, &init, &body);
    for m in [16, 8, 4, 2, 1] {
        for t in tops.iter_mut() {
            let other = k.shfl_bfly(*t, m);
            *t = k.max(*t, other);
        }
    }
    tops
}

/// `attention_decode_<bf16|f16|f32>(q, k_cache, v_cache, block_table, ctx_len, part_m,
/// part_l, part_o, scale)`, or `attention_decode_merge_<bf16|f16|f32>(q, k_cache, v_cache,
/// block_table, ctx_len, part_m, part_l, part_o, counters, out, scale)`.
pub fn build(p: &DecodeParams) -> Result<Function, KernelError> {
    p.check()?;
    let lanes = p
        .lanes()
        .ok_or_else(|| KernelError::unsupported(p.name(), "no lane layout fits"))?;
    let (d, g, s, t, warps) = (p.head_dim, p.group(), p.split, p.threads, p.warps());
    let Lanes {
        vec,
        per_pos,
        chunks,
    } = lanes;
    let units = d / vec;
    let mut k = Builder::new(p.name(), t);
    let q = k.param("q", gptr(Scalar::F32));
    let kc = k.param("k_cache", gptr(p.kv.scalar()));
    let vc = k.param("v_cache", gptr(p.kv.scalar()));
    let table = k.param("block_table", gptr(Scalar::U32));
    let ctx_len = k.param("ctx_len", gptr(Scalar::U32));
    let part_m = k.param("part_m", gptr(Scalar::F32));
    let part_l = k.param("part_l", gptr(Scalar::F32));
    let part_o = k.param("part_o", gptr(Scalar::F32));
    let merged = p.merge.then(|| {
        (
            k.param("counters", gptr(Scalar::U32)),
            k.param("out", gptr(Scalar::F32)),
        )
    });
    let scale = k.param("scale", Type::F32);
    let scores = k.shared_array("scores", Scalar::F32, g * s, 16);
    let warp_out = k.shared_array("warp_out", Scalar::F32, warps * g * d, 16);

    let split = k.ctaid_x();
    let sk = k.ctaid_y();
    let tid = k.tid_x();
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    let kv_heads = k.const_u32(p.n_kv_heads);
    let seq = k.div(sk, kv_heads);
    let kvh = k.rem(sk, kv_heads);
    let at = k.ptr_add(ctx_len, seq);
    let ctx = k.load_with(Type::U32, at, CacheOp::Nc);
    // This sequence's split (`DecodeParams::split_for`): clamp(⌈⌈ctx / n_splits⌉⌉₁₆, 16, s).
    let n_splits = p.n_splits();
    let each = k.add_const(ctx, n_splits - 1);
    let each = div_const(&mut k, each, n_splits);
    let each = k.add_const(each, BLOCK_TOKENS - 1);
    let each = k.and_const(each, !(BLOCK_TOKENS - 1));
    let least = k.const_u32(BLOCK_TOKENS);
    let each = k.max(each, least);
    let cap = k.const_u32(s);
    let each = k.min(each, cap);
    let t0 = k.mul(split, each);
    // Positions in this split: clamp(ctx − t0, 0, each).
    let has = k.gt(ctx, t0);
    let left = k.sub(ctx, t0);
    let left = k.min(left, each);
    let zero = k.const_u32(0);
    let n = k.select(has, left, zero);
    let log2e = k.const_f32(std::f32::consts::LOG2_E);
    let c = k.mul(scale, log2e);
    let first_head = k.mul_const(kvh, g);
    let seq_heads = k.mul_const(seq, p.n_heads);
    let head0 = k.add(seq_heads, first_head);
    let trow = wide_mul(&mut k, seq, p.max_blocks);
    let trow = k.ptr_add(table, trow);
    // Element offset of position `tok`'s row for this kv head in either cache.
    let row_of = |k: &mut Builder, tok: Value| {
        let bi = k.shr_const(tok, 4);
        let at = k.ptr_add(trow, bi);
        let blk = k.load_with(Type::U32, at, CacheOp::Nc);
        emit_row_start(k, blk, kvh, tok, p.n_kv_heads, d)
    };

    // This lane's place: its position group, and the row elements of its chunks (a lane
    // past the row's end loads the last chunk again and weighs it by zero).
    let in_group = k.and_const(lane, per_pos - 1);
    let group_of_lane = k.shr_const(lane, per_pos.trailing_zeros());
    let warp_first = k.mul_const(warp, lanes.positions());
    let base = k.add(warp_first, group_of_lane);
    let per_step = warps * lanes.positions();
    let steps = s.div_ceil(per_step);
    // 32-bit words of a lane's load.
    let load_words = vec * p.kv.size() / 4;
    let unroll = (IN_FLIGHT / (g + load_words * chunks)).clamp(1, MOST_UNROLL);
    // The rounds of steps that this split's positions need: those after them would only
    // load nothing and add zeros.
    let per_round = per_step * unroll.clamp(1, steps.max(1));
    let live = k.add_const(n, per_round - 1);
    let live = div_const(&mut k, live, per_round);
    let mut offsets = vec![];
    let mut real = vec![];
    for j in 0..chunks {
        let u = k.add_const(in_group, j * per_pos);
        let limit = k.const_u32(units);
        real.push(k.lt(u, limit));
        let last = k.const_u32(units - 1);
        let u = k.min(u, last);
        offsets.push(k.mul_const(u, vec));
    }
    let (load_ty, load_zero) = row_load(&mut k, load_words);
    let kw = words(&mut k, kc);
    let vw = words(&mut k, vc);
    // The loads of this lane's chunks of position `i`'s row and `extras` f32 more that
    // `extra` loads (zeros past the context).
    let load_rows = |k: &mut Builder,
                     i: Value,
                     from: Value,
                     extras: usize,
                     extra: &dyn Fn(&mut Builder) -> Vec<Value>| {
        let valid = k.lt(i, n);
        let mut types = vec![load_ty; chunks as usize];
        types.extend(vec![Type::F32; extras]);
        let got = k.if_else(
            valid,
            &types,
            |k| {
                let tok = k.add(t0, i);
                let row = row_of(k, tok);
                let mut vals: Vec<Value> = offsets
                    .iter()
                    .map(|&o| {
                        let o = k.cvt(Scalar::U64, o);
                        let e = k.add(row, o);
                        let w = word_of(k, p.kv, e);
                        let at = k.ptr_add(from, w);
                        k.load_with(load_ty, at, CacheOp::Nc)
                    })
                    .collect();
                vals.extend(extra(k));
                vals
            },
            |k| {
                let mut vals = vec![load_zero; chunks as usize];
                let fzero = k.const_f32(0.0);
                vals.extend(vec![fzero; extras]);
                vals
            },
        );
        let rows: Vec<Value> = got[..chunks as usize]
            .iter()
            .flat_map(|&v| unpack_row(k, p.kv, v, load_words))
            .collect();
        (valid, rows, got[chunks as usize..].to_vec())
    };

    // The lane's elements of the group's queries (contiguous: its heads are consecutive).
    let q_row = if p.q_stride == 0 {
        p.n_heads * d
    } else {
        p.q_stride
    };
    let qstart = wide_mul(&mut k, seq, q_row);
    let qg = k.ptr_add(q, qstart);
    let first_q = k.mul_const(first_head, d);
    let qg = k.ptr_add(qg, first_q);
    let fzero = k.const_f32(0.0);
    let mut qs = vec![];
    for h in 0..g {
        for (j, &o) in offsets.iter().enumerate() {
            let o = k.add_const(o, h * d);
            let at = k.ptr_add(qg, o);
            for v in load_f32s(&mut k, at, vec, CacheOp::Nc) {
                qs.push(k.select(real[j], v, fzero));
            }
        }
    }
    let per_head = (vec * chunks) as usize;

    // Phase 1: scores of the positions, running maxima per head.
    let neg_inf = k.const_f32(f32::NEG_INFINITY);
    let maxima = emit_steps(
        &mut k,
        steps,
        unroll,
        Some(live),
        &vec![neg_inf; g as usize],
        &|k, step, carried| {
            let first = k.mul_const(step, per_step);
            let i = k.add(first, base);
            let (valid, keys, _) = load_rows(k, i, kw, 0, &|_| vec![]);
            let in_table = k.lt(i, cap);
            let lead = k.eq(in_group, zero);
            let writes = k.and(in_table, lead);
            (0..g as usize)
                .map(|h| {
                    let mut dot = k.const_f32(0.0);
                    for (e, &key) in keys.iter().enumerate() {
                        dot = k.fma(qs[h * per_head + e], key, dot);
                    }
                    let mut m = per_pos / 2;
                    while m > 0 {
                        let other = k.shfl_bfly(dot, m);
                        dot = k.add(dot, other);
                        m /= 2;
                    }
                    let sc = k.mul(dot, c);
                    let sc = k.select(valid, sc, neg_inf);
                    k.if_then(writes, |k| {
                        let at = k.add_const(i, h as u32 * s);
                        let at = k.ptr_add(scores, at);
                        k.store(at, sc);
                    });
                    k.max(carried[h], sc)
                })
                .collect()
        },
    );
    let m = emit_block_allreduce_n(&mut k, &maxima, Combine::Max, tid, t, "maxima");

    // Phase 2: weights 2^(s − m) in place of the scores, and their sums.
    let mut sums = vec![fzero; g as usize];
    for j in 0..s.div_ceil(t) {
        let slot = k.add_const(tid, j * t);
        let inside = k.lt(slot, n);
        let in_table = k.lt(slot, cap);
        for (h, sum) in sums.iter_mut().enumerate() {
            let at = k.add_const(slot, h as u32 * s);
            let at = k.ptr_add(scores, at);
            let mh = m[h];
            let w = k.if_else(
                inside,
                &[Type::F32],
                |k| {
                    let sv = k.load(Type::F32, at);
                    let x = k.sub(sv, mh);
                    vec![k.ex2_approx(x)]
                },
                |k| vec![k.const_f32(0.0)],
            )[0];
            k.if_then(in_table, |k| k.store(at, w));
            *sum = k.add(*sum, w);
        }
    }
    // Its barrier also makes the weights visible to phase 3.
    let l = emit_block_allreduce_n(&mut k, &sums, Combine::Sum, tid, t, "sums");

    // Phase 3: each lane's elements of every head's weighted sum over its positions.
    let accs = emit_steps(
        &mut k,
        steps,
        unroll,
        Some(live),
        &vec![fzero; g as usize * per_head],
        &|k, step, carried| {
            let first = k.mul_const(step, per_step);
            let i = k.add(first, base);
            let weights = |k: &mut Builder| {
                (0..g)
                    .map(|h| {
                        let at = k.add_const(i, h * s);
                        let at = k.ptr_add(scores, at);
                        k.load(Type::F32, at)
                    })
                    .collect()
            };
            let (_, values, ws) = load_rows(k, i, vw, g as usize, &weights);
            let mut next = Vec::with_capacity(carried.len());
            for (h, &w) in ws.iter().enumerate() {
                for (e, &v) in values.iter().enumerate() {
                    next.push(k.fma(w, v, carried[h * per_head + e]));
                }
            }
            next
        },
    );
    // The warp's position groups, then the warps in order.
    let mut accs = accs;
    let mut mask = 16;
    while mask >= per_pos {
        for a in accs.iter_mut() {
            let other = k.shfl_bfly(*a, mask);
            *a = k.add(*a, other);
        }
        mask /= 2;
    }
    let group_lanes = k.const_u32(per_pos);
    let first_group = k.lt(lane, group_lanes);
    k.if_then(first_group, |k| {
        for h in 0..g {
            for (j, &o) in offsets.iter().enumerate() {
                let real_j = real[j];
                let from = h as usize * per_head + j * vec as usize;
                let vals = accs[from..from + vec as usize].to_vec();
                k.if_then(real_j, |k| {
                    let at = k.mul_const(warp, g * d);
                    let at = k.add_const(at, h * d);
                    let at = k.add(at, o);
                    let at = k.ptr_add(warp_out, at);
                    store_f32s(k, at, &vals);
                });
            }
        }
    });
    k.barrier();
    // Thread `i` adds elements `i, i + threads, …` of the warps' outputs and writes them.
    let elems = g * d;
    let mine: Vec<(Value, Value, Value)> = (0..elems.div_ceil(t))
        .map(|j| {
            let e = k.add_const(tid, j * t);
            let limit = k.const_u32(elems);
            let valid = k.lt(e, limit);
            let last = k.const_u32(elems - 1);
            let e = k.min(e, last);
            let dv = k.const_u32(d);
            let h = k.div(e, dv);
            let dim = k.rem(e, dv);
            let at = k.ptr_add(warp_out, e);
            let mut sum = k.load(Type::F32, at);
            for w in 1..warps {
                let at = k.add_const(e, w * elems);
                let at = k.ptr_add(warp_out, at);
                let v = k.load(Type::F32, at);
                sum = k.add(sum, v);
            }
            k.if_then(valid, |k| {
                let hh = k.add(head0, h);
                let at = k.mul_const(hh, n_splits);
                let at = k.add(at, split);
                let at = wide_mul(k, at, d);
                let dim64 = k.cvt(Scalar::U64, dim);
                let at = k.add(at, dim64);
                let at = k.ptr_add(part_o, at);
                k.store(at, sum);
            });
            (valid, h, dim)
        })
        .collect();
    // Threads 0..group write their head's maximum and sum.
    let gv = k.const_u32(g);
    let writer = k.lt(tid, gv);
    k.if_then(writer, |k| {
        let mut mv = m[0];
        let mut lv = l[0];
        for h in 1..g {
            let hc = k.const_u32(h);
            let is = k.eq(tid, hc);
            mv = k.select(is, m[h as usize], mv);
            lv = k.select(is, l[h as usize], lv);
        }
        let hh = k.add(head0, tid);
        let o = k.mul_const(hh, n_splits);
        let o = k.add(o, split);
        let am = k.ptr_add(part_m, o);
        k.store(am, mv);
        let al = k.ptr_add(part_l, o);
        k.store(al, lv);
    });
    if let Some((counters, out)) = merged {
        // Publish this split's partials (each thread fences its own writes), then count
        // the split; the count's old value says whether every other split is in.
        k.fence(Ordering::AcqRel, Scope::Gpu);
        k.barrier();
        let arrived = k.shared_array("arrived", Scalar::U32, 1, 4);
        let counter = k.ptr_add(counters, sk);
        let first_thread = k.eq(tid, zero);
        k.if_then(first_thread, |k| {
            let one = k.const_u32(1);
            let before = k.atomic(AtomOp::Add, Ordering::AcqRel, Scope::Gpu, counter, one);
            k.store(arrived, before);
        });
        k.barrier();
        let before = k.load(Type::U32, arrived);
        let all_others = k.const_u32(n_splits - 1);
        let last = k.eq(before, all_others);
        k.if_then(last, |k| {
            // See every split's partials; read them past the non-coherent L1.
            k.fence(Ordering::AcqRel, Scope::Gpu);
            let rows: Vec<SplitRow> = mine
                .iter()
                .map(|&(_, h, dim)| {
                    let hh = k.add(head0, h);
                    let first = wide_mul(k, hh, n_splits);
                    let ms = k.ptr_add(part_m, first);
                    let ls = k.ptr_add(part_l, first);
                    let o = wide_mul(k, hh, n_splits * d);
                    let os = k.ptr_add(part_o, o);
                    let os = k.ptr_add(os, dim);
                    SplitRow { ms, ls, os }
                })
                .collect();
            // Every warp finds the group's largest split maxima at once (a split a lane),
            // rather than each element walking the splits for them.
            let tops = emit_group_maxima(k, part_m, head0, lane, g, n_splits);
            let item_tops: Vec<Value> = mine
                .iter()
                .map(|&(_, h, _)| {
                    let mut top = tops[0];
                    for (i, &t) in tops.iter().enumerate().skip(1) {
                        let hi = k.const_u32(i as u32);
                        let is = k.eq(h, hi);
                        top = k.select(is, t, top);
                    }
                    top
                })
                .collect();
            // The splits past ⌈ctx / 16⌉ (at least as many as hold positions, as each
            // holds 16 or more) are empty, weigh 0, and the merge stops before them.
            let held = k.add_const(ctx, BLOCK_TOKENS - 1);
            let held = k.shr_const(held, BLOCK_TOKENS.trailing_zeros());
            let ys = emit_merge_below(k, &rows, &item_tops, n_splits, Some(held), d, CacheOp::Cg);
            for (&(valid, h, dim), y) in mine.iter().zip(ys) {
                k.if_then(valid, |k| {
                    let hh = k.add(head0, h);
                    let o = wide_mul(k, hh, d);
                    let at = k.ptr_add(out, o);
                    let at = k.ptr_add(at, dim);
                    k.store(at, y);
                });
            }
            k.if_then(first_thread, |k| k.store(counter, zero));
        });
    }
    Ok(k.finish()?)
}

/// The exact partials of every (sequence, head, split), in f64: `(m, l, o)` laid out as
/// the kernel's outputs.
pub fn reference(
    p: &DecodeParams,
    cache: &PagedCache,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let ns = p.n_splits() as usize;
    let d = p.head_dim as usize;
    let n = cache.n_seqs() * p.n_heads as usize * ns;
    let (mut m, mut l, mut o) = (vec![f64::NEG_INFINITY; n], vec![0.0; n], vec![0.0; n * d]);
    for seq in 0..cache.n_seqs() {
        for h in 0..p.n_heads {
            for sp in 0..ns as u32 {
                let Some((lo, hi)) = p.split_range(cache.ctx_len[seq], sp) else {
                    continue;
                };
                let i = (seq * p.n_heads as usize + h as usize) * ns + sp as usize;
                let s = cache.scores(seq, h, lo, hi, scale);
                let mx = s.iter().fold(f64::NEG_INFINITY, |a, &(v, _)| a.max(v));
                m[i] = mx;
                for (t, &(v, _)) in (lo..hi).zip(&s) {
                    let w = (v - mx).exp2();
                    l[i] += w;
                    let (_, vr) = cache.kv_row(seq, h / p.group(), t);
                    for (o, &vv) in o[i * d..(i + 1) * d].iter_mut().zip(vr) {
                        *o += w * vv as f64;
                    }
                }
            }
        }
    }
    (m, l, o)
}

/// Tolerances of `(m, l, o)` against [`reference()`], and how they follow.
///
/// A score's dot product sums `head_dim` products (chains per lane, then a butterfly),
/// within `γ_d·Σ|q_i k_i|·|c|`; the
/// rounded `c = fl(scale·log2 e)` and the product add `2u·|s|`: `|ŝ − s| ≤ E` for the
/// largest such bound `E`, and the split's maximum is within `E` too. A weight
/// `ex2.approx(fl(ŝ − m̂))` is then within a relative `ρ = 2^(2E + u·Δ)·(1 + EX2) − 1` of
/// `2^(s − m)`, `Δ` the widest score range plus `2E`. The sum adds `γ` of its tree
/// (`⌈split / threads⌉` terms per thread and two butterflies); each output is a sum of at
/// most `split` terms by some tree (chains per lane, butterflies, the warps):
/// `|ô − o| ≤ (ρ(1 + γ_n) + γ_n)·Σ 2^(s − m)|v|`. Flushed subnormal weights add at most
/// `n·2^-126` (times `max|v|`).
pub fn tolerances(p: &DecodeParams, cache: &PagedCache, scale: f64) -> ([Vec<f64>; 3], String) {
    let (m, l, o) = reference(p, cache, scale);
    let ns = p.n_splits() as usize;
    let d = p.head_dim as usize;
    let WeightError { e, rho, span } = weight_error(p, cache, scale);
    let g_sum = gamma(p.split.div_ceil(p.threads) as u64 + 10);
    let g_out = gamma(p.split as u64);
    let tiny = p.split as f64 * F32_MIN_NORMAL;
    // Each bound also covers the reference's own rounding to f32 (u relative).
    let tol_m: Vec<f64> = m.iter().map(|&m| e + F32_U * m.abs()).collect();
    let tol_l: Vec<f64> = l
        .iter()
        .map(|&l| l * ((1.0 + rho) * (1.0 + g_sum) - 1.0 + F32_U) * 1.01 + tiny)
        .collect();
    let mut tol_o = vec![0.0; m.len() * d];
    for seq in 0..cache.n_seqs() {
        for h in 0..p.n_heads {
            for sp in 0..ns as u32 {
                let Some((lo, hi)) = p.split_range(cache.ctx_len[seq], sp) else {
                    continue;
                };
                let i = (seq * p.n_heads as usize + h as usize) * ns + sp as usize;
                let s = cache.scores(seq, h, lo, hi, scale);
                for (t, &(v, _)) in (lo..hi).zip(&s) {
                    let w = (v - m[i]).exp2();
                    let (_, vr) = cache.kv_row(seq, h / p.group(), t);
                    for (o, &vv) in tol_o[i * d..(i + 1) * d].iter_mut().zip(vr) {
                        *o += w * (vv as f64).abs();
                    }
                }
            }
        }
    }
    for (t, o) in tol_o.iter_mut().zip(&o) {
        *t = *t * (rho * (1.0 + g_out) + g_out) * 1.01 + F32_U * o.abs() + tiny;
    }
    let explain = format!(
        "m within E = {e:.3e} (dot-product and scaling roundings); l within ((1+ρ)(1+γ) − 1)·l and o within \
         (ρ(1+γ_n) + γ_n)·Σ2^(s−m)|v| with ρ = {rho:.3e} (2E and the exponent's rounding over a score range of \
         {span:.2}, ex2.approx {EX2_REL:.1e}), plus {tiny:.1e} for flushed subnormals"
    );
    ([tol_m, tol_l, tol_o], explain)
}

/// How far the kernel's scores and weights may be from exact (see [`tolerances`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightError {
    /// Bound on a score's (and a split maximum's) error, base 2.
    pub e: f64,
    /// Relative error bound of a weight `2^(ŝ − m̂)` against `2^(s − m)`.
    pub rho: f64,
    /// The widest score range within a split.
    pub span: f64,
}

pub fn weight_error(p: &DecodeParams, cache: &PagedCache, scale: f64) -> WeightError {
    let (mut e_max, mut span) = (0.0f64, 0.0f64);
    for seq in 0..cache.n_seqs() {
        for h in 0..p.n_heads {
            for sp in 0..p.n_splits() {
                let Some((lo, hi)) = p.split_range(cache.ctx_len[seq], sp) else {
                    continue;
                };
                let s = cache.scores(seq, h, lo, hi, scale);
                let (mut top, mut bottom) = (f64::NEG_INFINITY, f64::INFINITY);
                for &(v, abs) in &s {
                    e_max = e_max.max(
                        gamma(p.head_dim as u64) * abs * (1.0 + 3.0 * F32_U)
                            + 2.01 * F32_U * v.abs(),
                    );
                    top = top.max(v);
                    bottom = bottom.min(v);
                }
                span = span.max(top - bottom);
            }
        }
    }
    let e = e_max * 1.01;
    let rho = (2.0 * e + F32_U * (span + 2.0 * e)).exp2() * (1.0 + EX2_REL) - 1.0;
    WeightError { e, rho, span }
}

/// The merged output's reference (exact attention, rounded to f32) and its bound: the
/// merge's own ([`merge::tolerance`]), its `κ` taken over the exact split maxima's span
/// widened by `2E` (the kernel's maxima are within `E` each), compounded with the
/// splits' weight error `ρ` and sums over at most `split + 10` terms (as
/// `tests/attention.rs` checks the two kernels apart).
fn merged_bound(p: &DecodeParams, cache: &PagedCache, scale: f64, m: &[f64]) -> (Vec<f64>, Check) {
    let mp = MergeParams {
        head_dim: p.head_dim,
        n_splits: p.n_splits(),
        out: OutType::F32,
    };
    let WeightError { e, rho, .. } = weight_error(p, cache, scale);
    let m32: Vec<f32> = m.iter().map(|&x| x as f32).collect();
    let top = m
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f64, |a, x| a.max(x.abs()));
    let span = merge::span(&mp, &m32) + 2.0 * e + 2.0 * F32_U * top;
    let splits = (1.0 + rho) * (1.0 + gamma(p.split as u64 + 10)) - 1.0;
    let kappa = (1.0 + merge::kappa(&mp, span)) * (1.0 + splits) - 1.0;
    let (exact, b) = cache.attend(scale);
    let want: Vec<f64> = exact.iter().map(|&v| merge::round_out(&mp, v)).collect();
    let tol = merge::tolerance(kappa, &b, &want, F32_U);
    let explain = format!(
        "(2κ/(1−κ) + u)·Σw|v|/Σw + 2u·|want|: κ = {kappa:.3e} (the splits' weights within ρ = {rho:.3e} and sums, \
         the merge's ex2.approx over a maxima span of {span:.2} and sums over {} splits)",
        p.n_splits()
    );
    (want, Check::Bound { tol, explain })
}

fn f64_as_f32_bytes(v: &[f64]) -> Vec<u8> {
    data::f32_bytes(&v.iter().map(|&x| x as f32).collect::<Vec<_>>())
}

/// A case: three sequences, the first with a full context, the second ending within the
/// longest split's length of the end, the third at most half the longest (where there are
/// several splits, the last two take shorter splits, or leave some empty); softmax scale
/// `1/sqrt(head_dim)`. Every split that is not empty holds at least two positions: over
/// one, attention is that position's values whatever the scale, which the wrong-answer
/// control could not tell apart.
pub fn case(p: &DecodeParams, seed: u64) -> Result<KernelCase, KernelError> {
    let mut rng = data::rng(seed);
    let max_ctx = p.max_blocks * BLOCK_TOKENS;
    let two_each = |ctx: u32| {
        let each = p.split_for(ctx);
        ctx >= 2 && ctx % each != 1
    };
    let mut pick = |lo: u32, hi: u32| loop {
        let ctx = lo + data::below(&mut rng, hi - lo + 1);
        if two_each(ctx) {
            break ctx;
        }
    };
    let (short, shortest) = if p.n_splits() >= 2 {
        (
            pick(max_ctx - 2 * p.split + 2, max_ctx - p.split),
            pick(2, (max_ctx / 2).max(2)),
        )
    } else {
        (pick(2, max_ctx), pick(2, max_ctx))
    };
    let cache = PagedCache::random(
        &mut rng,
        p.kv,
        p.head_dim,
        p.n_heads,
        p.n_kv_heads,
        p.max_blocks,
        vec![max_ctx, short, shortest],
    );
    case_for(p, &cache, 1.0 / (p.head_dim as f64).sqrt())
}

/// A case over a given cache and softmax scale.
pub fn case_for(
    p: &DecodeParams,
    cache: &PagedCache,
    scale: f64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    if cache.head_dim != p.head_dim
        || cache.n_heads != p.n_heads
        || cache.n_kv_heads != p.n_kv_heads
        || cache.max_blocks != p.max_blocks
        || cache
            .ctx_len
            .iter()
            .any(|&c| c > p.max_blocks * BLOCK_TOKENS)
        || cache.elem != p.kv
    {
        return Err(KernelError::unsupported(
            p.name(),
            "the cache does not have the kernel's shape and element type",
        ));
    }
    let (m, l, o) = reference(p, cache, scale);
    let ([tm, tl, to], explain) = tolerances(p, cache, scale);
    let (wm, _, wo) = reference(p, cache, 1.0);
    let bound = |tol: Vec<f64>| Check::Bound {
        tol,
        explain: explain.clone(),
    };
    // Queries `q_stride` apart when that is set, NaN between them (which a kernel that read
    // there would spread).
    let q_row = (p.n_heads * p.head_dim) as usize;
    let q = match p.q_stride as usize {
        0 => cache.q.clone(),
        stride => {
            let mut q = vec![f32::NAN; cache.n_seqs() * stride];
            for (s, row) in cache.q.chunks_exact(q_row).enumerate() {
                q[s * stride..][..q_row].copy_from_slice(row);
            }
            q
        }
    };
    let mut buffers = vec![
        Buffer::input("q", data::f32_bytes(&q)),
        Buffer::input("k_cache", cache.elem.bytes(&cache.k)),
        Buffer::input("v_cache", cache.elem.bytes(&cache.v)),
        Buffer::input(
            "block_table",
            cache
                .block_table
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        Buffer::input(
            "ctx_len",
            cache.ctx_len.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ),
        Buffer::output("part_m", m.len() * 4),
        Buffer::output("part_l", l.len() * 4),
        Buffer::output("part_o", o.len() * 4),
    ];
    let mut args: Vec<CaseArg> = (0..8).map(CaseArg::Buffer).collect();
    let mut expected = vec![
        Expected {
            buffer: 5,
            data: f64_as_f32_bytes(&m),
            elem: Scalar::F32,
            check: bound(tm.clone()),
        },
        Expected {
            buffer: 6,
            data: f64_as_f32_bytes(&l),
            elem: Scalar::F32,
            check: bound(tl),
        },
        Expected {
            buffer: 7,
            data: f64_as_f32_bytes(&o),
            elem: Scalar::F32,
            check: bound(to.clone()),
        },
    ];
    let mut controls = vec![
        Control {
            what: "scores without the 1/sqrt(head_dim) scale (maxima)".into(),
            expected: Expected {
                buffer: 5,
                data: f64_as_f32_bytes(&wm),
                elem: Scalar::F32,
                check: bound(tm),
            },
        },
        Control {
            what: "scores without the 1/sqrt(head_dim) scale (outputs)".into(),
            expected: Expected {
                buffer: 7,
                data: f64_as_f32_bytes(&wo),
                elem: Scalar::F32,
                check: bound(to),
            },
        },
    ];
    let out_len = cache.n_seqs() * (p.n_heads * p.head_dim) as usize;
    if p.merge {
        // The counters start at zero and must end there; the output is exact attention
        // within the bound of the splits' errors and the merge's.
        let counters = cache.n_seqs() * p.n_kv_heads as usize;
        buffers.push(Buffer::in_out("counters", vec![0; 4 * counters]));
        buffers.push(Buffer::output("out", 4 * out_len));
        args.extend([CaseArg::Buffer(8), CaseArg::Buffer(9)]);
        expected.push(Expected {
            buffer: 8,
            data: vec![0; 4 * counters],
            elem: Scalar::U32,
            check: Check::Exact,
        });
        let (want, check) = merged_bound(p, cache, scale, &m);
        let (wrong, _) = cache.attend(1.0);
        controls.push(Control {
            what: "scores without the 1/sqrt(head_dim) scale (merged output)".into(),
            expected: Expected {
                buffer: 9,
                data: f64_as_f32_bytes(&wrong),
                elem: Scalar::F32,
                check: check.clone(),
            },
        });
        expected.push(Expected {
            buffer: 9,
            data: f64_as_f32_bytes(&want),
            elem: Scalar::F32,
            check,
        });
    }
    args.push(CaseArg::Scalar(Arg::F32(scale as f32)));
    let tokens: u64 = cache.ctx_len.iter().map(|&c| c as u64).sum();
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!(
            "contexts {:?}, {}/{} heads of {}, splits of {}",
            cache.ctx_len, p.n_heads, p.n_kv_heads, p.head_dim, p.split
        ),
        kernel,
        launch: p.launch(cache.n_seqs() as u32),
        buffers,
        args,
        expected,
        controls,
        bytes_moved: tokens * p.n_kv_heads as u64 * p.head_dim as u64 * 4
            + (m.len() * (8 + 4 * p.head_dim as usize)) as u64
            + if p.merge { 4 * out_len as u64 } else { 0 },
        flops: tokens * p.n_heads as u64 * p.head_dim as u64 * 4,
    })
}
