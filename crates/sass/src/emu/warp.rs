//! One warp's state: 32 lanes with their own program counters, registers and
//! predicates; the warp's uniform registers and predicates; the convergence barrier
//! registers; and the scoreboards (dependency barriers) its instructions set and wait on.

use super::copy::Copies;
use super::inst::Inst;
use super::EmuError;
use std::cell::Cell;

use crate::codegen::{FixedResult, GUARD_LATENCY};

pub const LANES: usize = 32;
/// General registers per lane, R0..R254 and RZ (255, which reads 0 and ignores writes).
pub const REGS: usize = 256;
pub const RZ: u8 = 255;
/// Uniform registers UR0..UR62 and URZ (63).
pub const UREGS: usize = 64;
pub const URZ: u8 = 63;
/// PT and UPT: predicate 7 reads true and ignores writes.
pub const PT: u8 = 7;

/// A register that an instruction read or wrote: (uniform, number).
pub type RegRef = (bool, u8);

pub struct Warp {
    /// The warp's index in its block.
    pub index: u32,
    /// `regs[lane * REGS + r]`.
    regs: Vec<u32>,
    /// Bit `n` of `preds[lane]` is `Pn`.
    preds: [u8; LANES],
    uregs: [u32; UREGS],
    upreds: u8,
    /// Each lane's next instruction, as an index into the program.
    pub pc: [usize; LANES],
    /// Lanes that are threads of the block (the last warp of a block may be partial).
    pub present: u32,
    pub exited: u32,
    /// Convergence barrier registers `B0..B15`, per lane: the lanes `BSSY` gathered.
    pub bregs: [[u32; 16]; LANES],
    /// Each lane's `SR_TID`.
    pub tid: [[u32; 3]; LANES],
    pub scoreboard: Scoreboard,
    /// Asynchronous copies issued and not yet landed.
    pub copies: Copies,
    /// Buffers for the registers an instruction reads and writes (see `exec::issue`).
    pub touched: (Vec<Touched>, Vec<Touched>),
    /// Each lane's local memory: its frame, `frame` bytes below [`LOCAL_TOP`].
    pub local: Vec<u8>,
    pub frame: u32,
    /// Issue cycles so far: the sum of the stalls of the instructions issued.
    pub cycle: u64,
    /// The cycles after which the instruction being issued lets a predicate it writes
    /// guard another ([`crate::codegen::GUARD_LATENCY`] for a fixed-latency one; one that sets a
    /// scoreboard is waited for on it instead).
    pub predicate_latency: u64,
    /// Per lane, the cycle from which each predicate may guard an instruction.
    pub guard_ready: [[u64; PT as usize]; LANES],
    /// The opcode of the instruction being issued (see [`Warp::set_p`]).
    pub opcode: String,
    /// Per lane and predicate, the opcode of its latest writer and whether anything has
    /// read it since (bit `n` of `predicate_read[lane]`; reading takes `&self`).
    predicate_writer: [[String; PT as usize]; LANES],
    predicate_read: [Cell<u8>; LANES],
    /// A predicate write that may land before an earlier, unread one: the predicate and
    /// the cycles between the two (see [`Warp::set_p`]).
    pub predicate_overtaken: Option<(u8, u64)>,
    /// Per vector register, the latest fixed-latency write to it.
    pub results: Vec<Option<Written>>,
    /// The cycle the latest block barrier (`BAR`) issued at.
    pub barrier_at: Option<u64>,
}

/// A fixed-latency write: when it issued, for which lanes, what its readers wait for, and
/// where the writer is (for messages).
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub cycle: u64,
    pub lanes: u32,
    pub result: FixedResult,
    pub at: u64,
}

/// Where the emulator's local window ends (the stack pointer's start, `c[0x0][0x28]`).
pub const LOCAL_TOP: u32 = 0x0100_0000;

