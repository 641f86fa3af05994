//! The instrumentation pass: a kernel in, the same kernel recording its GPU start and end
//! time out.

use quench_ir::{
    verify, AddrSpace, AtomOp, BinOp, Block, CmpOp, Function, Inst, Op, Ordering, Param, Scalar, Scope, Special, Type,
    Value, VerifyError,
};

/// Name of the added ring-buffer parameter (a global `u64` pointer).
pub const RING_PARAM: &str = "prof_ring";
/// Name of the added record-slot parameter (`u32`).
pub const SLOT_PARAM: &str = "prof_slot";

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
        let (x, y, z) = (self.special(x), self.special(y), self.special(z));
        let xy = self.bin(BinOp::Or, x, y, Type::U32);
        let xyz = self.bin(BinOp::Or, xy, z, Type::U32);
        let zero = self.u32(0);
        self.val(Type::PRED, Op::Cmp { op: CmpOp::Eq, a: xyz, b: zero })
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

/// Instrument `f`: the result takes two more parameters, [`RING_PARAM`] (a global
/// pointer to records of [`crate::RECORD_BYTES`] bytes, zeroed once when allocated) and
/// [`SLOT_PARAM`] (which record this launch writes), and computes what `f` computes.
///
/// Record layout: `[start_ns: u64, end_ns: u64, blocks: u32, pad: u32]`. Every thread
/// reads `%globaltimer` at entry; thread 0 of block 0 stores its reading as the start.
/// At the end of the body, after a block barrier, thread 0 of each block reads
/// `%globaltimer` again and raises `end_ns` to it with an atomic max, and adds one to
/// `blocks`. Both atomics discard their result, so they compile to reductions that no
/// thread waits for.
///
/// Nothing needs resetting between launches, which is what lets a captured graph replay
/// with the same arguments: `start_ns` is overwritten, `end_ns` only grows (the timer is
/// monotonic, so the max is this launch's last block end), and `blocks` counts on — the
/// reader takes the difference from its previous reading ([`crate::Ring::read`]).
pub fn instrument(f: &Function) -> Result<Function, InstrumentError> {
    for name in [RING_PARAM, SLOT_PARAM] {
        if f.params.iter().any(|p| p.name == name) {
            return Err(InstrumentError::ParamTaken { kernel: f.name.clone(), name: name.to_string() });
        }
    }
    let mut g = f.clone();
    let ring_index = g.params.len() as u32;
    let ring_ty = Type::Ptr(AddrSpace::Global, Scalar::U64);
    g.params.push(Param { name: RING_PARAM.to_string(), ty: ring_ty });
    g.params.push(Param { name: SLOT_PARAM.to_string(), ty: Type::U32 });

    let mut pro = Emit { values: &mut g.values, insts: vec![] };
    let start = pro.special(Special::GlobalTimer);
    let ring = pro.val(ring_ty, Op::Param(ring_index));
    let slot = pro.val(Type::U32, Op::Param(ring_index + 1));
    let prologue = pro.insts;

    let mut epi = Emit { values: &mut g.values, insts: vec![] };
    // The body may only return as its last instruction, so every thread reaches this
    // point and the barrier is uniform.
    epi.void(Op::Barrier);
    let thread0 = epi.all_zero([Special::TidX, Special::TidY, Special::TidZ]);
    epi.if_then(thread0, |e| {
        let end = e.special(Special::GlobalTimer);
        let slot64 = e.val(Type::U64, Op::Cvt { to: Scalar::U64, rnd: None, sat: false, a: slot });
        let words = e.val(Type::U64, Op::Const { ty: Type::U64, bits: (crate::RECORD_BYTES / 8) as u64 });
        let word = e.bin(BinOp::Mul, slot64, words, Type::U64);
        let rec = e.val(ring_ty, Op::PtrAdd { ptr: ring, index: word });
        let block0 = e.all_zero([Special::CtaidX, Special::CtaidY, Special::CtaidZ]);
        e.if_then(block0, |e| e.void(Op::Store { ptr: rec, value: start, cache: Default::default() }));
        let (one, two) = (e.u32(1), e.u32(2));
        let end_at = e.val(ring_ty, Op::PtrAdd { ptr: rec, index: one });
        e.val(
            Type::U64,
            Op::Atomic { op: AtomOp::Max, ord: Ordering::Relaxed, scope: Scope::Gpu, ptr: end_at, a: end, b: None },
        );
        let count_at = e.val(ring_ty, Op::PtrAdd { ptr: rec, index: two });
        let count = e.val(Type::Ptr(AddrSpace::Global, Scalar::U32), Op::PtrCast { to: Scalar::U32, ptr: count_at });
        e.val(
            Type::U32,
            Op::Atomic { op: AtomOp::Add, ord: Ordering::Relaxed, scope: Scope::Gpu, ptr: count, a: one, b: None },
        );
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
