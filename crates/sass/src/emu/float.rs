//! f32 semantics: FADD, FMUL, FFMA (round to nearest even, one rounding for the fused
//! multiply-add) and F2FP's packing conversion to bf16. Subnormals are kept unless the
//! instruction says `.FTZ`, which flushes inputs and result to zero of the same sign.
//! A NaN result is the canonical NaN `0x7fffffff`, as the PTX ISA says of f32
//! arithmetic on sm_20 and later.

use super::exec::{lanes, Ctx, Step};
use super::EmuError;

pub const CANONICAL_NAN: u32 = 0x7fff_ffff;

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

/// f32 to bf16, rounding to nearest even; a NaN becomes the quiet NaN `0x7fff`.
pub fn bf16_rn(x: f32) -> u16 {
    if x.is_nan() {
        return 0x7fff;
    }
    let b = x.to_bits();
    let round = 0x7fff + (b >> 16 & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// `F2FP.BF16.F32.PACK_AB d, a, b`: `d = bf16(a) << 16 | bf16(b)`.
pub fn f2fp(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    if c.inst.mods != ["BF16", "F32", "PACK_AB"] {
        return Err(c.unmodelled("conversions other than .BF16.F32.PACK_AB"));
    }
    c.arity(3)?;
    for l in lanes(on) {
        let (a, b) = (c.f32(l, 1)?, c.f32(l, 2)?);
        c.set(l, 0, u32::from(bf16_rn(a)) << 16 | u32::from(bf16_rn(b)))?;
    }
    Ok(Step::Next)
}
