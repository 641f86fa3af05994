//! Tensor-core operations: `mma.sync` and `ldmatrix`.

use quench_ir::{AddrSpace, FragRole, FragType, MmaShape, Scalar, Type, Value};

use super::expect;
use crate::emitter::{Emitter, Res};

fn frag(e: &Emitter, v: Value, shape: MmaShape, role: FragRole) -> Res<FragType> {
    match e.ty(v)? {
        Type::Frag(f) if f.shape == shape && f.role == role && f.is_valid() => Ok(f),
        t => Err(format!(
            "operand {} of mma.{} must be a valid {} fragment of that shape, {v} is a {t}",
            role.name(),
            shape.name(),
            role.name()
        )),
    }
}

fn list(regs: &[String]) -> String {
    format!("{{{}}}", regs.join(", "))
}

/// `mma.sync.aligned.{shape}.row.col.{d}.{a}.{b}.{c}`: A row-major, B column-major,
/// the accumulator in and out of the same type.
pub(super) fn mma(e: &mut Emitter, d: Value, shape: MmaShape, [a, b, c]: [Value; 3]) -> Res<()> {
    let fa = frag(e, a, shape, FragRole::A)?;
    let fb = frag(e, b, shape, FragRole::B)?;
    let fc = frag(e, c, shape, FragRole::C)?;
    if fa.elem != fb.elem {
        return Err(format!("A is {} and B is {}; mma needs one element type", fa.elem, fb.elem));
    }
    expect(e, d, Type::Frag(fc))?;
    let (ar, br, cr) = (e.regs(a)?, e.regs(b)?, e.regs(c)?);
    let dr = e.def(d)?;
    let (ab, acc) = (fa.elem.name(), fc.elem.name());
    e.line(format!(
        "mma.sync.aligned.{}.row.col.{acc}.{ab}.{ab}.{acc} {}, {}, {}, {}",
        shape.name(),
        list(&dr),
        list(&ar),
        list(&br),
        list(&cr)
    ));
    Ok(())
}

/// `ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16`: `num` 8x8 matrices of 16-bit
/// elements, one 32-bit register each per lane.
pub(super) fn ldmatrix(e: &mut Emitter, d: Value, ty: Type, num: u8, trans: bool, ptr: Value) -> Res<()> {
    expect(e, d, ty)?;
    if !matches!(num, 1 | 2 | 4) {
        return Err(format!("ldmatrix loads 1, 2 or 4 matrices, not {num}"));
    }
    let regs = match ty {
        Type::Scalar(Scalar::U32) => 1,
        Type::Vec(Scalar::U32, n) => n as u32,
        Type::Frag(f) => f.regs(),
        _ => return Err(format!("ldmatrix gives u32 registers or a fragment, not a {ty}")),
    };
    if regs != num as u32 {
        return Err(format!("ldmatrix .x{num} gives {num} registers, a {ty} has {regs}"));
    }
    if !matches!(e.ty(ptr)?, Type::Ptr(AddrSpace::Shared, _)) {
        return Err(format!("ldmatrix reads shared memory, {ptr} is a {}", e.ty(ptr)?));
    }
    let pr = e.reg1(ptr)?;
    let dr = e.def(d)?;
    let t = if trans { ".trans" } else { "" };
    e.line(format!("ldmatrix.sync.aligned.m8n8.x{num}{t}.shared.b16 {}, [{pr}]", list(&dr)));
    Ok(())
}
