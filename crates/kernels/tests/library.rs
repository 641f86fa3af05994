//! The registry: names, parameters, and refusals that name the problem.

use quench_kernels::{find, library, time_case, KernelError};
use quench_rt::InterpExecutor;

#[test]
fn names_are_unique_and_complete() {
    let names: Vec<&str> = library().iter().map(|k| k.name).collect();
    let head = [
        "add_f32",
        "add_bf16",
        "silu_mul_f16",
        "reduce_sum_f32",
        "reduce_max_f32",
        "rmsnorm_bf16",
        "rmsnorm_rows_f32",
        "softmax_f32",
        "gemv_bf16",
        "gemm_bf16",
        "gemm_bf16_residual",
        "gemm_bf16_to_bf16",
        "gemm_q8_0",
        "gemm_q8_0_residual",
        "gemm_q8_0_to_bf16",
        "gemm_q4_0",
        "gemm_q4_0_residual",
        "gemm_q4_0_to_bf16",
        "gemm_q4_1",
        "gemm_q4_1_residual",
        "gemm_q4_1_to_bf16",
        "gemm_q4_k",
        "gemm_q4_k_residual",
        "gemm_q4_k_to_bf16",
        "gemm_q5_k",
        "gemm_q5_k_residual",
        "gemm_q5_k_to_bf16",
        "gemm_q6_k",
        "gemm_q6_k_residual",
        "gemm_q6_k_to_bf16",
        "gemm_q3_k",
        "gemm_q3_k_residual",
        "gemm_q3_k_to_bf16",
        "gemm_q2_k",
        "gemm_q2_k_residual",
        "gemm_q2_k_to_bf16",
        "gemm_bf16_xf16",
        "gemm_bf16_xf16_residual",
        "gemm_bf16_xf16_to_f16",
        "gemm_f16_xf16",
        "gemm_f16_xf16_residual",
        "gemm_f16_xf16_to_f16",
        "gemm_q8_0_xf16",
        "gemm_q8_0_xf16_residual",
        "gemm_q8_0_xf16_to_f16",
        "gemm_q4_0_xf16",
        "gemm_q4_0_xf16_residual",
        "gemm_q4_0_xf16_to_f16",
        "gemm_q4_1_xf16",
        "gemm_q4_1_xf16_residual",
        "gemm_q4_1_xf16_to_f16",
        "gemm_q4_k_xf16",
        "gemm_q4_k_xf16_residual",
        "gemm_q4_k_xf16_to_f16",
        "gemm_q5_k_xf16",
        "gemm_q5_k_xf16_residual",
        "gemm_q5_k_xf16_to_f16",
        "gemm_q6_k_xf16",
        "gemm_q6_k_xf16_residual",
        "gemm_q6_k_xf16_to_f16",
        "gemm_q3_k_xf16",
        "gemm_q3_k_xf16_residual",
        "gemm_q3_k_xf16_to_f16",
        "gemm_q2_k_xf16",
        "gemm_q2_k_xf16_residual",
        "gemm_q2_k_xf16_to_f16",
        "embed_f32",
        "embed_bf16",
        "embed_f16",
        "embed_q8_0",
        "embed_q4_1",
        "embed_q4_k",
        "embed_q5_k",
        "embed_q6_k",
        "rmsnorm_residual_bf16",
        "rmsnorm_residual_f16",
        "rmsnorm_residual_f32",
        "layernorm_residual_bf16",
        "layernorm_residual_f32",
        "rope_neox_f32",
        "rope_gptj_f32",
    ];
    // The matrix-vector kernels: each format's stem × (prologue, activation type) ×
    // epilogue, less plain bf16 (`gemv_bf16` above).
    let stems = [
        "gemv_bf16",
        "gemv_f16",
        "qgemv_q8_0",
        "qgemv_q4_0",
        "qgemv_q4_1",
        "qgemv_q4_k",
        "qgemv_q5_k",
        "qgemv_q6_k",
        "qgemv_q3_k",
        "qgemv_q2_k",
    ];
    let mut gemv: Vec<String> = vec![];
    for (mid, end) in [("", ""), ("", "_xf32"), ("_rmsnorm", "_xf32")] {
        for stem in stems {
            for epilogue in ["", "_residual", "_swiglu"] {
                gemv.push(format!("{stem}{mid}{epilogue}{end}"));
            }
        }
    }
    let tail = [
        "gemv_tc_bf16_xf32",
        "gemv_tc_bf16_residual_xf32",
        "gemv_tc_bf16_swiglu_xf32",
        "attention_decode_bf16",
        "attention_decode_merge_bf16",
        "attention_decode_f16",
        "attention_decode_merge_f16",
        "attention_decode_f32",
        "attention_decode_merge_f32",
        "attention_merge_bf16",
        "attention_merge_f32",
        "attention_prefill_bf16",
        "attention_prefill_f16",
        "attention_prefill_f32",
        "kv_append_bf16",
        "kv_append_f16",
        "kv_append_f32",
        "rope_append_neox_bf16",
        "rope_append_gptj_bf16",
        "rope_append_neox_qknorm_bf16",
        "rope_append_gptj_qknorm_bf16",
        "rope_append_neox_f16",
        "rope_append_gptj_f16",
        "rope_append_neox_qknorm_f16",
        "rope_append_gptj_qknorm_f16",
        "rope_append_neox_f32",
        "rope_append_gptj_f32",
        "rope_append_neox_qknorm_f32",
        "rope_append_gptj_qknorm_f32",
        "argmax_f32",
        "mask_logits_f32",
        "sample_f32",
        "cast_f32_bf16",
        "cast_f32_f16",
        "gelu_f32_bf16",
        "gelu_f32_f16",
        "bias_rows_f32",
        "encoder_attention_bf16",
    ];
    let expected: Vec<String> = head
        .iter()
        .map(|n| n.to_string())
        .chain(gemv.into_iter().skip(1))
        .chain(tail.iter().map(|n| n.to_string()))
        .collect();
    assert_eq!(names, expected);
    for spec in library() {
        assert!(!spec.description.is_empty());
        let f = spec
            .build(&spec.default_params())
            .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        assert_eq!(f.name, spec.name);
    }
}

