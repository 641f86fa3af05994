//! What the kernel tests share: a fresh seed per run (printed; `QUENCH_SEED` replays it),
//! a library kernel's case on given parameters, the full check of a case through the
//! interpreter — every output against its reference, and every deliberately wrong
//! reference failing the bound — and the same bits from a case run another way; for the
//! matrix–vector kernels, a case rebuilt on other parameters and each vector of a batch
//! alone; and `ptxas` register and spill checks.
#![allow(dead_code)] // each test binary uses its own part

use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::{self, Epilogue, QGemvParams, WeightFormat};
use quench_kernels::{
    compare, compare_controls, find, run_case, CaseArg, CaseOutputs, Check, KernelCase,
};
use quench_rt::{Arg, InterpExecutor};

/// The seed of a test's random inputs, printed (`QUENCH_SEED` replays one).
pub use quench_testkit::seed;

/// The library kernel `kernel`'s case on `params`, with fresh inputs.
pub fn case(kernel: &str, params: &str) -> KernelCase {
    let spec = find(kernel).expect("kernel in the library");
    let p = spec.parse_params(params).expect("valid parameters");
    spec.make_case(&p, seed()).expect("case")
}

/// Runs a case on the interpreter, checks every output, and checks that every control
/// fails on more than half of the elements; returns the outputs.
pub fn check(case: &KernelCase) -> CaseOutputs {
    let mut exec = InterpExecutor::new();
    let out = run_case(&mut exec, case).unwrap_or_else(|e| panic!("{e}"));
    for r in compare(case, &out).expect("comparable outputs") {
        eprintln!("{} {}: {r}", case.name, case.shape);
        assert!(
            r.passed,
            "{} {} failed its check:\n{r}",
            case.name, case.shape
        );
    }
    for e in &case.expected {
        if let Check::Bound { explain, .. } = &e.check {
            eprintln!("  bound: {explain}");
        }
    }
    let controls = compare_controls(case, &out).expect("comparable controls");
    let bounded = case
        .expected
        .iter()
        .any(|e| matches!(e.check, Check::Bound { .. }));
    assert!(
        !bounded || !controls.is_empty(),
        "{}: a bound needs a wrong-answer control",
        case.name
    );
    for (what, r) in controls {
        eprintln!("  control `{what}`: {r}");
        assert!(
            !r.passed,
            "{}: the wrong reference `{what}` passed the bound",
            case.name
        );
        assert!(
            r.mismatches * 2 > r.elements,
            "{}: `{what}` failed on only {} elements",
            case.name,
            r.mismatches
        );
    }
    out
}

/// Runs `case` on the interpreter (its references not applied) and asserts that every
/// output has the same bits as in `want`; `how` says how the two runs differ.
pub fn assert_same_bits(case: &KernelCase, want: &CaseOutputs, how: &str) {
    let got = run_case(&mut InterpExecutor::new(), case).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got.outputs.len(), want.outputs.len());
    for ((i, w), (j, g)) in want.outputs.iter().zip(&got.outputs) {
        assert_eq!(i, j);
        assert!(
            w == g,
            "{} {}: `{}` differs {how}",
            case.name,
            case.shape,
            case.buffers[*i].name
        );
    }
}

/// Each matrix–vector format on a row of a few pieces per lane, most with a partial last
/// step.
pub const QGEMV_SHAPES: [(WeightFormat, u32); 10] = [
    (WeightFormat::F16, 576),
    (WeightFormat::BF16, 96),
    (WeightFormat::Q8_0, 192),
    (WeightFormat::Q4_0, 128),
    (WeightFormat::Q4_1, 192),
    (WeightFormat::Q4K, 512),
    (WeightFormat::Q5K, 768),
    (WeightFormat::Q6K, 256),
    (WeightFormat::Q3K, 512),
    (WeightFormat::Q2K, 768),
];

/// The matrix–vector `case` with its kernel and launch built from `p` instead, and its
/// references dropped (the run is compared with another run, not with them).
pub fn rebuilt(case: &KernelCase, p: &QGemvParams) -> KernelCase {
    let mut c = case.clone();
    c.kernel = qgemv::build(p).expect("builds");
    c.launch = p.launch();
    c.expected.clear();
    c.controls.clear();
    c
}

/// The batched matrix–vector case cut down to vector `v` alone, one vector a pass: its
/// activations, its rows of the outputs (and of an in-place residual), `n = 1`.
pub fn alone(case: &KernelCase, p: &QGemvParams, v: usize) -> KernelCase {
    let one = QGemvParams { batch: 1, ..*p };
    let mut c = rebuilt(case, &one);
    let (rows, cols) = (p.rows as usize, p.cols as usize);
    let act = match p.act {
        OutType::F32 => 4,
        OutType::BF16 => 2,
    };
    let out = if p.epilogue == Epilogue::SwiGlu {
        act
    } else {
        4
    };
    for b in &mut c.buffers {
        let (from, len) = match b.name.as_str() {
            "x" => (v * cols * act, cols * act),
            "y" | "r" => (v * rows * out, rows * out),
            _ => continue,
        };
        b.data = b.data[from..from + len].to_vec();
    }
    // `n` is the first u32 scalar (a residual's `r_stride` follows it).
    let at = c
        .args
        .iter()
        .position(|a| matches!(a, CaseArg::Scalar(Arg::U32(_))))
        .expect("an n argument");
    c.args[at] = CaseArg::Scalar(Arg::U32(1));
    c
}

/// Asserts that each of the `n` vectors of the batched matrix–vector `case`, multiplied
/// alone, gives the same bits as its part of the batch's first output in `batched`.
pub fn assert_batch_invariant(case: &KernelCase, p: &QGemvParams, n: u32, batched: &CaseOutputs) {
    let (index, all) = &batched.outputs[0];
    let name = &case.buffers[*index].name;
    let per = all.len() / n as usize;
    let mut exec = InterpExecutor::new();
    for v in 0..n as usize {
        let single = run_case(&mut exec, &alone(case, p, v)).unwrap_or_else(|e| panic!("{e}"));
        let (_, got) = single
            .outputs
            .iter()
            .find(|(b, _)| case.buffers[*b].name == *name)
            .expect("the same output");
        assert!(
            got[..] == all[v * per..(v + 1) * per],
            "{}: vector {v} alone differs from the batch",
            case.name
        );
    }
}

/// Whether `ptxas` is missing: then the test returns, after failing in CI or reporting
/// NOT RUN elsewhere (quench-testkit).
pub fn no_ptxas() -> bool {
    quench_testkit::ok(quench_ptx::ptxas::find_ptxas()).is_none()
}

/// Assembles `f` with `ptxas` for sm_90 and prints its registers and spills, labelled
/// `what`; returns what went wrong (an error, or spills), if anything.
pub fn spill_failure(f: &quench_ir::Function, what: &str) -> Option<String> {
    let ptx = quench_ptx::emit(f).expect("emits");
    match quench_ptx::ptxas::assemble(&ptx, "sm_90") {
        Ok(r) => {
            eprintln!(
                "{:<36} {what}: registers {:>3}, spills {}/{} B",
                f.name, r.registers, r.spill_store_bytes, r.spill_load_bytes
            );
            (r.spill_store_bytes > 0 || r.spill_load_bytes > 0)
                .then(|| format!("{} {what}: spills", f.name))
        }
        Err(e) => Some(format!("{} {what}: {e}", f.name)),
    }
}
