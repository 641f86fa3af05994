//! The kernel: shared memory, the prologue that fills the pipeline, the k-loop, and the
//! epilogue.
//!
//! **The k-loop.** Commit group `j` carries A's tile `j` into stage `j mod stages`, and
//! B's tile `j` (bf16 or f16) or the stored bytes of tile `j + 1` (quantized, into staging slot
//! `(j + 1) mod stages`). Iteration `t` enters holding the fragments of tile `t`'s first
//! k16 slice (loaded by the previous iteration) and:
//! 1. loads the second slice's fragments of tile `t`;
//! 2. multiplies the first slice — and, quantized, dequantizes tile `t + 1` (its bytes
//!    arrived with group `t`) into the other B buffer;
//! 3. waits for group `t + 1` (`cp.async.wait_group stages − 2`) and meets the block at a
//!    barrier: now tile `t + 1` and its B buffer are visible to all, and no warp reads
//!    tile `t`'s stage (or tile `t + 1`'s staged bytes) any more;
//! 4. issues group `t + stages` into tile `t`'s stage (its stored bytes, of tile
//!    `t + stages + 1`, into tile `t + 1`'s staging slot);
//! 5. loads tile `t + 1`'s first-slice fragments, carried to the next iteration;
//! 6. multiplies the second slice of tile `t`.
//!
//! So `stages − 1` tiles are in flight while one is multiplied, one barrier per step, and
//! the fragment loads on either side of the barrier overlap MMAs of the same warp (ptxas
//! interleaves the independent streams). Copies for tiles past the last repeat the last
//! one (into stages nobody reads again), which keeps the loop free of branches.

use quench_ir::{Builder, Function, Scalar, Type, Value};

use super::decode::Decoder;
use super::raw::RawCopy;
use super::tiles::{store_c, zero_acc, FragAddrs, Frags, Ids, TileCopy};
use super::{GemmParams, BK};
use crate::error::KernelError;
use crate::lanes::gptr;

/// Where the B tile of a k-step comes from.
enum BSource {
    /// bf16 or f16 tiles copied like A's, one per stage.
    Tiles(TileCopy),
    /// Stored bytes, staged in `raw_s`, dequantized into one of two tile buffers of the
    /// operand type.
    Dequant {
        raw: RawCopy,
        dec: Decoder,
        raw_s: Value,
    },
}

/// Shared-memory arrays and sizes (in elements of each array).
struct Smem {
    a_s: Value,
    b_s: Value,
    a_stage: u32,
    b_stage: u32,
    raw_stage: u32,
}

