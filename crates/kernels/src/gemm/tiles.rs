//! The parts every matrix product of this family shares: the block's identity, copies
//! of 16-bit tiles into shared memory, the fragment loads and `mma.sync` of one k-step,
//! and the epilogue that writes `C`.
//!
//! A shared-memory tile holds `rows × 32` 16-bit elements (bf16 or f16), one 64-byte row
//! per matrix row; 16-byte
//! chunk `c` of row `r` sits at chunk `c ^ ((r >> 1) & 3)`. Eight consecutive rows then
//! cover all eight 16-byte bank groups for any fixed `c`, so `ldmatrix` (eight row
//! addresses per phase), the 16-byte `cp.async` copies and the dequantizer's 16-byte
//! stores are all free of bank conflicts.

use quench_ir::{Builder, CacheOp, FragRole, MmaShape, Scalar, Type, Value};

use super::{Epilogue, GemmParams, BK, WARP_M};
use crate::lanes::{emit_pack_f16x2, emit_unpack_bf16x2, wide_mul};

/// Element offset, within a tile, of chunk `chunk` of row `row` (both `u32` values).
pub fn swizzled(k: &mut Builder, row: Value, chunk: Value) -> Value {
    let swz = k.shr_const(row, 1);
    let swz = k.and_const(swz, 3);
    let c = k.xor(chunk, swz);
    let c = k.shl_const(c, 3);
    let r = k.shl_const(row, 5);
    k.add(r, c)
}

/// Who this thread is, and where its block's and warp's tiles of `C` lie.
pub struct Ids {
    pub tid: Value,
    pub lane: Value,
    pub warp: Value,
    /// The warp's place in the block's grid of warp tiles.
    pub warp_m: Value,
    pub warp_n: Value,
    /// First row and column of the block's tile of `C`.
    pub row0: Value,
    pub col0: Value,
}

impl Ids {
    /// Blocks are numbered `m`-tile first (`%ctaid.x`), so the blocks running at once
    /// share a few columns of `B` and all of `A`'s rows, and both stay in L2.
    pub fn emit(k: &mut Builder, p: &GemmParams) -> Ids {
        let tid = k.tid_x();
        let lane = k.and_const(tid, 31);
        let warp = k.shr_const(tid, 5);
        let warps_n = p.bn / p.wn;
        let warp_m = k.shr_const(warp, warps_n.trailing_zeros());
        let warp_n = k.and_const(warp, warps_n - 1);
        let mt = k.ctaid_x();
        let row0 = k.mul_const(mt, p.bm);
        let nt = k.ctaid_y();
        let col0 = k.mul_const(nt, p.bn);
        Ids {
            tid,
            lane,
            warp,
            warp_m,
            warp_n,
            row0,
            col0,
        }
    }
}

/// One thread's share of copying a `[rows][32]` 16-bit tile of a row-major `[·, kdim]`
/// operand into a stage of shared memory: chunk `tid & 3` of rows `tid / 4 + i·threads/4`,
/// `tid` counting the `threads` that copy.
pub struct TileCopy {
    /// Global address of each of this thread's chunks at k-step 0, as a pointer and a
    /// constant element offset from it.
    srcs: Vec<(Value, u64)>,
    /// Element offset of the first chunk within a stage (rows `threads/4` apart share
    /// the swizzle, `threads/4` being a multiple of 8).
    dst: Value,
    pass_rows: u32,
}

impl TileCopy {
    /// `first_row` is the tile's first row; with `last_row`, rows past it are read from
    /// `last_row` instead (rows of `A` past `m`: their products are never stored), which
    /// takes a pointer per chunk; without, one pointer and constant offsets.
    pub fn emit(
        k: &mut Builder,
        p: &GemmParams,
        (tid, threads): (Value, u32),
        base: Value,
        first_row: Value,
        last_row: Option<Value>,
        rows: u32,
    ) -> TileCopy {
        let kdim = p.k;
        let r = k.shr_const(tid, 2);
        let c = k.and_const(tid, 3);
        let pass_rows = threads / 4;
        let c8 = k.shl_const(c, 3);
        let c8 = k.cvt(Scalar::U64, c8);
        let row = k.add(first_row, r);
        let at_row = |k: &mut Builder, row: Value| {
            let at = wide_mul(k, row, kdim);
            let at = k.add(at, c8);
            k.ptr_add(base, at)
        };
        let srcs = match last_row {
            Some(last) => (0..rows / pass_rows)
                .map(|i| {
                    let ri = k.add_const(row, i * pass_rows);
                    let ri = k.min(ri, last);
                    (at_row(k, ri), 0)
                })
                .collect(),
            None => {
                let src = at_row(k, row);
                (0..rows / pass_rows)
                    .map(|i| (src, (i * pass_rows) as u64 * kdim as u64))
                    .collect()
            }
        };
        let dst = swizzled(k, r, c);
        TileCopy {
            srcs,
            dst,
            pass_rows,
        }
    }

