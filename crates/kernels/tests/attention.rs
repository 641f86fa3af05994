//! Decode attention end to end through the interpreter: the split kernel's partials,
//! merged by the merge kernel, against exact attention over the whole context in f64 —
//! with the bound both kernels' errors add up to, and the unscaled merge as a control;
//! and the kernel that merges its own splits against that pair, bit for bit.

use quench_kernels::approx::gamma;
use quench_kernels::attention::decode::{self, DecodeParams};
use quench_kernels::attention::merge::{self, MergeParams};
use quench_kernels::attention::{KvElem, PagedCache};
use quench_kernels::norm_residual::OutType;
use quench_kernels::{compare, compare_controls, data, run_case, KernelCase};
use quench_rt::InterpExecutor;

fn seed() -> u64 {
    let s = std::env::var("QUENCH_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("seed {s} (set QUENCH_SEED={s} to replay)");
    s
}

fn run(case: &KernelCase) -> quench_kernels::CaseOutputs {
    run_case(&mut InterpExecutor::new(), case).unwrap_or_else(|e| panic!("{e}"))
}

fn attend(p: DecodeParams, out_type: OutType, ctx_len: Vec<u32>) {
    let seed = seed();
    let mut rng = data::rng(seed);
    let cache = PagedCache::random(&mut rng, p.kv, p.head_dim, p.n_heads, p.n_kv_heads, p.max_blocks, ctx_len);
    let scale = 1.0 / (p.head_dim as f64).sqrt();
    let split_case = decode::case_for(&p, &cache, scale).expect("decode case");
    let out = run(&split_case);
    for r in compare(&split_case, &out).expect("comparable") {
        assert!(r.passed, "partials: {r}");
    }
    let f32s = |i: usize| data::f32_from_bytes(out.get(i).expect("partials read back"));
    let (m, l, o) = (f32s(5), f32s(6), f32s(7));

    let (exact, b) = cache.attend(scale);
    let mp = MergeParams { head_dim: p.head_dim, n_splits: p.n_splits(), out: out_type };
    let want: Vec<f64> = exact.iter().map(|&v| merge::round_out(&mp, v)).collect();
    // The split kernel's weights are within ρ of exact (relative to a common maximum, which
    // cancels in the quotient) and its sums add γ over at most split + 10 terms.
    let rho = decode::weight_error(&p, &cache, scale).rho;
    let extra = (1.0 + rho) * (1.0 + gamma(p.split as u64 + 10)) - 1.0;
    let merge_case = merge::case_from(&mp, m, l, o, want, &b, extra).expect("merge case");
    let out = run(&merge_case);
    for r in compare(&merge_case, &out).expect("comparable") {
        eprintln!("attention {:?}: {r}", cache.ctx_len);
        assert!(r.passed, "attention output: {r}");
    }
    for (what, r) in compare_controls(&merge_case, &out).expect("comparable") {
        eprintln!("  control `{what}`: {}", r.mismatches);
        assert!(r.mismatches * 2 > r.elements, "`{what}` failed on only {} elements", r.mismatches);
    }
}

#[test]
fn decode_then_merge_is_attention() {
    // Three sequences: full, ending inside a split, one token; GQA 8/2 of 64 over 4
    // splits of 64.
    let p = DecodeParams {
        head_dim: 64,
        n_heads: 8,
        n_kv_heads: 2,
        max_blocks: 16,
        split: 64,
        threads: 64,
        kv: KvElem::BF16,
        merge: false,
        q_stride: 0,
    };
    attend(p, OutType::BF16, vec![256, 150, 1]);
    // The engine's pair: an f16 cache, an f32 output.
    attend(DecodeParams { kv: KvElem::F16, ..p }, OutType::F32, vec![256, 150, 1]);
}

#[test]
fn heads_of_128_without_grouping() {
    let p = DecodeParams {
        head_dim: 128,
        n_heads: 2,
        n_kv_heads: 2,
        max_blocks: 16,
        split: 128,
        threads: 128,
        kv: KvElem::F16,
        merge: false,
        q_stride: 0,
    };
    attend(p, OutType::F32, vec![256, 200]);
}

/// The merging kernel's output and partials have the bits of the split kernel's partials
/// and the f32 merge kernel's output on the same cache.
fn merged_in_place_as_apart(p: DecodeParams, ctx_len: Vec<u32>) {
    let mut rng = data::rng(seed());
    let cache = PagedCache::random(&mut rng, p.kv, p.head_dim, p.n_heads, p.n_kv_heads, p.max_blocks, ctx_len);
    let scale = 1.0 / (p.head_dim as f64).sqrt();
    let apart = run(&decode::case_for(&p, &cache, scale).expect("decode case"));
    let f32s = |out: &quench_kernels::CaseOutputs, i: usize| data::f32_from_bytes(out.get(i).expect("read back"));
    let (m, l, o) = (f32s(&apart, 5), f32s(&apart, 6), f32s(&apart, 7));
    let mp = MergeParams { head_dim: p.head_dim, n_splits: p.n_splits(), out: OutType::F32 };
    let rows = m.len() / p.n_splits() as usize;
    let merge_case =
        merge::case_from(&mp, m, l, o, vec![0.0; rows * p.head_dim as usize], &vec![0.0; rows * p.head_dim as usize], 0.0)
            .expect("merge case");
    let merged_apart = run(&merge_case);
    let fused_case = decode::case_for(&DecodeParams { merge: true, ..p }, &cache, scale).expect("merging case");
    let fused = run(&fused_case);
    for r in compare(&fused_case, &fused).expect("comparable") {
        assert!(r.passed, "merged in place: {r}");
    }
    for (i, what) in [(5, "maxima"), (6, "sums"), (7, "partial outputs")] {
        assert_eq!(apart.get(i), fused.get(i), "{what}");
    }
    assert_eq!(merged_apart.get(3), fused.get(9), "merged outputs");
}

#[test]
fn the_last_split_merges_as_the_merge_kernel_does() {
    let p = DecodeParams {
        head_dim: 64,
        n_heads: 8,
        n_kv_heads: 2,
        max_blocks: 16,
        split: 64,
        threads: 64,
        kv: KvElem::F16,
        merge: false,
        q_stride: 0,
    };
    merged_in_place_as_apart(p, vec![256, 150, 1]);
    merged_in_place_as_apart(DecodeParams { head_dim: 128, n_heads: 6, n_kv_heads: 1, split: 128, threads: 128, ..p }, vec![200]);
    // Queries read in place from a fused projection's [sequence, q|k|v] rows.
    merged_in_place_as_apart(DecodeParams { q_stride: (8 + 2 * 2) * 64, ..p }, vec![256, 70, 1]);
}
