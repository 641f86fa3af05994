//! Kernels that together use every operation of the IR, on every type PTX allows it.

use quench_ir::*;

use super::{all_unops, bin_supported, cmp_supported, numeric, rounding, storable, un_supported};

pub fn global(s: Scalar) -> Type {
    Type::Ptr(AddrSpace::Global, s)
}

/// Output pointers, one per element type, each filled at consecutive indices.
pub struct Sink {
    outs: Vec<(Scalar, Value, u32)>,
}

impl Sink {
    /// Declare an output parameter for each of `types` (and u32, for predicates).
    pub fn new(k: &mut Builder, types: &[Scalar]) -> Sink {
        let mut outs = Vec::new();
        for s in types.iter().copied().chain([Scalar::U32]) {
            if s != Scalar::Pred && !outs.iter().any(|(t, _, _)| *t == s) {
                let p = k.param(&format!("out_{s}"), global(s));
                outs.push((s, p, 0));
            }
        }
        Sink { outs }
    }

    /// Store `v` (scalar, vector, pred as 0/1, or fragment register by register).
    pub fn put(&mut self, k: &mut Builder, v: Value) {
        match k.ty(v) {
            Type::Scalar(Scalar::Pred) => {
                let (one, zero) = (k.const_u32(1), k.const_u32(0));
                let x = k.select(v, one, zero);
                self.put(k, x)
            }
            Type::Frag(f) => {
                for i in 0..f.regs() {
                    let r = k.extract(v, i);
                    self.put(k, r);
                }
            }
            Type::Scalar(s) | Type::Vec(s, _) => {
                let lanes = k.ty(v).bytes() / s.bytes();
                let Some(slot) = self.outs.iter_mut().find(|(t, _, _)| *t == s) else {
                    panic!("no output for {s}");
                };
                let idx = k.const_u32(slot.2);
                slot.2 += lanes;
                let p = k.ptr_add(slot.1, idx);
                k.store(p, v);
            }
            t => panic!("cannot store a {t}"),
        }
    }
}

/// Two inputs of type `s` (predicates from comparing two u32 inputs).
fn two_inputs(k: &mut Builder, s: Scalar) -> (Value, Value) {
    let i = k.global_id_x();
    let one = k.const_u32(1);
    let j = k.add(i, one);
    let elem = if s == Scalar::Pred { Scalar::U32 } else { s };
    let inp = k.param("inp", global(elem));
    let (pa, pb) = (k.ptr_add(inp, i), k.ptr_add(inp, j));
    let (a, b) = (
        k.load(Type::Scalar(elem), pa),
        k.load(Type::Scalar(elem), pb),
    );
    if s == Scalar::Pred {
        (k.lt(a, b), k.ne(a, b))
    } else {
        (a, b)
    }
}

/// Loads and stores of `s`: every cache operator, vectors, parameters, shared memory.
pub fn memory(s: Scalar) -> Function {
    let mut k = Builder::new(&format!("memory_{s}"), 256);
    let inp = k.param("inp", global(s));
    let x = k.param("x", Type::Scalar(s));
    let mut sink = Sink::new(&mut k, &[s]);
    let i = k.global_id_x();
    let p = k.ptr_add(inp, i);
    let stores: Vec<CacheOp> = CacheOp::ALL
        .into_iter()
        .filter(|c| c.valid_for_store())
        .collect();
    let mut last = x;
    for (n, cache) in CacheOp::ALL
        .into_iter()
        .filter(|c| c.valid_for_load())
        .enumerate()
    {
        last = k.load_with(Type::Scalar(s), p, cache);
        k.store_with(p, last, stores[n % stores.len()]);
    }
    sink.put(&mut k, x);
    for n in [2u8, 4] {
        if s.bytes() * n as u32 <= 16 {
            let v = k.load(Type::Vec(s, n), p);
            sink.put(&mut k, v);
            let w = k.load_with(Type::Vec(s, n), p, CacheOp::Nc);
            k.store_with(p, w, CacheOp::Cs);
        }
    }
    let tile = k.shared_array("tile", s, 256, 16);
    let t = k.tid_x();
    let ps = k.ptr_add(tile, t);
    k.store(ps, last);
    k.barrier();
    let one = k.const_u32(1);
    let u = k.xor(t, one);
    let pu = k.ptr_add(tile, u);
    let y = k.load(Type::Scalar(s), pu);
    sink.put(&mut k, y);
    if s.bytes() * 2 <= 16 {
        let v = k.load(Type::Vec(s, 2), ps);
        k.store(pu, v);
    }
    k.finish().expect("valid kernel")
}

