//! The encoder kernels (BERT: bias rows, GELU and the bf16 conversion, bidirectional
//! attention over a padded batch) through the interpreter against their references, with
//! fresh seeded inputs (`QUENCH_SEED` replays a run) and poisoned outputs; bounded checks
//! must also fail their deliberately wrong references.

mod common;

use common::{case, check};

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
fn cast_f32_f16() {
    check(&case("cast_f32_f16", "n=1003 threads=64"));
}

#[test]
fn gelu_f32_f16() {
    check(&case("gelu_f32_f16", "n=1030 threads=64"));
}

#[test]
fn bias_rows_f32() {
    // 100 columns over 64 threads: a full stride and a partial one.
    check(&case("bias_rows_f32", "rows=5 cols=100 threads=64"));
}

#[test]
fn encoder_attention_head_dim_32() {
    // 3 texts of 11, some and 1 tokens; 11 queries over 4-warp blocks leaves a partial block.
    check(&case(
        "encoder_attention_bf16",
        "head_dim=32 n_heads=2 warps=4 batch=3 seq_len=11",
    ));
}

#[test]
fn encoder_attention_head_dim_64() {
    check(&case(
        "encoder_attention_bf16",
        "head_dim=64 n_heads=2 warps=2 batch=3 seq_len=9",
    ));
}
