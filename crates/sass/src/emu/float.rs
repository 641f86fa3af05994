//! f32 semantics: FADD, FMUL, FFMA (round to nearest even, one rounding for the fused
//! multiply-add) and F2FP's packing conversion to bf16. Subnormals are kept unless the
//! instruction says `.FTZ`, which flushes inputs and result to zero of the same sign.
//! NaNs come out as measured on an H200 for the PTX operations these instructions
//! implement (the IR interpreter's table, `crates/ir/src/interp/nan.rs`): f32 arithmetic
//! gives the canonical NaN `0x7fffffff`, f32 → f16/bf16 the canonical `0x7fff`, f16 → f32
//! `0x7fffffff`.

use super::exec::{lanes, Ctx, Step};
use super::inst::Operand;
use super::int::combine_preds;
use super::EmuError;
use crate::syntax::Kind;
use quench_ir::interp;
use quench_ir::{BinOp, Round, Scalar};

pub const CANONICAL_NAN: u32 = 0x7fff_ffff;
pub const CANONICAL_NAN16: u16 = 0x7fff;

fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        f32::from_bits(x.to_bits() & 0x8000_0000)
    } else {
        x
    }
}

/// `FADD d, a, b`, `FMUL d, a, b`, `FFMA d, a, b, c`, with `.FTZ`.
pub fn arith(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["FTZ"])?;
    let ftz = c.inst.has("FTZ");
    let op = c.inst.op.clone();
    c.arity(if op == "FFMA" { 4 } else { 3 })?;
    for l in lanes(on) {
        let mut x = [0f32; 3];
        for (k, v) in x.iter_mut().enumerate().take(c.ops.len() - 1) {
            let f = c.f32(l, k + 1)?;
            *v = if ftz { flush(f) } else { f };
        }
        let r = match op.as_str() {
            "FADD" => x[0] + x[1],
            "FMUL" => x[0] * x[1],
            _ => x[0].mul_add(x[1], x[2]),
        };
        let r = if ftz { flush(r) } else { r };
        let bits = if r.is_nan() {
            CANONICAL_NAN
        } else {
            r.to_bits()
        };
        c.set(l, 0, bits)?;
    }
    Ok(Step::Next)
}

