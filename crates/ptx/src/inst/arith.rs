//! Arithmetic, comparison and selection.
//!
//! Vectors and fragments compute lane by lane. 8-bit integers compute as 16-bit ones
//! and are re-extended afterwards (see `regs`); that keeps wrap-around, compares,
//! division and shifts exact at 8 bits.

use quench_ir::{BinOp, CmpOp, Round, Scalar, Type, UnOp, Value};

use super::expect;
use crate::emitter::{Emitter, Res};
use crate::ptype;
use crate::regs::RegClass;

/// The lane type and registers of a scalar, vector or fragment value.
fn lanes(e: &Emitter, v: Value) -> Res<(Scalar, Vec<String>)> {
    let s = match e.ty(v)? {
        Type::Scalar(s) | Type::Vec(s, _) => s,
        Type::Frag(f) => f.reg_type(),
        t @ Type::Ptr(..) => return Err(format!("{v} is a {t}; use ptr_add for address arithmetic")),
    };
    Ok((s, e.regs(v)?))
}

fn no_inst(what: &str, s: Scalar) -> String {
    format!("`{what}` on {s} has no PTX instruction")
}

/// `.rn` for `Some(Rn)`; an error naming the op when a rounding mode is missing.
fn rounding(op: &str, s: Scalar, rnd: Option<Round>) -> Res<String> {
    match rnd {
        Some(r) => Ok(format!(".{}", r.name())),
        None => Err(format!("`{op}` on {s} needs a rounding mode")),
    }
}

/// Halves and packed pairs round only to nearest even.
fn half_rounding(op: &str, s: Scalar, rnd: Option<Round>) -> Res<()> {
    match rnd {
        Some(Round::Rn) => Ok(()),
        Some(r) => Err(format!("`{op}` on {s} rounds only to nearest (rn), not {}", r.name())),
        None => Err(format!("`{op}` on {s} needs a rounding mode")),
    }
}

pub(super) fn bin(e: &mut Emitter, d: Value, op: BinOp, rnd: Option<Round>, a: Value, b: Value) -> Res<()> {
    let ty = e.ty(a)?;
    expect(e, d, ty)?;
    let (s, ar) = lanes(e, a)?;
    let br = if matches!(op, BinOp::Shl | BinOp::Shr) {
        if e.ty(b)? != Type::U32 {
            return Err(format!("the shift amount {b} must be a u32, not a {}", e.ty(b)?));
        }
        vec![e.reg1(b)?; ar.len()]
    } else {
        if e.ty(b)? != ty {
            return Err(format!("operands differ in type: {ty} and {}", e.ty(b)?));
        }
        e.regs(b)?
    };
    let form = bin_form(op, rnd, s)?;
    let dr = e.def(d)?;
    for ((d, a), b) in dr.iter().zip(&ar).zip(&br) {
        match &form {
            BinForm::Plain(inst) => e.line(format!("{inst} {d}, {a}, {b}")),
            // Both operands are extended, so the 16-bit product is exact; its high
            // byte is the 8-bit high half.
            BinForm::ByteMulHi => {
                let t = ptype::arith(s);
                e.line(format!("mul.lo.{t} {d}, {a}, {b}"));
                e.line(format!("shr.{t} {d}, {d}, 8"));
            }
        }
        e.rextend(s, d);
    }
    Ok(())
}

enum BinForm {
    Plain(String),
    ByteMulHi,
}

fn bin_form(op: BinOp, rnd: Option<Round>, s: Scalar) -> Res<BinForm> {
    let name = op.name();
    let plain = |x: String| Ok(BinForm::Plain(x));
    if rnd.is_some() && !((s.is_float() || s.is_packed()) && matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div)) {
        return Err(format!("`{name}` on {s} takes no rounding mode"));
    }
    if s == Scalar::Pred {
        return match op {
            BinOp::And | BinOp::Or | BinOp::Xor => plain(format!("{name}.pred")),
            _ => Err(no_inst(name, s)),
        };
    }
    if s.is_int() {
        let t = ptype::arith(s);
        let bits = ptype::bits(s);
        return match op {
            BinOp::Add | BinOp::Sub | BinOp::Div | BinOp::Rem | BinOp::Min | BinOp::Max | BinOp::Shr => {
                plain(format!("{name}.{t}"))
            }
            BinOp::Mul => plain(format!("mul.lo.{t}")),
            BinOp::MulHi if ptype::is_byte(s) => Ok(BinForm::ByteMulHi),
            BinOp::MulHi => plain(format!("mul.hi.{t}")),
            BinOp::And | BinOp::Or | BinOp::Xor | BinOp::Shl => plain(format!("{name}.{bits}")),
        };
    }
    let t = s.name();
    match (op, s) {
        (BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div, Scalar::F32 | Scalar::F64) => {
            plain(format!("{name}{}.{t}", rounding(name, s, rnd)?))
        }
        (BinOp::Add | BinOp::Sub | BinOp::Mul, _) => {
            half_rounding(name, s, rnd)?;
            plain(format!("{name}.rn.{t}"))
        }
        (BinOp::Min | BinOp::Max, _) => plain(format!("{name}.{t}")),
        _ => Err(no_inst(name, s)),
    }
}

