//! Integer semantics: IMAD, IADD3, VIADD, LEA, SHF, LOP3, ISETP, MOV, SEL, R2UR and their
//! uniform twins. The arithmetic of carries, shifts and lookup tables follows Mesa NAK's
//! constant folder for the same SM70+ instructions (`impl Foldable for OpIAdd3` and
//! friends); operand order is nvdisasm's.

use super::exec::{lanes, Ctx, Step};
use super::inst::Operand;
use super::EmuError;

/// How many predicates follow the destination: the carry outputs of IADD3 and LEA.
fn leading_preds(c: &Ctx) -> usize {
    c.ops
        .iter()
        .skip(1)
        .take_while(|o| matches!(o, Operand::Pred { .. }))
        .count()
}

/// `IMAD[.MOV|.SHL|.IADD][.U32]`, `.WIDE[.U32]`, `.HI.U32` (with a zero addend), `.X`:
/// `d = a * b + c`.
pub fn imad(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["MOV", "SHL", "IADD", "U32", "WIDE", "HI", "X"])?;
    let (wide, hi, x, unsigned) = (
        c.inst.has("WIDE"),
        c.inst.has("HI"),
        c.inst.has("X"),
        c.inst.has("U32"),
    );
    c.arity(if x { 5 } else { 4 })?;
    if c.modified(1) || c.modified(2) {
        return Err(c.unmodelled("a modifier on a factor"));
    }
    if hi
        && (!unsigned
            || !matches!(
                c.op(3)?,
                Operand::Reg {
                    n: 255,
                    uniform: false,
                    ..
                }
            ))
    {
        return Err(c.unmodelled("IMAD.HI other than .U32 with an RZ addend"));
    }
    for l in lanes(on) {
        let (a, b) = (c.bits(l, 1)?, c.bits(l, 2)?);
        if wide {
            let p = if unsigned {
                u64::from(a) * u64::from(b)
            } else {
                (i64::from(a as i32) * i64::from(b as i32)) as u64
            };
            let d = p.wrapping_add(c.pair(l, 3)?);
            c.set_many(l, 0, &[d as u32, (d >> 32) as u32])?;
        } else if hi {
            let d = (u64::from(a) * u64::from(b)) >> 32;
            c.set(l, 0, d as u32)?;
        } else {
            let mut d = a.wrapping_mul(b).wrapping_add(c.int(l, 3)?);
            if x {
                d = d.wrapping_add(u32::from(c.pred(l, 4)?));
            }
            c.set(l, 0, d)?;
        }
    }
    Ok(Step::Next)
}

/// `IADD3 d, [p0, [p1,]] a, b, c` and `IADD3.X d, [p0, [p1,]] a, b, c, q0, q1`: the
/// 34-bit sum of three words (negated ones as `!v + 1`, inverted ones with `.X`) and the
/// carries in; `p0` is set when the sum reaches 2^32, `p1` when it reaches 2^33.
pub fn iadd3(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["X"])?;
    let x = c.inst.has("X");
    let outs = leading_preds(c);
    let first = 1 + outs;
    c.arity(first + 3 + if x { 2 } else { 0 })?;
    for l in lanes(on) {
        let mut sum = 0u64;
        for i in first..first + 3 {
            let v = c.bits(l, i)?;
            sum += match c.op(i)? {
                Operand::Reg { neg: true, .. } if !x => u64::from(!v) + 1,
                Operand::Reg { not: true, .. } if x => u64::from(!v),
                _ if c.modified(i) => {
                    return Err(c.unmodelled(format!("operand {}'s modifier", i + 1)))
                }
                _ => u64::from(v),
            };
        }
        if x {
            sum += u64::from(c.pred(l, first + 3)?) + u64::from(c.pred(l, first + 4)?);
        }
        c.set(l, 0, sum as u32)?;
        for k in 0..outs {
            c.set_pred(l, 1 + k, sum >= (1u64 << 32) << k)?;
        }
    }
    Ok(Step::Next)
}

/// `VIADD d, a, b`: `d = a + b`.
pub fn viadd(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(3)?;
    for l in lanes(on) {
        let d = c.int(l, 1)?.wrapping_add(c.int(l, 2)?);
        c.set(l, 0, d)?;
    }
    Ok(Step::Next)
}

