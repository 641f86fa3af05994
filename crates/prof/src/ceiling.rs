//! The compute ceiling of a roofline, measured: f32 fused multiply-adds per second on
//! every CUDA core the device has.
//!
//! Each thread runs [`CHAINS`] independent chains `a = a·m + c`, so that the FMA latency
//! is hidden within the thread, over enough blocks to fill every SM; `m` and `c` are
//! kernel arguments, so nothing folds at compile time.

use quench_ir::{Builder, Function, Scalar, Type, VerifyError};
use quench_rt::{Arg, Executor, Launch, RtError, StreamId};

/// Independent FMA chains per thread.
pub const CHAINS: u32 = 8;
/// Threads per block.
pub const THREADS: u32 = 256;
/// Threads whose results a measurement checks.
const CHECKED: usize = 64;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CeilingError {
    #[error("the FMA throughput kernel: {0}")]
    Build(#[from] VerifyError),
    #[error("measuring the FMA throughput: {0}")]
    Runtime(#[from] RtError),
    #[error("measuring the FMA throughput: the device returned {got} at element {at}, where {expected} was due")]
    Wrong { at: usize, got: f32, expected: f32 },
}

/// `fma_peak_f32(out, iters, m, c)`: thread `i` starts its chains at `i + j` (chain `j`),
/// applies `a = fma(a, m, c)` `iters` times to each, and stores the sum of its chains at
/// `out[i]`.
pub fn fma_kernel() -> Result<Function, VerifyError> {
    let mut k = Builder::new("fma_peak_f32", THREADS);
    let out = k.param("out", Type::Ptr(quench_ir::AddrSpace::Global, Scalar::F32));
    let iters = k.param("iters", Type::U32);
    let m = k.param("m", Type::F32);
    let c = k.param("c", Type::F32);
    let gid = k.global_id_x();
    let init: Vec<_> = (0..CHAINS)
        .map(|j| {
            let x = k.add_const(gid, j);
            k.cvt(Scalar::F32, x)
        })
        .collect();
    let (zero, one) = (k.const_u32(0), k.const_u32(1));
    let chains = k.for_range(zero, iters, one, &init, |k, _, a| {
        a.iter().map(|&a| k.fma(a, m, c)).collect()
    });
    let sum = chains.iter().skip(1).fold(chains[0], |s, &a| k.add(s, a));
    let at = k.ptr_add(out, gid);
    k.store(at, sum);
    k.finish()
}

/// What thread `i` of [`fma_kernel`] stores, computed on the host with the same
/// single-rounding FMAs and the same summation order.
pub fn fma_expected(i: u32, iters: u32, m: f32, c: f32) -> f32 {
    let chain = |j: u32| (0..iters).fold((i + j) as f32, |a, _| a.mul_add(m, c));
    (1..CHAINS).fold(chain(0), |s, j| s + chain(j))
}

/// Floating-point operations (two per FMA) of one launch over `blocks` blocks.
pub fn fma_flops(blocks: u32, iters: u32) -> u64 {
    2 * blocks as u64 * THREADS as u64 * CHAINS as u64 * iters as u64
}

/// Measured f32 FLOP/s of `exec`: the median of `reps` timed launches (after a warm-up)
/// of [`fma_kernel`] over `blocks` blocks (at least one) of `iters` iterations, whose
/// output is checked against [`fma_expected`] before any time counts.
pub fn measure_fma_flops(
    exec: &mut dyn Executor,
    blocks: u32,
    iters: u32,
    reps: u32,
) -> Result<f64, CeilingError> {
    let kernel = exec.load(&fma_kernel()?)?;
    let blocks = blocks.max(1);
    let n = blocks as usize * THREADS as usize;
    let out = exec.alloc(4 * n as u64)?;
    let result = time_launches(exec, kernel, out, n, blocks, iters, reps);
    exec.free(out)?;
    result
}

#[allow(clippy::too_many_arguments)]
fn time_launches(
    exec: &mut dyn Executor,
    kernel: quench_rt::KernelId,
    out: quench_rt::DevicePtr,
    n: usize,
    blocks: u32,
    iters: u32,
    reps: u32,
) -> Result<f64, CeilingError> {
    // m < 1 and c > 0: every chain converges towards c / (1 − m) = 1, far from overflow
    // and from subnormals.
    let (m, c) = (0.999_9_f32, 1e-4_f32);
    let args = [Arg::Ptr(out), Arg::U32(iters), Arg::F32(m), Arg::F32(c)];
    let launch = Launch::linear(blocks, THREADS);
    exec.launch(kernel, &launch, &args, StreamId::DEFAULT)?;
    let mut got = vec![0u8; 4 * n];
    exec.copy_to_host(out, &mut got)?;
    // Every thread's result on the host would cost as much as the device's work; a
    // sample of [`CHECKED`] threads spread over the grid, the last included, shows that
    // the kernel ran in full and computed what it should.
    let stride = (n / CHECKED).max(1);
    for i in (0..n).step_by(stride).chain([n - 1]) {
        let b = &got[4 * i..4 * i + 4];
        let got = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let expected = fma_expected(i as u32, iters, m, c);
        if got.to_bits() != expected.to_bits() {
            return Err(CeilingError::Wrong {
                at: i,
                got,
                expected,
            });
        }
    }
    let mut ms = Vec::with_capacity(reps as usize);
    for _ in 0..reps.max(1) {
        let a = exec.record_event(StreamId::DEFAULT)?;
        exec.launch(kernel, &launch, &args, StreamId::DEFAULT)?;
        let b = exec.record_event(StreamId::DEFAULT)?;
        ms.push(exec.elapsed_ms(a, b)? as f64);
        exec.release_event(a)?;
        exec.release_event(b)?;
    }
    ms.sort_by(f64::total_cmp);
    Ok(fma_flops(blocks, iters) as f64 / (ms[ms.len() / 2] * 1e-3))
}
