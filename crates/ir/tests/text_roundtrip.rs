//! The text form: `parse(print(f)) == f` and `print(parse(t)) == t`, on hand-built
//! kernels that use every operation and type, on seeded random kernels, on kernels
//! deliberately left ill-formed, and the parser against mutated text.

use std::collections::BTreeSet;

use quench_ir::*;
use rand::{seq::SliceRandom, Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn gptr(s: Scalar) -> Type {
    Type::Ptr(AddrSpace::Global, s)
}

fn fr(shape: MmaShape, role: FragRole, elem: Scalar) -> Type {
    Type::Frag(FragType { shape, role, elem })
}

/// Print, parse back, compare structurally, and print again.
fn round_trip(f: &Function) -> String {
    let text = print(f);
    let g = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&g, f, "parse(print(f)) differs from f; text:\n{text}");
    assert_eq!(print(&g), text);
    text
}

// ---- hand-built kernels ----------------------------------------------------------

/// Uses every operation of the f16 MMA path, every scalar type and every valid
/// fragment type of m16n8k16.
fn kernel_f16() -> Function {
    let mut k = Builder::new("every_op_f16", 128);
    let x = k.param("x", gptr(Scalar::F32));
    let h = k.param("h", gptr(Scalar::F16));
    let out = k.param("out", gptr(Scalar::U32));
    let n = k.param("n", Type::U32);
    let wide = k.param("wide", Type::Scalar(Scalar::I64));
    let tile = k.shared_array("tile", Scalar::F16, 512, 16);
    let words = k.shared_array("words", Scalar::U32, 64, 16);

    // A constant of every scalar type.
    let p = k.const_pred(true);
    let c_s8 = k.const_bits(Type::Scalar(Scalar::I8), 0x80);
    let c_s16 = k.const_bits(Type::Scalar(Scalar::I16), 7);
    let c_u8 = k.const_bits(Type::Scalar(Scalar::U8), 200);
    let c_u16 = k.const_bits(Type::Scalar(Scalar::U16), 65535);
    let c_s32 = k.const_i32(-5);
    let c_u64 = k.const_u64(1 << 40);
    let c_f64 = k.const_f64(-0.0);
    let c_bf16 = k.const_bits(Type::Scalar(Scalar::BF16), 0x3f80);
    let c_f16x2 = k.const_bits(Type::Scalar(Scalar::F16x2), 0x3c00_4000);
    let c_bf16x2 = k.const_bits(Type::Scalar(Scalar::BF16x2), 0x3f80_4000);
    let nan = k.const_bits(Type::F32, 0x7fc0_0001);

    let tid = k.tid_x();
    let lane = k.lane_id();
    let t64 = k.special(Special::GlobalTimer);
    let i = k.global_id_x();
    let inside = k.lt(i, n);
    let sel = k.select(inside, tid, lane);

    // Arithmetic, conversions, bit moves.
    let px = k.ptr_add(x, i);
    let xv = k.load_with(Type::F32, px, CacheOp::Nc);
    let two = k.const_f32(2.0);
    let prod = k.bin_rnd(BinOp::Mul, Some(Round::Rz), xv, two);
    let fm = k.fma(prod, two, nan);
    let r = k.un(UnOp::Rcp(Round::Rm), fm);
    let q = k.div_approx(r, xv);
    let e = k.ex2_approx(q);
    let half = k.cvt(Scalar::F16, e);
    let wide_f = k.cvt(Scalar::F64, e);
    let sum64 = k.add(wide_f, c_f64);
    let back = k.cvt_rnd(Scalar::I32, Some(Round::Rp), true, sum64);
    let m = k.max(back, c_s32);
    let sh = k.shl(m, tid);
    let bits = k.bitcast(Type::U32, e);
    let pc = k.un(UnOp::Popc, bits);
    let small = k.add(c_s8, c_s8);
    let small16 = k.rem(c_s16, c_s16);
    let bytes = k.xor(c_u8, c_u8);
    let halves = k.and(c_u16, c_u16);
    let big = k.mul_hi(c_u64, t64);
    let widened = k.cvt(Scalar::I64, sh);
    let ws = k.sub(wide, widened);
    let np = k.not(p);
    let pp = k.and(np, inside);
    let ph = k.mul(c_f16x2, c_f16x2);
    let pb = k.min(c_bf16x2, c_bf16x2);
    let bf = k.cvt(Scalar::BF16, half);
    let bfs = k.bin(BinOp::Add, bf, c_bf16);
    let pair = k.pack(Type::Scalar(Scalar::F16x2), &[half, half]);
    let lo = k.extract(pair, 0);
    let v4 = k.pack(Type::Vec(Scalar::F32, 4), &[e, e, q, r]);
    let v4e = k.extract(v4, 3);
    let hx = k.ptr_add(h, i);
    let h2p = k.ptr_cast(Scalar::F16x2, hx);
    let h2 = k.load(Type::Scalar(Scalar::F16x2), h2p);
    let hv = k.load(Type::Vec(Scalar::F16, 4), hx);
    let hv0 = k.extract(hv, 1);
    let sum16 = k.add(lo, hv0);
    let ph2 = k.add(ph, h2);
    let as_u = k.bitcast(Type::Scalar(Scalar::U32), pb);
    let mixed = k.add(as_u, bits);

    // Shared memory, barrier, async copies, warp collectives.
    let st = k.ptr_add(tile, tid);
    k.store_with(st, sum16, CacheOp::Wb);
    let wp = k.ptr_add(words, lane);
    k.cp_async(wp, out, 16, CacheOp::Cg);
    k.cp_async_commit();
    k.cp_async_wait(0);
    k.barrier();
    k.fence(Ordering::AcqRel, Scope::Cta);
    let sh_up = k.shfl(ShflMode::Up, mixed, lane);
    let bal = k.vote(VoteMode::Ballot, pp);
    let red = k.redux(ReduxOp::Add, bal);
    let ow = k.ptr_add(out, i);
    let old = k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, ow, red);
    let cas = k.atomic_cas(Ordering::AcqRel, Scope::Gpu, ow, old, sh_up);

    // MMA from ldmatrix fragments.
    let a = k.ldmatrix(
        fr(MmaShape::M16N8K16, FragRole::A, Scalar::F16),
        4,
        false,
        st,
    );
    let b = k.ldmatrix(
        fr(MmaShape::M16N8K16, FragRole::B, Scalar::F16),
        2,
        true,
        st,
    );
    let zero = k.const_f32(0.0);
    let c = k.pack(fr(MmaShape::M16N8K16, FragRole::C, Scalar::F32), &[zero; 4]);
    let d = k.mma(MmaShape::M16N8K16, a, b, c);
    let bfa = k.pack(
        fr(MmaShape::M16N8K16, FragRole::A, Scalar::BF16),
        &[c_bf16x2; 4],
    );
    let bfb = k.pack(
        fr(MmaShape::M16N8K16, FragRole::B, Scalar::BF16),
        &[c_bf16x2; 2],
    );
    let d2 = k.mma(MmaShape::M16N8K16, bfa, bfb, d);
    let d0 = k.extract(d2, 0);

    // Warpgroup MMA: A from registers, then from a descriptor.
    k.fence_proxy_async();
    let desc_b = k.wgmma_desc(tile, 16, 512, Swizzle::B64);
    let desc_a = k.wgmma_desc(st, 128, 256, Swizzle::None);
    let wa = k.ldmatrix(
        fr(MmaShape::M64N16K16, FragRole::A, Scalar::F16),
        4,
        false,
        st,
    );
    let wc = k.pack(
        fr(MmaShape::M64N16K16, FragRole::C, Scalar::F32),
        &[zero; 8],
    );
    k.wgmma_fence();
    let wd = k.wgmma(MmaShape::M64N16K16, Scalar::F16, wa, desc_b, wc);
    let wd = k.wgmma(MmaShape::M64N16K16, Scalar::F16, desc_a, desc_b, wd);
    k.wgmma_commit();
    k.wgmma_wait(0);
    let wd0 = k.extract(wd, 7);
    let d0 = k.add(d0, wd0);

    // mbarriers.
    let bar = k.shared_array("bar", Scalar::U64, 2, 8);
    let count = k.const_u32(128);
    k.mbarrier_init(bar, count);
    k.cp_async_mbarrier_arrive(bar);
    k.mbarrier_arrive(bar);
    let parity = k.const_u32(0);
    k.mbarrier_wait(bar, parity);

    // Structured control flow with results and carried values.
    let res = k.if_else(
        inside,
        &[Type::F32, Type::U32],
        |k| {
            let y = k.add(d0, v4e);
            vec![y, cas]
        },
        |k| {
            let z = k.const_u32(3);
            vec![zero, z]
        },
    );
    let lo_b = k.const_u32(0);
    let step = k.const_u32(1);
    let fin = k.for_range(lo_b, n, step, &[res[0]], |k, iv, carried| {
        k.barrier();
        let f = k.cvt(Scalar::F32, iv);
        vec![k.add(carried[0], f)]
    });
    let fin_bits = k.bitcast(Type::U32, fin[0]);
    // Values made only to use their types and operations.
    let _ = (small, small16, bytes, halves, big, ws, ph2, bfs, sel, pc);
    k.store(ow, fin_bits);
    k.ret();
    k.finish().expect("every_op_f16 verifies")
}

