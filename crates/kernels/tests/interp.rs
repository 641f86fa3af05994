//! Every library kernel on small shapes through the interpreter executor, against its
//! reference: bit-exact where the kernel is exact, within the bound otherwise — and then
//! the deliberately wrong references must fail that bound.
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_kernels::{compare, run_case};
use quench_rt::InterpExecutor;

mod common;

use common::{case, check};

#[test]
fn add_f32() {
    // 250 vector groups and 3 trailing elements.
    check(&case("add_f32", "n=1003 threads=64"));
}

#[test]
fn add_bf16() {
    // 128 vector groups and 5 trailing elements.
    check(&case("add_bf16", "n=1029 threads=64"));
}

#[test]
fn silu_mul_f16() {
    // 97 vector groups and 3 trailing elements.
    check(&case("silu_mul_f16", "n=779 threads=64"));
}

#[test]
fn reduce_sum_f32() {
    // 81 groups over 64 threads: one full walk step and a guarded one.
    check(&case("reduce_sum_f32", "rows=3 cols=324 threads=64"));
    // One warp: no shared-memory stage.
    check(&case("reduce_sum_f32", "rows=2 cols=100 threads=32"));
}

#[test]
fn reduce_max_f32() {
    check(&case("reduce_max_f32", "rows=3 cols=324 threads=64"));
}

#[test]
fn rmsnorm_bf16() {
    check(&case("rmsnorm_bf16", "rows=3 cols=584 threads=64"));
}

#[test]
fn softmax_f32() {
    check(&case("softmax_f32", "rows=3 cols=376 threads=64"));
}

#[test]
fn gemv_bf16() {
    // 61 rows (not a multiple of 8 warps); 169 chunks: one unrolled step of 128, then
    // a full step of 32 and a partial one of 9.
    check(&case("gemv_bf16", "rows=61 cols=1352 warps=8 unroll=4"));
}

#[test]
fn gemm_bf16() {
    // 200 rows: a partial second row tile; 3 k-steps through 3 stages (copies past the
    // last step clamped); 2 column tiles.
    check(&case("gemm_bf16", "m=200 n=256 k=96"));
    // 8 warps of 64×32, 2 stages, 1 row tile of 64 holding 37 rows.
    check(&case(
        "gemm_bf16",
        "m=37 n=128 k=160 bm=64 bn=128 wn=32 stages=2",
    ));
    // 4 stages of 64×64, one warp.
    check(&case("gemm_bf16", "m=70 n=64 k=192 bm=64 bn=64 stages=4"));
}

#[test]
fn gemm_bf16_residual() {
    check(&case("gemm_bf16_residual", "m=131 n=128 k=64"));
}

#[test]
fn gemm_bf16_to_bf16() {
    // As gemm_bf16: a partial second row tile, 2 column tiles; and 64×32 warps, 2 stages.
    check(&case("gemm_bf16_to_bf16", "m=200 n=256 k=96"));
    check(&case(
        "gemm_bf16_to_bf16",
        "m=37 n=128 k=160 bm=64 bn=128 wn=32 stages=2",
    ));
}

#[test]
fn gemm_quantized_to_bf16() {
    for name in [
        "gemm_q8_0_to_bf16",
        "gemm_q4_0_to_bf16",
        "gemm_q4_1_to_bf16",
    ] {
        check(&case(name, "m=65 n=128 k=128"));
    }
    for name in [
        "gemm_q4_k_to_bf16",
        "gemm_q5_k_to_bf16",
        "gemm_q6_k_to_bf16",
        "gemm_q3_k_to_bf16",
        "gemm_q2_k_to_bf16",
    ] {
        check(&case(name, "m=65 n=128 k=512"));
    }
}

