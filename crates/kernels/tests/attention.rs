//! Decode attention end to end through the interpreter: the split kernel's partials,
//! merged by the merge kernel, against exact attention over the whole context in f64 —
//! with the bound both kernels' errors add up to, and wrong answers (unscaled scores, an
//! unscaled merge) as controls; and the kernel that merges its own splits against that
//! pair, bit for bit. The shapes cover each lane layout: 16-, 8- and 4-byte loads, heads
//! whose row leaves lanes idle, several warps per split and splits shorter than a step.

use quench_kernels::approx::gamma;
use quench_kernels::attention::decode::{self, DecodeParams, Lanes};
use quench_kernels::attention::merge::{self, MergeParams};
use quench_kernels::attention::{KvElem, PagedCache};
use quench_kernels::norm_residual::OutType;
use quench_kernels::{compare, compare_controls, data, run_case, KernelCase};
use quench_rt::InterpExecutor;

mod common;

use common::seed;

fn run(case: &KernelCase) -> quench_kernels::CaseOutputs {
    run_case(&mut InterpExecutor::new(), case).unwrap_or_else(|e| panic!("{e}"))
}

fn controls_fail(case: &KernelCase, out: &quench_kernels::CaseOutputs) {
    for (what, r) in compare_controls(case, out).expect("comparable") {
        eprintln!("  control `{what}`: {} of {}", r.mismatches, r.elements);
        // Empty splits hold zeros either way: a third of the elements must be wrong.
        assert!(
            r.mismatches * 3 > r.elements,
            "`{what}` failed on only {} elements",
            r.mismatches
        );
    }
}

