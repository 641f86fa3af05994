//! The matrix–vector kernels with several rows a warp at several vectors a pass (each
//! activation load shared by the warp's rows). On the interpreter, for every format and
//! epilogue, passes of 3, 5 and 8 vectors and row counts that leave the last row group
//! part full: every output against the reference (bit for bit where the kernel is exact,
//! within the bound for SwiGLU, whose wrong-answer control must fail); on a capped grid
//! the same bits as with a block per group; each vector's outputs the same bits as when
//! it is multiplied alone (one vector a pass, so fewer rows a warp). Then the kernels a
//! decode step of several rows builds for a model of hidden size 4096 and 14336-wide
//! SwiGLU assemble with `ptxas` without register spills.
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::{self, Addend, Epilogue, Prologue, QGemvParams, WeightFormat};
use quench_kernels::KernelCase;

mod common;

use common::{seed, QGEMV_SHAPES as SHAPES};

/// The rows a warp takes at several vectors a pass when `rows` allows it.
fn widest_rows(format: WeightFormat, epilogue: Epilogue) -> u32 {
    match (format.is_float(), epilogue) {
        (true, Epilogue::SwiGlu) => 2,
        (true, _) => 4,
        (false, Epilogue::SwiGlu) => 1,
        (false, _) => 2,
    }
}

/// 3 warps a block. 20 rows make row groups of 12, 6 or 3 rows (4, 2 or 1 a warp) with
/// the last one part full (8, 2 or 2 rows); capped, 44 rows make 4, 8 or 15 groups over
/// 3 blocks.
fn params(
    format: WeightFormat,
    epilogue: Epilogue,
    cols: u32,
    batch: u32,
    capped: bool,
) -> QGemvParams {
    QGemvParams {
        format,
        prologue: Prologue::None,
        epilogue,
        rows: if capped { 44 } else { 20 },
        cols,
        warps: 3,
        unroll: if format.is_float() { 2 } else { 1 },
        act: OutType::F32,
        batch,
        max_blocks: if capped { 3 } else { 0 },
    }
}

#[test]
fn rows_a_warp_follow_the_format_the_batch_and_the_row_count() {
    for format in WeightFormat::ALL {
        for epilogue in Epilogue::ALL {
            let p = params(format, epilogue, format.unit_elems(), 8, false);
            let widest = widest_rows(format, epilogue);
            assert_eq!(p.rows_per_warp(), widest, "{}", p.name());
            // Halved until it divides the rows.
            for (rows, want) in [(22, widest.min(2)), (21, 1), (4100, widest)] {
                assert_eq!(
                    QGemvParams { rows, ..p }.rows_per_warp(),
                    want,
                    "{} {rows} rows",
                    p.name()
                );
            }
            // One vector a pass: two rows of a quantized matrix, one otherwise.
            let single = if format.is_float() || epilogue == Epilogue::SwiGlu {
                1
            } else {
                2
            };
            assert_eq!(
                QGemvParams { batch: 1, ..p }.rows_per_warp(),
                single,
                "{} batch 1",
                p.name()
            );
            assert_eq!(p.groups(), 20u32.div_ceil(3 * widest), "{}", p.name());
        }
    }
}

/// Every output of the case against its reference; capped, also the same bits as the
/// kernel with a block per group; and each vector's outputs the same bits as alone.
fn check_all(case: &KernelCase, p: &QGemvParams, n: u32) {
    let out = common::check(case);
    if p.max_blocks != 0 {
        assert!(
            p.launch().grid[0] < p.groups(),
            "{}: the grid is not capped",
            case.name
        );
        let uncapped = common::rebuilt(
            case,
            &QGemvParams {
                max_blocks: 0,
                ..*p
            },
        );
        common::assert_same_bits(&uncapped, &out, "from a block per group");
    }
    common::assert_batch_invariant(case, p, n, &out);
}

#[test]
fn several_rows_a_warp_match_the_reference_alone_and_capped() {
    let s = seed();
    let passes = [(3, 5), (5, 7), (8, 8)];
    for (i, &(format, cols)) in SHAPES.iter().enumerate() {
        let forms = [
            (Epilogue::Plain, Addend::Residual),
            (Epilogue::Residual, Addend::Residual),
            (Epilogue::Residual, Addend::Bias),
            (Epilogue::SwiGlu, Addend::Residual),
        ];
        for (j, (epilogue, addend)) in forms.into_iter().enumerate() {
            let (batch, n) = passes[(i + j) % passes.len()];
            for capped in [false, true] {
                let p = params(format, epilogue, cols, batch, capped);
                assert_eq!(
                    p.rows_per_warp(),
                    widest_rows(format, epilogue),
                    "{}",
                    p.name()
                );
                let seed = s ^ (i as u64) << 32 ^ (j as u64) << 16 ^ capped as u64;
                let case = qgemv::case_with(&p, n, addend, seed).expect("case");
                check_all(&case, &p, n);
            }
        }
    }
    // bf16 activations (8 a word) on the widest float and quantized rows.
    for (format, cols, epilogue) in [
        (WeightFormat::BF16, 96, Epilogue::Residual),
        (WeightFormat::Q4_0, 128, Epilogue::Plain),
    ] {
        let p = QGemvParams {
            act: OutType::BF16,
            ..params(format, epilogue, cols, 5, true)
        };
        check_all(&qgemv::case(&p, 6, s ^ 0xbf16).expect("case"), &p, 6);
    }
}

#[test]
fn a_decode_step_of_several_rows_assembles_without_spills_at_hidden_4096() {
    if common::no_ptxas() {
        return;
    }
    // As a step of several rows builds them for a llama-3.1-8b shape: 4 warps, 8 vectors a
    // pass, unroll 4 (floats) or 1; the LM head on a grid capped at 1056 blocks.
    let (hidden, ffn, vocab) = (4096, 14336, 128_256);
    let products = [
        ("qkv", 6144, hidden, Epilogue::Plain, 0),
        ("o", hidden, hidden, Epilogue::Residual, 0),
        ("gate/up", ffn, hidden, Epilogue::SwiGlu, 0),
        ("down", hidden, ffn, Epilogue::Residual, 0),
        ("lm head", vocab, hidden, Epilogue::Plain, 132 * 8),
    ];
    let mut failures = vec![];
    for format in WeightFormat::ALL {
        for (what, rows, cols, epilogue, max_blocks) in products {
            for act in [OutType::F32, OutType::BF16] {
                let p = QGemvParams {
                    format,
                    prologue: Prologue::None,
                    epilogue,
                    rows,
                    cols,
                    warps: 4,
                    unroll: if format.is_float() { 4 } else { 1 },
                    act,
                    batch: 8,
                    max_blocks,
                };
                let f = qgemv::build(&p).expect("builds");
                let label = format!(
                    "{what:<8} {rows:>6}x{cols:<5} {} rows a warp",
                    p.rows_per_warp()
                );
                failures.extend(common::spill_failure(&f, &label));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
