//! The matrix–vector kernels over several vectors at once (a decode step of several
//! sequences): on the interpreter, every product of every vector against the reference
//! (bit for bit where the kernel is exact, within the bound for SwiGLU, whose wrong-answer
//! control must fail), for passes of 1, 3 and 8 vectors with the last pass partial; then
//! batch invariance itself — each vector's outputs, SwiGLU's included, have the same bits
//! when it is multiplied alone as in a batch; and the batched kernels the decode step
//! builds assemble with `ptxas` without register spills.
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::{self, Addend, Epilogue, Prologue, QGemvParams, WeightFormat};

mod common;

use common::seed;

fn params(
    format: WeightFormat,
    prologue: Prologue,
    epilogue: Epilogue,
    cols: u32,
    batch: u32,
) -> QGemvParams {
    // With the prologue, no more vectors a pass than its shared memory stages.
    let batch = batch.min(qgemv::widest_batch(prologue, cols));
    QGemvParams {
        format,
        prologue,
        epilogue,
        // Quantized rows pair up per warp; 6 rows over 2 warps leave the last block half
        // full, 9 (SwiGLU) a warp without rows.
        rows: if epilogue == Epilogue::SwiGlu { 9 } else { 6 },
        cols,
        warps: 2,
        unroll: if format.is_float() { 2 } else { 1 },
        act: OutType::F32,
        batch,
        max_blocks: 0,
    }
}

/// The formats on shapes of a few pieces per lane, with a partial last step.
const SHAPES: [(WeightFormat, u32); 5] = [
    (WeightFormat::F16, 320),
    (WeightFormat::BF16, 320),
    (WeightFormat::Q8_0, 2112),
    (WeightFormat::Q4_1, 2112),
    (WeightFormat::Q4K, 2304),
];

#[test]
fn every_vector_matches_the_reference() {
    let s = seed();
    for (i, &(format, cols)) in SHAPES.iter().enumerate() {
        // 11 vectors: passes of 3 leave 2 in the last, passes of 8 leave 3.
        for (batch, n) in [(3, 11), (8, 11), (1, 2)] {
            for prologue in [Prologue::None, Prologue::RmsNorm] {
                let seed = s ^ (i as u64) << 32 ^ (batch as u64) << 16 ^ n as u64;
                for epilogue in Epilogue::ALL {
                    let p = params(format, prologue, epilogue, cols, batch);
                    common::check(&qgemv::case(&p, n, seed).expect("case"));
                }
                let p = params(format, prologue, Epilogue::Residual, cols, batch);
                common::check(&qgemv::case_with(&p, n, Addend::Bias, seed).expect("case"));
            }
        }
    }
    // Q5_K, Q6_K, Q3_K and Q2_K, and bf16 activations (8 a word), on one form each.
    for (format, epilogue) in [
        (WeightFormat::Q5K, Epilogue::SwiGlu),
        (WeightFormat::Q6K, Epilogue::Residual),
        (WeightFormat::Q3K, Epilogue::Plain),
        (WeightFormat::Q2K, Epilogue::SwiGlu),
    ] {
        let p = params(format, Prologue::None, epilogue, 2304, 8);
        common::check(&qgemv::case(&p, 9, s).expect("case"));
    }
    let p = QGemvParams {
        act: OutType::BF16,
        ..params(
            WeightFormat::Q4_0,
            Prologue::None,
            Epilogue::SwiGlu,
            2112,
            4,
        )
    };
    common::check(&qgemv::case(&p, 6, s).expect("case"));
}

#[test]
fn a_vector_has_the_same_bits_alone_and_in_a_batch() {
    let s = seed();
    let forms = [
        (
            WeightFormat::Q4_1,
            2112,
            Prologue::RmsNorm,
            Epilogue::SwiGlu,
            OutType::F32,
        ),
        (
            WeightFormat::Q4K,
            2304,
            Prologue::RmsNorm,
            Epilogue::Plain,
            OutType::F32,
        ),
        (
            WeightFormat::F16,
            320,
            Prologue::None,
            Epilogue::Residual,
            OutType::F32,
        ),
        (
            WeightFormat::BF16,
            320,
            Prologue::None,
            Epilogue::SwiGlu,
            OutType::BF16,
        ),
    ];
    for (i, (format, cols, prologue, epilogue, act)) in forms.into_iter().enumerate() {
        let p = QGemvParams {
            act,
            ..params(format, prologue, epilogue, cols, 8)
        };
        let n = 5;
        let case = qgemv::case(&p, n, s ^ i as u64).expect("case");
        let batched = common::check(&case);
        common::assert_batch_invariant(&case, &p, n, &batched);
    }
}

#[test]
fn the_decode_steps_batched_kernels_assemble_without_spills() {
    if common::no_ptxas() {
        return;
    }
    let mut failures = vec![];
    // As the decode step builds them: 4 warps, unroll 4 (floats) or 2, 8 vectors a pass,
    // or as many as 44 KiB of staged rows hold with the prologue.
    for format in WeightFormat::ALL {
        for (prologue, cols) in [
            (Prologue::None, 4096),
            (Prologue::RmsNorm, 576),
            (Prologue::RmsNorm, 4096),
        ] {
            for epilogue in Epilogue::ALL {
                let cols = cols / format.unit_elems() * format.unit_elems();
                let batch = qgemv::widest_batch(prologue, cols);
                let p = QGemvParams {
                    rows: 4096,
                    warps: 4,
                    unroll: if format.is_float() { 4 } else { 1 },
                    ..params(format, prologue, epilogue, cols, batch)
                };
                let f = qgemv::build(&p).expect("builds");
                failures.extend(common::spill_failure(
                    &f,
                    &format!("batch {batch} cols {cols:>5}"),
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
