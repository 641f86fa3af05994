//! A warp: 32 lanes executing in lockstep under an active mask, with structured
//! control flow kept as an explicit stack of frames so that a warp can stop at a
//! barrier and resume there.
//!
//! - `if`: the then-branch runs with the lanes whose condition holds, then the
//!   else-branch with the others, then the lanes reconverge after the `if`. A branch no
//!   lane takes is skipped.
//! - `for`: the body runs while any lane's induction variable is below its bound; a
//!   lane whose bound is reached drops out and waits for the others at the loop's end.
//! - `return`: the lanes executing it exit for good; a block whose lanes have all
//!   exited or left is abandoned.
//! - `bar.sync`: must be executed by every lane of the warp that has not exited
//!   (exited lanes do not count, as on the GPU); the warp then stops until the block
//!   releases it.

use super::block::BlockCtx;
use super::cp_async::CpQueue;
use super::exec;
use super::program::{CBlock, CInst, Program, ValInfo};
use super::InterpError;
use crate::func::Value;
use crate::ops::Op;
use crate::types::Type;

/// A warp's registers: for every value part, 32 lane slots. `prov` records, for shared
/// pointers, which shared declaration (index + 1) the pointer was derived from, so
/// accesses can be checked against that array's bounds (0: unknown origin).
pub(crate) struct Regs {
    vals: Vec<u64>,
    prov: Vec<u16>,
}

impl Regs {
    fn new(slots: usize) -> Regs {
        Regs {
            vals: vec![0; slots * 32],
            prov: vec![0; slots * 32],
        }
    }

    fn at(i: ValInfo, part: u32, lane: u32) -> usize {
        (i.base as usize + part as usize) * 32 + lane as usize
    }

    pub fn get(&self, i: ValInfo, part: u32, lane: u32) -> u64 {
        self.vals[Self::at(i, part, lane)]
    }

    pub fn set(&mut self, i: ValInfo, part: u32, lane: u32, x: u64) {
        self.vals[Self::at(i, part, lane)] = x;
    }

    pub fn prov(&self, i: ValInfo, lane: u32) -> u16 {
        self.prov[Self::at(i, 0, lane)]
    }

    pub fn set_prov(&mut self, i: ValInfo, lane: u32, p: u16) {
        self.prov[Self::at(i, 0, lane)] = p;
    }

    /// Copy all parts (and the origin) of a value from one lane to another value/lane
    /// of the same type.
    pub fn copy(&mut self, src: ValInfo, src_lane: u32, dst: ValInfo, dst_lane: u32) {
        for part in 0..src.parts {
            let x = self.get(src, part, src_lane);
            self.set(dst, part, dst_lane, x);
        }
        let p = self.prov(src, src_lane);
        self.set_prov(dst, dst_lane, p);
    }
}

/// The lanes set in `mask`, lowest first.
pub(crate) fn lanes(mask: u32) -> impl Iterator<Item = u32> {
    let mut m = mask;
    std::iter::from_fn(move || {
        (m != 0).then(|| {
            let l = m.trailing_zeros();
            m &= m - 1;
            l
        })
    })
}

#[derive(Clone, Copy)]
enum Kind<'p> {
    Body,
    Then { inst: &'p CInst<'p>, else_mask: u32 },
    Else { inst: &'p CInst<'p> },
    Loop { inst: &'p CInst<'p>, entered: u32 },
}

#[derive(Clone, Copy)]
struct Frame<'p> {
    block: &'p CBlock<'p>,
    pc: usize,
    /// Lanes running this block (lanes that exit are removed through `alive`).
    mask: u32,
    kind: Kind<'p>,
}

/// Why a warp stopped running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    Barrier,
    /// At an mbarrier wait that does not pass yet (resumed there); `progressed` says
    /// whether it executed anything before.
    Blocked {
        progressed: bool,
    },
    Done,
}

