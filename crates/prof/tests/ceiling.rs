//! The FMA ceiling kernel computes what its host model says, bit for bit, on fresh
//! random multipliers; the measurement refuses a wrong result.

use quench_prof::ceiling::{fma_expected, fma_flops, fma_kernel, measure_fma_flops, THREADS};
use quench_rt::{Arg, Executor, InterpExecutor, Launch, StreamId};
use quench_testkit::seed;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn run(exec: &mut InterpExecutor, blocks: u32, iters: u32, m: f32, c: f32) -> Vec<f32> {
    let k = exec.load(&fma_kernel().expect("verifies")).expect("loads");
    let n = (blocks * THREADS) as usize;
    let out = exec.alloc(4 * n as u64).expect("alloc");
    exec.copy_to_device(out, &f32::NAN.to_le_bytes().repeat(n))
        .expect("poison");
    let args = [Arg::Ptr(out), Arg::U32(iters), Arg::F32(m), Arg::F32(c)];
    exec.launch(
        k,
        &Launch::linear(blocks, THREADS),
        &args,
        StreamId::DEFAULT,
    )
    .expect("launch");
    let mut bytes = vec![0u8; 4 * n];
    exec.copy_to_host(out, &mut bytes).expect("read");
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn fma_kernel_matches_its_host_model() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let (m, c) = (rng.gen_range(0.5f32..1.0), rng.gen_range(-1.0f32..1.0));
    let iters = rng.gen_range(3..9);
    let mut exec = InterpExecutor::new();
    let got = run(&mut exec, 2, iters, m, c);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(
            g.to_bits(),
            fma_expected(i as u32, iters, m, c).to_bits(),
            "thread {i}"
        );
    }
    // The control: one iteration more is a different result.
    assert!(got
        .iter()
        .enumerate()
        .any(|(i, g)| g.to_bits() != fma_expected(i as u32, iters + 1, m, c).to_bits()));
    assert_eq!(
        fma_flops(2, iters),
        2 * 2 * THREADS as u64 * 8 * iters as u64
    );
}

#[test]
fn measurement_checks_then_times() {
    let mut exec = InterpExecutor::new();
    let flops = measure_fma_flops(&mut exec, 1, 4, 2).expect("measured");
    // The interpreter's virtual clock makes this a count, but a positive finite one.
    assert!(flops.is_finite() && flops > 0.0, "{flops}");
}