/// f32 to bf16, rounding to nearest even (a NaN is the caller's).
fn bf16_rn(x: f32) -> u16 {
    let b = x.to_bits();
    let round = 0x7fff + (b >> 16 & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// f32 to f16, rounding to nearest even: subnormal halves below 2^-14, infinity from
/// 65520 up (halfway between 65504 and 2^16, which is even). Every step is exact in f64.
fn f16_rn(x: f32) -> u16 {
    let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
    let v = f64::from(x.abs());
    if x.is_infinite() || v >= 65520.0 {
        return sign | 0x7c00;
    }
    if v < 2f64.powi(-14) {
        // Multiples of 2^-24; 1024 of them is the least normal half, 0x0400.
        return sign | (v * 2f64.powi(24)).round_ties_even() as u16;
    }
    let e = ((x.to_bits() >> 23) & 0xff) as i32 - 127;
    let m = (v * 2f64.powi(10 - e)).round_ties_even() as u32;
    let (e, m) = if m == 2048 { (e + 1, 1024) } else { (e, m) };
    if e + 15 >= 31 {
        return sign | 0x7c00;
    }
    sign | ((e + 15) as u16) << 10 | (m - 1024) as u16
}

/// `F2FP.{BF16|F16}.F32.PACK_AB d, a, b`: `d = half(a) << 16 | half(b)`, each rounded to
/// nearest even; a NaN becomes the canonical `0x7fff`.
pub fn f2fp(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    let round: fn(f32) -> u16 = match c.inst.mods.iter().map(String::as_str).collect::<Vec<_>>()[..]
    {
        ["BF16", "F32", "PACK_AB"] => bf16_rn,
        ["F16", "F32", "PACK_AB"] => f16_rn,
        _ => return Err(c.unmodelled("conversions other than .BF16/.F16.F32.PACK_AB")),
    };
    c.arity(3)?;
    for l in lanes(on) {
        let (a, b) = (c.f32(l, 1)?, c.f32(l, 2)?);
        let half = |x: f32| {
            if x.is_nan() {
                CANONICAL_NAN16
            } else {
                round(x)
            }
        };
        c.set(l, 0, u32::from(half(a)) << 16 | u32::from(half(b)))?;
    }
    Ok(Step::Next)
}

/// `FMNMX d, a, b, p`: the minimum when `p` holds, else the maximum (ptxas writes
/// `min.f32` with `PT`, `max.f32` with `!PT`). As the IR interpreter has it from
/// measurement: a NaN operand yields the other (the canonical NaN if both are), and -0
/// is less than +0.
pub fn fmnmx(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(4)?;
    for l in lanes(on) {
        let (a, b, min) = (c.f32(l, 1)?, c.f32(l, 2)?, c.pred(l, 3)?);
        let r = match (a.is_nan(), b.is_nan()) {
            (true, true) => CANONICAL_NAN,
            (true, false) => b.to_bits(),
            (false, true) => a.to_bits(),
            _ => {
                let a_less = a < b || (a == b && a.is_sign_negative());
                if a_less == min {
                    a.to_bits()
                } else {
                    b.to_bits()
                }
            }
        };
        c.set(l, 0, r)?;
    }
    Ok(Step::Next)
}

/// `I2FP.F32.{S32|U32} d, a`: the integer to the nearest f32 (ties to even).
pub fn i2fp(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    let signed = match c.inst.mods.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["F32", "S32"] => true,
        ["F32", "U32"] => false,
        _ => return Err(c.unmodelled("conversions other than .F32.S32 and .F32.U32")),
    };
    c.arity(2)?;
    for l in lanes(on) {
        let a = c.int(l, 1)?;
        // Through f64, which holds every 32-bit integer exactly: one rounding.
        let v = if signed {
            f64::from(a as i32)
        } else {
            f64::from(a)
        };
        c.set(l, 0, (v as f32).to_bits())?;
    }
    Ok(Step::Next)
}

/// A rounding direction named by a modifier (`.RP`, `.RM`, `.RZ`; none is to nearest).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Nearest,
    Up,
    Down,
    Zero,
}

/// `v` (exact in f64) as an f32 rounded in `dir`.
fn to_f32(v: f64, dir: Direction) -> f32 {
    let near = v as f32;
    let below = f64::from(near) < v;
    let above = f64::from(near) > v;
    match dir {
        Direction::Up if below => near.next_up(),
        Direction::Down if above => near.next_down(),
        Direction::Zero if v > 0.0 && above => near.next_down(),
        Direction::Zero if v < 0.0 && below => near.next_up(),
        _ => near,
    }
}

/// `I2F.{U32|S32}[.RP|.RM|.RZ] d, a`: a 32-bit integer to f32, to nearest even or in the
/// direction named; `I2F.F64.U64 d, a` below. (A form without a source type, or with
/// another destination, is refused.)
pub fn i2f(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    if c.inst.has("F64") {
        return i2f64(c, on);
    }
    c.only(&["U32", "S32", "RP", "RM", "RZ"])?;
    let signed = match (c.inst.has("S32"), c.inst.has("U32")) {
        (true, false) => true,
        (false, true) => false,
        _ => return Err(c.unmodelled("a source type other than one of .U32 and .S32")),
    };
    c.arity(2)?;
    let dir = [
        ("RP", Direction::Up),
        ("RM", Direction::Down),
        ("RZ", Direction::Zero),
    ]
    .into_iter()
    .find(|(m, _)| c.inst.has(m))
    .map_or(Direction::Nearest, |(_, d)| d);
    for l in lanes(on) {
        let a = c.int(l, 1)?;
        let v = if signed {
            f64::from(a as i32)
        } else {
            f64::from(a)
        };
        c.set(l, 0, to_f32(v, dir).to_bits())?;
    }
    Ok(Step::Next)
}