pub(super) fn fma(e: &mut Emitter, d: Value, rnd: Round, [a, b, c]: [Value; 3]) -> Res<()> {
    let ty = e.ty(a)?;
    if e.ty(b)? != ty || e.ty(c)? != ty {
        return Err(format!("operands differ in type: {ty}, {}, {}", e.ty(b)?, e.ty(c)?));
    }
    expect(e, d, ty)?;
    let (s, ar) = lanes(e, a)?;
    let (br, cr) = (e.regs(b)?, e.regs(c)?);
    let inst = match s {
        Scalar::F32 | Scalar::F64 => format!("fma.{}.{s}", rnd.name()),
        Scalar::F16 | Scalar::BF16 | Scalar::F16x2 | Scalar::BF16x2 => {
            half_rounding("fma", s, Some(rnd))?;
            format!("fma.rn.{s}")
        }
        // Integer multiply-add keeps the low bits; no rounding is involved.
        _ if s.is_int() => format!("mad.lo.{}", ptype::arith(s)),
        _ => return Err(no_inst("fma", s)),
    };
    let dr = e.def(d)?;
    for (((d, a), b), c) in dr.iter().zip(&ar).zip(&br).zip(&cr) {
        e.line(format!("{inst} {d}, {a}, {b}, {c}"));
        e.rextend(s, d);
    }
    Ok(())
}

pub(super) fn un(e: &mut Emitter, d: Value, op: UnOp, a: Value) -> Res<()> {
    let (s, ar) = lanes(e, a)?;
    if matches!(op, UnOp::Popc | UnOp::Clz) {
        return count_bits(e, d, op, a);
    }
    expect(e, d, e.ty(a)?)?;
    let name = format!("{op:?}").to_lowercase();
    let t = s.name();
    let f32_only = |inst: &str| if s == Scalar::F32 { Ok(inst.to_string()) } else { Err(no_inst(&name, s)) };
    let exact_float = |inst: &str, r: Round| match s {
        Scalar::F32 | Scalar::F64 => Ok(format!("{inst}.{}.{t}", r.name())),
        _ => Err(no_inst(&name, s)),
    };
    // An instruction applied as `inst d, a`, and whether the result needs re-extending.
    let inst = match op {
        UnOp::Neg if s.is_int() => format!("neg.s{}", &ptype::bits(s)[1..]),
        UnOp::Abs if s.is_unsigned() => format!("mov.{}", ptype::bits(s)),
        UnOp::Abs if s.is_int() => format!("abs.s{}", &ptype::bits(s)[1..]),
        UnOp::Neg | UnOp::Abs if s.is_float() || s.is_packed() => format!("{name}.{t}"),
        UnOp::Not if s == Scalar::Pred => "not.pred".into(),
        UnOp::Not if s.is_int() => format!("not.{}", ptype::bits(s)),
        UnOp::Sqrt(r) => exact_float("sqrt", r)?,
        UnOp::Rcp(r) => exact_float("rcp", r)?,
        UnOp::RcpApprox => f32_only("rcp.approx.f32")?,
        UnOp::RsqrtApprox => f32_only("rsqrt.approx.f32")?,
        UnOp::Ex2Approx => match s {
            Scalar::F32 => "ex2.approx.ftz.f32".into(),
            Scalar::F16 | Scalar::F16x2 => format!("ex2.approx.{t}"),
            Scalar::BF16 | Scalar::BF16x2 => format!("ex2.approx.ftz.{t}"),
            _ => return Err(no_inst(&name, s)),
        },
        UnOp::Lg2Approx => f32_only("lg2.approx.ftz.f32")?,
        UnOp::TanhApprox => match s {
            Scalar::F32 | Scalar::F16 | Scalar::F16x2 | Scalar::BF16 | Scalar::BF16x2 => format!("tanh.approx.{t}"),
            _ => return Err(no_inst(&name, s)),
        },
        UnOp::SinApprox => f32_only("sin.approx.f32")?,
        UnOp::CosApprox => f32_only("cos.approx.f32")?,
        UnOp::RoundInt(r) if s.is_float() => format!("cvt.{}i.{t}.{t}", r.name()),
        _ => return Err(no_inst(&name, s)),
    };
    let dr = e.def(d)?;
    for (d, a) in dr.iter().zip(&ar) {
        e.line(format!("{inst} {d}, {a}"));
        e.rextend(s, d);
    }
    Ok(())
}

