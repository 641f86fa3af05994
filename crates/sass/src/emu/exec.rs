//! Issuing one instruction: its guard per lane, the operand reads and writes every
//! family of semantics shares (with the registers touched recorded for the scoreboard
//! check), and the table from opcode to the family that models it.

use super::inst::{Inst, Operand};
use super::memory::{Memory, Shared};
use super::warp::{RegRef, Touched, Warp, Written, PT, RZ, URZ};
use super::{control, copy, float, int, mem, tensor, EmuError};
use crate::codegen::{
    is_control_flow, FixedResult, BARRIER_STALL, CONTROL_FLOW_STALL, GUARD_LATENCY,
};

/// What the block scheduler must do after an instruction.
pub enum Step {
    Next,
    /// The warp waits at `BAR.SYNC` barrier `id`.
    Barrier(u32),
}

/// What a launch gives every block: the constant bank and the block's position.
pub struct Env<'a> {
    /// Constant bank 0: launch dimensions, the memory descriptor, the parameters.
    pub cbank: &'a [u8],
    pub ctaid: [u32; 3],
}

/// Everything one instruction may touch.
pub struct Ctx<'a> {
    pub w: &'a mut Warp,
    pub inst: &'a Inst,
    pub ops: &'a [Operand],
    pub env: &'a Env<'a>,
    pub global: &'a mut dyn Memory,
    pub shared: &'a mut Shared,
    /// The program's length in instructions (branch targets must fall inside it).
    pub len: usize,
    pub read: Vec<Touched>,
    pub wrote: Vec<Touched>,
}

/// The lanes set in `mask`.
pub fn lanes(mask: u32) -> impl Iterator<Item = usize> {
    (0..32).filter(move |l| mask >> l & 1 == 1)
}

/// The semantics of one instruction, for the lanes of the mask.
type Semantics = fn(&mut Ctx, u32) -> Result<Step, EmuError>;

/// The family that models `op`, or `None`.
fn semantics(op: &str) -> Option<Semantics> {
    Some(match op {
        "IMAD" | "UIMAD" => int::imad,
        "IADD3" | "UIADD3" => int::iadd3,
        "VIADD" => int::viadd,
        "LEA" | "ULEA" => int::lea,
        "SHF" | "USHF" => int::shf,
        "LOP3" | "ULOP3" => int::lop3,
        "ISETP" | "UISETP" => int::isetp,
        "MOV" | "UMOV" => int::mov,
        "SEL" | "USEL" => int::sel,
        "VIMNMX" => int::vimnmx,
        "VIADDMNMX" => int::viaddmnmx,
        "PRMT" => int::prmt,
        "IDP" => int::idp,
        "R2UR" => int::r2ur,
        "FADD" | "FMUL" | "FFMA" => float::arith,
        "F2FP" => float::f2fp,
        "FMNMX" => float::fmnmx,
        "HADD2" => float::hadd2,
        "MUFU" => float::mufu,
        "FSEL" => float::fsel,
        "FSETP" => float::fsetp,
        "I2FP" => float::i2fp,
        "I2F" => float::i2f,
        "F2I" => float::f2i,
        "F2F" => float::f2f,
        "DMUL" => float::dmul,
        "HFMA2" => float::hfma2,
        "PLOP3" => int::plop3,
        "LDG" | "STG" => mem::global,
        "ATOMG" => mem::atomic,
        "ATOMS" => mem::shared_cas,
        "MEMBAR" | "ERRBAR" | "CGAERRBAR" | "CCTL" => control::fence,
        "LDS" | "STS" => mem::shared,
        "LDL" | "STL" => mem::local,
        "LDC" | "ULDC" => mem::constant,
        "S2R" | "S2UR" | "CS2R" => control::special,
        "BRA" => control::bra,
        "EXIT" => control::exit,
        "BSSY" => control::bssy,
        "BSYNC" | "NOP" => control::nop,
        "BAR" => control::bar,
        "SHFL" => control::shfl,
        "LDGSTS" => copy::ldgsts,
        "LDGDEPBAR" => copy::ldgdepbar,
        "DEPBAR" => copy::depbar,
        "LDSM" => tensor::ldsm,
        "HMMA" => tensor::hmma,
        _ => return None,
    })
}

/// Whether `op` reads or writes shared or global memory (see [`BARRIER_STALL`]).
fn is_memory(op: &str) -> bool {
    matches!(
        op,
        "LDG" | "STG" | "ATOMG" | "ATOMS" | "LDS" | "STS" | "LDSM" | "LDGSTS"
    )
}

