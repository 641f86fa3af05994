//! Unit tests: the weights the kernels multiply bit for bit (identity `A`), the rounded
//! outputs, and refusals. The products themselves, with their bound and wrong-answer
//! controls, are checked through the library in `tests/interp.rs`.

use quench_rt::InterpExecutor;

use super::*;
use crate::case::{compare, run_case};

use crate::data::test_seed as seed;

fn params(format: BFormat, n: u32, k: u32, bm: u32, bn: u32, wn: u32, stages: u32) -> GemmParams {
    GemmParams {
        operands: Operands::Bf16,
        format,
        epilogue: Epilogue::Store,
        n,
        k,
        bm,
        bn,
        wn,
        stages,
        core: Core::MmaSync,
    }
}

/// Every (operand type, weight format) pair the kernels take: f16 weights want f16
/// operands.
fn variants() -> impl Iterator<Item = (Operands, BFormat)> {
    Operands::ALL.into_iter().flat_map(|o| {
        BFormat::ALL
            .into_iter()
            .filter(move |&f| !(f == BFormat::F16 && o == Operands::Bf16))
            .map(move |f| (o, f))
    })
}

/// With `A` the identity, `C` is the weights the kernel multiplies: each must be
/// `bf16(dequant(w))` or `f16(dequant(w))` exactly, and bf16 weights under f16 operands
/// `f16(w)` (magnitudes from 2^-30 up: exact, rounded to subnormals and to zero). Run
/// with whole-row dequantization items (64 threads for 64 rows) and half-row items (128
/// threads), over more than one super-block where there are some; stored in the operand
/// type too.
#[test]
fn weight_tiles_are_exact() {
    let seed = seed();
    for (operands, f) in variants() {
        let k = f.k_multiple().max(128);
        let store = GemmParams {
            operands,
            ..params(f, 64, k, 64, 64, 32, 3)
        };
        let to_half = GemmParams {
            epilogue: Epilogue::StoreHalf,
            ..store
        };
        let half_rows = GemmParams {
            operands,
            ..params(f, 128, k, 128, 64, 32, 2)
        };
        for p in [store, half_rows, to_half] {
            let case = exactness_case(&p, seed).unwrap_or_else(|e| panic!("{e}"));
            let out = run_case(&mut InterpExecutor::new(), &case).unwrap_or_else(|e| panic!("{e}"));
            for r in compare(&case, &out).expect("comparable") {
                assert!(r.passed, "{} ({} threads): {r}", case.name, p.threads());
            }
        }
    }
}

/// The exactness case's bf16 weights do exercise the f16 conversion's rounding: some of
/// them are not f16 values (they round to f16 subnormals or to zero).
#[test]
fn spread_bf16_weights_include_values_f16_rounds() {
    let p = GemmParams {
        operands: Operands::F16,
        ..params(BFormat::Bf16, 64, 128, 64, 64, 32, 3)
    };
    let case = exactness_case(&p, seed()).unwrap_or_else(|e| panic!("{e}"));
    let stored = crate::data::bf16_from_bytes(&case.buffers[1].data);
    let rounded = stored
        .iter()
        .filter(|w| Operands::F16.round(w.to_f32()) != w.to_f32())
        .count();
    let zeros = stored
        .iter()
        .filter(|w| Operands::F16.round(w.to_f32()) == 0.0)
        .count();
    assert!(
        rounded > 100 && zeros > 100,
        "{rounded} rounded, {zeros} to zero"
    );
}