#[test]
fn gemm_quantized() {
    // At the library's tiles: two row tiles (the second partial), two column tiles or
    // more; Q4_K, Q5_K and Q6_K over two super-blocks.
    for (name, k) in [
        ("gemm_q8_0", 128),
        ("gemm_q4_0", 128),
        ("gemm_q4_1", 192),
        ("gemm_q4_k", 512),
        ("gemm_q5_k", 512),
        ("gemm_q6_k", 512),
        ("gemm_q3_k", 512),
        ("gemm_q2_k", 512),
    ] {
        check(&case(name, &format!("m=150 n=256 k={k}")));
    }
    // 64×32 warp tiles with half-row dequantization items, 3 stages.
    check(&case("gemm_q4_0", "m=100 n=128 k=192 bn=64 wn=32 stages=3"));
    // Whole-row items (64 threads for 64 rows), 4 stages, and 2.
    check(&case(
        "gemm_q8_0",
        "m=40 n=64 k=256 bm=64 bn=64 wn=32 stages=4",
    ));
    check(&case("gemm_q6_k", "m=40 n=64 k=512 bm=64 stages=2"));
    // Q5_K: one super-block (every sub-block of its scales, mins and fifth bits) with
    // whole-row items, 4 stages; three with half-row items.
    check(&case("gemm_q5_k", "m=40 n=64 k=256 bm=64 stages=4"));
    check(&case("gemm_q5_k", "m=70 n=128 k=768"));
    // Q3_K: two super-blocks with whole-row items (every sub-block's scales, crumbs and
    // hmask bit), and four with half-row items.
    check(&case("gemm_q3_k", "m=40 n=64 k=512 bm=64 stages=4"));
    check(&case("gemm_q3_k", "m=70 n=128 k=1024"));
    // Q2_K: one super-block with whole-row items, three with half-row items.
    check(&case(
        "gemm_q2_k",
        "m=40 n=64 k=256 bm=64 bn=64 wn=32 stages=4",
    ));
    check(&case("gemm_q2_k", "m=70 n=128 k=768 bn=64 wn=32 stages=3"));
}

#[test]
fn gemm_quantized_residual() {
    for name in [
        "gemm_q8_0_residual",
        "gemm_q4_0_residual",
        "gemm_q4_1_residual",
    ] {
        check(&case(name, "m=65 n=128 k=128"));
    }
    for name in [
        "gemm_q4_k_residual",
        "gemm_q5_k_residual",
        "gemm_q6_k_residual",
        "gemm_q3_k_residual",
        "gemm_q2_k_residual",
    ] {
        check(&case(name, "m=65 n=128 k=512"));
    }
}

#[test]
fn gemm_float_weights_xf16() {
    // bf16 weights converted to f16 per fragment, and f16 weights, as gemm_bf16: a
    // partial second row tile, 2 column tiles; and 64×32 warps, 2 stages.
    for stem in ["gemm_bf16_xf16", "gemm_f16_xf16"] {
        check(&case(stem, "m=200 n=256 k=96"));
        check(&case(stem, "m=37 n=128 k=160 bm=64 bn=128 wn=32 stages=2"));
        check(&case(&format!("{stem}_residual"), "m=131 n=128 k=64"));
        check(&case(&format!("{stem}_to_f16"), "m=200 n=256 k=96"));
    }
}

#[test]
fn gemm_quantized_xf16() {
    // As gemm_quantized: two row tiles (the second partial), two column tiles; Q4_K and
    // Q5_K and Q6_K over two super-blocks; and half-row dequantization items.
    for (stem, k) in [
        ("gemm_q8_0_xf16", 128),
        ("gemm_q4_0_xf16", 128),
        ("gemm_q4_1_xf16", 192),
        ("gemm_q4_k_xf16", 512),
        ("gemm_q5_k_xf16", 512),
        ("gemm_q6_k_xf16", 512),
        ("gemm_q3_k_xf16", 512),
        ("gemm_q2_k_xf16", 512),
    ] {
        check(&case(stem, &format!("m=150 n=256 k={k}")));
        for end in ["_residual", "_to_f16"] {
            check(&case(&format!("{stem}{end}"), &format!("m=65 n=128 k={k}")));
        }
    }
    check(&case(
        "gemm_q4_0_xf16",
        "m=100 n=128 k=192 bn=64 wn=32 stages=3",
    ));
}

#[test]
fn embed_float_tables() {
    // 40 groups over 32 threads: one full walk step and a guarded one.
    for name in ["embed_f32", "embed_bf16", "embed_f16"] {
        check(&case(name, "tokens=5 vocab=37 dim=320 threads=32"));
    }
}

