//! Interpreter: lockstep execution, divergence and reconvergence, loops, exits,
//! barriers with shared memory, special registers and the virtual clock.

mod interp_support;

use interp_support::*;
use quench_ir::interp::{launch, Device, InterpError, LaunchConfig};
use quench_ir::{
    AddrSpace, AtomOp, Block, Builder, Op, Ordering, Scalar, Scope, Special, Type, Value, VoteMode,
};
use rand::Rng;

const PU32: Type = Type::Ptr(AddrSpace::Global, Scalar::U32);
const PI32: Type = Type::Ptr(AddrSpace::Global, Scalar::I32);
const PU64: Type = Type::Ptr(AddrSpace::Global, Scalar::U64);

fn ballot(k: &mut Builder, pred: Value, mask: Value) -> Value {
    k.emit(
        Type::U32,
        Op::Vote {
            mode: VoteMode::Ballot,
            pred,
            mask,
        },
    )
}

fn store_at(k: &mut Builder, base: Value, i: Value, v: Value) {
    let p = k.ptr_add(base, i);
    k.store(p, v);
}

/// Nested `if`s: each branch runs with exactly its lanes (seen by a ballot over the
/// branch's lanes), yields per-lane values, and all lanes are back after the `if`.
#[test]
fn branches_split_and_reconverge() {
    let mut k = Builder::new("diverge", 128);
    let out = k.param("out", PU32);
    let inner = k.param("inner", PU32);
    let after = k.param("after", PU32);
    let t = k.global_id_x();
    let lane_t = k.tid_x();
    let three = k.const_u32(3);
    let zero = k.const_u32(0);
    let r3 = k.rem(lane_t, three);
    let c1 = k.eq(r3, zero);
    let full = k.const_u32(u32::MAX);
    let m1 = ballot(&mut k, c1, full);
    let res = k.if_else(
        c1,
        &[Type::U32],
        |k| {
            let yes = k.const_pred(true);
            let b = ballot(k, yes, m1);
            store_at(k, inner, t, b);
            let two = k_two(k);
            vec![k.mul(lane_t, two)]
        },
        |k| {
            let rest = k.not(m1);
            let two = k_two(k);
            let r2 = k.rem(lane_t, two);
            let zero = k.const_u32(0);
            let c2 = k.eq(r2, zero);
            let m2 = ballot(k, c2, rest);
            k.if_else(
                c2,
                &[Type::U32],
                |k| {
                    let yes = k.const_pred(true);
                    let b = ballot(k, yes, m2);
                    store_at(k, inner, t, b);
                    let hundred = k.const_u32(100);
                    vec![k.add(lane_t, hundred)]
                },
                |k| {
                    let not_m2 = k.not(m2);
                    let m3 = k.and(rest, not_m2);
                    let yes = k.const_pred(true);
                    let b = ballot(k, yes, m3);
                    store_at(k, inner, t, b);
                    vec![k.const_u32(7)]
                },
            )
        },
    );
    store_at(&mut k, out, t, res[0]);
    let yes = k.const_pred(true);
    let b = ballot(&mut k, yes, full);
    store_at(&mut k, after, t, b);
    let f = k.finish().expect("verifies");

    let (grid, block) = (2, 96);
    let n = (grid * block) as usize;
    let mut dev = Device::new();
    let (o, i, a) = (
        output(&mut dev, 4 * n),
        output(&mut dev, 4 * n),
        output(&mut dev, 4 * n),
    );
    let stats = launch(&f, &cfg(grid, block), &[o, i, a], &mut dev).expect("runs");
    assert!(stats.all_exact());
    let (out, inner, after) = (
        download_u32(&dev, o, n),
        download_u32(&dev, i, n),
        download_u32(&dev, a, n),
    );
    for g in 0..n {
        let t = (g % block as usize) as u32;
        let warp_base = t / 32 * 32;
        let class = |u: u32| {
            if u.is_multiple_of(3) {
                0
            } else if u.is_multiple_of(2) {
                1
            } else {
                2
            }
        };
        let want_mask = (0..32)
            .filter(|l| class(warp_base + l) == class(t))
            .fold(0u32, |m, l| m | 1 << l);
        let want = [t * 2, t + 100, 7][class(t)];
        assert_eq!(out[g], want, "thread {g}");
        assert_eq!(inner[g], want_mask, "lanes with thread {g} in its branch");
        assert_eq!(after[g], u32::MAX, "thread {g} after reconvergence");
    }
}

