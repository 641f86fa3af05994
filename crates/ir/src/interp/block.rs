//! One thread block: its warps, its shared memory and its barriers.
//!
//! Warps run one after another, each until it reaches a barrier or ends. When every
//! warp that has not ended waits at the barrier, all are released together; warps
//! that ended are not waited for (exited threads do not count at `bar.sync`).

use super::error::Site;
use super::memory::{GlobalMemory, SharedMem};
use super::mma::MmaLayout;
use super::program::{CInst, Program};
use super::warp::{Stop, Warp};
use super::{InterpError, LaunchStats};

pub(crate) struct BlockCtx<'a, 'p> {
    pub prog: &'p Program<'p>,
    pub mem: &'a mut GlobalMemory,
    pub clock: &'a mut u64,
    pub shared: &'a mut SharedMem,
    pub stats: &'a mut LaunchStats,
    pub layout: Option<&'a MmaLayout>,
    pub args: &'a [u64],
    pub ctaid: [u32; 3],
    pub nctaid: [u32; 3],
    pub ntid: [u32; 3],
}

impl BlockCtx<'_, '_> {
    /// One warp-level instruction issued: count it and advance the virtual clock by 1 ns.
    pub fn tick(&mut self) {
        self.stats.instructions += 1;
        *self.clock += 1;
    }

    /// Thread index (x, y, z) of a lane.
    pub fn thread(&self, warp: u32, lane: u32) -> [u32; 3] {
        let [nx, ny, _] = self.ntid;
        let t = warp * 32 + lane;
        [t % nx, (t / nx) % ny, t / (nx * ny)]
    }

    pub fn site(&self, warp: u32, lane: Option<u32>, ci: &CInst) -> Box<Site> {
        Box::new(Site {
            kernel: self.prog.f.name.clone(),
            block: self.ctaid,
            warp,
            thread: lane.map(|l| self.thread(warp, l)),
            inst: ci.id,
            op: self.prog.mnemonic(ci.inst),
        })
    }

    pub fn bad_inst(&self, warp: u32, ci: &CInst, what: impl Into<String>) -> InterpError {
        InterpError::BadInst {
            site: self.site(warp, None, ci),
            what: what.into(),
        }
    }

    pub fn unsupported(&self, warp: u32, ci: &CInst, what: impl Into<String>) -> InterpError {
        InterpError::Unsupported {
            site: self.site(warp, None, ci),
            what: what.into(),
        }
    }
}

/// Run the block whose context is `ctx` with `warps` (reset here) to completion.
pub(crate) fn run_block<'p>(
    ctx: &mut BlockCtx<'_, 'p>,
    warps: &mut [Warp<'p>],
) -> Result<(), InterpError> {
    ctx.shared.reset();
    let mut running = vec![true; warps.len()];
    for w in warps.iter_mut() {
        w.start();
    }
    loop {
        let mut waiting = false;
        for (w, r) in warps.iter_mut().zip(running.iter_mut()) {
            if *r {
                match w.run(ctx)? {
                    Stop::Done => *r = false,
                    Stop::Barrier => waiting = true,
                }
            }
        }
        if !waiting {
            return Ok(());
        }
        // Every warp not yet ended now waits at the barrier; the next pass releases them.
    }
}
