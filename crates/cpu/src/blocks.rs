//! Weight matrices kept in ggml's 32-element block formats (Q4_1, Q8_0) and multiplied as
//! they are.
//!
//! Decoding one token reads every weight once, so its speed on a CPU is set by how many bytes
//! that is: a Q4_1 matrix is a fifth of its f32 expansion, Q8_0 a quarter. The activations stay
//! f32; only the weights stay compressed. Scales are stored apart from the quantized values,
//! already converted from f16 (exactly), so that the inner loops are plain vector code.

use quench_models::GgmlType;

use crate::error::{CpuError, Result};
use crate::prefetch::prefetch;
use crate::q8::{Q8Kind, Q8Row, BLOCK};
use quench_models::arch::ArchError;

/// The block formats kept as blocks; other types are expanded to f32 when loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// `w = d·q + m`, `q` unsigned 4-bit: byte `j` holds element `j` (low nibble) and
    /// element `j + 16` (high nibble).
    Q4_1,
    /// `w = q·d`, `q` a signed byte.
    Q8_0,
}

impl Format {
    /// The format tensors of `ty` are kept in, if they are kept as blocks.
    fn of(ty: GgmlType) -> Option<Format> {
        match ty {
            GgmlType::Q4_1 => Some(Format::Q4_1),
            GgmlType::Q8_0 => Some(Format::Q8_0),
            _ => None,
        }
    }

    /// Bytes held per block: the scale (and Q4_1's offset) as f32, and the quantized values.
    fn held_bytes(self) -> usize {
        let scales = match self {
            Format::Q4_1 => 8,
            Format::Q8_0 => 4,
        };
        scales + self.quant_bytes()
    }

    /// Bytes of quantized values per block (what remains after the scales are taken out).
    fn quant_bytes(self) -> usize {
        match self {
            Format::Q4_1 => 16,
            Format::Q8_0 => 32,
        }
    }
}

/// A `[rows, cols]` weight matrix in a block format.
#[derive(Clone, Debug)]
pub(crate) struct BlockMatrix {
    format: Format,
    rows: usize,
    cols: usize,
    /// `d` of each block, row after row.
    scales: Vec<f32>,
    /// `m` of each block (Q4_1); empty for Q8_0.
    offsets: Vec<f32>,
    /// The quantized values of each block, as ggml stores them.
    quants: Vec<u8>,
}

/// The little-endian f16 at byte `at`, as f32.
#[inline]
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    quench_models::dequant::f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