/// The verifier admits `return` only at the end of a kernel; the interpreter runs it
/// anywhere (as unverified input may have it). Kernels exercising early exits mark
/// each exit with a fence, swapped for `return` after verification.
fn early_return(k: &mut Builder) {
    k.fence(Ordering::SeqCst, Scope::Cta);
}

fn swap_in_returns(b: &mut Block) {
    for inst in &mut b.insts {
        match &mut inst.op {
            Op::Fence { .. } => inst.op = Op::Return,
            Op::If { then_, else_, .. } => {
                swap_in_returns(then_);
                swap_in_returns(else_);
            }
            Op::For { body, .. } => swap_in_returns(body),
            _ => {}
        }
    }
}

fn k_two(k: &mut Builder) -> Value {
    k.const_u32(2)
}

/// Loops whose bounds differ per lane: lanes drop out as their bounds are reached
/// (counted per iteration with atomics), carried values are per lane, signed
/// induction variables and steps above 1 work.
#[test]
fn loops_with_per_lane_trip_counts() {
    let mut rng = rng();
    let mut k = Builder::new("trips", 64);
    let trips = k.param("trips", PU32);
    let hist = k.param("hist", PU32);
    let sums = k.param("sums", PU32);
    let signed = k.param("signed", PI32);
    let t = k.global_id_x();
    let p = k.ptr_add(trips, t);
    let n = k.load(Type::U32, p);
    let (zero, one) = (k.const_u32(0), k.const_u32(1));
    let r = k.for_range(zero, n, one, &[zero], |k, i, c| {
        let h = k.ptr_add(hist, i);
        let one = k.const_u32(1);
        k.atomic(AtomOp::Add, Ordering::Relaxed, Scope::Gpu, h, one);
        let three = k.const_u32(3);
        let x = k.mul(i, three);
        let x = k.add(x, t);
        vec![k.add(c[0], x)]
    });
    store_at(&mut k, sums, t, r[0]);
    // for i in -(t % 7) .. t % 5 step 2, counting iterations.
    let ti = k.cvt(Scalar::I32, t);
    let (seven, five) = (k.const_i32(7), k.const_i32(5));
    let a = k.rem(ti, seven);
    let lo = k.neg(a);
    let hi = k.rem(ti, five);
    let (two, zero_i, one_i) = (k.const_i32(2), k.const_i32(0), k.const_i32(1));
    let r = k.for_range(lo, hi, two, &[zero_i], |k, _, c| vec![k.add(c[0], one_i)]);
    store_at(&mut k, signed, t, r[0]);
    let f = k.finish().expect("verifies");

    let (grid, block) = (3, 64);
    let n = grid * block;
    let trips: Vec<u32> = (0..n).map(|_| rng.gen_range(0..20)).collect();
    let mut dev = Device::new();
    let tp = upload_u32(&mut dev, &trips);
    let hp = upload_u32(&mut dev, &[0; 20]);
    let (sp, gp) = (output(&mut dev, 4 * n), output(&mut dev, 4 * n));
    launch(
        &f,
        &cfg(grid as u32, block as u32),
        &[tp, hp, sp, gp],
        &mut dev,
    )
    .expect("runs");
    let hist = download_u32(&dev, hp, 20);
    for (i, h) in hist.iter().enumerate() {
        assert_eq!(
            *h as usize,
            trips.iter().filter(|&&m| m as usize > i).count(),
            "lanes in iteration {i}"
        );
    }
    let sums = download_u32(&dev, sp, n);
    let counts = download_u32(&dev, gp, n);
    for t in 0..n {
        let want: u32 = (0..trips[t]).map(|i| i * 3 + t as u32).sum();
        assert_eq!(sums[t], want, "thread {t}");
        let (lo, hi) = (-((t % 7) as i32), (t % 5) as i32);
        assert_eq!(
            counts[t] as i32,
            (lo..hi).step_by(2).count() as i32,
            "thread {t}"
        );
    }
}

