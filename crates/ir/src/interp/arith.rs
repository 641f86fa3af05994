//! Scalar semantics of the arithmetic operations on raw register bits (zero-extended to
//! 64 bits), as PTX defines them for sm_90.
//!
//! Where PTX leaves a result unspecified, the interpreter gives what an H200 gives:
//! - integer division and remainder by zero give all ones (measured for 32 and 64
//!   bits); `MIN / -1` wraps to `MIN` with remainder 0;
//! - NaN results have the bit patterns described in [`nan`](super::nan).
//!
//! Round to nearest on f32/f64 uses the host's IEEE arithmetic (which keeps
//! subnormals); every other format and rounding direction goes through
//! [`softfloat`](super::softfloat), which rounds exactly.

use super::nan;
use super::softfloat::{self as sf, Fmt};
use crate::ops::{BinOp, CmpOp, Round, UnOp};
use crate::types::Scalar;

/// Why an operation could not be evaluated.
#[derive(Debug)]
pub(crate) enum ArithError {
    /// A combination of operation and type the interpreter does not run.
    Unsupported(String),
    /// A combination the IR does not allow.
    Malformed(String),
}

type R = Result<u64, ArithError>;

fn unsupported(what: String) -> ArithError {
    ArithError::Unsupported(what)
}

pub(crate) fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Sign-extend the low `bits` bits.
pub(crate) fn sext(x: u64, bits: u32) -> i64 {
    let sh = 64 - bits;
    ((x << sh) as i64) >> sh
}

/// The value of an integer register as i128 (signed or unsigned per its type).
pub(crate) fn int_value(s: Scalar, x: u64) -> i128 {
    if s.is_signed() {
        sext(x, s.bits()) as i128
    } else {
        (x & mask(s.bits())) as i128
    }
}

fn canon32(x: f32) -> u64 {
    if x.is_nan() {
        Fmt::F32.nan()
    } else {
        x.to_bits() as u64
    }
}

/// Apply `f` to both 16-bit halves of a packed pair.
fn packed(s: Scalar, a: u64, b: u64, c: u64, f: impl Fn(Fmt, u64, u64, u64) -> R) -> R {
    let fmt = if s == Scalar::F16x2 {
        Fmt::F16
    } else {
        Fmt::BF16
    };
    let lo = f(fmt, a & 0xffff, b & 0xffff, c & 0xffff)?;
    let hi = f(fmt, a >> 16 & 0xffff, b >> 16 & 0xffff, c >> 16 & 0xffff)?;
    Ok(lo | hi << 16)
}

// ---- two-operand ------------------------------------------------------------------------

pub(crate) fn bin(op: BinOp, rnd: Option<Round>, s: Scalar, a: u64, b: u64) -> R {
    if s.is_int() {
        if rnd.is_some() {
            return Err(ArithError::Malformed(format!(
                "integer {} takes no rounding mode",
                op.name()
            )));
        }
        return Ok(int_bin(op, s, a, b));
    }
    if let Some(fmt) = Fmt::of(s) {
        return float_bin(op, rnd, fmt, a, b);
    }
    if s.is_packed() {
        return packed(s, a, b, 0, |fmt, x, y, _| float_bin(op, rnd, fmt, x, y));
    }
    match (s, op) {
        (Scalar::Pred, BinOp::And) => Ok(a & b & 1),
        (Scalar::Pred, BinOp::Or) => Ok((a | b) & 1),
        (Scalar::Pred, BinOp::Xor) => Ok((a ^ b) & 1),
        _ => Err(unsupported(format!("{} on {s}", op.name()))),
    }
}

fn int_bin(op: BinOp, s: Scalar, a: u64, b: u64) -> u64 {
    let w = s.bits();
    let m = mask(w);
    let signed = s.is_signed();
    let (x, y) = (int_value(s, a), int_value(s, b));
    let r = match op {
        BinOp::Add => a.wrapping_add(b),
        BinOp::Sub => a.wrapping_sub(b),
        BinOp::Mul => a.wrapping_mul(b),
        BinOp::MulHi => {
            if signed {
                (x.wrapping_mul(y) >> w) as u64
            } else {
                ((x as u128).wrapping_mul(y as u128) >> w) as u64
            }
        }
        BinOp::Div if y == 0 => m,
        BinOp::Rem if y == 0 => m,
        // i128 holds MIN / -1 of every width; masking wraps it back to MIN.
        BinOp::Div => (x / y) as u64,
        BinOp::Rem => (x % y) as u64,
        BinOp::Min => x.min(y) as u64,
        BinOp::Max => x.max(y) as u64,
        BinOp::And => a & b,
        BinOp::Or => a | b,
        BinOp::Xor => a ^ b,
        // Shift amounts past the width clamp to it (PTX).
        BinOp::Shl => {
            if b >= w as u64 {
                0
            } else {
                a << b
            }
        }
        BinOp::Shr => {
            let n = b.min(w as u64 - 1) as u32;
            if signed {
                (x >> n) as u64
            } else if b >= w as u64 {
                0
            } else {
                (a & m) >> n
            }
        }
    };
    r & m
}