/// Every arithmetic, unary, comparison and selection op PTX has for `s`.
pub fn arith(s: Scalar) -> Function {
    let mut k = Builder::new(&format!("arith_{s}"), 128);
    let (a, b) = two_inputs(&mut k, s);
    let mut sink = Sink::new(&mut k, &[s]);
    let amount = k.const_u32(3);
    for op in BinOp::ALL.into_iter().filter(|op| bin_supported(*op, s)) {
        let rhs = if matches!(op, BinOp::Shl | BinOp::Shr) {
            amount
        } else {
            b
        };
        let r = k.bin_rnd(op, rounding(op, s), a, rhs);
        sink.put(&mut k, r);
        if matches!(s, Scalar::F32 | Scalar::F64) && rounding(op, s).is_some() {
            for rnd in [Round::Rz, Round::Rm, Round::Rp] {
                let r = k.bin_rnd(op, Some(rnd), a, b);
                sink.put(&mut k, r);
            }
        }
    }
    if s.is_float() || s.is_packed() {
        let rounds: &[Round] = if matches!(s, Scalar::F32 | Scalar::F64) {
            &Round::ALL
        } else {
            &[Round::Rn]
        };
        for rnd in rounds {
            let ty = k.ty(a);
            let r = k.emit(
                ty,
                Op::Fma {
                    rnd: *rnd,
                    a,
                    b,
                    c: a,
                },
            );
            sink.put(&mut k, r);
        }
    }
    for op in all_unops().into_iter().filter(|op| un_supported(*op, s)) {
        let r = k.un(op, a);
        sink.put(&mut k, r);
    }
    if s == Scalar::F32 {
        let r = k.div_approx(a, b);
        sink.put(&mut k, r);
    }
    if cmp_supported(s) {
        for op in CmpOp::ALL {
            let c = k.cmp(op, a, b);
            sink.put(&mut k, c);
        }
    }
    let c = k.const_pred(true);
    let r = k.select(c, a, b);
    sink.put(&mut k, r);
    k.finish().expect("valid kernel")
}

/// Selection between values of every shape: vectors, fragments, bytes, predicates.
pub fn selects() -> Function {
    let mut k = Builder::new("selects", 128);
    let inp = k.param("inp", global(Scalar::F32));
    let mut sink = Sink::new(&mut k, &[Scalar::F32, Scalar::U8]);
    let i = k.global_id_x();
    let p = k.ptr_add(inp, i);
    let v = k.load(Type::Vec(Scalar::F32, 4), p);
    let w = k.load_with(Type::Vec(Scalar::F32, 4), p, CacheOp::Cg);
    let zero = k.const_u32(0);
    let cond = k.eq(i, zero);
    let x = k.select(cond, v, w);
    sink.put(&mut k, x);
    let c = k.bitcast(
        Builder::frag_type(MmaShape::M16N8K16, FragRole::C, Scalar::F32),
        v,
    );
    let d = k.bitcast(
        Builder::frag_type(MmaShape::M16N8K16, FragRole::C, Scalar::F32),
        w,
    );
    let e = k.select(cond, c, d);
    sink.put(&mut k, e);
    let bytes = k.ptr_cast(Scalar::U8, inp);
    let b = k.load(Type::Vec(Scalar::U8, 4), bytes);
    let b1 = k.load(Type::Scalar(Scalar::U8), bytes);
    let b2 = k.extract(b, 3);
    let b3 = k.select(cond, b1, b2);
    sink.put(&mut k, b3);
    let t = k.const_pred(true);
    let other = k.ne(i, zero);
    let q = k.select(cond, t, other);
    sink.put(&mut k, q);
    k.finish().expect("valid kernel")
}