/// The s8 MMA path, vectors of every width and the remaining scalar and vector kinds.
fn kernel_s8() -> Function {
    let mut k = Builder::new("every_op_s8", 64);
    let out = k.param("out", gptr(Scalar::I32));
    let d64 = k.param("d64", gptr(Scalar::F64));
    let bytes = k.shared_array("bytes", Scalar::U16, 1024, 128);
    let tid = k.tid_x();
    let p = k.ptr_add(bytes, tid);
    let a = k.ldmatrix(fr(MmaShape::M16N8K32, FragRole::A, Scalar::I8), 4, false, p);
    let bv = k.ldmatrix(Type::Vec(Scalar::U32, 2), 2, false, p);
    let b0 = k.extract(bv, 0);
    let b1 = k.extract(bv, 1);
    let b = k.pack(fr(MmaShape::M16N8K32, FragRole::B, Scalar::I8), &[b0, b1]);
    let one = k.ldmatrix(Type::U32, 1, true, p);
    let four = k.ldmatrix(Type::Vec(Scalar::U32, 4), 4, false, p);
    let f0 = k.extract(four, 2);
    let ci = k.bitcast(Type::I32, one);
    let cj = k.bitcast(Type::I32, f0);
    let dot = k.dp4a(one, true, f0, false, ci);
    let c = k.pack(
        fr(MmaShape::M16N8K32, FragRole::C, Scalar::I32),
        &[dot, cj, ci, cj],
    );
    let d = k.mma(MmaShape::M16N8K32, a, b, c);
    let v = k.bitcast(Type::Vec(Scalar::I32, 4), d);
    let o = k.ptr_add(out, tid);
    k.store_with(o, v, CacheOp::Cs);
    let pd = k.ptr_add(d64, tid);
    let dv = k.load_with(Type::Vec(Scalar::F64, 2), pd, CacheOp::Lu);
    let dv0 = k.extract(dv, 0);
    let s = k.sqrt(dv0);
    let rounded = k.un(UnOp::RoundInt(Round::Rn), s);
    let neg = k.neg(rounded);
    let ab = k.abs(neg);
    let is_big = k.cmp(CmpOp::Ge, ab, s);
    let byte = k.const_bits(Type::Scalar(Scalar::U8), 7);
    let u8s = k.pack(Type::Vec(Scalar::U8, 4), &[byte; 4]);
    let _ = u8s;
    k.if_then(is_big, |k| {
        let t = k.const_pred(false);
        let any = k.vote(VoteMode::Any, t);
        let w = k.cvt(Scalar::U64, tid);
        let clz = k.un(UnOp::Clz, w);
        let _ = (any, clz);
    });
    k.finish().expect("every_op_s8 verifies")
}

/// Which `Op` variant an instruction is: the exhaustive match makes a new variant fail
/// to compile here until the coverage below includes it.
fn op_kind(op: &Op) -> &'static str {
    match op {
        Op::Const { .. } => "const",
        Op::Param(_) => "param",
        Op::Special(_) => "special",
        Op::Bin { .. } => "bin",
        Op::Fma { .. } => "fma",
        Op::Dp4a { .. } => "dp4a",
        Op::Un { .. } => "un",
        Op::DivApprox { .. } => "div_approx",
        Op::Cmp { .. } => "cmp",
        Op::Select { .. } => "select",
        Op::Cvt { .. } => "cvt",
        Op::Bitcast { .. } => "bitcast",
        Op::Pack { .. } => "pack",
        Op::Extract { .. } => "extract",
        Op::PtrAdd { .. } => "ptr_add",
        Op::PtrCast { .. } => "ptr_cast",
        Op::SharedAddr { .. } => "shared_addr",
        Op::Load { .. } => "load",
        Op::Store { .. } => "store",
        Op::Barrier => "barrier",
        Op::Fence { .. } => "fence",
        Op::Atomic { .. } => "atomic",
        Op::Shfl { .. } => "shfl",
        Op::Vote { .. } => "vote",
        Op::Redux { .. } => "redux",
        Op::Mma { .. } => "mma",
        Op::LdMatrix { .. } => "ldmatrix",
        Op::CpAsync { .. } => "cp_async",
        Op::CpAsyncCommit => "cp_async_commit",
        Op::CpAsyncWait { .. } => "cp_async_wait",
        Op::WgmmaDesc { .. } => "wgmma_desc",
        Op::Wgmma { .. } => "wgmma",
        Op::WgmmaFence => "wgmma_fence",
        Op::WgmmaCommit => "wgmma_commit",
        Op::WgmmaWait { .. } => "wgmma_wait",
        Op::FenceProxyAsync => "fence_proxy_async",
        Op::MbarrierInit { .. } => "mbarrier_init",
        Op::MbarrierArrive { .. } => "mbarrier_arrive",
        Op::MbarrierWait { .. } => "mbarrier_wait",
        Op::CpAsyncMbarrierArrive { .. } => "cp_async_mbarrier_arrive",
        Op::If { .. } => "if",
        Op::For { .. } => "for",
        Op::Yield(_) => "yield",
        Op::Return => "return",
    }
}
const OP_KINDS: usize = 44;

fn type_kind(t: Type) -> String {
    match t {
        Type::Scalar(s) => format!("scalar {s}"),
        Type::Vec(..) => "vec".into(),
        Type::Ptr(space, _) => format!("ptr {}", space.name()),
        Type::Frag(f) => format!("frag {f:?}"),
    }
}

#[test]
fn hand_built_kernels_cover_every_op_and_type_and_round_trip() {
    let kernels = [kernel_f16(), kernel_s8()];
    let mut ops = BTreeSet::new();
    let mut types = BTreeSet::new();
    for f in &kernels {
        round_trip(f);
        f.walk(&mut |inst| {
            ops.insert(op_kind(&inst.op));
        });
        types.extend(f.values.iter().map(|t| type_kind(*t)));
    }
    assert_eq!(ops.len(), OP_KINDS, "ops used: {ops:?}");
    for s in Scalar::ALL {
        assert!(
            types.contains(&format!("scalar {s}")),
            "no value of type {s}"
        );
    }
    // Local pointers have no source in a well-formed kernel (no op yields one), so
    // the ill-formed sweep below covers them.
    for t in ["vec", "ptr global", "ptr shared"] {
        assert!(types.contains(t), "no value of kind {t}");
    }
    for shape in [MmaShape::M16N8K16, MmaShape::M16N8K32] {
        for role in [FragRole::A, FragRole::B, FragRole::C] {
            for elem in Scalar::ALL {
                let ft = FragType { shape, role, elem };
                if ft.is_valid() {
                    assert!(
                        types.contains(&type_kind(Type::Frag(ft))),
                        "no value of {}",
                        Type::Frag(ft)
                    );
                }
            }
        }
    }
}

#[test]
fn printed_form_reads_as_documented() {
    let mut k = Builder::new("scale", 256);
    let x = k.param("x", gptr(Scalar::F32));
    let n = k.param("n", Type::U32);
    let i = k.global_id_x();
    let inside = k.lt(i, n);
    k.if_then(inside, |k| {
        let p = k.ptr_add(x, i);
        let v = k.load(Type::F32, p);
        let two = k.const_f32(2.0);
        let y = k.mul(v, two);
        k.store_with(p, y, CacheOp::Cs);
    });
    let f = k.finish().expect("scale verifies");
    let expected = "\
kernel scale(x: ptr<global, f32>, n: u32) max_threads=256 {
  %0: ptr<global, f32> = param 0 // x
  %1: u32 = param 1 // n
  %2: u32 = special ctaid.x
  %3: u32 = special ntid.x
  %4: u32 = special tid.x
  %5: u32 = mul %2, %3
  %6: u32 = add %5, %4
  %7: pred = cmp.lt %6, %1
  if %7 {
    %8: ptr<global, f32> = ptr_add %0, %6
    %9: f32 = load %8
    %10: f32 = const 2.0
    %11: f32 = mul.rn %9, %10
    store.cs %8, %11
    yield
  }
}
";
    assert_eq!(print(&f), expected);
    assert_eq!(f.to_string(), expected);
    assert_eq!(parse(expected).expect("parses"), f);
}

