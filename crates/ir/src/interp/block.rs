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

/// Where a warp stands between passes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Ready,
    AtBarrier,
    Blocked,
    Done,
}

/// Run the block whose context is `ctx` with `warps` (reset here) to completion.
pub(crate) fn run_block<'p>(
    ctx: &mut BlockCtx<'_, 'p>,
    warps: &mut [Warp<'p>],
) -> Result<(), InterpError> {
    ctx.shared.reset();
    let mut state = vec![State::Ready; warps.len()];
    for w in warps.iter_mut() {
        w.start();
    }
    loop {
        let mut progressed = false;
        for (w, s) in warps.iter_mut().zip(state.iter_mut()) {
            if matches!(s, State::Ready | State::Blocked) {
                (*s, progressed) = match w.run(ctx)? {
                    Stop::Done => (State::Done, true),
                    Stop::Barrier => (State::AtBarrier, true),
                    Stop::Blocked { progressed: p } => (State::Blocked, progressed || p),
                };
            }
        }
        if state.iter().all(|s| *s == State::Done) {
            return Ok(());
        }
        // Every warp not yet ended waits at the barrier: the next pass releases them.
        if state
            .iter()
            .all(|s| matches!(s, State::Done | State::AtBarrier))
        {
            for s in state.iter_mut().filter(|s| **s == State::AtBarrier) {
                *s = State::Ready;
            }
            continue;
        }
        if !progressed {
            return Err(InterpError::Deadlock {
                kernel: ctx.prog.f.name.clone(),
                block: ctx.ctaid,
                waiting: (0..warps.len() as u32)
                    .filter(|&i| state[i as usize] == State::Blocked)
                    .collect(),
            });
        }
    }
}