/// Whether `op` runs once per warp on the uniform datapath.
fn is_uniform(op: &str) -> bool {
    op.starts_with('U') || op == "S2UR"
}

/// Issues `inst` for the lanes of `active` (all at its address): evaluates the guard per
/// lane, advances their program counters, runs the semantics for the lanes whose guard
/// holds, and checks the registers it touched against the scoreboards.
pub fn issue(
    w: &mut Warp,
    inst: &Inst,
    active: u32,
    env: &Env,
    global: &mut dyn Memory,
    shared: &mut Shared,
    len: usize,
) -> Result<Step, EmuError> {
    let unmodelled = |detail: String| EmuError::Unmodelled {
        mnemonic: inst.mnemonic(),
        at: inst.addr,
        detail,
    };
    let f = semantics(&inst.op).ok_or_else(|| unmodelled(String::new()))?;
    let ops = inst
        .operands
        .as_ref()
        .map_err(|o| unmodelled(format!("operand {o}")))?;
    // ptxas writes URZ only in uniform-datapath instructions; what a vector instruction
    // reads from it was never measured, so it is not assumed to be zero.
    if !is_uniform(&inst.op)
        && ops
            .iter()
            .any(|o| matches!(o, Operand::Reg { uniform: true, n, .. } if *n == URZ))
    {
        return Err(unmodelled(
            "URZ as an operand of a vector instruction".into(),
        ));
    }
    if is_control_flow(&inst.op) && inst.control.stall < CONTROL_FLOW_STALL {
        return Err(EmuError::Hazard {
            at: inst.addr,
            why: format!(
                "{} with a stall of {}: a branch, BSYNC, EXIT, WARPSYNC, CALL or RET stalls \
                 {} cycles at least",
                inst.op, inst.control.stall, CONTROL_FLOW_STALL
            ),
        });
    }
    if let Some(bar) = w.barrier_at {
        if is_memory(&inst.op) && w.cycle < bar + u64::from(BARRIER_STALL) {
            return Err(EmuError::Hazard {
                at: inst.addr,
                why: format!(
                    "{} {} cycles after BAR: memory is read or written {} cycles after a \
                     barrier at the earliest",
                    inst.op,
                    w.cycle - bar,
                    BARRIER_STALL
                ),
            });
        }
    }
    if inst.op == "BAR" {
        w.barrier_at = Some(w.cycle);
    }
    w.scoreboard.wait(inst.control.wait);
    w.copies.wait(inst.control.wait, global, shared)?;
    let mut on = 0u32;
    for l in lanes(active) {
        w.pc[l] += 1;
        let holds = match inst.guard {
            None => true,
            Some(g) if g.uniform => w.up(g.pred) != g.neg,
            Some(g) => {
                guard_ready(w, inst, l, g.pred)?;
                w.p(l, g.pred) != g.neg
            }
        };
        if holds {
            on |= 1 << l;
        }
    }
    if is_uniform(&inst.op) {
        // One execution for the warp, on behalf of its lowest active lane.
        on &= on.wrapping_neg();
    }
    // The warp's buffers for the registers touched, reused from one issue to the next.
    let (mut read, mut wrote) = std::mem::take(&mut w.touched);
    read.clear();
    wrote.clear();
    let mut c = Ctx {
        w,
        inst,
        ops,
        env,
        global,
        shared,
        len,
        read,
        wrote,
    };
    c.w.predicate_latency = if inst.control.write_barrier < 6 {
        0
    } else {
        u64::from(GUARD_LATENCY)
    };
    c.w.opcode.clone_from(&inst.op);
    let step = if on == 0 { Step::Next } else { f(&mut c, on)? };
    if let Some((n, since)) = c.w.predicate_overtaken.take() {
        return Err(EmuError::Hazard {
            at: inst.addr,
            why: format!(
                "writes P{n} {since} cycles after another instruction's fixed-latency write \
                 of it that nothing read; that write may land after this one (a predicate \
                 lands {GUARD_LATENCY} cycles after its writer)"
            ),
        });
    }
    let (read, wrote) = (std::mem::take(&mut c.read), std::mem::take(&mut c.wrote));
    results_ready(c.w, inst, &read, &wrote)?;
    c.w.scoreboard.issue(inst, &read, &wrote)?;
    c.w.touched = (read, wrote);
    c.w.cycle += u64::from(inst.control.stall);
    Ok(step)
}

