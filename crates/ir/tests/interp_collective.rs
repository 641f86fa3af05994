//! Interpreter: warp shuffles, votes and reductions, their member masks, and atomics.

mod interp_support;

use interp_support::*;
use quench_ir::interp::{launch, Device, InterpError};
use quench_ir::{
    AddrSpace, AtomOp, Builder, Function, Op, Ordering, ReduxOp, Scalar, Scope, ShflMode, Type,
    Value, VoteMode,
};
use rand::Rng;

const PU32: Type = Type::Ptr(AddrSpace::Global, Scalar::U32);

fn store_at(k: &mut Builder, base: Value, i: Value, v: Value) {
    let p = k.ptr_add(base, i);
    k.store(p, v);
}

fn load_at(k: &mut Builder, ty: Type, base: Value, i: Value) -> Value {
    let p = k.ptr_add(base, i);
    k.load(ty, p)
}

/// `out[t] = shfl.mode(vals[t], bs[t], c)` over the full warp.
fn shuffle_kernel(mode: ShflMode) -> Function {
    let mut k = Builder::new("shuffle", 64);
    let vals = k.param("vals", PU32);
    let bs = k.param("bs", PU32);
    let c = k.param("c", Type::U32);
    let out = k.param("out", PU32);
    let t = k.tid_x();
    let v = load_at(&mut k, Type::U32, vals, t);
    let b = load_at(&mut k, Type::U32, bs, t);
    let mask = k.const_u32(u32::MAX);
    let r = k.emit(
        Type::U32,
        Op::Shfl {
            mode,
            value: v,
            b,
            c,
            mask,
        },
    );
    store_at(&mut k, out, t, r);
    k.finish().expect("verifies")
}

/// Every mode and segment width against CUDA's `__shfl*_sync(mask, v, x, width)`
/// definitions (which pass `c = (32 - width) << 8`, `| 31` except for `up`).
#[test]
fn shuffles_in_every_mode_and_width() {
    let mut rng = rng();
    for mode in [ShflMode::Idx, ShflMode::Up, ShflMode::Down, ShflMode::Bfly] {
        let f = shuffle_kernel(mode);
        for width in [32u32, 16, 8, 4] {
            let vals: Vec<u32> = (0..64).map(|_| rng.gen()).collect();
            // idx: any lane number (only its low bits count); up/down: a delta below
            // the width; bfly: a lane mask below the width.
            let bs: Vec<u32> = (0..64)
                .map(|_| {
                    if mode == ShflMode::Idx {
                        rng.gen_range(0..64)
                    } else {
                        rng.gen_range(0..width)
                    }
                })
                .collect();
            let c = ((32 - width) << 8) | if mode == ShflMode::Up { 0 } else { 31 };
            let mut dev = Device::new();
            let (vp, bp, op) = (
                upload_u32(&mut dev, &vals),
                upload_u32(&mut dev, &bs),
                output(&mut dev, 4 * 64),
            );
            launch(&f, &cfg(1, 64), &[vp, bp, c as u64, op], &mut dev).expect("runs");
            let out = download_u32(&dev, op, 64);
            for t in 0..64usize {
                let (warp, lane) = (t / 32 * 32, (t % 32) as u32);
                let start = lane & !(width - 1);
                let b = bs[t];
                let src = match mode {
                    ShflMode::Idx => start + b % width,
                    ShflMode::Up if lane - start >= b => lane - b,
                    ShflMode::Down if lane - start + b < width => lane + b,
                    ShflMode::Bfly => lane ^ b,
                    _ => lane,
                };
                assert_eq!(
                    out[t],
                    vals[warp + src as usize],
                    "{mode:?} width {width} thread {t} b {b}"
                );
            }
        }
    }
}