fn float_bin(op: BinOp, rnd: Option<Round>, fmt: Fmt, a: u64, b: u64) -> R {
    match op {
        BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div => {
            let r = rnd.ok_or_else(|| {
                ArithError::Malformed(format!("float {} needs a rounding mode", op.name()))
            })?;
            Ok(float_arith(op, r, fmt, a, b))
        }
        BinOp::Min => Ok(min_max(fmt, a, b, false)),
        BinOp::Max => Ok(min_max(fmt, a, b, true)),
        _ => Err(unsupported(format!("{} on floats", op.name()))),
    }
}

fn float_arith(op: BinOp, r: Round, fmt: Fmt, a: u64, b: u64) -> u64 {
    let v = match (fmt, r) {
        (Fmt::F32, Round::Rn) => {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            (match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::Mul => x * y,
                _ => x / y,
            })
            .to_bits() as u64
        }
        (Fmt::F64, Round::Rn) => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            (match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::Mul => x * y,
                _ => x / y,
            })
            .to_bits()
        }
        _ => match op {
            BinOp::Add => sf::add(fmt, a, b, r),
            BinOp::Sub => sf::sub(fmt, a, b, r),
            BinOp::Mul => sf::mul(fmt, a, b, r),
            _ => sf::div(fmt, a, b, r),
        },
    };
    nan::settle(fmt, v, &[a, b], false)
}

/// PTX `min`/`max`: a NaN operand yields the other operand (a NaN if both are), and
/// -0 counts as less than +0 (as measured).
fn min_max(fmt: Fmt, a: u64, b: u64, max: bool) -> u64 {
    match (fmt.is_nan(a), fmt.is_nan(b)) {
        (true, true) => return nan::arith(fmt, &[a, b], false),
        (true, false) => return b,
        (false, true) => return a,
        _ => {}
    }
    let (x, y) = (fmt.to_f64(a), fmt.to_f64(b));
    let a_less = x < y || (x == y && a & fmt.sign_bit() != 0);
    if a_less != max {
        a
    } else {
        b
    }
}

// ---- fused multiply-add -------------------------------------------------------------------

/// a·b + c: one rounding for floats, the low half (`mad.lo`) for integers.
pub(crate) fn fma(rnd: Round, s: Scalar, a: u64, b: u64, c: u64) -> R {
    if s.is_int() {
        return Ok(a.wrapping_mul(b).wrapping_add(c) & mask(s.bits()));
    }
    if s.is_packed() {
        return packed(s, a, b, c, |fmt, x, y, z| {
            Ok(nan::settle(
                fmt,
                sf::fma(fmt, x, y, z, rnd),
                &[x, y, z],
                true,
            ))
        });
    }
    let Some(fmt) = Fmt::of(s) else {
        return Err(unsupported(format!("fma on {s}")));
    };
    let v = match (fmt, rnd) {
        (Fmt::F32, Round::Rn) => {
            let (x, y, z) = (
                f32::from_bits(a as u32),
                f32::from_bits(b as u32),
                f32::from_bits(c as u32),
            );
            x.mul_add(y, z).to_bits() as u64
        }
        (Fmt::F64, Round::Rn) => f64::from_bits(a)
            .mul_add(f64::from_bits(b), f64::from_bits(c))
            .to_bits(),
        _ => sf::fma(fmt, a, b, c, rnd),
    };
    Ok(nan::settle(fmt, v, &[a, b, c], true))
}

// ---- one-operand ----------------------------------------------------------------------------

/// `c + Σ a.byte[i]·b.byte[i]` modulo 2^32, each word's bytes signed or not.
pub(crate) fn dp4a(a: u32, a_signed: bool, b: u32, b_signed: bool, c: u32) -> u32 {
    let byte = |w: u32, i: u32, signed: bool| {
        let v = (w >> (8 * i)) & 0xff;
        if signed {
            v as u8 as i8 as i32
        } else {
            v as i32
        }
    };
    (0..4).fold(c, |acc, i| {
        acc.wrapping_add((byte(a, i, a_signed) * byte(b, i, b_signed)) as u32)
    })
}