// ---- every attribute value, well-formed or not ---------------------------------------

/// A kernel that is not verified: every enum value of every operation, odd constants,
/// local pointers, and op types that differ from their result types (written out
/// explicitly by the printer).
fn attribute_sweep() -> Function {
    let mut values = vec![];
    let mut insts = vec![];
    let def = |values: &mut Vec<Type>, ty: Type| {
        values.push(ty);
        Value(values.len() as u32 - 1)
    };
    let push =
        |insts: &mut Vec<Inst>, results: Vec<Value>, op: Op| insts.push(Inst { results, op });
    let all_types: Vec<Type> = {
        let mut t: Vec<Type> = Scalar::ALL.iter().map(|s| Type::Scalar(*s)).collect();
        for s in Scalar::ALL {
            t.push(Type::Vec(s, 2));
            t.push(Type::Vec(s, 3));
            for sp in [AddrSpace::Global, AddrSpace::Shared, AddrSpace::Local] {
                t.push(Type::Ptr(sp, s));
            }
            for shape in [MmaShape::M16N8K16, MmaShape::M16N8K32] {
                for role in [FragRole::A, FragRole::B, FragRole::C] {
                    t.push(fr(shape, role, s));
                }
            }
        }
        t
    };
    // Constants: each type with bit patterns that stress the literal forms.
    let patterns = [
        0u64,
        1,
        0x80,
        0x7fff,
        0x8000,
        0x7c00,
        0xfc00,
        0x7e01,
        0x3c00,
        0x0001,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x8000_0000,
        0x0000_0001,
        0x3f80_0000,
        0x7ff0_0000_0000_0000,
        0x8000_0000_0000_0000,
        0x7ff8_0000_0000_0001,
        0x0000_0000_0000_0001,
        0x3fb9_9999_9999_999a,
        u64::MAX,
        0x1_0000_0000,
    ];
    for t in &all_types {
        for bits in patterns {
            let v = def(&mut values, *t);
            push(&mut insts, vec![v], Op::Const { ty: *t, bits });
        }
    }
    let a = def(&mut values, Type::F32);
    push(
        &mut insts,
        vec![a],
        Op::Const {
            ty: Type::F32,
            bits: 0,
        },
    );
    let ptr = def(&mut values, Type::Ptr(AddrSpace::Local, Scalar::F32));
    push(&mut insts, vec![ptr], Op::Param(7));
    for op in BinOp::ALL {
        for rnd in [
            None,
            Some(Round::Rn),
            Some(Round::Rz),
            Some(Round::Rm),
            Some(Round::Rp),
        ] {
            let r = def(&mut values, Type::F32);
            push(&mut insts, vec![r], Op::Bin { op, rnd, a, b: a });
        }
    }
    let mut un_ops = vec![
        UnOp::Neg,
        UnOp::Abs,
        UnOp::Not,
        UnOp::RcpApprox,
        UnOp::RsqrtApprox,
        UnOp::Ex2Approx,
        UnOp::Lg2Approx,
        UnOp::TanhApprox,
        UnOp::SinApprox,
        UnOp::CosApprox,
        UnOp::Popc,
        UnOp::Clz,
    ];
    for r in Round::ALL {
        un_ops.extend([UnOp::Sqrt(r), UnOp::Rcp(r), UnOp::RoundInt(r)]);
        let v = def(&mut values, Type::F32);
        push(
            &mut insts,
            vec![v],
            Op::Fma {
                rnd: r,
                a,
                b: a,
                c: a,
            },
        );
    }
    let word = def(&mut values, Type::U32);
    push(
        &mut insts,
        vec![word],
        Op::Const {
            ty: Type::U32,
            bits: 0x80ff_017f,
        },
    );
    for (a_signed, b_signed) in [(false, false), (false, true), (true, false), (true, true)] {
        let acc = if a_signed || b_signed {
            Type::I32
        } else {
            Type::U32
        };
        let c = def(&mut values, acc);
        push(&mut insts, vec![c], Op::Const { ty: acc, bits: 7 });
        let v = def(&mut values, acc);
        push(
            &mut insts,
            vec![v],
            Op::Dp4a {
                a_signed,
                b_signed,
                a: word,
                b: word,
                c,
            },
        );
    }
    for op in un_ops {
        let v = def(&mut values, Type::U32);
        push(&mut insts, vec![v], Op::Un { op, a });
    }
    for op in CmpOp::ALL {
        let v = def(&mut values, Type::F32);
        push(&mut insts, vec![v], Op::Cmp { op, a, b: a });
    }
    for s in Special::ALL {
        let v = def(&mut values, Type::F32);
        push(&mut insts, vec![v], Op::Special(s));
    }
    for cache in CacheOp::ALL {
        let v = def(&mut values, Type::F32);
        push(
            &mut insts,
            vec![v],
            Op::Load {
                ty: Type::Vec(Scalar::U8, 2),
                ptr,
                cache,
            },
        );
        push(
            &mut insts,
            vec![],
            Op::Store {
                ptr,
                value: a,
                cache,
            },
        );
        push(
            &mut insts,
            vec![],
            Op::CpAsync {
                dst: ptr,
                src: ptr,
                bytes: 3,
                cache,
            },
        );
    }
    let scopes = [Scope::Cta, Scope::Gpu, Scope::Sys];
    let ords = [
        Ordering::Relaxed,
        Ordering::Acquire,
        Ordering::Release,
        Ordering::AcqRel,
        Ordering::SeqCst,
    ];
    let atoms = [
        AtomOp::Add,
        AtomOp::Min,
        AtomOp::Max,
        AtomOp::And,
        AtomOp::Or,
        AtomOp::Xor,
        AtomOp::Exch,
        AtomOp::Cas,
    ];
    for scope in scopes {
        for ord in ords {
            push(&mut insts, vec![], Op::Fence { ord, scope });
            for op in atoms {
                let b = (op == AtomOp::Cas || ord == Ordering::Release).then_some(a);
                let v = def(&mut values, Type::F32);
                push(
                    &mut insts,
                    vec![v],
                    Op::Atomic {
                        op,
                        ord,
                        scope,
                        ptr,
                        a,
                        b,
                    },
                );
            }
        }
    }
    for mode in [ShflMode::Idx, ShflMode::Up, ShflMode::Down, ShflMode::Bfly] {
        let v = def(&mut values, Type::F32);
        push(
            &mut insts,
            vec![v],
            Op::Shfl {
                mode,
                value: a,
                b: a,
                c: a,
                mask: a,
            },
        );
    }
    for mode in [VoteMode::All, VoteMode::Any, VoteMode::Ballot] {
        let v = def(&mut values, Type::F32);
        push(
            &mut insts,
            vec![v],
            Op::Vote {
                mode,
                pred: a,
                mask: a,
            },
        );
    }
    for op in [
        ReduxOp::Add,
        ReduxOp::Min,
        ReduxOp::Max,
        ReduxOp::And,
        ReduxOp::Or,
        ReduxOp::Xor,
    ] {
        let v = def(&mut values, Type::F32);
        push(
            &mut insts,
            vec![v],
            Op::Redux {
                op,
                value: a,
                mask: a,
            },
        );
    }
    for shape in [MmaShape::M16N8K16, MmaShape::M16N8K32] {
        let v = def(&mut values, Type::F32);
        push(
            &mut insts,
            vec![v],
            Op::Mma {
                shape,
                a,
                b: a,
                c: a,
            },
        );
    }
    for (num, trans) in [(0, false), (1, true), (2, false), (4, true), (255, false)] {
        let v = def(&mut values, Type::U32);
        push(
            &mut insts,
            vec![v],
            Op::LdMatrix {
                ty: Type::U32,
                num,
                trans,
                ptr,
            },
        );
    }
    // Op types that differ from result types, and results where none are expected.
    let v = def(&mut values, Type::F32);
    let w = def(&mut values, Type::U32);
    push(
        &mut insts,
        vec![v, w],
        Op::Cvt {
            to: Scalar::F16,
            rnd: Some(Round::Rn),
            sat: true,
            a,
        },
    );
    push(&mut insts, vec![], Op::Bitcast { to: Type::U32, a });
    push(
        &mut insts,
        vec![],
        Op::Pack {
            ty: Type::Vec(Scalar::F32, 4),
            parts: vec![],
        },
    );
    let v = def(&mut values, Type::U32);
    push(
        &mut insts,
        vec![v],
        Op::PtrCast {
            to: Scalar::F16,
            ptr,
        },
    );
    let v = def(&mut values, Type::Ptr(AddrSpace::Shared, Scalar::F32));
    push(
        &mut insts,
        vec![v],
        Op::PtrCast {
            to: Scalar::F16,
            ptr,
        },
    );
    push(
        &mut insts,
        vec![],
        Op::PtrCast {
            to: Scalar::F16,
            ptr,
        },
    );
    let v = def(&mut values, Type::F32);
    push(
        &mut insts,
        vec![v],
        Op::Load {
            ty: Type::F32,
            ptr,
            cache: CacheOp::Default,
        },
    );
    let v = def(&mut values, Type::U32);
    push(
        &mut insts,
        vec![v],
        Op::Store {
            ptr,
            value: a,
            cache: CacheOp::Default,
        },
    );
    push(&mut insts, vec![], Op::SharedAddr { decl: 9 });
    push(&mut insts, vec![], Op::Extract { a, index: u32::MAX });
    push(&mut insts, vec![], Op::CpAsyncWait { n: u32::MAX });
    push(&mut insts, vec![], Op::CpAsyncCommit);
    push(&mut insts, vec![], Op::Barrier);
    push(&mut insts, vec![], Op::DivApprox { a, b: a });
    push(&mut insts, vec![], Op::Select { cond: a, a, b: a });
    push(&mut insts, vec![], Op::PtrAdd { ptr, index: a });
    push(
        &mut insts,
        vec![],
        Op::Const {
            ty: Type::F32,
            bits: 5,
        },
    );
    // Blocks with arguments where none belong, an `if` whose result list differs from
    // its result values, and a `for` whose arguments don't pair with its carried values.
    let ta = def(&mut values, Type::U32);
    let ea = def(&mut values, Type::Scalar(Scalar::F16));
    let r0 = def(&mut values, Type::F32);
    let then_ = Block {
        args: vec![ta],
        insts: vec![Inst {
            results: vec![],
            op: Op::Return,
        }],
    };
    let else_ = Block {
        args: vec![ea],
        insts: vec![],
    };
    push(
        &mut insts,
        vec![r0],
        Op::If {
            cond: a,
            then_,
            else_,
            results: vec![Type::U32, Type::PRED],
        },
    );
    let fa = def(&mut values, Type::U64);
    let body = Block {
        args: vec![fa],
        insts: vec![Inst {
            results: vec![],
            op: Op::Yield(vec![a, a]),
        }],
    };
    push(
        &mut insts,
        vec![],
        Op::For {
            lo: a,
            hi: a,
            step: a,
            init: vec![a, a],
            body,
        },
    );
    let body = Block {
        args: vec![],
        insts: vec![],
    };
    push(
        &mut insts,
        vec![],
        Op::For {
            lo: a,
            hi: a,
            step: a,
            init: vec![],
            body,
        },
    );
    let empty_then = Block::default();
    let else_yield = Block {
        args: vec![],
        insts: vec![Inst {
            results: vec![],
            op: Op::Yield(vec![]),
        }],
    };
    push(
        &mut insts,
        vec![],
        Op::If {
            cond: a,
            then_: empty_then.clone(),
            else_: else_yield,
            results: vec![],
        },
    );
    let else_vals = Block {
        args: vec![],
        insts: vec![Inst {
            results: vec![],
            op: Op::Yield(vec![a]),
        }],
    };
    push(
        &mut insts,
        vec![],
        Op::If {
            cond: a,
            then_: empty_then,
            else_: else_vals,
            results: vec![],
        },
    );
    let body_arg = def(&mut values, Type::Scalar(Scalar::I64));
    Function {
        name: "not valid: \"sweep\"\n\t\\ \u{1}é".into(),
        params: vec![
            Param {
                name: "1st".into(),
                ty: Type::Vec(Scalar::F64, 4),
            },
            Param {
                name: "".into(),
                ty: Type::PRED,
            },
            Param {
                name: "ok_name".into(),
                ty: Type::Ptr(AddrSpace::Local, Scalar::BF16x2),
            },
        ],
        shared: vec![
            SharedDecl {
                name: "s p".into(),
                elem: Scalar::Pred,
                len: 0,
                align: 3,
            },
            SharedDecl {
                name: "huge".into(),
                elem: Scalar::F64,
                len: u32::MAX,
                align: 1 << 31,
            },
        ],
        max_threads: 0,
        values,
        body: Block {
            args: vec![body_arg],
            insts,
        },
    }
}

