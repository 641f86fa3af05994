//! What the kernel tests share: a fresh seed per run (printed; `QUENCH_SEED` replays it),
//! a library kernel's case on given parameters, and the full check of a case through the
//! interpreter — every output against its reference, and every deliberately wrong
//! reference failing the bound.
#![allow(dead_code)] // each test binary uses its own part

use quench_kernels::{compare, compare_controls, find, run_case, CaseOutputs, Check, KernelCase};
use quench_rt::InterpExecutor;

pub fn seed() -> u64 {
    let s = std::env::var("QUENCH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("seed {s} (set QUENCH_SEED={s} to replay)");
    s
}

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
        assert!(r.passed, "{} {} failed its check:\n{r}", case.name, case.shape);
    }
    for e in &case.expected {
        if let Check::Bound { explain, .. } = &e.check {
            eprintln!("  bound: {explain}");
        }
    }
    let controls = compare_controls(case, &out).expect("comparable controls");
    let bounded = case.expected.iter().any(|e| matches!(e.check, Check::Bound { .. }));
    assert!(!bounded || !controls.is_empty(), "{}: a bound needs a wrong-answer control", case.name);
    for (what, r) in controls {
        eprintln!("  control `{what}`: {r}");
        assert!(!r.passed, "{}: the wrong reference `{what}` passed the bound", case.name);
        assert!(r.mismatches * 2 > r.elements, "{}: `{what}` failed on only {} elements", case.name, r.mismatches);
    }
    out
}