/// `LEA d, [p,] a, b, s`: `(a << s) + b`; `LEA.HI d, [p,] a, b, a_hi, s`: the high word
/// of `(a_hi:a) << s` plus `b`; `.X` adds the carry-in predicate last. `p` is the carry
/// out; `-a` negates the shifted value, `-b` (or `~b` with `.X`) the addend.
pub fn lea(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["HI", "X"])?;
    let (hi, x) = (c.inst.has("HI"), c.inst.has("X"));
    let outs = leading_preds(c);
    if outs > 1 {
        return Err(c.unmodelled("two carry outputs"));
    }
    let a = 1 + outs;
    let n = a + 3 + usize::from(hi) + usize::from(x);
    c.arity(n)?;
    let shift_at = a + 2 + usize::from(hi);
    for l in lanes(on) {
        let s = match c.op(shift_at)? {
            &Operand::Imm(s) if (0..32).contains(&s) => s as u32,
            o => return Err(c.unmodelled(format!("shift {o:?}"))),
        };
        let lo = c.bits(l, a)?;
        let mut shifted = if hi {
            let high = c.bits(l, a + 2)?;
            ((u64::from(high) << 32 | u64::from(lo)) >> (32 - s)) as u32
        } else {
            lo << s
        };
        let mut b = c.bits(l, a + 1)?;
        let mut carry = false;
        match c.op(a)? {
            Operand::Reg { neg: true, .. } if !x => {
                let (v, o) = (!shifted).overflowing_add(1);
                shifted = v;
                carry |= o;
            }
            Operand::Reg { not: true, .. } if x => shifted = !shifted,
            _ if c.modified(a) => return Err(c.unmodelled("the shifted operand's modifier")),
            _ => {}
        }
        match c.op(a + 1)? {
            Operand::Reg { neg: true, .. } if !x => {
                let (v, o) = (!b).overflowing_add(1);
                b = v;
                carry |= o;
            }
            Operand::Reg { not: true, .. } if x => b = !b,
            _ if c.modified(a + 1) => return Err(c.unmodelled("the addend's modifier")),
            _ => {}
        }
        let (mut d, o) = shifted.overflowing_add(b);
        carry |= o;
        if x {
            let (v, o) = d.overflowing_add(u32::from(c.pred(l, n - 1)?));
            d = v;
            carry |= o;
        }
        c.set(l, 0, d)?;
        if outs == 1 {
            c.set_pred(l, 1, carry)?;
        }
    }
    Ok(Step::Next)
}

/// `SHF.{L|R}[.W].{U32|S32|U64|S64}[.HI] d, lo, shift, hi`: shifts the 64-bit `hi:lo`;
/// the count wraps with `.W`, else clamps at the type's width; `.HI` keeps the high word.
pub fn shf(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["L", "R", "W", "U32", "S32", "U64", "S64", "HI"])?;
    c.arity(4)?;
    let right = c.inst.has("R");
    if right == c.inst.has("L") {
        return Err(c.unmodelled("a direction other than one of .L and .R"));
    }
    let (bits, signed) = match c
        .inst
        .mods
        .iter()
        .find(|m| m.len() == 3)
        .map(String::as_str)
    {
        Some("U32") => (32, false),
        Some("S32") => (32, true),
        Some("U64") => (64, false),
        Some("S64") => (64, true),
        _ => return Err(c.unmodelled("no data type")),
    };
    let (wrap, hi) = (c.inst.has("W"), c.inst.has("HI"));
    for l in lanes(on) {
        let lo = c.int(l, 1)?;
        let sh = c.int(l, 2)?;
        let high = c.int(l, 3)?;
        let sh = if wrap { sh & (bits - 1) } else { sh.min(bits) };
        let x = u64::from(high) << 32 | u64::from(lo);
        let r = if right {
            if signed {
                (x as i64).checked_shr(sh).unwrap_or(x as i64 >> 63) as u64
            } else {
                x.checked_shr(sh).unwrap_or(0)
            }
        } else {
            x.checked_shl(sh).unwrap_or(0)
        };
        c.set(l, 0, if hi { (r >> 32) as u32 } else { r as u32 })?;
    }
    Ok(Step::Next)
}

/// `LOP3.LUT [p,] d, a, b, c, lut, !PT`: bit `i` of `d` is bit `(a_i << 2 | b_i << 1 | c_i)`
/// of `lut`; `p` is set when `d` is not zero. The trailing predicate must be `!PT`.
pub fn lop3(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["LUT"])?;
    if !c.inst.has("LUT") {
        return Err(c.unmodelled("LOP3 without .LUT"));
    }
    let pout = matches!(c.op(0)?, Operand::Pred { .. });
    let d = usize::from(pout);
    c.arity(d + 6)?;
    if !c.is_pt(d + 5, true) {
        return Err(c.unmodelled("a predicate input other than !PT"));
    }
    let lut = match c.op(d + 4)? {
        &Operand::Imm(v) if (0..256).contains(&v) => v as u32,
        o => return Err(c.unmodelled(format!("lookup table {o:?}"))),
    };
    for l in lanes(on) {
        let (a, b, s) = (c.int(l, d + 1)?, c.int(l, d + 2)?, c.int(l, d + 3)?);
        let mut r = 0u32;
        for bit in 0..32 {
            let idx = (a >> bit & 1) << 2 | (b >> bit & 1) << 1 | (s >> bit & 1);
            r |= (lut >> idx & 1) << bit;
        }
        c.set(l, d, r)?;
        if pout {
            c.set_pred(l, 0, r != 0)?;
        }
    }
    Ok(Step::Next)
}