    /// Copy k-tile `tile` (a `u32`) into the stage at element offset `stage` of `smem`.
    pub fn issue(&self, k: &mut Builder, smem: Value, stage: Value, tile: Value) {
        let dst = k.add(stage, self.dst);
        let kofs = k.shl_const(tile, BK.trailing_zeros());
        for (i, &(src, off)) in self.srcs.iter().enumerate() {
            let d = k.add_const(dst, i as u32 * self.pass_rows * BK);
            let d = k.ptr_add(smem, d);
            let s = k.ptr_add(src, kofs);
            let s = if off == 0 {
                s
            } else {
                let o = k.const_u64(off);
                k.ptr_add(s, o)
            };
            k.cp_async(d, s, 16, CacheOp::Cg);
        }
    }
}

/// Per-lane `ldmatrix` row offsets of the warp's fragments, per 16-wide k slice.
pub struct FragAddrs {
    a: [Value; 2],
    b: [Value; 2],
}

impl FragAddrs {
    /// `ldmatrix.x4`: lane `l` gives the address of row `l mod 8` of 8×8 matrix `l / 8`.
    /// For A the four matrices are (rows 0–7, k 0–7), (rows 8–15, k 0–7), (rows 0–7,
    /// k 8–15), (rows 8–15, k 8–15): registers a0..a3 of the m16n8k16 A fragment. For B
    /// (stored `[n][k]`) they are (n 0–7, k 0–7), (n 0–7, k 8–15), (n 8–15, k 0–7),
    /// (n 8–15, k 8–15): registers b0, b1 of two adjacent n8 fragments.
    pub fn emit(k: &mut Builder, p: &GemmParams, ids: &Ids) -> FragAddrs {
        let quad = k.shr_const(ids.lane, 3);
        let r8 = k.and_const(ids.lane, 7);
        let q_lo = k.and_const(quad, 1);
        let q_hi = k.shr_const(quad, 1);
        let row_in = |k: &mut Builder, warp_pos: Value, size: u32, sel: Value| {
            let r = k.mul_const(warp_pos, size);
            let q = k.shl_const(sel, 3);
            let r = k.add(r, q);
            k.add(r, r8)
        };
        let a_row = row_in(k, ids.warp_m, WARP_M, q_lo);
        let b_row = row_in(k, ids.warp_n, p.wn, q_hi);
        let offsets = |k: &mut Builder, row: Value, khalf: Value| {
            [0u32, 1].map(|ks| {
                let chunk = k.add_const(khalf, 2 * ks);
                swizzled(k, row, chunk)
            })
        };
        FragAddrs {
            a: offsets(k, a_row, q_hi),
            b: offsets(k, b_row, q_lo),
        }
    }
}

/// Accumulator fragments of a warp tile: `4 × wn/8`, `mi`-major.
pub fn zero_acc(k: &mut Builder, p: &GemmParams) -> Vec<Value> {
    let frag_c = Builder::frag_type(MmaShape::M16N8K16, FragRole::C, Scalar::F32);
    let zero = k.const_f32(0.0);
    let z = k.pack(frag_c, &[zero; 4]);
    vec![z; (WARP_M / 16 * p.wn / 8) as usize]
}

/// The A and B fragments of one k16 slice of the warp tile.
pub struct Frags {
    a: Vec<Value>,
    b: Vec<Value>,
}

impl Frags {
    /// As loop-carried values.
    pub fn values(&self) -> Vec<Value> {
        self.a.iter().chain(&self.b).copied().collect()
    }

    /// Back from [`Frags::values`].
    pub fn from_values(p: &GemmParams, v: &[Value]) -> Frags {
        let na = (WARP_M / 16) as usize;
        Frags {
            a: v[..na].to_vec(),
            b: v[na..na + (p.wn / 8) as usize].to_vec(),
        }
    }

    /// Slice `ks` (0 or 1) of the k-step held by the A tile at element offset `a_stage`
    /// of `a_s` and the B tile at `b_stage` of `b_s`, as fragments of the operand type:
    /// a bf16 B tile under f16 operands has each register converted (both halves widened
    /// to f32 exactly, then rounded to nearest f16).
    pub fn load(
        k: &mut Builder,
        p: &GemmParams,
        f: &FragAddrs,
        ks: usize,
        (a_s, a_stage): (Value, Value),
        (b_s, b_stage): (Value, Value),
    ) -> Frags {
        let operand = p.operands.scalar();
        let frag_a = Builder::frag_type(MmaShape::M16N8K16, FragRole::A, operand);
        let frag_b = Builder::frag_type(MmaShape::M16N8K16, FragRole::B, operand);
        let a_base = k.add(a_stage, f.a[ks]);
        let a = (0..WARP_M / 16)
            .map(|mi| {
                let at = k.add_const(a_base, mi * 16 * BK);
                let at = k.ptr_add(a_s, at);
                k.ldmatrix(frag_a, 4, false, at)
            })
            .collect();
        let b_base = k.add(b_stage, f.b[ks]);
        let mut b = Vec::with_capacity((p.wn / 8) as usize);
        for nj in 0..p.wn / 16 {
            let at = k.add_const(b_base, nj * 16 * BK);
            let at = k.ptr_add(b_s, at);
            let regs = weight_regs(k, p, at);
            b.push(k.pack(frag_b, &regs[0..2]));
            b.push(k.pack(frag_b, &regs[2..4]));
        }
        Frags { a, b }
    }

