//! The instrumentation pass: a kernel in, the same kernel recording its GPU start and end
//! time out.

use crate::ring::{FIRST_LANE_PLANE, LANES, LAUNCH_PLANE, START_PLANE};
use quench_ir::{
    verify, AddrSpace, AtomOp, BinOp, Block, CmpOp, Function, Inst, Op, Ordering, Param, Scalar,
    Scope, Special, Type, Value, VerifyError,
};

/// Name of the added record parameter: a global `u64` pointer to the launch's word in
/// the first plane of the ring.
pub const RING_PARAM: &str = "prof_ring";
/// Name of the added plane-stride parameter (`u32`, in words).
pub const STRIDE_PARAM: &str = "prof_stride";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InstrumentError {
    #[error(
        "kernel `{kernel}` already has a parameter named `{name}`; it cannot be instrumented twice"
    )]
    ParamTaken { kernel: String, name: String },
    #[error("the instrumented kernel does not verify: {0}")]
    Verify(#[from] VerifyError),
}

/// Appends instructions to a block, allocating their result values in the function.
struct Emit<'a> {
    values: &'a mut Vec<Type>,
    insts: Vec<Inst>,
}

impl Emit<'_> {
    fn val(&mut self, ty: Type, op: Op) -> Value {
        self.values.push(ty);
        let v = Value(self.values.len() as u32 - 1);
        self.insts.push(Inst {
            results: vec![v],
            op,
        });
        v
    }
    fn void(&mut self, op: Op) {
        self.insts.push(Inst {
            results: vec![],
            op,
        });
    }
    fn special(&mut self, s: Special) -> Value {
        self.val(Type::Scalar(s.ty()), Op::Special(s))
    }
    fn u32(&mut self, x: u32) -> Value {
        self.val(
            Type::U32,
            Op::Const {
                ty: Type::U32,
                bits: x as u64,
            },
        )
    }
    fn bin(&mut self, op: BinOp, a: Value, b: Value, ty: Type) -> Value {
        self.val(
            ty,
            Op::Bin {
                op,
                rnd: None,
                a,
                b,
            },
        )
    }
    /// Whether the u32 values of `specials` are all zero.
    fn all_zero(&mut self, specials: &[Special]) -> Value {
        let mut any = match specials.split_first() {
            Some((&first, _)) => self.special(first),
            None => self.u32(0),
        };
        for &s in specials.iter().skip(1) {
            let v = self.special(s);
            any = self.bin(BinOp::Or, any, v, Type::U32);
        }
        let zero = self.u32(0);
        self.val(
            Type::PRED,
            Op::Cmp {
                op: CmpOp::Eq,
                a: any,
                b: zero,
            },
        )
    }
    /// The record's first-plane address and the plane stride (u64, in words), read from
    /// the added parameters where they are used, so that neither stays live in a
    /// register across the kernel's body.
    fn record(&mut self, ring_index: u32, ring_ty: Type) -> (Value, Value) {
        let ring = self.val(ring_ty, Op::Param(ring_index));
        let stride = self.val(Type::U32, Op::Param(ring_index + 1));
        let stride = self.val(
            Type::U64,
            Op::Cvt {
                to: Scalar::U64,
                rnd: None,
                sat: false,
                a: stride,
            },
        );
        (ring, stride)
    }
    /// A reduction: an atomic whose result is left unused, which PTX assemblers compile
    /// to a `red` that no thread waits for.
    fn reduce(&mut self, op: AtomOp, ptr: Value, a: Value) {
        self.val(
            Type::U64,
            Op::Atomic {
                op,
                ord: Ordering::Relaxed,
                scope: Scope::Gpu,
                ptr,
                a,
                b: None,
            },
        );
    }
    fn u64(&mut self, x: u64) -> Value {
        self.val(
            Type::U64,
            Op::Const {
                ty: Type::U64,
                bits: x,
            },
        )
    }
    /// The address of `plane` (u64) of the record at `record`: `plane · stride` words on.
    fn plane(&mut self, record: Value, stride: Value, plane: Value) -> Value {
        let word = self.bin(BinOp::Mul, plane, stride, Type::U64);
        let ty = self.values[record.0 as usize];
        self.val(
            ty,
            Op::PtrAdd {
                ptr: record,
                index: word,
            },
        )
    }
    fn plane_const(&mut self, record: Value, stride: Value, plane: usize) -> Value {
        let plane = self.u64(plane as u64);
        self.plane(record, stride, plane)
    }
    /// `if cond { body }` with no results.
    fn if_then(&mut self, cond: Value, body: impl FnOnce(&mut Emit)) {
        let mut inner = Emit {
            values: self.values,
            insts: vec![],
        };
        body(&mut inner);
        inner.void(Op::Yield(vec![]));
        let then_ = Block {
            args: vec![],
            insts: inner.insts,
        };
        let else_ = Block {
            args: vec![],
            insts: vec![Inst {
                results: vec![],
                op: Op::Yield(vec![]),
            }],
        };
        self.void(Op::If {
            cond,
            then_,
            else_,
            results: vec![],
        });
    }
}