pub(crate) fn un(op: UnOp, s: Scalar, a: u64) -> R {
    if op.is_approx() {
        return if s == Scalar::F32 {
            Ok(approx(op, f32::from_bits(a as u32)))
        } else {
            Err(unsupported(format!("{op:?} on {s} (only f32)")))
        };
    }
    if s.is_int() {
        let w = s.bits();
        let m = mask(w);
        return match op {
            UnOp::Neg => Ok(a.wrapping_neg() & m),
            UnOp::Abs => Ok((int_value(s, a).unsigned_abs() as u64) & m),
            UnOp::Not => Ok(!a & m),
            UnOp::Popc => Ok((a & m).count_ones() as u64),
            UnOp::Clz => Ok(((a & m).leading_zeros() - (64 - w)) as u64),
            _ => Err(unsupported(format!("{op:?} on {s}"))),
        };
    }
    if s == Scalar::Pred {
        return match op {
            UnOp::Not => Ok(!a & 1),
            _ => Err(unsupported(format!("{op:?} on pred"))),
        };
    }
    if s.is_packed() {
        return packed(s, a, 0, 0, |fmt, x, _, _| float_un(op, fmt, x));
    }
    match Fmt::of(s) {
        Some(fmt) => float_un(op, fmt, a),
        None => Err(unsupported(format!("{op:?} on {s}"))),
    }
}

fn float_un(op: UnOp, fmt: Fmt, a: u64) -> R {
    let v = match op {
        UnOp::Neg | UnOp::Abs if fmt.is_nan(a) => nan::arith(fmt, &[a], false),
        UnOp::Neg => a ^ fmt.sign_bit(),
        UnOp::Abs => a & !fmt.sign_bit(),
        UnOp::Sqrt(Round::Rn) if fmt == Fmt::F32 => {
            f32::from_bits(a as u32).sqrt().to_bits() as u64
        }
        UnOp::Sqrt(Round::Rn) if fmt == Fmt::F64 => f64::from_bits(a).sqrt().to_bits(),
        UnOp::Sqrt(r) => sf::sqrt(fmt, a, r),
        UnOp::Rcp(r) => float_arith(
            BinOp::Div,
            r,
            fmt,
            sf::from_int(false, 1, fmt, Round::Rn),
            a,
        ),
        UnOp::RoundInt(r) => round_int(fmt, a, r),
        _ => return Err(unsupported(format!("{op:?} on floats"))),
    };
    Ok(nan::settle(fmt, v, &[a], false))
}

/// Round to an integral value in the same format.
fn round_int(fmt: Fmt, a: u64, r: Round) -> u64 {
    let x = fmt.to_f64(a);
    if x.is_nan() {
        return nan::arith(fmt, &[a], false);
    }
    let y = match r {
        Round::Rn => x.round_ties_even(),
        Round::Rz => x.trunc(),
        Round::Rm => x.floor(),
        Round::Rp => x.ceil(),
    };
    // An integral value of the format is representable in it: the conversion is exact.
    sf::convert(y.to_bits(), Fmt::F64, fmt, Round::Rn)
}