/// `ISETP.cmp[.U32].{AND|OR|XOR}[.EX] p, PT, a, b, q[, low]`: `p = (a cmp b) op q`. With
/// `.EX` (the high words of a 64-bit comparison) equal high words defer to `low`, the
/// result for the low words. The second destination must be PT.
pub fn isetp(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[
        "EQ", "NE", "LT", "LE", "GT", "GE", "U32", "AND", "OR", "XOR", "EX",
    ])?;
    let ex = c.inst.has("EX");
    c.arity(if ex { 6 } else { 5 })?;
    if !c.is_pt(1, false) {
        return Err(c.unmodelled("a second predicate destination other than PT"));
    }
    let cmp = c.inst.mods.first().cloned().unwrap_or_default();
    let unsigned = c.inst.has("U32");
    let combine = ["AND", "OR", "XOR"]
        .into_iter()
        .find(|m| c.inst.has(m))
        .ok_or_else(|| c.unmodelled("no .AND/.OR/.XOR"))?;
    for l in lanes(on) {
        let (a, b) = (c.int(l, 2)?, c.int(l, 3)?);
        let ord = if unsigned {
            a.cmp(&b)
        } else {
            (a as i32).cmp(&(b as i32))
        };
        use std::cmp::Ordering::*;
        let mut r = match cmp.as_str() {
            "EQ" => ord == Equal,
            "NE" => ord != Equal,
            "LT" => ord == Less,
            "LE" => ord != Greater,
            "GT" => ord == Greater,
            "GE" => ord != Less,
            m => return Err(c.unmodelled(format!("comparison .{m}"))),
        };
        if ex && a == b {
            r = c.pred(l, 5)?;
        }
        let q = c.pred(l, 4)?;
        let v = combine_preds(combine, r, q);
        c.set_pred(l, 0, v)?;
    }
    Ok(Step::Next)
}

/// `MOV d, a` (a lane mask operand is refused).
pub fn mov(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(2)?;
    for l in lanes(on) {
        let v = c.int(l, 1)?;
        c.set(l, 0, v)?;
    }
    Ok(Step::Next)
}

/// `SEL d, a, b, p`: `p ? a : b`.
pub fn sel(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(4)?;
    for l in lanes(on) {
        let v = if c.pred(l, 3)? {
            c.int(l, 1)?
        } else {
            c.int(l, 2)?
        };
        c.set(l, 0, v)?;
    }
    Ok(Step::Next)
}

/// `R2UR ud, r`: a register that must hold one value in every active lane, copied to a
/// uniform register; different values are an error rather than a pick.
pub fn r2ur(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(2)?;
    let (uniform, n) = c.dst(0)?;
    if !uniform {
        return Err(c.unmodelled("a non-uniform destination"));
    }
    let mut value = None;
    for l in lanes(on) {
        let v = c.int(l, 1)?;
        if value.is_some_and(|u| u != v) {
            return Err(EmuError::Divergent {
                at: c.inst.addr,
                why: "R2UR of a register whose value differs between lanes".into(),
            });
        }
        value = Some(v);
    }
    if let (Some(v), Some(l)) = (value, lanes(on).next()) {
        c.set_reg(l, true, n, v);
    }
    Ok(Step::Next)
}

/// `VIMNMX[.U32] d, a, b, p`: the minimum when `p` holds, else the maximum (ptxas writes
/// `min.u32` as `VIMNMX.U32 d, a, b, PT` and `max.u32` with `!PT`), signed without `.U32`.
pub fn vimnmx(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["U32"])?;
    c.arity(4)?;
    let unsigned = c.inst.has("U32");
    for l in lanes(on) {
        let (a, b, min) = (c.int(l, 1)?, c.int(l, 2)?, c.pred(l, 3)?);
        let a_less = if unsigned {
            a < b
        } else {
            (a as i32) < (b as i32)
        };
        c.set(l, 0, if a_less == min { a } else { b })?;
    }
    Ok(Step::Next)
}