/// Conversions from `from` to every numeric type, with every rounding and `sat`.
pub fn convert_from(from: Scalar) -> Function {
    let mut k = Builder::new(&format!("convert_from_{from}"), 128);
    let (a, _) = two_inputs(&mut k, from);
    let mut sink = Sink::new(&mut k, &numeric());
    for to in numeric() {
        let r = k.cvt(to, a);
        sink.put(&mut k, r);
        let inexact = (from.is_float() && to.is_float() && to.bits() <= from.bits() && to != from)
            || (from.is_float() != to.is_float());
        if inexact {
            for rnd in Round::ALL {
                let r = k.cvt_rnd(to, Some(rnd), false, a);
                sink.put(&mut k, r);
            }
        }
        // `sat` is defined for every conversion but int → float.
        if !(from.is_int() && to.is_float()) {
            let rnd = quench_ir::builder::default_cvt_round(from, to);
            let r = k.cvt_rnd(to, rnd, true, a);
            sink.put(&mut k, r);
        }
    }
    k.finish().expect("valid kernel")
}

fn frag(role: FragRole, elem: Scalar) -> Type {
    let shape = if elem == Scalar::I8 || elem == Scalar::I32 {
        MmaShape::M16N8K32
    } else {
        MmaShape::M16N8K16
    };
    Builder::frag_type(shape, role, elem)
}

/// Reinterpretation between every shape of same-size values, and pack/extract.
pub fn bits() -> Function {
    use Scalar::*;
    let v = |s, n| Type::Vec(s, n);
    let sc = Type::Scalar;
    let pairs: Vec<(Type, Type)> = vec![
        (sc(F32), sc(U32)),
        (sc(I32), sc(F32)),
        (sc(F16), sc(U16)),
        (sc(BF16), sc(I16)),
        (sc(F16), sc(BF16)),
        (sc(F64), sc(U64)),
        (sc(I64), sc(F64)),
        (sc(F16x2), sc(U32)),
        (sc(BF16x2), sc(F32)),
        (sc(I8), sc(U8)),
        (sc(U8), sc(I8)),
        (v(F16, 2), sc(F16x2)),
        (sc(BF16x2), v(BF16, 2)),
        (v(U8, 4), sc(U32)),
        (sc(U32), v(I8, 4)),
        (v(I8, 4), sc(F32)),
        (v(I8, 2), sc(F16)),
        (sc(U16), v(I8, 2)),
        (v(U8, 2), sc(I16)),
        (sc(F64), v(F32, 2)),
        (v(F32, 2), sc(F64)),
        (sc(U64), v(U16, 4)),
        (v(I16, 4), sc(U64)),
        (v(F16, 4), v(U32, 2)),
        (v(U32, 2), v(F16, 4)),
        (v(BF16, 4), sc(U64)),
        (v(I32, 2), v(I16, 4)),
        (v(U8, 4), v(I16, 2)),
        (v(U8, 4), v(U8, 4)),
        (v(F32, 4), v(U32, 4)),
        (v(F64, 2), v(F32, 4)),
        (v(U32, 4), v(U64, 2)),
        (v(F32, 4), frag(FragRole::C, F32)),
        (v(U32, 4), frag(FragRole::A, BF16)),
        (v(U32, 2), frag(FragRole::B, I8)),
        (frag(FragRole::C, I32), v(F32, 4)),
        (frag(FragRole::A, F16), v(U64, 2)),
    ];
    let mut k = Builder::new("bits", 128);
    let inp = k.param("inp", global(U8));
    let mut sink = Sink::new(&mut k, &storable());
    for (from, to) in pairs {
        let x = match from {
            Type::Frag(f) => {
                let parts: Vec<Value> = (0..f.regs())
                    .map(|j| {
                        let idx = k.const_u32(j);
                        let p = k.ptr_cast(f.reg_type(), inp);
                        let p = k.ptr_add(p, idx);
                        k.load(Type::Scalar(f.reg_type()), p)
                    })
                    .collect();
                k.pack(from, &parts)
            }
            Type::Scalar(s) | Type::Vec(s, _) => {
                let p = k.ptr_cast(s, inp);
                k.load(from, p)
            }
            _ => unreachable!(),
        };
        let y = k.bitcast(to, x);
        sink.put(&mut k, y);
    }
    // Pack and extract every kind of aggregate.
    let hp = k.ptr_cast(F16, inp);
    let h = k.load(sc(F16), hp);
    let bp = k.ptr_cast(BF16, inp);
    let bh = k.load(sc(BF16), bp);
    let fp = k.ptr_cast(F32, inp);
    let f = k.load(sc(F32), fp);
    for (ty, part) in [
        (sc(F16x2), h),
        (sc(BF16x2), bh),
        (v(F32, 4), f),
        (frag(FragRole::C, F32), f),
    ] {
        let n = match ty {
            Type::Vec(_, n) => n as usize,
            Type::Frag(fr) => fr.regs() as usize,
            _ => 2,
        };
        let x = k.pack(ty, &vec![part; n]);
        sink.put(&mut k, x);
        for j in 0..n as u32 {
            let e = k.extract(x, j);
            sink.put(&mut k, e);
        }
    }
    k.finish().expect("valid kernel")
}

