//! f32 activations rounded to a 16-bit type (bf16 or f16) for the next matrix product,
//! optionally through the erf form of GELU on the way (BERT's feed-forward activation):
//! - `cast_f32_bf16`, `cast_f32_f16`: `y = bf16(x)` / `f16(x)`, exact (one rounding, to
//!   nearest even; past f16's ±65504 to infinity);
//! - `gelu_f32_bf16`, `gelu_f32_f16`: `y = bf16(x · Φ(x))` (or f16) with
//!   `Φ(x) = ½(1 + erf(x/√2))`.
//!
//! **Layout**: `x` `[n]` f32, `y` `[n]` bf16 or f16, `n` a launch argument; both 16-byte
//! aligned. Thread `i` of the grid converts group `i` of 4 elements (one 16-byte load, one
//! 8-byte store); the `n mod 4` trailing elements go one per thread to the first threads.
//!
//! **GELU arithmetic** (f32): `z = |x|·(1/√2)`, `t = rcp.rn(1 + p·z)`,
//! `c = t·(a₁ + t·(a₂ + t·(a₃ + t·(a₄ + t·a₅)))) · ex2.approx(−z²·log₂e)`, which is
//! erfc(z) to within 1.5·10⁻⁷ (Abramowitz & Stegun 7.1.26); then `y = x·(1 − c/2)` for
//! `x ≥ 0` and `y = x·(c/2)` for `x < 0` — the negative side takes erfc directly, so
//! nothing cancels where GELU is small. One approximate instruction and a truncated
//! series: the check is a bound ([`gelu_tolerance`]).

use half::{bf16, f16};
use quench_ir::{Builder, Function, Scalar, Type, Value};
use quench_rt::{Arg, Launch};

use crate::approx::{gamma, EX2_REL, F32_MIN_NORMAL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{emit_pack_bf16x2, emit_pack_f16x2, gptr};

/// What happens to each element before the rounding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// Nothing: a plain conversion.
    Identity,
    /// GELU, erf form.
    GeluErf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToBf16Params {
    pub activation: Activation,
    /// The output's element type: `Scalar::BF16` or `Scalar::F16`.
    pub out: Scalar,
    /// Threads per block.
    pub threads: u32,
}

/// Abramowitz & Stegun 7.1.26: `erfc(z) ≈ t·(a₁ + … + a₅t⁴)·e^(−z²)`, `t = 1/(1 + p·z)`.
const P: f32 = 0.327_591_1;
const A: [f32; 5] = [
    0.254_829_6,
    -0.284_496_74,
    1.421_413_8,
    -1.453_152_1,
    1.061_405_4,
];
/// The series' absolute error on [0, ∞).
const SERIES_ERR: f64 = 1.5e-7;

impl ToBf16Params {
    pub fn name(&self) -> &'static str {
        match (self.activation, self.out) {
            (Activation::Identity, Scalar::F16) => "cast_f32_f16",
            (Activation::GeluErf, Scalar::F16) => "gelu_f32_f16",
            (Activation::Identity, _) => "cast_f32_bf16",
            (Activation::GeluErf, _) => "gelu_f32_bf16",
        }
    }

    pub fn launch(&self, n: u32) -> Launch {
        let per_thread = (n / 4).max(n % 4);
        Launch::linear(per_thread.div_ceil(self.threads).max(1), self.threads)
    }
}

/// `cast_f32_bf16(x, y, n)` / `gelu_f32_bf16(x, y, n)` (or `_f16`).
pub fn build(p: &ToBf16Params) -> Result<Function, KernelError> {
    if !matches!(p.out, Scalar::BF16 | Scalar::F16) {
        return Err(KernelError::unsupported(
            p.name(),
            format!("output type {:?}: must be bf16 or f16", p.out),
        ));
    }
    let mut k = Builder::new(p.name(), p.threads);
    let x = k.param("x", gptr(Scalar::F32));
    let y = k.param("y", gptr(p.out));
    let pack = match p.out {
        Scalar::F16 => emit_pack_f16x2,
        _ => emit_pack_bf16x2,
    };
    let n = k.param("n", Type::U32);
    let act = p.activation;
    let f = move |k: &mut Builder, v: Value| match act {
        Activation::Identity => v,
        Activation::GeluErf => emit_gelu(k, v),
    };
    let gid = k.global_id_x();
    let groups = k.shr_const(n, 2);
    let in_range = k.lt(gid, groups);
    k.if_then(in_range, |k| {
        let at = k.mul_const(gid, 4);
        let src = k.ptr_add(x, at);
        let v = k.load(Type::Vec(Scalar::F32, 4), src);
        let ys: Vec<Value> = (0..4)
            .map(|i| {
                let e = k.extract(v, i);
                f(k, e)
            })
            .collect();
        let lo = pack(k, ys[0], ys[1]);
        let hi = pack(k, ys[2], ys[3]);
        let pair = k.pack(Type::Vec(Scalar::U32, 2), &[lo, hi]);
        let words = k.ptr_cast(Scalar::U32, y);
        let at = k.mul_const(gid, 2);
        let dst = k.ptr_add(words, at);
        k.store(dst, pair);
    });
    let start = k.shl_const(groups, 2);
    let tail = k.sub(n, start);
    let in_tail = k.lt(gid, tail);
    k.if_then(in_tail, |k| {
        let i = k.add(start, gid);
        let src = k.ptr_add(x, i);
        let v = k.load(Type::F32, src);
        let r = f(k, v);
        let r = k.cvt(p.out, r);
        let dst = k.ptr_add(y, i);
        k.store(dst, r);
    });
    Ok(k.finish()?)
}

