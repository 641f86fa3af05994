//! On the interpreter: every output against the exact reference within the bound, the
//! bf16-only control failing it; a row of `x` with the same bits at every `n`; and the
//! decode step's shapes assembling with `ptxas` without spills.
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_rt::InterpExecutor;

use super::*;
use crate::case::{compare, compare_controls, run_case, CaseOutputs};

use crate::data::test_seed as seed;

/// A small shape: rows not a multiple of a block's, a partial last step of chunks.
fn params(epilogue: Epilogue) -> GemvTcParams {
    GemvTcParams {
        epilogue,
        rows: 40,
        cols: 224,
        warps: 2,
        row_tiles: 2,
        tiles: 2,
        unroll: 2,
    }
}

/// Runs `case`, checks every output within its bound and that the control fails it on a
/// quarter of the elements or more (about half fail for SwiGLU, whose small outputs stay
/// within the bound either way); returns the outputs.
fn check(case: &KernelCase) -> CaseOutputs {
    let out = run_case(&mut InterpExecutor::new(), case).unwrap_or_else(|e| panic!("{e}"));
    for r in compare(case, &out).expect("comparable") {
        eprintln!("{} {}: {r}", case.name, case.shape);
        assert!(r.passed, "{} {}:\n{r}", case.name, case.shape);
    }
    for (what, r) in compare_controls(case, &out).expect("comparable") {
        eprintln!("  control `{what}`: {r}");
        assert!(
            !r.passed && r.mismatches * 4 >= r.elements,
            "{}: control `{what}` did not fail: {r}",
            case.name
        );
    }
    out
}

#[test]
fn gemv_tc_outputs_are_within_the_bound_and_dropping_lo_is_not() {
    let s = seed();
    for (i, e) in Epilogue::ALL.into_iter().enumerate() {
        // 19 rows of x: passes of 16 leave a partial tile in the second.
        check(&case(&params(e), 19, s ^ i as u64).expect("case"));
    }
    let bias = case_with(&params(Epilogue::Residual), 5, Addend::Bias, s ^ 7).expect("case");
    check(&bias);
}

/// The case cut down to rows `from .. from + len` of `x` (and of `y`, `r`).
fn rows_of(case: &KernelCase, p: &GemvTcParams, from: usize, len: usize) -> KernelCase {
    let mut c = case.clone();
    let (rows, cols) = (p.rows as usize, p.cols as usize);
    for b in &mut c.buffers {
        let width = match b.name.as_str() {
            "x" => cols,
            "y" | "r" => rows,
            _ => continue,
        };
        b.data = b.data[4 * from * width..4 * (from + len) * width].to_vec();
    }
    let at = c
        .args
        .iter()
        .position(|a| matches!(a, CaseArg::Scalar(Arg::U32(_))))
        .expect("an n argument");
    c.args[at] = CaseArg::Scalar(Arg::U32(len as u32));
    c.expected.clear();
    c.controls.clear();
    c
}

#[test]
fn gemv_tc_rows_have_the_same_bits_at_every_batch_size() {
    let s = seed();
    for (i, e) in Epilogue::ALL.into_iter().enumerate() {
        let p = GemvTcParams {
            rows: 24,
            cols: 96,
            tiles: 1,
            ..params(e)
        };
        let full = case(&p, 64, s ^ (i as u64) << 8).expect("case");
        let mut exec = InterpExecutor::new();
        // Each row alone: what every batch must reproduce.
        let alone: Vec<Vec<u8>> = (0..64)
            .map(|v| {
                let out = run_case(&mut exec, &rows_of(&full, &p, v, 1))
                    .unwrap_or_else(|e| panic!("{e}"));
                out.outputs[0].1.clone()
            })
            .collect();
        let per = alone[0].len();
        // Batches of 3, 8, 17 and 64 rows at different offsets, also with passes of 16.
        for (from, n, tiles) in [(5, 3, 1), (40, 8, 1), (20, 17, 2), (0, 64, 1), (0, 64, 8)] {
            let q = GemvTcParams { tiles, ..p };
            let mut c = rows_of(&full, &p, from, n);
            c.kernel = build(&q).expect("builds");
            let out = run_case(&mut exec, &c).unwrap_or_else(|e| panic!("{e}"));
            let got = &out.outputs[0].1;
            for v in 0..n {
                assert!(
                    got[v * per..(v + 1) * per] == alone[from + v][..],
                    "{}: row {} of a batch of {n} ({tiles} tiles a pass) differs from the row alone",
                    p.name(),
                    from + v
                );
            }
        }
    }
}

#[test]
fn gemv_tc_decode_shapes_assemble_without_spills() {
    if quench_testkit::ok(quench_ptx::ptxas::find_ptxas()).is_none() {
        return;
    }
    let mut failures = vec![];
    // The engine's variants: every pass width a step of up to 64 rows takes.
    for tiles in [1, 2, 4, 8] {
        for (e, row_tiles, warps) in [
            (Epilogue::Plain, 2, 8),
            (Epilogue::Residual, 2, 8),
            (Epilogue::SwiGlu, 1, 8),
        ] {
            let p = GemvTcParams {
                epilogue: e,
                rows: 4096,
                cols: 4096,
                warps,
                row_tiles,
                tiles,
                unroll: 2,
            };
            let f = build(&p).expect("builds");
            let ptx = quench_ptx::emit(&f).expect("emits");
            match quench_ptx::ptxas::assemble(&ptx, "sm_90") {
                Ok(r) => {
                    eprintln!(
                        "{:<28} tiles {tiles}: registers {:>3}, spills {}/{} B",
                        f.name, r.registers, r.spill_store_bytes, r.spill_load_bytes
                    );
                    if r.spill_store_bytes > 0 || r.spill_load_bytes > 0 {
                        failures.push(format!("{} ({tiles} tiles): spills", f.name));
                    }
                }
                Err(e) => failures.push(format!("{} ({tiles} tiles): {e}", f.name)),
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn gemv_tc_refuses_shapes_it_cannot_take() {
    let p = params(Epilogue::Plain);
    assert!(build(&GemvTcParams { cols: 48, ..p }).is_err());
    assert!(build(&GemvTcParams {
        warps: 16,
        tiles: 8,
        ..p
    })
    .is_err());
    assert!(build(&GemvTcParams { row_tiles: 0, ..p }).is_err());
}
