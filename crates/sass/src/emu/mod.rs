//! A SASS emulator: runs a kernel's sm_90 machine code from its bytes on the CPU.
//!
//! Every instruction goes through the decoder ([`crate::table::Tables::decode`]); its
//! template names the semantics (`exec.rs`), grouped by family (`int.rs`, `float.rs`,
//! `mem.rs`, `control.rs`). An instruction, modifier or operand shape without semantics
//! here is refused by name and address ([`EmuError::Unmodelled`]), never guessed.
//!
//! The machine: blocks run one after another; a block's warps run in turn, each until it
//! exits or waits at `BAR.SYNC`. A warp has 32 lanes, each with its own program counter
//! and R0..R254 (RZ reads 0) and P0..P6 (PT is true); the warp shares UR0..UR62 and
//! UP0..UP6. The scheduler issues the lowest program counter among the lanes that may
//! run, to every lane there: lanes that branched apart run apart and meet again at the
//! `BSYNC` that `BSSY` set up, where a lane waits until every live lane of its barrier
//! register has arrived. Each instruction's dependency barriers are checked
//! (`warp.rs`): touching a register that a load still owes to a scoreboard
//! without waiting on it is an error, since on the GPU that reads a stale value.
//!
//! Modelled, each with the modifiers and operand forms its function names: IMAD (`.MOV`,
//! `.SHL`, `.IADD`, `.U32`, `.WIDE`, `.HI.U32` with an RZ addend, `.X`), IADD3(`.X`), VIADD,
//! LEA(`.HI`)(`.X`), SHF, LOP3.LUT, PLOP3.LUT, ISETP(`.EX`), VIMNMX, VIADDMNMX.U32, PRMT,
//! IDP.4A, MOV, SEL, R2UR and the uniform twins; FADD, FMUL, FFMA, FMNMX, FSEL, FSETP,
//! I2F, I2FP, F2FP (to bf16 and f16), F2I (to u32 toward zero), HADD2.F32 and HFMA2.MMA as ptxas uses them for
//! conversions and constants, MUFU.EX2 as the interpreter models `ex2.approx`; LDG, STG,
//! LDS, STS, LDC, ULDC, ATOMG.E.ADD, ATOMS.CAST.SPIN.64 and the fences around it (MEMBAR, ERRBAR, CGAERRBAR,
//! CCTL.IVALL); S2R, S2UR, CS2R; BRA (`.DIV` when converged), EXIT, BSSY, BSYNC, NOP,
//! BAR.SYNC, SHFL; the asynchronous copies LDGSTS, LDGDEPBAR, DEPBAR (`copy.rs`); the
//! tensor-core LDSM and HMMA.16816.F32 (`tensor.rs`).
//!
//! Memory: constant bank 0 holds the launch (`blockDim` at `c[0x0][0x0]`, `gridDim` at
//! `c[0x0][0xc]`, as ptxas reads `%ntid`/`%nctaid`) and the parameters from the offset
//! `EIATTR_PARAM_CBANK` gives (0x210 on sm_90); global memory is [`Global`]; each block
//! has its shared window ([`Shared`]).

mod control;
mod copy;
mod exec;
mod float;
mod inst;
mod int;
mod mem;
mod memory;
mod tensor;
mod warp;

pub use inst::{decode_all, Inst, Operand, Special};
pub use memory::{Global, Memory, Shared, SHARED_BASE};

use crate::cubin::Cubin;
use crate::nvinfo;
use crate::table::Tables;
use exec::{Env, Step};
use warp::{Warp, LANES};

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EmuError {
    /// An instruction (or a modifier or operand of it) the emulator has no semantics for.
    #[error("the emulator does not model {mnemonic} at {at:#x}{}", if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    Unmodelled {
        mnemonic: String,
        at: u64,
        detail: String,
    },
    #[error("the word at {addr:#x} ({word:#034x}) is no instruction the tables decode")]
    Undecoded { addr: u64, word: u128 },
    #[error("the instruction at {at:#x} accesses {len} bytes of {space} memory at {addr:#x}, outside it")]
    Fault {
        at: u64,
        space: &'static str,
        addr: u64,
        len: usize,
    },
    #[error("the instruction at {at:#x} accesses {len} bytes of {space} memory at {addr:#x}, which is not aligned to {len}")]
    Misaligned {
        at: u64,
        space: &'static str,
        addr: u64,
        len: usize,
    },
    /// A dependency barrier the code does not wait on.
    #[error("the instruction at {at:#x} {why}")]
    Hazard { at: u64, why: String },
    /// Lanes that should act together do not (a barrier or shuffle under divergence).
    #[error("at {at:#x}: {why}")]
    Divergent { at: u64, why: String },
    /// Every lane of a warp waits and none can go on.
    #[error("deadlock: {0}")]
    Deadlock(String),
    #[error("the launch ran more than {0} instructions per warp")]
    Runaway(u64),
    /// The kernel, launch or parameters are not runnable as given.
    #[error("{0}")]
    Program(String),
}