#[test]
fn embed_quantized_tables() {
    // 18 blocks per row (SmolLM2's 576) over 32 threads: a partial step only.
    check(&case("embed_q8_0", "tokens=4 vocab=29 dim=576 threads=32"));
    // 9 blocks over 32 threads and 40 over 32 (a full step and a guarded one).
    check(&case("embed_q4_1", "tokens=3 vocab=11 dim=288 threads=32"));
    check(&case("embed_q4_1", "tokens=2 vocab=5 dim=1280 threads=32"));
    // Q4_K: 64-element pieces, four a super-block; 8 pieces over 32 threads (a partial
    // step), 64 over 32 (two full steps: every piece and scale position of a block).
    check(&case("embed_q4_k", "tokens=3 vocab=11 dim=512 threads=32"));
    check(&case("embed_q4_k", "tokens=2 vocab=7 dim=4096 threads=32"));
    // Q6_K: 32-element pieces in two runs of 16, eight a super-block; 16 over 32 threads,
    // 128 over 32 (four full steps: every piece of a block).
    check(&case("embed_q6_k", "tokens=3 vocab=11 dim=512 threads=32"));
    check(&case("embed_q6_k", "tokens=2 vocab=7 dim=4096 threads=32"));
    // Q5_K: 64-element pieces as Q4_K's, with the fifth bits; 8 over 32 threads (a partial
    // step), 64 over 32 (two full steps: every piece and bit plane of a block). Three
    // tokens or more, so that the out-of-range id's NaN row, which the controls share,
    // is at most a third of the output.
    check(&case("embed_q5_k", "tokens=3 vocab=11 dim=512 threads=32"));
    check(&case("embed_q5_k", "tokens=4 vocab=7 dim=4096 threads=32"));
}

#[test]
fn k_quant_tables_refuse_rows_that_are_not_whole_super_blocks() {
    for name in ["embed_q4_k", "embed_q5_k", "embed_q6_k"] {
        let spec = quench_kernels::find(name).expect("in the library");
        let p = spec.parse_params("dim=320 threads=32").expect("parses");
        let err = spec.build(&p).expect_err("320 is not a multiple of 256");
        assert!(err.to_string().contains("256"), "{name}: {err}");
    }
}

#[test]
fn norm_residual() {
    // 146 groups over 64 threads: two full walk steps and a guarded one.
    for name in [
        "rmsnorm_residual_bf16",
        "rmsnorm_residual_f16",
        "rmsnorm_residual_f32",
        "layernorm_residual_bf16",
        "layernorm_residual_f32",
    ] {
        check(&case(name, "rows=3 cols=584 threads=64"));
    }
    // One warp (no shared-memory stage), SmolLM2's width.
    check(&case("rmsnorm_residual_bf16", "rows=2 cols=576 threads=32"));
    check(&case("rmsnorm_residual_f16", "rows=2 cols=576 threads=32"));
}

#[test]
fn rope() {
    // GQA: 4 query heads and 2 key heads of 64; 192 pairs over 64 threads.
    for name in ["rope_neox_f32", "rope_gptj_f32"] {
        check(&case(
            name,
            "tokens=3 n_pos=40 head_dim=64 n_heads=4 n_kv_heads=2 threads=64",
        ));
    }
    // 5 + 1 heads of 128: 384 pairs over 256 threads (a full walk step and a guarded one).
    check(&case(
        "rope_neox_f32",
        "tokens=2 n_pos=9 head_dim=128 n_heads=5 n_kv_heads=1 threads=256",
    ));
}

/// Every epilogue of a matrix–vector kernel on one shape: 6 rows (quantized: two per
/// warp, the last block half full), 5 rows (one per warp), and the SwiGLU form on 9 rows,
/// so that its wrong-answer control is judged on enough outputs.
fn check_gemv_family(base: &str, params: &str) {
    check(&case(base, &format!("rows=6 {params}")));
    check(&case(
        &format!("{base}_residual"),
        &format!("rows=5 {params}"),
    ));
    check(&case(
        &format!("{base}_residual"),
        &format!("rows=6 {params}"),
    ));
    check(&case(
        &format!("{base}_swiglu"),
        &format!("rows=9 {params}"),
    ));
}