#[test]
fn every_attribute_and_ill_formed_structure_round_trips() {
    let f = attribute_sweep();
    assert!(verify(&f).is_err());
    round_trip(&f);
}

// ---- random kernels ----------------------------------------------------------------

/// Builds random well-formed kernels directly as IR: straight-line operations of valid
/// types, nested `if`/`for` with results and carried values, barriers where the
/// control flow is plainly uniform.
struct Gen {
    rng: ChaCha8Rng,
    values: Vec<Type>,
    /// Whether each value is uniform by construction (a subset of what the verifier
    /// proves, so barriers placed under uniform control flow must be accepted).
    uniform: Vec<bool>,
    scopes: Vec<Vec<Value>>,
    params: Vec<Param>,
    shared: Vec<SharedDecl>,
}

/// The scalar types `keep` takes, in [`Scalar::ALL`] order.
fn scalars(keep: fn(Scalar) -> bool) -> Vec<Scalar> {
    Scalar::ALL.into_iter().filter(|&s| keep(s)).collect()
}

/// Every scalar type but `pred`.
fn plain() -> Vec<Scalar> {
    scalars(|s| s != Scalar::Pred)
}

const FLOATS: [Scalar; 4] = [Scalar::F16, Scalar::BF16, Scalar::F32, Scalar::F64];
const SCOPES: [Scope; 3] = [Scope::Cta, Scope::Gpu, Scope::Sys];
const FENCE_ORDS: [Ordering; 4] = [
    Ordering::Acquire,
    Ordering::Release,
    Ordering::AcqRel,
    Ordering::SeqCst,
];

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: ChaCha8Rng::seed_from_u64(seed),
            values: vec![],
            uniform: vec![],
            scopes: vec![vec![]],
            params: vec![],
            shared: vec![],
        }
    }

    fn new_value(&mut self, ty: Type, uniform: bool) -> Value {
        self.values.push(ty);
        self.uniform.push(uniform);
        let v = Value(self.values.len() as u32 - 1);
        if let Some(s) = self.scopes.last_mut() {
            s.push(v);
        }
        v
    }

    fn emit(&mut self, out: &mut Vec<Inst>, ty: Type, op: Op) -> Value {
        let uniform = op.operands().iter().all(|v| self.uniform[v.index()])
            && !matches!(
                op,
                Op::Load { .. }
                    | Op::Atomic { .. }
                    | Op::Shfl { .. }
                    | Op::Vote { .. }
                    | Op::Redux { .. }
                    | Op::Mma { .. }
                    | Op::LdMatrix { .. }
            )
            && !matches!(op, Op::Special(s) if !s.name().contains("ctaid") && !s.name().starts_with("ntid"));
        let v = self.new_value(ty, uniform);
        out.push(Inst {
            results: vec![v],
            op,
        });
        v
    }

    fn visible(&self, want: impl Fn(Type) -> bool) -> Vec<Value> {
        self.scopes
            .iter()
            .flatten()
            .copied()
            .filter(|v| want(self.values[v.index()]))
            .collect()
    }

    fn pick(&mut self, want: impl Fn(Type) -> bool) -> Option<Value> {
        let c = self.visible(want);
        c.choose(&mut self.rng).copied()
    }

    fn one_of<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.rng.gen_range(0..xs.len())]
    }

    fn const_of(&mut self, out: &mut Vec<Inst>, s: Scalar) -> Value {
        let bits = match s {
            Scalar::Pred => self.rng.gen_range(0..2),
            Scalar::F32 if self.rng.gen_bool(0.5) => {
                (self.rng.gen_range(-1e6f32..1e6)).to_bits() as u64
            }
            Scalar::F64 if self.rng.gen_bool(0.5) => self.rng.gen_range(-1e9f64..1e9).to_bits(),
            s => {
                let x: u64 = self.rng.gen();
                if s.bits() >= 64 {
                    x
                } else {
                    x & ((1 << s.bits()) - 1)
                }
            }
        };
        self.emit(
            out,
            Type::Scalar(s),
            Op::Const {
                ty: Type::Scalar(s),
                bits,
            },
        )
    }

    /// A visible value of type `ty`, or a new one built from constants.
    fn get(&mut self, out: &mut Vec<Inst>, ty: Type) -> Value {
        if self.rng.gen_bool(0.7) {
            if let Some(v) = self.pick(|t| t == ty) {
                return v;
            }
        }
        match ty {
            Type::Scalar(s) => self.const_of(out, s),
            Type::Vec(s, n) => {
                let parts: Vec<Value> = (0..n).map(|_| self.get(out, Type::Scalar(s))).collect();
                self.emit(out, ty, Op::Pack { ty, parts })
            }
            Type::Frag(f) => {
                let parts: Vec<Value> = (0..f.regs())
                    .map(|_| self.get(out, Type::Scalar(f.reg_type())))
                    .collect();
                self.emit(out, ty, Op::Pack { ty, parts })
            }
            Type::Ptr(..) => self.pick(|t| t == ty).unwrap_or_else(|| {
                self.pick(|t| matches!(t, Type::Ptr(..)))
                    .expect("kernels always have pointers")
            }),
        }
    }

    fn rand_vec(&mut self) -> Type {
        loop {
            let s = self.one_of(&plain());
            let n = self.one_of(&[2u8, 4]);
            if s.bytes() * n as u32 <= 16 {
                return Type::Vec(s, n);
            }
        }
    }

    fn rand_frag(&mut self) -> Type {
        let all = [
            fr(MmaShape::M16N8K16, FragRole::A, Scalar::F16),
            fr(MmaShape::M16N8K16, FragRole::B, Scalar::F16),
            fr(MmaShape::M16N8K16, FragRole::A, Scalar::BF16),
            fr(MmaShape::M16N8K16, FragRole::B, Scalar::BF16),
            fr(MmaShape::M16N8K16, FragRole::C, Scalar::F32),
            fr(MmaShape::M16N8K32, FragRole::A, Scalar::I8),
            fr(MmaShape::M16N8K32, FragRole::B, Scalar::I8),
            fr(MmaShape::M16N8K32, FragRole::C, Scalar::I32),
        ];
        self.one_of(&all)
    }

    fn rand_type(&mut self) -> Type {
        match self.rng.gen_range(0..10) {
            0 => self.rand_vec(),
            1 => self.rand_frag(),
            2 => Type::PRED,
            _ => Type::Scalar(self.one_of(&plain())),
        }
    }

    fn kernel(&mut self, name: &str) -> Function {
        let mut body = vec![];
        let elems = [
            Scalar::F32,
            Scalar::U32,
            Scalar::I32,
            Scalar::F16,
            Scalar::BF16,
            Scalar::U64,
            Scalar::F64,
            Scalar::U8,
        ];
        for i in 0..self.rng.gen_range(2..6) {
            let ty = if i < 2 || self.rng.gen_bool(0.6) {
                gptr(self.one_of(&elems))
            } else {
                Type::Scalar(self.one_of(&plain()))
            };
            self.params.push(Param {
                name: format!("p{i}"),
                ty,
            });
            self.emit(&mut body, ty, Op::Param(i));
        }
        for i in 0..self.rng.gen_range(0..3) {
            let elem = self.one_of(&[Scalar::F32, Scalar::U16, Scalar::F16, Scalar::U32]);
            let decl = SharedDecl {
                name: format!("s{i}"),
                elem,
                len: self.rng.gen_range(1..512),
                align: 16,
            };
            self.shared.push(decl);
            self.emit(
                &mut body,
                Type::Ptr(AddrSpace::Shared, elem),
                Op::SharedAddr { decl: i },
            );
        }
        self.block(&mut body, 0, true);
        if self.rng.gen_bool(0.3) {
            body.push(Inst {
                results: vec![],
                op: Op::Return,
            });
        }
        Function {
            name: name.into(),
            params: std::mem::take(&mut self.params),
            shared: std::mem::take(&mut self.shared),
            max_threads: self.rng.gen_range(1..=1024),
            values: std::mem::take(&mut self.values),
            body: Block {
                args: vec![],
                insts: body,
            },
        }
    }

    fn block(&mut self, out: &mut Vec<Inst>, depth: u32, uniform_ctx: bool) {
        let steps = if depth == 0 {
            self.rng.gen_range(10..40)
        } else {
            self.rng.gen_range(2..10)
        };
        for _ in 0..steps {
            self.step(out, depth, uniform_ctx);
        }
    }

    /// One random instruction (and whatever it needs to get operands).
    fn step(&mut self, out: &mut Vec<Inst>, depth: u32, uniform_ctx: bool) {
        match self.rng.gen_range(0..30) {
            0 => {
                let s = self.one_of(&Scalar::ALL);
                self.const_of(out, s);
            }
            1 => {
                let s = self.one_of(&Special::ALL);
                self.emit(out, Type::Scalar(s.ty()), Op::Special(s));
            }
            2..=4 => self.bin(out),
            5 if self.rng.gen_bool(0.25) => {
                let (a_signed, b_signed) = (self.rng.gen_bool(0.5), self.rng.gen_bool(0.5));
                let acc = if a_signed || b_signed {
                    Type::I32
                } else {
                    Type::U32
                };
                let words = [Type::U32, Type::I32];
                let (ta, tb) = (self.one_of(&words), self.one_of(&words));
                let (a, b, c) = (self.get(out, ta), self.get(out, tb), self.get(out, acc));
                self.emit(
                    out,
                    acc,
                    Op::Dp4a {
                        a_signed,
                        b_signed,
                        a,
                        b,
                        c,
                    },
                );
            }
            5 => {
                let s = self.one_of(&[
                    Scalar::F16,
                    Scalar::BF16,
                    Scalar::F32,
                    Scalar::F64,
                    Scalar::F16x2,
                    Scalar::BF16x2,
                ]);
                let t = Type::Scalar(s);
                let (a, b, c) = (self.get(out, t), self.get(out, t), self.get(out, t));
                let rnd = self.one_of(&Round::ALL);
                self.emit(out, t, Op::Fma { rnd, a, b, c });
            }
            6 => self.un(out),
            7 => {
                let (a, b) = (self.get(out, Type::F32), self.get(out, Type::F32));
                self.emit(out, Type::F32, Op::DivApprox { a, b });
            }
            8 => {
                let s = self.one_of(&scalars(|s| s.is_int() || s.is_float()));
                let (a, b) = (
                    self.get(out, Type::Scalar(s)),
                    self.get(out, Type::Scalar(s)),
                );
                let op = self.one_of(&CmpOp::ALL);
                self.emit(out, Type::PRED, Op::Cmp { op, a, b });
            }
            9 => {
                let t = self.rand_type();
                let cond = self.get(out, Type::PRED);
                let (a, b) = (self.get(out, t), self.get(out, t));
                self.emit(out, t, Op::Select { cond, a, b });
            }
            10 => self.cvt(out),
            11 => {
                let from = self.rand_type();
                let same: Vec<Type> = (0..40)
                    .map(|_| self.rand_type())
                    .filter(|t| t.bytes() == from.bytes() && !t.is_pred())
                    .collect();
                if let (Some(to), false) = (same.first().copied(), from.is_pred()) {
                    let a = self.get(out, from);
                    self.emit(out, to, Op::Bitcast { to, a });
                }
            }
            12 => {
                let ty = match self.rng.gen_range(0..3) {
                    0 => self.rand_vec(),
                    1 => Type::Scalar(self.one_of(&[Scalar::F16x2, Scalar::BF16x2])),
                    _ => self.rand_frag(),
                };
                let (n, part) = match ty {
                    Type::Vec(s, n) => (n as u32, s),
                    Type::Frag(f) => (f.regs(), f.reg_type()),
                    Type::Scalar(s) => (2, s.packed_elem().expect("packed")),
                    Type::Ptr(..) => unreachable!(),
                };
                let parts = (0..n).map(|_| self.get(out, Type::Scalar(part))).collect();
                self.emit(out, ty, Op::Pack { ty, parts });
            }
            13 => {
                let whole = self.pick(|t| {
                    matches!(
                        t,
                        Type::Vec(..)
                            | Type::Frag(_)
                            | Type::Scalar(Scalar::F16x2 | Scalar::BF16x2)
                    )
                });
                if let Some(a) = whole {
                    let (n, part) = match self.values[a.index()] {
                        Type::Vec(s, n) => (n as u32, s),
                        Type::Frag(f) => (f.regs(), f.reg_type()),
                        Type::Scalar(s) => (2, s.packed_elem().expect("packed")),
                        Type::Ptr(..) => unreachable!(),
                    };
                    let index = self.rng.gen_range(0..n);
                    self.emit(out, Type::Scalar(part), Op::Extract { a, index });
                }
            }
            14 => {
                let ptr = self.get(out, gptr(Scalar::F32));
                let it = Type::Scalar(self.one_of(&scalars(Scalar::is_int)));
                let index = self.get(out, it);
                let ty = self.values[ptr.index()];
                self.emit(out, ty, Op::PtrAdd { ptr, index });
            }
            15 => {
                let ptr = self.get(out, gptr(Scalar::F32));
                let Type::Ptr(space, _) = self.values[ptr.index()] else {
                    unreachable!()
                };
                let to = self.one_of(&plain());
                self.emit(out, Type::Ptr(space, to), Op::PtrCast { to, ptr });
            }
            16 | 17 => self.memory(out),
            18 => {
                if uniform_ctx {
                    out.push(Inst {
                        results: vec![],
                        op: Op::Barrier,
                    });
                }
            }
            19 => {
                let ord = self.one_of(&FENCE_ORDS);
                let scope = self.one_of(&SCOPES);
                out.push(Inst {
                    results: vec![],
                    op: Op::Fence { ord, scope },
                });
            }
            20 => self.atomic(out),
            21 => {
                let s = self.one_of(&[
                    Scalar::I32,
                    Scalar::U32,
                    Scalar::F32,
                    Scalar::F16x2,
                    Scalar::BF16x2,
                ]);
                let value = self.get(out, Type::Scalar(s));
                let (b, c, mask) = (
                    self.get(out, Type::U32),
                    self.get(out, Type::U32),
                    self.get(out, Type::U32),
                );
                let mode =
                    self.one_of(&[ShflMode::Idx, ShflMode::Up, ShflMode::Down, ShflMode::Bfly]);
                self.emit(
                    out,
                    Type::Scalar(s),
                    Op::Shfl {
                        mode,
                        value,
                        b,
                        c,
                        mask,
                    },
                );
            }
            22 => {
                let (pred, mask) = (self.get(out, Type::PRED), self.get(out, Type::U32));
                let mode = self.one_of(&[VoteMode::All, VoteMode::Any, VoteMode::Ballot]);
                let ty = if mode == VoteMode::Ballot {
                    Type::U32
                } else {
                    Type::PRED
                };
                self.emit(out, ty, Op::Vote { mode, pred, mask });
            }
            23 => {
                let t = Type::Scalar(self.one_of(&[Scalar::I32, Scalar::U32]));
                let (value, mask) = (self.get(out, t), self.get(out, Type::U32));
                let op = self.one_of(&[
                    ReduxOp::Add,
                    ReduxOp::Min,
                    ReduxOp::Max,
                    ReduxOp::And,
                    ReduxOp::Or,
                    ReduxOp::Xor,
                ]);
                self.emit(out, t, Op::Redux { op, value, mask });
            }
            24 => {
                let (shape, elem, acc) = self.one_of(&[
                    (MmaShape::M16N8K16, Scalar::F16, Scalar::F32),
                    (MmaShape::M16N8K16, Scalar::BF16, Scalar::F32),
                    (MmaShape::M16N8K32, Scalar::I8, Scalar::I32),
                ]);
                let a = self.get(out, fr(shape, FragRole::A, elem));
                let b = self.get(out, fr(shape, FragRole::B, elem));
                let c = self.get(out, fr(shape, FragRole::C, acc));
                self.emit(out, fr(shape, FragRole::C, acc), Op::Mma { shape, a, b, c });
            }
            25 => {
                if let Some(ptr) = self.pick(|t| matches!(t, Type::Ptr(AddrSpace::Shared, _))) {
                    let num = self.one_of(&[1u8, 2, 4]);
                    let mut options = vec![if num == 1 {
                        Type::U32
                    } else {
                        Type::Vec(Scalar::U32, num)
                    }];
                    for role in [FragRole::A, FragRole::B] {
                        for (shape, e) in [
                            (MmaShape::M16N8K16, Scalar::F16),
                            (MmaShape::M16N8K16, Scalar::BF16),
                            (MmaShape::M16N8K32, Scalar::I8),
                        ] {
                            let ft = FragType {
                                shape,
                                role,
                                elem: e,
                            };
                            if ft.regs() == num as u32 {
                                options.push(Type::Frag(ft));
                            }
                        }
                    }
                    let ty = self.one_of(&options);
                    let trans = self.rng.gen();
                    self.emit(
                        out,
                        ty,
                        Op::LdMatrix {
                            ty,
                            num,
                            trans,
                            ptr,
                        },
                    );
                }
            }
            26 => {
                let dst = self.pick(|t| matches!(t, Type::Ptr(AddrSpace::Shared, _)));
                let src = self.pick(|t| matches!(t, Type::Ptr(AddrSpace::Global, _)));
                if let (Some(dst), Some(src)) = (dst, src) {
                    let bytes = self.one_of(&[4u8, 8, 16]);
                    let cache = if bytes == 16 && self.rng.gen() {
                        CacheOp::Cg
                    } else {
                        CacheOp::Ca
                    };
                    out.push(Inst {
                        results: vec![],
                        op: Op::CpAsync {
                            dst,
                            src,
                            bytes,
                            cache,
                        },
                    });
                    out.push(Inst {
                        results: vec![],
                        op: Op::CpAsyncCommit,
                    });
                    let n = self.rng.gen_range(0..3);
                    out.push(Inst {
                        results: vec![],
                        op: Op::CpAsyncWait { n },
                    });
                }
            }
            27 | 28 if depth < 3 => self.if_(out, depth, uniform_ctx),
            29 if depth < 3 => self.for_(out, depth, uniform_ctx),
            _ => {
                let s = self.one_of(&plain());
                self.const_of(out, s);
            }
        }
    }

    fn bin(&mut self, out: &mut Vec<Inst>) {
        use BinOp::*;
        let s = self.one_of(&Scalar::ALL);
        let ops: Vec<BinOp> = if s == Scalar::Pred {
            vec![And, Or, Xor]
        } else if s.is_int() {
            BinOp::ALL.to_vec()
        } else if matches!(s, Scalar::F32 | Scalar::F64) {
            vec![Add, Sub, Mul, Div, Min, Max]
        } else {
            vec![Add, Sub, Mul, Min, Max]
        };
        let op = self.one_of(&ops);
        let a = self.get(out, Type::Scalar(s));
        let b = if matches!(op, Shl | Shr) {
            self.get(out, Type::U32)
        } else {
            self.get(out, Type::Scalar(s))
        };
        let inexact = !s.is_int() && s != Scalar::Pred && matches!(op, Add | Sub | Mul | Div);
        let rnd = inexact.then(|| self.one_of(&Round::ALL));
        self.emit(out, Type::Scalar(s), Op::Bin { op, rnd, a, b });
    }

    fn un(&mut self, out: &mut Vec<Inst>) {
        let r = self.one_of(&Round::ALL);
        let choices: Vec<(UnOp, &[Scalar])> = vec![
            (
                UnOp::Neg,
                &[
                    Scalar::I8,
                    Scalar::I32,
                    Scalar::I64,
                    Scalar::F16,
                    Scalar::F32,
                    Scalar::BF16x2,
                ],
            ),
            (
                UnOp::Abs,
                &[Scalar::I16, Scalar::F64, Scalar::F16x2, Scalar::BF16],
            ),
            (
                UnOp::Not,
                &[Scalar::Pred, Scalar::U8, Scalar::U32, Scalar::I64],
            ),
            (UnOp::Sqrt(r), &[Scalar::F32, Scalar::F64]),
            (UnOp::Rcp(r), &[Scalar::F32, Scalar::F64]),
            (UnOp::RoundInt(r), &FLOATS),
            (UnOp::Popc, &[Scalar::U32, Scalar::I64]),
            (UnOp::Clz, &[Scalar::I32, Scalar::U64]),
            (UnOp::RcpApprox, &[Scalar::F32]),
            (UnOp::RsqrtApprox, &[Scalar::F32]),
            (UnOp::Ex2Approx, &[Scalar::F32]),
            (UnOp::Lg2Approx, &[Scalar::F32]),
            (UnOp::TanhApprox, &[Scalar::F32]),
            (UnOp::SinApprox, &[Scalar::F32]),
            (UnOp::CosApprox, &[Scalar::F32]),
        ];
        let (op, types) = choices[self.rng.gen_range(0..choices.len())];
        let s = self.one_of(types);
        let a = self.get(out, Type::Scalar(s));
        let ty = if matches!(op, UnOp::Popc | UnOp::Clz) {
            Type::U32
        } else {
            Type::Scalar(s)
        };
        self.emit(out, ty, Op::Un { op, a });
    }

    fn cvt(&mut self, out: &mut Vec<Inst>) {
        let all = scalars(|s| s.is_int() || s.is_float());
        let (from, to) = (self.one_of(&all), self.one_of(&all));
        let inexact = (from.is_int() && to.is_float())
            || (from.is_float() && to.is_int())
            || (from.is_float() && to.is_float() && from != to && to.bits() <= from.bits());
        let rnd = inexact.then(|| self.one_of(&Round::ALL));
        let sat = self.rng.gen();
        let a = self.get(out, Type::Scalar(from));
        self.emit(out, Type::Scalar(to), Op::Cvt { to, rnd, sat, a });
    }

    fn memory(&mut self, out: &mut Vec<Inst>) {
        let Some(ptr) = self.pick(|t| matches!(t, Type::Ptr(..))) else {
            return;
        };
        let Type::Ptr(space, elem) = self.values[ptr.index()] else {
            return;
        };
        let ty = match self.rng.gen_range(0..3) {
            0 if elem.bytes() * 2 <= 16 => Type::Vec(elem, 2),
            1 if elem.bytes() * 4 <= 16 => Type::Vec(elem, 4),
            _ => Type::Scalar(elem),
        };
        if self.rng.gen() {
            let caches: Vec<CacheOp> = CacheOp::ALL
                .into_iter()
                .filter(|c| c.valid_for_load() && (*c != CacheOp::Nc || space == AddrSpace::Global))
                .collect();
            let cache = self.one_of(&caches);
            self.emit(out, ty, Op::Load { ty, ptr, cache });
        } else {
            let caches: Vec<CacheOp> = CacheOp::ALL
                .into_iter()
                .filter(|c| c.valid_for_store())
                .collect();
            let cache = self.one_of(&caches);
            let value = self.get(out, ty);
            out.push(Inst {
                results: vec![],
                op: Op::Store { ptr, value, cache },
            });
        }
    }

    fn atomic(&mut self, out: &mut Vec<Inst>) {
        let Some(ptr) =
            self.pick(|t| matches!(t, Type::Ptr(AddrSpace::Global | AddrSpace::Shared, _)))
        else {
            return;
        };
        let Type::Ptr(_, elem) = self.values[ptr.index()] else {
            return;
        };
        let mut ops = vec![];
        if matches!(
            elem,
            Scalar::I32
                | Scalar::U32
                | Scalar::U64
                | Scalar::F32
                | Scalar::F64
                | Scalar::F16
                | Scalar::BF16
        ) {
            ops.push(AtomOp::Add);
        }
        if matches!(elem, Scalar::I32 | Scalar::U32 | Scalar::U64) {
            ops.extend([
                AtomOp::Min,
                AtomOp::Max,
                AtomOp::And,
                AtomOp::Or,
                AtomOp::Xor,
            ]);
        }
        if elem.bits() >= 32 {
            ops.extend([AtomOp::Exch, AtomOp::Cas]);
        }
        if ops.is_empty() {
            return;
        }
        let op = self.one_of(&ops);
        let t = Type::Scalar(elem);
        let a = self.get(out, t);
        let b = (op == AtomOp::Cas).then(|| self.get(out, t));
        let ord = self.one_of(&[
            Ordering::Relaxed,
            Ordering::Acquire,
            Ordering::Release,
            Ordering::AcqRel,
            Ordering::SeqCst,
        ]);
        let scope = self.one_of(&SCOPES);
        self.emit(
            out,
            t,
            Op::Atomic {
                op,
                ord,
                scope,
                ptr,
                a,
                b,
            },
        );
    }

    /// A nested block whose arguments are already defined: random body, then a yield
    /// of values of `yield_types`.
    fn nested(
        &mut self,
        args: Vec<Value>,
        yield_types: &[Type],
        depth: u32,
        uniform_ctx: bool,
    ) -> Block {
        self.scopes.push(args.clone());
        let mut insts = vec![];
        self.block(&mut insts, depth + 1, uniform_ctx);
        let vals = yield_types
            .iter()
            .map(|t| self.get(&mut insts, *t))
            .collect();
        insts.push(Inst {
            results: vec![],
            op: Op::Yield(vals),
        });
        self.scopes.pop();
        Block { args, insts }
    }

    fn result_types(&mut self) -> Vec<Type> {
        (0..self.rng.gen_range(0..3))
            .map(|_| match self.pick(|_| true) {
                Some(v) if self.rng.gen_bool(0.5) => self.values[v.index()],
                _ => self.rand_type(),
            })
            .collect()
    }

    fn if_(&mut self, out: &mut Vec<Inst>, depth: u32, uniform_ctx: bool) {
        let cond = self.get(out, Type::PRED);
        let inner = uniform_ctx && self.uniform[cond.index()];
        let results = self.result_types();
        let then_ = self.nested(vec![], &results, depth, inner);
        let else_ = self.nested(vec![], &results, depth, inner);
        let res: Vec<Value> = results.iter().map(|t| self.new_value(*t, false)).collect();
        out.push(Inst {
            results: res,
            op: Op::If {
                cond,
                then_,
                else_,
                results,
            },
        });
    }

    fn for_(&mut self, out: &mut Vec<Inst>, depth: u32, uniform_ctx: bool) {
        let s = self.one_of(&scalars(Scalar::is_int));
        let t = Type::Scalar(s);
        let (lo, hi, step) = (self.get(out, t), self.get(out, t), self.get(out, t));
        let bounds_uniform = [lo, hi, step].iter().all(|v| self.uniform[v.index()]);
        let carried = self.result_types();
        let init: Vec<Value> = carried.iter().map(|t| self.get(out, *t)).collect();
        // Block arguments are defined in the body's scope, not the enclosing one.
        self.scopes.push(vec![]);
        let mut args = vec![self.new_value(t, bounds_uniform)];
        args.extend(carried.iter().map(|t| self.new_value(*t, false)));
        self.scopes.pop();
        let body = self.nested(args, &carried, depth, uniform_ctx && bounds_uniform);
        let res: Vec<Value> = carried.iter().map(|t| self.new_value(*t, false)).collect();
        out.push(Inst {
            results: res,
            op: Op::For {
                lo,
                hi,
                step,
                init,
                body,
            },
        });
    }
}

