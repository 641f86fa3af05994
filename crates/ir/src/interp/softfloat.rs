//! Correctly rounded IEEE arithmetic in every rounding direction, for f16, bf16, f32 and
//! f64, computed with integers.
//!
//! Every operation first produces its result as `mant · 2^exp` with an integer `mant`
//! that is either exact or *rounded to odd* (truncated, lowest bit forced to 1 when
//! anything nonzero was dropped) with at least two bits below the target's last place.
//! Rounding such a value once more to the target gives the correctly rounded result in
//! every direction, so one rounding routine ([`round`]) serves all operations, formats
//! and modes, and nothing is ever rounded twice.

use crate::ops::Round;
use crate::types::Scalar;

/// A binary floating-point format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fmt {
    F16,
    BF16,
    F32,
    F64,
}

impl Fmt {
    pub(crate) fn of(s: Scalar) -> Option<Fmt> {
        match s {
            Scalar::F16 => Some(Fmt::F16),
            Scalar::BF16 => Some(Fmt::BF16),
            Scalar::F32 => Some(Fmt::F32),
            Scalar::F64 => Some(Fmt::F64),
            _ => None,
        }
    }

    /// Significand bits, the hidden bit included.
    fn prec(self) -> i32 {
        match self {
            Fmt::F16 => 11,
            Fmt::BF16 => 8,
            Fmt::F32 => 24,
            Fmt::F64 => 53,
        }
    }

    fn width(self) -> i32 {
        match self {
            Fmt::F16 | Fmt::BF16 => 16,
            Fmt::F32 => 32,
            Fmt::F64 => 64,
        }
    }

    fn frac_bits(self) -> u32 {
        (self.prec() - 1) as u32
    }

    fn bias(self) -> i32 {
        let exp_bits = self.width() - self.prec();
        (1 << (exp_bits - 1)) - 1
    }

    fn emin(self) -> i32 {
        1 - self.bias()
    }

    fn emax(self) -> i32 {
        self.bias()
    }

    pub(crate) fn sign_bit(self) -> u64 {
        1 << (self.width() - 1)
    }

    fn exp_mask(self) -> u64 {
        (self.sign_bit() - 1) & !self.frac_mask()
    }

    fn frac_mask(self) -> u64 {
        (1 << self.frac_bits()) - 1
    }

    /// The canonical NaN: all exponent and fraction bits set, sign clear.
    pub(crate) fn nan(self) -> u64 {
        self.sign_bit() - 1
    }

    /// The top fraction bit, set in quiet NaNs.
    pub(crate) fn quiet_bit(self) -> u64 {
        1 << (self.frac_bits() - 1)
    }

    pub(crate) fn inf(self, neg: bool) -> u64 {
        self.zero(neg) | self.exp_mask()
    }

    fn max_finite(self, neg: bool) -> u64 {
        self.inf(neg) - 1
    }

    pub(crate) fn zero(self, neg: bool) -> u64 {
        if neg {
            self.sign_bit()
        } else {
            0
        }
    }

    pub(crate) fn is_nan(self, bits: u64) -> bool {
        bits & self.exp_mask() == self.exp_mask() && bits & self.frac_mask() != 0
    }

    /// The value as f64 (exact for every format).
    pub(crate) fn to_f64(self, bits: u64) -> f64 {
        match self {
            Fmt::F64 => f64::from_bits(bits),
            Fmt::F32 => f32::from_bits(bits as u32) as f64,
            Fmt::F16 => half::f16::from_bits(bits as u16).to_f64(),
            Fmt::BF16 => half::bf16::from_bits(bits as u16).to_f64(),
        }
    }
}

/// `(-1)^neg · mant · 2^exp`, exact or rounded to odd (see the module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Exact {
    pub neg: bool,
    pub mant: u128,
    pub exp: i32,
}

pub(crate) enum Class {
    Nan,
    Inf(bool),
    Zero(bool),
    Num(Exact),
}

pub(crate) fn decode(fmt: Fmt, bits: u64) -> Class {
    let neg = bits & fmt.sign_bit() != 0;
    let e = ((bits & fmt.exp_mask()) >> fmt.frac_bits()) as i32;
    let f = bits & fmt.frac_mask();
    let all_ones = (fmt.exp_mask() >> fmt.frac_bits()) as i32;
    let frac_bits = fmt.frac_bits() as i32;
    if e == all_ones {
        if f != 0 {
            Class::Nan
        } else {
            Class::Inf(neg)
        }
    } else if e == 0 {
        if f == 0 {
            Class::Zero(neg)
        } else {
            Class::Num(Exact {
                neg,
                mant: f as u128,
                exp: fmt.emin() - frac_bits,
            })
        }
    } else {
        let mant = (f | (1 << frac_bits)) as u128;
        Class::Num(Exact {
            neg,
            mant,
            exp: e - fmt.bias() - frac_bits,
        })
    }
}