#[test]
fn gemv_f16_and_fused_bf16() {
    // 72 pieces of 8 (SmolLM2's 576): one unrolled step of 64, then 8 lanes.
    check_gemv_family("gemv_f16", "cols=576 warps=2 unroll=2");
    check(&case(
        "gemv_bf16_residual",
        "rows=5 cols=576 warps=2 unroll=2",
    ));
    check(&case(
        "gemv_bf16_swiglu",
        "rows=9 cols=576 warps=4 unroll=1",
    ));
}

#[test]
fn qgemv_legacy_blocks() {
    // 40 pieces of 64: one step of 32, then 8 lanes; 5 rows over blocks of 2 warps.
    for base in ["qgemv_q8_0", "qgemv_q4_0", "qgemv_q4_1"] {
        check_gemv_family(base, "cols=2560 warps=2 unroll=1");
    }
    // SmolLM2's 576 (9 pieces) and an unrolled step. Rows enough that a wrong control
    // fails on most of them: with two, one row of swapped Q8_0 scales can land inside the
    // bound by chance and leave the control failing on only half.
    check(&case("qgemv_q4_1", "rows=3 cols=576 warps=1 unroll=2"));
    check(&case("qgemv_q8_0", "rows=6 cols=4608 warps=2 unroll=2"));
}

#[test]
fn qgemv_k_quants() {
    // 9 super-blocks = 72 pieces of 32: one unrolled step of 64, then 8 lanes.
    for base in [
        "qgemv_q4_k",
        "qgemv_q5_k",
        "qgemv_q6_k",
        "qgemv_q3_k",
        "qgemv_q2_k",
    ] {
        check_gemv_family(base, "cols=2304 warps=2 unroll=2");
    }
    // 3 super-blocks: a partial step only.
    check(&case("qgemv_q4_k", "rows=2 cols=768 warps=2 unroll=4"));
    check(&case("qgemv_q5_k", "rows=2 cols=768 warps=2 unroll=4"));
    check(&case("qgemv_q6_k", "rows=2 cols=768 warps=2 unroll=4"));
    check(&case("qgemv_q3_k", "rows=2 cols=768 warps=2 unroll=4"));
    check(&case("qgemv_q2_k", "rows=2 cols=768 warps=2 unroll=4"));
    // Q5_K: 40 super-blocks = 160 pieces of 64, one unrolled step of 128 and a full
    // step of 32.
    check(&case("qgemv_q5_k", "rows=4 cols=10240 warps=1 unroll=4"));
}

#[test]
fn gemv_f32_activations() {
    // Every format with f32 activations (and, for SwiGLU, f32 output): the x loads take
    // 4 elements a word instead of 8.
    check_gemv_family_xf32("gemv_bf16", "cols=576 warps=2 unroll=2");
    check_gemv_family_xf32("gemv_f16", "cols=576 warps=2 unroll=2");
    for base in ["qgemv_q8_0", "qgemv_q4_0", "qgemv_q4_1"] {
        check_gemv_family_xf32(base, "cols=2560 warps=2 unroll=1");
    }
    for base in ["qgemv_q4_k", "qgemv_q5_k", "qgemv_q6_k"] {
        check_gemv_family_xf32(base, "cols=2304 warps=2 unroll=2");
    }
    check(&case("qgemv_q4_1_xf32", "rows=3 cols=576 warps=1 unroll=2"));
}

