//! IEEE f32 division and square root, correctly rounded to nearest even, in integer
//! instructions only: no approximate reciprocal or root, so the result depends on nothing
//! the hardware rounds.
//!
//! Division: the operands' significands (subnormals normalized by a binary search on the leading
//! bit) are divided bit by bit into 26 quotient bits; the remainder and, for a subnormal
//! result, the bits shifted out make the sticky bit; the quotient is rounded to nearest
//! even by adding one where the guard bit is set and the rest or the last kept bit is
//! not zero, the carry running into the exponent (and to infinity past the largest
//! finite). Zeros, infinities and NaNs are chosen last, as IEEE 754 says, a NaN being
//! the canonical `0x7fffffff` the GPU's arithmetic gives.
//!
//! Square root: the significand (normalized, doubled where the exponent is odd) gives 26
//! root bits by the restoring digit-by-digit method, two radicand bits a step; the
//! remainder is the sticky bit, the rounding as for division. −0 stays −0, +∞ stays +∞,
//! a negative number or a NaN gives the canonical NaN.
//!
//! Hundreds of instructions each, but branch-free: for the one division or root a row
//! that norms and softmaxes take.

/// The registers a division or square root uses beside its result.
pub const SCRATCH: u32 = 13;

/// The instructions of `d = a / b` (f32, round to nearest even); `t` the scratch
/// registers, `p` a scratch predicate besides `P6`.
pub fn div_rn(d: &str, a: &str, b: &str, t: &[String], p: &str) -> Vec<(String, String)> {
    let [s, aa, ab, ea, eb, ma, mb, n, be, q, st, k, u] = std::array::from_fn(|i| t[i].as_str());
    let mut o = Out::default();
    // Sign, magnitudes, biased exponents, significands with their leading bit.
    o.emit("", format!("LOP3.LUT {s}, {a}, {b}, RZ, 0x3c, !PT"));
    o.emit("", format!("LOP3.LUT {s}, {s}, 0x80000000, RZ, 0xc0, !PT"));
    o.emit("", format!("LOP3.LUT {aa}, {a}, 0x7fffffff, RZ, 0xc0, !PT"));
    o.emit("", format!("LOP3.LUT {ab}, {b}, 0x7fffffff, RZ, 0xc0, !PT"));
    o.normalize(ea, ma, a, aa, n, p);
    o.normalize(eb, mb, b, ab, n, p);
    // The quotient's exponent; significands ordered so that it lies in [1, 2).
    o.emit("", format!("IADD3 {be}, {ea}, 0x7f, -{eb}"));
    o.emit("", format!("ISETP.GE.U32.AND {P6}, PT, {ma}, {mb}, PT"));
    o.emit(&format!("@!{P6} "), format!("IADD3 {ma}, {ma}, {ma}, RZ"));
    o.emit(&format!("@!{P6} "), format!("IADD3 {be}, {be}, -0x1, RZ"));
    // 26 quotient bits: 24 kept, the guard bit and one more; the remainder in `ma`.
    o.emit("", format!("MOV {q}, RZ"));
    for _ in 0..26 {
        o.emit("", format!("IADD3 {q}, {q}, {q}, RZ"));
        o.emit("", format!("ISETP.GE.U32.AND {P6}, PT, {ma}, {mb}, PT"));
        o.emit(&format!("@{P6} "), format!("IADD3 {ma}, -{mb}, {ma}, RZ"));
        o.emit(&format!("@{P6} "), format!("IADD3 {q}, {q}, 0x1, RZ"));
        o.emit("", format!("IADD3 {ma}, {ma}, {ma}, RZ"));
    }
    o.sticky(st, ma);
    // A subnormal result: the quotient shifted right by 1 − exponent (at most 31), what
    // falls out joining the sticky bit, the exponent field 0.
    o.emit("", format!("ISETP.GE.AND {p}, PT, {be}, 0x1, PT"));
    o.emit("", format!("IADD3 {k}, -{be}, 0x1, RZ"));
    o.emit("", format!("SEL {k}, RZ, {k}, {p}"));
    o.emit("", format!("VIMNMX.U32 {k}, {k}, 0x1f, PT"));
    o.emit("", format!("SHF.R.U32.HI {u}, RZ, {k}, {q}"));
    o.emit("", format!("SHF.L.U32 {k}, {u}, {k}, RZ"));
    o.emit("", format!("ISETP.NE.U32.AND {P6}, PT, {k}, {q}, PT"));
    o.emit(&format!("@{P6} "), format!("MOV {st}, 0x1"));
    o.emit("", format!("MOV {q}, {u}"));
    o.emit(&format!("@!{p} "), format!("MOV {be}, 0x1"));
    o.round(u, be, q, st, k);
    o.emit("", format!("ISETP.GE.AND {P6}, PT, {be}, 0xff, PT"));
    o.emit(&format!("@{P6} "), format!("MOV {u}, {INF}"));
    o.emit("", format!("LOP3.LUT {d}, {u}, {s}, RZ, 0xfc, !PT"));
    // Zeros: 0 / y, x / ∞.
    o.emit("", format!("ISETP.EQ.U32.AND {p}, PT, {aa}, RZ, PT"));
    o.emit("", format!("ISETP.EQ.U32.AND {P6}, PT, {ab}, {INF}, PT"));
    o.emit("", format!("PLOP3.LUT {P6}, PT, {p}, {P6}, PT, 0xfc, 0x0"));
    o.emit(&format!("@{P6} "), format!("MOV {d}, {s}"));
    // Infinities: ∞ / y, x / 0.
    o.emit("", format!("ISETP.EQ.U32.AND {p}, PT, {aa}, {INF}, PT"));
    o.emit("", format!("ISETP.EQ.U32.AND {P6}, PT, {ab}, RZ, PT"));
    o.emit("", format!("PLOP3.LUT {P6}, PT, {p}, {P6}, PT, 0xfc, 0x0"));
    o.emit(
        &format!("@{P6} "),
        format!("LOP3.LUT {d}, {s}, {INF}, RZ, 0xfc, !PT"),
    );
    // NaN: a NaN operand, ∞ / ∞, 0 / 0.
    o.emit("", format!("ISETP.GT.U32.AND {p}, PT, {aa}, {INF}, PT"));
    o.emit("", format!("ISETP.GT.U32.AND {P6}, PT, {ab}, {INF}, PT"));
    o.emit("", format!("PLOP3.LUT {p}, PT, {p}, {P6}, PT, 0xfc, 0x0"));
    o.emit("", format!("ISETP.EQ.U32.AND {P6}, PT, {aa}, {INF}, PT"));
    o.emit("", format!("ISETP.EQ.U32.AND {P6}, PT, {ab}, {INF}, {P6}"));
    o.emit("", format!("PLOP3.LUT {p}, PT, {p}, {P6}, PT, 0xfc, 0x0"));
    o.emit("", format!("ISETP.EQ.U32.AND {P6}, PT, {aa}, RZ, PT"));
    o.emit("", format!("ISETP.EQ.U32.AND {P6}, PT, {ab}, RZ, {P6}"));
    o.emit("", format!("PLOP3.LUT {P6}, PT, {p}, {P6}, PT, 0xfc, 0x0"));
    o.emit(&format!("@{P6} "), format!("MOV {d}, {NAN}"));
    o.0
}