/// Where the dropped part of a significand lies relative to half a unit in the last place.
#[derive(PartialEq, Eq)]
enum Dropped {
    Zero,
    BelowHalf,
    Half,
    AboveHalf,
}

/// Round `x` to `fmt` in direction `mode`.
pub(crate) fn round(x: Exact, fmt: Fmt, mode: Round) -> u64 {
    if x.mant == 0 {
        return fmt.zero(x.neg);
    }
    let prec = fmt.prec();
    let nbits = 128 - x.mant.leading_zeros() as i32;
    let top = x.exp + nbits - 1;
    // Exponent of the last place kept: `prec` bits below the top, but never below the
    // subnormal range's last place.
    let mut lsb = (top - (prec - 1)).max(fmt.emin() - (prec - 1));
    let shift = lsb - x.exp;
    let (mut q, dropped) = if shift <= 0 {
        // Fewer significant bits than the format holds: exact (q < 2^prec).
        (x.mant << (-shift) as u32, Dropped::Zero)
    } else if shift > nbits {
        // Everything is dropped and the value is below half the last place.
        (0, Dropped::BelowHalf)
    } else {
        let s = shift as u32; // 1..=128
        let q = if s == 128 { 0 } else { x.mant >> s };
        let rem = if s == 128 {
            x.mant
        } else {
            x.mant & ((1u128 << s) - 1)
        };
        let half = 1u128 << (s - 1);
        let d = if rem == 0 {
            Dropped::Zero
        } else if rem < half {
            Dropped::BelowHalf
        } else if rem == half {
            Dropped::Half
        } else {
            Dropped::AboveHalf
        };
        (q, d)
    };
    let inexact = dropped != Dropped::Zero;
    let up = match mode {
        Round::Rn => dropped == Dropped::AboveHalf || (dropped == Dropped::Half && q & 1 == 1),
        Round::Rz => false,
        Round::Rp => inexact && !x.neg,
        Round::Rm => inexact && x.neg,
    };
    if up {
        q += 1;
        if q == 1u128 << prec {
            q >>= 1;
            lsb += 1;
        }
    }
    let hidden = 1u128 << (prec - 1);
    if q >= hidden && lsb + prec - 1 > fmt.emax() {
        return overflow(fmt, x.neg, mode);
    }
    let sign = fmt.zero(x.neg);
    if q < hidden {
        // Subnormal (or zero): exponent field 0.
        sign | q as u64
    } else {
        let biased = (lsb + prec - 1 + fmt.bias()) as u64;
        sign | (biased << fmt.frac_bits()) | (q as u64 & fmt.frac_mask())
    }
}

fn overflow(fmt: Fmt, neg: bool, mode: Round) -> u64 {
    let to_inf = match mode {
        Round::Rn => true,
        Round::Rz => false,
        Round::Rp => !neg,
        Round::Rm => neg,
    };
    if to_inf {
        fmt.inf(neg)
    } else {
        fmt.max_finite(neg)
    }
}

/// The sign of an exact zero sum of nonzero or differently signed terms: +0, except -0
/// when rounding toward -inf (IEEE 754 §6.3).
fn zero_sum(fmt: Fmt, mode: Round) -> u64 {
    fmt.zero(mode == Round::Rm)
}

fn top_bit(m: u128) -> i32 {
    127 - m.leading_zeros() as i32
}

/// Shift a nonzero significand of at most 126 bits so that its top bit is bit 125.
fn left_justify(x: Exact) -> Exact {
    let s = 125 - top_bit(x.mant);
    Exact {
        neg: x.neg,
        mant: x.mant << s as u32,
        exp: x.exp - s,
    }
}

/// x + y for nonzero x, y with significands of at most 107 bits; `None` for an exact
/// zero. Both are left-justified so the larger keeps at least 19 zero bits at the
/// bottom; the smaller is shifted down with the dropped bits folded into its lowest
/// bit (round to odd), which the even larger operand preserves under ±.
fn add_exact(x: Exact, y: Exact) -> Option<Exact> {
    let (x, y) = (left_justify(x), left_justify(y));
    let (big, small) = if x.exp >= y.exp { (x, y) } else { (y, x) };
    let d = (big.exp - small.exp) as u32;
    let s = if d == 0 {
        small.mant
    } else if d >= 127 {
        1
    } else {
        (small.mant >> d) | ((small.mant & ((1u128 << d) - 1) != 0) as u128)
    };
    let exp = big.exp;
    if big.neg == small.neg {
        Some(Exact {
            neg: big.neg,
            mant: big.mant + s,
            exp,
        })
    } else if big.mant > s {
        Some(Exact {
            neg: big.neg,
            mant: big.mant - s,
            exp,
        })
    } else if big.mant < s {
        Some(Exact {
            neg: small.neg,
            mant: s - big.mant,
            exp,
        })
    } else {
        None
    }
}

