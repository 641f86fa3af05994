//! The kernel: shared memory, the prologue that fills the pipeline, the k-loop, and the
//! epilogue.

use quench_ir::{Builder, Function, Scalar, Type, Value};

use super::decode::Decoder;
use super::raw::RawCopy;
use super::tiles::{mma_step, store_c, zero_acc, FragAddrs, Ids, TileCopy};
use super::{Epilogue, GemmParams, BK};
use crate::error::KernelError;
use crate::lanes::gptr;

/// Where the B tile of a k-step comes from.
enum BSource {
    /// bf16 tiles copied like A's, one per stage.
    Tiles(TileCopy),
    /// Stored bytes (staged in `raw_s`) copied one step ahead of A's tile, dequantized
    /// during the step before the one that multiplies them, into one of two bf16 tile
    /// buffers.
    Dequant { raw: RawCopy, dec: Decoder, raw_s: Value },
}

/// `(a, b, c, m)`: see the module documentation of [`super`].
pub fn build(p: &GemmParams) -> Result<Function, KernelError> {
    p.check()?;
    let stages = p.stages;
    let threads = p.threads();
    let mut kb = Builder::new(p.name(), threads);
    let k = &mut kb;
    let a = k.param("a", gptr(Scalar::BF16));
    let b_elem = if p.format.is_quantized() { Scalar::U8 } else { Scalar::BF16 };
    let b = k.param("b", gptr(b_elem));
    let c = k.param("c", gptr(Scalar::F32));
    let m = k.param("m", Type::U32);

    let a_stage = p.bm * BK;
    let b_stage = p.bn * BK;
    let a_s = k.shared_array("a_tile", Scalar::BF16, stages * a_stage, 128);
    let quantized = p.format.is_quantized();
    let b_s = k.shared_array("b_tile", Scalar::BF16, if quantized { 2 } else { stages } * b_stage, 128);
    let raw_stage = p.bn * p.format.staged_stride();

    let ids = Ids::emit(k, p);
    let one = k.const_u32(1);
    let last_row = k.sub(m, one);
    let a_copy = TileCopy::emit(k, &ids, a, ids.row0, Some(last_row), p.k, p.bm, threads);
    let source = if quantized {
        let raw_s = k.shared_array("b_raw", Scalar::U32, stages * raw_stage, 128);
        BSource::Dequant { raw: RawCopy::emit(k, p, &ids, b), dec: Decoder::emit(k, p, &ids), raw_s }
    } else {
        BSource::Tiles(TileCopy::emit(k, &ids, b, ids.col0, None, p.k, p.bn, threads))
    };
    let frags = FragAddrs::emit(k, p, &ids);

    let steps = p.k / BK;
    // The last k-step: copies past it repeat it into a stage nobody reads again, which
    // keeps the loop free of branches.
    let last_tile = k.const_u32(steps - 1);
    let clamp = |k: &mut Builder, t: Value| k.min(t, last_tile);
    let stage_at = |k: &mut Builder, slot: Value, size: u32| k.mul_const(slot, size);

    // Prologue. Commit group g holds A's tile g and B's tile g (bf16) or the stored
    // bytes of tile g + 1 (quantized, after a first group with tile 0's bytes, which are
    // dequantized before the loop).
    if let BSource::Dequant { raw, dec, raw_s } = &source {
        let (raw_s, zero) = (*raw_s, k.const_u32(0));
        raw.issue(k, raw_s, zero, zero);
        k.cp_async_commit();
        prologue_groups(k, stages, |k, g| {
            let slot = k.const_u32(g);
            let a_off = stage_at(k, slot, a_stage);
            let tile = k.const_u32(g);
            let tile = clamp(k, tile);
            a_copy.issue(k, a_s, a_off, tile);
            let next = k.const_u32(g + 1);
            let raw_off = stage_at(k, next, raw_stage);
            let tile = clamp(k, next);
            raw.issue(k, raw_s, raw_off, tile);
        });
        k.cp_async_wait(stages - 1);
        k.barrier();
        dec.decode(k, raw_s, zero, b_s, zero, zero);
    } else if let BSource::Tiles(b_copy) = &source {
        prologue_groups(k, stages, |k, g| {
            let slot = k.const_u32(g);
            let tile = clamp(k, slot);
            let a_off = stage_at(k, slot, a_stage);
            a_copy.issue(k, a_s, a_off, tile);
            let b_off = stage_at(k, slot, b_stage);
            b_copy.issue(k, b_s, b_off, tile);
        });
    }

    // The k-loop; `slot` (carried) is `t mod stages`.
    let zero = k.const_u32(0);
    let hi = k.const_u32(steps);
    let mut init = vec![zero];
    init.extend(zero_acc(k, p));
    let out = k.for_range(zero, hi, one, &init, |k, t, carried| {
        let slot = carried[0];
        // This step's group has landed (all but the `stages − 2` newer ones), and after
        // the barrier every thread's copies are visible and every thread is done with
        // the previous step, whose stages the copies below overwrite.
        k.cp_async_wait(stages - 2);
        k.barrier();
        let first = k.eq(slot, zero);
        let before = k.sub(slot, one);
        let wrap = k.const_u32(stages - 1);
        let prev = k.select(first, wrap, before);
        let at_end = k.eq(slot, wrap);
        let after = k.add(slot, one);
        let next = k.select(at_end, zero, after);

        let ahead = k.add_const(t, stages - 1);
        let tile = clamp(k, ahead);
        let a_write = stage_at(k, prev, a_stage);
        a_copy.issue(k, a_s, a_write, tile);
        match &source {
            BSource::Tiles(b_copy) => {
                let b_write = stage_at(k, prev, b_stage);
                b_copy.issue(k, b_s, b_write, tile);
            }
            BSource::Dequant { raw, raw_s, .. } => {
                let ahead = k.add_const(t, stages);
                let tile = clamp(k, ahead);
                let raw_write = stage_at(k, slot, raw_stage);
                raw.issue(k, *raw_s, raw_write, tile);
            }
        }
        k.cp_async_commit();

        let a_read = stage_at(k, slot, a_stage);
        let b_read = match &source {
            BSource::Tiles(_) => stage_at(k, slot, b_stage),
            BSource::Dequant { .. } => {
                let buf = k.and_const(t, 1);
                stage_at(k, buf, b_stage)
            }
        };
        let acc = mma_step(k, p, &frags, &carried[1..], (a_s, a_read), (b_s, b_read));
        if let BSource::Dequant { dec, raw_s, .. } = &source {
            // Independent of the MMAs above: ptxas interleaves the two.
            let t1 = k.add(t, one);
            let tile = clamp(k, t1);
            let raw_read = stage_at(k, next, raw_stage);
            let buf = k.and_const(t1, 1);
            let buf = stage_at(k, buf, b_stage);
            dec.decode(k, *raw_s, raw_read, b_s, buf, tile);
        }
        let mut out = vec![next];
        out.extend(acc);
        out
    });
    // Nothing is read from the copies still in flight (repeats of the last tile).
    k.cp_async_wait(0);
    store_c(k, p, &ids, c, m, &out[1..], p.epilogue == Epilogue::Accumulate);
    Ok(kb.finish()?)
}

/// Groups `0 .. stages − 1` of the prologue, each committed.
fn prologue_groups(k: &mut Builder, stages: u32, mut group: impl FnMut(&mut Builder, u32)) {
    for g in 0..stages - 1 {
        group(k, g);
        k.cp_async_commit();
    }
}
