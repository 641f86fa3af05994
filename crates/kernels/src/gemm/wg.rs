//! The same products on Hopper's warpgroup MMA (`wgmma.mma_async`; [`super::Core::Wgmma`]
//! and [`super::Core::WgmmaProducer`]).
//!
//! **Roles.** A warpgroup (four warps, 128 threads) computes `64 × bm` of `Cᵀ`: 64 weight
//! rows (columns of `C`) against the block's `bm` tokens, as `wgmma.m64n{bm}k16`. The
//! weights are wgmma's A, taken from registers: each warp loads its 16 rows with
//! `ldmatrix`, exactly as the `mma.sync` kernel loads its A fragments, and bf16 weights
//! under f16 operands are converted there (see [`super`]). The activations are wgmma's
//! B, read by the tensor cores from shared memory through a matrix descriptor: the
//! tiles `tiles.rs` writes — 64-byte rows, 16-byte chunk `c` of row `r` at chunk
//! `c ^ ((r >> 1) & 3)` — are the 64-byte-swizzled K-major layout (eight rows a 512-byte
//! atom), so they need no other copy. A block of `bn / 64` warpgroups covers `bn` weight
//! rows.
//!
//! **Pipeline.** A step covers 64 of `k`: two `[rows][32]` sub-tiles of each operand
//! per stage. Commit group `g` of `cp.async` carries step `g`'s tiles into stage
//! `g mod stages`. Step `t` loads its weight fragments, issues its four k16 `wgmma` as
//! one group, and waits until only that group is pending (`wgmma.wait_group 1`): step
//! `t − 1`'s products are done, step `t`'s run on while the warps wait for the copies of
//! step `t + 1` (`cp.async.wait_group stages − 3`), make them visible to the tensor
//! cores (`fence.proxy.async`) and meet at the barrier; then step `t + stages − 1` is
//! copied into the stage step `t − 1` used, which no product reads any more. So
//! `stages − 2` steps are in flight while one is multiplied. A step's A fragments are
//! read by the tensor cores until the next step's wait, so consecutive steps must hold
//! them in different registers: the loop body holds two steps (an odd last one follows
//! the loop).
//!
//! **Quantized weights** (all threads copying): the stored bytes of each step are staged
//! one step ahead, as in the `mma.sync` kernel, and dequantized into one of two buffers
//! of the operand type laid out like the tiles; the tensor cores then read both
//! operands from shared memory, the weights through descriptors too (see
//! `all_threads`).
//!
//! **With a copier warp** ([`super::Core::WgmmaProducer`]): one warp after the
//! warpgroups only copies, step after step, into stage `t mod stages`, and its lanes
//! arrive on the stage's "full" mbarrier as their copies land
//! (`cp.async.mbarrier.arrive.noinc`); before refilling a stage it waits on the stage's
//! "empty" mbarrier, on which every multiplying thread arrives once the products of its
//! previous use are done (after the next step's `wgmma.wait_group 1`). The warpgroups
//! wait on "full" by phase parity, make the copies visible to the tensor cores and
//! multiply: no block-wide barrier is left in the k-loop.
//!
//! **Epilogue.** Accumulator register `4j + r` of lane `l` in warp `q` of warpgroup `w`
//! holds weight row `64w + 16q + l/4 + 8·(r/2)` and token `8j + 2·(l mod 4) + (r mod 2)`
//! (the `m16n8k16` accumulator of each warp's 16 rows, repeated over the `n8` blocks);
//! each token's values are stored for tokens below `m`.

use quench_ir::{Builder, FragRole, Function, MmaShape, Scalar, Swizzle, Type, Value};

use super::decode::Decoder;
use super::kernel::next_slot;
use super::raw::RawCopy;
use super::tiles::{swizzled, weight_regs, Ids, TileCopy};
use super::{Core, Epilogue, GemmParams, BK};
use crate::error::KernelError;
use crate::lanes::{gptr, wide_mul};

/// Bytes between eight-row groups of a tile (64-byte rows).
const ATOM_BYTES: u32 = 8 * BK * 2;
/// Sub-tiles of `BK` a pipeline step covers: k advances 64 a step.
pub const SUB: u32 = 2;

