//! Host references: the weights as the kernel multiplies them, the exact products, the
//! error bound, and deliberately wrong answers that the bound must reject.

use half::{bf16, f16};
use quench_models::dequant;

use super::{BFormat, Epilogue, GemmParams, Operands};
use crate::approx::{F32_MIN_NORMAL, F32_U};
use crate::error::KernelError;
use crate::par::par_map;

/// The `[n, k]` weights the kernel multiplies, as f32: bf16 or f16 as stored, rounded to
/// the operand type (bf16 weights under f16 operands: to nearest f16), or each block
/// dequantized as [`quench_models::dequant`] does and rounded to the operand type (to
/// nearest even).
pub fn weights(p: &GemmParams, b: &[u8]) -> Result<Vec<f32>, KernelError> {
    let (n, k) = (p.n as usize, p.k as usize);
    let rb = p.format.row_bytes(p.k) as usize;
    if b.len() != n * rb {
        return Err(KernelError::unsupported(
            p.name(),
            format!("B has {} bytes, [{n}, {k}] needs {}", b.len(), n * rb),
        ));
    }
    let round = |x: f32| p.operands.round(x);
    match p.format {
        BFormat::Bf16 => {
            return Ok(b
                .chunks_exact(2)
                .map(|h| round(bf16::from_le_bytes([h[0], h[1]]).to_f32()))
                .collect())
        }
        BFormat::F16 => {
            return Ok(b
                .chunks_exact(2)
                .map(|h| f16::from_le_bytes([h[0], h[1]]).to_f32())
                .collect())
        }
        _ => {}
    }
    let rows = par_map(n, |j| {
        dequant::dequantize(p.format.ggml(), &b[j * rb..(j + 1) * rb], k)
    });
    let mut out = Vec::with_capacity(n * k);
    for r in rows {
        let r = r.map_err(|e| KernelError::unsupported(p.name(), e.to_string()))?;
        out.extend(r.iter().map(|&x| round(x)));
    }
    Ok(out)
}

/// Exact sums `Σ_k a[i][k]·w[j][k]` (f32 products of bf16 values, or of f16 values, are
/// exact; f64 sums)
/// and sums of `|a·w|`, for `a` `[m, k]` and `w` `[n, k]`; row-major `[m, n]` each.
pub fn exact(m: usize, n: usize, k: usize, a: &[f32], w: &[f32]) -> (Vec<f64>, Vec<f64>) {
    // Four rows of A against each row of W: W streams through the cache m/4 times.
    const ROWS: usize = 4;
    let blocks = par_map(m.div_ceil(ROWS), |blk| {
        let rows = blk * ROWS..((blk + 1) * ROWS).min(m);
        let mut sums = vec![(0.0f64, 0.0f64); rows.len() * n];
        for j in 0..n {
            let wj = &w[j * k..(j + 1) * k];
            for (r, i) in rows.clone().enumerate() {
                let ai = &a[i * k..(i + 1) * k];
                let (mut s, mut abs) = ([0.0f64; 4], [0.0f64; 4]);
                for (x, y) in ai.chunks_exact(4).zip(wj.chunks_exact(4)) {
                    for l in 0..4 {
                        let prod = (x[l] * y[l]) as f64;
                        s[l] += prod;
                        abs[l] += prod.abs();
                    }
                }
                sums[r * n + j] = (s.iter().sum(), abs.iter().sum());
            }
        }
        sums
    });
    blocks.into_iter().flatten().unzip()
}

/// A deliberately wrong weight operand, and what is wrong with it: for bf16 and f16, `B`'s
/// buffer read as `[k, n]` (the transposition mistake); for the block formats, the two
/// halves of every 32 elements swapped (the nibble-order mistake of Q4_0 and Q4_1).
pub fn wrong_weights(p: &GemmParams, w: &[f32]) -> (Vec<f32>, &'static str) {
    let (n, k) = (p.n as usize, p.k as usize);
    if !p.format.is_quantized() {
        let t = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
        (t, "B read as [k, n] instead of [n, k]")
    } else {
        let s = (0..n * k).map(|i| w[i ^ 16]).collect();
        (s, "the halves of every 32 weights swapped (nibble order)")
    }
}

