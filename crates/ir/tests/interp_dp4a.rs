//! Interpreter: `dp4a`, the four-way byte dot product, against a scalar reference in
//! every signedness, and the verifier's typing of it.

mod interp_support;

use interp_support::*;
use quench_ir::interp::{launch, Device};
use quench_ir::{AddrSpace, Builder, Function, Op, Scalar, Type};
use rand::Rng;

const PU32: Type = Type::Ptr(AddrSpace::Global, Scalar::U32);

/// `out[t] = dp4a(a[t], b[t], c[t])` with the given byte signedness, over 64 threads.
fn dp4a_kernel(a_signed: bool, b_signed: bool) -> Function {
    let mut k = Builder::new("dp4a", 64);
    let [a, b, c, out] = ["a", "b", "c", "out"].map(|n| k.param(n, PU32));
    let t = k.tid_x();
    let [x, y, z] = [a, b, c].map(|p| {
        let at = k.ptr_add(p, t);
        k.load(Type::U32, at)
    });
    let z = if a_signed || b_signed {
        k.bitcast(Type::I32, z)
    } else {
        z
    };
    let d = k.dp4a(x, a_signed, y, b_signed, z);
    let d = k.bitcast(Type::U32, d);
    let at = k.ptr_add(out, t);
    k.store(at, d);
    k.finish().expect("verifies")
}

/// Plain arithmetic on the bytes, wider than any partial sum, wrapped at the end.
fn reference(a: u32, a_signed: bool, b: u32, b_signed: bool, c: u32) -> u32 {
    let byte = |w: u32, i: usize, s: bool| {
        let v = w.to_le_bytes()[i];
        if s {
            i64::from(v as i8)
        } else {
            i64::from(v)
        }
    };
    let sum: i64 = (0..4)
        .map(|i| byte(a, i, a_signed) * byte(b, i, b_signed))
        .sum();
    (i64::from(c) + sum) as u32
}

#[test]
fn dp4a_matches_the_scalar_reference_in_every_signedness() {
    let mut rng = rng();
    // Bytes at the edges of both readings, and words of them, beside random words.
    let edges = [0x00u8, 0x01, 0x7f, 0x80, 0x81, 0xff];
    for (a_signed, b_signed) in [(false, false), (false, true), (true, false), (true, true)] {
        let f = dp4a_kernel(a_signed, b_signed);
        let word = |rng: &mut rand_chacha::ChaCha8Rng| -> u32 {
            if rng.gen_bool(0.3) {
                u32::from_le_bytes([0; 4].map(|_: u8| edges[rng.gen_range(0..edges.len())]))
            } else {
                rng.gen()
            }
        };
        let a: Vec<u32> = (0..64).map(|_| word(&mut rng)).collect();
        let b: Vec<u32> = (0..64).map(|_| word(&mut rng)).collect();
        // Addends near both wrap points, so that the modular sum is exercised.
        let c: Vec<u32> = (0..64)
            .map(|i| match i % 4 {
                0 => u32::MAX - rng.gen_range(0..70000),
                1 => 0x8000_0000 - rng.gen_range(0..70000),
                _ => rng.gen(),
            })
            .collect();
        let mut dev = Device::new();
        let (ap, bp, cp) = (
            upload_u32(&mut dev, &a),
            upload_u32(&mut dev, &b),
            upload_u32(&mut dev, &c),
        );
        let o = output(&mut dev, 4 * 64);
        launch(&f, &cfg(1, 64), &[ap, bp, cp, o], &mut dev).expect("runs");
        let got = download_u32(&dev, o, 64);
        for t in 0..64 {
            let want = reference(a[t], a_signed, b[t], b_signed, c[t]);
            assert_eq!(
                got[t], want,
                "dp4a.{a_signed}.{b_signed} thread {t}: a {:#010x} b {:#010x} c {:#010x}",
                a[t], b[t], c[t]
            );
        }
    }
}

#[test]
fn dp4a_addend_must_match_the_signedness() {
    for (a_signed, b_signed, c_ty) in [
        (false, false, Type::I32),
        (true, false, Type::U32),
        (false, true, Type::U32),
    ] {
        let mut k = Builder::new("bad_dp4a", 32);
        let w = k.const_u32(0x0102_0304);
        let c = k.emit(c_ty, Op::Const { ty: c_ty, bits: 0 });
        let acc = if a_signed || b_signed {
            Type::I32
        } else {
            Type::U32
        };
        k.emit(
            acc,
            Op::Dp4a {
                a_signed,
                b_signed,
                a: w,
                b: w,
                c,
            },
        );
        let err = k
            .finish()
            .expect_err("an addend of the wrong signedness is rejected");
        assert!(err.to_string().contains('c'), "{err}");
    }
    let mut k = Builder::new("bad_dp4a_word", 32);
    let w = k.const_f32(1.0);
    let c = k.const_u32(0);
    k.emit(
        Type::U32,
        Op::Dp4a {
            a_signed: false,
            b_signed: false,
            a: w,
            b: w,
            c,
        },
    );
    let err = k.finish().expect_err("a float word is rejected");
    assert!(err.to_string().contains("u32 or i32"), "{err}");
}