/// What both pipelines share: the operands, the shared-memory stages and who is who.
struct Setup {
    shape: MmaShape,
    c: Value,
    m: Value,
    ids: Ids,
    /// A's stages, then B's (element offsets `a_stage`, `b_stage` apart).
    a_s: Value,
    b_s: Value,
    a_stage: u32,
    b_stage: u32,
    /// Steps of `SUB · BK` along k.
    steps: u32,
}

impl Setup {
    fn emit(k: &mut Builder, p: &GemmParams) -> Result<(Setup, Value, Value), KernelError> {
        let shape = MmaShape::warpgroup(p.bm).ok_or_else(|| {
            KernelError::unsupported(p.name(), format!("no wgmma with n = {}", p.bm))
        })?;
        let operand = p.operands.scalar();
        let a = k.param("a", gptr(operand));
        let b = k.param("b", gptr(p.format.stored_elem()));
        let c = k.param("c", gptr(p.c_elem()));
        let m = k.param("m", Type::U32);
        // A stage holds `SUB` sub-tiles of each operand, each `[rows][BK]` as `tiles.rs`
        // lays it out. The stages live in dynamic shared memory (`GemmParams::launch`
        // sizes it): A's, then B's, then any mbarriers. 1024-byte alignment: the swizzle
        // atoms must sit at 512-byte addresses.
        let (a_stage, b_stage) = (SUB * p.bm * BK, SUB * p.bn * BK);
        let a_s = k.shared_array("tiles", operand, 0, 1024);
        let b_at = k.const_u32(p.stages * a_stage);
        let b_s = k.ptr_add(a_s, b_at);
        // Quantized weights: two buffers of dequantized tiles of the operand type, then
        // `stages` of their stored bytes (see `dequantized`).
        let b_elem = if p.format.is_quantized() {
            operand
        } else {
            p.format.stored_elem()
        };
        let b_s = k.ptr_cast(b_elem, b_s);
        let ids = Ids::emit(k, p);
        let setup = Setup {
            shape,
            c,
            m,
            ids,
            a_s,
            b_s,
            a_stage,
            b_stage,
            steps: p.k / (SUB * BK),
        };
        Ok((setup, a, b))
    }

    /// The copies of step `j` (a `u32`) into stage `slot`, without a commit: the
    /// activations, and the weights' tiles where they are copied as stored.
    fn issue(
        &self,
        k: &mut Builder,
        (a, b): (&TileCopy, Option<&TileCopy>),
        j: Value,
        slot: Value,
    ) {
        let first = k.mul_const(j, SUB);
        for sub in 0..SUB {
            let tile = k.add_const(first, sub);
            let a_off = k.mul_const(slot, self.a_stage);
            let a_off = k.add_const(a_off, sub * self.a_stage / SUB);
            a.issue(k, self.a_s, a_off, tile);
            if let Some(b) = b {
                let b_off = k.mul_const(slot, self.b_stage);
                let b_off = k.add_const(b_off, sub * self.b_stage / SUB);
                b.issue(k, self.b_s, b_off, tile);
            }
        }
    }

    /// The step's products on the activations in stage `slot`, as one committed group,
    /// four k16 `wgmma` into `acc`. The weights: from registers, the warp's fragments of
    /// the tiles in the same stage (values of this emission's own, see the module
    /// documentation); or read by the tensor cores from the dequantized buffer at element
    /// offset `buf`, the warpgroup's 64 rows through a descriptor.
    fn multiply(
        &self,
        k: &mut Builder,
        (p, weights): (&GemmParams, Weights),
        slot: Value,
        mut acc: Value,
    ) -> Value {
        let a_off = k.mul_const(slot, self.a_stage);
        let (a_sub, b_sub) = (self.a_stage / SUB, self.b_stage / SUB);
        let slices = (0..SUB).flat_map(|sub| [(sub, 0), (sub, 1)]);
        let frags: Vec<Value> = match weights {
            Weights::Registers(rows) => {
                let b_off = k.mul_const(slot, self.b_stage);
                slices
                    .map(|(sub, ks)| {
                        let off = k.add_const(b_off, sub * b_sub);
                        rows.load(k, p, self.shape, (self.b_s, off), ks)
                    })
                    .collect()
            }
            Weights::Dequantized(buf) => {
                let group = k.shr_const(self.ids.warp, 2);
                let rows = k.mul_const(group, 64 * BK);
                let base = k.add(buf, rows);
                slices
                    .map(|(sub, ks)| {
                        let at = k.add_const(base, sub * b_sub + ks * 16);
                        let at = k.ptr_add(self.b_s, at);
                        k.wgmma_desc(at, 16, ATOM_BYTES, Swizzle::B64)
                    })
                    .collect()
            }
        };
        k.wgmma_fence();
        for (i, &fa) in frags.iter().enumerate() {
            let (sub, ks) = (i as u32 / 2, i as u32 % 2);
            let at = k.add_const(a_off, sub * a_sub + ks * 16);
            let at = k.ptr_add(self.a_s, at);
            let desc = k.wgmma_desc(at, 16, ATOM_BYTES, Swizzle::B64);
            acc = k.wgmma(self.shape, p.operands.scalar(), fa, desc, acc);
        }
        k.wgmma_commit();
        acc
    }