/// The instructions of `d = sqrt(a)` (f32, round to nearest even); `t` the scratch
/// registers, `p` a scratch predicate besides `P6`.
pub fn sqrt_rn(d: &str, a: &str, t: &[String], p: &str) -> Vec<(String, String)> {
    let [aa, e, m, n, x, rem, root, st, k, u]: [&str; 10] = std::array::from_fn(|i| t[i].as_str());
    let mut o = Out::default();
    o.emit("", format!("LOP3.LUT {aa}, {a}, 0x7fffffff, RZ, 0xc0, !PT"));
    o.normalize(e, m, a, aa, n, p);
    // An even unbiased exponent (the significand doubled where it is odd), halved.
    o.emit("", format!("IADD3 {x}, {e}, -0x7f, RZ"));
    o.emit("", format!("LOP3.LUT {k}, {x}, 0x1, RZ, 0xc0, !PT"));
    o.emit("", format!("ISETP.NE.U32.AND {P6}, PT, {k}, RZ, PT"));
    o.emit(&format!("@{P6} "), format!("IADD3 {m}, {m}, {m}, RZ"));
    o.emit(&format!("@{P6} "), format!("IADD3 {x}, {x}, -0x1, RZ"));
    o.emit("", format!("SHF.R.S32.HI {x}, RZ, 0x1, {x}"));
    o.emit("", format!("IADD3 {e}, {x}, 0x7f, RZ"));
    // The root of m·2^27 (at most 52 bits: m's 25 bits, then zeros), two bits a step,
    // 26 root bits.
    o.emit("", format!("MOV {rem}, RZ"));
    o.emit("", format!("MOV {root}, RZ"));
    for i in 0..26u32 {
        match i {
            0..=11 => {
                o.emit("", format!("SHF.R.U32.HI {k}, RZ, {:#x}, {m}", 23 - 2 * i));
                o.emit("", format!("LOP3.LUT {k}, {k}, 0x3, RZ, 0xc0, !PT"));
            }
            12 => {
                o.emit("", format!("LOP3.LUT {k}, {m}, 0x1, RZ, 0xc0, !PT"));
                o.emit("", format!("IADD3 {k}, {k}, {k}, RZ"));
            }
            _ => o.emit("", format!("MOV {k}, RZ")),
        }
        o.emit("", format!("LEA {rem}, {rem}, {k}, 0x2"));
        o.emit("", format!("SHF.L.U32 {u}, {root}, 0x2, RZ"));
        o.emit("", format!("IADD3 {u}, {u}, 0x1, RZ"));
        o.emit("", format!("IADD3 {root}, {root}, {root}, RZ"));
        o.emit("", format!("ISETP.GE.U32.AND {P6}, PT, {rem}, {u}, PT"));
        o.emit(&format!("@{P6} "), format!("IADD3 {rem}, -{u}, {rem}, RZ"));
        o.emit(&format!("@{P6} "), format!("IADD3 {root}, {root}, 0x1, RZ"));
    }
    o.sticky(st, rem);
    o.round(u, e, root, st, k);
    o.emit("", format!("MOV {d}, {u}"));
    // ±0 as it is, +∞ as it is; a NaN or anything negative but −0 gives NaN.
    o.emit("", format!("ISETP.EQ.U32.AND {P6}, PT, {aa}, RZ, PT"));
    o.emit(&format!("@{P6} "), format!("MOV {d}, {a}"));
    o.emit("", format!("ISETP.EQ.U32.AND {P6}, PT, {a}, {INF}, PT"));
    o.emit(&format!("@{P6} "), format!("MOV {d}, {INF}"));
    o.emit("", format!("ISETP.GT.U32.AND {p}, PT, {aa}, {INF}, PT"));
    o.emit(
        "",
        format!("ISETP.GT.U32.AND {P6}, PT, {a}, -0x80000000, PT"),
    );
    o.emit("", format!("PLOP3.LUT {P6}, PT, {p}, {P6}, PT, 0xfc, 0x0"));
    o.emit(&format!("@{P6} "), format!("MOV {d}, {NAN}"));
    o.0
}