/// `if` with and without `else` and results, loops over signed, unsigned and byte
/// counters with carried values that swap places, nesting, and a final return.
pub fn control() -> Function {
    let mut k = Builder::new("control", 256);
    let inp = k.param("inp", global(Scalar::F32));
    let n = k.param("n", Type::U32);
    let mut sink = Sink::new(&mut k, &[Scalar::F32, Scalar::I32, Scalar::U8]);
    let i = k.global_id_x();
    let p = k.ptr_add(inp, i);
    let x = k.load(Type::F32, p);
    let zero = k.const_f32(0.0);
    let pos = k.gt(x, zero);
    let r = k.if_else(
        pos,
        &[Type::F32, Type::U32],
        |k| {
            let y = k.sqrt(x);
            let c = k.const_u32(1);
            vec![y, c]
        },
        |k| {
            let y = k.neg(x);
            let c = k.const_u32(2);
            vec![y, c]
        },
    );
    sink.put(&mut k, r[0]);
    sink.put(&mut k, r[1]);
    // Carried values swap every trip: the copies must not clobber each other.
    let (lo, one) = (k.const_u32(0), k.const_u32(1));
    let one_f = k.const_f32(1.0);
    let swapped = k.for_range(lo, n, one, &[x, one_f], |k, iv, c| {
        let is_odd = k.and(iv, one);
        let odd = k.ne(is_odd, lo);
        k.if_then(odd, |k| {
            let q = k.ptr_add(inp, iv);
            let v = k.load(Type::F32, q);
            k.store(q, v);
        });
        vec![c[1], c[0]]
    });
    sink.put(&mut k, swapped[0]);
    sink.put(&mut k, swapped[1]);
    // A signed countdown-free loop nested in a signed one.
    let (s_lo, s_hi, s_step) = (k.const_i32(-4), k.const_i32(9), k.const_i32(3));
    let acc0 = k.const_i32(0);
    let total = k.for_range(s_lo, s_hi, s_step, &[acc0], |k, iv, c| {
        let inner = k.for_range(s_lo, iv, s_step, &[c[0]], |k, jv, d| vec![k.add(d[0], jv)]);
        vec![k.add(inner[0], iv)]
    });
    sink.put(&mut k, total[0]);
    let (b_lo, b_hi, b_step) = (
        k.const_bits(Type::Scalar(Scalar::U8), 1),
        k.const_bits(Type::Scalar(Scalar::U8), 200),
        k.const_bits(Type::Scalar(Scalar::U8), 7),
    );
    let last = k.for_range(b_lo, b_hi, b_step, &[b_lo], |_, iv, _| vec![iv]);
    sink.put(&mut k, last[0]);
    k.ret();
    k.finish().expect("valid kernel")
}

/// Special registers, shuffles of every width, votes and reductions.
pub fn warp() -> Function {
    use Scalar::*;
    let mut k = Builder::new("warp", 1024);
    let inp = k.param("inp", global(U8));
    let mut sink = Sink::new(&mut k, &storable());
    for s in Special::ALL {
        let r = k.special(s);
        sink.put(&mut k, r);
    }
    let lane = k.lane_id();
    for s in [F32, U32, I32, F16x2, BF16x2] {
        let p = k.ptr_cast(s, inp);
        let x = k.load(Type::Scalar(s), p);
        for mode in [ShflMode::Idx, ShflMode::Up, ShflMode::Down, ShflMode::Bfly] {
            let r = k.shfl(mode, x, lane);
            sink.put(&mut k, r);
        }
    }
    let three = k.const_u32(3);
    let odd = k.gt(lane, three);
    for mode in [VoteMode::All, VoteMode::Any, VoteMode::Ballot] {
        let r = k.vote(mode, odd);
        sink.put(&mut k, r);
    }
    let signed = k.cvt(I32, lane);
    for op in [
        ReduxOp::Add,
        ReduxOp::Min,
        ReduxOp::Max,
        ReduxOp::And,
        ReduxOp::Or,
        ReduxOp::Xor,
    ] {
        for x in [lane, signed] {
            let r = k.redux(op, x);
            sink.put(&mut k, r);
        }
    }
    k.finish().expect("valid kernel")
}

