//! Unsigned 32-bit division by a constant without a divide instruction (sm_90 has none):
//! a shift for a power of two, else Granlund and Montgomery's multiply-high sequence for
//! invariant divisors ("Division by invariant integers using multiplication", 1994,
//! figure 4.1), exact for every 32-bit dividend.

/// How `x / d` is computed for a constant `d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `d = 2^k`: `x >> k`.
    Shift(u32),
    /// `t = hi32(m·x)`, `q = (t + ((x − t) >> 1)) >> shift`.
    Magic { m: u32, shift: u32 },
}

/// The plan for dividing by `d`, or `None` for `d = 0`.
pub fn plan(d: u32) -> Option<Plan> {
    if d == 0 {
        return None;
    }
    if d.is_power_of_two() {
        return Some(Plan::Shift(d.trailing_zeros()));
    }
    // l = ⌈log2 d⌉ ≥ 2 here; m = ⌊2^32·(2^l − d)/d⌋ + 1 fits in 32 bits.
    let l = 32 - (d - 1).leading_zeros();
    let m = (((1u64 << 32) * ((1u64 << l) - u64::from(d))) / u64::from(d) + 1) as u32;
    Some(Plan::Magic { m, shift: l - 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quotient as the emitted instructions compute it (32-bit wrapping arithmetic).
    fn quotient(p: Plan, x: u32) -> u32 {
        match p {
            Plan::Shift(k) => x >> k,
            Plan::Magic { m, shift } => {
                let t = ((u64::from(m) * u64::from(x)) >> 32) as u32;
                (t.wrapping_add(x.wrapping_sub(t) >> 1)) >> shift
            }
        }
    }

    /// Every divisor up to 2,000 and a spread of large ones, each against the dividends
    /// where a wrong magic number shows first (around multiples of `d`, the top of the
    /// range) and a pseudo-random sweep.
    #[test]
    fn quotients_are_exact() {
        let mut divisors: Vec<u32> = (1..2000).collect();
        divisors.extend([
            641,
            6700417,
            0x7fff_ffff,
            0x8000_0001,
            0xffff_fffe,
            u32::MAX,
            1_000_000_007,
        ]);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for d in divisors {
            let p = plan(d).expect("nonzero");
            let mut xs = vec![0, 1, u32::MAX, u32::MAX - 1, d - 1, d, d.saturating_add(1)];
            let top = u32::MAX - u32::MAX % d;
            xs.extend([top, top.wrapping_sub(1), top.wrapping_add(d - 1)]);
            for _ in 0..200 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                xs.push((state >> 32) as u32);
            }
            for x in xs {
                assert_eq!(quotient(p, x), x / d, "{x} / {d} with {p:?}");
            }
        }
        assert_eq!(plan(0), None);
    }

    #[test]
    fn a_wrong_magic_number_is_caught() {
        let Some(Plan::Magic { m, shift }) = plan(9) else {
            panic!("9 takes the multiply")
        };
        let wrong = Plan::Magic { m: m - 1, shift };
        assert!((0..=u32::MAX)
            .step_by(9_973)
            .any(|x| quotient(wrong, x) != x / 9));
    }
}