/// `I2F.F64.U64 d, a`: the 64-bit integer to the nearest f64 (ties to even).
fn i2f64(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    if c.inst.mods != ["F64", "U64"] {
        return Err(c.unmodelled("a conversion to f64 from other than u64"));
    }
    c.arity(2)?;
    for l in lanes(on) {
        let a = c.pair(l, 1)?;
        let v = interp::convert(Scalar::U64, Scalar::F64, Some(Round::Rn), a)
            .map_err(|e| c.unmodelled(e))?;
        c.set_many(l, 0, &words(v, Scalar::F64))?;
    }
    Ok(Step::Next)
}

/// `HFMA2.MMA d, -RZ, RZ, hi, lo`: ptxas's way to write a constant. The product is -0
/// in both halves, and -0 + x is x for every f16 `x` but a NaN, so `d` is the two
/// immediates, the first in the high half (as ptxas writes `0x3c000000` as `1, 0`).
/// Any other HFMA2 is refused: half-precision arithmetic is not modelled.
pub fn hfma2(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["MMA"])?;
    c.arity(5)?;
    let idiom = matches!(
        c.ops[1..3],
        [
            Operand::Reg {
                n: 255,
                neg: true,
                not: false,
                abs: false,
                uniform: false
            },
            Operand::Reg {
                n: 255,
                neg: false,
                not: false,
                abs: false,
                uniform: false
            }
        ]
    );
    let half = |o: &Operand| match *o {
        Operand::Float {
            kind: Kind::F16,
            bits,
            neg: false,
            abs: false,
        } if bits & 0x7c00 != 0x7c00 || bits & 0x3ff == 0 => Some(bits as u32 & 0xffff),
        _ => None,
    };
    let (Some(hi), Some(lo), true) = (half(&c.ops[3]), half(&c.ops[4]), idiom) else {
        return Err(c.unmodelled("HFMA2 other than -RZ * RZ plus non-NaN immediates"));
    };
    for l in lanes(on) {
        c.set(l, 0, hi << 16 | lo)?;
    }
    Ok(Step::Next)
}

/// `FSEL d, a, b, p`: `p ? a : b`, the bits unchanged.
pub fn fsel(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(4)?;
    for l in lanes(on) {
        let v = if c.pred(l, 3)? {
            c.f32(l, 1)?
        } else {
            c.f32(l, 2)?
        };
        c.set(l, 0, v.to_bits())?;
    }
    Ok(Step::Next)
}

/// `FSETP.cmp[.FTZ].{AND|OR|XOR} p, PT, a, b, q`: `p = (a cmp b) op q`. As PTX's `setp`
/// defines them, the ordered comparisons (EQ, NE, LT, LE, GT, GE) are false when either
/// operand is NaN, the unordered ones (EQU, ..., GEU) true; NUM and NAN test for NaN.
pub fn fsetp(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[
        "EQ", "NE", "LT", "LE", "GT", "GE", "EQU", "NEU", "LTU", "LEU", "GTU", "GEU", "NUM", "NAN",
        "FTZ", "AND", "OR", "XOR",
    ])?;
    c.arity(5)?;
    if !c.is_pt(1, false) {
        return Err(c.unmodelled("a second predicate destination other than PT"));
    }
    let cmp = c.inst.mods.first().cloned().unwrap_or_default();
    let ftz = c.inst.has("FTZ");
    let combine = ["AND", "OR", "XOR"]
        .into_iter()
        .find(|m| c.inst.has(m))
        .ok_or_else(|| c.unmodelled("no .AND/.OR/.XOR"))?;
    for l in lanes(on) {
        let (mut a, mut b) = (c.f32(l, 2)?, c.f32(l, 3)?);
        if ftz {
            (a, b) = (flush(a), flush(b));
        }
        let unordered = a.is_nan() || b.is_nan();
        let ordered = |r: bool| !unordered && r;
        let or_nan = |r: bool| unordered || r;
        let r = match cmp.as_str() {
            "EQ" => ordered(a == b),
            "NE" => ordered(a != b),
            "LT" => ordered(a < b),
            "LE" => ordered(a <= b),
            "GT" => ordered(a > b),
            "GE" => ordered(a >= b),
            "EQU" => or_nan(a == b),
            "NEU" => or_nan(a != b),
            "LTU" => or_nan(a < b),
            "LEU" => or_nan(a <= b),
            "GTU" => or_nan(a > b),
            "GEU" => or_nan(a >= b),
            "NUM" => !unordered,
            "NAN" => unordered,
            m => return Err(c.unmodelled(format!("comparison .{m}"))),
        };
        let q = c.pred(l, 4)?;
        let v = combine_preds(combine, r, q);
        c.set_pred(l, 0, v)?;
    }
    Ok(Step::Next)
}

