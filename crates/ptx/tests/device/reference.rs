//! Plain-Rust meanings of the operations the device cases check, written from the
//! IR's definitions (not from the emitter): correctly rounded float conversions
//! (round to nearest even), wrapping and saturating integer conversions.

use quench_ir::Scalar;

/// Exponent and fraction bits of a float format.
fn format(s: Scalar) -> (u32, u32) {
    match s {
        Scalar::F16 => (5, 10),
        Scalar::BF16 => (8, 7),
        Scalar::F32 => (8, 23),
        _ => (11, 52),
    }
}

/// A float's value: NaN, ±infinity, or exactly `(-1)^neg · mag · 2^exp`.
#[derive(Clone, Copy, Debug)]
pub enum Num {
    Nan,
    Inf(bool),
    Finite { neg: bool, mag: u128, exp: i32 },
}

pub fn decode_float(s: Scalar, bits: u64) -> Num {
    let (eb, mb) = format(s);
    let neg = bits >> (eb + mb) & 1 == 1;
    let e = (bits >> mb) & ((1 << eb) - 1);
    let m = bits & ((1 << mb) - 1);
    let bias = (1i32 << (eb - 1)) - 1;
    if e == (1 << eb) - 1 {
        return if m == 0 { Num::Inf(neg) } else { Num::Nan };
    }
    if e == 0 {
        Num::Finite {
            neg,
            mag: m as u128,
            exp: 1 - bias - mb as i32,
        }
    } else {
        Num::Finite {
            neg,
            mag: (m | 1 << mb) as u128,
            exp: e as i32 - bias - mb as i32,
        }
    }
}

/// Round `(-1)^neg · mag · 2^exp` to format `s`, to nearest even.
pub fn round_float(s: Scalar, neg: bool, mag: u128, exp: i32) -> u64 {
    let (eb, mb) = format(s);
    let sign = (neg as u64) << (eb + mb);
    if mag == 0 {
        return sign;
    }
    let bias = (1i32 << (eb - 1)) - 1;
    let top = 127 - mag.leading_zeros() as i32 + exp; // exponent of the leading bit
    let min_exp = 1 - bias;
    // The result is a multiple of 2^q with at most mb+1 significant bits.
    let mut q = top.max(min_exp) - mb as i32;
    let shift = q - exp;
    let mut n = if shift <= 0 {
        mag << (-shift) as u32
    } else if shift >= 128 {
        0
    } else {
        let kept = mag >> shift;
        let rem = mag & ((1u128 << shift) - 1);
        let half = 1u128 << (shift - 1);
        kept + u128::from(rem > half || (rem == half && kept & 1 == 1))
    };
    if n >> (mb + 1) != 0 {
        n >>= 1;
        q += 1;
    }
    if n >> mb == 0 {
        return sign | n as u64; // subnormal (or zero)
    }
    let biased = q + mb as i32 + bias;
    if biased >= (1 << eb) - 1 {
        return sign | (((1u64 << eb) - 1) << mb); // infinity
    }
    sign | (biased as u64) << mb | (n as u64 & ((1 << mb) - 1))
}

fn int_range(s: Scalar) -> (i128, i128) {
    let w = s.bits();
    if s.is_signed() {
        (-(1i128 << (w - 1)), (1i128 << (w - 1)) - 1)
    } else {
        (0, (1i128 << w) - 1)
    }
}

pub fn int_value(s: Scalar, bits: u64) -> i128 {
    let w = s.bits();
    let v = if w == 64 { bits } else { bits & ((1 << w) - 1) };
    if s.is_signed() && v >> (w - 1) & 1 == 1 {
        v as i128 - (1i128 << w)
    } else {
        v as i128
    }
}

fn int_bits(s: Scalar, v: i128) -> u64 {
    let w = s.bits();
    (v as u64) & if w == 64 { u64::MAX } else { (1 << w) - 1 }
}