pub(crate) fn add(fmt: Fmt, a: u64, b: u64, mode: Round) -> u64 {
    match (decode(fmt, a), decode(fmt, b)) {
        (Class::Nan, _) | (_, Class::Nan) => fmt.nan(),
        (Class::Inf(x), Class::Inf(y)) if x != y => fmt.nan(),
        (Class::Inf(x), _) | (_, Class::Inf(x)) => fmt.inf(x),
        (Class::Zero(x), Class::Zero(y)) => {
            if x == y {
                fmt.zero(x)
            } else {
                zero_sum(fmt, mode)
            }
        }
        (Class::Zero(_), Class::Num(v)) | (Class::Num(v), Class::Zero(_)) => round(v, fmt, mode),
        (Class::Num(x), Class::Num(y)) => match add_exact(x, y) {
            Some(s) => round(s, fmt, mode),
            None => zero_sum(fmt, mode),
        },
    }
}

pub(crate) fn sub(fmt: Fmt, a: u64, b: u64, mode: Round) -> u64 {
    add(fmt, a, b ^ fmt.sign_bit(), mode)
}

pub(crate) fn mul(fmt: Fmt, a: u64, b: u64, mode: Round) -> u64 {
    let neg = (a ^ b) & fmt.sign_bit() != 0;
    match (decode(fmt, a), decode(fmt, b)) {
        (Class::Nan, _) | (_, Class::Nan) => fmt.nan(),
        (Class::Inf(_), Class::Zero(_)) | (Class::Zero(_), Class::Inf(_)) => fmt.nan(),
        (Class::Inf(_), _) | (_, Class::Inf(_)) => fmt.inf(neg),
        (Class::Zero(_), _) | (_, Class::Zero(_)) => fmt.zero(neg),
        (Class::Num(x), Class::Num(y)) => round(
            Exact {
                neg,
                mant: x.mant * y.mant,
                exp: x.exp + y.exp,
            },
            fmt,
            mode,
        ),
    }
}

/// a·b + c with a single rounding.
pub(crate) fn fma(fmt: Fmt, a: u64, b: u64, c: u64, mode: Round) -> u64 {
    let pneg = (a ^ b) & fmt.sign_bit() != 0;
    let (ca, cb, cc) = (decode(fmt, a), decode(fmt, b), decode(fmt, c));
    let product = match (ca, cb) {
        (Class::Nan, _) | (_, Class::Nan) => return fmt.nan(),
        _ if matches!(cc, Class::Nan) => return fmt.nan(),
        (Class::Inf(_), Class::Zero(_)) | (Class::Zero(_), Class::Inf(_)) => return fmt.nan(),
        (Class::Inf(_), _) | (_, Class::Inf(_)) => {
            return match cc {
                Class::Inf(n) if n != pneg => fmt.nan(),
                _ => fmt.inf(pneg),
            };
        }
        (Class::Zero(_), _) | (_, Class::Zero(_)) => None,
        (Class::Num(x), Class::Num(y)) => Some(Exact {
            neg: pneg,
            mant: x.mant * y.mant,
            exp: x.exp + y.exp,
        }),
    };
    match (product, cc) {
        (_, Class::Inf(n)) => fmt.inf(n),
        (None, Class::Zero(n)) => {
            if n == pneg {
                fmt.zero(n)
            } else {
                zero_sum(fmt, mode)
            }
        }
        (None, Class::Num(v)) => round(v, fmt, mode),
        (Some(p), Class::Zero(_)) => round(p, fmt, mode),
        (Some(p), Class::Num(v)) => match add_exact(p, v) {
            Some(s) => round(s, fmt, mode),
            None => zero_sum(fmt, mode),
        },
        (_, Class::Nan) => fmt.nan(),
    }
}

