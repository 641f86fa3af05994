//! Conversions between f32 and the 16-bit float formats, bit-exact with numpy.
//!
//! They are written out rather than taken from the CPU's conversion instructions because those
//! quiet signalling NaNs, while numpy (and hence the `gguf` package) keeps NaN payloads as they
//! are; checkpoints are compared bit for bit.

/// IEEE binary16 to f32. Exact for every input; NaN payloads are kept, not quieted.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h >> 10) & 0x1f;
    let man = u32::from(h & 0x3ff);
    match exp {
        // Zero or subnormal: man·2⁻²⁴, exact in f32.
        0 => f32::from_bits((man as f32 * (1.0 / 16_777_216.0)).to_bits() | sign),
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (man << 13)),
        _ => f32::from_bits(sign | ((exp + 127 - 15) << 23) | (man << 13)),
    }
}

/// f32 to IEEE binary16, rounding to nearest even. Overflow gives infinity. A NaN keeps its
/// sign and top ten payload bits (forced non-zero so that it stays a NaN).
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x007f_ffff;
    if exp == 0xff {
        let payload = (man >> 13) as u16;
        return match (man, payload) {
            (0, _) => sign | 0x7c00,
            (_, 0) => sign | 0x7c01,
            _ => sign | 0x7c00 | payload,
        };
    }
    // Exponent re-biased for f16; ≥ 31 overflows, ≤ 0 is subnormal.
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            // Below half the smallest subnormal: rounds to zero.
            return sign;
        }
        let full = man | 0x0080_0000;
        let shift = (14 - e) as u32;
        return sign | round_shift(full, shift) as u16;
    }
    // A carry out of the mantissa correctly bumps the exponent (up to infinity).
    let rounded = ((e as u32) << 10 | (man >> 13)) + round_up(man, 13) as u32;
    sign | rounded as u16
}

/// `value >> shift`, rounded to nearest even.
fn round_shift(value: u32, shift: u32) -> u32 {
    (value >> shift) + round_up(value, shift) as u32
}

/// Whether dropping the low `shift` bits of `value` rounds up under round-to-nearest-even.
fn round_up(value: u32, shift: u32) -> bool {
    let rem = value & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    rem > half || (rem == half && (value >> shift) & 1 == 1)
}

/// bfloat16 to f32: the top half of an f32.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// f32 to bfloat16, rounding to nearest even; NaNs are quieted (as ggml and `gguf` do).
pub fn f32_to_bf16(x: f32) -> u16 {
    let mut bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        bits = (bits & 0xffff_0000) | 0x0040_0000;
    }
    ((u64::from(bits) + 0x7fff + u64::from((bits >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_value() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {:#010x}", f.to_bits());
        }
    }

    #[test]
    fn f16_known_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7c01).to_bits(), 0x7f80_2000);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65519.99), 0x7bff);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0x0000);
        assert_eq!(f32_to_f16(f32::from_bits(0x3300_0001)), 0x0001);
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(f32::from_bits(0x7f80_0001)), 0x7c01);
        assert_eq!(f32_to_f16(f32::from_bits(0xffc0_0001)), 0xfe00);
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_to_f32(0xbf80), -1.0);
    }
}
