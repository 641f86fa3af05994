//! Control and warp semantics: special registers, branches, exit, the convergence
//! barriers (`BSSY`/`BSYNC`: the scheduler in [`super::run`] holds a lane at `BSYNC`
//! until every live lane `BSSY` gathered has arrived), the block barrier and shuffles.

use super::exec::{lanes, Ctx, Step};
use super::inst::{Operand, Special};
use super::EmuError;

/// `S2R r, SR_*`, `S2UR ur, SR_*`, `CS2R r, SRZ` (a zero register pair).
pub fn special(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(2)?;
    let Operand::Special(sr) = *c.op(1)? else {
        return Err(c.unmodelled("a source that is not a special register"));
    };
    if (c.inst.op == "CS2R") != (sr == Special::Zero) {
        return Err(c.unmodelled(format!("{sr:?}")));
    }
    for l in lanes(on) {
        let v = match sr {
            Special::Zero => {
                c.set_many(l, 0, &[0, 0])?;
                continue;
            }
            Special::Tid(d) => c.w.tid[l][d],
            Special::Ctaid(d) => c.env.ctaid[d],
            Special::LaneId => l as u32,
            // Launches here have no clusters: every block is rank 0 of its own.
            Special::CgaCtaId => 0,
        };
        c.set(l, 0, v)?;
    }
    Ok(Step::Next)
}

/// The instruction index of a code address inside the program.
fn target(c: &Ctx, i: usize) -> Result<usize, EmuError> {
    match c.op(i)? {
        &Operand::Label(a) if a % 16 == 0 && ((a / 16) as usize) < c.len => Ok((a / 16) as usize),
        o => Err(EmuError::Program(format!(
            "{} at {:#x}: target {o:?} is outside the code",
            c.inst.mnemonic(),
            c.inst.addr
        ))),
    }
}

/// `BRA target` for the lanes whose guard holds. `BRA.DIV mask, target` guards a
/// warp-synchronous fast path: ptxas places the converged code right after it and the
/// slow path (`WARPSYNC.COLLECTIVE`) at the target. Only the case where every lane of
/// `mask` is here is modelled (it falls through); any other is refused.
pub fn bra(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["DIV"])?;
    if c.inst.has("DIV") {
        c.arity(2)?;
        target(c, 1)?;
        let Some(l) = lanes(on).next() else {
            return Ok(Step::Next);
        };
        let mask = c.bits(l, 0)?;
        if mask != on {
            return Err(c.unmodelled(format!(
                "lanes {on:#010x} here, mask {mask:#010x}: the diverged path"
            )));
        }
        return Ok(Step::Next);
    }
    c.arity(1)?;
    let t = target(c, 0)?;
    for l in lanes(on) {
        c.w.pc[l] = t;
    }
    Ok(Step::Next)
}

pub fn exit(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(0)?;
    c.w.exited |= on;
    Ok(Step::Next)
}

/// `BSSY Bn, target`: `Bn` of each lane holds the lanes that execute it.
pub fn bssy(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    c.arity(2)?;
    let &Operand::Barrier(b) = c.op(0)? else {
        return Err(c.unmodelled("a first operand that is not a B register"));
    };
    target(c, 1)?;
    for l in lanes(on) {
        c.w.bregs[l][usize::from(b) % 16] = on;
    }
    Ok(Step::Next)
}

/// `NOP`, and `BSYNC Bn` once the scheduler has let the lanes through.
pub fn nop(c: &mut Ctx, _on: u32) -> Result<Step, EmuError> {
    c.only(&[])?;
    match (c.inst.op.as_str(), c.ops) {
        ("NOP", []) | ("BSYNC", [Operand::Barrier(_)]) => Ok(Step::Next),
        _ => Err(c.unmodelled("these operands")),
    }
}

/// The memory fences ptxas emits for `fence.acq_rel.gpu` and around atomics
/// (`MEMBAR.ALL.GPU`, `ERRBAR`, `CGAERRBAR`, `CCTL.IVALL`): nothing to do here, where
/// every store is seen by every later load the moment it is made.
pub fn fence(c: &mut Ctx, _on: u32) -> Result<Step, EmuError> {
    let mods: Vec<&str> = c.inst.mods.iter().map(String::as_str).collect();
    match (c.inst.op.as_str(), &mods[..], c.ops) {
        ("MEMBAR", ["ALL", "GPU"], []) | ("ERRBAR" | "CGAERRBAR", [], []) => Ok(Step::Next),
        ("CCTL", ["IVALL"], []) => Ok(Step::Next),
        _ => Err(c.unmodelled("this fence")),
    }
}

/// `BAR.SYNC.DEFER_BLOCKING id`: every live lane of the warp must be here.
pub fn bar(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["SYNC", "DEFER_BLOCKING"])?;
    c.arity(1)?;
    let &Operand::Imm(id) = c.op(0)? else {
        return Err(c.unmodelled("a barrier that is not an immediate"));
    };
    if on != c.w.live() {
        return Err(EmuError::Divergent {
            at: c.inst.addr,
            why: format!(
                "BAR.SYNC by lanes {on:#010x} of warp {}, whose live lanes are {:#010x}",
                c.w.index,
                c.w.live()
            ),
        });
    }
    Ok(Step::Barrier(id as u32))
}

/// `SHFL.{IDX|UP|DOWN|BFLY} p, d, a, b, c` as the PTX ISA defines `shfl.sync`: `b` the
/// lane or offset, `c` the clamp (bits 0..5) and segment mask (bits 8..13); `p` is
/// whether the source lane was in range (else `d` is the lane's own `a`). Reading a lane
/// that does not take part is an error, not a guess.
pub fn shfl(c: &mut Ctx, on: u32) -> Result<Step, EmuError> {
    c.only(&["IDX", "UP", "DOWN", "BFLY"])?;
    c.arity(5)?;
    let mode = c.inst.mods.first().cloned().unwrap_or_default();
    let mut src = [0u32; 32];
    for l in lanes(on) {
        src[l] = c.int(l, 2)?;
    }
    for l in lanes(on) {
        let (b, cv) = (c.int(l, 3)? & 0x1f, c.int(l, 4)?);
        let (clamp, seg) = (cv & 0x1f, cv >> 8 & 0x1f);
        let lane = l as i64;
        let max = i64::from((l as u32 & seg) | (clamp & !seg));
        let min = i64::from(l as u32 & seg);
        let (j, ok) = match mode.as_str() {
            "UP" => {
                let j = lane - i64::from(b);
                (j, j >= max)
            }
            "DOWN" => {
                let j = lane + i64::from(b);
                (j, j <= max)
            }
            "BFLY" => {
                let j = lane ^ i64::from(b);
                (j, j <= max)
            }
            _ => {
                let j = min | i64::from(b & !seg);
                (j, j <= max)
            }
        };
        let j = if ok { j as usize } else { l };
        if on >> j & 1 == 0 {
            return Err(EmuError::Divergent {
                at: c.inst.addr,
                why: format!("SHFL: lane {l} reads lane {j}, which does not take part"),
            });
        }
        c.set(l, 1, src[j])?;
        c.set_pred(l, 0, ok)?;
    }
    Ok(Step::Next)
}
