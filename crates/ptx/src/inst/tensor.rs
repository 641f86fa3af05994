//! Tensor-core operations: `mma.sync`, `ldmatrix` and `wgmma`.

use quench_ir::{Block, Function, Inst, MmaShape, Op, Scalar, Swizzle, Type, Value};

use crate::emitter::{Emitter, Res};
use crate::regs::RegClass;

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

/// A `wgmma` descriptor from a shared address: `((addr & 0x3ffff) >> 4)` in bits 0–13,
/// the byte offsets' 16-byte units at bits 16 and 32, the layout type at bits 62–63.
pub(super) fn wgmma_desc(
    e: &mut Emitter,
    d: Value,
    ptr: Value,
    (lbo, sbo, swizzle): (u32, u32, Swizzle),
) -> Res<()> {
    let pr = e.reg1(ptr)?;
    let dr = e.def1(d)?;
    let t = e.temp(RegClass::B32);
    let fields = (lbo as u64 >> 4) << 16 | (sbo as u64 >> 4) << 32 | swizzle.code() << 62;
    e.line(format!("bfe.u32 {t}, {pr}, 4, 14"));
    e.line(format!("cvt.u64.u32 {dr}, {t}"));
    e.line(format!("or.b64 {dr}, {dr}, {fields}"));
    Ok(())
}

/// `wgmma.mma_async.sync.aligned.{shape}.f32.{ab}.{ab}`, accumulating into D in place:
/// D takes C's registers where C is used by this instruction only and defined in its
/// block (so no later read and no later iteration sees them change); otherwise C is
/// copied to D first. `scale-d` is true (D = A·B + C); A and B are K-major.
pub(super) fn wgmma(
    e: &mut Emitter,
    i: &Inst,
    d: Value,
    (shape, ab): (MmaShape, Scalar),
    [a, b, c]: [Value; 3],
) -> Res<()> {
    let cr = e.regs(c)?;
    let dr = if accumulates_in_place(e.f, i, c) {
        e.regs.bind(d, cr.clone());
        cr
    } else {
        let dr = e.def(d)?;
        for (x, y) in dr.iter().zip(&cr) {
            e.line(format!("mov.f32 {x}, {y}"));
        }
        dr
    };
    let br = e.reg1(b)?;
    let p = e.temp(RegClass::Pred);
    e.line(format!("setp.eq.u32 {p}, 0, 0"));
    let a_operand = match e.ty(a)? {
        Type::Frag(_) => format!("{}, {br}, {p}, 1, 1, 0", list(&e.regs(a)?)),
        _ => format!("{}, {br}, {p}, 1, 1, 0, 0", e.reg1(a)?),
    };
    e.line(format!(
        "wgmma.mma_async.sync.aligned.{}.f32.{ab}.{ab} {}, {a_operand}",
        shape.name(),
        list(&dr),
    ));
    Ok(())
}

/// Whether `c` is used only by `inst` and defined (as a result or a block argument) in
/// the block that holds `inst`.
fn accumulates_in_place(f: &Function, inst: &Inst, c: Value) -> bool {
    let mut uses = 0;
    f.walk(&mut |i| uses += i.op.operands().iter().filter(|v| **v == c).count());
    uses == 1 && defined_beside(&f.body, inst, c)
}

fn defined_beside(b: &Block, inst: &Inst, c: Value) -> bool {
    if b.insts.iter().any(|i| std::ptr::eq(i, inst)) {
        return b.args.contains(&c) || b.insts.iter().any(|i| i.results.contains(&c));
    }
    b.insts.iter().any(|i| match &i.op {
        Op::If { then_, else_, .. } => {
            defined_beside(then_, inst, c) || defined_beside(else_, inst, c)
        }
        Op::For { body, .. } => defined_beside(body, inst, c),
        _ => false,
    })
}
