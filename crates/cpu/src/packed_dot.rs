//! One token's activations times weight rows read as stored (the k-quants Q2_K to Q6_K, the
//! 32-element Q4_0, Q5_0, Q5_1, and the 4-bit non-linear IQ4_NL and IQ4_XS), in integers: the activations rounded once per product to
//! 16-bit integers per 32-element block ([`quantize`], the GPU's integer kernels' form),
//! each block's quants widened to 16 bits in registers and multiplied with them exactly,
//! and each block's integer sum scaled once in f32.
//!
//! **Why.** Widening every weight to f32 for a fused multiply made these products bound by
//! the instructions, not the memory: two cores decoded a 1B Q4_K_M model at half
//! llama.cpp's rate. An integer multiply-add of 16-bit pairs takes 16 weights an
//! instruction and needs no conversion per weight. 8-bit activations (llama.cpp's) would
//! move the logits further than the FP64 check allows; 16 bits move each element by at
//! most `(½ + 2^-7)·dx` of its block's step `dx = max|x|/32767`.
//!
//! **Order.** Per 32-element block (Q6_K: per 16), eight 32-bit lanes each take the exact
//! sum of four products, lane `l` elements `2l, 2l + 1, 16 + 2l, 17 + 2l` (what
//! `_mm256_madd_epi16` gives for the block's two halves, added); each lane is converted to
//! f32 (exact: below 2^24) and added into its own f32 accumulator as `acc = fma(scale, sum,
//! acc)`, with the block's `scale` formed as below; the accumulators are summed as
//! [`sum_8_lanes`] at the end, and the offsets, accumulated apart in block order, added.
//! The portable code and the AVX2 code follow this order, so they give the same bits.
//! - Q4_K, Q5_K (`w = q`, sub-block scale `sc`, min `m`, super-block `d`, `dmin`): scale
//!   `fl(d·sc)·dx`; the offsets `fl(dmin·m)·dx·Σq` accumulated (fused) in eight lanes of
//!   their own, one per sub-block position, summed as [`sum_8_lanes`] and subtracted.
//! - Q6_K (`w = q − 32`, a signed scale per 16): scale `fl(d·sc)·dx` for each 16's lanes;
//!   Q3_K the same with `w = low + 4·high − 4` and `sc` its stored scale less 32.
//! - Q2_K (`w = q`, a scale and a min per 16): scale `fl(d·sc)·dx` for each 16's lanes, the
//!   offsets `fl(dmin·m)·dx·Σq` (`Σq` over the 16) in eight offset lanes, mins `k` and
//!   `k + 8` of a super-block in lane `k`, summed as [`sum_8_lanes`] and subtracted.
//! - Q4_0, Q5_0 (`w = q − 8`, `q − 16`), Q5_1 (`w = q`, offset `m`): scale `fl(d·dx)`;
//!   Q5_1's offset `fma(fl(m·dx), Σq, ·)`.
//! - IQ4_NL, IQ4_XS (`w` the level its 4-bit index names, −127 … 113): scale `fl(d·dx)`,
//!   IQ4_XS's `fl(d·sc)·dx` with its sub-block's 6-bit scale `sc` less 32.

use quench_models::dequant::{unpack_k_scales, unpack_q3_k_scales, IQ4_LEVELS};
use quench_models::quant::activations::{quantize, BLOCK};
use quench_models::GgmlType;

use crate::blocks::{f16_at, sum_8_lanes};
use crate::prefetch::prefetch_ahead;

/// One row's product by the function for `ty` of the module it is used in (the portable
/// functions, or the AVX2 ones of the same names).
macro_rules! per_type {
    ($ty:expr, $row:expr, $row_bytes:expr, $x:expr) => {
        match $ty {
            GgmlType::Q2_K => q2_k_dot($row, $row_bytes, $x),
            GgmlType::Q3_K => q3_k_dot($row, $row_bytes, $x),
            GgmlType::Q4_K => q45_k_dot::<false>($row, $row_bytes, $x),
            GgmlType::Q5_K => q45_k_dot::<true>($row, $row_bytes, $x),
            GgmlType::Q6_K => q6_k_dot($row, $row_bytes, $x),
            GgmlType::Q4_0 => legacy_dot::<false, false>($row, $row_bytes, $x),
            GgmlType::Q5_0 => legacy_dot::<true, false>($row, $row_bytes, $x),
            GgmlType::IQ4_NL => iq4_dot::<false>($row, $row_bytes, $x),
            GgmlType::IQ4_XS => iq4_dot::<true>($row, $row_bytes, $x),
            _ => legacy_dot::<true, true>($row, $row_bytes, $x),
        }
    };
}

/// Whether rows of `ty` have a kernel here.
pub(crate) fn multiplies(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q4_0
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::IQ4_NL
            | GgmlType::IQ4_XS
    )
}

/// One token's activations as the products take them.
pub(crate) struct Activations {
    /// The 16-bit quants, 32 per block.
    q: Vec<i16>,
    /// Each block's step `dx`.
    dx: Vec<f32>,
    /// Each block's `Σq` (an integer below 2^21: exact).
    sq: Vec<f32>,
    /// `Σq` over each 16 elements (Q2_K's mins are per 16).
    sq16: Vec<f32>,
}