/// The predicate every sequence uses for its own steps (besides the one it is given).
const P6: &str = "P6";
const INF: &str = "0x7f800000";
/// The canonical NaN of the GPU's f32 arithmetic.
const NAN: &str = "0x7fffffff";

/// Instructions as `(guard, text)`.
#[derive(Default)]
struct Out(Vec<(String, String)>);

impl Out {
    fn emit(&mut self, guard: &str, text: String) {
        self.0.push((guard.to_string(), text));
    }

    /// `e`, `m`: the biased exponent and significand of `x` (magnitude `mag`) with its
    /// leading bit at bit 23: a normal number's added, a subnormal's shifted up to it by a
    /// binary search (`n` the shift), its exponent then 1 − shift. `p` is left set where
    /// `x` is normal.
    fn normalize(&mut self, e: &str, m: &str, x: &str, mag: &str, n: &str, p: &str) {
        self.emit("", format!("SHF.R.U32.HI {e}, RZ, 0x17, {mag}"));
        self.emit("", format!("LOP3.LUT {m}, {x}, 0x7fffff, RZ, 0xc0, !PT"));
        self.emit("", format!("ISETP.NE.U32.AND {p}, PT, {e}, RZ, PT"));
        self.emit(
            &format!("@{p} "),
            format!("LOP3.LUT {m}, {m}, 0x800000, RZ, 0xfc, !PT"),
        );
        self.emit("", format!("MOV {n}, RZ"));
        for step in [16u32, 8, 4, 2, 1] {
            let below = 1u32 << (24 - step);
            self.emit(
                "",
                format!("ISETP.GE.U32.AND {P6}, PT, {m}, {below:#x}, PT"),
            );
            self.emit(
                &format!("@!{P6} "),
                format!("SHF.L.U32 {m}, {m}, {step:#x}, RZ"),
            );
            self.emit(
                &format!("@!{P6} "),
                format!("IADD3 {n}, {n}, {step:#x}, RZ"),
            );
        }
        self.emit(&format!("@!{p} "), format!("IADD3 {e}, -{n}, 0x1, RZ"));
    }

    /// `st` = 1 where the remainder `rem` is not zero, else 0.
    fn sticky(&mut self, st: &str, rem: &str) {
        self.emit("", format!("ISETP.NE.U32.AND {P6}, PT, {rem}, RZ, PT"));
        self.emit("", format!("SEL {st}, RZ, 0x1, !{P6}"));
    }

    /// `u` = the f32 bits of biased exponent `be` and the 26-bit significand `q` (leading
    /// bit at 25; its leading bit adds the 1 the exponent field lacks), rounded to nearest
    /// even with the sticky bit `st`; `k` scratch.
    fn round(&mut self, u: &str, be: &str, q: &str, st: &str, k: &str) {
        self.emit("", format!("IADD3 {u}, {be}, -0x1, RZ"));
        self.emit("", format!("SHF.L.U32 {u}, {u}, 0x17, RZ"));
        self.emit("", format!("SHF.R.U32.HI {k}, RZ, 0x2, {q}"));
        self.emit("", format!("IADD3 {u}, {u}, {k}, RZ"));
        self.emit("", format!("LOP3.LUT {k}, {q}, 0x5, RZ, 0xc0, !PT"));
        self.emit("", format!("LOP3.LUT {k}, {k}, {st}, RZ, 0xfc, !PT"));
        self.emit("", format!("ISETP.NE.U32.AND {P6}, PT, {k}, RZ, PT"));
        self.emit("", format!("LOP3.LUT {k}, {q}, 0x2, RZ, 0xc0, !PT"));
        self.emit("", format!("ISETP.NE.U32.AND {P6}, PT, {k}, RZ, {P6}"));
        self.emit(&format!("@{P6} "), format!("IADD3 {u}, {u}, 0x1, RZ"));
    }
}
