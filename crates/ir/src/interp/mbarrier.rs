//! mbarrier objects in shared memory: arrival counts and phases.
//!
//! A barrier initialized with `count` expects that many arrivals a phase; the arrival that
//! completes them completes the phase and opens the next, expecting `count` again. A
//! wait for parity `p` passes once the phase of parity `p` before the current one has
//! completed, that is while the current phase's parity differs from `p`; otherwise the
//! warp blocks and the block runs its other warps (see `block`). The objects live beside
//! the shared bytes (the interpreter does not model their 8-byte encoding), keyed by
//! offset and cleared with the block's shared memory.

use super::block::BlockCtx;
use super::cp_async;
use super::exec::{resolve, Loc};
use super::program::CInst;
use super::warp::{lanes, Warp};
use super::InterpError;
use crate::func::Value;

/// Most arrivals a phase may expect (2^20 − 1).
const MAX_COUNT: u64 = (1 << 20) - 1;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Mbar {
    expected: u32,
    pending: u32,
    /// Phases completed so far: the current phase's parity is its low bit.
    phases: u64,
}

/// The shared-memory offset of lane `l`'s barrier operand (8 bytes, 8-byte aligned).
fn locate(ctx: &BlockCtx, w: &Warp, ci: &CInst, l: u32, bar: Value) -> Result<usize, InterpError> {
    match resolve(ctx, w, ci, l, bar, 8, 8)? {
        Loc::Shared(i) => Ok(i),
        Loc::Global(_) => Err(ctx.bad_inst(w.index, ci, "an mbarrier lives in shared memory")),
    }
}

pub(crate) fn init(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    (bar, count): (Value, Value),
) -> Result<(), InterpError> {
    let ci_count = ctx.prog.info(count);
    for l in lanes(active) {
        let i = locate(ctx, w, ci, l, bar)?;
        let n = w.regs.get(ci_count, 0, l);
        if !(1..=MAX_COUNT).contains(&n) {
            return Err(ctx.bad_inst(
                w.index,
                ci,
                format!("lane {l}: an mbarrier expects 1 to {MAX_COUNT} arrivals, not {n}"),
            ));
        }
        let m = Mbar {
            expected: n as u32,
            pending: n as u32,
            phases: 0,
        };
        ctx.shared.mbarriers.insert(i, m);
    }
    Ok(())
}

fn arrive_at(ctx: &mut BlockCtx, w: &Warp, ci: &CInst, i: usize) -> Result<(), InterpError> {
    let Some(m) = ctx.shared.mbarriers.get_mut(&i) else {
        return Err(ctx.bad_inst(
            w.index,
            ci,
            format!("arrival on shared offset {i:#x}, where no mbarrier was initialized"),
        ));
    };
    m.pending -= 1;
    if m.pending == 0 {
        m.phases += 1;
        m.pending = m.expected;
    }
    Ok(())
}

/// `mbarrier.arrive` (`land_copies` false) or `cp.async.mbarrier.arrive.noinc` (true:
/// each lane's copies land first).
pub(crate) fn arrive(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    (bar, land_copies): (Value, bool),
) -> Result<(), InterpError> {
    for l in lanes(active) {
        let i = locate(ctx, w, ci, l, bar)?;
        if land_copies {
            cp_async::complete_all(ctx, w, ci, l)?;
        }
        arrive_at(ctx, w, ci, i)?;
    }
    Ok(())
}

/// Whether every active lane's wait for `parity` passes now.
pub(crate) fn wait_passes(
    ctx: &BlockCtx,
    w: &Warp,
    ci: &CInst,
    active: u32,
    (bar, parity): (Value, Value),
) -> Result<bool, InterpError> {
    let pi = ctx.prog.info(parity);
    for l in lanes(active) {
        let i = locate(ctx, w, ci, l, bar)?;
        let Some(m) = ctx.shared.mbarriers.get(&i) else {
            return Err(ctx.bad_inst(
                w.index,
                ci,
                format!("wait on shared offset {i:#x}, where no mbarrier was initialized"),
            ));
        };
        if m.phases & 1 == w.regs.get(pi, 0, l) & 1 {
            return Ok(false);
        }
    }
    Ok(true)
}