/// `popc`/`clz` of an integer of any width, giving a u32. Narrow integers count in a
/// zero-extended 32-bit copy; `clz` then subtracts the zeros the extension added.
fn count_bits(e: &mut Emitter, d: Value, op: UnOp, a: Value) -> Res<()> {
    let name = if op == UnOp::Popc { "popc" } else { "clz" };
    let s = e.scalar(a)?;
    if !s.is_int() {
        return Err(no_inst(name, s));
    }
    expect(e, d, Type::U32)?;
    let ar = e.reg1(a)?;
    let dr = e.def1(d)?;
    match s.bits() {
        64 => e.line(format!("{name}.b64 {dr}, {ar}")),
        32 => e.line(format!("{name}.b32 {dr}, {ar}")),
        bits => {
            let w = e.temp(RegClass::B32);
            e.line(format!("cvt.u32.u{bits} {w}, {ar}"));
            e.line(format!("{name}.b32 {dr}, {w}"));
            if op == UnOp::Clz {
                e.line(format!("sub.u32 {dr}, {dr}, {}", 32 - bits));
            }
        }
    }
    Ok(())
}

pub(super) fn div_approx(e: &mut Emitter, d: Value, a: Value, b: Value) -> Res<()> {
    let s = e.scalar(a)?;
    if s != Scalar::F32 || e.ty(b)? != Type::F32 {
        return Err(no_inst("div.approx", s));
    }
    expect(e, d, Type::F32)?;
    let (ar, br, dr) = (e.reg1(a)?, e.reg1(b)?, e.def1(d)?);
    e.line(format!("div.approx.f32 {dr}, {ar}, {br}"));
    Ok(())
}

pub(super) fn cmp(e: &mut Emitter, d: Value, op: CmpOp, a: Value, b: Value) -> Res<()> {
    let ty = e.ty(a)?;
    if e.ty(b)? != ty {
        return Err(format!("operands differ in type: {ty} and {}", e.ty(b)?));
    }
    expect(e, d, Type::PRED)?;
    let (ar, br) = (e.reg1(a)?, e.reg1(b)?);
    let t = match ty {
        Type::Scalar(Scalar::Pred) => return pred_cmp(e, d, op, ar, br),
        Type::Scalar(s) if s.is_int() => ptype::arith(s).to_string(),
        Type::Scalar(s) if s.is_float() => s.name().to_string(),
        Type::Ptr(..) => format!("u{}", if RegClass::of_type(ty)? == [RegClass::B64] { 64 } else { 32 }),
        _ => return Err(format!("cannot compare {ty} values (one predicate results from one compare)")),
    };
    // Float compares are ordered (false on NaN) except `ne`, which is true on NaN.
    let cond = if op == CmpOp::Ne && ty.scalar().is_some_and(|s| s.is_float()) { "neu" } else { op.name() };
    let dr = e.def1(d)?;
    e.line(format!("setp.{cond}.{t} {dr}, {ar}, {br}"));
    Ok(())
}

fn pred_cmp(e: &mut Emitter, d: Value, op: CmpOp, a: String, b: String) -> Res<()> {
    let dr = e.def1(d)?;
    match op {
        CmpOp::Ne => e.line(format!("xor.pred {dr}, {a}, {b}")),
        CmpOp::Eq => {
            e.line(format!("xor.pred {dr}, {a}, {b}"));
            e.line(format!("not.pred {dr}, {dr}"));
        }
        _ => return Err(no_inst(&format!("cmp {}", op.name()), Scalar::Pred)),
    }
    Ok(())
}

pub(super) fn select(e: &mut Emitter, d: Value, cond: Value, a: Value, b: Value) -> Res<()> {
    let ty = e.ty(a)?;
    if e.ty(cond)? != Type::PRED || e.ty(b)? != ty {
        return Err(format!("select needs a pred and two values of one type, got {}, {ty}, {}", e.ty(cond)?, e.ty(b)?));
    }
    expect(e, d, ty)?;
    let (c, ar, br) = (e.reg1(cond)?, e.regs(a)?, e.regs(b)?);
    let classes = RegClass::of_type(ty)?;
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
