//! The SIMT interpreter: runs a kernel launch on the CPU as an sm_90 GPU would.
//!
//! # Execution model
//! - Blocks run one at a time, `ctaid.x` fastest. Threads are numbered `x` fastest and
//!   grouped into warps of 32 consecutive threads; a last partial warp has the missing
//!   lanes absent. `%warpid` is the thread's warp index within its block.
//! - A warp executes in lockstep under an active mask. An `if` runs its then-branch
//!   with the lanes whose condition holds, then its else-branch with the others, and
//!   the lanes reconverge after it; a `for` runs while any lane's induction variable is
//!   below its bound, lanes dropping out as theirs is reached; `return` ends the lanes
//!   executing it. Lanes run an instruction one after another in lane order, so
//!   atomics are sequentially consistent and fences have nothing to do.
//! - Within a block, each warp runs until it reaches `bar.sync`, blocks on an mbarrier
//!   wait that does not pass yet, or ends; blocked warps are retried after the others
//!   have run, and when all warps that have not ended wait at `bar.sync` they are
//!   released together. A pass in which no warp gets further is a deadlock, reported. Threads that have
//!   exited are not waited for (as on the GPU). A barrier executed by only some of a
//!   warp's living lanes (under divergent control flow) is an error.
//! - Shared memory holds the static declarations at [`Function::shared_offsets`], then
//!   the dynamic part; shared pointers are offsets in that window. A pointer derived
//!   from a declaration may only reach that declaration's bytes, except that the last
//!   declaration reaches on through the dynamic part to the end of the window (that is
//!   how a kernel addresses dynamic shared memory). Shared memory starts as 0xff bytes
//!   in every block. Local memory is not supported.
//! - `%clock`, `%clock64` and `%globaltimer` read [`Device::clock_ns`], a virtual clock
//!   advanced by 1 for every instruction any warp issues: deterministic and monotonic.
//! - `cp.async` is checked when issued, but its data moves only when
//!   `cp.async.wait_group` retires its group: a read before the wait sees the old
//!   contents. Copies never waited for are dropped at the end of the block.
//! - Warp collectives (`shfl`, `vote`, `redux`) need every executing lane in their
//!   member mask, and any other lane the mask names must have exited; a shuffle may
//!   only read a lane that executes it. `mma` and `ldmatrix` need all 32 lanes.
//! - Integer division by zero gives all ones (remainder: the dividend); arithmetic that
//!   produces a NaN produces the canonical one (0x7fffffff for f32).
//!
//! # Arithmetic
//! Exact operations are correctly rounded in the instruction's rounding direction in
//! every format, subnormals kept (see `arith` and `softfloat`). Approximate operations
//! (`*.approx`, `div.approx`) are modeled as the f32 rounding of the exact function
//! computed in f64 (`ex2`/`lg2` flushing subnormals as `.ftz`); floating-point
//! `mma.sync` sums exact products in f64 and rounds once. The hardware differs from both
//! within measured bounds (`isa/sm90/approx.json`), so [`LaunchStats`] lists which
//! ones ran and checks must use an error enclosure for those results.

mod arith;
mod block;
mod collective;
mod cp_async;
mod error;
mod exec;
mod mbarrier;
mod memory;
mod mma;
mod nan;
mod program;
mod softfloat;
mod warp;
mod wgmma;

pub use error::{InterpError, Site};
pub use memory::GlobalMemory;
pub use mma::{warp_ldmatrix, warp_mma, MmaLayout, MmaTables, Slot, LAYOUT_FORMAT};
pub use wgmma::{element_address, Descriptor};

use crate::func::{Function, MAX_STATIC_SHARED_BYTES, MAX_THREADS_PER_BLOCK};
use crate::ops::{BinOp, Round, UnOp};
use crate::types::{Scalar, Type};
use block::{run_block, BlockCtx};
use memory::SharedMem;
use program::Program;
use warp::Warp;

/// One element's `cvt` as the interpreter computes it (rounding, saturation and NaN
/// results as measured on the H200), for other executors of the same operations: the
/// SASS emulator's conversions use it, so the two cannot disagree.
pub fn convert(from: Scalar, to: Scalar, rnd: Option<Round>, a: u64) -> Result<u64, String> {
    arith::cvt(from, to, rnd, false, a).map_err(|e| format!("{e:?}"))
}

/// One element's binary arithmetic as the interpreter computes it (see [`convert`]).
pub fn arithmetic(op: BinOp, rnd: Option<Round>, s: Scalar, a: u64, b: u64) -> Result<u64, String> {
    arith::bin(op, rnd, s, a, b).map_err(|e| format!("{e:?}"))
}

/// Shared memory a block may use on sm_90 (static plus dynamic, with the opt-in).
pub const MAX_SHARED_BYTES_PER_BLOCK: u64 = 227 * 1024;

/// The interpreted device: its memory and its virtual clock in nanoseconds.
#[derive(Debug, Default)]
pub struct Device {
    pub mem: GlobalMemory,
    pub clock_ns: u64,
}

