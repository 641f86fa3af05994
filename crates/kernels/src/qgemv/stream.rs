//! Q4_K products at one vector a pass, streamed: the weights of a lane's next pieces
//! are copied into shared memory (`cp.async`) while it multiplies the current one, from
//! one row group into the next.
//!
//! **Why.** A Q4_K weight is 0.5625 bytes; at the copy bandwidth of an H200 (~4.2 TB/s,
//! ~32 KB/µs a multiprocessor) and a loaded device-memory latency near 1 µs, each
//! multiprocessor needs ~32 KB of weight loads in flight *all the time*. The stepped
//! loop ([`super::emit_dots`]) cannot keep them: a lane issues `unroll` pieces' loads,
//! waits, multiplies (~3.6 instructions a weight), and only then issues the next step's;
//! at the end of a row group it reduces and stores before the next group's first load.
//! A row at the decode shapes is a few steps long (4096 columns: 4 pieces a lane), so
//! every group costs a few full round trips with nothing in flight during the
//! arithmetic, and since loads in flight hold registers (16 bytes each) ptxas, keeping
//! a step in 64 registers, issues half of them only after the first piece's arithmetic.
//! The result was ~30% of the copy bandwidth with the issue slots ~25% busy: latency,
//! not bytes or instructions, was the limit.
//!
//! **How.** The loop runs over the warp's *items* (a piece of each of its row streams,
//! in the lane's piece order, group after group). Each iteration first copies the quant
//! bytes of the item `ahead` further on (`unroll − 1`, at least 1) into a ring in shared
//! memory, then waits for its own item's copy, reads it (one 16-byte shared load a
//! stream), reads the super-block's 16-byte header (whose 32-byte sector the copy of the
//! super-block's first lane brought into L1), and multiplies, the activations read 8
//! at a time from the staged row or L1. A copy in flight holds no register, so the
//! kernels stay at 56 registers (8 blocks of 4 warps an SM) and keep
//! `32 warps · 32 lanes · streams · ahead · 16` bytes (32 KiB at the engine's
//! `unroll = 2`, plus the headers' sectors) in flight through the arithmetic. The ring
//! costs `warps · (ahead + 1) · streams · 512` bytes of shared memory (8 KiB); where it
//! does not fit beside the prologue's staged row, the kernel keeps the stepped loop.
//!
//! **Arithmetic**: unchanged. A lane multiplies its pieces `l, l + 32, ...` in order,
//! decoded as [`crate::ggml::q4_k_piece`] and folded element by element with
//! `fma(w, x, acc)`, and the warp reduces by the butterfly: the same operations in the
//! same order as the stepped loop and [`super::dots`], so the results are the same bits
//! (and the same as the batched kernels', which keep the stepped loop).

use quench_ir::func::MAX_STATIC_SHARED_BYTES;
use quench_ir::{Builder, CacheOp, Scalar, Type, Value};

use super::format::{load_x, unpack_x, Q4kConsts};
use super::{Epilogue, Prologue, QGemvParams, WeightFormat};
use crate::ggml::{Bytes, Q4kScales};
use crate::lanes::{emit_warp_allreduce, wide_mul, words, Combine};

/// Pieces of a Q4_K super-block (one per lane of 8).
const PPU: u32 = 8;

/// Whether the kernel of `p` streams its pieces: Q4_K, one vector a pass, and room for
/// the ring beside the prologue's staged activations (else the stepped loop, whose
/// results are the same bits).
pub(super) fn applies(p: &QGemvParams) -> bool {
    let staged = match p.prologue {
        Prologue::RmsNorm => 4 * u64::from(p.batch * p.cols),
        Prologue::None => 0,
    };
    p.format == WeightFormat::Q4K && p.batch == 1 && staged + ring_bytes(p) + SLACK <= MAX_STATIC_SHARED_BYTES
}

/// Shared bytes left for the prologue's reductions.
const SLACK: u64 = 1024;

/// Items in flight beside the one multiplied: `unroll − 1`, at least 1.
fn ahead(p: &QGemvParams) -> u32 {
    p.unroll.max(2) - 1
}

/// The ring's slots: the items in flight and the one being read.
fn slots(p: &QGemvParams) -> u32 {
    ahead(p) + 1
}

fn streams(p: &QGemvParams) -> u32 {
    let matrices = if p.epilogue == Epilogue::SwiGlu { 2 } else { 1 };
    matrices * p.rows_per_warp()
}