/// Instrument `f`: the result takes two more parameters, [`RING_PARAM`] (where this
/// launch's record begins in a [`crate::Ring`], zeroed once when allocated) and
/// [`STRIDE_PARAM`] (words from one plane of the ring to the next), and computes what `f`
/// computes.
///
/// A record is one `u64` in each plane (see [`crate::Ring`]): `start_ns`, `launches`,
/// then [`LANES`] end-time lanes.
///
/// - At entry, thread 0 of block 0 alone reads `%globaltimer`, stores it as `start_ns`
///   and adds one to `launches`. The other threads only test their ids (which most
///   kernels read first anyway); no timer value stays live in a register across the
///   body, and block 0's bookkeeping is done while the kernel runs, not at its end.
/// - At the end of the body, after a block barrier, thread 0 of each block reads
///   `%globaltimer` again and raises an end-time lane to it with an atomic max: lane
///   `%clock mod LANES`, which spreads the blocks over the lanes without reading the
///   block's index after the body.
///
/// The atomics discard their result, so they compile to reductions that no thread waits
/// for, and each end-time address takes about one reduction in [`LANES`] blocks. The
/// barrier is what makes thread 0's reading later than every warp of its block
/// finishing; without it, each warp would have to read the timer and reduce on its own
/// (see the body's comments for why that costs more, and for what else each choice
/// saves).
///
/// Nothing needs resetting between launches, which is what lets a captured graph replay
/// with the same arguments: `start_ns` is overwritten, the lanes only grow (the timer is
/// monotonic, so their max is this launch's last block end), and `launches` counts on —
/// the reader takes the difference from its previous reading ([`crate::Ring::read`]).
pub fn instrument(f: &Function) -> Result<Function, InstrumentError> {
    for name in [RING_PARAM, STRIDE_PARAM] {
        if f.params.iter().any(|p| p.name == name) {
            return Err(InstrumentError::ParamTaken {
                kernel: f.name.clone(),
                name: name.to_string(),
            });
        }
    }
    let mut g = f.clone();
    let ring_index = g.params.len() as u32;
    let ring_ty = Type::Ptr(AddrSpace::Global, Scalar::U64);
    g.params.push(Param {
        name: RING_PARAM.to_string(),
        ty: ring_ty,
    });
    g.params.push(Param {
        name: STRIDE_PARAM.to_string(),
        ty: Type::U32,
    });

    let mut pro = Emit {
        values: &mut g.values,
        insts: vec![],
    };
    // One reading of the start suffices: the record's start is block 0's entry. Reading
    // it in every thread would keep a 64-bit value live across the whole body for the
    // sake of one thread. The test is split so that every warp but those holding a
    // thread `(0, y, z)` of a block `(0, y, z)` branches on `%tid.x` and `%ctaid.x`
    // alone, which the body reads first in nearly every kernel anyway: the other ids
    // are read, and waited for, only where they can matter.
    let column0 = pro.all_zero(&[Special::TidX, Special::CtaidX]);
    pro.if_then(column0, |e| {
        let first_thread = e.all_zero(&[
            Special::TidY,
            Special::TidZ,
            Special::CtaidY,
            Special::CtaidZ,
        ]);
        e.if_then(first_thread, |e| {
            let start = e.special(Special::GlobalTimer);
            let (ring, stride) = e.record(ring_index, ring_ty);
            let start_at = e.plane_const(ring, stride, START_PLANE);
            e.void(Op::Store {
                ptr: start_at,
                value: start,
                cache: Default::default(),
            });
            // Counting at entry rather than at block 0's end: the reduction then drains
            // while the kernel runs instead of possibly on the grid's last block. The
            // counter is read only once the launch has finished, so the count is the
            // same.
            let count_at = e.plane_const(ring, stride, LAUNCH_PLANE);
            let one = e.u64(1);
            e.reduce(AtomOp::Add, count_at, one);
        });
    });
    let prologue = pro.insts;

    let mut epi = Emit {
        values: &mut g.values,
        insts: vec![],
    };
    // The end must be no earlier than any warp of the block finishing. The barrier gives
    // that with one timer reading and one reduction per block. The alternative, every
    // warp's lane 0 reading the timer and reducing as it exits, saves the barrier's
    // wake-up of warp 0 (tens of cycles on the last block) but multiplies the
    // reductions by the warps per block, and the blocks of a one-wave grid all finish
    // within the same microsecond, where those reductions queue on the lanes'
    // addresses. Waiting at the barrier holds nothing back: a block's shared memory and
    // its place on the multiprocessor are freed only when its last warp exits anyway.
    // The body may only return as its last instruction, so every thread reaches this
    // point and the barrier is uniform.
    epi.void(Op::Barrier);
    let thread0 = epi.all_zero(&[Special::TidX, Special::TidY, Special::TidZ]);
    epi.if_then(thread0, |e| {
        let end = e.special(Special::GlobalTimer);
        let (ring, stride) = e.record(ring_index, ring_ty);
        // The lane comes from the multiprocessor's cycle counter, not from the block's
        // index: with `%ctaid` read here (as `x + y + z` or as the linear index), ptxas
        // gave the decode step's Q4_K GEMVs (4 warps, capped grid) 71 registers where
        // the plain kernels take 56 and 63, past the 64 at which the 8 blocks per
        // multiprocessor their grid is sized for are resident at once; with the counter,
        // exactly the plain kernels' counts. The counter holds no register through the
        // body and spreads the blocks that finish together over the lanes: those of one
        // multiprocessor finish on different cycles, and the counters of different
        // multiprocessors do not run in step.
        let clock = e.special(Special::Clock);
        let mask = e.u32(LANES as u32 - 1);
        let lane = e.bin(BinOp::And, clock, mask, Type::U32);
        let first = e.u32(FIRST_LANE_PLANE as u32);
        let plane = e.bin(BinOp::Add, lane, first, Type::U32);
        let plane = e.val(
            Type::U64,
            Op::Cvt {
                to: Scalar::U64,
                rnd: None,
                sat: false,
                a: plane,
            },
        );
        let lane_at = e.plane(ring, stride, plane);
        e.reduce(AtomOp::Max, lane_at, end);
    });
    let epilogue = epi.insts;

    let body = &mut g.body.insts;
    let ret = match body.last() {
        Some(Inst { op: Op::Return, .. }) => body.pop(),
        _ => None,
    };
    body.extend(epilogue);
    body.extend(ret);
    body.splice(0..0, prologue);
    verify(&g)?;
    Ok(g)
}
