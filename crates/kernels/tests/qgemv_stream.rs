//! The streamed Q4_K matrix–vector kernels (one vector a pass): on the interpreter,
//! every output bit for bit against the reference over rows whose last item is full or
//! ragged, grids with a block per group or capped (groups of several items crossing into
//! the next group), idle warps in a last group, several passes and every prefetch depth;
//! then the decode step's kernels at the llama-3.1-8b shape assemble with `ptxas`
//! without spills, in at most 64 registers (8 blocks of 4 warps an SM, the grid the
//! engine launches).
//!
//! Inputs are fresh for each run: the seed comes from `QUENCH_SEED` if set, else at
//! random, and is printed so that a failure can be replayed.

use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::{self, Epilogue, Prologue, QGemvParams, WeightFormat};

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
fn streamed_products_match_the_reference() {
    let s = seed();
    // (rows, cols, unroll, max_blocks, act, n): 1024 columns fill every lane's last item;
    // 768 and 2304 leave lanes without a piece in it; 13 or 14 rows leave a warp idle
    // in the last group; a cap of 3 blocks makes blocks run 2 or 3 groups.
    let shapes = [
        (14, 1024, 2, 0, OutType::F32, 1),
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

/// The decode step's Q4_K products at the llama-3.1-8b shape (hidden 4096, ffn 14336,
/// 8 of 32 heads for keys and values, vocabulary 128256), as the engine builds them.
#[test]
fn decode_kernels_fit_eight_blocks_an_sm() {
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
        let p = QGemvParams { warps: 4, max_blocks: 8 * 132, ..params(prologue, epilogue, rows, cols) };
        let f = qgemv::build(&p).expect("builds");
        let ptx = quench_ptx::emit(&f).expect("emits");
        match quench_ptx::ptxas::assemble(&ptx, "sm_90") {
            Ok(r) => {
                eprintln!("{what:<8} {rows:>6}x{cols:<5} {:<36} registers {:>3}", f.name, r.registers);
                if r.spill_store_bytes > 0 || r.spill_load_bytes > 0 || r.registers > 64 {
                    failures.push(format!("{what}: {} registers, spills {}/{} B", r.registers, r.spill_store_bytes, r.spill_load_bytes));
                }
            }
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The bit-for-bit check tells a kernel that took a piece's nibbles in the other order
/// (the high nibble of each quant byte as its low one) from the right one: that kernel's
/// output is the reference of the weights with every quant byte's nibbles swapped, and
/// it differs from the streamed kernel's in most rows.
#[test]
fn a_kernel_with_the_nibbles_swapped_fails_the_check() {
    let p = QGemvParams { max_blocks: 3, ..params(Prologue::None, Epilogue::Plain, 14, 1024) };
    let case = qgemv::case(&p, 1, seed()).expect("case");
    let out = common::check(&case);
    let w = &case.buffers[0].data;
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    };
    let x = f32s(&case.buffers.iter().find(|b| b.name == "x").expect("x").data);
    // Q4_K super-blocks: 16 header bytes, then 128 quant bytes.
    let mut swapped = w.clone();
    for block in swapped.chunks_exact_mut(144) {
        for q in &mut block[16..] {
            *q = q.rotate_left(4);
        }
    }
    let wrong = qgemv::dots(&p, &swapped, &x).expect("reference");
    let got = f32s(&out.outputs[0].1);
    let differs = got.iter().zip(&wrong).filter(|(g, w)| g.to_bits() != w.to_bits()).count();
    assert!(differs * 2 > wrong.len(), "the swapped-nibble variant matches on {} of {} rows", wrong.len() - differs, wrong.len());
}

/// Every Q4_K kernel the parameters allow at one vector a pass builds: the ring goes
/// beside the prologue's staged row where shared memory has room for both, and the
/// stepped loop takes the rest (the largest rows, many warps, deep prefetch).
#[test]
fn every_shape_builds_with_or_without_the_ring() {
    for cols in [256, 4096, 9216, 11264] {
        for (warps, unroll) in [(1, 1), (4, 2), (4, 16), (32, 2)] {
            for prologue in [Prologue::None, Prologue::RmsNorm] {
                for epilogue in Epilogue::ALL {
                    let p = QGemvParams { warps, unroll, ..params(prologue, epilogue, 64, cols) };
                    let f = qgemv::build(&p).unwrap_or_else(|e| panic!("{cols} cols, {warps} warps, unroll {unroll}: {e}"));
                    assert!(f.shared_bytes() <= quench_ir::func::MAX_STATIC_SHARED_BYTES);
                }
            }
        }
    }
    // A matrix of more than 2 GiB addresses its rows with 64-bit offsets.
    let p = params(Prologue::None, Epilogue::Residual, 1 << 20, 4096);
    qgemv::build(&p).expect("a 2.25 GiB matrix builds");
}
