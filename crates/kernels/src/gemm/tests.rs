//! Unit tests: the dequantized tile bit for bit (identity `A`), and refusals.
//! The products themselves, with their bound and wrong-answer controls, are checked
//! through the library in `tests/interp.rs`.

use quench_rt::InterpExecutor;

use super::*;
use crate::case::{compare, run_case};

use crate::data::test_seed as seed;

fn params(format: BFormat, n: u32, k: u32, bm: u32, bn: u32, wn: u32, stages: u32) -> GemmParams {
    GemmParams {
        format,
        epilogue: Epilogue::Store,
        n,
        k,
        bm,
        bn,
        wn,
        stages,
    }
}

/// With `A` the identity, `C` is the weights the kernel multiplies: each must be
/// `bf16(dequant(w))` exactly. Run with whole-row items (64 threads for 64 rows) and
/// half-row items (128 threads), over more than one super-block where there are some;
/// stored as bf16 too.
#[test]
fn dequantized_tiles_are_exact() {
    let seed = seed();
    for f in BFormat::ALL.into_iter().filter(|f| f.is_quantized()) {
        let k = f.k_multiple().max(128);
        let to_bf16 = GemmParams {
            epilogue: Epilogue::StoreBf16,
            ..params(f, 64, k, 64, 64, 32, 3)
        };
        for p in [
            params(f, 64, k, 64, 64, 32, 3),
            params(f, 128, k, 128, 64, 32, 2),
            to_bf16,
        ] {
            let case = exactness_case(&p, seed).unwrap_or_else(|e| panic!("{e}"));
            let out = run_case(&mut InterpExecutor::new(), &case).unwrap_or_else(|e| panic!("{e}"));
            for r in compare(&case, &out).expect("comparable") {
                assert!(r.passed, "{} ({} threads): {r}", case.name, p.threads());
            }
        }
    }
}

/// `C` stored as bf16 holds exactly the f32 `C` of the same operands rounded to nearest
/// even (what `cast_f32_bf16` writes), bit for bit, for every weight format, with a
/// partial row tile. (Every element written: the poison left in place would be a NaN.)
#[test]
fn bf16_output_is_the_f32_output_rounded() {
    let seed = seed();
    let m = 70;
    for f in BFormat::ALL {
        let f32_out = params(f, 128, f.k_multiple().max(64), 64, 64, 32, 2);
        let bf16_out = GemmParams {
            epilogue: Epilogue::StoreBf16,
            ..f32_out
        };
        let run = |p: &GemmParams| {
            let case = case(p, m, seed).unwrap_or_else(|e| panic!("{e}"));
            let out = run_case(&mut InterpExecutor::new(), &case).unwrap_or_else(|e| panic!("{e}"));
            out.get(2).expect("C is an output").to_vec()
        };
        let want: Vec<u8> = crate::data::f32_from_bytes(&run(&f32_out))
            .iter()
            .flat_map(|&x| crate::lanes::round_bf16(x).to_le_bytes())
            .collect();
        let got = run(&bf16_out);
        assert_eq!(got.len(), want.len(), "{}", bf16_out.name());
        let unwritten = crate::data::bf16_from_bytes(&got)
            .iter()
            .filter(|v| !v.is_finite())
            .count();
        assert_eq!(
            unwritten,
            0,
            "{}: {unwritten} elements not finite",
            bf16_out.name()
        );
        let differ = got
            .chunks_exact(2)
            .zip(want.chunks_exact(2))
            .filter(|(g, w)| g != w)
            .count();
        assert_eq!(
            differ,
            0,
            "{}: {differ} elements differ from the rounded f32 output",
            bf16_out.name()
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
}
