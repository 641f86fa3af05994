//! The standalone row normalization (`rmsnorm_rows_f32`): on the interpreter, every row
//! against the reference bit for bit; then what a decode step of several rows relies on
//! — normalizing the rows with it and multiplying them with a matrix–vector kernel
//! without a prologue gives the same bytes as the kernel whose prologue normalizes them
//! (one vector a pass, as a one-row step runs it, and as many as its shared memory
//! stages), for every epilogue; and it assembles with `ptxas` without spills at the
//! decode step's shapes.
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::{self, Addend, Epilogue, Prologue, QGemvParams, WeightFormat};
use quench_kernels::rmsnorm_rows::{self, RmsNormRowsParams};
use quench_kernels::{data, Buffer, CaseArg, KernelCase};
use quench_rt::Arg;

mod common;

use common::seed;

#[test]
fn every_row_matches_the_reference() {
    let s = seed();
    // Rows that leave some threads a group fewer (576 / 4 over 128 threads), fewer groups
    // than threads, one warp, and a row of the decode step's width.
    for (i, (cols, threads, rows)) in [(576, 128, 3), (128, 128, 2), (320, 32, 4), (4096, 128, 2)]
        .into_iter()
        .enumerate()
    {
        let p = RmsNormRowsParams { cols, threads };
        common::check(&rmsnorm_rows::case(&p, rows, s ^ i as u64).expect("case"));
    }
}

/// The kernel's refusals name the problem.
#[test]
fn shapes_it_cannot_take_are_refused() {
    for (cols, threads, needle) in [(130, 128, "multiple of 4"), (128, 48, "multiple of 32")] {
        let e = rmsnorm_rows::build(&RmsNormRowsParams { cols, threads })
            .expect_err("refused")
            .to_string();
        assert!(e.contains(rmsnorm_rows::NAME) && e.contains(needle), "{e}");
    }
}

fn buffer<'a>(case: &'a KernelCase, name: &str) -> (usize, &'a Buffer) {
    case.buffers
        .iter()
        .enumerate()
        .find(|(_, b)| b.name == name)
        .unwrap_or_else(|| panic!("a `{name}` buffer"))
}

/// The case's epsilon: its one f32 scalar.
fn eps(case: &KernelCase) -> f32 {
    case.args
        .iter()
        .find_map(|a| match a {
            CaseArg::Scalar(Arg::F32(e)) => Some(*e),
            _ => None,
        })
        .expect("an eps argument")
}

/// The prologue case's residual rows normalized by `rmsnorm_rows_f32` on the threads that
/// walk the prologue's sum, as a decode step of several rows normalizes them for products
/// of any block size (checked against the reference on the way).
fn normalized(case: &KernelCase, p: &QGemvParams) -> Vec<u8> {
    let np = RmsNormRowsParams {
        cols: p.cols,
        threads: qgemv::prologue::NORM_THREADS,
    };
    let (x, w) = (&buffer(case, "x").1.data, &buffer(case, "norm_w").1.data);
    let norm = rmsnorm_rows::case_on(
        &np,
        &data::f32_from_bytes(x),
        &data::f32_from_bytes(w),
        eps(case),
    )
    .expect("case");
    common::check(&norm).outputs.swap_remove(0).1
}

/// The same inputs through the kernel without a prologue: `x` replaced by the
/// normalized rows, the norm weight and eps arguments dropped.
fn without_prologue(case: &KernelCase, p: &QGemvParams, rows: Vec<u8>) -> KernelCase {
    // As a decode step of several rows builds it: 8 vectors a pass.
    let plain = QGemvParams {
        prologue: Prologue::None,
        batch: qgemv::widest_batch(Prologue::None, p.cols),
        unroll: if p.format.is_float() { 4 } else { 1 },
        ..*p
    };
    let mut c = common::rebuilt(case, &plain);
    let (xi, _) = buffer(case, "x");
    let (wi, _) = buffer(case, "norm_w");
    c.buffers[xi].data = rows;
    c.args
        .retain(|a| *a != CaseArg::Buffer(wi) && !matches!(a, CaseArg::Scalar(Arg::F32(_))));
    c
}

#[test]
fn normalized_rows_and_a_plain_gemv_give_the_prologues_bytes() {
    let s = seed();
    // Formats on rows of a few pieces per lane; 2112 columns stage 5 rows a pass.
    // Q4_K also at the wider blocks its products run with: the prologue's sum does not
    // depend on the block's warps.
    let shapes = [
        (WeightFormat::Q4_1, 2112, 4),
        (WeightFormat::BF16, 320, 4),
        (WeightFormat::Q4K, 2304, 4),
        (WeightFormat::Q4K, 2304, 8),
        (WeightFormat::Q4K, 2304, 16),
        (WeightFormat::F16, 576, 4),
    ];
    let n = 11;
    for (i, (format, cols, warps)) in shapes.into_iter().enumerate() {
        let forms = Epilogue::ALL
            .map(|e| (e, Addend::Residual))
            .into_iter()
            .chain([(Epilogue::Residual, Addend::Bias)]);
        for (j, (epilogue, addend)) in forms.enumerate() {
            // The one-row step's kernel (one vector a pass), and the most the prologue stages.
            for batch in [1, qgemv::widest_batch(Prologue::RmsNorm, cols)] {
                let p = QGemvParams {
                    format,
                    prologue: Prologue::RmsNorm,
                    epilogue,
                    rows: if epilogue == Epilogue::SwiGlu { 9 } else { 6 },
                    cols,
                    warps,
                    unroll: if format.is_float() { 4 } else { 2 },
                    act: OutType::F32,
                    batch,
                    max_blocks: 0,
                };
                let case =
                    qgemv::case_with(&p, n, addend, s ^ (i as u64) << 8 ^ j as u64).expect("case");
                let fused = common::check(&case);
                let plain = without_prologue(&case, &p, normalized(&case, &p));
                let how = format!("({format:?}, {warps} warps, {epilogue:?}, {addend:?}, {batch} a pass) with the rows normalized apart");
                common::assert_same_bits(&plain, &fused, &how);
            }
        }
    }
}

#[test]
fn assembles_without_spills_at_the_decode_steps_shapes() {
    if common::no_ptxas() {
        return;
    }
    // SmolLM2's, qwen2.5-0.5b's and llama-3.1-8b's hidden sizes, at the GEMVs' 4 warps.
    let mut failures = vec![];
    for cols in [576, 896, 4096] {
        let f = rmsnorm_rows::build(&RmsNormRowsParams { cols, threads: 128 }).expect("builds");
        failures.extend(common::spill_failure(&f, &format!("cols {cols}")));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