/// Lanes that return are gone for good: they store nothing, and later collectives
/// (whose full mask names them) see only the living lanes. Returning inside a loop
/// leaves the other lanes iterating.
#[test]
fn returned_lanes_stay_gone() {
    let mut k = Builder::new("exits", 64);
    let out = k.param("out", PU32);
    let live = k.param("live", PU32);
    let t = k.tid_x();
    let (five, zero, one, ten) = (
        k.const_u32(5),
        k.const_u32(0),
        k.const_u32(1),
        k.const_u32(10),
    );
    let r = k.rem(t, five);
    let c = k.eq(r, zero);
    k.if_then(c, early_return);
    // Odd threads leave in iteration t % 10 of this loop.
    let acc = k.for_range(zero, ten, one, &[zero], |k, i, acc| {
        let ten = k.const_u32(10);
        let two = k.const_u32(2);
        let m = k.rem(t, ten);
        let at = k.eq(i, m);
        let odd = k.rem(t, two);
        let one = k.const_u32(1);
        let is_odd = k.eq(odd, one);
        let leave = k.and(at, is_odd);
        k.if_then(leave, early_return);
        vec![k.add(acc[0], i)]
    });
    store_at(&mut k, out, t, acc[0]);
    let yes = k.const_pred(true);
    let full = k.const_u32(u32::MAX);
    let b = ballot(&mut k, yes, full);
    store_at(&mut k, live, t, b);
    let mut f = k.finish().expect("verifies");
    swap_in_returns(&mut f.body);

    let mut dev = Device::new();
    let (o, l) = (output(&mut dev, 4 * 64), output(&mut dev, 4 * 64));
    launch(&f, &cfg(1, 64), &[o, l], &mut dev).expect("runs");
    let (out, live) = (download_u32(&dev, o, 64), download_u32(&dev, l, 64));
    let survives = |t: u32| !t.is_multiple_of(5) && t.is_multiple_of(2);
    for t in 0..64u32 {
        if survives(t) {
            assert_eq!(out[t as usize], 45, "thread {t}");
            let want = (0..32)
                .filter(|l| survives(t / 32 * 32 + l))
                .fold(0u32, |m, l| m | 1 << l);
            assert_eq!(live[t as usize], want, "thread {t}");
        } else {
            assert_eq!(
                out[t as usize], POISON_U32,
                "thread {t} returned and must not store"
            );
        }
    }
}

/// Data written to shared memory before a barrier is seen by other warps after it;
/// barriers inside a loop with uniform bounds sequence a tree reduction.
#[test]
fn barriers_order_shared_memory_across_warps() {
    let mut rng = rng();
    let block = 256u32;
    let mut k = Builder::new("rotate_sum", block);
    let inp = k.param("in", PU32);
    let out = k.param("out", PU32);
    let sums = k.param("sums", PU32);
    let s = k.shared_array("s", Scalar::U32, block, 4);
    let r = k.shared_array("r", Scalar::U32, block, 4);
    let t = k.tid_x();
    let g = k.global_id_x();
    let p = k.ptr_add(inp, g);
    let x = k.load(Type::U32, p);
    let three = k.const_u32(3);
    let x3 = k.mul(x, three);
    store_at(&mut k, s, t, x3);
    store_at(&mut k, r, t, x);
    k.barrier();
    let (d, n) = (k.const_u32(37), k.const_u32(block));
    let j = k.add(t, d);
    let j = k.rem(j, n);
    let q = k.ptr_add(s, j);
    let y = k.load(Type::U32, q);
    store_at(&mut k, out, g, y);
    let (zero, one, eight) = (k.const_u32(0), k.const_u32(1), k.const_u32(8));
    k.for_range(zero, eight, one, &[], |k, i, _| {
        let half = k.const_u32(block / 2);
        let stride = k.shr(half, i);
        let c = k.lt(t, stride);
        k.if_then(c, |k| {
            let a = k.ptr_add(r, t);
            let u = k.add(t, stride);
            let b = k.ptr_add(r, u);
            let (va, vb) = (k.load(Type::U32, a), k.load(Type::U32, b));
            let sum = k.add(va, vb);
            k.store(a, sum);
        });
        k.barrier();
        vec![]
    });
    let first = k.eq(t, zero);
    k.if_then(first, |k| {
        let r0 = k.load(Type::U32, r);
        let b = k.ctaid_x();
        store_at(k, sums, b, r0);
    });
    let f = k.finish().expect("verifies");

    let grid = 3u32;
    let n = (grid * block) as usize;
    let input: Vec<u32> = (0..n).map(|_| rng.gen_range(0..1 << 20)).collect();
    let mut dev = Device::new();
    let ip = upload_u32(&mut dev, &input);
    let (op, sp) = (output(&mut dev, 4 * n), output(&mut dev, 4 * grid as usize));
    launch(&f, &cfg(grid, block), &[ip, op, sp], &mut dev).expect("runs");
    let out = download_u32(&dev, op, n);
    for (g, got) in out.iter().enumerate() {
        let (b, t) = (g / block as usize, g % block as usize);
        let src = b * block as usize + (t + 37) % block as usize;
        assert_eq!(*got, input[src].wrapping_mul(3), "thread {g}");
    }
    let sums = download_u32(&dev, sp, grid as usize);
    for b in 0..grid as usize {
        let want: u32 = input[b * block as usize..(b + 1) * block as usize]
            .iter()
            .sum();
        assert_eq!(sums[b], want, "block {b}");
    }
}