/// A kernel ready to run: its decoded code and what its `.nv.info` says.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub name: String,
    /// The instructions at addresses 0, 16, ..., or why a word does not decode.
    pub code: Vec<Result<Inst, EmuError>>,
    /// Where the parameters start in constant bank 0.
    pub param_base: usize,
    pub param_bytes: usize,
    /// The parameters' offsets and sizes in the parameter block, in ordinal order.
    pub params: Vec<nvinfo::KParam>,
    /// Static shared memory (`.nv.shared.<name>`).
    pub shared_bytes: u64,
    /// Each thread's local memory (`EIATTR_FRAME_SIZE`).
    pub frame_bytes: u32,
}

impl Kernel {
    /// The kernel `name` of a parsed cubin, decoded with `tables`.
    pub fn from_cubin(c: &Cubin, name: &str, tables: &Tables) -> Result<Kernel, EmuError> {
        let k = c
            .kernels
            .iter()
            .find(|k| k.name == name)
            .ok_or_else(|| EmuError::Program(format!("the cubin has no kernel {name}")))?;
        if !k.relocs.is_empty() {
            return Err(EmuError::Program(format!(
                "{name}: code with relocations (calls into other sections) is not modelled"
            )));
        }
        // EIATTR_PARAM_CBANK: the symbol (4 bytes), then the offset and size (2 each).
        let cbank = k
            .info
            .iter()
            .find(|a| a.attr == nvinfo::EIATTR_PARAM_CBANK)
            .and_then(|a| a.u32_at(1))
            .ok_or_else(|| EmuError::Program(format!("{name}: no EIATTR_PARAM_CBANK")))?;
        Ok(Kernel {
            name: name.to_string(),
            code: decode_all(c.text(k), tables)?,
            param_base: (cbank & 0xffff) as usize,
            param_bytes: (cbank >> 16) as usize,
            params: k.params.clone(),
            shared_bytes: k.shared_bytes,
            frame_bytes: k.frame_size.unwrap_or(0),
        })
    }
}

/// A launch: grid and block dimensions and the dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Warp instructions issued (one per group of lanes at one address).
    pub issued: u64,
}

/// Instructions one warp may issue before the run is stopped as a runaway.
const MAX_ISSUED_PER_WARP: u64 = 1 << 24;