/// `PLOP3.LUT p, q, a, b, c, lut_p, lut_q`: each destination is its table looked up at
/// `a << 2 | b << 1 | c`, the index LOP3 uses.
pub fn plop3(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["LUT"])?;
    c.arity(7)?;
    let mut luts = [0u32; 2];
    for (k, lut) in luts.iter_mut().enumerate() {
        *lut = match c.op(5 + k)? {
            &Operand::Imm(v) if (0..256).contains(&v) => v as u32,
            o => return Err(c.unmodelled(format!("lookup table {o:?}"))),
        };
    }
    for l in lanes(on) {
        let idx = u32::from(c.pred(l, 2)?) << 2
            | u32::from(c.pred(l, 3)?) << 1
            | u32::from(c.pred(l, 4)?);
        for (k, lut) in luts.iter().enumerate() {
            c.set_pred(l, k, lut >> idx & 1 == 1)?;
        }
    }
    Ok(Step::Next)
}

/// `VIADDMNMX[.U32] d, a, b, c, p`: `min(a + b, c)` when `p` holds, else the maximum (ptxas
/// fuses `add.u32` then `min.u32` into `VIADDMNMX.U32 d, a, b, c, PT`, `max` with `!PT`).
pub fn viaddmnmx(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["U32"])?;
    if !c.inst.has("U32") {
        return Err(c.unmodelled("the signed form"));
    }
    c.arity(5)?;
    for l in lanes(on) {
        let sum = c.int(l, 1)?.wrapping_add(c.int(l, 2)?);
        let (bound, min) = (c.int(l, 3)?, c.pred(l, 4)?);
        c.set(l, 0, if min { sum.min(bound) } else { sum.max(bound) })?;
    }
    Ok(Step::Next)
}

/// `PRMT d, a, sel, b` (PTX's `prmt.b32 d, a, b, sel`, default mode): byte `i` of `d` is
/// byte `sel[i] & 7` of the eight bytes `b:a`, or that byte's sign bit replicated when
/// `sel[i] & 8`, where `sel[i]` is the `i`-th nibble of the selector.
pub fn prmt(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(4)?;
    for l in lanes(on) {
        let (a, sel, b) = (c.int(l, 1)?, c.int(l, 2)?, c.int(l, 3)?);
        let bytes = u64::from(b) << 32 | u64::from(a);
        let mut d = 0u32;
        for i in 0..4 {
            let s = sel >> (4 * i) & 0xf;
            let byte = (bytes >> (8 * (s & 7)) & 0xff) as u32;
            let byte = if s & 8 != 0 {
                if byte & 0x80 != 0 {
                    0xff
                } else {
                    0
                }
            } else {
                byte
            };
            d |= byte << (8 * i);
        }
        c.set(l, 0, d)?;
    }
    Ok(Step::Next)
}

/// `IDP.4A.{S8|U8}.{S8|U8} d, a, b, c`: `c` plus the four products of `a`'s and `b`'s
/// bytes, byte `i` with byte `i`, each operand's bytes signed or unsigned as its modifier
/// says (PTX's `dp4a`), the sum wrapping in 32 bits.
pub fn idp(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    let mods: Vec<&str> = c.inst.mods.iter().map(String::as_str).collect();
    let (a_signed, b_signed) = match mods[..] {
        ["4A", a, b] if [a, b].iter().all(|m| matches!(*m, "S8" | "U8")) => (a == "S8", b == "S8"),
        _ => return Err(c.unmodelled(format!("IDP.{}", mods.join(".")))),
    };
    c.arity(4)?;
    let byte = |w: u32, i: u32, signed: bool| {
        let v = (w >> (8 * i)) & 0xff;
        if signed {
            v as u8 as i8 as i32
        } else {
            v as i32
        }
    };
    for l in lanes(on) {
        let (a, b, acc) = (c.int(l, 1)?, c.int(l, 2)?, c.int(l, 3)?);
        let sum = (0..4).fold(acc as i32, |s, i| {
            s.wrapping_add(byte(a, i, a_signed).wrapping_mul(byte(b, i, b_signed)))
        });
        c.set(l, 0, sum as u32)?;
    }
    Ok(Step::Next)
}

/// A compare's result `r` joined with the predicate operand `q` by the instruction's
/// `.AND`, `.OR` or `.XOR` (ISETP, FSETP).
pub fn combine_preds(combine: &str, r: bool, q: bool) -> bool {
    match combine {
        "AND" => r && q,
        "OR" => r || q,
        _ => r != q,
    }
}