/// Inside `if lane < 16`: a mask of exactly those lanes works; a full mask (naming
/// lanes that are alive elsewhere) and a read of lane 20 are errors.
#[test]
fn shuffle_masks_must_match_the_executing_lanes() {
    let mut k = Builder::new("partial_shuffle", 32);
    let mask = k.param("mask", Type::U32);
    let src = k.param("src", Type::U32);
    let out = k.param("out", PU32);
    let lane = k.lane_id();
    let sixteen = k.const_u32(16);
    let c = k.lt(lane, sixteen);
    k.if_then(c, |k| {
        let (thirty_one, hundred) = (k.const_u32(31), k.const_u32(100));
        let v = k.add(lane, hundred);
        let r = k.emit(
            Type::U32,
            Op::Shfl {
                mode: ShflMode::Idx,
                value: v,
                b: src,
                c: thirty_one,
                mask,
            },
        );
        store_at(k, out, lane, r);
    });
    let f = k.finish().expect("verifies");
    let mut dev = Device::new();
    let o = output(&mut dev, 4 * 32);
    launch(&f, &cfg(1, 32), &[0xffff, 5, o], &mut dev).expect("runs");
    let got = download_u32(&dev, o, 32);
    assert!(got[..16].iter().all(|&x| x == 105) && got[16..].iter().all(|&x| x == POISON_U32));

    match launch(&f, &cfg(1, 32), &[u32::MAX as u64, 5, o], &mut dev) {
        Err(InterpError::CollectiveMask {
            lane: 0,
            mask: u32::MAX,
            active: 0xffff,
            ..
        }) => {}
        other => panic!("expected a mask error, got {other:?}"),
    }
    match launch(&f, &cfg(1, 32), &[0xffff, 20, o], &mut dev) {
        Err(InterpError::ShuffleInactiveSource {
            lane: 0, src: 20, ..
        }) => {}
        other => panic!("expected an inactive-source error, got {other:?}"),
    }
}

/// vote.all/any/ballot over the full warp and over the lanes of a branch, with
/// predicates that are all true, all false, or random.
#[test]
fn votes_over_active_lanes() {
    let mut rng = rng();
    let mut k = Builder::new("votes", 128);
    let preds = k.param("preds", PU32);
    let out = k.param("out", PU32);
    let t = k.tid_x();
    let x = load_at(&mut k, Type::U32, preds, t);
    let zero = k.const_u32(0);
    let p = k.ne(x, zero);
    let full = k.const_u32(u32::MAX);
    let lane = k.lane_id();
    let three = k.const_u32(3);
    let r = k.rem(lane, three);
    let in_branch = k.ne(r, zero);
    let branch_mask = k.emit(
        Type::U32,
        Op::Vote {
            mode: VoteMode::Ballot,
            pred: in_branch,
            mask: full,
        },
    );
    let six = k.const_u32(6);
    let base = k.mul(t, six);
    let emit_votes = |k: &mut Builder, mask: Value, first: u32| {
        for (i, mode) in [VoteMode::All, VoteMode::Any, VoteMode::Ballot]
            .into_iter()
            .enumerate()
        {
            let ty = if mode == VoteMode::Ballot {
                Type::U32
            } else {
                Type::PRED
            };
            let v = k.emit(
                ty,
                Op::Vote {
                    mode,
                    pred: p,
                    mask,
                },
            );
            let v = if ty == Type::PRED {
                let (one, zero) = (k.const_u32(1), k.const_u32(0));
                k.select(v, one, zero)
            } else {
                v
            };
            let off = k.const_u32(first + i as u32);
            let at = k.add(base, off);
            store_at(k, out, at, v);
        }
    };
    emit_votes(&mut k, full, 0);
    k.if_then(in_branch, |k| emit_votes(k, branch_mask, 3));
    let f = k.finish().expect("verifies");

    let mut preds = vec![];
    for warp in 0..4 {
        preds.extend((0..32).map(|_| match warp {
            0 => 1,
            1 => 0,
            _ => rng.gen_range(0..2u32),
        }));
    }
    let mut dev = Device::new();
    let (pp, op) = (upload_u32(&mut dev, &preds), output(&mut dev, 4 * 6 * 128));
    launch(&f, &cfg(1, 128), &[pp, op], &mut dev).expect("runs");
    let out = download_u32(&dev, op, 6 * 128);
    for t in 0..128usize {
        let w = t / 32 * 32;
        let bits = |lanes: &dyn Fn(usize) -> bool| {
            (0..32)
                .filter(|&l| lanes(l) && preds[w + l] != 0)
                .fold(0u32, |m, l| m | 1 << l)
        };
        let all_lanes = bits(&|_| true);
        let branch = (0..32).filter(|l| l % 3 != 0).fold(0u32, |m, l| m | 1 << l);
        let in_branch = bits(&|l| l % 3 != 0);
        let got = &out[6 * t..6 * t + 6];
        assert_eq!(
            got[..3],
            [
                (all_lanes == u32::MAX) as u32,
                (all_lanes != 0) as u32,
                all_lanes
            ],
            "thread {t}"
        );
        if t % 32 % 3 != 0 {
            assert_eq!(
                got[3..],
                [
                    (in_branch == branch) as u32,
                    (in_branch != 0) as u32,
                    in_branch
                ],
                "thread {t}"
            );
        } else {
            assert_eq!(
                got[3..],
                [POISON_U32; 3],
                "thread {t} is outside the branch"
            );
        }
    }
}