pub(crate) fn div(fmt: Fmt, a: u64, b: u64, mode: Round) -> u64 {
    let neg = (a ^ b) & fmt.sign_bit() != 0;
    match (decode(fmt, a), decode(fmt, b)) {
        (Class::Nan, _) | (_, Class::Nan) => fmt.nan(),
        (Class::Inf(_), Class::Inf(_)) | (Class::Zero(_), Class::Zero(_)) => fmt.nan(),
        (Class::Inf(_), _) | (_, Class::Zero(_)) => fmt.inf(neg),
        (_, Class::Inf(_)) | (Class::Zero(_), _) => fmt.zero(neg),
        (Class::Num(x), Class::Num(y)) => {
            // Dividend's top bit at 116, divisor's at 52: the quotient has 64 or 65 bits.
            let sa = 116 - top_bit(x.mant);
            let sb = 52 - top_bit(y.mant);
            let n = x.mant << sa as u32;
            let d = y.mant << sb as u32;
            let (q, r) = (n / d, n % d);
            let mant = q | (r != 0) as u128;
            round(
                Exact {
                    neg,
                    mant,
                    exp: (x.exp - sa) - (y.exp - sb),
                },
                fmt,
                mode,
            )
        }
    }
}

pub(crate) fn sqrt(fmt: Fmt, a: u64, mode: Round) -> u64 {
    match decode(fmt, a) {
        Class::Nan => fmt.nan(),
        Class::Zero(n) => fmt.zero(n),
        Class::Inf(true) | Class::Num(Exact { neg: true, .. }) => fmt.nan(),
        Class::Inf(false) => fmt.inf(false),
        Class::Num(x) => {
            // Top bit at 124 or 125 with an even exponent: the root has 62 or 63 bits.
            let mut s = 124 - top_bit(x.mant);
            if (x.exp - s) % 2 != 0 {
                s += 1;
            }
            let m = x.mant << s as u32;
            let r = m.isqrt();
            let mant = r | (m != r * r) as u128;
            round(
                Exact {
                    neg: false,
                    mant,
                    exp: (x.exp - s) / 2,
                },
                fmt,
                mode,
            )
        }
    }
}

/// Convert between float formats (exact when widening).
pub(crate) fn convert(a: u64, from: Fmt, to: Fmt, mode: Round) -> u64 {
    match decode(from, a) {
        Class::Nan => to.nan(),
        Class::Inf(n) => to.inf(n),
        Class::Zero(n) => to.zero(n),
        Class::Num(x) => round(x, to, mode),
    }
}