/// A vector register read sooner after its fixed-latency writer than ptxas's code ever
/// reads one ([`FixedResult::ready_for`]) is an error: on the GPU it reads the old value.
/// Then the registers `inst` wrote are recorded: its results if it is of fixed latency (it
/// sets no scoreboard), nothing to wait for otherwise.
fn results_ready(
    w: &mut Warp,
    inst: &Inst,
    read: &[Touched],
    wrote: &[Touched],
) -> Result<(), EmuError> {
    for &((uniform, n), lanes) in read {
        let Some(written) = w.results.get(usize::from(n)).copied().flatten() else {
            continue;
        };
        let needed = u64::from(written.result.ready_for());
        if !uniform && written.lanes & lanes != 0 && w.cycle < written.cycle + needed {
            return Err(EmuError::Hazard {
                at: inst.addr,
                why: format!(
                    "reads R{n} {} cycles after the fixed-latency instruction at {:#x} \
                     wrote it; no code reads that result sooner than {needed}",
                    w.cycle - written.cycle,
                    written.at,
                ),
            });
        }
    }
    let fixed = inst.control.write_barrier >= 6;
    let result = FixedResult::of(&inst.op);
    for &((uniform, n), lanes) in wrote {
        if let (false, Some(slot)) = (uniform, w.results.get_mut(usize::from(n))) {
            *slot = fixed.then_some(Written {
                cycle: w.cycle,
                lanes,
                result,
                at: inst.addr,
            });
        }
    }
    Ok(())
}

/// A guard read sooner after its predicate's fixed-latency writer than the hardware
/// delivers it (the emulator counts issue cycles as the stalls; waits and taken branches
/// only add to them) is an error: on the GPU it reads the old predicate.
fn guard_ready(w: &Warp, inst: &Inst, lane: usize, pred: u8) -> Result<(), EmuError> {
    // PT is never written.
    let Some(&ready) = w.guard_ready[lane].get(usize::from(pred)) else {
        return Ok(());
    };
    if w.cycle >= ready {
        return Ok(());
    }
    Err(EmuError::Hazard {
        at: inst.addr,
        why: format!(
            "guarded by P{pred} {} cycles after the instruction that wrote it; a guard reads \
             a predicate {GUARD_LATENCY} cycles after a fixed-latency write",
            w.cycle + u64::from(GUARD_LATENCY) - ready
        ),
    })
}