/// redux.sync of every operation on u32 and s32, over the full warp and over the odd
/// lanes.
#[test]
fn reductions_over_active_lanes() {
    let mut rng = rng();
    let ops = [
        ReduxOp::Add,
        ReduxOp::Min,
        ReduxOp::Max,
        ReduxOp::And,
        ReduxOp::Or,
        ReduxOp::Xor,
    ];
    for signed in [false, true] {
        let ty = if signed { Type::I32 } else { Type::U32 };
        let mut k = Builder::new("redux", 64);
        let vals = k.param(
            "vals",
            Type::Ptr(AddrSpace::Global, ty.scalar().unwrap_or(Scalar::U32)),
        );
        let out = k.param("out", PU32);
        let t = k.tid_x();
        let v = load_at(&mut k, ty, vals, t);
        let lane = k.lane_id();
        let (one, two, full) = (k.const_u32(1), k.const_u32(2), k.const_u32(u32::MAX));
        let odd = k.rem(lane, two);
        let odd = k.eq(odd, one);
        let odd_mask = k.emit(
            Type::U32,
            Op::Vote {
                mode: VoteMode::Ballot,
                pred: odd,
                mask: full,
            },
        );
        let n = k.const_u32(2 * ops.len() as u32);
        let base = k.mul(t, n);
        let emit = |k: &mut Builder, mask: Value, first: usize| {
            for (i, op) in ops.iter().enumerate() {
                let r = k.emit(
                    ty,
                    Op::Redux {
                        op: *op,
                        value: v,
                        mask,
                    },
                );
                let r = k.bitcast(Type::U32, r);
                let off = k.const_u32((first + i) as u32);
                let at = k.add(base, off);
                store_at(k, out, at, r);
            }
        };
        emit(&mut k, full, 0);
        k.if_then(odd, |k| emit(k, odd_mask, ops.len()));
        let f = k.finish().expect("verifies");

        let vals: Vec<u32> = (0..64).map(|_| rng.gen()).collect();
        let mut dev = Device::new();
        let (vp, op) = (
            upload_u32(&mut dev, &vals),
            output(&mut dev, 4 * 64 * 2 * ops.len()),
        );
        launch(&f, &cfg(1, 64), &[vp, op], &mut dev).expect("runs");
        let out = download_u32(&dev, op, 64 * 2 * ops.len());
        for t in 0..64usize {
            let w = &vals[t / 32 * 32..][..32];
            let reduce = |lanes: Vec<u32>| -> Vec<u32> {
                let key = |x: &u32| {
                    if signed {
                        (*x as i32) as i64
                    } else {
                        *x as i64
                    }
                };
                vec![
                    lanes.iter().fold(0u32, |a, x| a.wrapping_add(*x)),
                    *lanes.iter().min_by_key(|x| key(x)).unwrap_or(&0),
                    *lanes.iter().max_by_key(|x| key(x)).unwrap_or(&0),
                    lanes.iter().fold(u32::MAX, |a, x| a & x),
                    lanes.iter().fold(0, |a, x| a | x),
                    lanes.iter().fold(0, |a, x| a ^ x),
                ]
            };
            let got = &out[t * 2 * ops.len()..][..2 * ops.len()];
            assert_eq!(
                got[..ops.len()],
                reduce(w.to_vec())[..],
                "thread {t} signed {signed}"
            );
            let odd: Vec<u32> = w.iter().skip(1).step_by(2).copied().collect();
            let want = if t % 2 == 1 {
                reduce(odd)
            } else {
                vec![POISON_U32; ops.len()]
            };
            assert_eq!(
                got[ops.len()..],
                want[..],
                "thread {t} signed {signed} (odd lanes)"
            );
        }
    }
}