/// Atomic `op` types sm_90 has (written from the PTX ISA).
pub fn atomic_types(op: AtomOp) -> Vec<Scalar> {
    use Scalar::*;
    match op {
        AtomOp::Add => vec![I32, U32, I64, U64, F32, F64, F16, BF16, F16x2, BF16x2],
        AtomOp::Min | AtomOp::Max | AtomOp::And | AtomOp::Or | AtomOp::Xor => {
            vec![I32, U32, I64, U64]
        }
        AtomOp::Exch | AtomOp::Cas => vec![I32, U32, I64, U64, F32, F64, F16x2, BF16x2],
    }
}

/// Barriers, fences of every order and scope, and every atomic in both spaces.
pub fn atomics() -> Function {
    let mut k = Builder::new("atomics", 256);
    let buf = k.param("buf", global(Scalar::U8));
    let mut sink = Sink::new(&mut k, &storable());
    let shared = k.shared_array("scratch", Scalar::U8, 64, 16);
    k.barrier();
    let scopes = [Scope::Cta, Scope::Gpu, Scope::Sys];
    for ord in [
        Ordering::Acquire,
        Ordering::Release,
        Ordering::AcqRel,
        Ordering::SeqCst,
    ] {
        for scope in scopes {
            k.fence(ord, scope);
        }
    }
    let orders = [
        Ordering::Relaxed,
        Ordering::Acquire,
        Ordering::Release,
        Ordering::AcqRel,
        Ordering::SeqCst,
    ];
    let mut n = 0;
    for op in [
        AtomOp::Add,
        AtomOp::Min,
        AtomOp::Max,
        AtomOp::And,
        AtomOp::Or,
        AtomOp::Xor,
        AtomOp::Exch,
        AtomOp::Cas,
    ] {
        for s in atomic_types(op) {
            for base in [buf, shared] {
                let (ord, scope) = (orders[n % orders.len()], scopes[n % scopes.len()]);
                n += 1;
                let p = k.ptr_cast(s, base);
                let x = k.load(Type::Scalar(s), p);
                let old = if op == AtomOp::Cas {
                    k.atomic_cas(ord, scope, p, x, x)
                } else {
                    k.atomic(op, ord, scope, p, x)
                };
                sink.put(&mut k, old);
            }
        }
    }
    k.finish().expect("valid kernel")
}

/// `mma.sync` of every shape and type, `ldmatrix` of every count, with and without
/// transposition, and `cp.async` of every size.
pub fn tensor() -> Function {
    use Scalar::*;
    let mut k = Builder::new("tensor", 128);
    let src = k.param("src", global(F32));
    let mut sink = Sink::new(&mut k, &[F32, I32, U32]);
    let tile = k.shared_array("tile", BF16, 2048, 128);
    let stage = k.shared_array("stage", F32, 512, 16);
    let lane = k.lane_id();
    let eight = k.const_u32(8);
    let row = k.mul(lane, eight);
    let rp = k.ptr_add(tile, row);
    for (bytes, cache) in [
        (4, CacheOp::Ca),
        (8, CacheOp::Ca),
        (16, CacheOp::Ca),
        (16, CacheOp::Cg),
    ] {
        let q = k.ptr_add(src, lane);
        let d = k.ptr_add(stage, lane);
        k.cp_async(d, q, bytes, cache);
    }
    k.cp_async_commit();
    k.cp_async_wait(1);
    k.cp_async_wait(0);
    k.barrier();
    let one = k.ldmatrix(Type::U32, 1, false, rp);
    sink.put(&mut k, one);
    let two = k.ldmatrix(Type::Vec(U32, 2), 2, true, rp);
    sink.put(&mut k, two);
    let four = k.ldmatrix(Type::Vec(U32, 4), 4, false, rp);
    sink.put(&mut k, four);
    for (elem, acc) in [(BF16, F32), (F16, F32), (I8, I32)] {
        let a = k.ldmatrix(frag(FragRole::A, elem), 4, false, rp);
        let b = k.ldmatrix(frag(FragRole::B, elem), 2, true, rp);
        let z = k.const_bits(Type::Scalar(acc), 0);
        let c = k.pack(frag(FragRole::C, acc), &[z, z, z, z]);
        let shape = if elem == I8 {
            MmaShape::M16N8K32
        } else {
            MmaShape::M16N8K16
        };
        let d = k.mma(shape, a, b, c);
        let d2 = k.mma(shape, a, b, d);
        sink.put(&mut k, d2);
    }
    k.finish().expect("valid kernel")
}