/// The block's ring: per warp, slot and stream, 16 quant bytes a lane.
fn ring_bytes(p: &QGemvParams) -> u64 {
    u64::from(p.warps * slots(p) * streams(p)) * 32 * 16
}

/// Stores a row group's totals: `(first row of the warp, totals[vector][stream])`.
pub(super) type Store<'a> = dyn Fn(&mut Builder, Value, &[Vec<Value>]) + 'a;

/// One warp's streamed products: its constants, made once per kernel.
pub(super) struct Stream<'a> {
    p: &'a QGemvParams,
    /// The matrices' byte pointers.
    weights: Vec<Value>,
    warp: Value,
    lane: Value,
    /// This lane's words in the block's ring of quants in shared memory (`u32`): slot
    /// 0, stream 0 of its warp.
    ring: Value,
    /// Items per row: a piece of each stream per lane, `ceil(pieces / 32)`.
    items: u32,
}

impl<'a> Stream<'a> {
    pub(super) fn new(k: &mut Builder, p: &'a QGemvParams, weights: &[Value], warp: Value, lane: Value) -> Stream<'a> {
        let weights = weights.iter().map(|&w| k.ptr_cast(Scalar::U8, w)).collect();
        let ring = k.shared_array("q4k_ring", Scalar::U32, (ring_bytes(p) / 4) as u32, 16);
        let at = k.mul_const(warp, slots(p) * streams(p) * 32);
        let at = k.add(at, lane);
        let at = k.shl_const(at, 2);
        let ring = k.ptr_add(ring, at);
        Stream { p, weights, warp, lane, ring, items: p.pieces().div_ceil(32) }
    }

    fn streams(&self) -> usize {
        streams(self.p) as usize
    }

    /// This lane's 16 bytes of stream `i` in ring slot `slot`.
    fn slot_at(&self, k: &mut Builder, slot: Value, i: u32) -> Value {
        let at = k.mul_const(slot, streams(self.p) * 128);
        let at = k.add_const(at, i * 128);
        k.ptr_add(self.ring, at)
    }

    /// Whether the last item of a row leaves some lanes without a piece.
    fn ragged(&self) -> bool {
        !self.p.pieces().is_multiple_of(32)
    }

    /// The first row of the warp in row group `group`.
    fn row0(&self, k: &mut Builder, group: Value) -> Value {
        let first = k.mul_const(group, self.p.warps);
        let first = k.add(first, self.warp);
        k.mul_const(first, self.p.rows_per_warp())
    }

    /// Whether this lane has a piece in item `s` of a row.
    fn has_piece(&self, k: &mut Builder, s: Value) -> Value {
        let piece = k.shl_const(s, 5);
        let piece = k.add(piece, self.lane);
        let pieces = k.const_u32(self.p.pieces());
        k.lt(piece, pieces)
    }

    /// The super-block of this lane's piece in item `s`: `lane / 8 + 4s`.
    fn unit(&self, k: &mut Builder, s: Value) -> Value {
        let base = k.mul_const(s, 32 / PPU);
        let unit_lane = k.shr_const(self.lane, PPU.trailing_zeros());
        k.add(base, unit_lane)
    }

    /// The lane's sub-piece constants. Made where they are used, from the lane index,
    /// rather than held across the loop: a few integer operations an item buy back the
    /// registers that keep 8 blocks of 4 warps on a multiprocessor.
    fn consts(&self, k: &mut Builder) -> Q4kConsts {
        let j = k.and_const(self.lane, PPU - 1);
        Q4kConsts::new(k, j)
    }

    /// Byte pointers to the super-block of item `s` of row group `group` in every
    /// stream. A lane without a piece in a ragged last item, or a warp past the last row,
    /// gets one that exists instead (and does not use it).
    fn blocks(&self, k: &mut Builder, group: Value, s: Value) -> Vec<Value> {
        let p = self.p;
        let rpw = p.rows_per_warp();
        let mut row0 = self.row0(k, group);
        if !p.rows.is_multiple_of(p.warps * rpw) {
            let last = k.const_u32(p.rows - rpw);
            row0 = k.min(row0, last);
        }
        let mut unit = self.unit(k, s);
        if self.ragged() {
            let has = self.has_piece(k, s);
            let first = k.mul_const(s, 32 / PPU);
            unit = k.select(has, unit, first);
        }
        let off = k.mul_const(unit, p.format.unit_bytes());
        let rb = p.format.row_bytes(p.cols);
        // A matrix under 2 GiB (any decoder's) takes 32-bit offsets: one 64-bit add a
        // stream instead of a wide multiply and two.
        let start = if u64::from(p.rows) * u64::from(rb) < 1 << 31 {
            let start = k.mul_const(row0, rb);
            k.add(start, off)
        } else {
            let start = wide_mul(k, row0, rb);
            let off = k.cvt(Scalar::U64, off);
            k.add(start, off)
        };
        let mut out = Vec::with_capacity(self.streams());
        for i in 0..rpw {
            for &w in &self.weights {
                let at = k.ptr_add(w, start);
                // The warp's later rows as constant offsets from its first (an address
                // immediate, not another pointer held across the loop).
                let later = k.const_u32(i * rb);
                out.push(k.ptr_add(at, later));
            }
        }
        out
    }

    /// Copy item `s` of row group `group` into ring slot `slot`: every stream's 16 quant
    /// bytes, one `cp.async` group. (A super-block's header shares a 32-byte sector with
    /// the quants of its first lane, and `.ca` keeps that sector in L1, where
    /// [`Stream::multiply`] reads the header.)
    fn issue(&self, k: &mut Builder, group: Value, s: Value, slot: Value) {
        let blocks = self.blocks(k, group, s);
        let q4k = self.consts(k);
        for (i, b) in blocks.into_iter().enumerate() {
            let src = k.ptr_add(b, q4k.qs);
            let dst = self.slot_at(k, slot, i as u32);
            k.cp_async(dst, src, 16, CacheOp::Ca);
        }
        k.cp_async_commit();
    }

    /// The position `ahead` items after item `s` of row group `group`: further on in
    /// the row, or in the block's following groups. It may lie past the last group.
    fn after(&self, k: &mut Builder, group: Value, s: Value, ahead: u32) -> (Value, Value) {
        // One item at a time (`ahead` is small): no division, which ptxas would expand
        // into a reciprocal sequence even for a constant divisor held in a register.
        let (mut group, mut s) = (group, s);
        for _ in 0..ahead {
            let t = k.add_const(s, 1);
            let items = k.const_u32(self.items);
            let wrap = k.eq(t, items);
            let zero = k.const_u32(0);
            s = k.select(wrap, zero, t);
            let stride = k.nctaid_x();
            let on = k.add(group, stride);
            group = k.select(wrap, on, group);
        }
        (group, s)
    }

    /// Issue item `ahead` after `(group, s)` into `slot`, or, past the block's last
    /// group, item `s` again (never used): copies that exist either way, and one group
    /// for every item, so that the waits count alike.
    fn issue_after(&self, k: &mut Builder, group: Value, s: Value, ahead: u32, slot: Value) {
        let (g, t) = self.after(k, group, s, ahead);
        let groups = k.const_u32(self.p.groups());
        let exists = k.lt(g, groups);
        let g = k.select(exists, g, group);
        let t = k.select(exists, t, s);
        self.issue(k, g, t, slot)
    }

    /// Copy the block's first items into the ring (slots `0..ahead`). Emitted before
    /// the pass stages its activations, so that the weights travel while it normalizes.
    pub(super) fn start(&self, k: &mut Builder) {
        let first = k.ctaid_x();
        let zero = k.const_u32(0);
        for a in 0..ahead(self.p) {
            let slot = k.const_u32(a);
            self.issue_after(k, first, zero, a, slot);
        }
    }

    /// Multiply item `s` of row group `group` (its quants in ring slot `slot`) with the
    /// activations at `xw` (`x` as 32-bit words), adding to `accs` (one per stream).
    #[allow(clippy::too_many_arguments)]
    fn multiply(&self, k: &mut Builder, group: Value, s: Value, slot: Value, xw: Value, accs: &[Value]) -> Vec<Value> {
        let act = self.p.act;
        let unit = self.unit(k, s);
        let first = k.mul_const(unit, self.p.format.unit_elems());
        let zero = k.const_u32(0);
        let blocks = self.blocks(k, group, s);
        let q4k = self.consts(k);
        let pieces: Vec<(Q4kScales, Bytes)> = blocks
            .into_iter()
            .enumerate()
            .map(|(i, b)| {
                let header = load16(k, b, zero);
                let header = Bytes::words(k, header);
                let at = self.slot_at(k, slot, i as u32);
                let v = k.load(Type::Vec(Scalar::U32, 4), at);
                let qs = (0..4).map(|e| k.extract(v, e)).collect();
                (Q4kScales::new(k, &q4k.lane, &header), Bytes::words(k, qs))
            })
            .collect();
        let mut accs = accs.to_vec();
        // A half piece (16 weights) at a time, its run of activations 8 at a time, so that
        // few values are live at once; each stream's order is unchanged.
        for (half, &off) in q4k.x_runs.iter().enumerate() {
            let ws: Vec<Vec<Value>> =
                pieces.iter().map(|(scales, qs)| scales.half(k, q4k.magic, qs, half as u32)).collect();
            for c in 0..2 {
                let at = k.add(first, off);
                let at = k.add_const(at, 8 * c);
                let loaded = load_x(k, act, xw, at, 8);
                let xv = unpack_x(k, act, &loaded);
                for (acc, ws) in accs.iter_mut().zip(&ws) {
                    let ws = &ws[8 * c as usize..8 * c as usize + 8];
                    *acc = ws.iter().zip(&xv).fold(*acc, |acc, (&w, &x)| k.fma(w, x, acc));
                }
            }
        }
        accs
    }

    /// The warp's products with the vector at `x` (its activations, global or staged):
    /// every row group of the block in turn (`ctaid, ctaid + nctaid, ...`), each group's
    /// totals handed to `store`, from the items [`Stream::start`] issued on. Each
    /// iteration copies the item `ahead` further on (into the slot read last), waits for
    /// its own, and multiplies it; the copies run on from one group into the next.
    pub(super) fn run(&self, k: &mut Builder, x: Value, store: &Store<'_>) {
        let p = self.p;
        let streams = self.streams();
        let ahead = ahead(p);
        let xw = words(k, x);
        let first = k.ctaid_x();
        let groups = k.const_u32(p.groups());
        let stride = k.nctaid_x();
        let zero = k.const_u32(0);
        let one = k.const_u32(1);
        let items = k.const_u32(self.items);
        let slots_n = slots(p);
        let fzero = k.const_f32(0.0);
        k.for_range(first, groups, stride, &[zero], |k, group, c| {
            let mut init = vec![c[0]];
            init.extend(vec![fzero; streams]);
            let out = k.for_range(zero, items, one, &init, |k, s, c| {
                let (slot, accs) = (c[0], &c[1..]);
                // The slot `ahead` on from this one: the one read in the last iteration.
                let free = wrap_add(k, slot, ahead, slots_n);
                self.issue_after(k, group, s, ahead, free);
                k.cp_async_wait(ahead);
                let accs = if self.ragged() {
                    let has = self.has_piece(k, s);
                    let types = vec![Type::F32; streams];
                    k.if_else(has, &types, |k| self.multiply(k, group, s, slot, xw, accs), |_| accs.to_vec())
                } else {
                    self.multiply(k, group, s, slot, xw, accs)
                };
                let mut out = vec![wrap_add(k, slot, 1, slots_n)];
                out.extend(accs);
                out
            });
            let totals: Vec<Value> = out[1..].iter().map(|&a| emit_warp_allreduce(k, a, Combine::Sum)).collect();
            let row0 = self.row0(k, group);
            if p.rows.is_multiple_of(p.warps * p.rows_per_warp()) {
                store(k, row0, &[totals]);
            } else {
                let rows = k.const_u32(p.rows);
                let inside = k.lt(row0, rows);
                k.if_then(inside, |k| store(k, row0, &[totals]));
            }
            vec![out[0]]
        });
        // The copies issued past the end land before the next pass reuses their slots.
        k.cp_async_wait(0);
    }
}

/// The four 32-bit words at byte `off` (16-aligned) of `at`, through the read-only path.
fn load16(k: &mut Builder, at: Value, off: Value) -> Vec<Value> {
    let at = k.ptr_add(at, off);
    let at = k.ptr_cast(Scalar::U32, at);
    let v = k.load_with(Type::Vec(Scalar::U32, 4), at, CacheOp::Nc);
    (0..4).map(|e| k.extract(v, e)).collect()
}

/// `(slot + d) mod slots` for `slot < slots`, `d ≤ slots`, without a division.
fn wrap_add(k: &mut Builder, slot: Value, d: u32, slots: u32) -> Value {
    let t = k.add_const(slot, d);
    let n = k.const_u32(slots);
    let over = k.ge(t, n);
    let back = k.sub(t, n);
    k.select(over, back, t)
}
