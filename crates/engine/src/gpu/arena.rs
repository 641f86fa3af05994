//! Activation arena planning: every activation of a decode step gets an offset in one
//! allocation, and activations that are never live at the same time share bytes.
//!
//! An activation is live from the first dispatch that touches it to the last (both
//! included), or for the whole step when the host reads or writes it between steps. Two
//! activations live at a common dispatch never overlap; otherwise they may. The values
//! of one layer die before the next layer's are born, so the arena holds about one
//! layer's working set however deep the model is.
//!
//! Placement is greedy: largest first (ties: earliest first), each at the lowest aligned
//! offset that overlaps no placed activation whose lifetime meets its own.

/// One activation to place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub bytes: u64,
    /// First and last dispatch that touch it.
    pub first: usize,
    pub last: usize,
}

impl Lifetime {
    fn meets(&self, other: &Lifetime) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

/// Where each activation lives in the arena.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Bytes of the arena.
    pub bytes: u64,
    /// Offset of each activation, in the order given.
    pub offsets: Vec<u64>,
}

/// Place `values` (each offset a multiple of `align`, a power of two).
pub fn plan(values: &[Lifetime], align: u64) -> ArenaPlan {
    let round = |x: u64| x.div_ceil(align) * align;
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(values[i].bytes), values[i].first, i));
    let mut offsets = vec![0u64; values.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(values.len());
    let mut bytes = 0u64;
    for i in order {
        let v = values[i];
        // Byte ranges taken by placed activations live alongside this one, by start.
        let mut taken: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| values[j].meets(&v))
            .map(|&j| (offsets[j], offsets[j] + values[j].bytes))
            .collect();
        taken.sort_unstable();
        let mut at = 0u64;
        for (start, end) in taken {
            if at + v.bytes <= start {
                break;
            }
            at = at.max(round(end));
        }
        offsets[i] = at;
        bytes = bytes.max(at + v.bytes);
        placed.push(i);
    }
    ArenaPlan {
        bytes: round(bytes),
        offsets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn check(values: &[Lifetime], p: &ArenaPlan, align: u64) {
        for (i, a) in values.iter().enumerate() {
            assert_eq!(p.offsets[i] % align, 0);
            assert!(p.offsets[i] + a.bytes <= p.bytes);
            for (j, b) in values.iter().enumerate().skip(i + 1) {
                if a.meets(b) && a.bytes > 0 && b.bytes > 0 {
                    let (sa, sb) = (p.offsets[i], p.offsets[j]);
                    assert!(
                        sa + a.bytes <= sb || sb + b.bytes <= sa,
                        "{a:?} at {sa} and {b:?} at {sb} overlap while both live"
                    );
                }
            }
        }
    }

    #[test]
    fn values_live_together_never_overlap_and_dead_ones_are_reused() {
        let seed: u64 = rand::random();
        eprintln!("seed {seed}");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..50 {
            let n = rng.gen_range(1..60);
            let values: Vec<Lifetime> = (0..n)
                .map(|_| {
                    let first = rng.gen_range(0..40);
                    Lifetime {
                        bytes: rng.gen_range(1..5000),
                        first,
                        last: first + rng.gen_range(0..6),
                    }
                })
                .collect();
            let p = plan(&values, 256);
            check(&values, &p, 256);
            // Never more than everything side by side, never less than the busiest dispatch.
            let sum: u64 = values.iter().map(|v| v.bytes.div_ceil(256) * 256).sum();
            let peak = (0..46)
                .map(|t| {
                    values
                        .iter()
                        .filter(|v| v.first <= t && t <= v.last)
                        .map(|v| v.bytes)
                        .sum::<u64>()
                })
                .max()
                .unwrap_or(0);
            assert!(
                p.bytes <= sum && p.bytes >= peak,
                "{} vs {peak}..={sum}",
                p.bytes
            );
        }
    }

    #[test]
    fn a_chain_of_layers_needs_one_layers_worth() {
        // Twenty layers of a 1000-byte value read by the next dispatch only.
        let values: Vec<Lifetime> = (0..20)
            .map(|l| Lifetime {
                bytes: 1000,
                first: 2 * l,
                last: 2 * l + 1,
            })
            .collect();
        let p = plan(&values, 256);
        check(&values, &p, 256);
        assert_eq!(p.bytes, 1024);
    }
}