/// The IR's `cvt` with its default rounding (nearest even; toward zero to integers).
/// A NaN converted to an integer follows PTX ISA 9.0: 0, except from f64 or to a
/// 64-bit integer, where it is `1 << (bits - 1)`.
pub fn cvt(from: Scalar, to: Scalar, sat: bool, bits: u64) -> u64 {
    if from.is_int() {
        let v = int_value(from, bits);
        if to.is_int() {
            let (lo, hi) = int_range(to);
            return int_bits(to, if sat { v.clamp(lo, hi) } else { v });
        }
        return round_float(to, v < 0, v.unsigned_abs(), 0);
    }
    let x = decode_float(from, bits);
    if to.is_int() {
        let (lo, hi) = int_range(to);
        let v = match x {
            Num::Nan if from == Scalar::F64 || to.bits() == 64 => return 1 << (to.bits() - 1),
            Num::Nan => 0,
            Num::Inf(neg) => {
                if neg {
                    lo
                } else {
                    hi
                }
            }
            Num::Finite { neg, mag, exp } => {
                let whole = if exp >= 0 {
                    if 127 - mag.leading_zeros() as i32 + exp > 100 {
                        i128::MAX
                    } else {
                        (mag << exp) as i128
                    }
                } else if exp <= -128 {
                    0
                } else {
                    (mag >> -exp) as i128
                };
                (if neg { -whole } else { whole }).clamp(lo, hi)
            }
        };
        return int_bits(to, v);
    }
    let (eb, mb) = format(to);
    let y = match x {
        Num::Nan => ((1u64 << (eb + 1)) - 1) << (mb - 1), // the canonical quiet NaN
        Num::Inf(neg) => (neg as u64) << (eb + mb) | ((1u64 << eb) - 1) << mb,
        Num::Finite { neg, mag, exp } => round_float(to, neg, mag, exp),
    };
    if !sat {
        return y;
    }
    match decode_float(to, y) {
        Num::Nan | Num::Inf(true) => 0,
        Num::Finite { neg: true, .. } => 0,
        Num::Finite { mag: 0, .. } => 0,
        Num::Inf(false) => round_float(to, false, 1, 0),
        Num::Finite { mag, exp, .. } => {
            let one = round_float(to, false, 1, 0);
            let at_least_one = (127 - mag.leading_zeros() as i32 + exp) >= 0;
            if at_least_one {
                one
            } else {
                y
            }
        }
    }
}

#[test]
fn rounding_matches_the_hardware_formats_of_rust() {
    // f32 and f64 conversions in Rust round to nearest even: the reference must agree.
    for x in [
        1.0f64,
        0.1,
        -3.75e-40,
        1e39,
        65519.0,
        65520.0,
        5.960464477539063e-8,
        2.9802322387695312e-8,
    ] {
        assert_eq!(
            round_float_of(Scalar::F32, x),
            (x as f32).to_bits() as u64,
            "{x}"
        );
    }
    assert_eq!(round_float_of(Scalar::F16, 65519.0), 0x7BFF);
    assert_eq!(round_float_of(Scalar::F16, 65520.0), 0x7C00);
    assert_eq!(round_float_of(Scalar::F16, 5.960464477539063e-8), 0x0001);
    assert_eq!(
        round_float_of(Scalar::F16, 2.9802322387695312e-8),
        0x0000,
        "ties to even: 0"
    );
    assert_eq!(
        round_float_of(Scalar::BF16, 1.00390625),
        0x3F80,
        "ties to even"
    );
    assert_eq!(
        round_float_of(Scalar::BF16, 1.01171875),
        0x3F82,
        "ties to even, up"
    );
    assert_eq!(cvt(Scalar::I8, Scalar::U8, true, 0xFF), 0);
    assert_eq!(
        cvt(Scalar::F32, Scalar::I8, false, (-300.7f32).to_bits() as u64),
        0x80
    );
    assert_eq!(
        cvt(Scalar::F32, Scalar::U32, false, f32::NAN.to_bits() as u64),
        0
    );
    assert_eq!(
        cvt(Scalar::F32, Scalar::F32, true, 2.0f32.to_bits() as u64),
        1.0f32.to_bits() as u64
    );
}

#[cfg(test)]
fn round_float_of(s: Scalar, x: f64) -> u64 {
    match decode_float(Scalar::F64, x.to_bits()) {
        Num::Finite { neg, mag, exp } => round_float(s, neg, mag, exp),
        _ => unreachable!(),
    }
}
