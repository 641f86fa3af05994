//! Arithmetic, comparison and selection.
//!
//! 8-bit integers compute as 16-bit ones and are re-extended afterwards (see `regs`);
//! that keeps wrap-around, compares, division and shifts exact at 8 bits.

use quench_ir::{BinOp, CmpOp, Round, Scalar, UnOp, Value};

use crate::emitter::{Emitter, Res};
use crate::ptype;
use crate::regs::RegClass;

/// Halves and packed pairs round only to nearest even in PTX; the IR allows any mode.
fn half_rounding(op: &str, s: Scalar, rnd: Round) -> Res<()> {
    if rnd == Round::Rn {
        Ok(())
    } else {
        Err(format!(
            "`{op}` on {s} rounds only to nearest (rn) in PTX, not {}",
            rnd.name()
        ))
    }
}

fn no_inst(op: &str, s: Scalar) -> String {
    format!("`{op}` on {s} has no PTX instruction")
}

/// `.rn`, or the error for a float op without a rounding mode.
fn rounding(op: &str, s: Scalar, rnd: Option<Round>) -> Res<Round> {
    rnd.ok_or_else(|| format!("`{op}` on {s} needs a rounding mode"))
}

pub(super) fn bin(
    e: &mut Emitter,
    d: Value,
    op: BinOp,
    rnd: Option<Round>,
    a: Value,
    b: Value,
) -> Res<()> {
    let s = e.scalar(a)?;
    let (ar, br) = (e.reg1(a)?, e.reg1(b)?);
    let name = op.name();
    let inst = if s == Scalar::Pred {
        match op {
            BinOp::And | BinOp::Or | BinOp::Xor => format!("{name}.pred"),
            _ => return Err(no_inst(name, s)),
        }
    } else if s.is_int() {
        let (t, bits) = (ptype::arith(s), ptype::bits(s));
        match op {
            BinOp::Add
            | BinOp::Sub
            | BinOp::Div
            | BinOp::Rem
            | BinOp::Min
            | BinOp::Max
            | BinOp::Shr => {
                format!("{name}.{t}")
            }
            BinOp::Mul => format!("mul.lo.{t}"),
            // Both operands are extended, so their 16-bit product is exact and its
            // high byte is the 8-bit high half.
            BinOp::MulHi if ptype::is_byte(s) => {
                let dr = e.def1(d)?;
                e.line(format!("mul.lo.{t} {dr}, {ar}, {br}"));
                e.line(format!("shr.{t} {dr}, {dr}, 8"));
                e.rextend(s, &dr);
                return Ok(());
            }
            BinOp::MulHi => format!("mul.hi.{t}"),
            BinOp::And | BinOp::Or | BinOp::Xor | BinOp::Shl => format!("{name}.{bits}"),
        }
    } else {
        match (op, s) {
            (BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div, Scalar::F32 | Scalar::F64) => {
                format!("{name}.{}.{s}", rounding(name, s, rnd)?.name())
            }
            (BinOp::Add | BinOp::Sub | BinOp::Mul, _) => {
                half_rounding(name, s, rounding(name, s, rnd)?)?;
                format!("{name}.rn.{s}")
            }
            (BinOp::Min | BinOp::Max, _) => format!("{name}.{s}"),
            _ => return Err(no_inst(name, s)),
        }
    };
    let dr = e.def1(d)?;
    e.line(format!("{inst} {dr}, {ar}, {br}"));
    e.rextend(s, &dr);
    Ok(())
}

pub(super) fn fma(e: &mut Emitter, d: Value, rnd: Round, [a, b, c]: [Value; 3]) -> Res<()> {
    let s = e.scalar(a)?;
    match s {
        Scalar::F32 | Scalar::F64 => {}
        Scalar::F16 | Scalar::BF16 | Scalar::F16x2 | Scalar::BF16x2 => {
            half_rounding("fma", s, rnd)?
        }
        _ => return Err(no_inst("fma", s)),
    }
    let (ar, br, cr) = (e.reg1(a)?, e.reg1(b)?, e.reg1(c)?);
    let dr = e.def1(d)?;
    e.line(format!("fma.{}.{s} {dr}, {ar}, {br}, {cr}", rnd.name()));
    Ok(())
}

/// `dp4a.{u32|s32}.{u32|s32} d, a, b, c`: the types name how `a`'s and `b`'s bytes are
/// read; the 32-bit registers of either integer type are accepted as they are.
pub(super) fn dp4a(e: &mut Emitter, d: Value, signed: [bool; 2], [a, b, c]: [Value; 3]) -> Res<()> {
    let sign = |s: bool| if s { "s32" } else { "u32" };
    let (ar, br, cr) = (e.reg1(a)?, e.reg1(b)?, e.reg1(c)?);
    let dr = e.def1(d)?;
    e.line(format!(
        "dp4a.{}.{} {dr}, {ar}, {br}, {cr}",
        sign(signed[0]),
        sign(signed[1])
    ));
    Ok(())
}

