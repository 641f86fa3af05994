//! Cases: seeded random operands, the reference outputs and their bound.

use quench_ir::Scalar;
use quench_rt::Arg;
use rand::Rng;

use super::reference::{exact, tolerance, weights, wrong_weights};
use super::{build, Epilogue, GemmParams};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;

/// Cases up to this many multiply-adds also carry the wrong-answer control; larger ones
/// (the full-size shapes timed on the GPU) skip it, whose reference would cost as much
/// again on the host.
const CONTROL_MAX_MACS: u64 = 1 << 32;

/// The magnitudes of the random operands: `A` in ±[2^-4, 2], bf16 and f16 `B` in
/// ±[2^-6, 0.5], and the f16 scales of quantized `B` in ±[2^-16, 2^-8] (subnormal f16
/// scales included).
const A_RANGE: (f32, f32) = (0.0625, 2.0);
const B_RANGE: (f32, f32) = (0.015625, 0.5);
const SCALE_RANGE: (f32, f32) = (1.0 / 65536.0, 1.0 / 256.0);

/// The exponents of the exactness case's bf16 and f16 weights: see [`spread_weights`].
const SPREAD_EXPONENTS: (i32, i32) = (-30, 3);

fn weight_bytes(p: &GemmParams, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<u8> {
    let (n, k) = (p.n as usize, p.k as usize);
    let (lo, hi) = if p.format.is_quantized() {
        SCALE_RANGE
    } else {
        B_RANGE
    };
    data::ggml_rows(rng, p.format.ggml(), n, k, lo, hi)
}

/// bf16 or f16 weights `±2^e·(1 + f)` with `e` uniform in [`SPREAD_EXPONENTS`] and `f` in
/// [0, 1): under f16 operands some round to f16's subnormals (below 2^-14; bf16 ones
/// inexactly below 2^-17) or to zero (below 2^-25), so the exactness case sees the
/// conversion's rounding as well as its exact range.
fn spread_weights(p: &GemmParams, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<u8> {
    let v: Vec<f32> = (0..p.n as usize * p.k as usize)
        .map(|_| {
            let e = rng.gen_range(SPREAD_EXPONENTS.0..=SPREAD_EXPONENTS.1);
            let m = 1.0 + rng.gen::<f32>();
            let x = m * 2f32.powi(e);
            if rng.gen::<bool>() {
                -x
            } else {
                x
            }
        })
        .collect();
    bytes_of(p.format.stored_elem(), &v)
}

/// `v` as the bytes of `elem`: f32 as is, or each value rounded to bf16 or f16 (to
/// nearest even).
fn bytes_of(elem: Scalar, v: &[f32]) -> Vec<u8> {
    match elem {
        Scalar::BF16 => data::bf16_bytes(&data::to_bf16(v)),
        Scalar::F16 => data::f16_bytes(v),
        _ => data::f32_bytes(v),
    }
}

fn check_m(p: &GemmParams, m: u32) -> Result<(), KernelError> {
    if m == 0 || m as u64 * p.k as u64 > 1 << 40 {
        return Err(KernelError::unsupported(
            p.name(),
            format!("m = {m}: must be positive, and m·k at most 2^40"),
        ));
    }
    Ok(())
}

/// A case of `m` rows: random `A` (of the operand type), random `B` (every quant pattern,
/// random scales), and for `C += A·Bᵀ` a random `C` in ±[2^-6, 4] updated in place.
/// Small cases hold wrong answers as controls: [`super::reference::wrong_weights`], for
/// Q5_K and Q3_K each of [`data::mistakes`], and for `C +=` the sums stored without `C`.
pub fn case(p: &GemmParams, m: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    check_m(p, m)?;
    let mut rng = data::rng(seed);
    let (mu, n, k) = (m as usize, p.n as usize, p.k as usize);
    let a: Vec<f32> = data::signed(&mut rng, mu * k, A_RANGE.0, A_RANGE.1)
        .into_iter()
        .map(|x| p.operands.round(x))
        .collect();
    let b = weight_bytes(p, &mut rng);
    let w = weights(p, &b)?;
    let (sums, abs_sums) = exact(mu, n, k, &a, &w);
    let accumulate = p.epilogue == Epilogue::Accumulate;
    let c0 = if accumulate {
        data::signed(&mut rng, mu * n, 0.015625, 4.0)
    } else {
        vec![]
    };
    let finish = |s: &[f64]| -> Vec<f32> {
        if accumulate {
            s.iter()
                .zip(&c0)
                .map(|(s, c)| (s + *c as f64) as f32)
                .collect()
        } else {
            s.iter().map(|&s| s as f32).collect()
        }
    };
    let want = finish(&sums);
    let (tol, explain) = tolerance(p, &abs_sums, &want);
    let check = Check::Bound { tol, explain };
    let c_elem = p.c_elem();
    // An f32 result as the kernel stores it: as is, or rounded to the operand type.
    let expected = |data: &[f32]| Expected {
        buffer: 2,
        data: bytes_of(c_elem, data),
        elem: c_elem,
        check: check.clone(),
    };

    let mut controls = vec![];
    if mu as u64 * n as u64 * k as u64 <= CONTROL_MAX_MACS {
        let (wrong, what) = wrong_weights(p, &w);
        let (wrong_sums, _) = exact(mu, n, k, &a, &wrong);
        controls.push(Control {
            what: what.to_string(),
            expected: expected(&finish(&wrong_sums)),
        });
        // Q5_K and Q3_K: B read with each of the format's mistakes.
        let mistakes = data::mistakes(p.format.ggml(), &b);
        for (what, wrong) in mistakes {
            let (wrong_sums, _) = exact(mu, n, k, &a, &weights(p, &wrong)?);
            controls.push(Control {
                what: format!("B read with {what}"),
                expected: expected(&finish(&wrong_sums)),
            });
        }
        if accumulate {
            let overwritten: Vec<f32> = sums.iter().map(|&s| s as f32).collect();
            controls.push(Control {
                what: "C overwritten instead of added to".into(),
                expected: expected(&overwritten),
            });
        }
    }
    let c_size = mu * n * c_elem.bytes() as usize;
    let c_buffer = if accumulate {
        Buffer::in_out("c", data::f32_bytes(&c0))
    } else {
        Buffer::output("c", c_size)
    };
    let c_bytes = (c_size * if accumulate { 2 } else { 1 }) as u64;
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!("{m}x{n}x{k} t{}x{}w{}s{}", p.bm, p.bn, p.wn, p.stages),
        kernel,
        launch: p.launch(m),
        bytes_moved: (mu * k * 2 + b.len()) as u64 + c_bytes,
        buffers: vec![
            Buffer::input("a", bytes_of(p.operands.scalar(), &a)),
            Buffer::input("b", b),
            c_buffer,
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::U32(m)),
        ],
        expected: vec![expected(&want)],
        controls,
        flops: 2 * (mu * n * k) as u64,
    })
}