/// `C` stored in the operand type holds exactly the f32 `C` of the same operands rounded
/// to nearest even (what `cast_f32_bf16`, or the host's f16 rounding, writes), bit for
/// bit, for every operand type and weight format, with a partial row tile. (Every
/// element written: the poison left in place would be a NaN.)
#[test]
fn half_output_is_the_f32_output_rounded() {
    let seed = seed();
    let m = 70;
    for (operands, f) in variants() {
        let f32_out = GemmParams {
            operands,
            ..params(f, 128, f.k_multiple().max(64), 64, 64, 32, 2)
        };
        let half_out = GemmParams {
            epilogue: Epilogue::StoreHalf,
            ..f32_out
        };
        let run = |p: &GemmParams| {
            let case = case(p, m, seed).unwrap_or_else(|e| panic!("{e}"));
            let out = run_case(&mut InterpExecutor::new(), &case).unwrap_or_else(|e| panic!("{e}"));
            out.get(2).expect("C is an output").to_vec()
        };
        let want: Vec<u8> = crate::data::f32_from_bytes(&run(&f32_out))
            .iter()
            .flat_map(|&x| match operands {
                Operands::Bf16 => crate::lanes::round_bf16(x).to_le_bytes(),
                Operands::F16 => half::f16::from_f32(x).to_le_bytes(),
            })
            .collect();
        let got = run(&half_out);
        let name = half_out.name();
        assert_eq!(got.len(), want.len(), "{name}");
        let values = crate::data::decode(half_out.c_elem(), &got).expect("a float type");
        let unwritten = values.iter().filter(|v| !v.is_finite()).count();
        assert_eq!(unwritten, 0, "{name}: {unwritten} elements not finite");
        let differ = got
            .chunks_exact(2)
            .zip(want.chunks_exact(2))
            .filter(|(g, w)| g != w)
            .count();
        assert_eq!(
            differ, 0,
            "{name}: {differ} elements differ from the rounded f32 output"
        );
    }
}

#[test]
fn unsupported_shapes_are_refused_by_name() {
    let refuse = |p: GemmParams, needle: &str| {
        let e = build(&p).unwrap_err().to_string();
        assert!(e.contains(p.name()) && e.contains(needle), "{e}");
    };
    refuse(params(BFormat::Bf16, 100, 64, 128, 128, 64, 3), "n = 100");
    refuse(params(BFormat::Bf16, 128, 48, 128, 128, 64, 3), "k = 48");
    refuse(
        params(BFormat::Q4_0, 128, 96, 128, 64, 32, 3),
        "multiple of 64",
    );
    refuse(
        params(BFormat::Q6K, 128, 256, 128, 64, 32, 3),
        "multiple of 512",
    );
    refuse(params(BFormat::Bf16, 128, 64, 96, 128, 64, 3), "64 or 128");
    refuse(params(BFormat::Bf16, 128, 64, 128, 128, 16, 3), "wn = 16");
    refuse(
        params(BFormat::Bf16, 128, 64, 128, 128, 64, 4),
        "shared memory",
    );
    refuse(
        params(BFormat::Bf16, 128, 64, 128, 128, 64, 5),
        "stages = 5",
    );
    let p = params(BFormat::Bf16, 128, 64, 128, 128, 64, 3);
    let e = case(&p, 0, 1).unwrap_err().to_string();
    assert!(e.contains("m = 0"), "{e}");

    // f16 weights with bf16 operands, in every epilogue; the same weights with f16
    // operands build.
    for epilogue in Epilogue::ALL {
        let f16_weights = GemmParams {
            epilogue,
            ..params(BFormat::F16, 128, 64, 128, 128, 64, 3)
        };
        refuse(f16_weights, "f16 weights need f16 operands");
        let f16_operands = GemmParams {
            operands: Operands::F16,
            ..f16_weights
        };
        build(&f16_operands).unwrap_or_else(|e| panic!("{e}"));
    }
    // f16 operands refuse what bf16 ones do.
    let f16 = |p: GemmParams| GemmParams {
        operands: Operands::F16,
        ..p
    };
    refuse(
        f16(params(BFormat::F16, 128, 48, 128, 128, 64, 3)),
        "k = 48",
    );
    refuse(
        f16(params(BFormat::Q6K, 128, 256, 128, 64, 32, 3)),
        "multiple of 512",
    );
    refuse(
        f16(params(BFormat::Bf16, 128, 64, 128, 128, 64, 4)),
        "shared memory",
    );
}

/// The names: bf16 operands keep theirs; f16 operands' carry `_xf16`, and their 16-bit
/// outputs are f16.
#[test]
fn names_say_the_operand_type() {
    assert_eq!(
        name(Operands::Bf16, BFormat::Bf16, Epilogue::Store),
        "gemm_bf16"
    );
    assert_eq!(
        name(Operands::Bf16, BFormat::Q4K, Epilogue::StoreHalf),
        "gemm_q4_k_to_bf16"
    );
    assert_eq!(
        name(Operands::F16, BFormat::Bf16, Epilogue::Store),
        "gemm_bf16_xf16"
    );
    assert_eq!(
        name(Operands::F16, BFormat::F16, Epilogue::Accumulate),
        "gemm_f16_xf16_residual"
    );
    assert_eq!(
        name(Operands::F16, BFormat::Q4K, Epilogue::StoreHalf),
        "gemm_q4_k_xf16_to_f16"
    );
}