    fn zero_acc(&self, k: &mut Builder, p: &GemmParams) -> Value {
        let frag_c = Builder::frag_type(self.shape, FragRole::C, Scalar::F32);
        let zf = k.const_f32(0.0);
        k.pack(frag_c, &vec![zf; (p.bm / 2) as usize])
    }

    /// Steps `0..steps`, two a loop iteration (each emission with fragments of its
    /// own), an odd last one after the loop. `step(k, t, carried) -> carried`.
    fn steps(
        &self,
        k: &mut Builder,
        init: &[Value],
        step: &impl Fn(&mut Builder, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let (zero, one) = (k.const_u32(0), k.const_u32(1));
        let pairs = k.const_u32(self.steps / 2);
        let out = k.for_range(zero, pairs, one, init, |k, i, carried| {
            let t = k.shl_const(i, 1);
            let carried = step(k, t, carried);
            let t1 = k.add_const(t, 1);
            step(k, t1, &carried)
        });
        if self.steps % 2 == 1 {
            let t = k.const_u32(self.steps - 1);
            step(k, t, &out)
        } else {
            out
        }
    }
}

/// Where a step's weights come from (see [`Setup::multiply`]).
#[derive(Clone, Copy)]
enum Weights<'r> {
    Registers(&'r FragRows),
    /// Element offset of the dequantized buffer.
    Dequantized(Value),
}

/// `(a, b, c, m)`: see the module documentation of [`super`].
pub fn build(p: &GemmParams) -> Result<Function, KernelError> {
    p.check()?;
    let mut kb = Builder::new(p.name(), p.threads());
    let k = &mut kb;
    let (setup, a, b) = Setup::emit(k, p)?;
    match p.core {
        Core::WgmmaProducer => producer_consumer(k, p, &setup, (a, b)),
        _ => all_threads(k, p, &setup, (a, b)),
    }
    Ok(kb.finish()?)
}

/// How the weights reach the tensor cores when every thread copies.
enum Source {
    /// bf16 or f16 tiles copied like the activations, loaded into registers.
    Tiles(TileCopy, FragRows),
    /// Stored bytes staged a step ahead in `raw_s` (`raw_sub` words a sub-tile),
    /// dequantized into two buffers read through descriptors.
    Dequant {
        raw: RawCopy,
        dec: Decoder,
        raw_s: Value,
        raw_sub: u32,
    },
}

/// Every thread copies and multiplies; a barrier a step. Commit group `j` carries step
/// `j`'s activations (and bf16 or f16 weight tiles) into stage `j mod stages`; for
/// quantized weights, the stored bytes of step `j + 1` into staging slot
/// `(j + 1) mod stages` instead, and step `t` dequantizes step `t + 1`'s bytes (landed
/// with group `t`) into buffer `(t + 1) mod 2` once step `t − 1`'s products, which read
/// that buffer, are retired.
fn all_threads(k: &mut Builder, p: &GemmParams, s: &Setup, (a, b): (Value, Value)) {
    let stages = p.stages;
    let ids = &s.ids;
    let one = k.const_u32(1);
    let last_row = k.sub(s.m, one);
    let copier = (ids.tid, p.threads());
    let a_copy = TileCopy::emit(k, p, copier, a, ids.row0, Some(last_row), p.bm);
    let source = if p.format.is_quantized() {
        // The stored bytes' stages follow the two dequantized buffers (u32 words).
        let raw_at = k.const_u32(2 * s.b_stage);
        let raw_s = k.ptr_add(s.b_s, raw_at);
        Source::Dequant {
            raw: RawCopy::emit(k, p, ids, b),
            dec: Decoder::emit(k, p, ids),
            raw_s: k.ptr_cast(Scalar::U32, raw_s),
            raw_sub: p.bn * p.format.staged_stride(),
        }
    } else {
        let b_copy = TileCopy::emit(k, p, copier, b, ids.col0, None, p.bn);
        Source::Tiles(b_copy, FragRows::emit(k, ids))
    };
    let last_step = k.const_u32(s.steps - 1);
    // The stored bytes of step `j` (clamped) into staging slot `slot`, no commit.
    let stage_raw = |k: &mut Builder, j: Value, slot: Value| {
        if let Source::Dequant {
            raw,
            raw_s,
            raw_sub,
            ..
        } = &source
        {
            let j = k.min(j, last_step);
            let first = k.mul_const(j, SUB);
            for sub in 0..SUB {
                let tile = k.add_const(first, sub);
                let off = k.mul_const(slot, SUB * raw_sub);
                let off = k.add_const(off, sub * raw_sub);
                raw.issue(k, *raw_s, off, tile);
            }
        }
    };
    // Group `j`, clamped to the last step: the copies past it fill stages nobody reads.
    let issue = |k: &mut Builder, j: Value, slot: Value| {
        let jc = k.min(j, last_step);
        match &source {
            Source::Tiles(b_copy, _) => s.issue(k, (&a_copy, Some(b_copy)), jc, slot),
            Source::Dequant { .. } => {
                s.issue(k, (&a_copy, None), jc, slot);
                let j1 = k.add_const(j, 1);
                let slot1 = next_slot(k, slot, stages);
                stage_raw(k, j1, slot1);
            }
        }
        k.cp_async_commit();
    };
    // Dequantize step `j` (clamped) from staging slot `slot` into buffer `j mod 2`.
    let decode = |k: &mut Builder, j: Value, slot: Value| {
        if let Source::Dequant {
            dec,
            raw_s,
            raw_sub,
            ..
        } = &source
        {
            let jc = k.min(j, last_step);
            let first = k.mul_const(jc, SUB);
            let buf = k.and_const(j, 1);
            let buf = k.mul_const(buf, s.b_stage);
            for sub in 0..SUB {
                let tile = k.add_const(first, sub);
                let from = k.mul_const(slot, SUB * raw_sub);
                let from = k.add_const(from, sub * raw_sub);
                let to = k.add_const(buf, sub * s.b_stage / SUB);
                dec.decode(k, *raw_s, from, s.b_s, to, tile);
            }
        }
    };
    let zero = k.const_u32(0);
    // Prologue: for quantized weights, step 0's stored bytes first (their own group);
    // then groups 0 .. stages − 2. Step 0's tiles (and bytes) are then in.
    if let Source::Dequant { .. } = source {
        stage_raw(k, zero, zero);
        k.cp_async_commit();
    }
    for g in 0..stages - 1 {
        let g = k.const_u32(g);
        issue(k, g, g);
    }
    k.cp_async_wait(stages - 2);
    k.fence_proxy_async();
    k.barrier();
    if let Source::Dequant { .. } = source {
        decode(k, zero, zero);
        k.fence_proxy_async();
        k.barrier();
    }
    let step = |k: &mut Builder, t: Value, carried: &[Value]| {
        let slot = carried[0];
        let weights = match &source {
            Source::Tiles(_, rows) => Weights::Registers(rows),
            Source::Dequant { .. } => {
                let buf = k.and_const(t, 1);
                Weights::Dequantized(k.mul_const(buf, s.b_stage))
            }
        };
        let acc = s.multiply(k, (p, weights), slot, carried[1]);
        // Step t − 1's products are done: its stage (and buffer) are free.
        k.wgmma_wait(1);
        let slot1 = next_slot(k, slot, stages);
        if let Source::Dequant { .. } = source {
            let t1 = k.add_const(t, 1);
            decode(k, t1, slot1);
        }
        k.cp_async_wait(stages - 3);
        k.fence_proxy_async();
        k.barrier();
        let ahead = k.add_const(t, stages - 1);
        let free = prev_slot(k, slot, stages);
        issue(k, ahead, free);
        vec![slot1, acc]
    };
    let acc0 = s.zero_acc(k, p);
    let out = s.steps(k, &[zero, acc0], &step);
    k.wgmma_wait(0);
    // Nothing is read from the copies still in flight (repeats of the last step).
    k.cp_async_wait(0);
    store(k, p, ids, s.c, s.m, out[1]);
}

/// The last warp copies, the warpgroups multiply; stage `s` has a "full" mbarrier (the
/// copier's 32 lanes arrive as their copies land) and an "empty" one (every multiplying
/// thread arrives once its step's products are done). The `n`-th use of a stage waits
/// for the parity `n mod 2` of its full barrier; the copier's `n`-th refill waits for
/// the parity `(n − 1) mod 2` of its empty one.
fn producer_consumer(k: &mut Builder, p: &GemmParams, s: &Setup, (a, b): (Value, Value)) {
    let stages = p.stages;
    let consumers = p.threads() - 32;
    let ids = &s.ids;
    let bar_at = k.const_u32(stages * s.b_stage);
    let bars = k.ptr_add(s.b_s, bar_at);
    let bars = k.ptr_cast(Scalar::U64, bars);
    let full = |k: &mut Builder, slot: Value| k.ptr_add(bars, slot);
    let empty = |k: &mut Builder, slot: Value| {
        let i = k.add_const(slot, stages);
        k.ptr_add(bars, i)
    };
    let zero = k.const_u32(0);
    let first = k.eq(ids.tid, zero);
    k.if_then(first, |k| {
        for st in 0..stages {
            let st = k.const_u32(st);
            let (f, e) = (full(k, st), empty(k, st));
            let n = k.const_u32(32);
            k.mbarrier_init(f, n);
            let n = k.const_u32(consumers);
            k.mbarrier_init(e, n);
        }
    });
    k.barrier();
    let copier = k.const_u32(consumers / 32);
    let is_copier = k.eq(ids.warp, copier);
    k.if_else(
        is_copier,
        &[],
        |k| {
            let one = k.const_u32(1);
            let last_row = k.sub(s.m, one);
            let copies = (
                TileCopy::emit(k, p, (ids.lane, 32), a, ids.row0, Some(last_row), p.bm),
                TileCopy::emit(k, p, (ids.lane, 32), b, ids.col0, None, p.bn),
            );
            let (lo, hi) = (k.const_u32(0), k.const_u32(s.steps));
            k.for_range(lo, hi, one, &[zero, zero], |k, t, carried| {
                let (slot, round) = (carried[0], carried[1]);
                let n = k.const_u32(stages);
                let refill = k.ge(t, n);
                k.if_then(refill, |k| {
                    let e = empty(k, slot);
                    let one = k.const_u32(1);
                    let parity = k.xor(round, one);
                    k.mbarrier_wait(e, parity);
                });
                s.issue(k, (&copies.0, Some(&copies.1)), t, slot);
                k.cp_async_commit();
                let f = full(k, slot);
                k.cp_async_mbarrier_arrive(f);
                next_slot_round(k, slot, round, stages)
            });
            vec![]
        },
        |k| {
            let rows = FragRows::emit(k, ids);
            let step = |k: &mut Builder, t: Value, carried: &[Value]| {
                let (slot, round) = (carried[0], carried[1]);
                let f = full(k, slot);
                k.mbarrier_wait(f, round);
                k.fence_proxy_async();
                let acc = s.multiply(k, (p, Weights::Registers(&rows)), slot, carried[2]);
                // Step t − 1's products are done: its stage may be refilled.
                k.wgmma_wait(1);
                let zero = k.const_u32(0);
                let after_first = k.ne(t, zero);
                k.if_then(after_first, |k| {
                    let prev = prev_slot(k, slot, stages);
                    let e = empty(k, prev);
                    k.mbarrier_arrive(e);
                });
                let mut next = next_slot_round(k, slot, round, stages);
                next.push(acc);
                next
            };
            let acc0 = s.zero_acc(k, p);
            let out = s.steps(k, &[zero, zero, acc0], &step);
            k.wgmma_wait(0);
            store(k, p, ids, s.c, s.m, out[2]);
            vec![]
        },
    );
}

/// Each lane's `ldmatrix.x4` row within the weight tile: lane `l` gives row `l mod 8` of
/// 8×8 matrix `l / 8`, the matrices being (rows 0–7, k 0–7), (rows 8–15, k 0–7),
/// (rows 0–7, k 8–15), (rows 8–15, k 8–15) of the warp's 16 rows — the m16n8k16 A
/// fragment's registers a0..a3, which is also each warp's part of wgmma's A.
struct FragRows {
    row: Value,
    khalf: Value,
}

impl FragRows {
    fn emit(k: &mut Builder, ids: &Ids) -> FragRows {
        let quad = k.shr_const(ids.lane, 3);
        let r8 = k.and_const(ids.lane, 7);
        let q_lo = k.and_const(quad, 1);
        let khalf = k.shr_const(quad, 1);
        let row = k.mul_const(ids.warp, 16);
        let q8 = k.shl_const(q_lo, 3);
        let row = k.add(row, q8);
        let row = k.add(row, r8);
        FragRows { row, khalf }
    }