/// A case that shows the weights the kernel multiplies bit for bit: `A` is the `k × k`
/// identity, so `C` is `Bᵀ` as the kernel holds it (each output one exact product), and
/// every element must equal [`weights`]: `bf16(dequant(B))` or `f16(dequant(B))`, bf16
/// or f16 weights rounded to the operand type (their magnitudes spread from 2^-30 to
/// 2^4, see [`spread_weights`]) — compared by value, as the tensor core may give either
/// zero for a sum of zeros. `p` must store `C` (not add to it); stored in the operand
/// type, the values are unchanged (they are of that type already).
pub fn exactness_case(p: &GemmParams, seed: u64) -> Result<KernelCase, KernelError> {
    if p.epilogue == Epilogue::Accumulate {
        return Err(KernelError::unsupported(
            p.name(),
            "the exactness case stores C",
        ));
    }
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let (n, k) = (p.n as usize, p.k as usize);
    let a: Vec<f32> = (0..k * k)
        .map(|i| if i / k == i % k { 1.0 } else { 0.0 })
        .collect();
    let b = if p.format.is_quantized() {
        weight_bytes(p, &mut rng)
    } else {
        spread_weights(p, &mut rng)
    };
    let w = weights(p, &b)?;
    let want: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
    let check = Check::Bound {
        tol: vec![0.0; k * n],
        explain: "equal values: each output is one exact product".into(),
    };
    let c_elem = p.c_elem();
    let c_size = k * n * c_elem.bytes() as usize;
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!("{k}x{n}x{k} identity A"),
        kernel,
        launch: p.launch(p.k),
        bytes_moved: (k * k * 2 + b.len() + c_size) as u64,
        buffers: vec![
            Buffer::input("a", bytes_of(p.operands.scalar(), &a)),
            Buffer::input("b", b),
            Buffer::output("c", c_size),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::U32(p.k)),
        ],
        expected: vec![Expected {
            buffer: 2,
            data: bytes_of(c_elem, &want),
            elem: c_elem,
            check,
        }],
        controls: vec![],
        flops: 2 * (k * n * k) as u64,
    })
}