/// A barrier reached by only part of a warp is an error naming the barrier. (The
/// verifier rejects this statically; the kernel is altered after verification to
/// stand for unverified input.)
#[test]
fn barrier_under_divergence_is_an_error() {
    let mut k = Builder::new("divergent_barrier", 64);
    let flag = k.param("flag", Type::U32);
    let lane = k.lane_id();
    let sixteen = k.const_u32(16);
    let divergent = k.lt(lane, sixteen);
    let zero = k.const_u32(0);
    let uniform = k.ne(flag, zero);
    k.if_then(uniform, |k| k.barrier());
    let mut f = k.finish().expect("verifies");
    for inst in &mut f.body.insts {
        if let Op::If { cond, .. } = &mut inst.op {
            *cond = divergent;
        }
    }
    let mut dev = Device::new();
    let err = launch(&f, &cfg(1, 64), &[1], &mut dev).expect_err("must fail");
    match &err {
        InterpError::BarrierDivergence {
            site,
            arrived,
            missing,
        } => {
            assert_eq!((*arrived, *missing), (0xffff, 0xffff_0000));
            assert_eq!(site.kernel, "divergent_barrier");
            assert!(site.op.contains("bar.sync"), "{err}");
        }
        e => panic!("unexpected error {e}"),
    }
    assert!(err.to_string().contains("divergent"), "{err}");
}

/// Warps that have exited are not waited for at a barrier; shared memory nobody wrote
/// reads as 0xff bytes.
#[test]
fn exited_warps_do_not_block_barriers() {
    let mut k = Builder::new("early_exit", 128);
    let out = k.param("out", PU32);
    let t = k.tid_x();
    let s = k.shared_array("s", Scalar::U32, 128, 4);
    let w = k.special(Special::WarpId);
    let one = k.const_u32(1);
    let gone = k.eq(w, one);
    k.if_then(gone, early_return);
    let ten = k.const_u32(10);
    let v = k.add(t, ten);
    store_at(&mut k, s, t, v);
    k.barrier();
    let (d, n) = (k.const_u32(64), k.const_u32(128));
    let j = k.add(t, d);
    let j = k.rem(j, n);
    let q = k.ptr_add(s, j);
    let y = k.load(Type::U32, q);
    store_at(&mut k, out, t, y);
    let mut f = k.finish().expect("verifies");
    swap_in_returns(&mut f.body);

    let mut dev = Device::new();
    let o = output(&mut dev, 4 * 128);
    launch(&f, &cfg(1, 128), &[o], &mut dev).expect("runs");
    let out = download_u32(&dev, o, 128);
    for t in 0..128u32 {
        let src = (t + 64) % 128;
        let want = match (t / 32, src / 32) {
            (1, _) => POISON_U32,
            (_, 1) => u32::MAX,
            _ => src + 10,
        };
        assert_eq!(out[t as usize], want, "thread {t}");
    }
}

