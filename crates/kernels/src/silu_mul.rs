//! `y = silu(g) · u = g · u / (1 + e^-g)`, f16 in and out, f32 math: the gated
//! activation of SwiGLU feed-forward blocks on the prompt path, between the gate and up
//! products (which store f16) and the down product (which reads f16).
//!
//! **Layout**: `g`, `u`, `y` are contiguous f16 arrays of `n` elements (a runtime
//! argument); see [`crate::elementwise`] for the thread mapping.
//!
//! **Arithmetic**, per element in f32: `t = g · (−log2 e)`, `e = ex2.approx(t)`,
//! `d = 1 + e`, `s = div.approx(g, d)`, `y = s · u`, rounded to f16 (past ±65504 to
//! infinity). Two approximate
//! instructions, so the check is a bound: see [`tolerance`].

use half::f16;
use quench_ir::{Builder, Function, Scalar, Type};
use quench_rt::{Arg, Launch};

use crate::approx::{DIV_REL, EX2_REL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::elementwise;
use crate::error::KernelError;
use crate::lanes::gptr;

pub const NAME: &str = "silu_mul_f16";

/// Parameters of the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SiluMulParams {
    /// Threads per block.
    pub threads: u32,
}

impl SiluMulParams {
    pub fn launch(&self, n: u32) -> Launch {
        elementwise::launch(Scalar::F16, n, self.threads)
    }
}

/// `silu_mul_f16(g, u, y, n)`.
pub fn build(p: &SiluMulParams) -> Result<Function, KernelError> {
    let mut k = Builder::new(NAME, p.threads);
    let g = k.param("g", gptr(Scalar::F16));
    let u = k.param("u", gptr(Scalar::F16));
    let y = k.param("y", gptr(Scalar::F16));
    let n = k.param("n", Type::U32);
    let neg_log2e = -std::f32::consts::LOG2_E;
    elementwise::emit_map(&mut k, Scalar::F16, &[g, u], y, n, &|k, x| {
        let c = k.const_f32(neg_log2e);
        let t = k.mul(x[0], c);
        let e = k.ex2_approx(t);
        let one = k.const_f32(1.0);
        let d = k.add(one, e);
        let s = k.div_approx(x[0], d);
        k.mul(s, x[1])
    });
    Ok(k.finish()?)
}

/// The exact function, rounded once to f16.
pub fn reference(g: &[f16], u: &[f16]) -> Vec<f16> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| {
            let (g, u) = (g.to_f64(), u.to_f64());
            f16::from_f64(g * u / (1.0 + (-g).exp()))
        })
        .collect()
}

/// A deliberately wrong reference: the sigmoid taken as `1 / (1 + 2^-g)`, the mistake of
/// forgetting the log2(e) scaling in front of `ex2`.
pub fn reference_without_log2e(g: &[f16], u: &[f16]) -> Vec<f16> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| {
            let (g, u) = (g.to_f64(), u.to_f64());
            f16::from_f64(g * u / (1.0 + (-g).exp2()))
        })
        .collect()
}

/// Per-element tolerance against [`reference()`], and how it follows.
///
/// Before the final rounding the kernel's value is `y·(1 + η)` with
/// `|η| ≤ 2u·|g|·(1 + …)` (the rounded constant and product in `t`, magnified by
/// `2^t`'s sensitivity `ln 2·|t| = |g|`) `+ EX2 + u` (the sum `1 + e`) `+ DIV + u`
/// (the product with `u`). While `η < 2^-12`, the kernel's rounding to f16 and the
/// reference's land on the same or adjacent f16 values, which differ by at most one f16
/// ulp: `2^-10·|want|`, or `2^-24` among f16's subnormals (below 2^-14).
pub fn tolerance(g: &[f16], want: &[f16]) -> (Vec<f64>, String) {
    let gmax = g.iter().map(|x| x.to_f64().abs()).fold(0.0, f64::max);
    let eta = 2.0 * F32_U * gmax * 1.01 + EX2_REL + DIV_REL + 2.0 * F32_U;
    let tol = want
        .iter()
        .map(|w| w.to_f64().abs() * 2f64.powi(-10) + F16_SUBNORMAL_STEP)
        .collect();
    let explain = format!(
        "one f16 ulp (2^-10·|want|) + 2^-24: the f32 result before rounding is within η = {eta:.2e} \
         (2u·max|g| = 2u·{gmax} for the rounded exponent, ex2.approx {EX2_REL:.2e}, div.approx {DIV_REL:.2e}, \
         two roundings) of exact, and η < 2^-12 = {:.2e}, so both roundings to f16 meet or are adjacent",
        2f64.powi(-12)
    );
    (tol, explain)
}

/// f16's spacing below its smallest normal, 2^-14.
const F16_SUBNORMAL_STEP: f64 = 1.0 / (1u32 << 24) as f64;

/// A case over `n` elements: gates in ±[2^-6, 8], up-projections in ±[2^-6, 4].
pub fn case(p: &SiluMulParams, n: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let g = data::to_f16(&data::signed(&mut rng, n as usize, 0.015625, 8.0));
    let u = data::to_f16(&data::signed(&mut rng, n as usize, 0.015625, 4.0));
    let want = reference(&g, &u);
    let (tol, explain) = tolerance(&g, &want);
    let bytes = n as usize * 2;
    let control = Expected {
        buffer: 2,
        data: data::f16_values_bytes(&reference_without_log2e(&g, &u)),
        elem: Scalar::F16,
        check: Check::Bound {
            tol: tol.clone(),
            explain: explain.clone(),
        },
    };
    Ok(KernelCase {
        name: NAME.to_string(),
        shape: n.to_string(),
        kernel,
        launch: p.launch(n),
        buffers: vec![
            Buffer::input("g", data::f16_values_bytes(&g)),
            Buffer::input("u", data::f16_values_bytes(&u)),
            Buffer::output("y", bytes),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::U32(n)),
        ],
        expected: vec![Expected {
            buffer: 2,
            data: data::f16_values_bytes(&want),
            elem: Scalar::F16,
            check: Check::Bound { tol, explain },
        }],
        controls: vec![Control {
            what: "sigmoid without the log2(e) scaling".to_string(),
            expected: control,
        }],
        bytes_moved: 3 * bytes as u64,
        flops: 6 * n as u64,
    })
}