/// `(a, b, c, m)`: see the module documentation of [`super`].
pub fn build(p: &GemmParams) -> Result<Function, KernelError> {
    p.check()?;
    let stages = p.stages;
    let threads = p.threads();
    let quantized = p.format.is_quantized();
    let mut kb = Builder::new(p.name(), threads);
    let k = &mut kb;
    let operand = p.operands.scalar();
    let a = k.param("a", gptr(operand));
    let b = k.param("b", gptr(p.format.stored_elem()));
    let c = k.param("c", gptr(p.c_elem()));
    let m = k.param("m", Type::U32);

    let (a_stage, b_stage) = (p.bm * BK, p.bn * BK);
    // Stored bf16 or f16 tiles as they are copied; dequantized ones of the operand type.
    let (b_elem, b_buffers) = if quantized {
        (operand, 2)
    } else {
        (p.format.stored_elem(), stages)
    };
    let sm = Smem {
        a_s: k.shared_array("a_tile", operand, stages * a_stage, 128),
        b_s: k.shared_array("b_tile", b_elem, b_buffers * b_stage, 128),
        a_stage,
        b_stage,
        raw_stage: p.bn * p.format.staged_stride(),
    };
    let ids = Ids::emit(k, p);
    let one = k.const_u32(1);
    let last_row = k.sub(m, one);
    let a_copy = TileCopy::emit(
        k,
        p,
        (ids.tid, p.threads()),
        a,
        ids.row0,
        Some(last_row),
        p.bm,
    );
    let source = if quantized {
        let raw_s = k.shared_array("b_raw", Scalar::U32, stages * sm.raw_stage, 128);
        BSource::Dequant {
            raw: RawCopy::emit(k, p, &ids, b),
            dec: Decoder::emit(k, p, &ids),
            raw_s,
        }
    } else {
        BSource::Tiles(TileCopy::emit(
            k,
            p,
            (ids.tid, p.threads()),
            b,
            ids.col0,
            None,
            p.bn,
        ))
    };
    let fa = FragAddrs::emit(k, p, &ids);

    let steps = p.k / BK;
    let last_tile = k.const_u32(steps - 1);
    // Issue group `j` (a `u32`, clamped to the last tile) into stage `slot`; for
    // quantized B the bytes of tile `j + 1` go to slot `slot + 1 (mod stages)`.
    let issue = |k: &mut Builder, j: Value, slot: Value| {
        let tile = k.min(j, last_tile);
        let a_off = k.mul_const(slot, sm.a_stage);
        a_copy.issue(k, sm.a_s, a_off, tile);
        match &source {
            BSource::Tiles(b_copy) => {
                let b_off = k.mul_const(slot, sm.b_stage);
                b_copy.issue(k, sm.b_s, b_off, tile);
            }
            BSource::Dequant { raw, raw_s, .. } => {
                let j1 = k.add_const(j, 1);
                let tile = k.min(j1, last_tile);
                let s1 = next_slot(k, slot, stages);
                let off = k.mul_const(s1, sm.raw_stage);
                raw.issue(k, *raw_s, off, tile);
            }
        }
        k.cp_async_commit();
    };
    // Dequantize tile `j` (a `u32`, clamped) from staging slot `slot` into B buffer `j & 1`.
    let decode = |k: &mut Builder, j: Value, slot: Value| {
        if let BSource::Dequant { dec, raw_s, .. } = &source {
            let tile = k.min(j, last_tile);
            let off = k.mul_const(slot, sm.raw_stage);
            let buf = k.and_const(j, 1);
            let buf = k.mul_const(buf, sm.b_stage);
            dec.decode(k, *raw_s, off, sm.b_s, buf, tile);
        }
    };
    // Fragments of slice `ks` of tile `j` (a `u32`) held in stage `slot`.
    let frags = |k: &mut Builder, ks: usize, j: Value, slot: Value| {
        let a_off = k.mul_const(slot, sm.a_stage);
        let b_off = match &source {
            BSource::Tiles(_) => k.mul_const(slot, sm.b_stage),
            BSource::Dequant { .. } => {
                let buf = k.and_const(j, 1);
                k.mul_const(buf, sm.b_stage)
            }
        };
        Frags::load(k, p, &fa, ks, (sm.a_s, a_off), (sm.b_s, b_off))
    };

    // Prologue: groups 0 .. stages − 1; for quantized B, first tile 0's bytes alone, which
    // are dequantized (and their slot freed) before the last group is issued.
    let zero = k.const_u32(0);
    if let BSource::Dequant { raw, raw_s, .. } = &source {
        raw.issue(k, *raw_s, zero, zero);
        k.cp_async_commit();
        for g in 0..stages - 1 {
            let g = k.const_u32(g);
            issue(k, g, g);
        }
        k.cp_async_wait(stages - 2);
        k.barrier();
        decode(k, zero, zero);
        k.barrier();
        let g = k.const_u32(stages - 1);
        issue(k, g, g);
    } else {
        for g in 0..stages {
            let g = k.const_u32(g);
            issue(k, g, g);
        }
        k.cp_async_wait(stages - 1);
        k.barrier();
    }
    let first = frags(k, 0, zero, zero);

    // The loop carries `t mod stages`, tile `t`'s first-slice fragments, and the
    // accumulators.
    let hi = k.const_u32(steps);
    let mut init = vec![zero];
    init.extend(first.values());
    let n_frags = init.len() - 1;
    init.extend(zero_acc(k, p));
    let out = k.for_range(zero, hi, one, &init, |k, t, carried| {
        let slot = carried[0];
        let cur0 = Frags::from_values(p, &carried[1..1 + n_frags]);
        let acc = &carried[1 + n_frags..];
        let cur1 = frags(k, 1, t, slot);
        let acc = cur0.mma(k, acc);
        let t1 = k.add(t, one);
        let slot1 = next_slot(k, slot, stages);
        decode(k, t1, slot1);
        k.cp_async_wait(stages - 2);
        k.barrier();
        let ahead = k.add_const(t, stages);
        issue(k, ahead, slot);
        let next0 = frags(k, 0, t1, slot1);
        let acc = cur1.mma(k, &acc);
        let mut out = vec![slot1];
        out.extend(next0.values());
        out.extend(acc);
        out
    });
    // Nothing is read from the copies still in flight (repeats of the last tile).
    k.cp_async_wait(0);
    store_c(k, p, &ids, c, m, &out[1 + n_frags..]);
    Ok(kb.finish()?)
}

/// `(slot + 1) mod stages`.
pub(super) fn next_slot(k: &mut Builder, slot: Value, stages: u32) -> Value {
    let wrap = k.const_u32(stages - 1);
    let at_end = k.eq(slot, wrap);
    let zero = k.const_u32(0);
    let after = k.add_const(slot, 1);
    k.select(at_end, zero, after)
}