/// Every thread of four blocks increments one counter: the old values it sees are
/// each count exactly once.
#[test]
fn contended_atomic_counter() {
    let mut k = Builder::new("counter", 256);
    let counter = k.param("counter", PU32);
    let olds = k.param("olds", PU32);
    let g = k.global_id_x();
    let one = k.const_u32(1);
    let old = k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, counter, one);
    store_at(&mut k, olds, g, old);
    let f = k.finish().expect("verifies");
    let mut dev = Device::new();
    let (cp, op) = (upload_u32(&mut dev, &[0]), output(&mut dev, 4 * 1024));
    launch(&f, &cfg(4, 256), &[cp, op], &mut dev).expect("runs");
    assert_eq!(download_u32(&dev, cp, 1), [1024]);
    let mut olds = download_u32(&dev, op, 1024);
    olds.sort_unstable();
    assert!(
        olds.iter().enumerate().all(|(i, &x)| x == i as u32),
        "old values are a permutation of 0..1024"
    );
}

/// Shared-memory atomics (add, signed min/max) combine a block's values; exchange and
/// compare-and-swap return the old value and write per their rule.
#[test]
fn atomics_on_shared_and_global_memory() {
    let mut rng = rng();
    let block = 128u32;
    let mut k = Builder::new("atomics", block);
    let vals = k.param("vals", Type::Ptr(AddrSpace::Global, Scalar::I32));
    let out = k.param("out", Type::Ptr(AddrSpace::Global, Scalar::I32));
    let slots = k.param("slots", PU32);
    let olds = k.param("olds", PU32);
    let s = k.shared_array("acc", Scalar::I32, 3, 4);
    let t = k.tid_x();
    let zero = k.const_u32(0);
    let first = k.eq(t, zero);
    k.if_then(first, |k| {
        let (z, min, max) = (k.const_i32(0), k.const_i32(i32::MAX), k.const_i32(i32::MIN));
        for (i, v) in [z, min, max].into_iter().enumerate() {
            let i = k.const_u32(i as u32);
            store_at(k, s, i, v);
        }
    });
    k.barrier();
    let x = load_at(&mut k, Type::I32, vals, t);
    for (i, op) in [AtomOp::Add, AtomOp::Min, AtomOp::Max]
        .into_iter()
        .enumerate()
    {
        let i = k.const_u32(i as u32);
        let p = k.ptr_add(s, i);
        k.atomic(op, Ordering::Relaxed, Scope::Cta, p, x);
    }
    k.barrier();
    k.if_then(first, |k| {
        for i in 0..3 {
            let i = k.const_u32(i);
            let v = load_at(k, Type::I32, s, i);
            store_at(k, out, i, v);
        }
    });
    // Even threads swap their slot if it holds t, odd threads exchange it for t + 1000.
    let p = k.ptr_add(slots, t);
    let two = k.const_u32(2);
    let parity = k.rem(t, two);
    let even = k.eq(parity, zero);
    let thousand = k.const_u32(1000);
    let new = k.add(t, thousand);
    let old = k.if_else(
        even,
        &[Type::U32],
        |k| vec![k.atomic_cas(Ordering::Relaxed, Scope::Gpu, p, t, new)],
        |k| vec![k.atomic(AtomOp::Exch, Ordering::Relaxed, Scope::Gpu, p, new)],
    );
    store_at(&mut k, olds, t, old[0]);
    let f = k.finish().expect("verifies");

    let vals: Vec<i32> = (0..block)
        .map(|_| rng.gen_range(-1 << 30..1 << 30))
        .collect();
    let slots: Vec<u32> = (0..block)
        .map(|t| {
            if rng.gen() {
                t
            } else {
                rng.gen_range(0..block)
            }
        })
        .collect();
    let mut dev = Device::new();
    let vp = upload_u32(
        &mut dev,
        &vals.iter().map(|&v| v as u32).collect::<Vec<_>>(),
    );
    let (op, sp, olp) = (
        output(&mut dev, 12),
        upload_u32(&mut dev, &slots),
        output(&mut dev, 4 * block as usize),
    );
    launch(&f, &cfg(1, block), &[vp, op, sp, olp], &mut dev).expect("runs");
    let got: Vec<i32> = download_u32(&dev, op, 3)
        .into_iter()
        .map(|x| x as i32)
        .collect();
    let sum = vals.iter().fold(0i32, |a, v| a.wrapping_add(*v));
    assert_eq!(
        got,
        [
            sum,
            *vals.iter().min().unwrap(),
            *vals.iter().max().unwrap()
        ]
    );
    let (after, olds) = (
        download_u32(&dev, sp, block as usize),
        download_u32(&dev, olp, block as usize),
    );
    for t in 0..block {
        let (before, i) = (slots[t as usize], t as usize);
        assert_eq!(olds[i], before, "thread {t} sees the old value");
        let swapped = t % 2 == 1 || before == t;
        assert_eq!(
            after[i],
            if swapped { t + 1000 } else { before },
            "thread {t}"
        );
    }
}

