//! Constants, numeric conversions, bit reinterpretation, and building or taking apart
//! vectors, packed pairs and fragments.

use quench_ir::{Round, Scalar, Type, Value};

use super::expect;
use crate::emitter::{Emitter, Res};
use crate::ptype;
use crate::regs::RegClass;

pub(super) fn constant(e: &mut Emitter, d: Value, ty: Type, bits: u64) -> Res<()> {
    expect(e, d, ty)?;
    let Type::Scalar(s) = ty else {
        return Err(format!("a constant must be a scalar, not a {ty} (pack scalars instead)"));
    };
    let width = s.bits();
    if width < 64 && bits >> width != 0 {
        return Err(format!("the constant 0x{bits:x} does not fit in {s}"));
    }
    let dr = e.def1(d)?;
    let text = match s {
        Scalar::Pred => format!("mov.pred {dr}, {bits}"),
        Scalar::F32 => format!("mov.f32 {dr}, 0f{bits:08X}"),
        Scalar::F64 => format!("mov.f64 {dr}, 0d{bits:016X}"),
        // Held sign-extended to 16 bits (see `regs`).
        Scalar::I8 if bits & 0x80 != 0 => format!("mov.b16 {dr}, 0x{:X}", bits | 0xFF00),
        _ => format!("mov.{} {dr}, 0x{bits:X}", ptype::bits(s)),
    };
    e.line(text);
    Ok(())
}

/// Whether every value of integer type `from` is exactly a value of float type `to`.
fn int_to_float_exact(from: Scalar, to: Scalar) -> bool {
    let magnitude_bits = if from.is_signed() { from.bits() - 1 } else { from.bits() };
    let precision = match to {
        Scalar::F16 => 11,
        Scalar::BF16 => 8,
        Scalar::F32 => 24,
        _ => 53,
    };
    magnitude_bits <= precision
}

/// `cvt` with PTX's rounding rules: float→int selects the integer rounding (`.rzi`
/// etc.), int→float and float narrowing need a rounding mode (one given for an exact
/// conversion is dropped: it cannot change the result), integer conversions truncate
/// or, with `sat`, clamp. Float→int always clamps in PTX; `sat` is emitted as given.
pub(super) fn cvt(e: &mut Emitter, d: Value, to: Scalar, rnd: Option<Round>, sat: bool, a: Value) -> Res<()> {
    expect(e, d, Type::Scalar(to))?;
    let from = e.scalar(a)?;
    if from == Scalar::Pred || to == Scalar::Pred {
        return Err(format!("no conversion between {from} and {to}: compare or select instead"));
    }
    if from.is_packed() || to.is_packed() {
        return Err(format!("no conversion between {from} and {to}: extract or pack the halves"));
    }
    let (ar, dr) = (e.reg1(a)?, e.def1(d)?);
    let s = if sat { ".sat" } else { "" };
    let needs = |what: &str| format!("converting {from} to {to} {what} needs a rounding mode");
    let text = if from == to {
        if sat && to.is_float() {
            format!("cvt.sat.{to}.{to} {dr}, {ar}")
        } else {
            format!("mov.{} {dr}, {ar}", ptype::bits(to))
        }
    } else {
        match (from.is_float(), to.is_float()) {
            (false, false) => format!("cvt{s}.{to}.{from} {dr}, {ar}"),
            (false, true) => {
                if sat {
                    return Err(format!("`sat` on a conversion from {from} to {to} is not defined"));
                }
                let r = match rnd {
                    Some(r) => r,
                    None if int_to_float_exact(from, to) => Round::Rn,
                    None => return Err(needs("(inexact)")),
                };
                format!("cvt.{}.{to}.{from} {dr}, {ar}", r.name())
            }
            (true, false) => {
                let r = rnd.ok_or_else(|| needs("(to select the integer rounding)"))?;
                format!("cvt.{}i{s}.{to}.{from} {dr}, {ar}", r.name())
            }
            (true, true) if to.bits() > from.bits() => format!("cvt{s}.{to}.{from} {dr}, {ar}"),
            (true, true) => {
                let r = rnd.ok_or_else(|| needs("(inexact)"))?;
                format!("cvt.{}{s}.{to}.{from} {dr}, {ar}", r.name())
            }
        }
    };
    e.line(text);
    e.rextend(to, &dr);
    Ok(())
}