/// Every kernel's problem sizes (the interpreter's, check-kernels' comparison and timing
/// ones) parse against its own parameters and name only parameters it has.
#[test]
fn problem_sizes_parse() {
    let mut failures = vec![];
    for spec in library() {
        let sizes = [spec.small_params(), spec.compare_params()];
        assert!(
            !spec.perf_params().is_empty(),
            "{}: no timing shape",
            spec.name
        );
        for text in sizes.iter().chain(spec.perf_params()) {
            if let Err(e) = spec.parse_params(text) {
                failures.push(format!("{} [{text}]: {e}", spec.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unknown_kernels_and_parameters_are_named() {
    let e = find("gemv_f64").unwrap_err();
    assert!(
        matches!(e, KernelError::UnknownKernel { .. }) && e.to_string().contains("gemv_f64"),
        "{e}"
    );
    let gemv = find("gemv_bf16").unwrap();
    let e = gemv
        .parse_params("rows=64,colums=8")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gemv_bf16") && e.contains("`colums`") && e.contains("cols"),
        "{e}"
    );
    let e = gemv.parse_params("rows=sixty").unwrap_err().to_string();
    assert!(e.contains("rows=sixty"), "{e}");
}

#[test]
fn unsupported_shapes_are_refused_by_name() {
    let refuse = |kernel: &str, params: &str, needle: &str| {
        let spec = find(kernel).unwrap();
        let p = spec.parse_params(params).unwrap();
        let e = spec.build(&p).unwrap_err().to_string();
        assert!(
            e.contains(kernel) && e.contains(needle),
            "{kernel} {params}: {e}"
        );
        let e = spec.make_case(&p, 1).unwrap_err().to_string();
        assert!(e.contains(needle), "{kernel} {params}: {e}");
    };
    refuse("gemm_bf16", "m=100 n=100 k=64", "n = 100");
    refuse("gemm_bf16", "bm=96", "64 or 128");
    refuse("gemm_q6_k", "k=256", "multiple of 512");
    refuse("gemv_bf16", "cols=12", "multiple of 8");
    refuse("rmsnorm_bf16", "cols=12", "multiple of 8");
    refuse("softmax_f32", "cols=10", "multiple of 4");
    refuse("reduce_sum_f32", "threads=48", "multiple of 32");
    let e = find("add_f32").unwrap().build(
        &find("add_f32")
            .unwrap()
            .parse_params("threads=2048")
            .unwrap(),
    );
    assert!(e.unwrap_err().to_string().contains("threads=2048"));
}

#[test]
fn timing_runs_on_any_executor() {
    let spec = find("add_f32").unwrap();
    let case = spec
        .make_case(&spec.parse_params("n=100 threads=32").unwrap(), 3)
        .unwrap();
    let t = time_case(&mut InterpExecutor::new(), &case, 1, 3).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(t.reps, 3);
    assert!(t.min_ms <= t.median_ms && t.median_ms <= t.max_ms);
    assert!(time_case(&mut InterpExecutor::new(), &case, 0, 0).is_err());
}
