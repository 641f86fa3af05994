//! Warp collectives: shuffle, vote and reduction.

use quench_ir::{ReduxOp, ShflMode, Value, VoteMode};

use crate::emitter::{Emitter, Res};
use crate::ptype;

/// `shfl.sync` of a 32-bit value (any 32-bit type; the IR allows no other width).
pub(super) fn shfl(
    e: &mut Emitter,
    d: Value,
    mode: ShflMode,
    value: Value,
    [b, c, mask]: [Value; 3],
) -> Res<()> {
    let (vr, br, cr, mr) = (e.reg1(value)?, e.reg1(b)?, e.reg1(c)?, e.reg1(mask)?);
    let dr = e.def1(d)?;
    e.line(format!(
        "shfl.sync.{}.b32 {dr}, {vr}, {br}, {cr}, {mr}",
        mode.name()
    ));
    Ok(())
}

pub(super) fn vote(e: &mut Emitter, d: Value, mode: VoteMode, pred: Value, mask: Value) -> Res<()> {
    let t = if mode == VoteMode::Ballot {
        "b32"
    } else {
        "pred"
    };
    let (pr, mr) = (e.reg1(pred)?, e.reg1(mask)?);
    let dr = e.def1(d)?;
    e.line(format!("vote.sync.{}.{t} {dr}, {pr}, {mr}", mode.name()));
    Ok(())
}

/// `redux.sync` on s32/u32 (the IR's domain, which is sm_90's).
pub(super) fn redux(e: &mut Emitter, d: Value, op: ReduxOp, value: Value, mask: Value) -> Res<()> {
    let s = e.scalar(value)?;
    let t = match op {
        ReduxOp::Add | ReduxOp::Min | ReduxOp::Max => ptype::arith(s),
        ReduxOp::And | ReduxOp::Or | ReduxOp::Xor => "b32",
    };
    let (vr, mr) = (e.reg1(value)?, e.reg1(mask)?);
    let dr = e.def1(d)?;
    e.line(format!("redux.sync.{}.{t} {dr}, {vr}, {mr}", op.name()));
    Ok(())
}