impl Activations {
    /// `x` (a whole number of 32-element blocks) rounded to 16-bit integers.
    pub(crate) fn of(x: &[f32]) -> Self {
        let qx = quantize(x);
        Activations {
            // |q| ≤ 32767.
            q: qx.q.iter().map(|&q| q as i16).collect(),
            dx: qx.dx,
            sq: qx.sq.iter().map(|&s| s as f32).collect(),
            sq16: qx
                .q
                .chunks_exact(16)
                .map(|h| h.iter().sum::<i32>() as f32)
                .collect(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.q.len()
    }
}

/// `out[i] = Σ_k w[i][k]·x[k]` for the first `out.len()` rows stored one after another in
/// `rows` (each `row_bytes` long) of type `ty`. Rows past those are fetched into the caches
/// ahead of their turn.
pub(crate) fn dot_rows(
    ty: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    x: &Activations,
    out: &mut [f32],
) {
    assert!(multiplies(ty), "dot_rows: no kernel for {}", ty.name());
    assert!(rows.len() >= row_bytes * out.len(), "dot_rows: row bytes");
    assert_eq!(
        row_bytes as u64,
        ty.bytes_for(x.len() as u64).unwrap_or(0),
        "dot_rows: row width"
    );
    simd::dot_rows(ty, rows, row_bytes, x, out)
}

/// The portable [`dot_rows`]: the reference the vector code matches bit for bit.
fn dot_rows_portable(
    ty: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    x: &Activations,
    out: &mut [f32],
) {
    for (r, o) in out.iter_mut().enumerate() {
        // From the row's start on: the row, and the rows ahead to fetch.
        let row = &rows[r * row_bytes..];
        *o = per_type!(ty, row, row_bytes, x);
    }
}

/// The eight lanes' exact sums of a block's products: lane `l` takes elements `2l`, `2l + 1`
/// of each 16 in `w` (16 or 32 weights) and the same elements of `q`.
fn lane_sums(w: &[i16], q: &[i16]) -> [f32; 8] {
    let mut s = [0i32; 8];
    for (half_w, half_q) in w.chunks_exact(16).zip(q.chunks_exact(16)) {
        for (l, s) in s.iter_mut().enumerate() {
            *s += i32::from(half_w[2 * l]) * i32::from(half_q[2 * l])
                + i32::from(half_w[2 * l + 1]) * i32::from(half_q[2 * l + 1]);
        }
    }
    s.map(|v| v as f32)
}

/// `acc[l] = fma(scale, sums[l], acc[l])`.
fn accumulate(acc: &mut [f32; 8], scale: f32, sums: [f32; 8]) {
    for (a, s) in acc.iter_mut().zip(sums) {
        *a = scale.mul_add(s, *a);
    }
}

/// Q4_K (`FIFTH = false`: f16 `d`, f16 `dmin`, 12 scale bytes, 128 bytes of nibbles) or Q5_K
/// (`FIFTH = true`: 32 bytes of fifth bits before the nibbles). Sub-block `j` (32 elements)
/// holds the low (`j` even) or high nibbles of bytes `32·(j/2) ..`, and Q5_K's bit `j` of
/// `qh[0..32]`; `w = (d·sc_j)·q − dmin·m_j`.
fn q45_k_dot<const FIFTH: bool>(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
    let block_bytes = if FIFTH { 176 } else { 144 };
    let mut acc = [0.0f32; 8];
    let mut mins_part = [0.0f32; 8];
    for (u, block) in rows[..row_bytes].chunks_exact(block_bytes).enumerate() {
        prefetch_ahead(rows, u * block_bytes, block_bytes);
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let (scales, mins) = unpack_k_scales(block[4..16].try_into().expect("12 bytes"));
        let qs = &block[block_bytes - 128..];
        for j in 0..8 {
            let bytes = &qs[32 * (j / 2)..32 * (j / 2) + 32];
            let w: [i16; 32] = std::array::from_fn(|k| {
                let mut q = (bytes[k] >> (4 * (j % 2))) & 0x0f;
                if FIFTH {
                    q |= ((block[16 + k] >> j) & 1) << 4;
                }
                i16::from(q)
            });
            let b = 8 * u + j;
            let sums = lane_sums(&w, &x.q[BLOCK * b..BLOCK * (b + 1)]);
            accumulate(&mut acc, d * f32::from(scales[j]) * x.dx[b], sums);
            mins_part[j] = (dmin * f32::from(mins[j]) * x.dx[b]).mul_add(x.sq[b], mins_part[j]);
        }
    }
    sum_8_lanes(acc) - sum_8_lanes(mins_part)
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit fields, 16 signed scales (one per
/// 16 elements), f16 `d`; within half `h`, element `e` takes nibble `e / 64` of byte
/// `64h + e % 64` and bits `2·(e / 32)` of byte `128 + 32h + e % 32`; `w = (d·sc)·(q − 32)`.
fn q6_k_dot(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
    let mut acc = [0.0f32; 8];
    for (u, block) in rows[..row_bytes].chunks_exact(210).enumerate() {
        prefetch_ahead(rows, u * 210, 210);
        let (ql, qh, scales) = (&block[0..128], &block[128..192], &block[192..208]);
        let d = f16_at(block, 208);
        for j in 0..8 {
            let (h, e) = (j / 4, 32 * (j % 4));
            let low = &ql[64 * h + e % 64..];
            let high = &qh[32 * h..];
            let w: [i16; 32] = std::array::from_fn(|k| {
                let q =
                    ((low[k] >> (4 * (e / 64))) & 0x0f) | (((high[k] >> (2 * (j % 4))) & 3) << 4);
                i16::from(q) - 32
            });
            let b = 8 * u + j;
            let q = &x.q[BLOCK * b..BLOCK * (b + 1)];
            for half in 0..2 {
                let span = 16 * half..16 * half + 16;
                let sums = lane_sums(&w[span.clone()], &q[span]);
                let sc = f32::from(scales[2 * j + half] as i8);
                accumulate(&mut acc, d * sc * x.dx[b], sums);
            }
        }
    }
    sum_8_lanes(acc)
}

/// Q2_K: 16 scale bytes (low nibble the scale, high nibble the min, per 16 elements), 64
/// bytes of 2-bit quants, f16 `d`, f16 `dmin`; element `32j + k` is bits `2·(j % 4)` of
/// byte `32·(j / 4) + k`; `w = (d·sc)·q − dmin·m`. The mins of scales `k` and `k + 8` go to
/// offset lane `k`.
fn q2_k_dot(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut mins_part = [0.0f32; 8];
    for (u, block) in rows[..row_bytes].chunks_exact(84).enumerate() {
        prefetch_ahead(rows, u * 84, 84);
        let (scales, qs) = (&block[0..16], &block[16..80]);
        let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
        for (k, &s) in scales.iter().enumerate() {
            let min = dmin * f32::from(s >> 4) * x.dx[8 * u + k / 2];
            mins_part[k % 8] = min.mul_add(x.sq16[16 * u + k], mins_part[k % 8]);
        }
        for j in 0..8 {
            let bytes = &qs[32 * (j / 4)..];
            let w: [i16; 32] = std::array::from_fn(|k| i16::from((bytes[k] >> (2 * (j % 4))) & 3));
            let b = 8 * u + j;
            let q = &x.q[BLOCK * b..BLOCK * (b + 1)];
            for half in 0..2 {
                let span = 16 * half..16 * half + 16;
                let sums = lane_sums(&w[span.clone()], &q[span]);
                let sc = f32::from(scales[2 * j + half] & 0x0f);
                accumulate(&mut acc, d * sc * x.dx[b], sums);
            }
        }
    }
    sum_8_lanes(acc) - sum_8_lanes(mins_part)
}

/// Q3_K: 32 bytes of high bits, 64 bytes of low 2-bit quants, 12 bytes of sixteen 6-bit
/// scales, f16 `d`; element `32j + k` takes bits `2·(j % 4)` of byte `32·(j / 4) + k` and
/// bit `j` of high byte `k`; `w = (d·(sc − 32))·(low + 4·high − 4)`.
fn q3_k_dot(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
    let mut acc = [0.0f32; 8];
    for (u, block) in rows[..row_bytes].chunks_exact(110).enumerate() {
        prefetch_ahead(rows, u * 110, 110);
        let (hmask, qs) = (&block[0..32], &block[32..96]);
        let scales = unpack_q3_k_scales(block[96..108].try_into().expect("12 bytes"));
        let d = f16_at(block, 108);
        for j in 0..8 {
            let bytes = &qs[32 * (j / 4)..];
            let w: [i16; 32] = std::array::from_fn(|k| {
                let low = (bytes[k] >> (2 * (j % 4))) & 3;
                let high = (hmask[k] >> j) & 1;
                i16::from(low | (high << 2)) - 4
            });
            let b = 8 * u + j;
            let q = &x.q[BLOCK * b..BLOCK * (b + 1)];
            for half in 0..2 {
                let span = 16 * half..16 * half + 16;
                let sums = lane_sums(&w[span.clone()], &q[span]);
                let sc = f32::from(scales[2 * j + half]);
                accumulate(&mut acc, d * sc * x.dx[b], sums);
            }
        }
    }
    sum_8_lanes(acc)
}

/// Q4_0 (`FIFTH = false, OFFSET = false`: f16 `d`, 16 bytes of nibbles; `w = d·(q − 8)`),
/// Q5_0 (`FIFTH`: f16 `d`, a little-endian u32 of fifth bits, nibbles; `w = d·(q − 16)`) or
/// Q5_1 (`FIFTH, OFFSET`: f16 `d`, f16 `m`, fifth bits, nibbles; `w = d·q + m`). Byte `j` holds
/// element `j` (low nibble) and `j + 16`; bit `i` of the u32 is element `i`'s fifth bit.
fn legacy_dot<const FIFTH: bool, const OFFSET: bool>(
    rows: &[u8],
    row_bytes: usize,
    x: &Activations,
) -> f32 {
    let (qh_at, qs_at) = legacy_layout(FIFTH, OFFSET);
    let zero = legacy_zero(FIFTH, OFFSET);
    let mut acc = [0.0f32; 8];
    let mut offsets = 0.0f32;
    for (b, block) in rows[..row_bytes].chunks_exact(qs_at + 16).enumerate() {
        if b % 8 == 0 {
            prefetch_ahead(rows, b * (qs_at + 16), 8 * (qs_at + 16));
        }
        let qh = if FIFTH {
            u32::from_le_bytes(block[qh_at..qh_at + 4].try_into().expect("4 bytes"))
        } else {
            0
        };
        let qs = &block[qs_at..qs_at + 16];
        let w: [i16; 32] = std::array::from_fn(|k| {
            let q = (qs[k % 16] >> (4 * (k / 16))) & 0x0f;
            i16::from(q) + 16 * ((qh >> k) & 1) as i16 - zero
        });
        let sums = lane_sums(&w, &x.q[BLOCK * b..BLOCK * (b + 1)]);
        accumulate(&mut acc, f16_at(block, 0) * x.dx[b], sums);
        if OFFSET {
            offsets = (f16_at(block, 2) * x.dx[b]).mul_add(x.sq[b], offsets);
        }
    }
    sum_8_lanes(acc) + offsets
}

/// The 4-bit non-linear types: IQ4_NL (`XS = false`: blocks of 32, f16 `d`, 16 bytes of
/// indices; `w = d·level[q]`) or IQ4_XS (`XS`: super-blocks of 256, f16 `d`, a u16 of the
/// scales' high bits, 4 bytes of their low nibbles, then per 32-element sub-block 16 bytes
/// of indices; `w = (d·(sc − 32))·level[q]`). Byte `k` of a block's indices holds element
/// `k` (low nibble) and `k + 16`.
fn iq4_dot<const XS: bool>(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
    let (unit_bytes, subs) = iq4_layout(XS);
    let mut acc = [0.0f32; 8];
    for (u, unit) in rows[..row_bytes].chunks_exact(unit_bytes).enumerate() {
        prefetch_ahead(rows, u * unit_bytes, unit_bytes);
        let d = f16_at(unit, 0);
        for j in 0..subs {
            let (sc, qs) = if XS {
                (f32::from(iq4_xs_scale(unit, j)), &unit[8 + 16 * j..])
            } else {
                (1.0, &unit[2..])
            };
            let w: [i16; 32] = std::array::from_fn(|k| {
                i16::from(IQ4_LEVELS[usize::from((qs[k % 16] >> (4 * (k / 16))) & 0x0f)])
            });
            let b = subs * u + j;
            let sums = lane_sums(&w, &x.q[BLOCK * b..BLOCK * (b + 1)]);
            accumulate(&mut acc, d * sc * x.dx[b], sums);
        }
    }
    sum_8_lanes(acc)
}

/// An IQ4_NL block's or IQ4_XS super-block's bytes, and its 32-element blocks.
const fn iq4_layout(xs: bool) -> (usize, usize) {
    if xs {
        (136, 8)
    } else {
        (18, 1)
    }
}

/// IQ4_XS sub-block `j`'s scale, less 32: its low nibble from byte `4 + j/2`, its high two
/// bits from the u16 at byte 2.
fn iq4_xs_scale(unit: &[u8], j: usize) -> i8 {
    let high = u16::from_le_bytes([unit[2], unit[3]]);
    let low = (unit[4 + j / 2] >> (4 * (j % 2))) & 0x0f;
    (low | ((((high >> (2 * j)) & 3) as u8) << 4)) as i8 - 32
}

/// Where a legacy block's fifth bits and nibbles start.
const fn legacy_layout(fifth: bool, offset: bool) -> (usize, usize) {
    match (fifth, offset) {
        (false, _) => (2, 2),
        (true, false) => (2, 6),
        (true, true) => (4, 8),
    }
}

/// What a legacy type subtracts from its quants (Q5_1 adds its offset instead).
const fn legacy_zero(fifth: bool, offset: bool) -> i16 {
    match (fifth, offset) {
        (_, true) => 0,
        (true, false) => 16,
        (false, false) => 8,
    }
}

/// The products in AVX2, chosen at run time where the CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use quench_models::dequant::{unpack_k_scales, unpack_q3_k_scales};
    use quench_models::GgmlType;

    use super::{iq4_layout, iq4_xs_scale, legacy_layout, legacy_zero, Activations, BLOCK};
    use crate::blocks::{f16_at, sum_8_lanes};
    use crate::prefetch::prefetch_ahead;
    use quench_models::dequant::IQ4_LEVELS;

    pub(super) fn dot_rows(
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        x: &Activations,
        out: &mut [f32],
    ) {
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            // SAFETY: the CPU has AVX2, FMA and F16C, the function's only requirements.
            unsafe { dot_rows_avx2(ty, rows, row_bytes, x, out) }
        } else {
            super::dot_rows_portable(ty, rows, row_bytes, x, out)
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_rows_avx2(
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        x: &Activations,
        out: &mut [f32],
    ) {
        for (r, o) in out.iter_mut().enumerate() {
            let row = &rows[r * row_bytes..];
            *o = per_type!(ty, row, row_bytes, x);
        }
    }

    /// 32 bytes from `bytes[at..]`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn load32(bytes: &[u8], at: usize) -> __m256i {
        assert!(at + 32 <= bytes.len());
        // SAFETY: the 32 bytes are in bounds (checked); the load is unaligned.
        unsafe { _mm256_loadu_si256(bytes[at..].as_ptr().cast()) }
    }

    /// Block `b`'s 32 activation quants, as two registers of 16.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn activations(x: &Activations, b: usize) -> (__m256i, __m256i) {
        let q = &x.q[BLOCK * b..BLOCK * (b + 1)];
        // SAFETY: `q` holds 32 i16, two 256-bit loads' worth; the loads are unaligned.
        unsafe {
            (
                _mm256_loadu_si256(q.as_ptr().cast()),
                _mm256_loadu_si256(q[16..].as_ptr().cast()),
            )
        }
    }

    /// 32 weights (bytes, unsigned) times a block's activations: eight lanes of exact sums,
    /// as f32.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn unsigned_block(w: __m256i, (xa, xb): (__m256i, __m256i)) -> __m256 {
        let wa = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(w));
        let wb = _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(w));
        _mm256_cvtepi32_ps(_mm256_add_epi32(
            _mm256_madd_epi16(wa, xa),
            _mm256_madd_epi16(wb, xb),
        ))
    }

    /// 32 weights (bytes, signed) times a block's activations: eight lanes of exact sums,
    /// as f32.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn signed_block(w: __m256i, (xa, xb): (__m256i, __m256i)) -> __m256 {
        let wa = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(w));
        let wb = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(w));
        _mm256_cvtepi32_ps(_mm256_add_epi32(
            _mm256_madd_epi16(wa, xa),
            _mm256_madd_epi16(wb, xb),
        ))
    }

    /// The lanes of `a`, then those of `b`.
    #[inline]
    #[target_feature(enable = "avx")]
    fn sixteen_lanes(a: __m256, b: __m256) -> [f32; 16] {
        let mut l = [0.0f32; 16];
        l[..8].copy_from_slice(&lanes(a));
        l[8..].copy_from_slice(&lanes(b));
        l
    }

    /// 32 weights as signed bytes times a block's activations, each 16's eight lanes of
    /// exact sums scaled by its own factor (`scales[0]` the first 16's) and added to `acc`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn scaled_sixteens(
        w: __m256i,
        (xa, xb): (__m256i, __m256i),
        scales: [f32; 2],
        acc: __m256,
    ) -> __m256 {
        let halves = [
            (_mm256_castsi256_si128(w), xa),
            (_mm256_extracti128_si256::<1>(w), xb),
        ];
        let mut acc = acc;
        for ((w, xs), scale) in halves.into_iter().zip(scales) {
            let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_cvtepi8_epi16(w), xs));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), sums, acc);
        }
        acc
    }

    /// The eight accumulators summed as [`sum_8_lanes`].
    #[inline]
    #[target_feature(enable = "avx2")]
    fn sum(acc: __m256) -> f32 {
        sum_8_lanes(lanes(acc))
    }

    /// Eight bytes from `bytes[at..]` as f32 lanes, unsigned.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn u8_lanes(bytes: &[u8], at: usize) -> __m256 {
        let v = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)))
    }

    /// Eight bytes from `bytes[at..]` as f32 lanes, signed.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn i8_lanes(bytes: &[u8], at: usize) -> __m256 {
        let v = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(v as i64)))
    }

    /// Super-block `u`'s eight activation steps.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn steps(x: &Activations, u: usize) -> __m256 {
        let dx = &x.dx[8 * u..8 * u + 8];
        // SAFETY: `dx` holds 8 f32, as an unaligned 256-bit load reads.
        unsafe { _mm256_loadu_ps(dx.as_ptr()) }
    }

    /// The lanes of `v`, to be read one at a time.
    #[inline]
    #[target_feature(enable = "avx")]
    fn lanes(v: __m256) -> [f32; 8] {
        let mut l = [0.0f32; 8];
        // SAFETY: `l` holds 8 f32, as an unaligned 256-bit store writes.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), v) };
        l
    }

    #[target_feature(enable = "avx2,fma")]
    fn q45_k_dot<const FIFTH: bool>(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
        let block_bytes = if FIFTH { 176 } else { 144 };
        let nibble = _mm256_set1_epi8(0x0f);
        let one = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_ps();
        let mut mins_part = _mm256_setzero_ps();
        for (u, block) in rows[..row_bytes].chunks_exact(block_bytes).enumerate() {
            prefetch_ahead(rows, u * block_bytes, block_bytes);
            let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
            let (scales, mins) = unpack_k_scales(block[4..16].try_into().expect("12 bytes"));
            // Each sub-block's `fl(d·sc)·dx` and `fl(dmin·m)·dx`, eight at a time.
            let dx = steps(x, u);
            let scale = lanes(_mm256_mul_ps(
                _mm256_mul_ps(_mm256_set1_ps(d), u8_lanes(&scales, 0)),
                dx,
            ));
            let min = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), u8_lanes(&mins, 0)), dx);
            let sq = &x.sq[8 * u..8 * u + 8];
            // SAFETY: `sq` holds 8 f32, as an unaligned 256-bit load reads.
            mins_part = _mm256_fmadd_ps(min, unsafe { _mm256_loadu_ps(sq.as_ptr()) }, mins_part);
            let qh = if FIFTH {
                load32(block, 16)
            } else {
                _mm256_setzero_si256()
            };
            for p in 0..4 {
                let bytes = load32(block, block_bytes - 128 + 32 * p);
                let halves = [
                    _mm256_and_si256(bytes, nibble),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(bytes), nibble),
                ];
                for (half, mut w) in halves.into_iter().enumerate() {
                    let j = 2 * p + half;
                    if FIFTH {
                        let bit = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32));
                        w = _mm256_or_si256(w, _mm256_slli_epi16::<4>(_mm256_and_si256(bit, one)));
                    }
                    let sums = unsigned_block(w, activations(x, 8 * u + j));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(scale[j]), sums, acc);
                }
            }
        }
        sum(acc) - sum(mins_part)
    }

    #[target_feature(enable = "avx2,fma")]
    fn q6_k_dot(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
        let nibble = _mm256_set1_epi8(0x0f);
        let field = _mm256_set1_epi8(3);
        let offset = _mm256_set1_epi8(32);
        // Scales 2j and 2j + 1 both take block j's step.
        let (first, second) = (
            _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
            _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7),
        );
        let mut acc = _mm256_setzero_ps();
        for (u, block) in rows[..row_bytes].chunks_exact(210).enumerate() {
            prefetch_ahead(rows, u * 210, 210);
            let d = _mm256_set1_ps(f16_at(block, 208));
            // Each 16's `fl(d·sc)·dx`, eight at a time.
            let dx = steps(x, u);
            let scale = |at: usize, steps: __m256i| {
                let sc = _mm256_mul_ps(d, i8_lanes(block, 192 + at));
                _mm256_mul_ps(sc, _mm256_permutevar8x32_ps(dx, steps))
            };
            let scales = sixteen_lanes(scale(0, first), scale(8, second));
            for j in 0..8 {
                let (h, e) = (j / 4, 32 * (j % 4));
                let ql = load32(block, 64 * h + e % 64);
                let low = if e < 64 {
                    _mm256_and_si256(ql, nibble)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql), nibble)
                };
                let qh = load32(block, 128 + 32 * h);
                let high = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * (j % 4) as i32)),
                    field,
                );
                let w = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16::<4>(high)), offset);
                let sixteens = [scales[2 * j], scales[2 * j + 1]];
                acc = scaled_sixteens(w, activations(x, 8 * u + j), sixteens, acc);
            }
        }
        sum(acc)
    }

    /// Q2_K, in the order of the portable `q2_k_dot`.
    #[target_feature(enable = "avx2,fma")]
    fn q2_k_dot(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
        let (nibble, crumb) = (_mm_set1_epi8(0x0f), _mm256_set1_epi8(3));
        let (first, second) = (
            _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
            _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7),
        );
        let mut acc = _mm256_setzero_ps();
        let mut mins_part = _mm256_setzero_ps();
        for (u, block) in rows[..row_bytes].chunks_exact(84).enumerate() {
            prefetch_ahead(rows, u * 84, 84);
            let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
            let dx = steps(x, u);
            let dxs = [
                _mm256_permutevar8x32_ps(dx, first),
                _mm256_permutevar8x32_ps(dx, second),
            ];
            assert!(16 <= block.len());
            // SAFETY: the 16 scale bytes are in bounds (checked); the load is unaligned.
            let packed = unsafe { _mm_loadu_si128(block.as_ptr().cast()) };
            let (sc, m) = (
                _mm_and_si128(packed, nibble),
                _mm_and_si128(_mm_srli_epi16::<4>(packed), nibble),
            );
            let as_f32 = |v: __m128i| {
                [
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)),
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v))),
                ]
            };
            let (sc, m) = (as_f32(sc), as_f32(m));
            let sq16 = &x.sq16[16 * u..16 * u + 16];
            let mut halves = [_mm256_setzero_ps(); 2];
            for i in 0..2 {
                let min = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), m[i]), dxs[i]);
                // SAFETY: `sq16[8i..]` holds 8 f32, as an unaligned 256-bit load reads.
                let sums = unsafe { _mm256_loadu_ps(sq16[8 * i..].as_ptr()) };
                mins_part = _mm256_fmadd_ps(min, sums, mins_part);
                halves[i] = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), sc[i]), dxs[i]);
            }
            let scales = sixteen_lanes(halves[0], halves[1]);
            for j in 0..8 {
                let bytes = load32(block, 16 + 32 * (j / 4));
                let shift = _mm_cvtsi32_si128(2 * (j % 4) as i32);
                let w = _mm256_and_si256(_mm256_srl_epi16(bytes, shift), crumb);
                let sixteens = [scales[2 * j], scales[2 * j + 1]];
                acc = scaled_sixteens(w, activations(x, 8 * u + j), sixteens, acc);
            }
        }
        sum(acc) - sum(mins_part)
    }

    /// Q3_K, in the order of the portable `q3_k_dot`.
    #[target_feature(enable = "avx2,fma")]
    fn q3_k_dot(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
        let (crumb, one, four) = (
            _mm256_set1_epi8(3),
            _mm256_set1_epi8(1),
            _mm256_set1_epi8(4),
        );
        let (first, second) = (
            _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3),
            _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7),
        );
        let mut acc = _mm256_setzero_ps();
        for (u, block) in rows[..row_bytes].chunks_exact(110).enumerate() {
            prefetch_ahead(rows, u * 110, 110);
            let d = _mm256_set1_ps(f16_at(block, 108));
            let dx = steps(x, u);
            let sc =
                unpack_q3_k_scales(block[96..108].try_into().expect("12 bytes")).map(|v| v as u8);
            let scales = sixteen_lanes(
                _mm256_mul_ps(
                    _mm256_mul_ps(d, i8_lanes(&sc, 0)),
                    _mm256_permutevar8x32_ps(dx, first),
                ),
                _mm256_mul_ps(
                    _mm256_mul_ps(d, i8_lanes(&sc, 8)),
                    _mm256_permutevar8x32_ps(dx, second),
                ),
            );
            let hmask = load32(block, 0);
            for j in 0..8 {
                let bytes = load32(block, 32 + 32 * (j / 4));
                let low = _mm256_and_si256(
                    _mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * (j % 4) as i32)),
                    crumb,
                );
                let high =
                    _mm256_and_si256(_mm256_srl_epi16(hmask, _mm_cvtsi32_si128(j as i32)), one);
                let w = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16::<2>(high)), four);
                let sixteens = [scales[2 * j], scales[2 * j + 1]];
                acc = scaled_sixteens(w, activations(x, 8 * u + j), sixteens, acc);
            }
        }
        sum(acc)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn legacy_dot<const FIFTH: bool, const OFFSET: bool>(
        rows: &[u8],
        row_bytes: usize,
        x: &Activations,
    ) -> f32 {
        let (qh_at, qs_at) = legacy_layout(FIFTH, OFFSET);
        let nibble = _mm_set1_epi8(0x0f);
        let zero = _mm256_set1_epi8(legacy_zero(FIFTH, OFFSET) as i8);
        // Byte k of 32 takes byte k / 8 of the fifth bits and tests its bit k % 8.
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let sixteen = _mm256_set1_epi8(16);
        let mut acc = _mm256_setzero_ps();
        let mut offsets = 0.0f32;
        let block_bytes = qs_at + 16;
        // Eight blocks at a time: their scales `fl(d·dx)` formed together.
        for (g, group) in rows[..row_bytes].chunks(8 * block_bytes).enumerate() {
            prefetch_ahead(rows, g * 8 * block_bytes, 8 * block_bytes);
            let (first, n) = (8 * g, group.len() / block_bytes);
            let dx = group_steps(x, first, n);
            let scales = f16_times_steps(group, block_bytes, 0, dx);
            // Q5_1's offsets `fl(m·dx)`.
            let offset_steps = if OFFSET {
                f16_times_steps(group, block_bytes, 2, dx)
            } else {
                [0.0; 8]
            };
            let quants = x.q[BLOCK * first..].chunks_exact(BLOCK);
            for (k, (block, q)) in group.chunks_exact(block_bytes).zip(quants).enumerate() {
                assert!(block_bytes <= block.len());
                // SAFETY: the block's 16 quant bytes are in bounds (checked); the load is
                // unaligned.
                let qs = unsafe { _mm_loadu_si128(block[qs_at..].as_ptr().cast()) };
                // The 32 quants as bytes in element order: low nibbles, then high.
                let mut w = _mm256_set_m128i(
                    _mm_and_si128(_mm_srli_epi16::<4>(qs), nibble),
                    _mm_and_si128(qs, nibble),
                );
                if FIFTH {
                    let qh =
                        u32::from_le_bytes(block[qh_at..qh_at + 4].try_into().expect("4 bytes"));
                    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
                    w = _mm256_or_si256(w, _mm256_and_si256(set, sixteen));
                }
                w = _mm256_sub_epi8(w, zero);
                // SAFETY: `q` holds 32 i16, two 256-bit loads' worth; the loads are unaligned.
                let (xa, xb) = unsafe {
                    (
                        _mm256_loadu_si256(q.as_ptr().cast()),
                        _mm256_loadu_si256(q[16..].as_ptr().cast()),
                    )
                };
                acc = _mm256_fmadd_ps(_mm256_set1_ps(scales[k]), signed_block(w, (xa, xb)), acc);
                if OFFSET {
                    offsets = offset_steps[k].mul_add(x.sq[first + k], offsets);
                }
            }
        }
        sum(acc) + offsets
    }

    /// Blocks `first .. first + n` (n ≤ 8) steps, zero past `n`.
    fn group_steps(x: &Activations, first: usize, n: usize) -> [f32; 8] {
        let mut dx = [0.0f32; 8];
        dx[..n].copy_from_slice(&x.dx[first..first + n]);
        dx
    }

    /// The f16 at byte `at` of each of a group's (up to) eight blocks of `block_bytes`, times
    /// its step in `dx`: eight products `fl(h·dx)` at once.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    fn f16_times_steps(group: &[u8], block_bytes: usize, at: usize, dx: [f32; 8]) -> [f32; 8] {
        let mut h = [0u16; 8];
        for (h, block) in h.iter_mut().zip(group.chunks_exact(block_bytes)) {
            *h = u16::from_le_bytes([block[at], block[at + 1]]);
        }
        // SAFETY: `h` holds 8 u16 and `dx` 8 f32, as the unaligned loads read.
        lanes(unsafe {
            _mm256_mul_ps(
                _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast())),
                _mm256_loadu_ps(dx.as_ptr()),
            )
        })
    }

    /// IQ4_NL and IQ4_XS, in the order of the portable `iq4_dot`: each byte's two indices
    /// looked up in the 16 levels by a byte shuffle. Eight 32-element blocks at a time (an
    /// IQ4_XS super-block, or eight IQ4_NL blocks), their scales formed together.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn iq4_dot<const XS: bool>(rows: &[u8], row_bytes: usize, x: &Activations) -> f32 {
        let (unit_bytes, subs) = iq4_layout(XS);
        let group_bytes = 8 * unit_bytes / subs;
        let nibble = _mm_set1_epi8(0x0f);
        // SAFETY: the 16 levels are 16 bytes, as the unaligned load reads.
        let levels = unsafe { _mm_loadu_si128(IQ4_LEVELS.as_ptr().cast()) };
        let mut acc = _mm256_setzero_ps();
        for (g, group) in rows[..row_bytes].chunks(group_bytes).enumerate() {
            prefetch_ahead(rows, g * group_bytes, group_bytes);
            let (first, n) = (8 * g, group.len() * subs / unit_bytes);
            let dx = group_steps(x, first, n);
            let scales = if XS {
                // `fl(fl(d·sc)·dx)`, as the portable code rounds it (`d·sc` is exact).
                let sc: [f32; 8] = std::array::from_fn(|j| f32::from(iq4_xs_scale(group, j)));
                // SAFETY: `sc` and `dx` hold 8 f32, as the unaligned loads read.
                lanes(unsafe {
                    _mm256_mul_ps(
                        _mm256_mul_ps(
                            _mm256_set1_ps(f16_at(group, 0)),
                            _mm256_loadu_ps(sc.as_ptr()),
                        ),
                        _mm256_loadu_ps(dx.as_ptr()),
                    )
                })
            } else {
                f16_times_steps(group, unit_bytes, 0, dx)
            };
            for (k, scale) in scales.into_iter().enumerate().take(n) {
                let at = if XS { 8 + 16 * k } else { unit_bytes * k + 2 };
                assert!(at + 16 <= group.len());
                // SAFETY: the 16 index bytes are in bounds (checked); the load is unaligned.
                let qs = unsafe { _mm_loadu_si128(group[at..].as_ptr().cast()) };
                // The 32 weights as signed bytes in element order: low nibbles, then high.
                let w = _mm256_set_m128i(
                    _mm_shuffle_epi8(levels, _mm_and_si128(_mm_srli_epi16::<4>(qs), nibble)),
                    _mm_shuffle_epi8(levels, _mm_and_si128(qs, nibble)),
                );
                let sums = signed_block(w, activations(x, first + k));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), sums, acc);
            }
        }
        sum(acc)
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use quench_models::GgmlType;

    use super::Activations;

    pub(super) fn dot_rows(
        ty: GgmlType,
        rows: &[u8],
        row_bytes: usize,
        x: &Activations,
        out: &mut [f32],
    ) {
        super::dot_rows_portable(ty, rows, row_bytes, x, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quench_models::dequant::{dequantize, f32_to_f16};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Elements of a super-block.
    const QK_K: usize = 256;

    const TYPES: [GgmlType; 10] = [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ];

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
                GgmlType::Q2_K => {
                    half(80);
                    half(82);
                }
                GgmlType::Q3_K => half(108),
                GgmlType::Q6_K => half(208),
                GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => half(0),
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
    /// `m` or zero point `z·d`; 0 for Q3_K, Q6_K and the IQ4 types), so that the bound covers both terms of
    /// `scale·q − offset`.
    fn offset_terms(ty: GgmlType, bytes: &[u8]) -> Vec<f64> {
        let mut out = Vec::new();
        for block in bytes.chunks_exact(ty.type_size() as usize) {
            let d = f64::from(f16_at(block, 0)).abs();
            match ty {
                GgmlType::Q2_K => {
                    let dmin = f64::from(f16_at(block, 82)).abs();
                    for j in 0..QK_K {
                        out.push(dmin * f64::from(block[j / 16] >> 4));
                    }
                }
                GgmlType::Q3_K | GgmlType::Q6_K | GgmlType::IQ4_XS => out.extend([0.0; QK_K]),
                GgmlType::IQ4_NL => out.extend([0.0; 32]),
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
        out
    }

    /// Activations of several magnitudes per block, some blocks all zero, some with one
    /// large outlier.
    fn random_activations(rng: &mut ChaCha8Rng, cols: usize) -> Vec<f32> {
        let mut x = Vec::with_capacity(cols);
        for _ in 0..cols / BLOCK {
            let scale = 10f32.powi(rng.gen_range(-3..3));
            let kind = rng.gen_range(0..8);
            for k in 0..BLOCK {
                x.push(match kind {
                    0 => 0.0,
                    1 if k == 7 => 300.0 * scale,
                    _ => rng.gen_range(-1.0f32..1.0) * scale,
                });
            }
        }
        x
    }

    /// `Σ_i w_i·x_i` against f64 of the rows as quench-models expands them (bit for bit what
    /// the `gguf` package gives): within what rounding the activations to 16 bits moves
    /// them (`(½ + 2^-7)·dx` per element, times `|w|`) plus f32 rounding of the sums of
    /// absolute terms; the vector code equal to the portable code bit for bit, from row
    /// blocks not starting at 0.
    #[test]
    fn row_products_match_f64_within_the_activations_rounding() {
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        for ty in TYPES {
            // Legacy rows of 27 blocks: eight at a time leaves a part group of three.
            let cols = if ty.block_size() == 32 { 864 } else { 768 };
            let rows = 23;
            let bytes = random_rows(&mut rng, ty, rows, cols);
            let w = dequantize(ty, &bytes, rows * cols).unwrap();
            let offsets = offset_terms(ty, &bytes);
            let x = random_activations(&mut rng, cols);
            let ax = Activations::of(&x);
            let row_bytes = bytes.len() / rows;
            let mut portable = vec![f32::NAN; rows];
            dot_rows_portable(ty, &bytes, row_bytes, &ax, &mut portable);
            let mut dispatched = vec![f32::NAN; rows];
            dot_rows(
                ty,
                &bytes[..5 * row_bytes],
                row_bytes,
                &ax,
                &mut dispatched[..5],
            );
            dot_rows(
                ty,
                &bytes[5 * row_bytes..],
                row_bytes,
                &ax,
                &mut dispatched[5..],
            );
            assert_eq!(
                portable.map_bits(),
                dispatched.map_bits(),
                "{ty:?}: the vector code differs from the portable code"
            );
            for r in 0..rows {
                let (row, row_offsets) = (&w[r * cols..(r + 1) * cols], &offsets[r * cols..]);
                let mut exact = 0.0f64;
                let mut moved = 0.0f64;
                let mut magnitude = 0.0f64;
                for (k, ((&a, &b), &o)) in row.iter().zip(&x).zip(row_offsets).enumerate() {
                    let (a, b) = (f64::from(a), f64::from(b));
                    exact += a * b;
                    moved += (a.abs() + 2.0 * o) * (0.5 + 1.0 / 128.0) * f64::from(ax.dx[k / 32]);
                    magnitude += (a.abs() + 2.0 * o) * b.abs();
                }
                let bound = moved + 1e-5 * magnitude + 1e-30;
                let err = (f64::from(portable[r]) - exact).abs();
                assert!(
                    err <= bound,
                    "{ty:?} row {r}: {} vs {exact} (bound {bound})",
                    portable[r]
                );
            }
        }
    }

    /// The bound above is tight enough to notice 8-bit activations: rounding them to 8 bits
    /// (a step of `max|x|/127`) before the products breaks it on every type.
    #[test]
    fn eight_bit_activations_break_the_bound() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for ty in TYPES {
            let (rows, cols) = (8, 512);
            let bytes = random_rows(&mut rng, ty, rows, cols);
            let w = dequantize(ty, &bytes, rows * cols).unwrap();
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
            let exact = Activations::of(&x);
            let mut coarse = Activations::of(&x);
            for (b, q) in coarse.q.chunks_exact_mut(BLOCK).enumerate() {
                for v in q.iter_mut() {
                    *v = (f32::from(*v) / 258.0).round() as i16 * 258;
                }
                coarse.sq[b] = q.iter().map(|&v| f32::from(v)).sum();
            }
            let row_bytes = bytes.len() / rows;
            let mut got = vec![0.0f32; rows];
            dot_rows(ty, &bytes, row_bytes, &coarse, &mut got);
            let worst = (0..rows)
                .map(|r| {
                    let row = &w[r * cols..(r + 1) * cols];
                    let want: f64 = row
                        .iter()
                        .zip(&x)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    let moved: f64 = row
                        .iter()
                        .enumerate()
                        .map(|(k, &a)| {
                            f64::from(a).abs() * (0.5 + 1.0 / 128.0) * f64::from(exact.dx[k / 32])
                        })
                        .sum();
                    (f64::from(got[r]) - want).abs() / moved
                })
                .fold(0.0f64, f64::max);
            assert!(
                worst > 1.0,
                "{ty:?}: 8-bit activations stayed within the bound ({worst})"
            );
        }
    }

    trait MapBits {
        fn map_bits(&self) -> Vec<u32>;
    }

    impl MapBits for Vec<f32> {
        fn map_bits(&self) -> Vec<u32> {
            self.iter().map(|v| v.to_bits()).collect()
        }
    }
}