#[test]
fn gemv_rmsnorm_prologue() {
    // Every format and epilogue with x = RMSNorm(R)·w formed in the kernel: blocks of 64
    // threads reduce R (576 columns: two full walk steps and a guarded one; 2560 and 2304:
    // ten and nine full steps).
    check_gemv_family_rmsnorm("gemv_bf16", "cols=576 warps=2 unroll=2");
    check_gemv_family_rmsnorm("gemv_f16", "cols=576 warps=2 unroll=2");
    for base in ["qgemv_q8_0", "qgemv_q4_0", "qgemv_q4_1"] {
        check_gemv_family_rmsnorm(base, "cols=2560 warps=2 unroll=1");
    }
    for base in ["qgemv_q4_k", "qgemv_q5_k", "qgemv_q6_k"] {
        check_gemv_family_rmsnorm(base, "cols=2304 warps=2 unroll=2");
    }
    // One warp (no shared reduction stage), SmolLM2's width; and a row of fewer groups
    // than threads (a guarded step only).
    check(&case(
        "qgemv_q4_1_rmsnorm_xf32",
        "rows=3 cols=576 warps=1 unroll=2",
    ));
    check(&case(
        "gemv_f16_rmsnorm_residual_xf32",
        "rows=9 cols=128 warps=4 unroll=1",
    ));
}

/// [`check_gemv_family`] of the kernels with the RMSNorm prologue.
fn check_gemv_family_rmsnorm(base: &str, params: &str) {
    check(&case(
        &format!("{base}_rmsnorm_xf32"),
        &format!("rows=6 {params}"),
    ));
    check(&case(
        &format!("{base}_rmsnorm_residual_xf32"),
        &format!("rows=5 {params}"),
    ));
    check(&case(
        &format!("{base}_rmsnorm_swiglu_xf32"),
        &format!("rows=9 {params}"),
    ));
}

/// [`check_gemv_family`] of the f32-activation kernels.
fn check_gemv_family_xf32(base: &str, params: &str) {
    check(&case(&format!("{base}_xf32"), &format!("rows=6 {params}")));
    check(&case(
        &format!("{base}_residual_xf32"),
        &format!("rows=5 {params}"),
    ));
    check(&case(
        &format!("{base}_residual_xf32"),
        &format!("rows=6 {params}"),
    ));
    check(&case(
        &format!("{base}_swiglu_xf32"),
        &format!("rows=9 {params}"),
    ));
}

#[test]
fn attention_decode() {
    // 4 splits of 64 tokens; GQA 4/2 of 64; the second sequence leaves its last split empty.
    check(&case(
        "attention_decode_bf16",
        "head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=16 split=64 threads=64",
    ));
    // 6 query heads on one kv head of 128 (6 accumulators per thread), 2 splits of 128.
    check(&case(
        "attention_decode_bf16",
        "head_dim=128 n_heads=6 n_kv_heads=1 max_blocks=16 split=128 threads=128",
    ));
    // The f16 cache on both shapes.
    check(&case(
        "attention_decode_f16",
        "head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=16 split=64 threads=64",
    ));
    check(&case(
        "attention_decode_f16",
        "head_dim=128 n_heads=6 n_kv_heads=1 max_blocks=16 split=128 threads=128",
    ));
}

#[test]
fn attention_decode_merged_by_the_last_split() {
    // As above, the last split of each (sequence, kv head) merging: 4 splits, GQA 4/2; 2
    // splits, 6 heads on one kv head; and one split (the merge of a single partial).
    for name in ["attention_decode_merge_bf16", "attention_decode_merge_f16"] {
        check(&case(
            name,
            "head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=16 split=64 threads=64",
        ));
        check(&case(
            name,
            "head_dim=128 n_heads=6 n_kv_heads=1 max_blocks=16 split=128 threads=128",
        ));
    }
    check(&case(
        "attention_decode_merge_f16",
        "head_dim=32 n_heads=4 n_kv_heads=2 max_blocks=4 split=64 threads=32",
    ));
    // 32 splits, more than the merge takes a round: a short context's merge stops after
    // the rounds that hold its splits.
    check(&case(
        "attention_decode_merge_bf16",
        "head_dim=32 n_heads=4 n_kv_heads=2 max_blocks=64 split=32 threads=32",
    ));
    check(&case(
        "attention_decode_merge_f32",
        "head_dim=128 n_heads=6 n_kv_heads=1 max_blocks=16 split=128 threads=128",
    ));
}

