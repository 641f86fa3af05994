//! One token's activations times weight rows read as stored (Q4_K, Q5_K, Q6_K and the
//! 32-element Q4_0, Q5_0, Q5_1): each (sub-)block's quants meet the f32 activations, their sum
//! is scaled once by the block's factor, and the offsets (the k-quants' mins, the legacy
//! types' `m` or zero point) are applied through the activations' sums per 32.
//!
//! Expanding a row to f32 first and multiplying the expansion costs a store and a load per
//! weight; here the quants are widened in registers, so decoding reads each weight's bits once.
//! The sums are regrouped (sub-block by sub-block), so they are not the expansion's bits, but
//! they stay within f32 rounding of the same products.

use quench_models::dequant::{f16_to_f32, unpack_k_scales};
use quench_models::GgmlType;

use crate::prefetch::prefetch;

/// Elements of a super-block.
const QK_K: usize = 256;

/// Whether rows of `ty` have a kernel here.
pub(crate) fn multiplies(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q4_0
            | GgmlType::Q5_0
            | GgmlType::Q5_1
    )
}

/// `out[i] = Σ_k w[i][k]·x[k]` for the first `out.len()` rows stored one after another in
/// `rows` (each `row_bytes` long) of type `ty`; `x_sums[b]` is the sum of `x` over its
/// 32-element block `b`. Rows past those are fetched into the caches ahead of their turn.
pub(crate) fn dot_rows(
    ty: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    x: &[f32],
    x_sums: &[f32],
    out: &mut [f32],
) {
    debug_assert!(multiplies(ty));
    assert!(rows.len() >= row_bytes * out.len(), "dot_rows: row bytes");
    assert_eq!(x.len() % 32, 0, "dot_rows: whole blocks");
    assert_eq!(x_sums.len() * 32, x.len(), "dot_rows: block sums");
    simd::dot_rows(ty, rows, row_bytes, x, x_sums, out)
}

/// The body of [`dot_rows`], inlined into each instruction-set variant.
#[inline(always)]
fn dot_rows_body<const FMA: bool>(
    ty: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    x: &[f32],
    x_sums: &[f32],
    out: &mut [f32],
) {
    for (r, (row, o)) in rows.chunks_exact(row_bytes).zip(out.iter_mut()).enumerate() {
        let next = ((r + 1) * row_bytes).min(rows.len());
        prefetch(&rows[next..(next + row_bytes).min(rows.len())]);
        *o = match ty {
            GgmlType::Q4_K => q45_k_dot::<FMA, false>(row, x, x_sums),
            GgmlType::Q5_K => q45_k_dot::<FMA, true>(row, x, x_sums),
            GgmlType::Q6_K => q6_k_dot::<FMA>(row, x),
            GgmlType::Q4_0 => legacy_dot::<FMA, false, false>(row, x, x_sums),
            GgmlType::Q5_0 => legacy_dot::<FMA, true, false>(row, x, x_sums),
            _ => legacy_dot::<FMA, true, true>(row, x, x_sums),
        };
    }
}

