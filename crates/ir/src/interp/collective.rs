//! Warp collectives: `shfl.sync`, `vote.sync`, `redux.sync`.
//!
//! Every lane executing one must name all the lanes executing it in its member mask;
//! any other lane the mask names must have exited (a lane that is alive but elsewhere
//! would make the GPU wait for it, or read what it has not provided). Reading a lane
//! that does not execute the shuffle is an error rather than an undefined value.

use super::block::BlockCtx;
use super::program::CInst;
use super::warp::{lanes, Warp};
use super::InterpError;
use crate::func::Value;
use crate::ops::{ReduxOp, ShflMode, VoteMode};
use crate::types::{Scalar, Type};

fn check_mask(
    ctx: &BlockCtx,
    w: &Warp,
    ci: &CInst,
    mask: Value,
    active: u32,
) -> Result<(), InterpError> {
    let m = ctx.prog.info(mask);
    for l in lanes(active) {
        let mk = w.regs.get(m, 0, l) as u32;
        if mk & active != active || mk & w.alive & !active != 0 {
            return Err(InterpError::CollectiveMask {
                site: ctx.site(w.index, Some(l), ci),
                lane: l,
                mask: mk,
                active,
            });
        }
    }
    Ok(())
}

/// The lane `lane` reads in a shuffle, per the PTX definition: `c` packs the clamp
/// value (bits 0..5) and the segment mask (bits 8..13); a source outside the segment
/// or past the clamp leaves the lane reading itself.
fn source_lane(mode: ShflMode, lane: u32, b: u32, c: u32) -> u32 {
    let bval = (b & 31) as i32;
    let cval = (c & 31) as i32;
    let segmask = ((c >> 8) & 31) as i32;
    let lane = lane as i32;
    let max_lane = (lane & segmask) | (cval & !segmask);
    let min_lane = lane & segmask;
    let (j, ok) = match mode {
        ShflMode::Up => (lane - bval, lane - bval >= max_lane),
        ShflMode::Down => (lane + bval, lane + bval <= max_lane),
        ShflMode::Bfly => (lane ^ bval, (lane ^ bval) <= max_lane),
        ShflMode::Idx => {
            let j = min_lane | (bval & !segmask);
            (j, j <= max_lane)
        }
    };
    if ok {
        j as u32
    } else {
        lane as u32
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn shfl(
    ctx: &BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    mode: ShflMode,
    value: Value,
    b: Value,
    c: Value,
    mask: Value,
) -> Result<(), InterpError> {
    check_mask(ctx, w, ci, mask, active)?;
    let p = ctx.prog;
    let (v, bi, cv, o) = (
        p.info(value),
        p.info(b),
        p.info(c),
        p.info(ci.inst.results[0]),
    );
    for l in lanes(active) {
        let src = source_lane(
            mode,
            l,
            w.regs.get(bi, 0, l) as u32,
            w.regs.get(cv, 0, l) as u32,
        );
        if active & (1 << src) == 0 {
            return Err(InterpError::ShuffleInactiveSource {
                site: ctx.site(w.index, Some(l), ci),
                lane: l,
                src,
            });
        }
        // The result is a different value than the source, so lanes cannot clobber
        // what another lane still has to read.
        w.regs.copy(v, src, o, l);
    }
    Ok(())
}

pub(crate) fn vote(
    ctx: &BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    mode: VoteMode,
    pred: Value,
    mask: Value,
) -> Result<(), InterpError> {
    check_mask(ctx, w, ci, mask, active)?;
    let (pi, o) = (ctx.prog.info(pred), ctx.prog.info(ci.inst.results[0]));
    let ballot = lanes(active)
        .filter(|&l| w.regs.get(pi, 0, l) & 1 == 1)
        .fold(0u32, |m, l| m | 1 << l);
    let r = match mode {
        VoteMode::All => (ballot == active) as u64,
        VoteMode::Any => (ballot != 0) as u64,
        VoteMode::Ballot => ballot as u64,
    };
    for l in lanes(active) {
        w.regs.set(o, 0, l, r);
    }
    Ok(())
}

pub(crate) fn redux(
    ctx: &BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    op: ReduxOp,
    value: Value,
    mask: Value,
) -> Result<(), InterpError> {
    let s = match ctx.prog.ty(value) {
        Type::Scalar(s @ (Scalar::U32 | Scalar::I32)) => s,
        t => {
            return Err(ctx.unsupported(
                w.index,
                ci,
                format!("redux.sync on {t} (only u32 and s32)"),
            ))
        }
    };
    check_mask(ctx, w, ci, mask, active)?;
    let (vi, o) = (ctx.prog.info(value), ctx.prog.info(ci.inst.results[0]));
    let vals = lanes(active).map(|l| w.regs.get(vi, 0, l) as u32);
    let signed = s == Scalar::I32;
    let r = match op {
        ReduxOp::Add => vals.fold(0u32, u32::wrapping_add),
        ReduxOp::And => vals.fold(u32::MAX, |a, x| a & x),
        ReduxOp::Or => vals.fold(0, |a, x| a | x),
        ReduxOp::Xor => vals.fold(0, |a, x| a ^ x),
        ReduxOp::Min if signed => vals.map(|x| x as i32).min().unwrap_or(0) as u32,
        ReduxOp::Max if signed => vals.map(|x| x as i32).max().unwrap_or(0) as u32,
        ReduxOp::Min => vals.min().unwrap_or(0),
        ReduxOp::Max => vals.max().unwrap_or(0),
    };
    for l in lanes(active) {
        w.regs.set(o, 0, l, r as u64);
    }
    Ok(())
}