#[test]
fn attention_prefill() {
    // 70 queries after a prefix of 37: two query tiles (the second with 6 rows), key tiles
    // up to position 106 (the last partly past the cache); GQA 4/2 of 64.
    check(&case(
        "attention_prefill_bf16",
        "head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=8 q_start=37 n_q=70",
    ));
    // A whole prompt of 64, heads of 128.
    check(&case(
        "attention_prefill_bf16",
        "head_dim=128 n_heads=2 n_kv_heads=1 max_blocks=4 q_start=0 n_q=64",
    ));
    // Three query tiles (started last first), the middle one walking 3 key tiles with the
    // next tile's keys in flight, the last ending 22 rows into its tile; the first tile's
    // last warp starts at position 62, so its first key tile crosses its rows by one key;
    // the last key tile reaches past the block table (rows clamped into the cache).
    check(&case(
        "attention_prefill_bf16",
        "head_dim=128 n_heads=2 n_kv_heads=1 max_blocks=11 q_start=14 n_q=150",
    ));
}

#[test]
fn attention_prefill_f16() {
    // As above over an f16 cache: 70 queries after 37 cached, GQA 4/2 of 64, each
    // token's queries 320 elements apart (as in a q|k|v row), NaN between them.
    check(&case(
        "attention_prefill_f16",
        "head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=8 q_start=37 n_q=70 q_stride=320",
    ));
    // Heads of 128, GQA 3/1, 41 queries after a prefix of 80 (two key tiles before the
    // chunk's first row).
    check(&case(
        "attention_prefill_f16",
        "head_dim=128 n_heads=3 n_kv_heads=1 max_blocks=8 q_start=80 n_q=41",
    ));
}

#[test]
fn attention_prefill_f32() {
    // An f32 cache, its tiles rounded to f16 as they load: the shapes above, the queries
    // in place in q|k|v rows; the first tile partly past the cache.
    check(&case(
        "attention_prefill_f32",
        "head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=8 q_start=37 n_q=70 q_stride=320",
    ));
    check(&case(
        "attention_prefill_f32",
        "head_dim=128 n_heads=3 n_kv_heads=1 max_blocks=8 q_start=80 n_q=41",
    ));
}

#[test]
fn kv_append() {
    // 2 kv heads of 64: 32 groups over 32 threads; the last token is past the cache.
    check(&case(
        "kv_append_bf16",
        "tokens=7 n_seqs=3 head_dim=64 n_kv_heads=2 max_blocks=2 threads=32",
    ));
    // 8 heads of 128: 256 groups over 96 threads (two full walk steps and a guarded one).
    check(&case(
        "kv_append_bf16",
        "tokens=3 n_seqs=2 head_dim=128 n_kv_heads=8 max_blocks=3 threads=96",
    ));
    check(&case(
        "kv_append_f16",
        "tokens=7 n_seqs=3 head_dim=64 n_kv_heads=2 max_blocks=2 threads=32",
    ));
    check(&case(
        "kv_append_f16",
        "tokens=3 n_seqs=2 head_dim=128 n_kv_heads=8 max_blocks=3 threads=96",
    ));
    check(&case(
        "kv_append_f32",
        "tokens=7 n_seqs=3 head_dim=64 n_kv_heads=2 max_blocks=2 threads=32",
    ));
}