    /// The slice's MMAs into the warp tile's accumulators.
    pub fn mma(&self, k: &mut Builder, acc: &[Value]) -> Vec<Value> {
        let mut acc = acc.to_vec();
        for (mi, &fa) in self.a.iter().enumerate() {
            for (ni, &fb) in self.b.iter().enumerate() {
                let i = mi * self.b.len() + ni;
                acc[i] = k.mma(MmaShape::M16N8K16, fa, fb, acc[i]);
            }
        }
        acc
    }
}

/// `ldmatrix.x4` of weight rows at `at` (shared): four registers of the operand type's
/// pairs, each converted from bf16 to f16 where the kernel converts B (both halves
/// widened to f32 exactly, then rounded to nearest f16).
pub fn weight_regs(k: &mut Builder, p: &GemmParams, at: Value) -> Vec<Value> {
    let pair = Type::Scalar(p.operands.pair());
    let v = k.ldmatrix(Type::Vec(Scalar::U32, 4), 4, false, at);
    (0..4)
        .map(|i| {
            let r = k.extract(v, i);
            let r = if p.converts_b() {
                let [lo, hi] = emit_unpack_bf16x2(k, r);
                emit_pack_f16x2(k, lo, hi)
            } else {
                r
            };
            k.bitcast(pair, r)
        })
        .collect()
}

/// Write the warp tile to `C` (row-major `[m, n]`), rows below `m` only, as `p`'s
/// epilogue says: f32 stored or added to what `C` holds (one rounding), or rounded to the
/// operand type, bf16 or f16 (`cvt.rn`, to nearest even), and stored as one 4-byte pair.
///
/// Accumulator layout: `c0, c1` at (row `g`, columns `2t, 2t + 1`), `c2, c3` at row
/// `g + 8`, with `g = lane / 4`, `t = lane mod 4`.
pub fn store_c(k: &mut Builder, p: &GemmParams, ids: &Ids, c: Value, m: Value, acc: &[Value]) {
    let g = k.shr_const(ids.lane, 2);
    let t = k.and_const(ids.lane, 3);
    let out_row = {
        let r = k.mul_const(ids.warp_m, WARP_M);
        let r = k.add(ids.row0, r);
        k.add(r, g)
    };
    let out_col = {
        let cc = k.mul_const(ids.warp_n, p.wn);
        let cc = k.add(ids.col0, cc);
        let t2 = k.shl_const(t, 1);
        let cc = k.add(cc, t2);
        k.cvt(Scalar::U64, cc)
    };
    let vec2 = Type::Vec(Scalar::F32, 2);
    let nfrags = p.wn / 8;
    for mi in 0..WARP_M / 16 {
        for half in 0..2u32 {
            let row = k.add_const(out_row, mi * 16 + half * 8);
            let inside = k.lt(row, m);
            k.if_then(inside, |k| {
                let at = wide_mul(k, row, p.n);
                let at = k.add(at, out_col);
                let row_ptr = k.ptr_add(c, at);
                for ni in 0..nfrags {
                    let f = acc[(mi * nfrags + ni) as usize];
                    let lo = k.extract(f, 2 * half);
                    let hi = k.extract(f, 2 * half + 1);
                    let off = k.const_u32(ni * 8);
                    let at = k.ptr_add(row_ptr, off);
                    match p.epilogue {
                        Epilogue::Store => {
                            let v = k.pack(vec2, &[lo, hi]);
                            k.store(at, v);
                        }
                        Epilogue::Accumulate => {
                            let old = k.load(vec2, at);
                            let o0 = k.extract(old, 0);
                            let o1 = k.extract(old, 1);
                            let sum = [k.add(lo, o0), k.add(hi, o1)];
                            let v = k.pack(vec2, &sum);
                            k.store(at, v);
                        }
                        Epilogue::StoreHalf => {
                            let pair = p.operands.emit_pack(k, lo, hi);
                            let at = k.ptr_cast(Scalar::U32, at);
                            k.store(at, pair);
                        }
                    }
                }
            });
        }
    }
}