/// GELU of one f32 value, as the module docs describe.
fn emit_gelu(k: &mut Builder, x: Value) -> Value {
    let ax = k.abs(x);
    let inv_sqrt2 = k.const_f32(std::f32::consts::FRAC_1_SQRT_2);
    let z = k.mul(ax, inv_sqrt2);
    let pc = k.const_f32(P);
    let one = k.const_f32(1.0);
    let d = k.fma(pc, z, one);
    let t = k.rcp(d);
    let mut poly = k.const_f32(A[4]);
    for &a in A[..4].iter().rev() {
        let ac = k.const_f32(a);
        poly = k.fma(poly, t, ac);
    }
    let series = k.mul(poly, t);
    let zz = k.mul(z, z);
    let neg_log2e = k.const_f32(-std::f32::consts::LOG2_E);
    let w = k.mul(zz, neg_log2e);
    let e = k.ex2_approx(w);
    let c = k.mul(series, e);
    let half = k.const_f32(0.5);
    let half_c = k.mul(c, half);
    let upper = k.sub(one, half_c);
    let zero = k.const_f32(0.0);
    let nonneg = k.ge(x, zero);
    let factor = k.select(nonneg, upper, half_c);
    k.mul(x, factor)
}

/// `v` rounded once to the output type (to nearest even), as f64.
fn round_out(out: Scalar, v: f64) -> f64 {
    match out {
        Scalar::F16 => f16::from_f64(v).to_f64(),
        _ => bf16::from_f64(v).to_f64(),
    }
}

/// Values (exactly representable in `out`) as `out`'s bytes.
fn out_bytes(out: Scalar, v: &[f64]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| match out {
            Scalar::F16 => f16::from_f64(x).to_bits().to_le_bytes(),
            _ => bf16::from_f64(x).to_bits().to_le_bytes(),
        })
        .collect()
}

/// `bf16(x)` (or `f16(x)`) for each element: the conversion's reference, bit for bit
/// (rounded from the f32 itself, as the kernel rounds it: `half`'s conversion from f64
/// rounds some f32 values differently).
pub fn reference_cast(out: Scalar, x: &[f32]) -> Vec<f64> {
    x.iter()
        .map(|&v| match out {
            Scalar::F16 => f16::from_f32(v).to_f64(),
            _ => bf16::from_f32(v).to_f64(),
        })
        .collect()
}

/// The exact GELU (erf form, with [`erf`] in f64), rounded once to the output type;
/// `scale` is the factor inside erf (1/√2 for GELU).
fn gelu_with(out: Scalar, x: &[f32], scale: f64) -> Vec<f64> {
    x.iter()
        .map(|&v| round_out(out, 0.5 * v as f64 * (1.0 + erf(v as f64 * scale))))
        .collect()
}

pub fn reference_gelu(out: Scalar, x: &[f32]) -> Vec<f64> {
    gelu_with(out, x, std::f64::consts::FRAC_1_SQRT_2)
}

/// A deliberately wrong GELU: `x·½(1 + erf(x))`, the 1/√2 inside erf forgotten.
pub fn reference_gelu_unscaled(out: Scalar, x: &[f32]) -> Vec<f64> {
    gelu_with(out, x, 1.0)
}

/// erf to about 1e-16 absolute: the Maclaurin series (alternating, summed in f64) for
/// |x| ≤ 3, the continued fraction of erfc beyond.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a <= 3.0 {
        // erf(a) = 2/√π Σ (−1)ⁿ a^(2n+1) / (n! (2n+1))
        let (mut term, mut sum, mut n) = (a, a, 0.0);
        while term.abs() > 1e-18 * sum.abs() {
            n += 1.0;
            term *= -a * a / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(a) = e^(−a²)/√π · 1/(a + (1/2)/(a + 1/(a + (3/2)/(a + 2/(a + …)))))
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
    };
    r.copysign(x)
}

