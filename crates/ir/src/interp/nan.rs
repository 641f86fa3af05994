//! The NaN bit patterns float operations produce, as measured on an H200 (driver
//! 580.159.04) with PTX kernels run from their inputs in memory.
//!
//! - f32, f16 and bf16 arithmetic — `neg`, `abs` and `min`/`max` of two NaNs
//!   included — returns the canonical NaN (all exponent and fraction bits set, sign
//!   clear: 0x7fffffff, 0x7fff).
//! - f64 arithmetic propagates a NaN operand, quietened, sign and payload kept (`neg`
//!   and `abs` too, which leave a NaN's sign alone). With several NaN operands, `fma`
//!   returns its addend's; the others returned the operand with the larger bit pattern
//!   in every case measured, which is the rule modeled. An invalid operation on
//!   non-NaN operands (`inf - inf`, `0 · inf`, `0 / 0`, `sqrt(-1)`) gives
//!   0xfff8000000000000.
//! - Conversions to or from f64, and bf16 → f32, keep the sign and the payload (shifted
//!   to the new width, truncated when narrowing) and quieten it; f32 → f16/bf16 and
//!   f16 → f32 give the target's canonical NaN. Conversions not measured (f16 ↔ bf16)
//!   are modeled as giving the canonical NaN too.

use super::softfloat::Fmt;

const F64_INVALID: u64 = 0xfff8_0000_0000_0000;

fn quiet(fmt: Fmt, bits: u64) -> u64 {
    bits | fmt.quiet_bit()
}

/// The NaN an arithmetic operation on `fmt` returns when its result is NaN, given its
/// operands in order (`a, b, c` for `fma`, whose addend is `c`).
pub(crate) fn arith(fmt: Fmt, operands: &[u64], fma: bool) -> u64 {
    if fmt != Fmt::F64 {
        return fmt.nan();
    }
    let nans = || operands.iter().copied().filter(|x| fmt.is_nan(*x));
    let addend = operands.get(2).copied().filter(|c| fma && fmt.is_nan(*c));
    match addend.or_else(|| nans().max()) {
        Some(x) => quiet(fmt, x),
        None => F64_INVALID,
    }
}

/// `r` if it is not NaN, else the NaN the GPU returns for these operands.
pub(crate) fn settle(fmt: Fmt, r: u64, operands: &[u64], fma: bool) -> u64 {
    if fmt.is_nan(r) {
        arith(fmt, operands, fma)
    } else {
        r
    }
}

/// The result of converting the NaN `a` from one float format to another.
pub(crate) fn convert(a: u64, from: Fmt, to: Fmt) -> u64 {
    let keeps_payload = from != to
        && matches!(
            (from, to),
            (_, Fmt::F64) | (Fmt::F64, _) | (Fmt::BF16, Fmt::F32)
        );
    if !keeps_payload {
        return if from == to { a } else { to.nan() };
    }
    let neg = a & from.sign_bit() != 0;
    let payload = a & (from.quiet_bit() * 2 - 1);
    let (fb, tb) = (
        from.quiet_bit().trailing_zeros(),
        to.quiet_bit().trailing_zeros(),
    );
    let payload = if tb >= fb {
        payload << (tb - fb)
    } else {
        payload >> (fb - tb)
    };
    quiet(to, to.inf(neg) | payload)
}
