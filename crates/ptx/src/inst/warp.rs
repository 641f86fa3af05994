//! Warp collectives: shuffle, vote and reduction.

use quench_ir::{ReduxOp, Scalar, ShflMode, Type, Value, VoteMode};

use super::expect;
use crate::emitter::{Emitter, Res};
use crate::ptype;
use crate::regs::RegClass;

fn u32_operand(e: &Emitter, v: Value, what: &str) -> Res<String> {
    if e.ty(v)? != Type::U32 {
        return Err(format!("the {what} {v} must be a u32, not a {}", e.ty(v)?));
    }
    e.reg1(v)
}

/// `shfl.sync` moves 32 bits; 64-bit values shuffle as two halves, narrower ones
/// widened to 32 bits and back.
pub(super) fn shfl(e: &mut Emitter, d: Value, mode: ShflMode, value: Value, [b, c, mask]: [Value; 3]) -> Res<()> {
    let s = e.scalar(value)?;
    if s == Scalar::Pred {
        return Err("predicates cannot be shuffled; use vote ballot".into());
    }
    expect(e, d, Type::Scalar(s))?;
    let (br, cr, mr) = (u32_operand(e, b, "lane or delta")?, u32_operand(e, c, "clamp")?, u32_operand(e, mask, "mask")?);
    let vr = e.reg1(value)?;
    let dr = e.def1(d)?;
    let m = mode.name();
    let shfl = |e: &mut Emitter, dst: &str, src: &str| {
        e.line(format!("shfl.sync.{m}.b32 {dst}, {src}, {br}, {cr}, {mr}"));
    };
    match s.bits() {
        32 => shfl(e, &dr, &vr),
        64 => {
            let [lo, hi, rlo, rhi] = [(); 4].map(|_| e.temp(RegClass::B32));
            e.line(format!("mov.b64 {{{lo}, {hi}}}, {vr}"));
            shfl(e, &rlo, &lo);
            shfl(e, &rhi, &hi);
            e.line(format!("mov.b64 {dr}, {{{rlo}, {rhi}}}"));
        }
        _ => {
            let (w, r) = (e.temp(RegClass::B32), e.temp(RegClass::B32));
            e.line(format!("cvt.u32.u16 {w}, {vr}"));
            shfl(e, &r, &w);
            e.line(format!("cvt.u16.u32 {dr}, {r}"));
        }
    }
    Ok(())
}

pub(super) fn vote(e: &mut Emitter, d: Value, mode: VoteMode, pred: Value, mask: Value) -> Res<()> {
    if e.ty(pred)? != Type::PRED {
        return Err(format!("vote takes a pred, {pred} is a {}", e.ty(pred)?));
    }
    let (t, ty) = if mode == VoteMode::Ballot { ("b32", Type::U32) } else { ("pred", Type::PRED) };
    expect(e, d, ty)?;
    let (pr, mr) = (e.reg1(pred)?, u32_operand(e, mask, "mask")?);
    let dr = e.def1(d)?;
    e.line(format!("vote.sync.{}.{t} {dr}, {pr}, {mr}", mode.name()));
    Ok(())
}

pub(super) fn redux(e: &mut Emitter, d: Value, op: ReduxOp, value: Value, mask: Value) -> Res<()> {
    let s = e.scalar(value)?;
    if !matches!(s, Scalar::I32 | Scalar::U32) {
        return Err(format!("redux.sync `{}` on {s} has no PTX instruction for sm_90 (32-bit integers only)", op.name()));
    }
    expect(e, d, Type::Scalar(s))?;
    let t = match op {
        ReduxOp::Add | ReduxOp::Min | ReduxOp::Max => ptype::arith(s),
        ReduxOp::And | ReduxOp::Or | ReduxOp::Xor => "b32",
    };
    let (vr, mr) = (e.reg1(value)?, u32_operand(e, mask, "mask")?);
    let dr = e.def1(d)?;
    e.line(format!("redux.sync.{}.{t} {dr}, {vr}, {mr}", op.name()));
    Ok(())
}