/// `HADD2.F32 d, -RZ, r.H0_H0` (or `.H1_H1`): ptxas's conversion of one f16 half of `r`
/// to f32, exact (-0 + x is x), a NaN half giving the canonical NaN. HADD2 with any other
/// addend is refused: f16 arithmetic is not modelled.
pub fn hadd2(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    if c.inst.mods != ["F32"] {
        return Err(c.unmodelled("HADD2 other than .F32"));
    }
    c.arity(3)?;
    let neg_rz = matches!(
        c.ops[1],
        Operand::Reg {
            n: 255,
            neg: true,
            not: false,
            abs: false,
            uniform: false
        }
    );
    let &Operand::Half { n, high } = &c.ops[2] else {
        return Err(c.unmodelled("an operand other than R.H0_H0 or R.H1_H1"));
    };
    if !neg_rz {
        return Err(c.unmodelled("an addend other than -RZ"));
    }
    for l in lanes(on) {
        let w = c.reg_value(l, false, n);
        let h = if high { w >> 16 } else { w & 0xffff } as u16;
        let v = crate::syntax::f16_to_f64(h);
        let bits = if v.is_nan() {
            CANONICAL_NAN
        } else {
            (v as f32).to_bits()
        };
        c.set(l, 0, bits)?;
    }
    Ok(Step::Next)
}

/// `MUFU.EX2 d, a`: 2^a with subnormal inputs and results flushed (PTX's
/// `ex2.approx.ftz.f32`, which ptxas emits as this instruction alone), modelled as the
/// interpreter models the approximation: the f64 function rounded to f32. The hardware's
/// own approximation is judged against that model within the kernel's bound, on the GPU.
/// The other functions (RCP, RSQ, LG2, SIN, COS, ...) are refused.
pub fn mufu(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    if c.inst.mods != ["EX2"] {
        return Err(c.unmodelled(format!("MUFU.{}", c.inst.mods.join("."))));
    }
    c.arity(2)?;
    for l in lanes(on) {
        let x = flush(c.f32(l, 1)?);
        let r = flush(f64::from(x).exp2() as f32);
        let bits = if r.is_nan() {
            CANONICAL_NAN
        } else {
            r.to_bits()
        };
        c.set(l, 0, bits)?;
    }
    Ok(Step::Next)
}

/// `F2I[.FTZ].U32.TRUNC.NTZ d, a` (f32 to u32 toward zero, PTX's `cvt.rzi.u32.f32`; a
/// subnormal truncates to 0 with or without `.FTZ`) and `F2I.U64.F64.{TRUNC|CEIL} d, a`
/// (f64 to u64 toward zero or up): saturating, NaN as the interpreter's `cvt` gives it.
pub fn f2i(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["FTZ", "U32", "U64", "F64", "TRUNC", "CEIL", "NTZ"])?;
    let rnd = match (c.inst.has("TRUNC"), c.inst.has("CEIL")) {
        (true, false) => Round::Rz,
        (false, true) => Round::Rp,
        _ => return Err(c.unmodelled("a rounding other than .TRUNC or .CEIL")),
    };
    let (from, to) = match (c.inst.has("F64"), c.inst.has("U64"), c.inst.has("U32")) {
        (false, false, true) => (Scalar::F32, Scalar::U32),
        (true, true, false) if !c.inst.has("FTZ") && !c.inst.has("NTZ") => {
            (Scalar::F64, Scalar::U64)
        }
        _ => return Err(c.unmodelled("a conversion other than f32 to u32 and f64 to u64")),
    };
    c.arity(2)?;
    for l in lanes(on) {
        let a = match from {
            Scalar::F32 => u64::from(c.f32(l, 1)?.to_bits()),
            _ => c.pair(l, 1)?,
        };
        let v = interp::convert(from, to, Some(rnd), a).map_err(|e| c.unmodelled(e))?;
        c.set_many(l, 0, &words(v, to))?;
    }
    Ok(Step::Next)
}

