//! The Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 and Q4_1 matrix–vector kernels on 16-bit integer
//! activations (`dp4a`): on the interpreter, every output bit for bit against the integer
//! reference and within the bound of the exact f64 product (whose wrong variants — the
//! 4-bit formats' nibbles swapped, Q8_0, Q4_0 and Q4_1 block scales and Q6_K 16-weight
//! scales swapped, Q5_K fifth bits
//! and Q6_K high fields taken from the other nibble's, byte planes swapped — must fail
//! it), over rows whose last
//! step is full or ragged, Q6_K rows of an odd number of super-blocks (every other row
//! starting 2 bytes past a word boundary), grids with a block per group or capped, idle warps in a last group,
//! several passes, and passes too wide for shared memory (staged in column chunks); a
//! vector's bits alone and in such a batch; then the decode step's kernels at the
//! llama-3.1-8b shape assemble with `ptxas` without spills (registers printed).
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::{self, integer, Epilogue, Prologue, QGemvParams, WeightFormat};

mod common;

use common::seed;

const FORMATS: [WeightFormat; 6] = [
    WeightFormat::Q4K,
    WeightFormat::Q8_0,
    WeightFormat::Q6K,
    WeightFormat::Q5K,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
];

fn params(
    format: WeightFormat,
    prologue: Prologue,
    epilogue: Epilogue,
    rows: u32,
    cols: u32,
) -> QGemvParams {
    QGemvParams {
        format,
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
    for (f, format) in FORMATS.into_iter().enumerate() {
        for (i, &(rows, cols, unroll, max_blocks, act, n)) in shapes.iter().enumerate() {
            for epilogue in Epilogue::ALL {
                for prologue in [Prologue::None, Prologue::RmsNorm] {
                    if prologue == Prologue::RmsNorm && act != OutType::F32 {
                        continue;
                    }
                    let p = QGemvParams {
                        unroll,
                        max_blocks,
                        act,
                        ..params(format, prologue, epilogue, rows, cols)
                    };
                    let case = qgemv::case(
                        &p,
                        n,
                        s ^ (f as u64) << 16 ^ (i as u64) << 8 ^ epilogue as u64,
                    )
                    .expect("case");
                    common::check(&case);
                }
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
    for (f, format) in FORMATS.into_iter().enumerate() {
        for (i, epilogue) in Epilogue::ALL.into_iter().enumerate() {
            let p = QGemvParams {
                unroll: 1,
                batch: 8,
                max_blocks: 2,
                ..params(format, Prologue::None, epilogue, 6, 4352)
            };
            assert_eq!(integer::chunk_cols(&p), 2048);
            let n = 9;
            let case = qgemv::case(&p, n, s ^ (f as u64) << 8 ^ i as u64).expect("case");
            let batched = common::check(&case);
            common::assert_batch_invariant(&case, &p, n, &batched);
        }
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The kernel's outputs and the inputs of a one-vector case of `p`.
fn run(p: &QGemvParams) -> (Vec<f32>, Vec<u8>, Vec<f32>) {
    let case = qgemv::case(p, 1, seed()).expect("case");
    let out = common::check(&case);
    let x = f32s(&case.buffers.iter().find(|b| b.name == "x").expect("x").data);
    (f32s(&out.outputs[0].1), case.buffers[0].data.clone(), x)
}

/// Whether `wrong` differs from the kernel's `got` in most rows.
fn assert_mostly_differs(what: &str, got: &[f32], wrong: &[f32]) {
    let differs = got
        .iter()
        .zip(wrong)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    assert!(
        differs * 2 > wrong.len(),
        "the variant with {what} matches on {} of {} rows",
        wrong.len() - differs,
        wrong.len()
    );
}

/// The bit-for-bit check also tells the wrong variants from the kernel: their outputs
/// differ from the kernel's in most rows. Each variant is the reference of weights
/// changed the way the mistake reads them.
#[test]
fn the_wrong_variants_fail_the_exact_check() {
    let p = QGemvParams {
        max_blocks: 3,
        ..params(WeightFormat::Q4K, Prologue::None, Epilogue::Plain, 14, 1024)
    };
    let (got, w, x) = run(&p);
    // A kernel that took each quant byte's high nibble as its low one computes the
    // products of the weights with every quant byte's nibbles swapped.
    let mut swapped = w.clone();
    for block in swapped.chunks_exact_mut(144) {
        for q in &mut block[16..] {
            *q = q.rotate_left(4);
        }
    }
    let nibbles = qgemv::dots(&p, &swapped, &x).expect("reference");
    assert_eq!(
        nibbles,
        integer::dots(&p, &w, &x, integer::Variant::NibblesSwapped)
    );
    assert_mostly_differs("nibbles swapped", &got, &nibbles);

    let p = QGemvParams {
        format: WeightFormat::Q8_0,
        ..p
    };
    let (got8, w8, x8) = run(&p);
    // One that took each piece's two block scales the other way round: the products of
    // the weights with the scales of every pair of blocks exchanged.
    let mut swapped = w8.clone();
    for piece in swapped.chunks_exact_mut(68) {
        let (a, b) = piece.split_at_mut(34);
        a[..2].swap_with_slice(&mut b[..2]);
    }
    let scales = qgemv::dots(&p, &swapped, &x8).expect("reference");
    assert_eq!(
        scales,
        integer::dots(&p, &w8, &x8, integer::Variant::ScalesSwapped)
    );
    assert_mostly_differs("block scales swapped", &got8, &scales);

    // Q6_K over rows of an odd number of super-blocks (768 columns): each ql byte's
    // nibbles swapped; each 16-weight scale pair swapped; the high fields of each qh byte
    // taken from the other nibble's (bits 0–3 and 4–7 exchanged).
    let p6 = QGemvParams {
        format: WeightFormat::Q6K,
        ..params(WeightFormat::Q6K, Prologue::None, Epilogue::Plain, 14, 768)
    };
    let (got6, w6, x6) = run(&p6);
    type Mistake = (&'static str, integer::Variant, fn(&mut [u8]));
    let mistakes: [Mistake; 3] = [
        (
            "ql nibbles swapped",
            integer::Variant::NibblesSwapped,
            |b| b[..128].iter_mut().for_each(|q| *q = q.rotate_left(4)),
        ),
        (
            "16-weight scales swapped",
            integer::Variant::ScalesSwapped,
            |b| b[192..208].chunks_exact_mut(2).for_each(|s| s.swap(0, 1)),
        ),
        (
            "high fields swapped",
            integer::Variant::FieldsSwapped,
            |b| b[128..192].iter_mut().for_each(|q| *q = q.rotate_left(4)),
        ),
    ];
    for (what, variant, change) in mistakes {
        let mut changed = w6.clone();
        changed.chunks_exact_mut(210).for_each(change);
        let want = qgemv::dots(&p6, &changed, &x6).expect("reference");
        assert_eq!(want, integer::dots(&p6, &w6, &x6, variant), "{what}");
        assert_mostly_differs(what, &got6, &want);
    }

    // Q5_K: each qs byte's nibbles swapped; each weight's fifth bit taken from the other
    // nibble's (the bits of each pair 2g, 2g + 1 of every qh byte exchanged).
    let p5 = QGemvParams {
        format: WeightFormat::Q5K,
        ..p6
    };
    let (got5, w5, x5) = run(&p5);
    let mistakes: [Mistake; 2] = [
        (
            "qs nibbles swapped",
            integer::Variant::NibblesSwapped,
            |b| b[48..].iter_mut().for_each(|q| *q = q.rotate_left(4)),
        ),
        ("fifth bits swapped", integer::Variant::FieldsSwapped, |b| {
            b[16..48]
                .iter_mut()
                .for_each(|q| *q = (*q & 0x55) << 1 | (*q & 0xaa) >> 1)
        }),
    ];
    for (what, variant, change) in mistakes {
        let mut changed = w5.clone();
        changed.chunks_exact_mut(176).for_each(change);
        let want = qgemv::dots(&p5, &changed, &x5).expect("reference");
        assert_eq!(want, integer::dots(&p5, &w5, &x5, variant), "{what}");
        assert_mostly_differs(what, &got5, &want);
    }

    // Q4_0 and Q4_1 (blocks of 18 and 20 bytes, two a piece): each quant byte's nibbles
    // swapped; each piece's two blocks' scales (and offsets) swapped.
    for (format, block) in [(WeightFormat::Q4_0, 18), (WeightFormat::Q4_1, 20)] {
        let p = QGemvParams { format, ..p6 };
        let (got, w, x) = run(&p);
        let mut nibbles = w.clone();
        for b in nibbles.chunks_exact_mut(block) {
            b[block - 16..]
                .iter_mut()
                .for_each(|q| *q = q.rotate_left(4));
        }
        let mut scales = w.clone();
        for piece in scales.chunks_exact_mut(2 * block) {
            let (a, b) = piece.split_at_mut(block);
            a[..block - 16].swap_with_slice(&mut b[..block - 16]);
        }
        for (what, variant, changed) in [
            ("nibbles swapped", integer::Variant::NibblesSwapped, nibbles),
            (
                "block scales swapped",
                integer::Variant::ScalesSwapped,
                scales,
            ),
        ] {
            let want = qgemv::dots(&p, &changed, &x).expect("reference");
            assert_eq!(
                want,
                integer::dots(&p, &w, &x, variant),
                "{format:?} {what}"
            );
            assert_mostly_differs(what, &got, &want);
        }
        assert_mostly_differs(
            "planes swapped",
            &got,
            &integer::dots(&p, &w, &x, integer::Variant::PlanesSwapped),
        );
    }

    for (p, got, w, x) in [
        (
            QGemvParams {
                format: WeightFormat::Q4K,
                ..p
            },
            &got,
            &w,
            &x,
        ),
        (p, &got8, &w8, &x8),
        (p6, &got6, &w6, &x6),
        (p5, &got5, &w5, &x5),
    ] {
        assert_mostly_differs(
            "planes swapped",
            got,
            &integer::dots(&p, w, x, integer::Variant::PlanesSwapped),
        );
    }
}

/// Every integer-path kernel the parameters allow builds within the static shared
/// memory: the prologue's vectors always whole, others in chunks where they do not fit.
#[test]
fn every_shape_fits_in_shared_memory() {
    for format in FORMATS {
        for cols in [256, 4096, 11264, 14336, 28672] {
            for (warps, unroll) in [(1, 1), (4, 2), (32, 2)] {
                for prologue in [Prologue::None, Prologue::RmsNorm] {
                    for batch in [1, 3, 8] {
                        if prologue == Prologue::RmsNorm && batch * cols > qgemv::prologue::MAX_COLS
                        {
                            continue;
                        }
                        for epilogue in Epilogue::ALL {
                            let p = QGemvParams {
                                warps,
                                unroll,
                                batch,
                                ..params(format, prologue, epilogue, 64, cols)
                            };
                            let f = qgemv::build(&p).unwrap_or_else(|e| {
                                panic!("{format:?} {cols} cols, batch {batch}: {e}")
                            });
                            assert!(f.shared_bytes() <= quench_ir::func::MAX_STATIC_SHARED_BYTES);
                            if prologue == Prologue::RmsNorm {
                                assert_eq!(
                                    integer::chunk_cols(&p),
                                    cols,
                                    "the prologue's vectors are staged whole"
                                );
                            }
                        }
                    }
                }
            }
        }
        // A matrix of more than 2 GiB addresses its rows with 64-bit offsets.
        let p = params(format, Prologue::None, Epilogue::Residual, 1 << 20, 4096);
        qgemv::build(&p).expect("a matrix of over 2 GiB builds");
    }
}

/// The decode step's integer-path products at the llama-3.1-8b shape (hidden 4096, ffn 14336,
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
    for format in FORMATS {
        for (what, prologue, epilogue, rows, cols) in products {
            let one = QGemvParams {
                warps: 8,
                max_blocks: 132,
                unroll: if format == WeightFormat::Q6K { 1 } else { 2 },
                ..params(format, prologue, epilogue, rows, cols)
            };
            let many = QGemvParams {
                prologue: Prologue::None,
                unroll: 1,
                batch: 8,
                ..one
            };
            for p in [one, many] {
                let f = qgemv::build(&p).expect("builds");
                let name = format!("{format:?} {what:<8} {rows:>6}x{cols:<5} batch {}", p.batch);
                failures.extend(common::spill_failure(&f, &name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
