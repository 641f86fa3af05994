//! Cases: seeded random operands, the reference outputs and their bound.

use half::bf16;
use quench_ir::Scalar;
use quench_rt::Arg;

use super::reference::{exact, tolerance, weights, wrong_weights};
use super::{build, BFormat, Epilogue, GemmParams};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;

/// Cases up to this many multiply-adds also carry the wrong-answer control; larger ones
/// (the full-size shapes timed on the GPU) skip it, whose reference would cost as much
/// again on the host.
const CONTROL_MAX_MACS: u64 = 1 << 32;

/// The magnitudes of the random operands: `A` in ±[2^-4, 2], bf16 `B` in ±[2^-6, 0.5],
/// and the f16 scales of quantized `B` in ±[2^-16, 2^-8] (subnormal f16 scales included).
const A_RANGE: (f32, f32) = (0.0625, 2.0);
const B_RANGE: (f32, f32) = (0.015625, 0.5);
const SCALE_RANGE: (f32, f32) = (1.0 / 65536.0, 1.0 / 256.0);

fn weight_bytes(p: &GemmParams, rng: &mut rand_chacha::ChaCha8Rng) -> Vec<u8> {
    let (n, k) = (p.n as usize, p.k as usize);
    match p.format {
        BFormat::Bf16 => data::bf16_bytes(&data::to_bf16(&data::signed(
            rng,
            n * k,
            B_RANGE.0,
            B_RANGE.1,
        ))),
        f => data::ggml_rows(rng, f.ggml(), n, k, SCALE_RANGE.0, SCALE_RANGE.1),
    }
}

/// `C`'s bytes holding `v`: f32, or each value rounded to bf16 (to nearest even).
fn c_bytes_of(elem: Scalar, v: &[f32]) -> Vec<u8> {
    match elem {
        Scalar::BF16 => data::bf16_bytes(&data::to_bf16(v)),
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

/// A case of `m` rows: random `A`, random `B` (every quant pattern, random scales), and
/// for `C += A·Bᵀ` a random `C` in ±[2^-6, 4] updated in place.
pub fn case(p: &GemmParams, m: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    check_m(p, m)?;
    let mut rng = data::rng(seed);
    let (mu, n, k) = (m as usize, p.n as usize, p.k as usize);
    let a = data::to_bf16(&data::signed(&mut rng, mu * k, A_RANGE.0, A_RANGE.1));
    let b = weight_bytes(p, &mut rng);
    let w = weights(p, &b)?;
    let af: Vec<f32> = a.iter().map(|v| v.to_f32()).collect();
    let (sums, abs_sums) = exact(mu, n, k, &af, &w);
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
    let c_elem = p.epilogue.c_elem();
    // An f32 result as the kernel stores it: as is, or rounded to bf16.
    let expected = |data: &[f32]| Expected {
        buffer: 2,
        data: c_bytes_of(c_elem, data),
        elem: c_elem,
        check: check.clone(),
    };

    let mut controls = vec![];
    if mu as u64 * n as u64 * k as u64 <= CONTROL_MAX_MACS {
        let (wrong, what) = wrong_weights(p, &w);
        let (wrong_sums, _) = exact(mu, n, k, &af, &wrong);
        controls.push(Control {
            what: what.to_string(),
            expected: expected(&finish(&wrong_sums)),
        });
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
            Buffer::input("a", data::bf16_bytes(&a)),
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
/// every element must equal `bf16(dequant(B))` — compared by value, as the tensor core
/// may give either zero for a sum of zeros. `p` must store `C` (not add to it); stored as
/// bf16, the values are unchanged (they are bf16 already).
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
    let a: Vec<bf16> = (0..k * k)
        .map(|i| bf16::from_f32(if i / k == i % k { 1.0 } else { 0.0 }))
        .collect();
    let b = weight_bytes(p, &mut rng);
    let w = weights(p, &b)?;
    let want: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
    let check = Check::Bound {
        tol: vec![0.0; k * n],
        explain: "equal values: each output is one exact product".into(),
    };
    let c_elem = p.epilogue.c_elem();
    let c_size = k * n * c_elem.bytes() as usize;
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!("{k}x{n}x{k} identity A"),
        kernel,
        launch: p.launch(p.k),
        bytes_moved: (k * k * 2 + b.len() + c_size) as u64,
        buffers: vec![
            Buffer::input("a", data::bf16_bytes(&a)),
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
            data: c_bytes_of(c_elem, &want),
            elem: c_elem,
            check,
        }],
        controls: vec![],
        flops: 2 * (k * n * k) as u64,
    })
}
