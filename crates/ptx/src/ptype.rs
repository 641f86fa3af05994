//! PTX spellings of IR scalar types for the different instruction families.

use quench_ir::Scalar;

/// 8-bit integers are held in 16-bit registers (see `regs`).
pub(crate) fn is_byte(s: Scalar) -> bool {
    matches!(s, Scalar::I8 | Scalar::U8)
}

/// Type suffix of arithmetic, compares and loop counters: 8-bit integers compute as
/// 16-bit ones on their extended registers.
pub(crate) fn arith(s: Scalar) -> &'static str {
    match s {
        Scalar::I8 => "s16",
        Scalar::U8 => "u16",
        _ => s.name(),
    }
}

/// Type suffix of memory accesses, parameters and conversions: the exact width, with
/// halves and packed pairs as untyped bits.
pub(crate) fn mem(s: Scalar) -> &'static str {
    match s {
        Scalar::F16 | Scalar::BF16 => "b16",
        Scalar::F16x2 | Scalar::BF16x2 => "b32",
        _ => s.name(),
    }
}

/// Untyped bits of the register holding `s`: `b16`, `b32`, `b64`.
pub(crate) fn bits(s: Scalar) -> &'static str {
    match s.bytes() {
        1 | 2 => "b16",
        4 => "b32",
        _ => "b64",
    }
}