/// Per-element tolerance of `C = A·Bᵀ`: `k·2^-22·Σ|a·b| + u·|want| + 2^-126`.
///
/// Each `mma.m16n8k16` adds 16 exact products to the accumulator; aligning the 17 terms
/// to the largest with truncation may lose up to one f32 ulp (2^-23 relative) per term,
/// at most `17·2^-23 ≤ 2^-18.9` of the step's `Σ|terms|`, which is at most the row's
/// `Σ|a·b|`. Over `k/16` steps that is `k·2^-22.9·Σ|a·b|`, rounded up to `k·2^-22`.
/// `u·|want|` covers the reference's own rounding. The same holds for bf16 and f16
/// operands: their products are exact either way.
///
/// With `C += A·Bᵀ` the kernel rounds once more, `RN(acc + c)` against the reference's
/// `RN(S + c)`: the sum's error `E` passes through, plus `u` of each side, so the
/// tolerance is `E·(1 + u) + 2u·|want|/(1 − u) + 2^-126`.
///
/// With `C` rounded to the operand type ([`Epilogue::StoreHalf`]) the reference is the
/// f32 `want` rounded to it, against the kernel's rounded accumulator, which is within
/// the f32 bound `E` of `want`: each rounding moves its side by at most the type's unit
/// roundoff `u_h` of it (bf16 2^-8, f16 2^-11) plus, below the smallest normal, half a
/// subnormal step `s_h` (f16: 2^-25; bf16's 2^-134 is covered by 2^-126), so the
/// tolerance is `E·(1 + u_h) + 2u_h·|want| + 2s_h + 2^-126`. Where the two land on the
/// same side of a rounding boundary they agree bit for bit (and the unit tests show the
/// kernel rounds exactly as the host rounds its f32 output).
///
/// `want` is the f32 reference, before any rounding to the operand type.
pub fn tolerance(p: &GemmParams, abs_sums: &[f64], want: &[f32]) -> (Vec<f64>, String) {
    let per_k = p.k as f64 * 2f64.powi(-22);
    let (u_h, s_h) = (p.operands.unit_roundoff(), p.operands.subnormal_half_step());
    let tol = abs_sums
        .iter()
        .zip(want)
        .map(|(s, w)| {
            let w = (*w as f64).abs();
            let sum = per_k * s + F32_U * w + F32_MIN_NORMAL;
            match p.epilogue {
                Epilogue::Store => sum,
                Epilogue::Accumulate => {
                    per_k * s * (1.0 + F32_U) + 2.0 * F32_U * w / (1.0 - F32_U) + F32_MIN_NORMAL
                }
                Epilogue::StoreHalf => {
                    sum * (1.0 + u_h) + 2.0 * u_h * w + 2.0 * s_h + F32_MIN_NORMAL
                }
            }
        })
        .collect();
    let sum = format!(
        "k·2^-22·Σ|a·b| with k = {}: up to one ulp per addend in each of the k/16 mma.m16n8k16 steps \
         (17 addends aligned by truncation)",
        p.k
    );
    let explain = match p.epilogue {
        Epilogue::Store => format!("{sum}, + u·|want| + 2^-126 for the reference's rounding"),
        Epilogue::Accumulate => format!(
            "E·(1 + u) + 2u·|want|/(1 − u) + 2^-126 with E = {sum}, and both roundings of the sum with C"
        ),
        Epilogue::StoreHalf => match p.operands {
            Operands::Bf16 => format!(
                "E·(1 + 2^-8) + 2^-7·|want| + 2^-126 with E = {sum}, + u·|want| + 2^-126: \
                 both sides rounded to bf16"
            ),
            Operands::F16 => format!(
                "E·(1 + 2^-11) + 2^-10·|want| + 2^-24 + 2^-126 with E = {sum}, + u·|want| + 2^-126: \
                 both sides rounded to f16 (2^-24: half a subnormal step each)"
            ),
        },
    };
    (tol, explain)
}
