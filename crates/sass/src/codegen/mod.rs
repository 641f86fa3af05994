//! IR → sm_90 machine code, without ptxas: instruction selection (`select`), register
//! assignment (`regs`) and control bits (`control`), written as the SASS text that
//! [`crate::asm`] assembles into a cubin.
//!
//! **What it takes so far.** Structured control flow (`if` with or without results,
//! counted `for` with carried values), 32- and 64-bit integers, f32 (IEEE division and
//! square root in integer instructions, `ieee`), 16-bit floats moved and converted,
//! global and shared memory, barriers, butterfly shuffles, byte dot products, fences and
//! atomic adds, and the tensor cores as `mma.sync` code uses them: `cp.async` (`LDGSTS`,
//! its groups on `LDGDEPBAR`/`DEPBAR`), `ldmatrix.x4` (`LDSM`) and `mma.m16n8k16` on f16
//! or bf16 (`HMMA.16816.F32`). Any other operation is refused with its name and the
//! kernel's; those kernels are compiled through PTX.
//!
//! **Registers** (`regs`): on SSA, each value's registers given back after its last
//! use; predicate values in P0–P4, and in registers as 0 or 1 once those are taken. The
//! code names at most 253 registers, fewer where a block of `max_threads` would not fit
//! the register file; where live values need more, values are spilled to each thread's
//! frame in local memory one at a time until they fit ([`regs::Spills`]), and a kernel
//! still short of registers with nothing left to spill is refused with the numbers.
//!
//! **Control bits.** A fixed-latency instruction stalls the warp for its latency, a cycle
//! more into another pipe and three into a load, store, shuffle or conversion, and one
//! cycle of margin (`control`) — latency measured on the H200
//! (`isa/sm90/latencies.json`) where measured; else
//! `control::DEFAULT_STALL` cycles) before the next instruction issues, so every
//! result is ready before anything reads it; a latency past the 15 cycles a stall field
//! holds (`HMMA`'s 24) is waited out by a `NOP`, as ptxas does. A variable-latency
//! instruction (global, shared and constant loads, special registers, shuffles, `LDSM`)
//! sets scoreboard 1 and the next instruction waits on it; copy groups are counted on
//! scoreboard 0, which only `DEPBAR` waits on. Correct, not yet fast: scheduling comes
//! later.

mod control;
mod divide;
mod ieee;
mod regs;
mod schedule;
mod scoreboard;
mod select;

use quench_ir::Function;

use crate::error::{Result, SassError};
use crate::table::Tables;
use regs::Spills;

pub use control::{is_control_flow, FixedResult, BARRIER_STALL, CONTROL_FLOW_STALL, GUARD_LATENCY};
pub use regs::MAX_REGISTERS;

/// The SASS text (as `quench sass dis` prints it) of `f`'s machine code, with its ABI.
pub fn compile(f: &Function) -> Result<String> {
    // A block of `max_threads` must fit the SM's register file, registers being handed to
    // each thread of whole warps in units of 8, and two of each thread's reserved.
    let warps = f.max_threads.div_ceil(32).max(1);
    let limit = (REGISTER_FILE / (32 * warps) / 8 * 8).saturating_sub(regs::RESERVED);
    let mut spills = Spills::default();
    loop {
        let mut more = spills.clone();
        let mut s = select::Selector::new(f, limit, &spills)?;
        let e = match s.body() {
            Ok(()) => return Ok(s.finish()),
            Err(e) => e,
        };
        if spills.len() >= MAX_SPILLS || !s.spill_more(&mut more) {
            return Err(e);
        }
        spills = more;
    }
}

/// Values the code generator spills before it gives a kernel up.
const MAX_SPILLS: usize = 256;

/// 32-bit registers of an sm_90 SM, shared by the threads of a block.
const REGISTER_FILE: u32 = 65536;

/// A cubin of `f`'s machine code, assembled by quench's own encoder.
pub fn compile_cubin(f: &Function) -> Result<Vec<u8>> {
    let text = compile(f)?;
    let tables = Tables::sm90().map_err(|e| SassError::malformed("sm_90 encoding tables", e))?;
    crate::asm::assemble_cubin(&text, tables).map_err(|e| match e {
        // The tables hold the forms ptxas was seen to emit; a selected form outside them
        // cannot be encoded yet.
        SassError::Asm { msg, .. } => refuse(f, format!("no encoding yet: {msg}")),
        e => e,
    })
}

/// A kernel the code generator cannot compile, and why.
pub(crate) fn refuse(f: &Function, msg: impl Into<String>) -> SassError {
    SassError::Codegen {
        kernel: f.name.clone(),
        msg: msg.into(),
    }
}
