//! The instrumentation pass: a kernel in, the same kernel recording its GPU start and end
//! time out.

use crate::ring::{FIRST_LANE_PLANE, LANES, LAUNCH_PLANE, START_PLANE};
use quench_ir::{
    verify, AddrSpace, AtomOp, BinOp, Block, CmpOp, Function, Inst, Op, Ordering, Param, Scalar, Scope, Special, Type,
    Value, VerifyError,
};

/// Name of the added record parameter: a global `u64` pointer to the launch's word in
/// the first plane of the ring.
pub const RING_PARAM: &str = "prof_ring";
/// Name of the added plane-stride parameter (`u32`, in words).
pub const STRIDE_PARAM: &str = "prof_stride";

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InstrumentError {
    #[error("kernel `{kernel}` already has a parameter named `{name}`; it cannot be instrumented twice")]
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
        self.insts.push(Inst { results: vec![v], op });
        v
    }
    fn void(&mut self, op: Op) {
        self.insts.push(Inst { results: vec![], op });
    }
    fn special(&mut self, s: Special) -> Value {
        self.val(Type::Scalar(s.ty()), Op::Special(s))
    }
    fn u32(&mut self, x: u32) -> Value {
        self.val(Type::U32, Op::Const { ty: Type::U32, bits: x as u64 })
    }
    fn bin(&mut self, op: BinOp, a: Value, b: Value, ty: Type) -> Value {
        self.val(ty, Op::Bin { op, rnd: None, a, b })
    }
    /// Whether all three of `x`, `y`, `z` (u32) are zero.
    fn all_zero(&mut self, [x, y, z]: [Special; 3]) -> Value {
        let xyz = [x, y, z].map(|s| self.special(s));
        self.zeros(xyz)
    }
    /// Whether the u32 values `x`, `y`, `z` are all zero.
    fn zeros(&mut self, [x, y, z]: [Value; 3]) -> Value {
        let xy = self.bin(BinOp::Or, x, y, Type::U32);
        let xyz = self.bin(BinOp::Or, xy, z, Type::U32);
        let zero = self.u32(0);
        self.val(Type::PRED, Op::Cmp { op: CmpOp::Eq, a: xyz, b: zero })
    }
    fn u64(&mut self, x: u64) -> Value {
        self.val(Type::U64, Op::Const { ty: Type::U64, bits: x })
    }
    /// The address of `plane` (u64) of the record at `record`: `plane · stride` words on.
    fn plane(&mut self, record: Value, stride: Value, plane: Value) -> Value {
        let word = self.bin(BinOp::Mul, plane, stride, Type::U64);
        let ty = self.values[record.0 as usize];
        self.val(ty, Op::PtrAdd { ptr: record, index: word })
    }
    fn plane_const(&mut self, record: Value, stride: Value, plane: usize) -> Value {
        let plane = self.u64(plane as u64);
        self.plane(record, stride, plane)
    }
    /// `if cond { body }` with no results.
    fn if_then(&mut self, cond: Value, body: impl FnOnce(&mut Emit)) {
        let mut inner = Emit { values: self.values, insts: vec![] };
        body(&mut inner);
        inner.void(Op::Yield(vec![]));
        let then_ = Block { args: vec![], insts: inner.insts };
        let else_ = Block { args: vec![], insts: vec![Inst { results: vec![], op: Op::Yield(vec![]) }] };
        self.void(Op::If { cond, then_, else_, results: vec![] });
    }
}