impl BlockMatrix {
    /// The tensor `name` of ggml type `ty` as a block matrix, or `None` when `ty` is not a
    /// format kept as blocks. `bytes` must hold exactly `rows · cols` elements.
    pub(crate) fn from_ggml(
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Option<Self>> {
        let Some(format) = Format::of(ty) else {
            return Ok(None);
        };
        let block_bytes = ty.type_size() as usize;
        let blocks = rows * cols / BLOCK;
        if !cols.is_multiple_of(BLOCK) || bytes.len() != blocks * block_bytes {
            return Err(CpuError::from(ArchError::Tensor {
                name: name.to_owned(),
                source: format!(
                    "{} bytes of {} do not make [{rows}, {cols}] in whole rows of blocks",
                    bytes.len(),
                    ty.name()
                )
                .into(),
            }));
        }
        let mut m = BlockMatrix {
            format,
            rows,
            cols,
            scales: Vec::with_capacity(blocks),
            offsets: Vec::new(),
            quants: Vec::with_capacity(blocks * format.quant_bytes()),
        };
        for block in bytes.chunks_exact(block_bytes) {
            m.scales.push(f16_at(block, 0));
            let quants_at = match format {
                Format::Q4_1 => {
                    m.offsets.push(f16_at(block, 2));
                    4
                }
                Format::Q8_0 => 2,
            };
            m.quants.extend_from_slice(&block[quants_at..]);
        }
        Ok(Some(m))
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes held: the scales and offsets (as f32) and the quantized values.
    pub(crate) fn held_bytes(&self) -> usize {
        self.scales.len() * self.format.held_bytes()
    }

    /// What a matrix of `elements` elements of `ty` holds when kept as blocks; `None` for a
    /// type not kept as blocks.
    pub(crate) fn held_bytes_for(ty: GgmlType, elements: u64) -> Option<u64> {
        Format::of(ty).map(|f| elements / BLOCK as u64 * f.held_bytes() as u64)
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    fn row_blocks(&self, r: usize) -> std::ops::Range<usize> {
        let per_row = self.cols / BLOCK;
        r * per_row..(r + 1) * per_row
    }

    fn row_quants(&self, r: usize) -> &[u8] {
        let q = self.format.quant_bytes();
        let b = self.row_blocks(r);
        &self.quants[b.start * q..b.end * q]
    }

    /// Row `r` as f32, computed as quench-models' dequantization computes it (bit for bit).
    pub(crate) fn dequant_row(&self, r: usize, out: &mut [f32]) {
        assert_eq!(out.len(), self.cols, "dequant_row: output width");
        let b = self.row_blocks(r);
        let quants = self.row_quants(r);
        let q = self.format.quant_bytes();
        for (i, out) in out.chunks_exact_mut(BLOCK).enumerate() {
            let (d, qs) = (self.scales[b.start + i], &quants[i * q..(i + 1) * q]);
            match self.format {
                Format::Q4_1 => {
                    let m = self.offsets[b.start + i];
                    for j in 0..16 {
                        out[j] = d * f32::from(qs[j] & 0x0f) + m;
                        out[j + 16] = d * f32::from(qs[j] >> 4) + m;
                    }
                }
                Format::Q8_0 => {
                    for (o, &v) in out.iter_mut().zip(qs) {
                        *o = f32::from(v as i8) * d;
                    }
                }
            }
        }
    }

    /// `out[i] = Σ_k w[first + i][k]·x[k]`, with `x_sums[b]` the sum of `x` over block `b`
    /// (see [`block_sums`]).
    pub(crate) fn dot_rows(&self, first: usize, x: &[f32], x_sums: &[f32], out: &mut [f32]) {
        assert_eq!(x.len(), self.cols, "dot_rows: input width");
        assert_eq!(x_sums.len(), self.cols / BLOCK, "dot_rows: block sums");
        assert!(
            first + out.len() <= self.rows,
            "dot_rows: rows out of range"
        );
        simd::dot_rows(self, first, x, x_sums, out)
    }

    /// The 8-bit blocks llama.cpp's CPU path rounds activations to before multiplying them
    /// by this matrix.
    pub(crate) fn activation_kind(&self) -> Q8Kind {
        match self.format {
            Format::Q4_1 => Q8Kind::Q8_1,
            Format::Q8_0 => Q8Kind::Q8_0,
        }
    }

    /// `out[i] = Σ_k w[first + i][k]·x[k]` computed as llama.cpp's CPU path computes it from
    /// `x` in 8-bit blocks (of [`Self::activation_kind`]): see [`q8_dot`].
    pub(crate) fn dot_rows_q8(&self, first: usize, x: &Q8Row, out: &mut [f32]) {
        let blocks = self.cols / BLOCK;
        assert_eq!(x.scales.len(), blocks, "dot_rows_q8: input width");
        assert_eq!(
            x.sums.len(),
            if self.format == Format::Q4_1 {
                blocks
            } else {
                0
            },
            "dot_rows_q8: input blocks of the wrong kind"
        );
        assert!(
            first + out.len() <= self.rows,
            "dot_rows_q8: rows out of range"
        );
        simd::dot_rows_q8(self, first, x, out)
    }

    /// `out[r·n + t] = Σ_k w[first + r][k]·xs[t·cols + k]`: rows `first, first + 1, …` times
    /// each of the `n` inputs in `xs`. Each row is expanded once (as [`Self::dequant_row`])
    /// and multiplied with every input while it is in cache.
    pub(crate) fn dot_rows_tokens(&self, first: usize, xs: &[f32], n: usize, out: &mut [f32]) {
        assert_eq!(xs.len(), n * self.cols, "dot_rows_tokens: input size");
        assert_eq!(out.len() % n.max(1), 0, "dot_rows_tokens: output size");
        assert!(
            first + out.len() / n.max(1) <= self.rows,
            "dot_rows_tokens: rows out of range"
        );
        simd::dot_rows_tokens(self, first, xs, n, out)
    }
}

/// The body of [`BlockMatrix::dot_rows_tokens`].
#[inline(always)]
fn dot_rows_tokens<const FMA: bool>(
    m: &BlockMatrix,
    first: usize,
    xs: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let k = m.cols;
    let mut row = vec![0.0f32; k];
    for (r, out_row) in out.chunks_mut(n).enumerate() {
        m.dequant_row(first + r, &mut row);
        for (o, x) in out_row.iter_mut().zip(xs.chunks_exact(k)) {
            *o = dot_f32::<FMA>(&row, x);
        }
    }
}

/// `Σ a·b` over equal lengths that are a multiple of 32, in 16 lanes.
#[inline(always)]
fn dot_f32<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for (x, y) in a.chunks_exact(16).zip(b.chunks_exact(16)) {
        for j in 0..16 {
            acc[j] = madd::<FMA>(x[j], y[j], acc[j]);
        }
    }
    sum_lanes(acc)
}

/// The body of [`BlockMatrix::dot_rows`], inlined into each instruction-set variant.
#[inline(always)]
fn dot_rows<const FMA: bool>(
    m: &BlockMatrix,
    first: usize,
    x: &[f32],
    x_sums: &[f32],
    out: &mut [f32],
) {
    for (i, o) in out.iter_mut().enumerate() {
        let r = first + i;
        let b = m.row_blocks(r);
        let quants = m.row_quants(r);
        if r + 1 < m.rows {
            prefetch(m.row_quants(r + 1));
        }
        *o = match m.format {
            Format::Q4_1 => q4_1_dot::<FMA>(&m.scales[b.clone()], &m.offsets[b], quants, x, x_sums),
            Format::Q8_0 => q8_0_dot::<FMA>(&m.scales[b], quants, x),
        };
    }
}

/// The body of [`BlockMatrix::dot_rows_q8`].
#[inline(always)]
fn dot_rows_q8(m: &BlockMatrix, first: usize, x: &Q8Row, out: &mut [f32]) {
    let xq: Vec<i16> = x.quants.iter().map(|&q| i16::from(q)).collect();
    for (i, o) in out.iter_mut().enumerate() {
        let r = first + i;
        let b = m.row_blocks(r);
        *o = q8_dot(m, b, m.row_quants(r), x, &xq);
    }
}

/// One weight row (blocks `b`, quantized values `quants`) times activations in 8-bit blocks
/// (`x`, its quants widened in `xq`), in the order of ggml's AVX2 kernels
/// (`ggml_vec_dot_q4_1_q8_1`, `ggml_vec_dot_q8_0_q8_0`): per block, eight exact integer sums
/// of four adjacent products, each added into its own f32 lane as `lane += (d_w·d_x)·sum`
/// (fused); the lanes summed as [`sum_8_lanes`] at the end. Q4_1 adds `Σ_b m_b·s_b` (fused, in
/// block order) to the lanes' total: its offsets times the activation blocks' stored sums.
#[inline(always)]
fn q8_dot(m: &BlockMatrix, b: std::ops::Range<usize>, quants: &[u8], x: &Q8Row, xq: &[i16]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let mut offset_part = 0.0f32;
    let quant_bytes = m.format.quant_bytes();
    for (i, (wq, xq)) in quants
        .chunks_exact(quant_bytes)
        .zip(xq.chunks_exact(BLOCK))
        .enumerate()
    {
        let mut w = [0i16; BLOCK];
        match m.format {
            Format::Q4_1 => {
                for j in 0..16 {
                    w[j] = i16::from(wq[j] & 0x0f);
                    w[j + 16] = i16::from(wq[j] >> 4);
                }
                offset_part = m.offsets[b.start + i].mul_add(x.sums[i], offset_part);
            }
            Format::Q8_0 => {
                for j in 0..BLOCK {
                    w[j] = i16::from(wq[j] as i8);
                }
            }
        }
        // Products of pairs, then pairs of pairs: exact in i32 (|w·x| ≤ 128·127).
        let mut pairs = [0i32; 16];
        for (p, pair) in pairs.iter_mut().enumerate() {
            *pair = i32::from(w[2 * p]) * i32::from(xq[2 * p])
                + i32::from(w[2 * p + 1]) * i32::from(xq[2 * p + 1]);
        }
        let d = m.scales[b.start + i] * x.scales[i];
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = d.mul_add((pairs[2 * l] + pairs[2 * l + 1]) as f32, *lane);
        }
    }
    sum_8_lanes(lanes) + offset_part
}

/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`: how ggml adds the eight lanes of an
/// AVX register.
pub(crate) fn sum_8_lanes(l: [f32; 8]) -> f32 {
    let h = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (h[0] + h[2]) + (h[1] + h[3])
}

/// The sum of `x` over each block of 32: Q4_1's offsets multiply these.
pub(crate) fn block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(BLOCK).map(|b| b.iter().sum()).collect()
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

#[inline(always)]
fn sum_lanes<const N: usize>(v: [f32; N]) -> f32 {
    v.iter().sum()
}

/// Q4_1: `Σ_b d_b·Σ_j q_bj·x_bj + Σ_b m_b·Σ_j x_bj`. Written with fixed-width lane arrays so
/// that the compiler turns each inner loop into a few vector instructions.
#[inline(always)]
fn q4_1_dot<const FMA: bool>(
    scales: &[f32],
    offsets: &[f32],
    quants: &[u8],
    x: &[f32],
    x_sums: &[f32],
) -> f32 {
    let mut acc = [0.0f32; 16];
    for ((qs, xb), &d) in quants
        .chunks_exact(16)
        .zip(x.chunks_exact(BLOCK))
        .zip(scales)
    {
        let mut t = [0.0f32; 16];
        for j in 0..16 {
            t[j] = f32::from(qs[j] & 0x0f) * xb[j];
        }
        for j in 0..16 {
            t[j] = madd::<FMA>(f32::from(qs[j] >> 4), xb[16 + j], t[j]);
        }
        for j in 0..16 {
            acc[j] = madd::<FMA>(d, t[j], acc[j]);
        }
    }
    let mut offset_part = 0.0f32;
    for (&m, &s) in offsets.iter().zip(x_sums) {
        offset_part = madd::<FMA>(m, s, offset_part);
    }
    sum_lanes(acc) + offset_part
}

/// Q8_0: `Σ_b d_b·Σ_j q_bj·x_bj`.
#[inline(always)]
fn q8_0_dot<const FMA: bool>(scales: &[f32], quants: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    for ((qs, xb), &d) in quants
        .chunks_exact(BLOCK)
        .zip(x.chunks_exact(BLOCK))
        .zip(scales)
    {
        let mut t = [0.0f32; 16];
        for j in 0..16 {
            t[j] = f32::from(qs[j] as i8) * xb[j];
        }
        for j in 0..16 {
            t[j] = madd::<FMA>(f32::from(qs[16 + j] as i8), xb[16 + j], t[j]);
        }
        for j in 0..16 {
            acc[j] = madd::<FMA>(d, t[j], acc[j]);
        }
    }
    sum_lanes(acc)
}

/// The loops compiled for AVX2 and FMA, chosen at run time where the CPU has them (the
/// portable build targets a baseline x86-64 without either).
#[cfg(target_arch = "x86_64")]
mod simd {
    use super::{BlockMatrix, Format, BLOCK};
    use crate::q8::Q8Row;

    #[target_feature(enable = "avx2,fma")]
    fn dot_rows_tokens_avx2(m: &BlockMatrix, first: usize, xs: &[f32], n: usize, out: &mut [f32]) {
        super::dot_rows_tokens::<true>(m, first, xs, n, out)
    }

    pub(super) fn dot_rows_tokens(
        m: &BlockMatrix,
        first: usize,
        xs: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, the only requirement of the function.
            unsafe { dot_rows_tokens_avx2(m, first, xs, n, out) }
        } else {
            super::dot_rows_tokens::<false>(m, first, xs, n, out)
        }
    }

    /// [`super::q8_dot`] for each row, its integer sums computed 32 products at a time:
    /// `maddubs` multiplies unsigned by signed bytes and adds adjacent pairs into i16 (exact:
    /// at most 2·128·127 in magnitude), `madd` with ones adds adjacent pairs of those into
    /// the eight i32 sums of four.
    #[target_feature(enable = "avx2,fma")]
    fn dot_rows_q8_avx2(m: &BlockMatrix, first: usize, x: &Q8Row, out: &mut [f32]) {
        use std::arch::x86_64::*;

        let ones = _mm256_set1_epi16(1);
        let low_nibbles = _mm_set1_epi8(0x0f);
        let quant_bytes = m.format.quant_bytes();
        for (i, o) in out.iter_mut().enumerate() {
            let r = first + i;
            let b = m.row_blocks(r);
            let blocks = m.row_quants(r).chunks_exact(quant_bytes);
            let mut lanes = _mm256_setzero_ps();
            let mut offset_part = 0.0f32;
            for (k, (wq, xq)) in blocks.zip(x.quants.chunks_exact(BLOCK)).enumerate() {
                // SAFETY: `xq` holds 32 bytes, as an unaligned 256-bit load reads.
                let xv = unsafe { _mm256_loadu_si256(xq.as_ptr().cast()) };
                let products = match m.format {
                    Format::Q4_1 => {
                        // SAFETY: a Q4_1 block's quants are 16 bytes.
                        let packed = unsafe { _mm_loadu_si128(wq.as_ptr().cast()) };
                        let low = _mm_and_si128(packed, low_nibbles);
                        let high = _mm_and_si128(_mm_srli_epi16::<4>(packed), low_nibbles);
                        offset_part = m.offsets[b.start + k].mul_add(x.sums[k], offset_part);
                        _mm256_maddubs_epi16(_mm256_set_m128i(high, low), xv)
                    }
                    Format::Q8_0 => {
                        // SAFETY: a Q8_0 block's quants are 32 bytes.
                        let wv = unsafe { _mm256_loadu_si256(wq.as_ptr().cast()) };
                        // |w| (unsigned) times x with w's sign: the same products.
                        let magnitude = _mm256_sign_epi8(wv, wv);
                        _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(xv, wv))
                    }
                };
                let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(products, ones));
                let d = _mm256_set1_ps(m.scales[b.start + k] * x.scales[k]);
                lanes = _mm256_fmadd_ps(d, sums, lanes);
            }
            let mut l = [0.0f32; 8];
            // SAFETY: `l` holds 8 f32, as an unaligned 256-bit store writes.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr(), lanes) };
            *o = super::sum_8_lanes(l) + offset_part;
        }
    }

    /// Exact either way: the same integer sums, and `mul_add` is fused without FMA too.
    pub(super) fn dot_rows_q8(m: &BlockMatrix, first: usize, x: &Q8Row, out: &mut [f32]) {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, the only requirement of the function.
            unsafe { dot_rows_q8_avx2(m, first, x, out) }
        } else {
            super::dot_rows_q8(m, first, x, out)
        }
    }

    #[target_feature(enable = "avx2,fma")]
    fn dot_rows_avx2(m: &BlockMatrix, first: usize, x: &[f32], xs: &[f32], out: &mut [f32]) {
        super::dot_rows::<true>(m, first, x, xs, out)
    }

    pub(super) fn dot_rows(m: &BlockMatrix, first: usize, x: &[f32], xs: &[f32], out: &mut [f32]) {
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, the only requirement of dot_rows_avx2.
            unsafe { dot_rows_avx2(m, first, x, xs, out) }
        } else {
            super::dot_rows::<false>(m, first, x, xs, out)
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod simd {
    use super::BlockMatrix;
    use crate::q8::Q8Row;

    pub(super) fn dot_rows_q8(m: &BlockMatrix, first: usize, x: &Q8Row, out: &mut [f32]) {
        super::dot_rows_q8(m, first, x, out)
    }

    pub(super) fn dot_rows(m: &BlockMatrix, first: usize, x: &[f32], xs: &[f32], out: &mut [f32]) {
        super::dot_rows::<false>(m, first, x, xs, out)
    }

    pub(super) fn dot_rows_tokens(
        m: &BlockMatrix,
        first: usize,
        xs: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        super::dot_rows_tokens::<false>(m, first, xs, n, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::q8::quantize_row;
    use quench_models::dequant::{dequantize, f32_to_f16};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Random blocks of `ty` for a `[rows, cols]` matrix: scales of either sign and several
    /// magnitudes, every quantized value possible.
    fn random_blocks(rng: &mut ChaCha8Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
        let mut bytes = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            let half = |rng: &mut ChaCha8Rng| {
                let v = rng.gen_range(-1.0f32..1.0) * 10f32.powi(rng.gen_range(-3..1));
                f32_to_f16(v).to_le_bytes()
            };
            bytes.extend(half(rng));
            if ty == GgmlType::Q4_1 {
                bytes.extend(half(rng));
            }
            let quant_bytes = if ty == GgmlType::Q4_1 { 16 } else { 32 };
            bytes.extend((0..quant_bytes).map(|_| rng.gen::<u8>()));
        }
        bytes
    }

    /// The `[rows, cols]` matrix of `ty` in `bytes`, and its weights as `quench_models`
    /// expands them.
    fn expanded(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> (BlockMatrix, Vec<f32>) {
        let w = dequantize(ty, bytes, rows * cols).unwrap();
        let m = BlockMatrix::from_ggml("w", ty, rows, cols, bytes)
            .unwrap()
            .unwrap();
        (m, w)
    }

    #[test]
    fn rows_expand_as_quench_models_dequantizes() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (rows, cols) = (5, 96);
            let bytes = random_blocks(&mut rng, ty, rows, cols);
            let (m, want) = expanded(ty, rows, cols, &bytes);
            for r in 0..rows {
                let mut got = vec![f32::NAN; cols];
                m.dequant_row(r, &mut got);
                let want_row = &want[r * cols..(r + 1) * cols];
                for (g, w) in got.iter().zip(want_row) {
                    assert_eq!(g.to_bits(), w.to_bits(), "{ty:?} row {r}");
                }
            }
        }
    }

    /// Every variant of the row products against the f64 products of the expanded weights,
    /// within f32 rounding of the sums of absolute terms.
    #[test]
    fn row_products_match_f64_of_the_expanded_weights() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (rows, cols) = (37, 160);
            let bytes = random_blocks(&mut rng, ty, rows, cols);
            let (m, w) = expanded(ty, rows, cols, &bytes);
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            let sums = block_sums(&x);
            let portable = {
                let mut out = vec![f32::NAN; rows];
                super::dot_rows::<false>(&m, 0, &x, &sums, &mut out);
                out
            };
            // A block of rows not starting at 0, through the dispatching entry point.
            let mut dispatched = vec![f32::NAN; rows];
            m.dot_rows(0, &x, &sums, &mut dispatched[..3]);
            m.dot_rows(3, &x, &sums, &mut dispatched[3..]);
            // Several inputs at once: `x` second of three, the others random.
            let other = |rng: &mut ChaCha8Rng| -> Vec<f32> {
                (0..cols).map(|_| rng.gen_range(-2.0f32..2.0)).collect()
            };
            let xs: Vec<f32> = [other(&mut rng), x.clone(), other(&mut rng)].concat();
            let mut many = vec![f32::NAN; rows * 3];
            m.dot_rows_tokens(0, &xs, 3, &mut many[..6]);
            m.dot_rows_tokens(2, &xs, 3, &mut many[6..]);
            let mut portable_many = vec![f32::NAN; rows * 3];
            super::dot_rows_tokens::<false>(&m, 0, &xs, 3, &mut portable_many);
            for r in 0..rows {
                let row = &w[r * cols..(r + 1) * cols];
                let exact: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let magnitude: f64 = row
                    .iter()
                    .zip(&x)
                    .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                    .sum();
                let bound = 1e-5 * magnitude + 1e-30;
                for (what, got) in [
                    ("portable", portable[r]),
                    ("dispatched", dispatched[r]),
                    ("portable, several inputs", portable_many[r * 3 + 1]),
                    ("dispatched, several inputs", many[r * 3 + 1]),
                ] {
                    let err = (f64::from(got) - exact).abs();
                    assert!(
                        err <= bound,
                        "{ty:?} {what} row {r}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    /// A hand-computed Q4_1 row of one block: `d = 0.5`, `m = −1`, quants 0..15 then 15..0,
    /// times activations `d_x = 0.25` with quants all 2 except the last (−4), `s = 1.5`.
    #[test]
    fn one_q4_1_block_times_8_bit_activations() {
        let mut bytes = Vec::new();
        bytes.extend(f32_to_f16(0.5).to_le_bytes());
        bytes.extend(f32_to_f16(-1.0).to_le_bytes());
        // Byte j: element j (low) = j, element j + 16 (high) = 15 − j.
        bytes.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let m = BlockMatrix::from_ggml("w", GgmlType::Q4_1, 1, 32, &bytes)
            .unwrap()
            .unwrap();
        assert_eq!(m.activation_kind(), Q8Kind::Q8_1);
        let mut quants = vec![2i8; 32];
        quants[31] = -4; // element 31 has weight quant 0
        let x = Q8Row {
            scales: vec![0.25],
            sums: vec![1.5],
            quants,
        };
        // Σ q_w·q_x = 2·(0 + … + 15) + 2·(15 + … + 1) + 0·(−4) = 240 + 240 = 480;
        // d_w·d_x·480 + m·s = 0.125·480 − 1.5 = 58.5.
        let mut out = [f32::NAN];
        m.dot_rows_q8(0, &x, &mut out);
        assert_eq!(out, [58.5]);
        super::dot_rows_q8(&m, 0, &x, &mut out);
        assert_eq!(out, [58.5]);
    }

    /// The dispatched products equal the portable ones bit for bit, and both lie within f32
    /// rounding of the exact products of the dequantized weights and activations.
    #[test]
    fn products_with_8_bit_activations_are_exact_sums_in_ggml_order() {
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (rows, cols) = (37, 160);
            let bytes = random_blocks(&mut rng, ty, rows, cols);
            let (m, w) = expanded(ty, rows, cols, &bytes);
            let xf: Vec<f32> = (0..cols).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            let x = quantize_row(&xf, m.activation_kind());
            let mut portable = vec![f32::NAN; rows];
            super::dot_rows_q8(&m, 0, &x, &mut portable);
            let mut dispatched = vec![f32::NAN; rows];
            m.dot_rows_q8(0, &x, &mut dispatched[..4]);
            m.dot_rows_q8(4, &x, &mut dispatched[4..]);
            for r in 0..rows {
                assert_eq!(
                    portable[r].to_bits(),
                    dispatched[r].to_bits(),
                    "{ty:?} row {r}"
                );
                let row = &w[r * cols..(r + 1) * cols];
                let terms = row.iter().enumerate().map(|(k, &wk)| {
                    let xk = f64::from(x.scales[k / BLOCK]) * f64::from(x.quants[k]);
                    f64::from(wk) * xk
                });
                // Q4_1's offsets meet the stored (f16) block sums, not Σx: the difference
                // is that of the sums.
                let offset_error: f64 = match ty {
                    GgmlType::Q4_1 => (0..cols / BLOCK)
                        .map(|b| {
                            let exact: f64 = (0..BLOCK)
                                .map(|j| {
                                    f64::from(x.scales[b]) * f64::from(x.quants[b * BLOCK + j])
                                })
                                .sum();
                            let m_b = f64::from(f16_at(&bytes, (r * cols / BLOCK + b) * 20 + 2));
                            m_b * (f64::from(x.sums[b]) - exact)
                        })
                        .sum(),
                    _ => 0.0,
                };
                let exact: f64 = terms.clone().sum::<f64>() + offset_error;
                let magnitude: f64 = terms.map(f64::abs).sum();
                let err = (f64::from(portable[r]) - exact).abs();
                assert!(
                    err <= 1e-5 * magnitude + 1e-30,
                    "{ty:?} row {r}: {} vs {exact}",
                    portable[r]
                );
            }
        }
    }

    #[test]
    fn other_types_and_bad_sizes_are_told_apart() {
        let none = BlockMatrix::from_ggml("w", GgmlType::F32, 1, 32, &[0; 128]).unwrap();
        assert!(none.is_none());
        let err = BlockMatrix::from_ggml("blk.0.w", GgmlType::Q8_0, 2, 32, &[0; 34]).unwrap_err();
        assert!(err.to_string().contains("blk.0.w"), "{err}");
        let err = BlockMatrix::from_ggml("w", GgmlType::Q4_1, 1, 48, &[0; 40]).unwrap_err();
        assert!(err.to_string().contains("[1, 48]"), "{err}");
    }
}