#[test]
fn random_kernels_verify_and_round_trip() {
    let seed: u64 = rand::random();
    for i in 0..300u64 {
        let f = Gen::new(seed ^ i).kernel(&format!("random_{i}"));
        if let Err(e) = verify(&f) {
            panic!(
                "seed {seed} ^ {i}: generated kernel rejected: {e}\n{}",
                print(&f)
            );
        }
        round_trip(&f);
    }
}

/// Random changes that keep every value defined once but break well-formedness: the
/// printer must still write exactly what is there.
fn mutate_structure(f: &mut Function, rng: &mut ChaCha8Rng) {
    let n = f.values.len();
    for _ in 0..rng.gen_range(1..6) {
        match rng.gen_range(0..4) {
            0 if n > 0 => {
                let v = rng.gen_range(0..n);
                f.values[v] = Type::Vec(Scalar::ALL[rng.gen_range(0..15)], rng.gen_range(0..6));
            }
            1 => {
                let v = Value(f.values.len() as u32);
                f.values.push(Type::Scalar(Scalar::U16));
                f.body.insts.push(Inst {
                    results: vec![v],
                    op: Op::Barrier,
                });
            }
            2 => {
                if let Some(inst) = f
                    .body
                    .insts
                    .iter_mut()
                    .find(|i| matches!(i.op, Op::If { .. } | Op::For { .. }))
                {
                    match &mut inst.op {
                        Op::If { results, .. } => results.push(Type::Scalar(Scalar::F64)),
                        Op::For { init, .. } => init.push(Value(0)),
                        _ => {}
                    }
                }
            }
            _ => {
                let target = Type::Scalar(Scalar::ALL[rng.gen_range(0..15)]);
                for inst in f.body.insts.iter_mut() {
                    match &mut inst.op {
                        Op::Load { ty, .. }
                        | Op::Pack { ty, .. }
                        | Op::Const { ty, .. }
                        | Op::LdMatrix { ty, .. } => *ty = target,
                        Op::Bitcast { to, .. } => *to = target,
                        _ => {}
                    }
                }
            }
        }
    }
}

