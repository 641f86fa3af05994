//! `cp.async`: asynchronous copies from global to shared memory.
//!
//! A copy is checked when it is issued (alignment, both ranges in bounds) but its data
//! moves only when a `cp.async.wait_group` retires its group: reading the destination
//! before waiting sees the old contents, the stalest result the GPU could give, so a
//! missing wait shows up. Each thread keeps its own queue: `commit_group` closes the
//! copies issued since the last commit into a group (possibly empty), and
//! `wait_group n` completes the oldest groups until at most `n` remain pending. Copies
//! never waited for are dropped when the block ends. A barrier does not complete them;
//! `cp.async.mbarrier.arrive` completes all of the thread's copies before it arrives.

use std::collections::VecDeque;

use super::block::BlockCtx;
use super::exec::{resolve, Loc};
use super::program::CInst;
use super::warp::{lanes, Warp};
use super::InterpError;
use crate::func::Value;
use crate::types::{AddrSpace, Type};

#[derive(Clone, Copy, Debug)]
struct Copy {
    src: u64,
    dst: usize,
    bytes: u8,
}

/// One thread's pending copies.
#[derive(Clone, Debug, Default)]
pub(crate) struct CpQueue {
    open: Vec<Copy>,
    groups: VecDeque<Vec<Copy>>,
}

impl CpQueue {
    pub fn clear(&mut self) {
        self.open.clear();
        self.groups.clear();
    }
}

pub(crate) fn issue(
    ctx: &BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    dst: Value,
    src: Value,
    bytes: u8,
) -> Result<(), InterpError> {
    if !matches!(bytes, 4 | 8 | 16) {
        return Err(ctx.bad_inst(
            w.index,
            ci,
            format!("cp.async copies 4, 8 or 16 bytes, not {bytes}"),
        ));
    }
    let spaces = (ctx.prog.ty(dst), ctx.prog.ty(src));
    if !matches!(
        spaces,
        (
            Type::Ptr(AddrSpace::Shared, _),
            Type::Ptr(AddrSpace::Global, _)
        )
    ) {
        return Err(ctx.bad_inst(
            w.index,
            ci,
            "cp.async copies from a global to a shared pointer",
        ));
    }
    let n = bytes as u64;
    for l in lanes(active) {
        let to = resolve(ctx, w, ci, l, dst, n, n)?;
        let from = resolve(ctx, w, ci, l, src, n, n)?;
        if let (Loc::Shared(dst), Loc::Global(src)) = (to, from) {
            w.cp[l as usize].open.push(Copy { src, dst, bytes });
        }
    }
    Ok(())
}

pub(crate) fn commit(w: &mut Warp, active: u32) {
    for l in lanes(active) {
        let q = &mut w.cp[l as usize];
        let group = std::mem::take(&mut q.open);
        q.groups.push_back(group);
    }
}

pub(crate) fn wait(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    active: u32,
    n: u32,
) -> Result<(), InterpError> {
    for l in lanes(active) {
        while w.cp[l as usize].groups.len() > n as usize {
            let group = w.cp[l as usize].groups.pop_front().unwrap_or_default();
            land(ctx, w, ci, l, &group)?;
        }
    }
    Ok(())
}

/// Complete every copy lane `l` has issued, committed or not (the copies before a
/// `cp.async.mbarrier.arrive`); its groups are then all retired.
pub(crate) fn complete_all(
    ctx: &mut BlockCtx,
    w: &mut Warp,
    ci: &CInst,
    l: u32,
) -> Result<(), InterpError> {
    let q = &mut w.cp[l as usize];
    let mut copies: Vec<Copy> = q.groups.drain(..).flatten().collect();
    copies.append(&mut q.open);
    land(ctx, w, ci, l, &copies)
}

/// Move the data of `copies`, issued by lane `l`.
fn land(
    ctx: &mut BlockCtx,
    w: &Warp,
    ci: &CInst,
    l: u32,
    copies: &[Copy],
) -> Result<(), InterpError> {
    for c in copies {
        let len = c.bytes as usize;
        let data =
            ctx.mem
                .slice(c.src, len as u64)
                .map_err(|detail| InterpError::GlobalOutOfBounds {
                    site: ctx.site(w.index, Some(l), ci),
                    addr: c.src,
                    bytes: len as u64,
                    detail,
                })?;
        match ctx.shared.bytes.get_mut(c.dst..c.dst + len) {
            Some(d) => d.copy_from_slice(data),
            None => {
                return Err(ctx.bad_inst(w.index, ci, "cp.async destination left shared memory"))
            }
        }
    }
    Ok(())
}