/// `a·b + c`, fused where the caller was compiled for FMA (unfused it is a slow library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// Q4_K (`FIFTH = false`: f16 `d`, f16 `dmin`, 12 scale bytes, 128 bytes of nibbles) or Q5_K
/// (`FIFTH = true`: 32 bytes of fifth bits before the nibbles). Sub-block `j` (32 elements)
/// holds the low (`j` even) or high nibbles of bytes `32·(j/2) ..`, and Q5_K's bit `j` of
/// `qh[0..32]`; `w = (d·sc_j)·q − dmin·m_j`.
#[inline(always)]
fn q45_k_dot<const FMA: bool, const FIFTH: bool>(row: &[u8], x: &[f32], x_sums: &[f32]) -> f32 {
    let block_bytes = if FIFTH { 176 } else { 144 };
    let mut acc = [0.0f32; 16];
    let mut mins_part = 0.0f32;
    for (b, (block, xb)) in row
        .chunks_exact(block_bytes)
        .zip(x.chunks_exact(QK_K))
        .enumerate()
    {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (scales, mins) = unpack_k_scales(block[4..16].try_into().expect("12 bytes"));
        let (qh, qs) = if FIFTH {
            (&block[16..48], &block[48..176])
        } else {
            (&block[0..0], &block[16..144])
        };
        // Sub-blocks 2p and 2p + 1 share bytes 32p .. 32p + 32: low and high nibbles.
        for p in 0..4 {
            let bytes = &qs[32 * p..32 * p + 32];
            let (xl, xh) = (&xb[64 * p..64 * p + 32], &xb[64 * p + 32..64 * p + 64]);
            let quants = |k: usize| {
                let (mut lo, mut hi) = (bytes[k] & 0x0f, bytes[k] >> 4);
                if FIFTH {
                    lo |= ((qh[k] >> (2 * p)) & 1) << 4;
                    hi |= ((qh[k] >> (2 * p + 1)) & 1) << 4;
                }
                (f32::from(lo), f32::from(hi))
            };
            let (mut tl, mut th) = ([0.0f32; 16], [0.0f32; 16]);
            for k in 0..16 {
                let (lo, hi) = quants(k);
                tl[k] = lo * xl[k];
                th[k] = hi * xh[k];
            }
            for k in 0..16 {
                let (lo, hi) = quants(16 + k);
                tl[k] = madd::<FMA>(lo, xl[16 + k], tl[k]);
                th[k] = madd::<FMA>(hi, xh[16 + k], th[k]);
            }
            let (dl, dh) = (
                d * f32::from(scales[2 * p]),
                d * f32::from(scales[2 * p + 1]),
            );
            for k in 0..16 {
                acc[k] = madd::<FMA>(dh, th[k], madd::<FMA>(dl, tl[k], acc[k]));
            }
            let m = &x_sums[8 * b + 2 * p..8 * b + 2 * p + 2];
            mins_part = madd::<FMA>(dmin * f32::from(mins[2 * p]), m[0], mins_part);
            mins_part = madd::<FMA>(dmin * f32::from(mins[2 * p + 1]), m[1], mins_part);
        }
    }
    acc.iter().sum::<f32>() - mins_part
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit fields, 16 signed scales (one per
/// 16 elements), f16 `d`; within half `h`, element `e` takes nibble `e / 64` of byte
/// `64h + e % 64` and bits `2·(e / 32)` of byte `128 + 32h + e % 32`; `w = (d·sc)·(q − 32)`.
#[inline(always)]
fn q6_k_dot<const FMA: bool>(row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for (block, xb) in row.chunks_exact(210).zip(x.chunks_exact(QK_K)) {
        let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
        let d = f16_at(block, 208);
        for g in 0..16 {
            let (h, e) = (g / 8, (16 * g) % 128);
            let low = &ql[64 * h + e % 64..64 * h + e % 64 + 16];
            let high = &qh[32 * h + e % 32..32 * h + e % 32 + 16];
            let (low_shift, high_shift) = (4 * (e / 64), 2 * (e / 32));
            let xs = &xb[16 * g..16 * g + 16];
            let mut t = [0.0f32; 16];
            for (k, t) in t.iter_mut().enumerate() {
                let q = ((low[k] >> low_shift) & 0x0f) | (((high[k] >> high_shift) & 3) << 4);
                *t = f32::from(i16::from(q) - 32) * xs[k];
            }
            let dl = d * f32::from(scales[g] as i8);
            for (a, t) in acc.iter_mut().zip(t) {
                *a = madd::<FMA>(dl, t, *a);
            }
        }
    }
    acc.iter().sum()
}

/// Q4_0 (`FIFTH = false, OFFSET = false`: f16 `d`, 16 bytes of nibbles; `w = d·(q − 8)`),
/// Q5_0 (`FIFTH`: f16 `d`, a little-endian u32 of fifth bits, nibbles; `w = d·(q − 16)`) or
/// Q5_1 (`FIFTH, OFFSET`: f16 `d`, f16 `m`, fifth bits, nibbles; `w = d·q + m`). Byte `j` holds
/// element `j` (low nibble) and `j + 16`; bit `i` of the u32 is element `i`'s fifth bit.
#[inline(always)]
fn legacy_dot<const FMA: bool, const FIFTH: bool, const OFFSET: bool>(
    row: &[u8],
    x: &[f32],
    x_sums: &[f32],
) -> f32 {
    let (qh_at, qs_at) = match (FIFTH, OFFSET) {
        (false, _) => (2, 2),
        (true, false) => (2, 6),
        (true, true) => (4, 8),
    };
    let zero = match (FIFTH, OFFSET) {
        (_, true) => 0.0,
        (true, false) => 16.0,
        (false, false) => 8.0,
    };
    let mut acc = [0.0f32; 16];
    let mut offsets = 0.0f32;
    for ((block, xb), &s) in row
        .chunks_exact(qs_at + 16)
        .zip(x.chunks_exact(32))
        .zip(x_sums)
    {
        let d = f16_at(block, 0);
        let qh = u32::from_le_bytes([
            block[qh_at],
            block[qh_at + 1],
            block[qh_at + 2],
            block[qh_at + 3],
        ]);
        let qs = &block[qs_at..qs_at + 16];
        let quants = |k: usize| {
            let (mut lo, mut hi) = (qs[k] & 0x0f, qs[k] >> 4);
            if FIFTH {
                lo |= (((qh >> k) & 1) as u8) << 4;
                hi |= (((qh >> (k + 16)) & 1) as u8) << 4;
            }
            (f32::from(lo), f32::from(hi))
        };
        let mut t = [0.0f32; 16];
        for (k, t) in t.iter_mut().enumerate() {
            let (lo, hi) = quants(k);
            *t = madd::<FMA>(hi, xb[16 + k], lo * xb[k]);
        }
        for (a, t) in acc.iter_mut().zip(t) {
            *a = madd::<FMA>(d, t, *a);
        }
        let offset = if OFFSET { f16_at(block, 2) } else { -zero * d };
        offsets = madd::<FMA>(offset, s, offsets);
    }
    acc.iter().sum::<f32>() + offsets
}

/// The loops compiled for AVX2 and FMA, chosen at run time where the CPU has them.
#[cfg(target_arch = "x86_64")]
mod simd {
    use quench_models::GgmlType;

    #[target_feature(enable = "avx2,fma")]
    fn dot_rows_avx2(
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        x: &[f32],
        x_sums: &[f32],
        out: &mut [f32],
    ) {
        super::dot_rows_body::<true>(ty, rows, row_bytes, x, x_sums, out)
    }

    pub(super) fn dot_rows(
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        x: &[f32],
        x_sums: &[f32],
        out: &mut [f32],
    ) {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, the only requirement of the function.
            unsafe { dot_rows_avx2(ty, rows, row_bytes, x, x_sums, out) }
        } else {
            super::dot_rows_body::<false>(ty, rows, row_bytes, x, x_sums, out)
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use quench_models::GgmlType;

    pub(super) fn dot_rows(
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        x: &[f32],
        x_sums: &[f32],
        out: &mut [f32],
    ) {
        super::dot_rows_body::<false>(ty, rows, row_bytes, x, x_sums, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::block_sums;
    use quench_models::dequant::{dequantize, f32_to_f16};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random (super-)blocks of `ty`: every quant and scale byte random, the f16 factors (`d`,
    /// and `dmin` or `m`) of either sign and several magnitudes.
    fn random_rows(rng: &mut ChaCha8Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
        let size = ty.type_size() as usize;
        let mut bytes = Vec::new();
        for _ in 0..rows * cols / ty.block_size() as usize {
            let mut block: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
            let mut half = |at: usize| {
                let v = rng.gen_range(-1.0f32..1.0) * 10f32.powi(rng.gen_range(-4..0));
                block[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
            };
            match ty {
                GgmlType::Q6_K => half(208),
                GgmlType::Q4_0 | GgmlType::Q5_0 => half(0),
                _ => {
                    half(0);
                    half(2);
                }
            }
            bytes.extend(block);
        }
        bytes
    }

    /// The size of the offset part of each element's weight (`dmin·m_j`, the legacy types'
    /// `m` or zero point `z·d`; 0 for Q6_K), so that the bound covers both terms of
    /// `scale·q − offset`.
    fn min_terms(ty: GgmlType, bytes: &[u8], cols: usize) -> Vec<f64> {
        let size = ty.type_size() as usize;
        let mut out = Vec::new();
        for block in bytes.chunks_exact(size) {
            let d = f64::from(f16_at(block, 0)).abs();
            match ty {
                GgmlType::Q6_K => out.extend([0.0; QK_K]),
                GgmlType::Q4_0 => out.extend([8.0 * d; 32]),
                GgmlType::Q5_0 => out.extend([16.0 * d; 32]),
                GgmlType::Q5_1 => out.extend([f64::from(f16_at(block, 2)).abs(); 32]),
                _ => {
                    let (_, mins) = unpack_k_scales(block[4..16].try_into().unwrap());
                    for j in 0..QK_K {
                        out.push(f64::from(f16_at(block, 2) * f32::from(mins[j / 32])).abs());
                    }
                }
            }
        }
        assert_eq!(out.len() % cols, 0);
        out
    }

    /// Against the f64 products of the rows as quench-models expands them (bit for bit what
    /// the `gguf` package gives), within f32 rounding of the sums of absolute terms; the
    /// portable and the dispatched code, from row blocks not starting at 0.
    #[test]
    fn row_products_match_f64_of_the_expanded_weights() {
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        for ty in [
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
        ] {
            let (rows, cols) = (23, 768);
            let bytes = random_rows(&mut rng, ty, rows, cols);
            let w = dequantize(ty, &bytes, rows * cols).unwrap();
            let mins = min_terms(ty, &bytes, cols);
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let sums = block_sums(&x);
            let row_bytes = bytes.len() / rows;
            let mut portable = vec![f32::NAN; rows];
            dot_rows_body::<false>(ty, &bytes, row_bytes, &x, &sums, &mut portable);
            let mut dispatched = vec![f32::NAN; rows];
            dot_rows(
                ty,
                &bytes[..5 * row_bytes],
                row_bytes,
                &x,
                &sums,
                &mut dispatched[..5],
            );
            dot_rows(
                ty,
                &bytes[5 * row_bytes..],
                row_bytes,
                &x,
                &sums,
                &mut dispatched[5..],
            );
            for r in 0..rows {
                let (row, row_mins) = (&w[r * cols..(r + 1) * cols], &mins[r * cols..]);
                let exact: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let magnitude: f64 = row
                    .iter()
                    .zip(&x)
                    .zip(row_mins)
                    .map(|((&a, &b), &m)| (f64::from(a).abs() + 2.0 * m) * f64::from(b).abs())
                    .sum();
                let bound = 1e-5 * magnitude + 1e-30;
                for (what, got) in [("portable", portable[r]), ("dispatched", dispatched[r])] {
                    let err = (f64::from(got) - exact).abs();
                    assert!(
                        err <= bound,
                        "{ty:?} {what} row {r}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }
}