    /// The warp's A fragment of k16 slice `ks` of the weight tile at element offset
    /// `stage` of `b_s`, converted to the operand type where it differs from storage.
    fn load(
        &self,
        k: &mut Builder,
        p: &GemmParams,
        shape: MmaShape,
        (b_s, stage): (Value, Value),
        ks: u32,
    ) -> Value {
        let chunk = k.add_const(self.khalf, 2 * ks);
        let at = swizzled(k, self.row, chunk);
        let at = k.add(stage, at);
        let at = k.ptr_add(b_s, at);
        let regs = weight_regs(k, p, at);
        let frag_a = Builder::frag_type(shape, FragRole::A, p.operands.scalar());
        k.pack(frag_a, &regs)
    }
}

/// Write the warpgroup's `64 × bm` block of `Cᵀ` into `C` (row-major `[m, n]`), tokens
/// below `m` only, as the epilogue says (see `tiles::store_c` for the three kinds).
fn store(k: &mut Builder, p: &GemmParams, ids: &Ids, c: Value, m: Value, acc: Value) {
    let g = k.shr_const(ids.lane, 2);
    let t = k.and_const(ids.lane, 3);
    let col = {
        let w = k.mul_const(ids.warp, 16);
        let cc = k.add(ids.col0, w);
        let cc = k.add(cc, g);
        k.cvt(Scalar::U64, cc)
    };
    let tok0 = {
        let t2 = k.shl_const(t, 1);
        k.add(ids.row0, t2)
    };
    for j in 0..p.bm / 8 {
        for parity in 0..2u32 {
            let tok = k.add_const(tok0, 8 * j + parity);
            let inside = k.lt(tok, m);
            k.if_then(inside, |k| {
                let at = wide_mul(k, tok, p.n);
                let at = k.add(at, col);
                let row_ptr = k.ptr_add(c, at);
                for half in 0..2u32 {
                    let v = k.extract(acc, 4 * j + 2 * half + parity);
                    let off = k.const_u32(8 * half);
                    let at = k.ptr_add(row_ptr, off);
                    match p.epilogue {
                        Epilogue::Store => k.store(at, v),
                        Epilogue::Accumulate => {
                            let old = k.load(Type::Scalar(Scalar::F32), at);
                            let sum = k.add(v, old);
                            k.store(at, sum);
                        }
                        Epilogue::StoreHalf => {
                            let h = k.cvt(p.operands.scalar(), v);
                            k.store(at, h);
                        }
                    }
                }
            });
        }
    }
}

/// The next stage and its round's parity (flipped when the stages wrap around).
fn next_slot_round(k: &mut Builder, slot: Value, round: Value, stages: u32) -> Vec<Value> {
    let wrap = k.const_u32(stages - 1);
    let at_end = k.eq(slot, wrap);
    let one = k.const_u32(1);
    let flipped = k.xor(round, one);
    let round = k.select(at_end, flipped, round);
    vec![next_slot(k, slot, stages), round]
}

/// `(slot − 1) mod stages`.
fn prev_slot(k: &mut Builder, slot: Value, stages: u32) -> Value {
    let zero = k.const_u32(0);
    let at_start = k.eq(slot, zero);
    let last = k.const_u32(stages - 1);
    let one = k.const_u32(1);
    let before = k.sub(slot, one);
    k.select(at_start, last, before)
}