impl Warp {
    /// Warp `index` of a block of `block` threads, each with a frame of `frame` bytes.
    pub fn new(index: u32, block: [u32; 3], frame: u32) -> Warp {
        let threads = block[0] * block[1] * block[2];
        let mut present = 0u32;
        let mut tid = [[0u32; 3]; LANES];
        for (lane, t) in tid.iter_mut().enumerate() {
            let linear = index * LANES as u32 + lane as u32;
            if linear < threads {
                present |= 1 << lane;
                *t = [
                    linear % block[0],
                    linear / block[0] % block[1],
                    linear / (block[0] * block[1]),
                ];
            }
        }
        Warp {
            index,
            // Registers start as junk, as on the GPU (whatever the last kernel left), so
            // that code reading one it never wrote disagrees with the interpreter.
            regs: (0..LANES * REGS)
                .map(|i| (i as u32).wrapping_mul(0x9e37_79b9) | 1)
                .collect(),
            preds: [1 << PT; LANES],
            uregs: [0; UREGS],
            upreds: 1 << PT,
            pc: [0; LANES],
            present,
            exited: 0,
            bregs: [[0; 16]; LANES],
            tid,
            scoreboard: Scoreboard::default(),
            copies: Copies::default(),
            touched: (Vec::new(), Vec::new()),
            local: vec![0; LANES * frame as usize],
            frame,
            cycle: 0,
            predicate_latency: 0,
            guard_ready: [[0; PT as usize]; LANES],
            opcode: String::new(),
            predicate_writer: Default::default(),
            predicate_read: Default::default(),
            predicate_overtaken: None,
            results: vec![None; usize::from(RZ)],
            barrier_at: None,
        }
    }

    /// Lanes still running.
    pub fn live(&self) -> u32 {
        self.present & !self.exited
    }

    pub fn r(&self, lane: usize, n: u8) -> u32 {
        if n == RZ {
            0
        } else {
            self.regs[lane * REGS + usize::from(n)]
        }
    }

    pub fn set_r(&mut self, lane: usize, n: u8, v: u32) {
        if n != RZ {
            self.regs[lane * REGS + usize::from(n)] = v;
        }
    }

    pub fn ur(&self, n: u8) -> u32 {
        if n >= URZ {
            0
        } else {
            self.uregs[usize::from(n)]
        }
    }

    pub fn set_ur(&mut self, n: u8, v: u32) {
        if n < URZ {
            self.uregs[usize::from(n)] = v;
        }
    }

    pub fn p(&self, lane: usize, n: u8) -> bool {
        if n < PT {
            let read = &self.predicate_read[lane];
            read.set(read.get() | 1 << n);
        }
        n >= PT || self.preds[lane] >> n & 1 == 1
    }

    /// Writes `Pn` of `lane`. A fixed-latency write of a predicate that an earlier
    /// fixed-latency write by another opcode (another pipe) left unread and still in
    /// flight (sooner than a guard could read it) may land first and be overwritten by the
    /// older value: recorded in [`Warp::predicate_overtaken`]. ptxas's code never
    /// overwrites an unread predicate so soon.
    pub fn set_p(&mut self, lane: usize, n: u8, v: bool) {
        if n < PT {
            let i = usize::from(n);
            let unread = self.predicate_read[lane].get() >> n & 1 == 0;
            let in_flight = self.cycle < self.guard_ready[lane][i];
            if self.predicate_latency > 0
                && unread
                && in_flight
                && self.predicate_writer[lane][i] != self.opcode
            {
                let since = self.cycle + u64::from(GUARD_LATENCY) - self.guard_ready[lane][i];
                self.predicate_overtaken = Some((n, since));
            }
            self.preds[lane] = self.preds[lane] & !(1 << n) | u8::from(v) << n;
            self.guard_ready[lane][i] = self.cycle + self.predicate_latency;
            self.predicate_writer[lane][i].clone_from(&self.opcode);
            let read = &self.predicate_read[lane];
            read.set(read.get() & !(1 << n));
        }
    }

    pub fn up(&self, n: u8) -> bool {
        n >= PT || self.upreds >> n & 1 == 1
    }