#[test]
fn ill_formed_random_kernels_round_trip() {
    let seed: u64 = rand::random();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in 0..200u64 {
        let mut f = Gen::new(seed.wrapping_add(i)).kernel("mutant");
        mutate_structure(&mut f, &mut rng);
        let text = print(&f);
        let g = parse(&text).unwrap_or_else(|e| panic!("seed {seed}+{i}: {e}\n{text}"));
        assert_eq!(g, f, "seed {seed}+{i}:\n{text}");
    }
}

// ---- the parser against malformed text -------------------------------------------

const VOCAB: [&str; 24] = [
    "%",
    "%0",
    "%99999",
    "%4294967296",
    ":",
    "=",
    ",",
    "{",
    "}",
    "(",
    ")",
    "<",
    ">",
    "->",
    "\"",
    "\\",
    "-",
    "f32",
    "vec3<u8>",
    "yield",
    "if",
    "for",
    "0x",
    "\n",
];

fn mutate_text(text: &str, rng: &mut ChaCha8Rng) -> String {
    let mut s: Vec<char> = text.chars().collect();
    for _ in 0..rng.gen_range(1..4) {
        let len = s.len();
        if len == 0 {
            break;
        }
        let at = rng.gen_range(0..len);
        match rng.gen_range(0..5) {
            0 => {
                let end = (at + rng.gen_range(1..12)).min(len);
                s.drain(at..end);
            }
            1 => {
                let w = VOCAB[rng.gen_range(0..VOCAB.len())];
                s.splice(at..at, w.chars());
            }
            2 => s[at] = char::from(rng.gen_range(0x20u8..0x7f)),
            3 => {
                s.truncate(at);
            }
            _ => {
                // Duplicate a line somewhere else.
                let lines: Vec<String> = s
                    .iter()
                    .collect::<String>()
                    .lines()
                    .map(String::from)
                    .collect();
                let line = &lines[rng.gen_range(0..lines.len())];
                let pos = s
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| **c == '\n')
                    .map(|(i, _)| i + 1)
                    .collect::<Vec<_>>();
                if let Some(p) = pos.choose(rng) {
                    s.splice(*p..*p, format!("{line}\n").chars());
                }
            }
        }
    }
    s.into_iter().collect()
}