impl Device {
    pub fn new() -> Self {
        Device {
            mem: GlobalMemory::new(),
            clock_ns: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

/// What a launch did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaunchStats {
    /// Instructions issued, counted once per warp however many lanes were active.
    pub instructions: u64,
    /// Approximate unary operations that ran, in order of first use.
    pub approx_ops_used: Vec<UnOp>,
    /// Whether `div.approx` ran.
    pub approx_div_used: bool,
    /// Whether a floating-point `mma.sync` ran (its accumulation order is not the
    /// hardware's).
    pub approx_mma_used: bool,
}

impl LaunchStats {
    /// Whether every result of the launch is exactly what the GPU computes (no
    /// approximate operation ran).
    pub fn all_exact(&self) -> bool {
        self.approx_ops_used.is_empty() && !self.approx_div_used && !self.approx_mma_used
    }
}

/// Run `f` over the grid of `cfg` with `args` (the raw bits of each parameter: device
/// addresses for pointers, floats in their low bits, narrower integers zero-extended).
/// Kernels using `mma`/`ldmatrix` read the measured layout table
/// ([`MmaLayout::measured`]).
///
/// The kernel is not verified here: the interpreter checks the structure it relies on
/// and reports faults as they happen (out-of-bounds or misaligned accesses, divergent
/// barriers, collectives over the wrong lanes), so run [`verify()`](crate::verify()) first for the
/// static checks. A kernel that loops forever on the GPU loops forever here too.
pub fn launch(
    f: &Function,
    cfg: &LaunchConfig,
    args: &[u64],
    dev: &mut Device,
) -> Result<LaunchStats, InterpError> {
    let prog = Program::new(f)?;
    let layout = if prog.uses_layout {
        Some(MmaLayout::measured()?)
    } else {
        None
    };
    run(&prog, cfg, args, dev, layout)
}

/// [`launch`] with the fragment layouts of `layout` instead of the measured table.
pub fn launch_with_layout(
    f: &Function,
    cfg: &LaunchConfig,
    args: &[u64],
    dev: &mut Device,
    layout: &MmaLayout,
) -> Result<LaunchStats, InterpError> {
    let prog = Program::new(f)?;
    run(&prog, cfg, args, dev, Some(layout))
}

fn run(
    prog: &Program,
    cfg: &LaunchConfig,
    args: &[u64],
    dev: &mut Device,
    layout: Option<&MmaLayout>,
) -> Result<LaunchStats, InterpError> {
    let f = prog.f;
    check_args(f, args)?;
    check_shape(f, cfg)?;
    let [gx, gy, gz] = cfg.grid;
    let threads = cfg.block.iter().product::<u32>();
    let mut warps: Vec<Warp> = (0..threads.div_ceil(32))
        .map(|i| {
            let present = (threads - 32 * i).min(32);
            Warp::new(
                prog,
                i,
                if present == 32 {
                    u32::MAX
                } else {
                    (1 << present) - 1
                },
            )
        })
        .collect();
    let mut shared = SharedMem::new(f, cfg.dynamic_shared_bytes as u64);
    let mut stats = LaunchStats::default();
    for z in 0..gz {
        for y in 0..gy {
            for x in 0..gx {
                let mut ctx = BlockCtx {
                    prog,
                    mem: &mut dev.mem,
                    clock: &mut dev.clock_ns,
                    shared: &mut shared,
                    stats: &mut stats,
                    layout,
                    args,
                    ctaid: [x, y, z],
                    nctaid: cfg.grid,
                    ntid: cfg.block,
                };
                run_block(&mut ctx, &mut warps)?;
            }
        }
    }
    Ok(stats)
}

fn check_args(f: &Function, args: &[u64]) -> Result<(), InterpError> {
    if args.len() != f.params.len() {
        return Err(InterpError::ArgCount {
            kernel: f.name.clone(),
            expected: f.params.len(),
            got: args.len(),
        });
    }
    for (index, (p, &a)) in f.params.iter().zip(args).enumerate() {
        let problem = match p.ty {
            Type::Ptr(..) => None,
            Type::Scalar(s) if s.bits() >= 64 || a >> s.bits() == 0 => None,
            Type::Scalar(s) => Some(format!(
                "is {a:#x}, which has bits set above its {} bits",
                s.bits()
            )),
            t => Some(format!(
                "has type {t}, which cannot be passed as a parameter"
            )),
        };
        if let Some(problem) = problem {
            return Err(InterpError::BadArg {
                kernel: f.name.clone(),
                index,
                name: p.name.clone(),
                ty: p.ty.to_string(),
                problem,
            });
        }
    }
    Ok(())
}

fn check_shape(f: &Function, cfg: &LaunchConfig) -> Result<(), InterpError> {
    let [bx, by, bz] = cfg.block;
    let [gx, gy, gz] = cfg.grid;
    let threads = bx as u64 * by as u64 * bz as u64;
    let static_shared = f.shared_bytes();
    let shared = static_shared + cfg.dynamic_shared_bytes as u64;
    let problem = if cfg.grid.contains(&0) || cfg.block.contains(&0) {
        format!(
            "grid {:?} and block {:?} must have no zero dimension",
            cfg.grid, cfg.block
        )
    } else if gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
        format!(
            "grid {:?} exceeds sm_90's limits (2^31-1, 65535, 65535)",
            cfg.grid
        )
    } else if bx > 1024 || by > 1024 || bz > 64 {
        format!(
            "block {:?} exceeds sm_90's limits (1024, 1024, 64)",
            cfg.block
        )
    } else if threads > MAX_THREADS_PER_BLOCK as u64 {
        format!(
            "block {:?} has {threads} threads, more than {MAX_THREADS_PER_BLOCK}",
            cfg.block
        )
    } else if threads > f.max_threads as u64 {
        format!(
            "block {:?} has {threads} threads, the kernel allows at most {}",
            cfg.block, f.max_threads
        )
    } else if static_shared > MAX_STATIC_SHARED_BYTES {
        format!(
            "{static_shared} bytes of static shared memory, more than {MAX_STATIC_SHARED_BYTES}"
        )
    } else if shared > MAX_SHARED_BYTES_PER_BLOCK {
        format!(
            "{static_shared} bytes of static and {} of dynamic shared memory, more than {MAX_SHARED_BYTES_PER_BLOCK}",
            cfg.dynamic_shared_bytes
        )
    } else {
        return Ok(());
    };
    Err(InterpError::LaunchShape {
        kernel: f.name.clone(),
        problem,
    })
}
