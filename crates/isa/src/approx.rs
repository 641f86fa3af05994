//! Error of the hardware's approximate instructions, measured against f64.

use quench_ir::UnOp;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::probe_kernels::ApproxOp;

/// What was measured for one instruction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApproxError {
    pub instruction: String,
    /// Input range sampled, as text (`[lo, hi]`, log-uniform or uniform).
    pub domain: String,
    pub samples: u64,
    /// Largest |got − exact| in units of the f32 spacing at the exact value.
    pub max_ulp: f64,
    pub max_abs: f64,
    /// Largest |got − exact| / |exact| over exact values with |exact| ≥ 2^-100.
    pub max_rel: f64,
    /// The input at which `max_ulp` occurred.
    pub worst_input: Vec<f32>,
}

/// Inputs for one instruction: `(x, y, domain description)`; `y` only for division.
pub fn inputs(op: ApproxOp, n: usize, seed: u64) -> (Vec<f32>, Vec<f32>, String) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let log_uniform = |rng: &mut ChaCha8Rng, lo: f64, hi: f64| -> f32 {
        (lo.ln() + rng.gen::<f64>() * (hi.ln() - lo.ln())).exp() as f32
    };
    let uniform = |rng: &mut ChaCha8Rng, lo: f64, hi: f64| -> f32 {
        (lo + rng.gen::<f64>() * (hi - lo)) as f32
    };
    let mut x = Vec::with_capacity(n);
    let mut y = vec![];
    let domain;
    match op {
        ApproxOp::Un(UnOp::Ex2Approx) => {
            domain = "uniform [-125, 127]".to_string();
            x.extend((0..n).map(|_| uniform(&mut rng, -125.0, 127.0)));
        }
        ApproxOp::Un(UnOp::Lg2Approx) => {
            domain = "log-uniform [2^-125, 2^127]".to_string();
            x.extend((0..n).map(|_| log_uniform(&mut rng, 2f64.powi(-125), 2f64.powi(127))));
        }
        ApproxOp::Un(UnOp::RcpApprox) | ApproxOp::Un(UnOp::RsqrtApprox) => {
            // rsqrt is only defined for positive inputs; rcp takes both signs.
            let signed = op == ApproxOp::Un(UnOp::RcpApprox);
            domain = format!(
                "log-uniform {}[2^-125, 2^125]",
                if signed { "±" } else { "" }
            );
            x.extend((0..n).map(|_| {
                let v = log_uniform(&mut rng, 2f64.powi(-125), 2f64.powi(125));
                if signed && rng.gen::<bool>() {
                    -v
                } else {
                    v
                }
            }));
        }
        ApproxOp::Un(UnOp::TanhApprox) => {
            domain = "uniform [-10, 10]".to_string();
            x.extend((0..n).map(|_| uniform(&mut rng, -10.0, 10.0)));
        }
        ApproxOp::Un(UnOp::SinApprox) | ApproxOp::Un(UnOp::CosApprox) | ApproxOp::Un(_) => {
            domain = "uniform [-pi, pi]".to_string();
            x.extend(
                (0..n).map(|_| uniform(&mut rng, -std::f64::consts::PI, std::f64::consts::PI)),
            );
        }
        ApproxOp::Div => {
            domain = "x, y log-uniform ±[2^-60, 2^60]".to_string();
            for _ in 0..n {
                let s = if rng.gen::<bool>() { -1.0 } else { 1.0 };
                x.push(s * log_uniform(&mut rng, 2f64.powi(-60), 2f64.powi(60)));
                y.push(log_uniform(&mut rng, 2f64.powi(-60), 2f64.powi(60)));
            }
        }
    }
    if y.is_empty() {
        y = vec![1.0; n];
    }
    (x, y, domain)
}

/// The exact function in f64.
pub fn exact(op: ApproxOp, x: f32, y: f32) -> f64 {
    let x = x as f64;
    match op {
        ApproxOp::Un(UnOp::Ex2Approx) => x.exp2(),
        ApproxOp::Un(UnOp::Lg2Approx) => x.log2(),
        ApproxOp::Un(UnOp::RcpApprox) => 1.0 / x,
        ApproxOp::Un(UnOp::RsqrtApprox) => 1.0 / x.sqrt(),
        ApproxOp::Un(UnOp::TanhApprox) => x.tanh(),
        ApproxOp::Un(UnOp::SinApprox) => x.sin(),
        ApproxOp::Un(UnOp::CosApprox) => x.cos(),
        ApproxOp::Div => x / y as f64,
        ApproxOp::Un(_) => f64::NAN,
    }
}

/// Spacing of f32 values at `v` (the ulp), subnormals included.
pub fn ulp_f32(v: f64) -> f64 {
    let a = v.abs();
    if a < f32::MIN_POSITIVE as f64 {
        return 2f64.powi(-149);
    }
    2f64.powi(a.log2().floor() as i32 - 23)
}

/// Error statistics of `got` against the exact function.
pub fn measure(op: ApproxOp, x: &[f32], y: &[f32], got: &[f32], domain: String) -> ApproxError {
    let mut e = ApproxError {
        instruction: op.name().to_string(),
        domain,
        samples: got.len() as u64,
        max_ulp: 0.0,
        max_abs: 0.0,
        max_rel: 0.0,
        worst_input: vec![],
    };
    for i in 0..got.len() {
        let r = exact(op, x[i], y[i]);
        let g = got[i] as f64;
        let abs = if g.is_nan() || r.is_nan() {
            f64::INFINITY
        } else {
            (g - r).abs()
        };
        let ulp = abs / ulp_f32(r);
        if ulp > e.max_ulp {
            e.max_ulp = ulp;
            e.worst_input = if op == ApproxOp::Div {
                vec![x[i], y[i]]
            } else {
                vec![x[i]]
            };
        }
        e.max_abs = e.max_abs.max(abs);
        if r.abs() >= 2f64.powi(-100) {
            e.max_rel = e.max_rel.max(abs / r.abs());
        }
    }
    e
}