/// Instrument `f`: the result takes two more parameters, [`RING_PARAM`] (where this
/// launch's record begins in a [`crate::Ring`], zeroed once when allocated) and
/// [`STRIDE_PARAM`] (words from one plane of the ring to the next), and computes what `f`
/// computes.
///
/// A record is one `u64` in each plane (see [`crate::Ring`]): `start_ns`, `launches`,
/// then [`LANES`] end-time lanes. Every thread reads `%globaltimer` at entry. At the end
/// of the body, after a block barrier, thread 0 of each block reads `%globaltimer` again
/// and raises the end lane of its linear block index modulo [`LANES`] to it with an
/// atomic max; thread 0 of block 0 also stores its entry reading as `start_ns` and adds
/// one to `launches`. The atomics discard their result, so they compile to reductions
/// that no thread waits for, and no address takes more than one reduction in
/// [`LANES`] blocks (plus, for the counter, one per launch).
///
/// Nothing needs resetting between launches, which is what lets a captured graph replay
/// with the same arguments: `start_ns` is overwritten, the lanes only grow (the timer is
/// monotonic, so their max is this launch's last block end), and `launches` counts on —
/// the reader takes the difference from its previous reading ([`crate::Ring::read`]).
pub fn instrument(f: &Function) -> Result<Function, InstrumentError> {
    for name in [RING_PARAM, STRIDE_PARAM] {
        if f.params.iter().any(|p| p.name == name) {
            return Err(InstrumentError::ParamTaken { kernel: f.name.clone(), name: name.to_string() });
        }
    }
    let mut g = f.clone();
    let ring_index = g.params.len() as u32;
    let ring_ty = Type::Ptr(AddrSpace::Global, Scalar::U64);
    g.params.push(Param { name: RING_PARAM.to_string(), ty: ring_ty });
    g.params.push(Param { name: STRIDE_PARAM.to_string(), ty: Type::U32 });

    let mut pro = Emit { values: &mut g.values, insts: vec![] };
    let start = pro.special(Special::GlobalTimer);
    let ring = pro.val(ring_ty, Op::Param(ring_index));
    let stride = pro.val(Type::U32, Op::Param(ring_index + 1));
    let prologue = pro.insts;

    let mut epi = Emit { values: &mut g.values, insts: vec![] };
    // The body may only return as its last instruction, so every thread reaches this
    // point and the barrier is uniform.
    epi.void(Op::Barrier);
    let thread0 = epi.all_zero([Special::TidX, Special::TidY, Special::TidZ]);
    epi.if_then(thread0, |e| {
        let end = e.special(Special::GlobalTimer);
        let stride = e.val(Type::U64, Op::Cvt { to: Scalar::U64, rnd: None, sat: false, a: stride });
        // The linear block index `x + nx·(y + ny·z)`, wrapping: only its low bits count.
        let [x, y, z, nx, ny] = [Special::CtaidX, Special::CtaidY, Special::CtaidZ, Special::NctaidX, Special::NctaidY]
            .map(|s| e.special(s));
        let nyz = e.bin(BinOp::Mul, ny, z, Type::U32);
        let yz = e.bin(BinOp::Add, y, nyz, Type::U32);
        let nxyz = e.bin(BinOp::Mul, nx, yz, Type::U32);
        let linear = e.bin(BinOp::Add, x, nxyz, Type::U32);
        let mask = e.u32(LANES as u32 - 1);
        let lane = e.bin(BinOp::And, linear, mask, Type::U32);
        let first = e.u32(FIRST_LANE_PLANE as u32);
        let plane = e.bin(BinOp::Add, lane, first, Type::U32);
        let plane = e.val(Type::U64, Op::Cvt { to: Scalar::U64, rnd: None, sat: false, a: plane });
        let lane_at = e.plane(ring, stride, plane);
        e.val(
            Type::U64,
            Op::Atomic { op: AtomOp::Max, ord: Ordering::Relaxed, scope: Scope::Gpu, ptr: lane_at, a: end, b: None },
        );
        let block0 = e.zeros([x, y, z]);
        e.if_then(block0, |e| {
            let start_at = e.plane_const(ring, stride, START_PLANE);
            e.void(Op::Store { ptr: start_at, value: start, cache: Default::default() });
            let count_at = e.plane_const(ring, stride, LAUNCH_PLANE);
            let one = e.u64(1);
            e.val(
                Type::U64,
                Op::Atomic {
                    op: AtomOp::Add,
                    ord: Ordering::Relaxed,
                    scope: Scope::Gpu,
                    ptr: count_at,
                    a: one,
                    b: None,
                },
            );
        });
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