/// `wgmma` of every shape, both operand types, A from registers and through a
/// descriptor, descriptors of every swizzle, accumulators carried through a loop (in
/// place) and one read after its product (copied), with the fences and groups.
pub fn warpgroup() -> Function {
    use Scalar::*;
    let mut k = Builder::new("warpgroup", 128);
    let mut sink = Sink::new(&mut k, &[F32]);
    let tile = k.shared_array("tile", F16, 8192, 1024);
    let lane = k.lane_id();
    let row = k.shl_const(lane, 3);
    let rp = k.ptr_add(tile, row);
    k.fence_proxy_async();
    k.barrier();
    let descs: Vec<Value> = Swizzle::ALL
        .into_iter()
        .map(|z| k.wgmma_desc(tile, 128, 1024, z))
        .collect();
    let zero = k.const_f32(0.0);
    for (i, n) in [16, 32, 64, 128, 256].into_iter().enumerate() {
        let shape = MmaShape::warpgroup(n).expect("a warpgroup shape");
        let elem = if i % 2 == 0 { F16 } else { BF16 };
        let c_ty = Builder::frag_type(shape, FragRole::C, F32);
        let c = k.pack(c_ty, &vec![zero; (n / 2) as usize]);
        let (lo, hi, one) = (k.const_u32(0), k.const_u32(2), k.const_u32(1));
        let out = k.for_range(lo, hi, one, &[c], |k, _, acc| {
            let a = k.ldmatrix(Builder::frag_type(shape, FragRole::A, elem), 4, false, rp);
            k.wgmma_fence();
            let d = k.wgmma(shape, elem, a, descs[i % 4], acc[0]);
            let d = k.wgmma(shape, elem, descs[(i + 1) % 4], descs[i % 4], d);
            k.wgmma_commit();
            // The next iteration writes `a` again: its product must be done.
            k.wgmma_wait(0);
            vec![d]
        });
        k.wgmma_wait(1);
        k.wgmma_wait(0);
        // `out` feeds a product and is read after it: the product copies it first.
        k.wgmma_fence();
        let again = k.wgmma(shape, elem, descs[0], descs[1], out[0]);
        k.wgmma_commit();
        k.wgmma_wait(0);
        let x = k.extract(again, n / 2 - 1);
        let y = k.extract(out[0], 0);
        let s = k.add(x, y);
        sink.put(&mut k, s);
    }
    k.finish().expect("valid kernel")
}

/// A producer warp copies into a stage and arrives when its copies land; the other warp
/// waits for the phase, then arrives on a second barrier.
pub fn mbarriers() -> Function {
    use Scalar::*;
    let mut k = Builder::new("mbarriers", 64);
    let src = k.param("src", global(U32));
    let out = k.param("out", global(U32));
    let stage = k.shared_array("stage", U32, 128, 16);
    let bars = k.shared_array("bars", U64, 2, 8);
    let tid = k.tid_x();
    let zero = k.const_u32(0);
    let first = k.eq(tid, zero);
    let full = bars;
    let one = k.const_u32(1);
    let empty = k.ptr_add(bars, one);
    k.if_then(first, |k| {
        let n = k.const_u32(32);
        k.mbarrier_init(full, n);
        k.mbarrier_init(empty, n);
    });
    k.barrier();
    let warp = k.shr_const(tid, 5);
    let lane = k.lane_id();
    let producer = k.eq(warp, zero);
    k.if_else(
        producer,
        &[],
        |k| {
            let four = k.shl_const(lane, 2);
            let from = k.ptr_add(src, four);
            let to = k.ptr_add(stage, four);
            k.cp_async(to, from, 16, CacheOp::Cg);
            k.cp_async_mbarrier_arrive(full);
            vec![]
        },
        |k| {
            let zero = k.const_u32(0);
            k.mbarrier_wait(full, zero);
            let at = k.ptr_add(stage, lane);
            let x = k.load(Type::U32, at);
            let o = k.ptr_add(out, lane);
            k.store(o, x);
            k.mbarrier_arrive(empty);
            vec![]
        },
    );
    k.finish().expect("valid kernel")
}