pub(crate) struct Warp<'p> {
    prog: &'p Program<'p>,
    pub index: u32,
    /// Lanes that exist in the block and have not exited.
    pub alive: u32,
    /// Lanes of this warp that exist in the block.
    present: u32,
    frames: Vec<Frame<'p>>,
    pub regs: Regs,
    pub cp: Vec<CpQueue>,
    /// Per-lane scratch for loop-carried values in flight.
    scratch: Vec<(u64, u16)>,
}

impl<'p> Warp<'p> {
    pub fn new(prog: &'p Program<'p>, index: u32, present: u32) -> Warp<'p> {
        Warp {
            prog,
            index,
            alive: 0,
            present,
            frames: vec![],
            regs: Regs::new(prog.slots),
            cp: vec![CpQueue::default(); 32],
            scratch: vec![],
        }
    }

    /// Reset for a new block: all present lanes at the start of the kernel.
    pub fn start(&mut self) {
        self.alive = self.present;
        self.frames.clear();
        self.frames.push(Frame {
            block: &self.prog.blocks[0],
            pc: 0,
            mask: self.present,
            kind: Kind::Body,
        });
        self.cp.iter_mut().for_each(CpQueue::clear);
    }

    /// Run until the warp reaches a barrier, blocks on an mbarrier or ends.
    pub fn run(&mut self, ctx: &mut BlockCtx<'_, 'p>) -> Result<Stop, InterpError> {
        let mut progressed = false;
        loop {
            let Some(top) = self.frames.last_mut() else {
                return Ok(Stop::Done);
            };
            let active = top.mask & self.alive;
            let block = top.block;
            if active == 0 || top.pc >= block.insts.len() {
                self.end_block();
                continue;
            }
            let ci = &block.insts[top.pc];
            if let Op::MbarrierWait { bar, parity } = &ci.inst.op {
                if !super::mbarrier::wait_passes(ctx, self, ci, active, (*bar, *parity))? {
                    return Ok(Stop::Blocked { progressed });
                }
            }
            progressed = true;
            let top = self.frames.last_mut().expect("the frame just read");
            top.pc += 1;
            ctx.tick();
            match &ci.inst.op {
                Op::Barrier => {
                    if active != self.alive {
                        return Err(InterpError::BarrierDivergence {
                            site: ctx.site(self.index, None, ci),
                            arrived: active,
                            missing: self.alive & !active,
                        });
                    }
                    return Ok(Stop::Barrier);
                }
                Op::Return => self.alive &= !active,
                Op::Yield(vals) => self.yield_values(ctx, ci, vals, active)?,
                Op::If { cond, .. } => {
                    let c = self.prog.info(*cond);
                    let then_mask = lanes(active)
                        .filter(|&l| self.regs.get(c, 0, l) & 1 == 1)
                        .fold(0, |m, l| m | 1 << l);
                    self.frames.push(Frame {
                        block: &self.prog.blocks[ci.sub[0]],
                        pc: 0,
                        mask: then_mask,
                        kind: Kind::Then {
                            inst: ci,
                            else_mask: active & !then_mask,
                        },
                    });
                }
                Op::For { lo, init, body, .. } => {
                    let Type::Scalar(s) = self.prog.ty(*lo) else {
                        return Err(ctx.bad_inst(
                            self.index,
                            ci,
                            "the induction variable is not an integer",
                        ));
                    };
                    if !s.is_int() {
                        return Err(ctx.bad_inst(
                            self.index,
                            ci,
                            "the induction variable is not an integer",
                        ));
                    }
                    let iv = self.prog.info(body.args[0]);
                    let lo = self.prog.info(*lo);
                    for l in lanes(active) {
                        self.regs.copy(lo, l, iv, l);
                        for (v, a) in init.iter().zip(&body.args[1..]) {
                            self.regs.copy(self.prog.info(*v), l, self.prog.info(*a), l);
                        }
                    }
                    let mask = self.continuing(ci, active);
                    self.frames.push(Frame {
                        block: &self.prog.blocks[ci.sub[0]],
                        pc: 0,
                        mask,
                        kind: Kind::Loop {
                            inst: ci,
                            entered: active,
                        },
                    });
                }
                _ => exec::exec(ctx, self, ci, active)?,
            }
        }
    }

    /// The lanes of `mask` whose induction variable is still below the bound.
    fn continuing(&self, ci: &CInst, mask: u32) -> u32 {
        let Op::For { lo, hi, body, .. } = &ci.inst.op else {
            return 0;
        };
        let Type::Scalar(s) = self.prog.ty(*lo) else {
            return 0;
        };
        let (iv, hi) = (self.prog.info(body.args[0]), self.prog.info(*hi));
        lanes(mask)
            .filter(|&l| {
                super::arith::int_value(s, self.regs.get(iv, 0, l))
                    < super::arith::int_value(s, self.regs.get(hi, 0, l))
            })
            .fold(0, |m, l| m | 1 << l)
    }

    /// Hand the values of a `yield` to the enclosing construct, for the active lanes.
    fn yield_values(
        &mut self,
        ctx: &mut BlockCtx<'_, 'p>,
        ci: &CInst,
        vals: &[Value],
        active: u32,
    ) -> Result<(), InterpError> {
        let Some(top) = self.frames.last() else {
            return Ok(());
        };
        match top.kind {
            Kind::Body => Err(ctx.bad_inst(self.index, ci, "yield outside an if or for")),
            Kind::Then { inst, .. } | Kind::Else { inst } => {
                for (v, r) in vals.iter().zip(&inst.inst.results) {
                    let (v, r) = (self.prog.info(*v), self.prog.info(*r));
                    for l in lanes(active) {
                        self.regs.copy(v, l, r, l);
                    }
                }
                Ok(())
            }
            Kind::Loop { inst, .. } => {
                let Op::For { lo, step, body, .. } = &inst.inst.op else {
                    return Ok(());
                };
                // Yielded values may be the body's own arguments in another order: read
                // all of a lane's values before writing any.
                let prog = self.prog;
                for l in lanes(active) {
                    self.scratch.clear();
                    for v in vals.iter().map(|v| prog.info(*v)) {
                        let p = self.regs.prov(v, l);
                        for part in 0..v.parts {
                            self.scratch.push((self.regs.get(v, part, l), p));
                        }
                    }
                    let mut it = self.scratch.iter();
                    for a in body.args[1..].iter().map(|a| prog.info(*a)) {
                        for part in 0..a.parts {
                            if let Some(&(x, p)) = it.next() {
                                self.regs.set(a, part, l, x);
                                self.regs.set_prov(a, l, p);
                            }
                        }
                    }
                }
                let Type::Scalar(s) = self.prog.ty(*lo) else {
                    return Ok(());
                };
                let (iv, step) = (self.prog.info(body.args[0]), self.prog.info(*step));
                let m = super::arith::mask(s.bits());
                for l in lanes(active) {
                    let next = self
                        .regs
                        .get(iv, 0, l)
                        .wrapping_add(self.regs.get(step, 0, l))
                        & m;
                    self.regs.set(iv, 0, l, next);
                }
                Ok(())
            }
        }
    }

    /// The top frame's block is finished (or has no lanes left): move to what follows.
    fn end_block(&mut self) {
        let Some(f) = self.frames.pop() else {
            return;
        };
        match f.kind {
            Kind::Body => {}
            Kind::Then { inst, else_mask } => self.frames.push(Frame {
                block: &self.prog.blocks[inst.sub[1]],
                pc: 0,
                mask: else_mask,
                kind: Kind::Else { inst },
            }),
            Kind::Else { .. } => {}
            Kind::Loop { inst, entered } => {
                let mask = self.continuing(inst, f.mask & self.alive);
                if mask != 0 {
                    self.frames.push(Frame { pc: 0, mask, ..f });
                } else if let Op::For { body, .. } = &inst.inst.op {
                    for (a, r) in body.args[1..].iter().zip(&inst.inst.results) {
                        let (a, r) = (self.prog.info(*a), self.prog.info(*r));
                        for l in lanes(entered & self.alive) {
                            self.regs.copy(a, l, r, l);
                        }
                    }
                }
            }
        }
    }
}
