//! IEEE f32 division, correctly rounded to nearest even, in integer instructions only:
//! no approximate reciprocal, so the result depends on nothing the hardware rounds.
//!
//! The operands' significands (subnormals normalized by a binary search on the leading
//! bit) are divided bit by bit into 26 quotient bits; the remainder and, for a subnormal
//! result, the bits shifted out make the sticky bit; the quotient is rounded to nearest
//! even by adding one where the guard bit is set and the rest or the last kept bit is
//! not zero, the carry running into the exponent (and to infinity past the largest
//! finite). Zeros, infinities and NaNs are chosen last, as IEEE 754 says, a NaN being
//! the canonical `0x7fffffff` the GPU's arithmetic gives. Hundreds of instructions, but
//! branch-free: for the one division a row that norms and softmaxes take.

/// The registers a division uses beside its result.
pub const SCRATCH: u32 = 13;

/// The instructions of `d = a / b` (f32, round to nearest even); `t` the scratch
/// registers, `p` a scratch predicate besides `P6`.
pub fn div_rn(d: &str, a: &str, b: &str, t: &[String], p: &str) -> Vec<(String, String)> {
    let [s, aa, ab, ea, eb, ma, mb, n, be, q, st, k, u] = std::array::from_fn(|i| t[i].as_str());
    let mut out: Vec<(String, String)> = Vec::new();
    let mut emit = |guard: &str, text: String| out.push((guard.to_string(), text));
    let p6 = "P6";
    // Sign, magnitudes, biased exponents, stored significands.
    emit("", format!("LOP3.LUT {s}, {a}, {b}, RZ, 0x3c, !PT"));
    emit("", format!("LOP3.LUT {s}, {s}, 0x80000000, RZ, 0xc0, !PT"));
    emit("", format!("LOP3.LUT {aa}, {a}, 0x7fffffff, RZ, 0xc0, !PT"));
    emit("", format!("LOP3.LUT {ab}, {b}, 0x7fffffff, RZ, 0xc0, !PT"));
    for (e, m, x, mag) in [(ea, ma, a, aa), (eb, mb, b, ab)] {
        emit("", format!("SHF.R.U32.HI {e}, RZ, 0x17, {mag}"));
        emit("", format!("LOP3.LUT {m}, {x}, 0x7fffff, RZ, 0xc0, !PT"));
        // A normal number's leading bit; a subnormal's significand shifted up to it, the
        // exponent 1 − shift.
        emit("", format!("ISETP.NE.U32.AND {p}, PT, {e}, RZ, PT"));
        emit(
            &format!("@{p} "),
            format!("LOP3.LUT {m}, {m}, 0x800000, RZ, 0xfc, !PT"),
        );
        emit("", format!("MOV {n}, RZ"));
        for step in [16u32, 8, 4, 2, 1] {
            let below = 1u32 << (24 - step);
            emit(
                "",
                format!("ISETP.GE.U32.AND {p6}, PT, {m}, {below:#x}, PT"),
            );
            emit(
                &format!("@!{p6} "),
                format!("SHF.L.U32 {m}, {m}, {step:#x}, RZ"),
            );
            emit(
                &format!("@!{p6} "),
                format!("IADD3 {n}, {n}, {step:#x}, RZ"),
            );
        }
        emit(&format!("@!{p} "), format!("IADD3 {e}, -{n}, 0x1, RZ"));
    }
    // The quotient's exponent; significands ordered so that it lies in [1, 2).
    emit("", format!("IADD3 {be}, {ea}, 0x7f, -{eb}"));
    emit("", format!("ISETP.GE.U32.AND {p6}, PT, {ma}, {mb}, PT"));
    emit(&format!("@!{p6} "), format!("IADD3 {ma}, {ma}, {ma}, RZ"));
    emit(&format!("@!{p6} "), format!("IADD3 {be}, {be}, -0x1, RZ"));
    // 26 quotient bits: 24 kept, the guard bit and one more; the remainder in `ma`.
    emit("", format!("MOV {q}, RZ"));
    for _ in 0..26 {
        emit("", format!("IADD3 {q}, {q}, {q}, RZ"));
        emit("", format!("ISETP.GE.U32.AND {p6}, PT, {ma}, {mb}, PT"));
        emit(&format!("@{p6} "), format!("IADD3 {ma}, -{mb}, {ma}, RZ"));
        emit(&format!("@{p6} "), format!("IADD3 {q}, {q}, 0x1, RZ"));
        emit("", format!("IADD3 {ma}, {ma}, {ma}, RZ"));
    }
    emit("", format!("ISETP.NE.U32.AND {p6}, PT, {ma}, RZ, PT"));
    emit("", format!("SEL {st}, RZ, 0x1, !{p6}"));
    // A subnormal result: the quotient shifted right by 1 − exponent (at most 31), what
    // falls out joining the sticky bit, the exponent field 0.
    emit("", format!("ISETP.GE.AND {p}, PT, {be}, 0x1, PT"));
    emit("", format!("IADD3 {k}, -{be}, 0x1, RZ"));
    emit("", format!("SEL {k}, RZ, {k}, {p}"));
    emit("", format!("VIMNMX.U32 {k}, {k}, 0x1f, PT"));
    emit("", format!("SHF.R.U32.HI {u}, RZ, {k}, {q}"));
    emit("", format!("SHF.L.U32 {k}, {u}, {k}, RZ"));
    emit("", format!("ISETP.NE.U32.AND {p6}, PT, {k}, {q}, PT"));
    emit(&format!("@{p6} "), format!("MOV {st}, 0x1"));
    emit("", format!("MOV {q}, {u}"));
    emit(&format!("@!{p} "), format!("MOV {be}, 0x1"));
    // Exponent field and significand (its leading bit adds the 1 the exponent lacks),
    // rounded to nearest even.
    emit("", format!("IADD3 {u}, {be}, -0x1, RZ"));
    emit("", format!("SHF.L.U32 {u}, {u}, 0x17, RZ"));
    emit("", format!("SHF.R.U32.HI {k}, RZ, 0x2, {q}"));
    emit("", format!("IADD3 {u}, {u}, {k}, RZ"));
    emit("", format!("LOP3.LUT {k}, {q}, 0x5, RZ, 0xc0, !PT"));
    emit("", format!("LOP3.LUT {k}, {k}, {st}, RZ, 0xfc, !PT"));
    emit("", format!("ISETP.NE.U32.AND {p6}, PT, {k}, RZ, PT"));
    emit("", format!("LOP3.LUT {k}, {q}, 0x2, RZ, 0xc0, !PT"));
    emit("", format!("ISETP.NE.U32.AND {p6}, PT, {k}, RZ, {p6}"));
    emit(&format!("@{p6} "), format!("IADD3 {u}, {u}, 0x1, RZ"));
    emit("", format!("ISETP.GE.AND {p6}, PT, {be}, 0xff, PT"));
    emit(&format!("@{p6} "), format!("MOV {u}, 0x7f800000"));
    emit("", format!("LOP3.LUT {d}, {u}, {s}, RZ, 0xfc, !PT"));
    // Zeros: 0 / y, x / ∞.
    let inf = "0x7f800000";
    emit("", format!("ISETP.EQ.U32.AND {p}, PT, {aa}, RZ, PT"));
    emit("", format!("ISETP.EQ.U32.AND {p6}, PT, {ab}, {inf}, PT"));
    emit("", format!("PLOP3.LUT {p6}, PT, {p}, {p6}, PT, 0xfc, 0x0"));
    emit(&format!("@{p6} "), format!("MOV {d}, {s}"));
    // Infinities: ∞ / y, x / 0.
    emit("", format!("ISETP.EQ.U32.AND {p}, PT, {aa}, {inf}, PT"));
    emit("", format!("ISETP.EQ.U32.AND {p6}, PT, {ab}, RZ, PT"));
    emit("", format!("PLOP3.LUT {p6}, PT, {p}, {p6}, PT, 0xfc, 0x0"));
    emit(
        &format!("@{p6} "),
        format!("LOP3.LUT {d}, {s}, {inf}, RZ, 0xfc, !PT"),
    );
    // NaN: a NaN operand, ∞ / ∞, 0 / 0.
    emit("", format!("ISETP.GT.U32.AND {p}, PT, {aa}, {inf}, PT"));
    emit("", format!("ISETP.GT.U32.AND {p6}, PT, {ab}, {inf}, PT"));
    emit("", format!("PLOP3.LUT {p}, PT, {p}, {p6}, PT, 0xfc, 0x0"));
    emit("", format!("ISETP.EQ.U32.AND {p6}, PT, {aa}, {inf}, PT"));
    emit("", format!("ISETP.EQ.U32.AND {p6}, PT, {ab}, {inf}, {p6}"));
    emit("", format!("PLOP3.LUT {p}, PT, {p}, {p6}, PT, 0xfc, 0x0"));
    emit("", format!("ISETP.EQ.U32.AND {p6}, PT, {aa}, RZ, PT"));
    emit("", format!("ISETP.EQ.U32.AND {p6}, PT, {ab}, RZ, {p6}"));
    emit("", format!("PLOP3.LUT {p6}, PT, {p}, {p6}, PT, 0xfc, 0x0"));
    emit(&format!("@{p6} "), format!("MOV {d}, 0x7fffffff"));
    out
}
