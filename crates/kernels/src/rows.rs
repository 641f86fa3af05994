//! How one block walks one row: the row is cut into 16-byte groups, and thread `t` of a
//! block of `threads` visits groups `t, t + threads, t + 2·threads, ...` in that order —
//! consecutive threads read consecutive 16 bytes, so every warp load is coalesced.
//!
//! The group count is known when the kernel is built, so the walk is a loop of constant
//! trip count over the groups every thread has, then one guarded step for the threads
//! that have one more.

use quench_ir::{Builder, Value};

use crate::error::KernelError;

/// Refuse a row length that is not a positive multiple of `group` elements (rows must
/// start 16-byte aligned) and a block that is not a whole number of warps in 32..=1024.
pub fn check(kernel: &str, cols: u32, group: u32, threads: u32) -> Result<(), KernelError> {
    if cols == 0 || !cols.is_multiple_of(group) {
        return Err(KernelError::unsupported(
            kernel,
            format!("cols = {cols} must be a positive multiple of {group}"),
        ));
    }
    if !threads.is_multiple_of(32) || !(32..=1024).contains(&threads) {
        return Err(KernelError::unsupported(
            kernel,
            format!("threads = {threads} must be a multiple of 32 in 32..=1024"),
        ));
    }
    Ok(())
}

/// One step of a walk: `(builder, group index, carried values) -> next carried values`.
pub type Step<'a> = &'a dyn Fn(&mut Builder, Value, &[Value]) -> Vec<Value>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowWalk {
    pub groups: u32,
    pub threads: u32,
}

impl RowWalk {
    /// Emit the walk for thread `tid`: `step(k, group, carried)` returns the new carried
    /// values; the final ones are returned.
    pub fn emit(&self, k: &mut Builder, tid: Value, init: &[Value], step: Step) -> Vec<Value> {
        let full = self.groups / self.threads;
        let rem = self.groups % self.threads;
        let threads = self.threads;
        let mut carried = init.to_vec();
        if full > 0 {
            let lo = k.const_u32(0);
            let hi = k.const_u32(full);
            let one = k.const_u32(1);
            carried = k.for_range(lo, hi, one, &carried, |k, j, c| {
                let off = k.mul_const(j, threads);
                let g = k.add(off, tid);
                step(k, g, c)
            });
        }
        if rem > 0 {
            let types: Vec<_> = carried.iter().map(|v| k.ty(*v)).collect();
            let r = k.const_u32(rem);
            let has = k.lt(tid, r);
            let before = carried.clone();
            carried = k.if_else(
                has,
                &types,
                |k| {
                    let g = k.add_const(tid, full * threads);
                    step(k, g, &before)
                },
                |_| before.clone(),
            );
        }
        carried
    }

    /// The host twin: the groups thread `t` visits, in order.
    pub fn groups_of(&self, t: u32) -> impl Iterator<Item = u32> {
        (t..self.groups).step_by(self.threads as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_is_visited_once() {
        for (groups, threads) in [(81, 64), (25, 32), (512, 256), (64, 64)] {
            let w = RowWalk { groups, threads };
            let mut seen = vec![0u32; groups as usize];
            for t in 0..threads {
                for g in w.groups_of(t) {
                    assert_eq!(g % threads, t);
                    seen[g as usize] += 1;
                }
            }
            assert!(
                seen.iter().all(|&n| n == 1),
                "groups {groups}, threads {threads}"
            );
        }
    }
}