/// The wgmma kernels, every thread copying or a copier warp beside the warpgroups: bf16
/// and f16 weights, each epilogue, one and two warpgroups, the three token widths, a
/// partial token tile, odd and even step counts; the products within their bound (and
/// the controls outside it), the weights through an identity `A` bit for bit.
#[test]
fn wgmma_products_meet_the_bound_and_carry_exact_weights() {
    let seed = seed();
    let shapes = [(64, 128, 3), (128, 64, 4), (256, 128, 4)];
    for (operands, f) in [
        (Operands::F16, BFormat::Bf16),
        (Operands::F16, BFormat::F16),
        (Operands::Bf16, BFormat::Bf16),
    ] {
        for (i, &(bm, bn, stages)) in shapes.iter().enumerate() {
            for core in [Core::Wgmma, Core::WgmmaProducer] {
                let p = GemmParams {
                    operands,
                    epilogue: Epilogue::ALL[i % 3],
                    core,
                    ..params(f, 128, 192 + 64 * i as u32, bm, bn, 32, stages)
                };
                check_products(&p, seed);
            }
        }
    }
}

#[test]
fn wgmma_refuses_what_it_does_not_do() {
    let wg = |p: GemmParams| GemmParams {
        core: Core::Wgmma,
        ..p
    };
    let refuse = |p: GemmParams, needle: &str| {
        let e = build(&p).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    };
    let copier = |p: GemmParams| GemmParams {
        core: Core::WgmmaProducer,
        ..p
    };
    refuse(
        copier(params(BFormat::Q8_0, 128, 64, 128, 128, 64, 3)),
        "bf16 or f16 weights",
    );
    refuse(
        wg(params(BFormat::Bf16, 128, 64, 96, 128, 64, 3)),
        "64, 128 or 256",
    );
    refuse(
        wg(params(BFormat::Bf16, 128, 64, 128, 128, 64, 2)),
        "3 or 4",
    );
}

/// The wgmma products of quantized weights (dequantized in shared memory, both operands
/// read there by the tensor cores), every format and operand type, each epilogue, odd
/// and even step counts, a partial token tile: within the bound, the controls outside
/// it, and the dequantized weights through an identity `A` bit for bit.
#[test]
fn wgmma_products_of_quantized_weights_meet_the_bound() {
    let seed = seed();
    for (j, (operands, f)) in variants().filter(|(_, f)| f.is_quantized()).enumerate() {
        let km = f.k_multiple();
        let k = if km < 64 { 192 } else { km.max(128) };
        let (bm, bn, stages) = [(64, 128, 3), (128, 64, 4)][j % 2];
        let p = GemmParams {
            operands,
            epilogue: Epilogue::ALL[j % 3],
            core: Core::Wgmma,
            ..params(f, 128, k, bm, bn, 32, stages)
        };
        check_products(&p, seed);
    }
}

/// `p`'s products on 70 tokens within their bound (controls outside it) and, unless it
/// accumulates, its weights through an identity `A` bit for bit.
fn check_products(p: &GemmParams, seed: u64) {
    let mut cases = vec![case(p, 70, seed).unwrap_or_else(|e| panic!("{e}"))];
    if p.epilogue != Epilogue::Accumulate {
        cases.push(exactness_case(p, seed).unwrap_or_else(|e| panic!("{e}")));
    }
    for case in cases {
        let out = run_case(&mut InterpExecutor::new(), &case).unwrap_or_else(|e| panic!("{e}"));
        for r in compare(&case, &out).expect("comparable") {
            let (bm, bn, k) = (p.bm, p.bn, p.k);
            assert!(
                r.passed,
                "{} {:?} k {k} bm {bm} bn {bn}: {r}",
                case.name, p.core
            );
        }
    }
}