/// Runs `kernel` over `launch` with the parameter block `params` (laid out as the
/// cubin's `EIATTR_KPARAM_INFO` records say), reading and writing `global` (the
/// emulator's own [`Global`], or the interpreter's memory).
pub fn run(
    kernel: &Kernel,
    launch: &Launch,
    params: &[u8],
    global: &mut dyn Memory,
) -> Result<Stats, EmuError> {
    if params.len() != kernel.param_bytes {
        return Err(EmuError::Program(format!(
            "{}: {} parameter bytes, the kernel takes {}",
            kernel.name,
            params.len(),
            kernel.param_bytes
        )));
    }
    let (g, b) = (launch.grid, launch.block);
    let threads = u64::from(b[0]) * u64::from(b[1]) * u64::from(b[2]);
    if g.contains(&0) || threads == 0 || threads > 1024 {
        return Err(EmuError::Program(format!(
            "launch of grid {g:?} and block {b:?}: empty, or more than 1024 threads a block"
        )));
    }
    // blockDim and gridDim take the first 0x18 bytes; the parameters must start after.
    if kernel.param_base < 0x18 {
        return Err(EmuError::Program(format!(
            "{}: parameters at c[0x0][{:#x}] overlap the launch dimensions",
            kernel.name, kernel.param_base
        )));
    }
    let mut cbank = vec![0u8; kernel.param_base + params.len()];
    for (i, v) in b.iter().chain(&g).enumerate() {
        cbank[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
    }
    cbank[kernel.param_base..].copy_from_slice(params);
    cbank[0x28..0x2c].copy_from_slice(&warp::LOCAL_TOP.to_le_bytes());
    let shared = kernel.shared_bytes as usize + launch.dynamic_shared_bytes as usize;
    let mut stats = Stats::default();
    for z in 0..g[2] {
        for y in 0..g[1] {
            for x in 0..g[0] {
                let env = Env {
                    cbank: &cbank,
                    ctaid: [x, y, z],
                };
                let mut sh = Shared::new(shared);
                run_block(kernel, &env, b, threads, global, &mut sh, &mut stats)?;
            }
        }
    }
    Ok(stats)
}

/// One block: its warps in turn, each to its exit or the next barrier, until all exit.
fn run_block(
    kernel: &Kernel,
    env: &Env,
    block: [u32; 3],
    threads: u64,
    global: &mut dyn Memory,
    shared: &mut Shared,
    stats: &mut Stats,
) -> Result<(), EmuError> {
    let n = threads.div_ceil(LANES as u64) as u32;
    let mut warps: Vec<Warp> = (0..n)
        .map(|i| Warp::new(i, block, kernel.frame_bytes))
        .collect();
    loop {
        let mut waiting = Vec::new();
        for w in &mut warps {
            if w.live() == 0 {
                continue;
            }
            if let Some(id) = run_warp(kernel, w, env, global, shared, stats)? {
                waiting.push((w.index, id));
            }
        }
        let Some(&(_, id)) = waiting.first() else {
            return Ok(());
        };
        let live = warps.iter().filter(|w| w.live() != 0).count();
        if waiting.len() != live || waiting.len() != warps.len() {
            return Err(EmuError::Deadlock(format!(
                "block {:?}: {} of {} warps wait at BAR.SYNC, the others have exited \
                 (whether exited warps count at a barrier is not modelled)",
                env.ctaid,
                waiting.len(),
                warps.len()
            )));
        }
        if let Some((w, other)) = waiting.iter().find(|(_, i)| *i != id) {
            return Err(EmuError::Deadlock(format!(
                "block {:?}: warp {w} waits at barrier {other}, others at barrier {id}",
                env.ctaid
            )));
        }
    }
}

/// Runs one warp until every lane has exited (`None`) or it reaches `BAR.SYNC` (`Some(id)`).
fn run_warp(
    kernel: &Kernel,
    w: &mut Warp,
    env: &Env,
    global: &mut dyn Memory,
    shared: &mut Shared,
    stats: &mut Stats,
) -> Result<Option<u32>, EmuError> {
    let code = &kernel.code;
    let mut issued = 0u64;
    loop {
        let live = w.live();
        if live == 0 {
            return Ok(None);
        }
        // The lowest program counter among the lanes that may go on, and those lanes.
        let mut best = usize::MAX;
        let mut active = 0u32;
        for l in exec::lanes(live) {
            let pc = w.pc[l];
            if pc > best {
                continue;
            }
            let inst = code.get(pc).ok_or_else(|| {
                EmuError::Program(format!("lane {l} of warp {} ran past the code", w.index))
            })?;
            if waits_at_bsync(w, inst.as_ref().map_err(Clone::clone)?, l, live) {
                continue;
            }
            if pc < best {
                (best, active) = (pc, 0);
            }
            active |= 1 << l;
        }
        if active == 0 {
            return Err(EmuError::Deadlock(format!(
                "every live lane of warp {} of block {:?} waits at a BSYNC",
                w.index, env.ctaid
            )));
        }
        let pc = best;
        let inst = code[pc].as_ref().map_err(Clone::clone)?;
        issued += 1;
        stats.issued += 1;
        if issued > MAX_ISSUED_PER_WARP {
            return Err(EmuError::Runaway(MAX_ISSUED_PER_WARP));
        }
        if let Step::Barrier(id) = exec::issue(w, inst, active, env, global, shared, code.len())? {
            return Ok(Some(id));
        }
    }
}

/// Whether lane `l`, at `inst`, is a `BSYNC` still waiting for a lane of its barrier
/// register that lives and is elsewhere.
fn waits_at_bsync(w: &Warp, inst: &Inst, l: usize, live: u32) -> bool {
    if inst.op != "BSYNC" {
        return false;
    }
    let Ok([Operand::Barrier(b)]) = inst.operands.as_deref() else {
        return false;
    };
    let pc = w.pc[l];
    let gathered = w.bregs[l][usize::from(*b) % 16] & live;
    exec::lanes(gathered).any(|o| w.pc[o] != pc)
}