/// Bits of each register part of a value (8 for bytes held in 16-bit registers).
fn part_widths(ty: Type) -> Res<Vec<u32>> {
    let classes = RegClass::of_type(ty)?;
    let one = match ty {
        Type::Scalar(Scalar::Pred) | Type::Vec(Scalar::Pred, _) => {
            return Err("predicates have no bit pattern to reinterpret".into())
        }
        Type::Scalar(s) | Type::Vec(s, _) => s.bits(),
        Type::Frag(_) => 32,
        Type::Ptr(..) if classes == [RegClass::B64] => 64,
        Type::Ptr(..) => 32,
    };
    Ok(vec![one; classes.len()])
}

/// The element scalar whose byte registers need re-extending after a write.
fn elem(ty: Type) -> Option<Scalar> {
    match ty {
        Type::Scalar(s) | Type::Vec(s, _) => Some(s),
        _ => None,
    }
}

/// Reinterpret bits. Parts of equal widths move one to one; otherwise the bits pass
/// through 32-bit words (little-endian: part 0 in the low bits). Shared pointers are
/// 32-bit shared-window addresses here, global pointers 64-bit global addresses.
pub(super) fn bitcast(e: &mut Emitter, d: Value, to: Type, a: Value) -> Res<()> {
    expect(e, d, to)?;
    let from = e.ty(a)?;
    let (sw, dw) = (part_widths(from)?, part_widths(to)?);
    let (sbits, dbits) = (sw.iter().sum::<u32>(), dw.iter().sum::<u32>());
    if sbits != dbits {
        return Err(format!("cannot reinterpret {from} ({sbits} bits here) as {to} ({dbits} bits)"));
    }
    let src = e.regs(a)?;
    let dst = e.def(d)?;
    let rext = |e: &mut Emitter, r: &str| {
        if let Some(s) = elem(to) {
            e.rextend(s, r)
        }
    };
    if sw == dw {
        for ((d, s), w) in dst.iter().zip(&src).zip(&sw) {
            e.line(format!("mov.b{} {d}, {s}", (*w).max(16)));
            rext(e, d);
        }
        return Ok(());
    }
    let words = to_words(e, &src, sw[0], RegClass::of_type(from)?[0]);
    from_words(e, &words, &dst, dw[0], elem(to).is_some_and(|s| s.is_signed()));
    for d in &dst {
        rext(e, d);
    }
    Ok(())
}

/// Gather parts of `width` bits each into 32-bit words (the last may be half full).
fn to_words(e: &mut Emitter, parts: &[String], width: u32, class: RegClass) -> Vec<String> {
    let mut words = Vec::new();
    match width {
        64 => {
            for p in parts {
                let (lo, hi) = (e.temp(RegClass::B32), e.temp(RegClass::B32));
                e.line(format!("mov.b64 {{{lo}, {hi}}}, {p}"));
                words.extend([lo, hi]);
            }
        }
        32 => {
            for p in parts {
                if class == RegClass::F32 {
                    // Integer bit-field instructions do not take f32 registers.
                    let w = e.temp(RegClass::B32);
                    e.line(format!("mov.b32 {w}, {p}"));
                    words.push(w);
                } else {
                    words.push(p.clone());
                }
            }
        }
        16 => {
            for pair in parts.chunks(2) {
                let w = e.temp(RegClass::B32);
                match pair {
                    [lo, hi] => e.line(format!("mov.b32 {w}, {{{lo}, {hi}}}")),
                    [lo] => e.line(format!("cvt.u32.u16 {w}, {lo}")),
                    _ => {}
                }
                words.push(w);
            }
        }
        _ => {
            for bytes in parts.chunks(4) {
                let w = e.temp(RegClass::B32);
                e.line(format!("cvt.u32.u16 {w}, {}", bytes[0]));
                for (i, b) in bytes.iter().enumerate().skip(1) {
                    let t = e.temp(RegClass::B32);
                    e.line(format!("cvt.u32.u16 {t}, {b}"));
                    e.line(format!("bfi.b32 {w}, {t}, {w}, {}, 8", 8 * i));
                }
                words.push(w);
            }
        }
    }
    words
}