#[test]
fn mutated_text_gives_errors_not_panics() {
    let seed: u64 = rand::random();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut texts: Vec<String> = (0..20u64)
        .map(|i| print(&Gen::new(seed ^ i).kernel("fuzz")))
        .collect();
    texts.push(print(&kernel_f16()));
    texts.push(print(&attribute_sweep()));
    let (mut ok, mut failed) = (0, 0);
    for case in 0..5000 {
        let base = &texts[case % texts.len()];
        let text = mutate_text(base, &mut rng);
        match parse(&text) {
            Ok(g) => {
                ok += 1;
                // Whatever parses is a function the verifier and printer handle, and
                // its printed form reads back to it.
                let _ = verify(&g);
                let again =
                    parse(&print(&g)).unwrap_or_else(|e| panic!("seed {seed} case {case}: {e}"));
                assert_eq!(again, g, "seed {seed} case {case}");
            }
            Err(e) => {
                failed += 1;
                let line_count = text.lines().count() as u32 + 1;
                assert!(
                    e.line >= 1 && e.line <= line_count,
                    "seed {seed} case {case}: {e}"
                );
                assert!(e.column >= 1);
            }
        }
    }
    assert!(
        failed > ok,
        "mutations should mostly break the text ({ok} parsed, {failed} failed)"
    );
}

