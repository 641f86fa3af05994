//! Tensor-core operations: `mma.sync` and `ldmatrix`.

use quench_ir::{MmaShape, Type, Value};

use crate::emitter::{Emitter, Res};

fn list(regs: &[String]) -> String {
    format!("{{{}}}", regs.join(", "))
}

/// `mma.sync.aligned.{shape}.row.col.{d}.{a}.{b}.{c}`: A row-major, B column-major,
/// the accumulator in and out of the same type.
pub(super) fn mma(e: &mut Emitter, d: Value, shape: MmaShape, [a, b, c]: [Value; 3]) -> Res<()> {
    let (Type::Frag(fa), Type::Frag(fc)) = (e.ty(a)?, e.ty(c)?) else {
        return Err("mma operands must be fragments".into());
    };
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
pub(super) fn ldmatrix(e: &mut Emitter, d: Value, num: u8, trans: bool, ptr: Value) -> Res<()> {
    let pr = e.reg1(ptr)?;
    let dr = e.def(d)?;
    let t = if trans { ".trans" } else { "" };
    e.line(format!(
        "ldmatrix.sync.aligned.m8n8.x{num}{t}.shared.b16 {}, [{pr}]",
        list(&dr)
    ));
    Ok(())
}