    pub fn set_up(&mut self, n: u8, v: bool) {
        if n < PT {
            self.upreds = self.upreds & !(1 << n) | u8::from(v) << n;
        }
    }
}

/// The six scoreboards of a warp. A variable-latency instruction (a load, `S2R`) names a
/// scoreboard that it releases when its result is written (`W`) or its sources have been
/// read (`R`); a later instruction must wait on that scoreboard (its wait mask) before it
/// touches those registers. The emulator writes results at once, so it cannot see a
/// missing wait as a wrong value; it checks the waits instead: reading or writing a
/// register that a pending instruction still owes, in a lane where it does, is an error
/// naming both instructions. (Lanes matter: `@!P1 LDS R0` then `@P1 MOV R0, RZ` is fine.)
/// The read scoreboards guard against immediate writes only (see [`Scoreboard::issue`]);
/// a shuffle or conversion that releases none owes its sources on its write scoreboard.
#[derive(Default)]
pub struct Scoreboard {
    /// Registers a pending write will still change.
    writes: Vec<Pending>,
    /// Registers a pending instruction has yet to read.
    reads: Vec<Pending>,
}

/// A register owed to scoreboard `sb` by the instruction at `by`, in the lanes of `lanes`.
struct Pending {
    reg: RegRef,
    lanes: u32,
    sb: u8,
    by: u64,
}

/// A register an instruction touched, and in which lanes (all of them for a uniform one).
pub type Touched = (RegRef, u32);

impl Scoreboard {
    /// The instruction's wait mask releases its scoreboards.
    pub fn wait(&mut self, mask: u8) {
        self.writes.retain(|p| mask >> p.sb & 1 == 0);
        self.reads.retain(|p| mask >> p.sb & 1 == 0);
    }

    /// Checks what `inst` read and wrote against the pending scoreboards, then records
    /// the ones `inst` sets.
    pub fn issue(
        &mut self,
        inst: &Inst,
        read: &[Touched],
        wrote: &[Touched],
    ) -> Result<(), EmuError> {
        let hazard = |what: &str, p: &Pending| EmuError::Hazard {
            at: inst.addr,
            why: format!(
                "{what} {}R{} while the instruction at {:#x} still holds it on scoreboard {}, \
                 which it does not wait on",
                if p.reg.0 { "U" } else { "" },
                p.reg.1,
                p.by,
                p.sb
            ),
        };
        let clash = |list: &[Pending], &(r, m): &Touched| -> Option<usize> {
            list.iter().position(|p| p.reg == r && p.lanes & m != 0)
        };
        for t in read {
            if let Some(i) = clash(&self.writes, t) {
                return Err(hazard("reads", &self.writes[i]));
            }
        }
        for t in wrote {
            if let Some(i) = clash(&self.writes, t) {
                return Err(hazard("writes", &self.writes[i]));
            }
            // A write that is itself tracked by a scoreboard lands late, after the pending
            // reader has read (ptxas lets `LDG R23` follow `LDG [R22.64]` that still owes
            // its read of R23); an immediate write must wait.
            if let Some(i) = clash(&self.reads, t).filter(|_| inst.control.write_barrier >= 6) {
                return Err(hazard("overwrites", &self.reads[i]));
            }
        }
        let c = inst.control;
        // A shuffle or conversion reads its sources late, however long after issue: they
        // are owed until its result is waited for, unless it releases a read scoreboard.
        let late = matches!(inst.op.as_str(), "SHFL" | "F2I" | "I2F");
        let read_sb = if c.read_barrier >= 6 && late {
            c.write_barrier
        } else {
            c.read_barrier
        };
        for (sb, list, into) in [
            (c.write_barrier, wrote, &mut self.writes),
            (read_sb, read, &mut self.reads),
        ] {
            if sb < 6 {
                into.extend(list.iter().map(|&(reg, lanes)| Pending {
                    reg,
                    lanes,
                    sb,
                    by: inst.addr,
                }));
            }
        }
        Ok(())
    }
}