/// Split 32-bit words into parts of `width` bits each.
fn from_words(e: &mut Emitter, words: &[String], parts: &[String], width: u32, signed: bool) {
    match width {
        64 => {
            for (p, w) in parts.iter().zip(words.chunks(2)) {
                e.line(format!("mov.b64 {p}, {{{}, {}}}", w[0], w[1]));
            }
        }
        32 => {
            for (p, w) in parts.iter().zip(words) {
                e.line(format!("mov.b32 {p}, {w}"));
            }
        }
        16 => {
            for (pair, w) in parts.chunks(2).zip(words) {
                match pair {
                    [lo, hi] => e.line(format!("mov.b32 {{{lo}, {hi}}}, {w}")),
                    [lo] => e.line(format!("cvt.u16.u32 {lo}, {w}")),
                    _ => {}
                }
            }
        }
        _ => {
            let t = if signed { "s32" } else { "u32" };
            for (bytes, w) in parts.chunks(4).zip(words) {
                for (i, b) in bytes.iter().enumerate() {
                    let x = e.temp(RegClass::B32);
                    e.line(format!("bfe.{t} {x}, {w}, {}, 8", 8 * i));
                    e.line(format!("cvt.u16.u32 {b}, {x}"));
                }
            }
        }
    }
}

pub(super) fn pack(e: &mut Emitter, d: Value, ty: Type, parts: &[Value]) -> Res<()> {
    expect(e, d, ty)?;
    let (part_ty, count) = match ty {
        Type::Scalar(s) if s.is_packed() => (Type::Scalar(s.packed_elem().unwrap_or(s)), 2),
        Type::Vec(s, n) => (Type::Scalar(s), n as usize),
        Type::Frag(f) => (Type::Scalar(f.reg_type()), f.regs() as usize),
        _ => return Err(format!("cannot pack into a {ty}")),
    };
    if parts.len() != count {
        return Err(format!("a {ty} has {count} parts, {} given", parts.len()));
    }
    let mut src = Vec::with_capacity(count);
    for p in parts {
        if e.ty(*p)? != part_ty {
            return Err(format!("the parts of a {ty} are {part_ty}, {p} is a {}", e.ty(*p)?));
        }
        src.push(e.reg1(*p)?);
    }
    let dst = e.def(d)?;
    if let [d] = dst.as_slice() {
        if ty.scalar().is_some_and(|s| s.is_packed()) {
            e.line(format!("mov.b32 {d}, {{{}, {}}}", src[0], src[1]));
            return Ok(());
        }
    }
    let classes = RegClass::of_type(ty)?;
    for ((d, s), c) in dst.iter().zip(&src).zip(classes) {
        e.line(format!("mov{} {d}, {s}", c.mov_type()));
    }
    Ok(())
}

pub(super) fn extract(e: &mut Emitter, d: Value, a: Value, index: u32) -> Res<()> {
    let ty = e.ty(a)?;
    let (part_ty, count) = match ty {
        Type::Scalar(s) if s.is_packed() => (Type::Scalar(s.packed_elem().unwrap_or(s)), 2),
        Type::Vec(s, n) => (Type::Scalar(s), n as u32),
        Type::Frag(f) => (Type::Scalar(f.reg_type()), f.regs()),
        _ => return Err(format!("cannot take a part of a {ty}")),
    };
    if index >= count {
        return Err(format!("part {index} of a {ty}, which has {count}"));
    }
    expect(e, d, part_ty)?;
    let src = e.regs(a)?;
    let dr = e.def1(d)?;
    if ty.scalar().is_some_and(|s| s.is_packed()) {
        let halves = if index == 0 { format!("{dr}, _") } else { format!("_, {dr}") };
        e.line(format!("mov.b32 {{{halves}}}, {}", src[0]));
    } else {
        let c = RegClass::of_type(part_ty)?[0];
        e.line(format!("mov{} {dr}, {}", c.mov_type(), src[index as usize]));
    }
    Ok(())
}