impl Ctx<'_> {
    pub fn unmodelled(&self, detail: impl Into<String>) -> EmuError {
        EmuError::Unmodelled {
            mnemonic: self.inst.mnemonic(),
            at: self.inst.addr,
            detail: detail.into(),
        }
    }

    /// Refuses a modifier outside `known`.
    pub fn only(&self, known: &[&str]) -> Result<(), EmuError> {
        match self.inst.mods.iter().find(|m| !known.contains(&m.as_str())) {
            Some(m) => Err(self.unmodelled(format!("modifier .{m}"))),
            None => Ok(()),
        }
    }

    /// Refuses an operand count other than `n`.
    pub fn arity(&self, n: usize) -> Result<(), EmuError> {
        if self.ops.len() == n {
            Ok(())
        } else {
            Err(self.unmodelled(format!("{} operands", self.ops.len())))
        }
    }

    pub fn op(&self, i: usize) -> Result<&Operand, EmuError> {
        self.ops
            .get(i)
            .ok_or_else(|| self.unmodelled(format!("no operand {}", i + 1)))
    }

    /// Records that register `r` was touched in `lane` (in every lane if uniform).
    fn note(list: &mut Vec<Touched>, r: RegRef, lane: usize) {
        let zero = if r.0 { URZ } else { RZ };
        if r.1 == zero {
            return;
        }
        let m = if r.0 { u32::MAX } else { 1 << lane };
        match list.iter_mut().find(|(x, _)| *x == r) {
            Some((_, lanes)) => *lanes |= m,
            None => list.push((r, m)),
        }
    }

    fn reg(&mut self, lane: usize, uniform: bool, n: u8) -> u32 {
        Self::note(&mut self.read, (uniform, n), lane);
        if uniform {
            self.w.ur(n)
        } else {
            self.w.r(lane, n)
        }
    }

    /// Register `n` (general or uniform) of `lane`.
    pub fn reg_value(&mut self, lane: usize, uniform: bool, n: u8) -> u32 {
        self.reg(lane, uniform, n)
    }

    /// The register pair `n, n + 1`, low word first; a pair at RZ or URZ reads 0.
    pub fn reg_pair(&mut self, lane: usize, uniform: bool, n: u8) -> Result<u64, EmuError> {
        let zero = if uniform { URZ } else { RZ };
        if n == zero {
            return Ok(0);
        }
        if n % 2 == 1 || n + 1 >= zero {
            return Err(self.unmodelled(format!("a register pair at register {n}")));
        }
        let lo = self.reg(lane, uniform, n);
        let hi = self.reg(lane, uniform, n + 1);
        Ok(u64::from(lo) | u64::from(hi) << 32)
    }

    /// The 32 bits of operand `i` with no modifier applied (a float immediate's bits).
    pub fn bits(&mut self, lane: usize, i: usize) -> Result<u32, EmuError> {
        match *self.op(i)? {
            Operand::Reg { uniform, n, .. } => Ok(self.reg(lane, uniform, n)),
            Operand::Imm(v) => Ok(v as u32),
            Operand::Float {
                kind: crate::syntax::Kind::F32,
                bits,
                ..
            } => Ok(bits as u32),
            Operand::Const { bank, reg, offset } => {
                let base = match reg {
                    Some(r) => i64::from(self.reg(lane, false, r)),
                    None => 0,
                };
                let v = self.constant(bank, base + offset, 4)?;
                Ok(v as u32)
            }
            o => Err(self.unmodelled(format!("operand {} as a 32-bit value ({o:?})", i + 1))),
        }
    }

    /// `len` (4 or 8) bytes of constant bank `bank` at `offset`.
    pub fn constant(&self, bank: u32, offset: i64, len: usize) -> Result<u64, EmuError> {
        let fault = EmuError::Fault {
            at: self.inst.addr,
            space: "constant",
            addr: offset as u64,
            len,
        };
        if bank != 0 {
            return Err(self.unmodelled(format!("constant bank {bank}")));
        }
        let start = usize::try_from(offset).map_err(|_| fault.clone())?;
        let end = start.checked_add(len).ok_or(fault.clone())?;
        let b = self
            .env
            .cbank
            .get(start..end)
            .filter(|_| start % len == 0)
            .ok_or(fault)?;
        let mut v = [0u8; 8];
        v[..len].copy_from_slice(b);
        Ok(u64::from_le_bytes(v))
    }

    /// Whether operand `i` carries any of `-`, `~`/`!`, `|..|`.
    pub fn modified(&self, i: usize) -> bool {
        match self.ops.get(i) {
            Some(Operand::Reg { neg, not, abs, .. }) => *neg || *not || *abs,
            Some(Operand::Float { neg, abs, .. }) => *neg || *abs,
            Some(Operand::Pred { not, .. }) => *not,
            _ => false,
        }
    }

    /// Operand `i` as an integer: `-R` negated, `~R` inverted.
    pub fn int(&mut self, lane: usize, i: usize) -> Result<u32, EmuError> {
        let v = self.bits(lane, i)?;
        match self.op(i)? {
            Operand::Reg { abs: true, .. } => Err(self.unmodelled("|R| on an integer")),
            Operand::Reg { neg: true, .. } => Ok(v.wrapping_neg()),
            Operand::Reg { not: true, .. } => Ok(!v),
            Operand::Float { .. } => Err(self.unmodelled("a float immediate as an integer")),
            _ => Ok(v),
        }
    }

    /// Operand `i` as an f32: `|x|` then `-x`, both on the sign bit alone.
    pub fn f32(&mut self, lane: usize, i: usize) -> Result<f32, EmuError> {
        let v = self.bits(lane, i)?;
        let (neg, abs) = match self.op(i)? {
            Operand::Reg { neg, abs, not, .. } => {
                if *not {
                    return Err(self.unmodelled("~R on a float"));
                }
                (*neg, *abs)
            }
            Operand::Float { neg, abs, .. } => (*neg, *abs),
            _ => (false, false),
        };
        let v = if abs { v & 0x7fff_ffff } else { v };
        Ok(f32::from_bits(if neg { v ^ 0x8000_0000 } else { v }))
    }

    /// The register pair (or 64-bit constant) at operand `i`, low word first; RZ and URZ
    /// pairs read 0. No modifier is allowed.
    pub fn pair(&mut self, lane: usize, i: usize) -> Result<u64, EmuError> {
        if self.modified(i) {
            return Err(self.unmodelled(format!("a modifier on 64-bit operand {}", i + 1)));
        }
        match *self.op(i)? {
            Operand::Reg { uniform, n, .. } => self.reg_pair(lane, uniform, n),
            Operand::Const {
                bank,
                reg: None,
                offset,
            } => self.constant(bank, offset, 8),
            o => Err(self.unmodelled(format!("operand {} as a 64-bit value ({o:?})", i + 1))),
        }
    }

    /// Predicate operand `i`, `!` applied.
    pub fn pred(&mut self, lane: usize, i: usize) -> Result<bool, EmuError> {
        match self.op(i)? {
            &Operand::Pred { uniform, n, not } => {
                let v = if uniform {
                    self.w.up(n)
                } else {
                    self.w.p(lane, n)
                };
                Ok(v != not)
            }
            o => Err(self.unmodelled(format!("operand {} as a predicate ({o:?})", i + 1))),
        }
    }

    /// The destination register at operand `i`: (uniform, number).
    pub fn dst(&self, i: usize) -> Result<(bool, u8), EmuError> {
        match self.op(i)? {
            &Operand::Reg {
                uniform,
                n,
                neg: false,
                not: false,
                abs: false,
            } => Ok((uniform, n)),
            o => Err(self.unmodelled(format!("destination {o:?}"))),
        }
    }

    pub fn set(&mut self, lane: usize, i: usize, v: u32) -> Result<(), EmuError> {
        let (uniform, n) = self.dst(i)?;
        self.set_reg(lane, uniform, n, v);
        Ok(())
    }

    pub fn set_reg(&mut self, lane: usize, uniform: bool, n: u8, v: u32) {
        Self::note(&mut self.wrote, (uniform, n), lane);
        if uniform {
            self.w.set_ur(n, v);
        } else {
            self.w.set_r(lane, n, v);
        }
    }

    /// Writes `words` to consecutive registers from the destination at operand `i`,
    /// which must be aligned to their count.
    pub fn set_many(&mut self, lane: usize, i: usize, words: &[u32]) -> Result<(), EmuError> {
        let (uniform, n) = self.dst(i)?;
        let zero = if uniform { URZ } else { RZ };
        if n == zero {
            return Ok(());
        }
        let k = words.len();
        if usize::from(n) % k != 0 || usize::from(n) + k > usize::from(zero) {
            return Err(self.unmodelled(format!("{k} registers from register {n}")));
        }
        for (j, &v) in words.iter().enumerate() {
            self.set_reg(lane, uniform, n + j as u8, v);
        }
        Ok(())
    }

    /// Reads `k` consecutive registers from operand `i` (a store's data).
    pub fn get_many(&mut self, lane: usize, i: usize, k: usize) -> Result<Vec<u32>, EmuError> {
        if self.modified(i) {
            return Err(self.unmodelled("a modifier on stored data"));
        }
        let (uniform, n) = match self.op(i)? {
            &Operand::Reg { uniform, n, .. } => (uniform, n),
            o => return Err(self.unmodelled(format!("stored data {o:?}"))),
        };
        let zero = if uniform { URZ } else { RZ };
        if n == zero {
            return Ok(vec![0; k]);
        }
        if usize::from(n) % k != 0 || usize::from(n) + k > usize::from(zero) {
            return Err(self.unmodelled(format!("{k} registers from register {n}")));
        }
        Ok((0..k as u8)
            .map(|j| self.reg(lane, uniform, n + j))
            .collect())
    }

    /// Writes predicate operand `i` (PT and UPT discard the value).
    pub fn set_pred(&mut self, lane: usize, i: usize, v: bool) -> Result<(), EmuError> {
        match self.op(i)? {
            &Operand::Pred {
                uniform,
                n,
                not: false,
            } => {
                if uniform {
                    self.w.set_up(n, v);
                } else {
                    self.w.set_p(lane, n, v);
                }
                Ok(())
            }
            o => Err(self.unmodelled(format!("predicate destination {o:?}"))),
        }
    }

    /// Whether operand `i` is the predicate `PT`/`UPT` (with `!` when `not`).
    pub fn is_pt(&self, i: usize, not: bool) -> bool {
        matches!(self.ops.get(i), Some(&Operand::Pred { n: PT, not: x, .. }) if x == not)
    }
}
