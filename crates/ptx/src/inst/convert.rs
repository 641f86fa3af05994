//! Constants, numeric conversions, bit reinterpretation, and building or taking apart
//! vectors, packed pairs and fragments.

use quench_ir::{Round, Scalar, Type, Value};

use crate::emitter::{Emitter, Res};
use crate::ptype;
use crate::regs::RegClass;

pub(super) fn constant(e: &mut Emitter, d: Value, ty: Type, bits: u64) -> Res<()> {
    let Type::Scalar(s) = ty else {
        return Err(format!("a constant must be a scalar, not a {ty}"));
    };
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

/// Whether every value of integer type `from` is a value of integer type `to`.
fn int_fits(from: Scalar, to: Scalar) -> bool {
    if from.is_signed() == to.is_signed() {
        to.bits() >= from.bits()
    } else {
        from.is_unsigned() && to.bits() > from.bits()
    }
}

/// `cvt` with PTX's modifiers: float→int selects the integer rounding (`.rzi` etc.),
/// int→float and float narrowing take the rounding mode, integer conversions truncate
/// or, with `sat`, clamp; float→float `sat` clamps to [0, 1]. Float→int always clamps,
/// in PTX as in the IR, so `sat` adds nothing there. 8-bit integer sources convert as
/// the 16-bit values their registers hold (see `regs`).
pub(super) fn cvt(
    e: &mut Emitter,
    d: Value,
    to: Scalar,
    rnd: Option<Round>,
    sat: bool,
    a: Value,
) -> Res<()> {
    let from = e.scalar(a)?;
    let (ar, dr) = (e.reg1(a)?, e.def1(d)?);
    let src = if from.is_int() {
        ptype::arith(from)
    } else {
        from.name()
    };
    let s = if sat { ".sat" } else { "" };
    let r = |what: &str| {
        rnd.map(|r| r.name())
            .ok_or_else(|| format!("converting {from} to {to} needs a rounding mode ({what})"))
    };
    let text = match (from.is_float(), to.is_float()) {
        // Widening keeps every value: nothing to clamp, and PTX refuses `.sat` there.
        (false, false) if int_fits(from, to) && src == to.name() => {
            format!("mov.{} {dr}, {ar}", ptype::bits(to))
        }
        (false, false) if int_fits(from, to) => format!("cvt.{to}.{src} {dr}, {ar}"),
        (false, false) => format!("cvt{s}.{to}.{src} {dr}, {ar}"),
        (false, true) if sat => {
            // PTX's `.sat` would clamp the result to [0, 1].
            return Err(format!(
                "`sat` on a conversion from {from} to {to} has no PTX equivalent"
            ));
        }
        (false, true) => format!("cvt.{}.{to}.{src} {dr}, {ar}", r("inexact")?),
        // PTX has no bf16 → 8-bit conversion: round to 16 bits, then clamp to 8.
        (true, false) if from == Scalar::BF16 && ptype::is_byte(to) => {
            let wide = ptype::arith(to);
            e.line(format!(
                "cvt.{}i.{wide}.bf16 {dr}, {ar}",
                r("the integer rounding")?
            ));
            format!("cvt.sat.{to}.{wide} {dr}, {dr}")
        }
        (true, false) => format!("cvt.{}i.{to}.{src} {dr}, {ar}", r("the integer rounding")?),
        (true, true) if sat && (from == Scalar::BF16 || to == Scalar::BF16) => {
            return bf16_sat(e, from, to, rnd, &ar, &dr);
        }
        (true, true) if from == to && !sat => format!("mov.{} {dr}, {ar}", ptype::bits(to)),
        (true, true) if to.bits() > from.bits() || from == to => {
            format!("cvt{s}.{to}.{src} {dr}, {ar}")
        }
        (true, true) => format!("cvt.{}{s}.{to}.{src} {dr}, {ar}", r("inexact")?),
    };
    e.line(text);
    e.rextend(to, &dr);
    Ok(())
}

/// PTX has no `.sat` on conversions from or to bf16: convert exactly to a wide format
/// (f64 if either side is f64, else f32), clamp there, then round once to `to`.
/// Clamping before rounding gives what rounding before clamping gives, since 0 and 1
/// are exact in every format and rounding is monotonic.
fn bf16_sat(
    e: &mut Emitter,
    from: Scalar,
    to: Scalar,
    rnd: Option<Round>,
    a: &str,
    d: &str,
) -> Res<()> {
    let (wide, class) = if from == Scalar::F64 || to == Scalar::F64 {
        (Scalar::F64, RegClass::F64)
    } else {
        (Scalar::F32, RegClass::F32)
    };
    let x = e.temp(class);
    if from == wide {
        e.line(format!("cvt.sat.{wide}.{wide} {x}, {a}"));
    } else {
        e.line(format!("cvt.{wide}.{from} {x}, {a}"));
        e.line(format!("cvt.sat.{wide}.{wide} {x}, {x}"));
    }
    if to == wide {
        e.line(format!("mov.{} {d}, {x}", ptype::bits(to)));
    } else {
        let r = rnd.or((from == Scalar::BF16 && to == Scalar::BF16).then_some(Round::Rn));
        let r = r.ok_or_else(|| format!("converting {from} to {to} needs a rounding mode"))?;
        e.line(format!("cvt.{}.{to}.{wide} {d}, {x}", r.name()));
    }
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
        Type::Ptr(..) => return Err("pointers cannot be reinterpreted".into()),
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
/// through 32-bit words (little-endian: part 0 in the low bits).
pub(super) fn bitcast(e: &mut Emitter, d: Value, to: Type, a: Value) -> Res<()> {
    let from = e.ty(a)?;
    let (sw, dw) = (part_widths(from)?, part_widths(to)?);
    let (sbits, dbits) = (sw.iter().sum::<u32>(), dw.iter().sum::<u32>());
    if sbits != dbits {
        return Err(format!(
            "cannot reinterpret {from} ({sbits} bits) as {to} ({dbits} bits)"
        ));
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
    from_words(
        e,
        &words,
        &dst,
        dw[0],
        elem(to).is_some_and(|s| s.is_signed()),
    );
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
    let src = parts
        .iter()
        .map(|p| e.reg1(*p))
        .collect::<Res<Vec<String>>>()?;
    let dst = e.def(d)?;
    if ty.scalar().is_some_and(|s| s.is_packed()) {
        e.line(format!("mov.b32 {}, {{{}}}", dst[0], src.join(", ")));
        return Ok(());
    }
    let classes = RegClass::of_type(ty)?;
    for ((d, s), c) in dst.iter().zip(&src).zip(classes) {
        e.line(format!("mov{} {d}, {s}", c.mov_type()));
    }
    Ok(())
}

pub(super) fn extract(e: &mut Emitter, d: Value, a: Value, index: u32) -> Res<()> {
    let ty = e.ty(a)?;
    let src = e.regs(a)?;
    let dr = e.def1(d)?;
    if ty.scalar().is_some_and(|s| s.is_packed()) {
        let halves = if index == 0 {
            format!("{dr}, _")
        } else {
            format!("_, {dr}")
        };
        e.line(format!("mov.b32 {{{halves}}}, {}", src[0]));
    } else {
        let part = src
            .get(index as usize)
            .ok_or_else(|| format!("{ty} has no part {index}"))?;
        let c = RegClass::of_type(e.ty(d)?)?[0];
        e.line(format!("mov{} {dr}, {part}", c.mov_type()));
    }
    Ok(())
}