/// `%globaltimer`/`%clock64` never go back: every read after a barrier is later than
/// every read before it, a later launch reads later times, and the clock advances by
/// one per instruction issued (the next instruction of a warp reads one tick later).
#[test]
fn virtual_clock_is_monotonic() {
    let mut k = Builder::new("clock", 128);
    let before = k.param("before", PU64);
    let after = k.param("after", PU64);
    let t = k.tid_x();
    let step = k.param("step", PU64);
    let t0 = k.special(Special::GlobalTimer);
    k.barrier();
    let t1 = k.special(Special::GlobalTimer);
    let c1 = k.special(Special::Clock64);
    let d = k.sub(c1, t1);
    store_at(&mut k, before, t, t0);
    store_at(&mut k, after, t, t1);
    store_at(&mut k, step, t, d);
    let f = k.finish().expect("verifies");

    let mut dev = Device::new();
    let (b, a, s) = (
        output(&mut dev, 8 * 128),
        output(&mut dev, 8 * 128),
        output(&mut dev, 8 * 128),
    );
    let mut last = 0;
    for _ in 0..2 {
        let start = dev.clock_ns;
        let stats = launch(&f, &cfg(2, 128), &[b, a, s], &mut dev).expect("runs");
        assert_eq!(dev.clock_ns - start, stats.instructions);
        let (before, after) = (download_u64(&dev, b, 128), download_u64(&dev, a, 128));
        let (max_before, min_after) = (*before.iter().max().unwrap(), *after.iter().min().unwrap());
        assert!(
            before.iter().all(|&x| x > last),
            "later launch reads later times"
        );
        assert!(max_before < min_after, "{max_before} vs {min_after}");
        assert!(*after.iter().max().unwrap() <= dev.clock_ns);
        assert!(
            download_u64(&dev, s, 128).iter().all(|&d| d == 1),
            "one instruction later, one tick later"
        );
        last = dev.clock_ns;
    }
}

/// Thread, block and lane ids in a 3-D launch.
#[test]
fn special_registers() {
    use Special::*;
    let regs = [
        TidX, TidY, TidZ, NtidX, NtidY, NtidZ, CtaidX, CtaidY, CtaidZ, NctaidX, NctaidY, NctaidZ,
        LaneId, WarpId,
    ];
    let mut k = Builder::new("ids", 64);
    let out = k.param("out", PU32);
    let (tx, ty, tz) = (k.special(TidX), k.special(TidY), k.special(TidZ));
    let (nx, ny, cx, cy, cz, gx, gy) = (
        k.special(NtidX),
        k.special(NtidY),
        k.special(CtaidX),
        k.special(CtaidY),
        k.special(CtaidZ),
        k.special(NctaidX),
        k.special(NctaidY),
    );
    // Linear thread id in the grid: ((block * 64) + thread) * regs.len()
    let by = k.mul(cz, gy);
    let by = k.add(by, cy);
    let bl = k.mul(by, gx);
    let bl = k.add(bl, cx);
    let tzy = k.mul(tz, ny);
    let tzy = k.add(tzy, ty);
    let tl = k.mul(tzy, nx);
    let tl = k.add(tl, tx);
    let sixty_four = k.const_u32(64);
    let g = k.mul(bl, sixty_four);
    let g = k.add(g, tl);
    let nregs = k.const_u32(regs.len() as u32);
    let base = k.mul(g, nregs);
    for (i, r) in regs.iter().enumerate() {
        let v = k.special(*r);
        let off = k.const_u32(i as u32);
        let at = k.add(base, off);
        store_at(&mut k, out, at, v);
    }
    let f = k.finish().expect("verifies");

    let c = LaunchConfig {
        grid: [2, 3, 2],
        block: [8, 4, 2],
        dynamic_shared_bytes: 0,
    };
    let n = 12 * 64 * regs.len();
    let mut dev = Device::new();
    let o = output(&mut dev, 4 * n);
    launch(&f, &c, &[o], &mut dev).expect("runs");
    let out = download_u32(&dev, o, n);
    for (bz, by, bx) in
        (0..2).flat_map(|z| (0..3).flat_map(move |y| (0..2).map(move |x| (z, y, x))))
    {
        for (tz, ty, tx) in
            (0..2).flat_map(|z| (0..4).flat_map(move |y| (0..8).map(move |x| (z, y, x))))
        {
            let (b, t) = ((bz * 3 + by) * 2 + bx, (tz * 4 + ty) * 8 + tx);
            let want = [tx, ty, tz, 8, 4, 2, bx, by, bz, 2, 3, 2, t % 32, t / 32];
            let got = &out[(b * 64 + t) as usize * regs.len()..][..regs.len()];
            assert_eq!(got, want, "block ({bx},{by},{bz}) thread ({tx},{ty},{tz})");
        }
    }
}
