//! The matrix–vector kernels on a capped grid: fewer blocks than row groups, so that each
//! block loops over several groups (and, with the RMSNorm prologue, normalizes each
//! pass's vectors once for all of them). On the interpreter, with a last group that
//! leaves warps without rows and passes of one and of several vectors (the last one
//! partial): every output against the reference (bit for bit where the kernel is exact,
//! within the bound for SwiGLU, whose wrong-answer control must fail), and the same bits
//! as the kernel with a block per group; then the capped kernels the decode step builds
//! assemble with `ptxas` without register spills.
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::{self, Addend, Epilogue, Prologue, QGemvParams, WeightFormat};
use quench_kernels::KernelCase;

mod common;

use common::{seed, QGEMV_SHAPES as SHAPES};

/// 2 warps a block and at most 3 blocks. 14 rows pair up per warp (quantized, one vector
/// a pass) into 4 groups, the last with one warp idle; otherwise 13 rows make 7 groups,
/// the last half full: blocks of 2 or 3 groups either way.
fn capped(
    format: WeightFormat,
    prologue: Prologue,
    epilogue: Epilogue,
    cols: u32,
    batch: u32,
) -> QGemvParams {
    let p = QGemvParams {
        format,
        prologue,
        epilogue,
        rows: 14,
        cols,
        warps: 2,
        unroll: if format.is_float() { 2 } else { 1 },
        act: OutType::F32,
        batch: batch.min(qgemv::widest_batch(prologue, cols)),
        max_blocks: 3,
    };
    if p.rows_per_warp() == 2 {
        p
    } else {
        QGemvParams { rows: 13, ..p }
    }
}

/// Checks the capped case against its reference, then runs the same inputs through the
/// kernel with a block per group: the outputs must be the same bits.
fn check_against_uncapped(case: &KernelCase, p: &QGemvParams) {
    assert!(
        p.launch().grid[0] < p.groups(),
        "{}: the grid is not capped",
        case.name
    );
    let capped = common::check(case);
    let uncapped = common::rebuilt(
        case,
        &QGemvParams {
            max_blocks: 0,
            ..*p
        },
    );
    common::assert_same_bits(&uncapped, &capped, "from the kernel with a block per group");
}

#[test]
fn capped_grids_match_the_reference_and_the_uncapped_kernel() {
    let s = seed();
    for (i, &(format, cols)) in SHAPES.iter().enumerate() {
        // Alternate formats take one vector a pass, or 5 vectors in passes of 3 and 2.
        let (batch, n) = if i % 2 == 0 { (1, 2) } else { (3, 5) };
        for prologue in [Prologue::None, Prologue::RmsNorm] {
            let seed = s ^ (i as u64) << 32 ^ (prologue == Prologue::RmsNorm) as u64;
            for epilogue in Epilogue::ALL {
                let p = capped(format, prologue, epilogue, cols, batch);
                check_against_uncapped(&qgemv::case(&p, n, seed).expect("case"), &p);
            }
            let p = capped(format, prologue, Epilogue::Residual, cols, batch);
            check_against_uncapped(
                &qgemv::case_with(&p, n, Addend::Bias, seed).expect("case"),
                &p,
            );
        }
    }
    // bf16 activations, with passes of one vector and of several.
    for (batch, n) in [(1, 1), (4, 6)] {
        let p = capped(
            WeightFormat::Q4_1,
            Prologue::None,
            Epilogue::SwiGlu,
            128,
            batch,
        );
        let p = QGemvParams {
            act: OutType::BF16,
            ..p
        };
        check_against_uncapped(&qgemv::case(&p, n, s ^ batch as u64).expect("case"), &p);
    }
}

#[test]
fn the_grid_is_the_groups_or_the_cap_whichever_is_fewer() {
    let p = QGemvParams {
        max_blocks: 0,
        ..capped(WeightFormat::Q8_0, Prologue::None, Epilogue::Plain, 64, 1)
    };
    for (rows, groups) in [(14, 4), (16, 4), (17, 9), (1, 1)] {
        let p = QGemvParams { rows, ..p };
        assert_eq!(p.groups(), groups, "{rows} rows");
        assert_eq!(p.launch().grid, [groups, 1, 1], "{rows} rows, uncapped");
        for cap in [1, groups - 1, groups, groups + 5] {
            let blocks = if cap == 0 { groups } else { cap.min(groups) };
            assert_eq!(
                QGemvParams {
                    max_blocks: cap,
                    ..p
                }
                .launch()
                .grid,
                [blocks, 1, 1],
                "{rows} rows, cap {cap}"
            );
        }
    }
}

#[test]
fn the_decode_steps_capped_kernels_assemble_without_spills() {
    if common::no_ptxas() {
        return;
    }
    let mut failures = vec![];
    // As the decode step builds them on a 132-SM device: 4 warps, unroll 4 (floats) or 2
    // at one vector a pass, 1 at the widest batch; at most 1056 blocks over the row
    // groups of a large matrix (qwen2.5-0.5b's LM head).
    for format in WeightFormat::ALL {
        for (prologue, cols) in [(Prologue::None, 4864), (Prologue::RmsNorm, 896)] {
            let cols = cols / format.unit_elems() * format.unit_elems();
            for epilogue in Epilogue::ALL {
                for batch in [1, qgemv::widest_batch(prologue, cols)] {
                    let p = QGemvParams {
                        format,
                        prologue,
                        epilogue,
                        rows: 151_936,
                        cols,
                        warps: 4,
                        unroll: match (format.is_float(), batch) {
                            (true, _) => 4,
                            (false, 1) => 2,
                            (false, _) => 1,
                        },
                        act: OutType::F32,
                        batch,
                        max_blocks: 132 * 8,
                    };
                    let f = qgemv::build(&p).expect("builds");
                    failures.extend(common::spill_failure(
                        &f,
                        &format!("batch {batch} cols {cols:>5}"),
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
