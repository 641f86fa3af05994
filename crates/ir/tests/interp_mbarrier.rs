//! Interpreter: mbarriers. A producer warp copies blocks of data with `cp.async` into a
//! ring of stages and arrives on each stage's "full" barrier when its copies land; a
//! consumer warp waits on it by phase parity, sums the stage and arrives on its "empty"
//! barrier, which the producer waits on before refilling the stage. No `bar.sync` inside
//! the loops: the interpreter must switch between the blocked warps.

mod interp_support;

use interp_support::*;
use quench_ir::interp::{launch, Device, InterpError};
use quench_ir::{AddrSpace, Builder, CacheOp, Function, Scalar, Type, Value};
use rand::Rng;

const PU32: Type = Type::Ptr(AddrSpace::Global, Scalar::U32);
const STAGES: u32 = 2;
/// u32 words a stage holds: one 16-byte copy per producer lane.
const WORDS: u32 = 128;

/// `steps` blocks of `WORDS` words from `src`; each consumer lane adds its four words of
/// every block and stores the total at `out[lane]`. With `never_full`, nobody arrives on
/// the full barriers (a deadlock).
fn kernel(steps: u32, never_full: bool) -> Function {
    let mut k = Builder::new("ring", 64);
    let src = k.param("src", PU32);
    let out = k.param("out", PU32);
    let ring = k.shared_array("ring", Scalar::U32, STAGES * WORDS, 16);
    let bars = k.shared_array("bars", Scalar::U64, 2 * STAGES, 8);
    let tid = k.tid_x();
    let lane = k.lane_id();
    let warp = k.shr_const(tid, 5);
    let zero = k.const_u32(0);
    let first = k.eq(tid, zero);
    k.if_then(first, |k| {
        for i in 0..2 * STAGES {
            let b = k.const_u32(i);
            let b = k.ptr_add(bars, b);
            // Full barriers expect the 32 producer lanes, empty ones the 32 consumers.
            let n = k.const_u32(32);
            k.mbarrier_init(b, n);
        }
    });
    k.barrier();
    let is_producer = k.eq(warp, zero);
    let one = k.const_u32(1);
    let hi = k.const_u32(steps);
    let stage_of = |k: &mut Builder, t: Value| k.and_const(t, STAGES - 1);
    // The parity of step `t`'s use of its stage: its (t / STAGES)-th phase.
    let parity_of = |k: &mut Builder, t: Value| {
        let r = k.shr_const(t, STAGES.trailing_zeros());
        k.and_const(r, 1)
    };
    k.if_else(
        is_producer,
        &[],
        |k| {
            k.for_range(zero, hi, one, &[], |k, t, _| {
                let s = stage_of(k, t);
                // Wait until the consumer has emptied the stage's previous use.
                let n = k.const_u32(STAGES);
                let reuse = k.ge(t, n);
                k.if_then(reuse, |k| {
                    let prev = k.sub(t, n);
                    let p = parity_of(k, prev);
                    let e = k.add_const(s, STAGES);
                    let e = k.ptr_add(bars, e);
                    k.mbarrier_wait(e, p);
                });
                let word = k.mul_const(t, WORDS);
                let four = k.shl_const(lane, 2);
                let word = k.add(word, four);
                let from = k.ptr_add(src, word);
                let at = k.mul_const(s, WORDS);
                let at = k.add(at, four);
                let to = k.ptr_add(ring, at);
                k.cp_async(to, from, 16, CacheOp::Cg);
                k.cp_async_commit();
                if !never_full {
                    let f = k.ptr_add(bars, s);
                    k.cp_async_mbarrier_arrive(f);
                }
                vec![]
            });
            vec![]
        },
        |k| {
            let sums = k.for_range(zero, hi, one, &[zero], |k, t, acc| {
                let s = stage_of(k, t);
                let p = parity_of(k, t);
                let f = k.ptr_add(bars, s);
                k.mbarrier_wait(f, p);
                let at = k.mul_const(s, WORDS);
                let four = k.shl_const(lane, 2);
                let at = k.add(at, four);
                let mut sum = acc[0];
                for i in 0..4 {
                    let q = k.add_const(at, i);
                    let q = k.ptr_add(ring, q);
                    let x = k.load(Type::U32, q);
                    sum = k.add(sum, x);
                }
                let e = k.add_const(s, STAGES);
                let e = k.ptr_add(bars, e);
                k.mbarrier_arrive(e);
                vec![sum]
            });
            let o = k.ptr_add(out, lane);
            k.store(o, sums[0]);
            vec![]
        },
    );
    k.finish().expect("verifies")
}

fn run(steps: u32, never_full: bool) -> Result<(Vec<u32>, Vec<u32>), InterpError> {
    let mut rng = rng();
    let data: Vec<u32> = (0..steps * WORDS).map(|_| rng.gen_range(0..1000)).collect();
    let mut dev = Device::new();
    let src = upload_u32(&mut dev, &data);
    let out = output(&mut dev, 32 * 4);
    launch(
        &kernel(steps, never_full),
        &cfg(1, 64),
        &[src, out],
        &mut dev,
    )?;
    let got = download_u32(&dev, out, 32);
    let want = (0..32)
        .map(|l| {
            (0..steps)
                .flat_map(|t| (0..4).map(move |i| (t * WORDS + 4 * l + i) as usize))
                .map(|i| data[i])
                .sum()
        })
        .collect();
    Ok((got, want))
}

#[test]
fn a_producer_and_a_consumer_pass_stages_through_mbarriers() {
    for steps in [1, 2, 5, 8] {
        let (got, want) = run(steps, false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got, want, "{steps} steps");
    }
}

#[test]
fn a_wait_nobody_can_satisfy_is_a_deadlock() {
    match run(3, true) {
        // The consumer waits for data, the producer for room.
        Err(InterpError::Deadlock { waiting, .. }) => assert_eq!(waiting, vec![0, 1]),
        other => panic!("{other:?}"),
    }
}