/// Address arithmetic with every index type in both spaces, casts, pointer selects,
/// several shared arrays.
pub fn addressing() -> Function {
    let mut k = Builder::new("addressing", 128);
    let g = k.param("g", global(Scalar::F64));
    let mut sink = Sink::new(&mut k, &[Scalar::F64, Scalar::F32]);
    let s1 = k.shared_array("a", Scalar::F32, 100, 4);
    let s2 = k.shared_array("b", Scalar::F64, 10, 8);
    let i = k.tid_x();
    for s in [
        Scalar::I8,
        Scalar::U8,
        Scalar::I16,
        Scalar::U16,
        Scalar::I32,
        Scalar::U32,
        Scalar::I64,
        Scalar::U64,
    ] {
        let idx = k.cvt(s, i);
        let pg = k.ptr_add(g, idx);
        let x = k.load(Type::Scalar(Scalar::F64), pg);
        let ps = k.ptr_add(s2, idx);
        k.store(ps, x);
        let pf = k.ptr_add(s1, idx);
        let y = k.load(Type::F32, pf);
        sink.put(&mut k, y);
    }
    let c = k.ptr_cast(Scalar::F64, s1);
    let far = k.ptr_add(c, i);
    let ten = k.const_u32(10);
    let low = k.lt(i, ten);
    let pick = k.select(low, far, s2);
    let z = k.load(Type::Scalar(Scalar::F64), pick);
    sink.put(&mut k, z);
    let gi = k.ptr_add(g, i);
    let gp = k.select(low, g, gi);
    let w = k.load(Type::Scalar(Scalar::F64), gp);
    sink.put(&mut k, w);
    k.finish().expect("valid kernel")
}

/// A realistic kernel: grid-stride sum of a vector, reduced by shuffles, then through
/// shared memory, then with one atomic per block.
pub fn block_sum() -> Function {
    let mut k = Builder::new("block_sum", 256);
    let x = k.param("x", global(Scalar::F32));
    let n = k.param("n", Type::U32);
    let total = k.param("total", global(Scalar::F32));
    let partial = k.shared_array("partial", Scalar::F32, 8, 16);
    let start = k.global_id_x();
    let (nt, nb) = (k.ntid_x(), k.nctaid_x());
    let stride = k.mul(nt, nb);
    let zero = k.const_f32(0.0);
    let acc = k.for_range(start, n, stride, &[zero], |k, i, c| {
        let p = k.ptr_add(x, i);
        let v = k.load_with(Type::F32, p, CacheOp::Nc);
        vec![k.add(c[0], v)]
    });
    let mut s = acc[0];
    for m in [16, 8, 4, 2, 1] {
        let o = k.shfl_bfly(s, m);
        s = k.add(s, o);
    }
    let lane = k.lane_id();
    let tid = k.tid_x();
    let five = k.const_u32(5);
    let warp = k.shr(tid, five);
    let z = k.const_u32(0);
    let first = k.eq(lane, z);
    k.if_then(first, |k| {
        let p = k.ptr_add(partial, warp);
        k.store(p, s);
    });
    k.barrier();
    let leader = k.eq(tid, z);
    k.if_then(leader, |k| {
        let eight = k.const_u32(8);
        let one = k.const_u32(1);
        let sum = k.for_range(z, eight, one, &[zero], |k, w, c| {
            let p = k.ptr_add(partial, w);
            let v = k.load(Type::F32, p);
            vec![k.add(c[0], v)]
        });
        k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, total, sum[0]);
    });
    k.finish().expect("valid kernel")
}

/// Every kernel above.
pub fn all() -> Vec<Function> {
    let mut v: Vec<Function> = storable().into_iter().map(memory).collect();
    v.extend(Scalar::ALL.into_iter().map(arith));
    v.extend(numeric().into_iter().map(convert_from));
    v.extend([
        selects(),
        bits(),
        control(),
        warp(),
        atomics(),
        tensor(),
        warpgroup(),
        mbarriers(),
        addressing(),
        block_sum(),
    ]);
    v
}