#[test]
fn parse_errors_name_place_and_expectation() {
    let cases: &[(&str, u32, u32, &str)] = &[
        (
            "kernel k() max_threads=1 {\n  %0: f32 = add.rn %1, %2\n}\n",
            2,
            20,
            "%1 is used but never defined",
        ),
        (
            "kernel k() max_threads=1 {\n  %0: f32 = frob %1\n}\n",
            2,
            13,
            "unknown operation `frob`",
        ),
        (
            "kernel k() max_threads=1 {\n  %0: f31 = const 1\n}\n",
            2,
            7,
            "unknown type `f31`",
        ),
        (
            "kernel k() max_threads=1 {\n  %0: u8 = const 256\n}\n",
            2,
            18,
            "does not fit in u8",
        ),
        (
            "kernel k() max_threads=1 {\n  %1: u32 = const 1\n}\n",
            2,
            3,
            "%0 is never defined",
        ),
        (
            "kernel k() max_threads=1 {\n  %0: u32 = const 1\n  %0: f32 = const 1.0\n}\n",
            3,
            3,
            "defined with type f32",
        ),
        (
            "kernel k() max_threads=1 {\n  store %0 %1\n}\n",
            2,
            12,
            "expected `,`, found `%1`",
        ),
        (
            "kernel k() max_threads=1 {\n  %0: u32 = load.xx %1\n}\n",
            2,
            13,
            "unknown modifier `load.xx`",
        ),
        (
            "kernel k() max_threads=1 {\n  %0: f32 = fma %1, %1, %1\n}\n",
            2,
            13,
            "expected a rounding mode after `fma`",
        ),
        (
            "kernel k(a b) max_threads=1 {\n}\n",
            1,
            12,
            "expected `:`, found `b`",
        ),
        (
            "kernel \"k max_threads=1 {\n}\n",
            1,
            8,
            "unterminated string",
        ),
        (
            "kernel k() max_threads=1 {\n  barrier\n",
            3,
            1,
            "expected `}`, found end of input",
        ),
        (
            "kernel k() max_threads=1 {\n  barrier # x\n}\n",
            2,
            11,
            "unexpected character '#'",
        ),
        (
            "kernel k() max_threads=1 {\n}\nkernel",
            3,
            1,
            "expected end of input after the kernel",
        ),
    ];
    for (text, line, column, what) in cases {
        let e = parse(text).expect_err(text);
        let msg = e.to_string();
        assert!(
            msg.contains(what),
            "{text:?}: got `{msg}`, expected it to contain `{what}`"
        );
        assert_eq!((e.line, e.column), (*line, *column), "{text:?}: {msg}");
    }
}

#[test]
fn nesting_is_bounded() {
    let mut text = String::from("kernel k() max_threads=1 {\n  %0: pred = const true\n");
    for _ in 0..1000 {
        text.push_str("if %0 {\n");
    }
    let e = parse(&text).expect_err("too deep");
    assert_eq!(e.kind, ParseErrorKind::TooDeep);
}

#[test]
fn the_deepest_nesting_the_parser_takes_verifies_and_prints_on_a_small_stack() {
    // The parser's limit bounds the recursion of everything after it (verify, print): on
    // a thread with a 2 MiB stack (libtest's, tokio's), none may run out of stack.
    let depth = quench_ir::parse::MAX_NESTING - 1;
    let mut text = String::from("kernel k() max_threads=1 {\n  %0: pred = const true\n");
    text.push_str(&"if %0 {\n".repeat(depth));
    text.push_str(&"}\n".repeat(depth));
    text.push_str("}\n");
    let worker = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let f = parse(&text).expect("parses at the limit");
            let _ = quench_ir::verify(&f);
            let printed = quench_ir::print(&f);
            assert_eq!(
                quench_ir::print(&parse(&printed).expect("reparses")),
                printed
            );
        })
        .expect("spawns");
    worker.join().expect("no stack overflow");
}