/// `F2F.F64.F32 d, a`: the f32 widened to f64 (exact; NaN as the interpreter's `cvt`).
pub fn f2f(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    if c.inst.mods != ["F64", "F32"] {
        return Err(c.unmodelled("a conversion other than f32 to f64"));
    }
    c.arity(2)?;
    for l in lanes(on) {
        let a = u64::from(c.f32(l, 1)?.to_bits());
        let v = interp::convert(Scalar::F32, Scalar::F64, None, a).map_err(|e| c.unmodelled(e))?;
        c.set_many(l, 0, &words(v, Scalar::F64))?;
    }
    Ok(Step::Next)
}

/// `DMUL d, a, b`: the f64 product, rounded to nearest even (NaN as the interpreter's).
pub fn dmul(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(3)?;
    for l in lanes(on) {
        let (a, b) = (c.pair(l, 1)?, c.pair(l, 2)?);
        let v = interp::arithmetic(BinOp::Mul, Some(Round::Rn), Scalar::F64, a, b)
            .map_err(|e| c.unmodelled(e))?;
        c.set_many(l, 0, &words(v, Scalar::F64))?;
    }
    Ok(Step::Next)
}

/// A value of `ty` as the registers that hold it, low word first.
fn words(v: u64, ty: Scalar) -> Vec<u32> {
    match ty.bits() {
        64 => vec![v as u32, (v >> 32) as u32],
        _ => vec![v as u32],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directed_rounding_of_integers() {
        // 2^24 + 1 lies between the f32s 2^24 and 2^24 + 2; 2^24 + 3 between + 2 and + 4.
        let (a, b, c) = (16777216f32, 16777218f32, 16777220f32);
        for (v, dir, want) in [
            (16777217.0, Direction::Nearest, a),
            (16777219.0, Direction::Nearest, c),
            (16777217.0, Direction::Up, b),
            (16777217.0, Direction::Down, a),
            (16777217.0, Direction::Zero, a),
            (-16777217.0, Direction::Zero, -a),
            (-16777217.0, Direction::Down, -b),
            (-16777217.0, Direction::Up, -a),
            (9.0, Direction::Up, 9.0),
        ] {
            assert_eq!(to_f32(v, dir), want, "{v} {dir:?}");
        }
    }

    #[test]
    fn f16_rounding_agrees_with_the_f16_table_at_every_boundary() {
        // Every f16 and the f32 midpoints around it: to nearest, ties to even.
        for h in 0..0x7c00u16 {
            let v = crate::syntax::f16_to_f64(h);
            assert_eq!(f16_rn(v as f32), h, "{v}");
            assert_eq!(f16_rn(-v as f32), h | 0x8000, "{v}");
            if h == 0x7bff {
                continue;
            }
            let next = crate::syntax::f16_to_f64(h + 1);
            let mid = ((v + next) / 2.0) as f32;
            let even = if h % 2 == 0 { h } else { h + 1 };
            assert_eq!(f16_rn(mid), even, "midpoint of {v} and {next}");
            assert_eq!(f16_rn(mid.next_up()), h + 1, "above the midpoint of {v}");
            assert_eq!(f16_rn(mid.next_down()), h, "below the midpoint of {v}");
        }
        assert_eq!(f16_rn(65520.0f32.next_down()), 0x7bff);
        assert_eq!(f16_rn(65520.0), 0x7c00);
        assert_eq!(f16_rn(f32::INFINITY), 0x7c00);
        assert_eq!(f16_rn(1e9), 0x7c00);
        assert_eq!(f16_rn(-0.0), 0x8000);
    }
}