fn ftz32(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// The approximate instructions, modeled as the f32 rounding of the function computed
/// in f64. `ex2`/`lg2` are `.ftz` in PTX: subnormal inputs and results become zero.
fn approx(op: UnOp, x: f32) -> u64 {
    let d = x as f64;
    let y = match op {
        UnOp::RcpApprox => (1.0 / d) as f32,
        UnOp::RsqrtApprox => (1.0 / d.sqrt()) as f32,
        UnOp::Ex2Approx => ftz32((ftz32(x) as f64).exp2() as f32),
        UnOp::Lg2Approx => (ftz32(x) as f64).log2() as f32,
        UnOp::TanhApprox => d.tanh() as f32,
        UnOp::SinApprox => d.sin() as f32,
        _ => d.cos() as f32,
    };
    canon32(y)
}

/// `div.approx.f32`, modeled as the correctly rounded quotient.
pub(crate) fn div_approx(a: u64, b: u64) -> u64 {
    canon32(f32::from_bits(a as u32) / f32::from_bits(b as u32))
}

// ---- comparison -------------------------------------------------------------------------------

/// Float comparisons are ordered (false with a NaN operand) except `ne`, which is true
/// when either operand is NaN.
pub(crate) fn cmp(op: CmpOp, s: Scalar, a: u64, b: u64) -> Result<bool, ArithError> {
    let ord = if let Some(fmt) = Fmt::of(s) {
        let (x, y) = (fmt.to_f64(a), fmt.to_f64(b));
        match x.partial_cmp(&y) {
            Some(o) => o,
            None => return Ok(op == CmpOp::Ne),
        }
    } else if s.is_int() {
        int_value(s, a).cmp(&int_value(s, b))
    } else if s == Scalar::Pred {
        (a & 1).cmp(&(b & 1))
    } else {
        return Err(unsupported(format!("comparison of {s}")));
    };
    Ok(match op {
        CmpOp::Eq => ord.is_eq(),
        CmpOp::Ne => ord.is_ne(),
        CmpOp::Lt => ord.is_lt(),
        CmpOp::Le => ord.is_le(),
        CmpOp::Gt => ord.is_gt(),
        CmpOp::Ge => ord.is_ge(),
    })
}

// ---- conversion ---------------------------------------------------------------------------------

/// `cvt`. Float→int rounds to an integer in direction `rnd` and always saturates to the
/// destination range; NaN gives 0, except from f64 or to a 64-bit integer, where it
/// gives the pattern with only the top bit set (PTX ISA 9.0). Int→int truncates or
/// extends by the source's signedness, or clamps with `sat`. Float→float with `sat`
/// clamps to [0, 1], NaN giving +0.
pub(crate) fn cvt(from: Scalar, to: Scalar, rnd: Option<Round>, sat: bool, a: u64) -> R {
    let need_rnd = || {
        rnd.ok_or_else(|| {
            ArithError::Malformed(format!("cvt {from} to {to} needs a rounding mode"))
        })
    };
    match (from.is_int(), Fmt::of(from), to.is_int(), Fmt::of(to)) {
        (true, _, true, _) => {
            let v = int_value(from, a);
            let v = if sat {
                let (lo, hi) = int_range(to);
                v.clamp(lo, hi)
            } else {
                v
            };
            Ok(v as u64 & mask(to.bits()))
        }
        (true, _, _, Some(tf)) => {
            let v = int_value(from, a);
            Ok(sf::from_int(v < 0, v.unsigned_abs(), tf, need_rnd()?))
        }
        (_, Some(ff), true, _) => {
            let r = need_rnd()?;
            let x = ff.to_f64(a);
            if x.is_nan() {
                // PTX: NaN converts to 0, except from f64 or to a 64-bit integer, where
                // it gives the pattern with only the top bit set (seen so on the H200).
                return Ok(if from == Scalar::F64 || to.bits() == 64 {
                    1u64 << (to.bits() - 1)
                } else {
                    0
                });
            }
            let i = match r {
                Round::Rn => x.round_ties_even(),
                Round::Rz => x.trunc(),
                Round::Rm => x.floor(),
                Round::Rp => x.ceil(),
            };
            let (lo, hi) = int_range(to);
            // f64 → i128 saturates, and every integral f64 inside i128's range is exact.
            Ok((i as i128).clamp(lo, hi) as u64 & mask(to.bits()))
        }
        (_, Some(ff), _, Some(tf)) => {
            let widening =
                tf == ff || matches!((ff, tf), (_, Fmt::F64) | (Fmt::F16 | Fmt::BF16, Fmt::F32));
            let r = if widening { Round::Rn } else { need_rnd()? };
            let y = if ff.is_nan(a) {
                nan::convert(a, ff, tf)
            } else {
                sf::convert(a, ff, tf, r)
            };
            Ok(if sat { saturate(tf, y) } else { y })
        }
        _ => Err(unsupported(format!("cvt from {from} to {to}"))),
    }
}

fn int_range(s: Scalar) -> (i128, i128) {
    let w = s.bits();
    if s.is_signed() {
        (-(1i128 << (w - 1)), (1i128 << (w - 1)) - 1)
    } else {
        (0, (1i128 << w) - 1)
    }
}

/// Clamp to [0, 1]; NaN and negative values (-0 included) become +0.
fn saturate(fmt: Fmt, y: u64) -> u64 {
    let x = fmt.to_f64(y);
    if x.is_nan() || x <= 0.0 {
        0
    } else if x >= 1.0 {
        sf::from_int(false, 1, fmt, Round::Rn)
    } else {
        y
    }
}

// ---- atomics ------------------------------------------------------------------------------------

/// `atom.add` on a float type, rounding to nearest. On global memory f32 flushes
/// subnormal inputs and results to zero (`atom.global.add.f32` is `.ftz` on sm_90);
/// on shared memory it keeps them, as do f64 and the 16-bit types everywhere (all as
/// measured on an H200).
pub(crate) fn atomic_fadd(s: Scalar, global: bool, old: u64, x: u64) -> R {
    match s {
        Scalar::F32 if global => {
            let (a, b) = (
                ftz32(f32::from_bits(old as u32)),
                ftz32(f32::from_bits(x as u32)),
            );
            Ok(canon32(ftz32(a + b)))
        }
        _ => bin(BinOp::Add, Some(Round::Rn), s, old, x),
    }
}
