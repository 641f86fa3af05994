//! Asynchronous copies from global to shared memory (`cp.async`): `LDGSTS` issues a
//! copy, `LDGDEPBAR` closes the copies issued since the last one into a group counted on
//! the scoreboard it sets, and `DEPBAR.LE SBn, k` waits until at most `k` of that
//! scoreboard's groups are pending; a wait mask naming the scoreboard waits for all of
//! them. As in the interpreter, a copy is checked when it is issued (both ranges in
//! bounds and aligned) but its data moves only when a wait retires its group: reading
//! the destination before the wait sees the old contents, so a missing wait shows up as
//! a wrong value. The groups belong to the warp, as the scoreboard counting them does;
//! copies never waited for are dropped when the block ends.

use std::collections::VecDeque;

use super::exec::{lanes, Ctx, Step};
use super::inst::Operand;
use super::mem::{address, width};
use super::memory::{Memory, Shared};
use super::EmuError;

/// One lane's copy: `len` bytes from global `src` to shared `dst`, issued at `at`.
#[derive(Clone, Copy, Debug)]
struct Copy {
    at: u64,
    src: u64,
    dst: u64,
    len: usize,
}

/// A warp's copies not yet landed.
#[derive(Default)]
pub struct Copies {
    /// Issued since the last `LDGDEPBAR`.
    open: Vec<Copy>,
    /// Closed groups, oldest first, each with its scoreboard.
    groups: VecDeque<(u8, Vec<Copy>)>,
}

impl Copies {
    /// Lands the oldest groups counted on scoreboard `sb` until at most `keep` remain.
    fn retire(
        &mut self,
        sb: u8,
        keep: usize,
        global: &mut dyn Memory,
        shared: &mut Shared,
    ) -> Result<(), EmuError> {
        while self.groups.iter().filter(|(s, _)| *s == sb).count() > keep {
            let Some(i) = self.groups.iter().position(|(s, _)| *s == sb) else {
                break;
            };
            if let Some((_, group)) = self.groups.remove(i) {
                land(&group, global, shared)?;
            }
        }
        Ok(())
    }

    /// An instruction's wait mask: every group counted on a scoreboard it names lands.
    pub fn wait(
        &mut self,
        mask: u8,
        global: &mut dyn Memory,
        shared: &mut Shared,
    ) -> Result<(), EmuError> {
        for sb in 0..6 {
            if mask >> sb & 1 == 1 {
                self.retire(sb, 0, global, shared)?;
            }
        }
        Ok(())
    }
}

fn land(copies: &[Copy], global: &mut dyn Memory, shared: &mut Shared) -> Result<(), EmuError> {
    let mut buf = [0u8; 16];
    for c in copies {
        global.read(c.at, c.src, &mut buf[..c.len])?;
        shared.write(c.at, c.dst, &buf[..c.len])?;
    }
    Ok(())
}

/// `LDGSTS.E[.BYPASS][.LTC128B][.64|.128] [R+imm], desc[UR][R.64+imm]`: 4, 8 or 16
/// bytes a lane (`.BYPASS`, through L2 alone, and `.LTC128B`, an L2 prefetch hint, do
/// not change what is copied).
pub fn ldgsts(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["E", "BYPASS", "LTC128B", "64", "128"])?;
    c.arity(2)?;
    let (len, _) = width(c);
    let at = c.inst.addr;
    let mut buf = [0u8; 16];
    for l in lanes(on) {
        let dst = address(c, l, 0, false)?;
        let src = address(c, l, 1, true)?;
        // Checked now, moved later.
        c.shared.read(at, dst, &mut buf[..len])?;
        c.global.read(at, src, &mut buf[..len])?;
        c.w.copies.open.push(Copy { at, src, dst, len });
    }
    Ok(Step::Next)
}

/// `LDGDEPBAR`: closes the open copies into a group on the scoreboard it sets.
pub fn ldgdepbar(c: &mut Ctx, _on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(0)?;
    let sb = c.inst.control.write_barrier;
    if sb >= 6 {
        return Err(c.unmodelled("a group that sets no scoreboard"));
    }
    let group = std::mem::take(&mut c.w.copies.open);
    c.w.copies.groups.push_back((sb, group));
    Ok(Step::Next)
}

/// `DEPBAR.LE SBn, k`: waits until at most `k` groups on scoreboard `n` are pending.
pub fn depbar(c: &mut Ctx, _on: u32) -> Result<Step, EmuError> {
    c.only(&["LE"])?;
    c.arity(2)?;
    let (&Operand::Scoreboard(sb), &Operand::Imm(k)) = (c.op(0)?, c.op(1)?) else {
        return Err(c.unmodelled("operands other than a scoreboard and a count"));
    };
    let keep = usize::try_from(k).map_err(|_| c.unmodelled(format!("a count of {k}")))?;
    c.w.copies.retire(sb, keep, c.global, c.shared)?;
    Ok(Step::Next)
}
