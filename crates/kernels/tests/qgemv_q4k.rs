//! The Q4_K matrix–vector kernels on 16-bit integer activations (`dp4a`): on the
//! interpreter, every output bit for bit against the integer reference and within the
//! bound of the exact f64 product (whose wrong variants — nibbles swapped, byte planes
//! swapped — must fail it), over rows whose last step is full or ragged, grids with a
//! block per group or capped, idle warps in a last group, several passes, and passes too
//! wide for shared memory (staged in column chunks); a vector's bits alone and in such a
//! batch; then the decode step's kernels at the llama-3.1-8b shape assemble with `ptxas`
//! without spills (registers printed).
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::{self, q4k, Epilogue, Prologue, QGemvParams, WeightFormat};

mod common;

use common::seed;

fn params(prologue: Prologue, epilogue: Epilogue, rows: u32, cols: u32) -> QGemvParams {
    QGemvParams {
        format: WeightFormat::Q4K,
        prologue,
        epilogue,
        rows,
        cols,
        warps: 2,
        unroll: 2,
        act: OutType::F32,
        batch: 1,
        max_blocks: 0,
    }
}

#[test]
fn products_match_the_reference_and_the_exact_bound() {
    let s = seed();
    // (rows, cols, unroll, max_blocks, act, n): 2048 columns fill every lane's last step;
    // 768 and 2304 leave lanes without a piece in it; 13 rows leave a warp idle in the
    // last group; a cap of 3 blocks makes blocks run 2 or 3 groups.
    let shapes = [
        (14, 2048, 2, 0, OutType::F32, 1),
        (14, 1024, 2, 3, OutType::F32, 2),
        (13, 768, 3, 3, OutType::F32, 1),
        (6, 2304, 1, 2, OutType::BF16, 2),
        (9, 512, 4, 0, OutType::BF16, 1),
    ];
    for (i, &(rows, cols, unroll, max_blocks, act, n)) in shapes.iter().enumerate() {
        for epilogue in Epilogue::ALL {
            for prologue in [Prologue::None, Prologue::RmsNorm] {
                if prologue == Prologue::RmsNorm && act != OutType::F32 {
                    continue;
                }
                let p = QGemvParams { unroll, max_blocks, act, ..params(prologue, epilogue, rows, cols) };
                let case = qgemv::case(&p, n, s ^ (i as u64) << 8 ^ epilogue as u64).expect("case");
                common::check(&case);
            }
        }
    }
}

/// Passes whose vectors do not fit in shared memory at once stage their columns in
/// chunks (here 2048, 2048 and a last one of 256, whose step leaves lanes idle), for
/// every row group; each vector still has the bits it has alone.
#[test]
fn chunked_passes_match_and_keep_each_vectors_bits() {
    let s = seed();
    for (i, epilogue) in Epilogue::ALL.into_iter().enumerate() {
        let p = QGemvParams { unroll: 1, batch: 8, max_blocks: 2, ..params(Prologue::None, epilogue, 6, 4352) };
        assert_eq!(q4k::chunk_cols(&p), 2048);
        let n = 9;
        let case = qgemv::case(&p, n, s ^ i as u64).expect("case");
        let batched = common::check(&case);
        common::assert_batch_invariant(&case, &p, n, &batched);
    }
}

/// The bit-for-bit check also tells the wrong variants from the kernel: their outputs
/// differ from the kernel's in most rows.
#[test]
fn the_wrong_variants_fail_the_exact_check() {
    let p = QGemvParams { max_blocks: 3, ..params(Prologue::None, Epilogue::Plain, 14, 1024) };
    let case = qgemv::case(&p, 1, seed()).expect("case");
    let out = common::check(&case);
    let w = &case.buffers[0].data;
    let f32s = |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect() };
    let x = f32s(&case.buffers.iter().find(|b| b.name == "x").expect("x").data);
    let got = f32s(&out.outputs[0].1);
    // A kernel that took each quant byte's high nibble as its low one computes the
    // products of the weights with every quant byte's nibbles swapped.
    let mut swapped = w.clone();
    for block in swapped.chunks_exact_mut(144) {
        for q in &mut block[16..] {
            *q = q.rotate_left(4);
        }
    }
    let nibbles = qgemv::dots(&p, &swapped, &x).expect("reference");
    assert_eq!(nibbles, q4k::dots(&p, w, &x, q4k::Variant::NibblesSwapped));
    for (what, wrong) in [("nibbles", nibbles), ("planes", q4k::dots(&p, w, &x, q4k::Variant::PlanesSwapped))] {
        let differs = got.iter().zip(&wrong).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
        assert!(differs * 2 > wrong.len(), "the variant with {what} swapped matches on {} of {} rows", wrong.len() - differs, wrong.len());
    }
}

/// Every Q4_K kernel the parameters allow builds within the static shared memory: the
/// prologue's vectors always whole, others in chunks where they do not fit.
#[test]
fn every_shape_fits_in_shared_memory() {
    for cols in [256, 4096, 11264, 14336, 28672] {
        for (warps, unroll) in [(1, 1), (4, 2), (32, 2)] {
            for prologue in [Prologue::None, Prologue::RmsNorm] {
                for batch in [1, 3, 8] {
                    if prologue == Prologue::RmsNorm && batch * cols > qgemv::prologue::MAX_COLS {
                        continue;
                    }
                    for epilogue in Epilogue::ALL {
                        let p = QGemvParams { warps, unroll, batch, ..params(prologue, epilogue, 64, cols) };
                        let f = qgemv::build(&p).unwrap_or_else(|e| panic!("{cols} cols, batch {batch}: {e}"));
                        assert!(f.shared_bytes() <= quench_ir::func::MAX_STATIC_SHARED_BYTES);
                        if prologue == Prologue::RmsNorm {
                            assert_eq!(q4k::chunk_cols(&p), cols, "the prologue's vectors are staged whole");
                        }
                    }
                }
            }
        }
    }
    // A matrix of more than 2 GiB addresses its rows with 64-bit offsets.
    let p = params(Prologue::None, Epilogue::Residual, 1 << 20, 4096);
    qgemv::build(&p).expect("a 2.25 GiB matrix builds");
}

/// The decode step's Q4_K products at the llama-3.1-8b shape (hidden 4096, ffn 14336,
/// 8 of 32 heads for keys and values, vocabulary 128256), as the engine builds them: one
/// vector a pass (unroll 2) and eight (unroll 1).
#[test]
fn decode_kernels_assemble_without_spills() {
    if common::no_ptxas() {
        return;
    }
    let products = [
        ("q|k|v", Prologue::RmsNorm, Epilogue::Plain, 6144, 4096),
        ("o", Prologue::None, Epilogue::Residual, 4096, 4096),
        ("gate/up", Prologue::RmsNorm, Epilogue::SwiGlu, 14336, 4096),
        ("down", Prologue::None, Epilogue::Residual, 4096, 14336),
        ("LM head", Prologue::RmsNorm, Epilogue::Plain, 128256, 4096),
    ];
    let mut failures = vec![];
    for (what, prologue, epilogue, rows, cols) in products {
        let one = QGemvParams { warps: 4, max_blocks: 8 * 132, ..params(prologue, epilogue, rows, cols) };
        let many = QGemvParams { prologue: Prologue::None, unroll: 1, batch: 8, ..one };
        for p in [one, many] {
            let f = qgemv::build(&p).expect("builds");
            failures.extend(common::spill_failure(&f, &format!("{what:<8} {rows:>6}x{cols:<5} batch {}", p.batch)));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