#[test]
fn rope_append() {
    // GQA 4/2 heads of 64 over 2 warps (3 rounds of heads, 32 pairs a head: one per lane);
    // 7 tokens into 3 sequences of 32 positions, the tables longer than the cache.
    for name in [
        "rope_append_neox_f16",
        "rope_append_gptj_f16",
        "rope_append_neox_qknorm_f16",
        "rope_append_gptj_qknorm_f16",
    ] {
        check(&case(
            name,
            "tokens=7 n_seqs=3 n_pos=40 head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=2 threads=64",
        ));
    }
    // 5 + 1 heads of 128 on 8 warps (two idle; two pairs a lane); the tables shorter than
    // the cache, so the last token's position is in the cache but not the tables.
    for name in [
        "rope_append_neox_bf16",
        "rope_append_gptj_bf16",
        "rope_append_neox_qknorm_bf16",
        "rope_append_gptj_qknorm_bf16",
    ] {
        check(&case(name, "tokens=3 n_seqs=2 n_pos=9 head_dim=128 n_heads=5 n_kv_heads=1 max_blocks=3 threads=256"));
    }
    // An f32 cache: keys and values stored as computed.
    for name in ["rope_append_neox_f32", "rope_append_gptj_qknorm_f32"] {
        check(&case(
            name,
            "tokens=7 n_seqs=3 n_pos=40 head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=2 threads=64",
        ));
    }
    // Heads of 32 (16 pairs: half the lanes idle) on one warp.
    check(&case(
        "rope_append_neox_qknorm_f16",
        "tokens=2 n_seqs=1 n_pos=48 head_dim=32 n_heads=4 n_kv_heads=2 max_blocks=3 threads=32",
    ));
    // Tokens' q, k and v read (and q written) in place in a fused projection's rows of
    // (4 + 2 + 2) heads of 64.
    check(&case(
        "rope_append_gptj_qknorm_f16",
        "tokens=5 n_seqs=3 n_pos=40 head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=2 threads=64 token_stride=512",
    ));
}

#[test]
fn attention_merge() {
    check(&case(
        "attention_merge_bf16",
        "rows=6 head_dim=64 n_splits=5",
    ));
    check(&case(
        "attention_merge_bf16",
        "rows=3 head_dim=128 n_splits=2",
    ));
    check(&case(
        "attention_merge_f32",
        "rows=6 head_dim=64 n_splits=5",
    ));
    check(&case(
        "attention_merge_f32",
        "rows=3 head_dim=128 n_splits=2",
    ));
}

#[test]
fn sample() {
    // Rows of 4096 logits: top-k 40 with top-p, top-k off, top-p off, and a greedy row.
    check(&case("sample_f32", "rows=24 cols=4096 threads=256"));
    // 49152 (SmolLM2's vocabulary) over 1024 threads: shares of 48.
    check(&case("sample_f32", "rows=3 cols=49152 threads=1024"));
}

#[test]
fn argmax() {
    // 2500 groups over 256 threads (a guarded last step); the last row is all −∞.
    check(&case("argmax_f32", "rows=3 cols=10000 threads=256"));
    // One warp, SmolLM2's vocabulary.
    check(&case("argmax_f32", "rows=2 cols=49152 threads=32"));
}

#[test]
fn mask_logits() {
    // 2500 groups over 256 threads (a guarded last step); rows 2 and 0 masked, 1 not.
    check(&case("mask_logits_f32", "rows=3 cols=10000 threads=256"));
    // One warp, SmolLM2's vocabulary; rows 3, 2 and 0 masked.
    check(&case("mask_logits_f32", "rows=4 cols=49152 threads=32"));
}

/// The harness itself must be able to fail: a launch that leaves outputs unwritten
/// leaves poison, which the check catches.
#[test]
fn unwritten_output_fails() {
    let mut c = case("reduce_sum_f32", "rows=4 cols=64 threads=32");
    c.launch.grid[0] = 3;
    let out = run_case(&mut InterpExecutor::new(), &c).unwrap_or_else(|e| panic!("{e}"));
    let r = compare(&c, &out).expect("comparable").remove(0);
    assert!(!r.passed && r.mismatches == 1, "{r}");
    assert_eq!(r.first_mismatches[0].index, 3);
    assert!(r.first_mismatches[0].got.is_nan());
}

/// An output updated in place starts from its input contents, not poison: a row the
/// launch skips keeps the old residual, which the check must catch.
#[test]
fn unwritten_in_place_output_fails() {
    let mut c = case("rmsnorm_residual_f32", "rows=3 cols=64 threads=32");
    c.launch.grid[0] = 2;
    let out = run_case(&mut InterpExecutor::new(), &c).unwrap_or_else(|e| panic!("{e}"));
    let reports = compare(&c, &out).expect("comparable");
    let residual = &reports[0];
    assert_eq!(residual.buffer, "residual");
    assert!(!residual.passed && residual.mismatches == 64, "{residual}");
    assert_eq!(residual.first_mismatches[0].index, 128);
    assert!(!residual.first_mismatches[0].got.is_nan());
}