/// Per-element tolerance of the GELU kernel against [`reference_gelu`], and how it
/// follows.
///
/// `c` differs from erfc(z) by the series' 1.5·10⁻⁷, plus the f32 evaluation: the
/// Horner steps and products (γ₁₂ relative, with every partial at most 3 in magnitude, t
/// ≤ 1), the exponent `−z²·log₂e` rounded twice (relative error `ln2·|w|·γ₂` after ex2)
/// and ex2.approx itself; all relative to a value at most 1, so absolute. `y` then
/// differs from the exact GELU by `δ = ½|x|·E_c + γ₃|y|`, and the two roundings to bf16
/// add at most one ulp of the output type: `2^-7·|want|` for bf16, `2^-10·|want|` or
/// f16's subnormal step 2^-24 for f16, with margin.
pub fn gelu_tolerance(out: Scalar, x: &[f32], want: &[f64]) -> (Vec<f64>, String) {
    let (ulp, tiny, name) = match out {
        Scalar::F16 => (2f64.powi(-10), 2f64.powi(-24), "f16"),
        _ => (2f64.powi(-7), F32_MIN_NORMAL, "bf16"),
    };
    let tol = x
        .iter()
        .zip(want)
        .map(|(&v, &w)| {
            let (v, w) = (v as f64, w.abs());
            let z2 = v * v / 2.0;
            let e_c = SERIES_ERR
                + 3.0 * gamma(12)
                + std::f64::consts::LN_2 * z2 * std::f64::consts::LOG2_E * gamma(2)
                + EX2_REL;
            let delta = 0.5 * v.abs() * e_c + gamma(3) * (w + 1e-30);
            delta * 1.01 + ulp * (w + delta) * 1.01 + tiny
        })
        .collect();
    let explain = format!(
        "½|x|·E_c + γ₃|y| + one {name} ulp ({ulp:e}·|want|, at least {tiny:e}): E_c = 1.5e-7 (A&S 7.1.26) + 3γ₁₂ + ex2.approx {EX2_REL:.2e} \
         + ln2·|w|·γ₂ (the rounded exponent w = −z²·log₂e), u = {F32_U:.2e}"
    );
    (tol, explain)
}

/// A case of `n` elements. Conversion: values in ±[2^-6, 64]. GELU: three quarters in
/// ±[1/4, 2] (where the wrong control differs) and the rest in ±[2, 10] (GELU's tails).
pub fn case(p: &ToBf16Params, n: u32, seed: u64) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let len = n as usize;
    let x: Vec<f32> = match p.activation {
        Activation::Identity => data::signed(&mut rng, len, 0.015625, 64.0),
        Activation::GeluErf => {
            let near = data::signed(&mut rng, len, 0.25, 2.0);
            let far = data::signed(&mut rng, len, 2.0, 10.0);
            (0..len)
                .map(|i| if i % 4 == 3 { far[i] } else { near[i] })
                .collect()
        }
    };
    let (expected, controls) = match p.activation {
        Activation::Identity => {
            let want = reference_cast(p.out, &x);
            (
                Expected {
                    buffer: 1,
                    data: out_bytes(p.out, &want),
                    elem: p.out,
                    check: Check::Exact,
                },
                vec![],
            )
        }
        Activation::GeluErf => {
            let want = reference_gelu(p.out, &x);
            let (tol, explain) = gelu_tolerance(p.out, &x, &want);
            let check = Check::Bound { tol, explain };
            let wrong = reference_gelu_unscaled(p.out, &x);
            let control = Control {
                what: "erf(x) in place of erf(x/√2)".to_string(),
                expected: Expected {
                    buffer: 1,
                    data: out_bytes(p.out, &wrong),
                    elem: p.out,
                    check: check.clone(),
                },
            };
            (
                Expected {
                    buffer: 1,
                    data: out_bytes(p.out, &want),
                    elem: p.out,
                    check,
                },
                vec![control],
            )
        }
    };
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: n.to_string(),
        kernel,
        launch: p.launch(n),
        buffers: vec![
            Buffer::input("x", data::f32_bytes(&x)),
            Buffer::output("y", len * 2),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Scalar(Arg::U32(n)),
        ],
        expected: vec![expected],
        controls,
        bytes_moved: 6 * len as u64,
        flops: if p.activation == Activation::GeluErf {
            20
        } else {
            0
        } * len as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::erf;

    #[test]
    fn erf_matches_known_values() {
        // erf(0.5), erf(1), erf(2), erf(3.5), from tables to 16 digits.
        for (x, want) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.5, 0.999_999_256_901_627_7),
        ] {
            assert!((erf(x) - want).abs() < 1e-15, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-15);
        }
    }
}