/// An integer `(-1)^neg · mag` as a float.
pub(crate) fn from_int(neg: bool, mag: u128, to: Fmt, mode: Round) -> u64 {
    round(
        Exact {
            neg,
            mant: mag,
            exp: 0,
        },
        to,
        mode,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random f64 bits spread over all exponents, with zeros, infinities, NaNs and
    /// subnormals mixed in.
    fn any_f64(rng: &mut ChaCha8Rng) -> u64 {
        match rng.gen_range(0..20) {
            0 => [0, 1 << 63, 0x7ff0 << 48, 0xfff0 << 48, 0x7ff8 << 48][rng.gen_range(0..5)],
            1 => rng.gen::<u64>() & 0x800f_ffff_ffff_ffff,
            _ => rng.gen(),
        }
    }

    fn any_f32(rng: &mut ChaCha8Rng) -> u32 {
        match rng.gen_range(0..20) {
            0 => [0, 1 << 31, 0x7f80_0000, 0xff80_0000, 0x7fc0_0000][rng.gen_range(0..5)],
            1 => rng.gen::<u32>() & 0x807f_ffff,
            2 => (rng.gen::<u32>() & 0x80ff_ffff) | 0x3f00_0000,
            _ => rng.gen(),
        }
    }

    fn same64(soft: u64, native: f64) -> bool {
        if native.is_nan() {
            Fmt::F64.is_nan(soft)
        } else {
            soft == native.to_bits()
        }
    }

    fn same32(soft: u64, native: f32) -> bool {
        if native.is_nan() {
            Fmt::F32.is_nan(soft)
        } else {
            soft == native.to_bits() as u64
        }
    }

    /// Round to nearest must agree bit for bit with the host's IEEE arithmetic.
    #[test]
    fn nearest_matches_host_f64() {
        let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
        for _ in 0..20_000 {
            let (a, b, c) = (any_f64(&mut rng), any_f64(&mut rng), any_f64(&mut rng));
            let (x, y, z) = (f64::from_bits(a), f64::from_bits(b), f64::from_bits(c));
            let f = Fmt::F64;
            assert!(same64(add(f, a, b, Round::Rn), x + y), "{x:e} + {y:e}");
            assert!(same64(sub(f, a, b, Round::Rn), x - y), "{x:e} - {y:e}");
            assert!(same64(mul(f, a, b, Round::Rn), x * y), "{x:e} * {y:e}");
            assert!(same64(div(f, a, b, Round::Rn), x / y), "{x:e} / {y:e}");
            assert!(same64(sqrt(f, a, Round::Rn), x.sqrt()), "sqrt {x:e}");
            assert!(
                same64(fma(f, a, b, c, Round::Rn), x.mul_add(y, z)),
                "fma {x:e} {y:e} {z:e}"
            );
        }
    }

    #[test]
    fn nearest_matches_host_f32() {
        let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
        for _ in 0..20_000 {
            let (a, b, c) = (any_f32(&mut rng), any_f32(&mut rng), any_f32(&mut rng));
            let (x, y, z) = (f32::from_bits(a), f32::from_bits(b), f32::from_bits(c));
            let (a, b, c) = (a as u64, b as u64, c as u64);
            let f = Fmt::F32;
            assert!(same32(add(f, a, b, Round::Rn), x + y), "{x:e} + {y:e}");
            assert!(same32(mul(f, a, b, Round::Rn), x * y), "{x:e} * {y:e}");
            assert!(same32(div(f, a, b, Round::Rn), x / y), "{x:e} / {y:e}");
            assert!(same32(sqrt(f, a, Round::Rn), x.sqrt()), "sqrt {x:e}");
            assert!(
                same32(fma(f, a, b, c, Round::Rn), x.mul_add(y, z)),
                "fma {x:e} {y:e} {z:e}"
            );
            assert!(
                same64(convert(a, f, Fmt::F64, Round::Rn), x as f64),
                "widen {x:e}"
            );
            let w = f64::from_bits(any_f64(&mut rng));
            assert!(
                same32(convert(w.to_bits(), Fmt::F64, f, Round::Rn), w as f32),
                "narrow {w:e}"
            );
        }
    }

    /// Directed results are the round-to-nearest result or its neighbour on the side
    /// of the exact value, which the f64 remainder of an f32 division tells exactly.
    #[test]
    fn directed_modes_pick_the_right_neighbour() {
        let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
        let f = Fmt::F32;
        let run = |a: u64, b: u64, m: Round| div(f, a, b, m) as u32;
        for _ in 0..20_000 {
            let (a, b) = (any_f32(&mut rng) as u64, any_f32(&mut rng) as u64);
            let rn = f32::from_bits(run(a, b, Round::Rn));
            if !rn.is_finite() {
                continue;
            }
            let (x, y) = (
                f32::from_bits(a as u32) as f64,
                f32::from_bits(b as u32) as f64,
            );
            if !x.is_finite() || !y.is_finite() {
                continue;
            }
            let above = (-(rn as f64)).mul_add(y, x) * y.signum(); // sign of exact - rn
            let positive = (x > 0.0) == (y > 0.0);
            let (down, up) = if above == 0.0 {
                (rn, rn)
            } else if above > 0.0 {
                (rn, rn.next_up())
            } else {
                (rn.next_down(), rn)
            };
            let zero = if positive { down } else { up };
            assert_eq!(
                run(a, b, Round::Rm),
                down.to_bits(),
                "{x:e} / {y:e} toward -inf"
            );
            assert_eq!(
                run(a, b, Round::Rp),
                up.to_bits(),
                "{x:e} / {y:e} toward +inf"
            );
            assert_eq!(
                run(a, b, Round::Rz),
                zero.to_bits(),
                "{x:e} / {y:e} toward zero"
            );
        }
    }

    #[test]
    fn overflow_and_underflow_by_mode() {
        let f = Fmt::F32;
        let max = f32::MAX.to_bits() as u64;
        assert_eq!(add(f, max, max, Round::Rn), f.inf(false));
        assert_eq!(add(f, max, max, Round::Rz), max);
        assert_eq!(add(f, max, max, Round::Rm), max);
        assert_eq!(add(f, max, max, Round::Rp), f.inf(false));
        let tiny = 1u64; // smallest subnormal
        let half = 0.5f32.to_bits() as u64;
        assert_eq!(mul(f, tiny, half, Round::Rn), 0, "ties to even: 0");
        assert_eq!(mul(f, tiny, half, Round::Rp), 1);
        assert_eq!(
            mul(f, tiny | f.sign_bit(), half, Round::Rm),
            1 | f.sign_bit()
        );
        assert_eq!(mul(f, tiny | f.sign_bit(), half, Round::Rz), f.sign_bit());
        let one = 1f32.to_bits() as u64;
        assert_eq!(
            sub(f, one, one, Round::Rm),
            f.sign_bit(),
            "x - x is -0 toward -inf"
        );
        assert_eq!(sub(f, one, one, Round::Rn), 0);
    }
}
