//! The encoder kernels (BERT: bias rows, GELU and the bf16 conversion, bidirectional
//! attention over a padded batch) through the interpreter against their references, with
//! fresh seeded inputs (`QUENCH_SEED` replays a run) and poisoned outputs; bounded checks
//! must also fail their deliberately wrong references.

use quench_kernels::{compare, compare_controls, find, run_case, Check, KernelCase};
use quench_rt::InterpExecutor;

fn seed() -> u64 {
    let s = std::env::var("QUENCH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("seed {s} (set QUENCH_SEED={s} to replay)");
    s
}

fn case(kernel: &str, params: &str) -> KernelCase {
    let spec = find(kernel).expect("kernel in the library");
    let p = spec.parse_params(params).expect("valid parameters");
    spec.make_case(&p, seed()).expect("case")
}

fn check(case: &KernelCase) {
    let mut exec = InterpExecutor::new();
    let out = run_case(&mut exec, case).unwrap_or_else(|e| panic!("{e}"));
    for r in compare(case, &out).expect("comparable outputs") {
        eprintln!("{} {}: {r}", case.name, case.shape);
        assert!(r.passed, "{} {} failed its check:\n{r}", case.name, case.shape);
    }
    let bounded = case.expected.iter().any(|e| matches!(e.check, Check::Bound { .. }));
    let controls = compare_controls(case, &out).expect("comparable controls");
    assert!(!bounded || !controls.is_empty(), "{}: a bound needs a wrong-answer control", case.name);
    for (what, r) in controls {
        eprintln!("  control `{what}`: {r}");
        assert!(!r.passed, "{}: the wrong reference `{what}` passed the bound", case.name);
        assert!(r.mismatches * 2 > r.elements, "{}: `{what}` failed on only {} elements", case.name, r.mismatches);
    }
}

#[test]
fn cast_f32_bf16() {
    // 250 groups of 4 and 3 trailing elements.
    check(&case("cast_f32_bf16", "n=1003 threads=64"));
}

#[test]
fn gelu_f32_bf16() {
    check(&case("gelu_f32_bf16", "n=1030 threads=64"));
}

#[test]
fn bias_rows_f32() {
    // 100 columns over 64 threads: a full stride and a partial one.
    check(&case("bias_rows_f32", "rows=5 cols=100 threads=64"));
}

#[test]
fn encoder_attention_head_dim_32() {
    // 3 texts of 11, some and 1 tokens; 11 queries over 4-warp blocks leaves a partial block.
    check(&case("encoder_attention_bf16", "head_dim=32 n_heads=2 warps=4 batch=3 seq_len=11"));
}

#[test]
fn encoder_attention_head_dim_64() {
    check(&case("encoder_attention_bf16", "head_dim=64 n_heads=2 warps=2 batch=3 seq_len=9"));
}