pub(super) fn un(e: &mut Emitter, d: Value, op: UnOp, a: Value) -> Res<()> {
    let s = e.scalar(a)?;
    let t = s.name();
    let name = format!("{op:?}").to_lowercase();
    let f32_only = |inst: &str| {
        if s == Scalar::F32 {
            Ok(inst.to_string())
        } else {
            Err(no_inst(&name, s))
        }
    };
    let ieee = |inst: &str, r: Round| match s {
        Scalar::F32 | Scalar::F64 => Ok(format!("{inst}.{}.{t}", r.name())),
        _ => Err(no_inst(&name, s)),
    };
    let inst = match op {
        // `neg`/`abs` are typed signed in PTX; 8-bit ones work on the extended value.
        UnOp::Neg | UnOp::Abs if s.is_signed() => format!("{name}.s{}", &ptype::bits(s)[1..]),
        UnOp::Neg | UnOp::Abs if s.is_float() || s.is_packed() => format!("{name}.{t}"),
        UnOp::Not if s == Scalar::Pred => "not.pred".into(),
        UnOp::Not if s.is_int() => format!("not.{}", ptype::bits(s)),
        UnOp::Sqrt(r) => ieee("sqrt", r)?,
        UnOp::Rcp(r) => ieee("rcp", r)?,
        UnOp::RcpApprox => f32_only("rcp.approx.f32")?,
        UnOp::RsqrtApprox => f32_only("rsqrt.approx.f32")?,
        // The IR defines ex2 and lg2 as the flush-to-zero forms.
        UnOp::Ex2Approx => f32_only("ex2.approx.ftz.f32")?,
        UnOp::Lg2Approx => f32_only("lg2.approx.ftz.f32")?,
        UnOp::TanhApprox => f32_only("tanh.approx.f32")?,
        UnOp::SinApprox => f32_only("sin.approx.f32")?,
        UnOp::CosApprox => f32_only("cos.approx.f32")?,
        UnOp::RoundInt(r) if s.is_float() => format!("cvt.{}i.{t}.{t}", r.name()),
        UnOp::Popc | UnOp::Clz if s.is_int() && s.bits() >= 32 => format!("{name}.b{}", s.bits()),
        _ => return Err(no_inst(&name, s)),
    };
    let (ar, dr) = (e.reg1(a)?, e.def1(d)?);
    e.line(format!("{inst} {dr}, {ar}"));
    e.rextend(s, &dr);
    Ok(())
}

pub(super) fn div_approx(e: &mut Emitter, d: Value, a: Value, b: Value) -> Res<()> {
    let s = e.scalar(a)?;
    if s != Scalar::F32 {
        return Err(no_inst("div.approx", s));
    }
    let (ar, br, dr) = (e.reg1(a)?, e.reg1(b)?, e.def1(d)?);
    e.line(format!("div.approx.f32 {dr}, {ar}, {br}"));
    Ok(())
}

pub(super) fn cmp(e: &mut Emitter, d: Value, op: CmpOp, a: Value, b: Value) -> Res<()> {
    let s = e.scalar(a)?;
    // Float compares are ordered (false on NaN) except `ne`, which is true on NaN.
    let (cond, t) = match s {
        _ if s.is_int() => (op.name(), ptype::arith(s)),
        _ if s.is_float() => (if op == CmpOp::Ne { "neu" } else { op.name() }, s.name()),
        _ => return Err(no_inst(&format!("cmp {}", op.name()), s)),
    };
    let (ar, br, dr) = (e.reg1(a)?, e.reg1(b)?, e.def1(d)?);
    e.line(format!("setp.{cond}.{t} {dr}, {ar}, {br}"));
    Ok(())
}

/// Works on any type, register by register (vectors, fragments, pointers included).
pub(super) fn select(e: &mut Emitter, d: Value, cond: Value, a: Value, b: Value) -> Res<()> {
    let (c, ar, br) = (e.reg1(cond)?, e.regs(a)?, e.regs(b)?);
    let classes = RegClass::of_type(e.ty(a)?)?;
    let dr = e.def(d)?;
    for (((d, a), b), class) in dr.iter().zip(&ar).zip(&br).zip(classes) {
        if class == RegClass::Pred {
            // `selp` has no predicate form.
            e.line(format!("@{c} mov.pred {d}, {a}"));
            e.line(format!("@!{c} mov.pred {d}, {b}"));
        } else {
            e.line(format!("selp{} {d}, {a}, {b}, {c}", class.mov_type()));
        }
    }
    Ok(())
}