/// Grouped-query attention with 8 query heads per kv head over 4 splits of 64, in
/// blocks of 64 threads.
const BASE: DecodeParams = DecodeParams {
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

fn attend(p: DecodeParams, out_type: OutType, ctx_len: Vec<u32>) {
    let seed = seed();
    let mut rng = data::rng(seed);
    let cache = PagedCache::random(
        &mut rng,
        p.kv,
        p.head_dim,
        p.n_heads,
        p.n_kv_heads,
        p.max_blocks,
        ctx_len,
    );
    let scale = 1.0 / (p.head_dim as f64).sqrt();
    let split_case = decode::case_for(&p, &cache, scale).expect("decode case");
    let out = run(&split_case);
    for r in compare(&split_case, &out).expect("comparable") {
        assert!(r.passed, "partials of {:?}: {r}", p.lanes());
    }
    controls_fail(&split_case, &out);
    let f32s = |i: usize| data::f32_from_bytes(out.get(i).expect("partials read back"));
    let (m, l, o) = (f32s(5), f32s(6), f32s(7));

    let (exact, b) = cache.attend(scale);
    let mp = MergeParams {
        head_dim: p.head_dim,
        n_splits: p.n_splits(),
        out: out_type,
    };
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
    controls_fail(&merge_case, &out);
}

#[test]
fn decode_then_merge_is_attention() {
    // Three sequences: full, ending inside a split, one token.
    assert_eq!(
        BASE.lanes(),
        Some(Lanes {
            vec: 8,
            per_pos: 8,
            chunks: 1
        })
    );
    attend(BASE, OutType::BF16, vec![256, 150, 1]);
    // The engine's pair: an f16 cache, an f32 output.
    attend(
        DecodeParams {
            kv: KvElem::F16,
            ..BASE
        },
        OutType::F32,
        vec![256, 150, 1],
    );
}

#[test]
fn an_f32_cache_takes_loads_of_four_two_and_one() {
    // The f32 cache's loads of 16, 8 and 4 bytes: 4 elements a lane at a group of 8
    // heads of 64, 2 at 32 heads of 64, 1 at 64 heads of 32.
    let p = DecodeParams {
        kv: KvElem::F32,
        ..BASE
    };
    assert_eq!(
        p.lanes(),
        Some(Lanes {
            vec: 4,
            per_pos: 16,
            chunks: 1
        })
    );
    attend(p, OutType::F32, vec![256, 150, 1]);
    let p = DecodeParams {
        n_heads: 32,
        n_kv_heads: 1,
        split: 32,
        max_blocks: 4,
        ..p
    };
    assert_eq!(
        p.lanes(),
        Some(Lanes {
            vec: 2,
            per_pos: 32,
            chunks: 1
        })
    );
    attend(p, OutType::F32, vec![64, 20]);
    let p = DecodeParams {
        head_dim: 32,
        n_heads: 64,
        ..p
    };
    assert_eq!(
        p.lanes(),
        Some(Lanes {
            vec: 1,
            per_pos: 32,
            chunks: 1
        })
    );
    merged_in_place(DecodeParams { merge: true, ..p }, vec![64, 20]);
}

#[test]
fn seven_heads_a_kv_head_over_short_splits() {
    // qwen2.5-0.5b's grouping: 16-byte loads, 8 lanes a position, 4 warps covering a
    // split of 16 in one step; a context ending inside a cache block.
    let p = DecodeParams {
        n_heads: 14,
        split: 16,
        threads: 128,
        max_blocks: 4,
        kv: KvElem::F16,
        ..BASE
    };
    assert_eq!(
        p.lanes(),
        Some(Lanes {
            vec: 8,
            per_pos: 8,
            chunks: 1
        })
    );
    attend(p, OutType::F32, vec![64, 37]);
}

#[test]
fn heads_of_128_and_of_80() {
    // Without grouping, splits of 32 over two warps (two steps each).
    let p = DecodeParams {
        head_dim: 128,
        n_heads: 2,
        n_kv_heads: 2,
        max_blocks: 8,
        split: 32,
        threads: 64,
        kv: KvElem::F16,
        ..BASE
    };
    assert_eq!(
        p.lanes(),
        Some(Lanes {
            vec: 8,
            per_pos: 16,
            chunks: 1
        })
    );
    attend(p, OutType::F32, vec![128, 100]);
    // Ten 16-byte pieces a row: six of each position's 16 lanes load nothing of their own.
    // (The merge kernel takes rows of a multiple of 32: this one merges in place.)
    let p = DecodeParams {
        head_dim: 80,
        n_heads: 4,
        n_kv_heads: 2,
        split: 48,
        max_blocks: 6,
        threads: 96,
        ..p
    };
    assert_eq!(
        p.lanes(),
        Some(Lanes {
            vec: 8,
            per_pos: 16,
            chunks: 1
        })
    );
    merged_in_place(DecodeParams { merge: true, ..p }, vec![96, 50]);
}

#[test]
fn many_heads_a_kv_head_take_narrower_loads() {
    // 32 query heads of one kv head: 4-byte loads keep a lane's values at 64.
    let p = DecodeParams {
        n_heads: 32,
        n_kv_heads: 1,
        split: 32,
        max_blocks: 4,
        threads: 64,
        ..BASE
    };
    assert_eq!(
        p.lanes(),
        Some(Lanes {
            vec: 2,
            per_pos: 32,
            chunks: 1
        })
    );
    attend(p, OutType::F32, vec![64, 20]);
}

/// The merging kernel's partials and output against exact attention.
fn merged_in_place(p: DecodeParams, ctx_len: Vec<u32>) {
    let mut rng = data::rng(seed());
    let cache = PagedCache::random(
        &mut rng,
        p.kv,
        p.head_dim,
        p.n_heads,
        p.n_kv_heads,
        p.max_blocks,
        ctx_len,
    );
    let case =
        decode::case_for(&p, &cache, 1.0 / (p.head_dim as f64).sqrt()).expect("merging case");
    let out = run(&case);
    for r in compare(&case, &out).expect("comparable") {
        eprintln!("merged in place {:?}: {r}", cache.ctx_len);
        assert!(r.passed, "merged in place: {r}");
    }
    controls_fail(&case, &out);
}

/// The merging kernel's output and partials have the bits of the split kernel's partials
/// and the f32 merge kernel's output on the same cache.
fn merged_in_place_as_apart(p: DecodeParams, ctx_len: Vec<u32>) {
    let mut rng = data::rng(seed());
    let cache = PagedCache::random(
        &mut rng,
        p.kv,
        p.head_dim,
        p.n_heads,
        p.n_kv_heads,
        p.max_blocks,
        ctx_len,
    );
    let scale = 1.0 / (p.head_dim as f64).sqrt();
    let apart = run(&decode::case_for(&p, &cache, scale).expect("decode case"));
    let f32s = |out: &quench_kernels::CaseOutputs, i: usize| {
        data::f32_from_bytes(out.get(i).expect("read back"))
    };
    let (m, l, o) = (f32s(&apart, 5), f32s(&apart, 6), f32s(&apart, 7));
    let mp = MergeParams {
        head_dim: p.head_dim,
        n_splits: p.n_splits(),
        out: OutType::F32,
    };
    let rows = m.len() / p.n_splits() as usize;
    let merge_case = merge::case_from(
        &mp,
        m,
        l,
        o,
        vec![0.0; rows * p.head_dim as usize],
        &vec![0.0; rows * p.head_dim as usize],
        0.0,
    )
    .expect("merge case");
    let merged_apart = run(&merge_case);
    let fused_case =
        decode::case_for(&DecodeParams { merge: true, ..p }, &cache, scale).expect("merging case");
    let fused = run(&fused_case);
    for r in compare(&fused_case, &fused).expect("comparable") {
        assert!(r.passed, "merged in place: {r}");
    }
    controls_fail(&fused_case, &fused);
    for (i, what) in [(5, "maxima"), (6, "sums"), (7, "partial outputs")] {
        assert_eq!(apart.get(i), fused.get(i), "{what}");
    }
    assert_eq!(merged_apart.get(3), fused.get(9), "merged outputs");
}

#[test]
fn the_last_split_merges_as_the_merge_kernel_does() {
    let p = DecodeParams {
        kv: KvElem::F16,
        ..BASE
    };
    merged_in_place_as_apart(p, vec![256, 150, 1]);
    // More elements than threads (each thread merges several), 17 splits (a loop of
    // eight and a tail).
    merged_in_place_as_apart(
        DecodeParams {
            head_dim: 128,
            n_heads: 6,
            n_kv_heads: 1,
            split: 16,
            max_blocks: 17,
            threads: 128,
            ..p
        },
        vec![272],
    );
    // Queries read in place from a fused projection's [sequence, q|k|v] rows.
    merged_in_place_as_apart(
        DecodeParams {
            q_stride: (8 + 2 * 2) * 64,
            ..p
        },
        vec![256, 70, 1],
    );
    // 40 splits: the merging block's lanes find the maxima in two rounds of 32.
    merged_in_place_as_apart(
        DecodeParams {
            n_heads: 4,
            split: 16,
            max_blocks: 40,
            threads: 128,
            ..p
        },
        vec![640, 300],
    );
}

/// Batch invariance: a sequence's partials and output have the same bits alone and
/// among others.
#[test]
fn a_sequence_alone_and_among_others() {
    let p = DecodeParams {
        n_heads: 14,
        split: 16,
        threads: 128,
        max_blocks: 4,
        kv: KvElem::F16,
        merge: true,
        ..BASE
    };
    let mut rng = data::rng(seed());
    let all = PagedCache::random(
        &mut rng,
        p.kv,
        p.head_dim,
        p.n_heads,
        p.n_kv_heads,
        p.max_blocks,
        vec![40, 64, 9],
    );
    let scale = 1.0 / (p.head_dim as f64).sqrt();
    let together = run(&decode::case_for(&p, &all, scale).expect("case"));
    let (q_row, table_row) = ((p.n_heads * p.head_dim) as usize, p.max_blocks as usize);
    for s in 0..all.n_seqs() {
        let alone = PagedCache {
            q: all.q[s * q_row..(s + 1) * q_row].to_vec(),
            block_table: all.block_table[s * table_row..(s + 1) * table_row].to_vec(),
            ctx_len: vec![all.ctx_len[s]],
            ..all.clone()
        };
        let out = run(&decode::case_for(&p, &alone, scale).expect("case"));
        for buffer in [5, 6, 7, 9] {
            let (a, b) = (
                together.get(buffer).expect("read"),
                out.get(buffer).expect("read"),
            );
            let n = b.len();
            assert_eq!(&a[s * n..(s + 1) * n], b, "sequence {s}, buffer {buffer}");
        }
    }
}