/// `atom.add.f32` on global memory flushes subnormals to zero (it is `.ftz` on sm_90)
/// while on shared memory it keeps them; `atom.add.f64` keeps them. All round to
/// nearest (as measured on an H200).
#[test]
fn float_atomic_add() {
    let mut k = Builder::new("fadd", 32);
    let pf = k.param("f", Type::Ptr(AddrSpace::Global, Scalar::F32));
    let pd = k.param("d", Type::Ptr(AddrSpace::Global, Scalar::F64));
    let s = k.shared_array("s", Scalar::F32, 1, 4);
    let tiny_f = k.const_f32(f32::from_bits(1));
    let tiny_d = k.const_f64(f64::from_bits(1));
    let (zero, one, two) = (k.const_u32(0), k.const_u32(1), k.const_u32(2));
    let lane = k.lane_id();
    let first = k.eq(lane, zero);
    let zf = k.const_f32(0.0);
    k.if_then(first, |k| k.store(s, zf));
    k.barrier();
    k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Cta, s, tiny_f);
    let pf1 = k.ptr_add(pf, one);
    let third = k.const_f32(1.0 / 3.0);
    k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, pf, tiny_f);
    k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, pf1, third);
    let pd0 = k.ptr_add(pd, zero);
    k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, pd0, tiny_d);
    k.barrier();
    k.if_then(first, |k| {
        let v = k.load(Type::F32, s);
        let q = k.ptr_add(pf, two);
        k.store(q, v);
    });
    let f = k.finish().expect("verifies");
    let mut dev = Device::new();
    let fp = upload_u32(&mut dev, &[0, 0, POISON_U32]);
    let dp = upload_u64(&mut dev, &[0]);
    launch(&f, &cfg(1, 32), &[fp, dp], &mut dev).expect("runs");
    let [flushed, sum, shared] = download_u32(&dev, fp, 3)[..] else {
        panic!()
    };
    assert_eq!(
        flushed, 0,
        "subnormal f32 addends are flushed in global memory"
    );
    assert_eq!(shared, 32, "and kept in shared memory");
    let mut want = 0.0f32;
    for _ in 0..32 {
        want += 1.0 / 3.0;
    }
    assert_eq!(
        sum,
        want.to_bits(),
        "32 sequential round-to-nearest additions"
    );
    assert_eq!(download_u64(&dev, dp, 1), [32], "f64 keeps subnormals");
}
