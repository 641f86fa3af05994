//! Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 and Q4_1 products on 16-bit integer activations: byte dot products (`dp4a`) in
//! place of a float dequantization per weight.
//!
//! **Why.** Dequantizing each weight to f32 and multiplying it with an f32 activation
//! costs about four instructions a weight (five for Q8_0's byte a weight), and at decode
//! shapes that issue rate, not the memory, bounds these products. Integer dot products
//! take four weights an instruction; 8-bit activations would add more error than the
//! FP64 check allows, so the activations keep 16 bits, split into two byte planes.
//!
//! **Activations.** Each pass first quantizes its vectors into shared memory, every
//! 32-element block `j` (a Q4_K or Q5_K sub-block's span, a Q8_0, Q4_0 or Q4_1 block's, two Q6_K scales') on its own
//! ([`quantize`]): `dx_j = max|x| / 32767` and `q_i = rne(x_i · fl(1/dx_j))`, the exact
//! product rounded once to an integer (|q| ≤ 32767), or `dx_j = 0` and
//! `q = 0` where `dx_j` would be below the smallest normal f32 (an all-zero block). The
//! staged form is `q`'s low bytes (unsigned) and high bytes (signed, `q >> 8`) as two
//! planes in element order, and per block `(dx_j, Σ q_i)` as two f32 (the sum is an
//! integer below 2^21, exact). With the RMSNorm prologue the block normalizes its vectors
//! first, with the same operations as the f32 kernels, and quantizes the normalized
//! values. When a pass's vectors do not fit in shared memory at once (several long ones)
//! the columns go in chunks of a multiple of 2048, each staged in turn for each row group.
//!
//! **Pieces.** A lane takes 64-weight pieces of a row, lane `l` pieces `l, l + 32, ...` in
//! order (a chunk boundary falls on a multiple of 32 pieces, so chunking keeps that
//! order); piece `p` covers activation blocks `2p` and `2p + 1` (Q6_K: two blocks of its
//! super-block, below).
//! - Q4_K: piece `4u + g` is sub-blocks `2g`, `2g + 1` of super-block `u`: the 32 quant
//!   bytes `32g ..` whose low nibbles are sub-block `2g` and high nibbles sub-block
//!   `2g + 1`, element `32·sub-block + b` at byte `b`. Masking a word of them with
//!   `0x0F0F0F0F` spreads four weights to bytes that meet four consecutive activations in
//!   the byte planes, so no permutation is needed; `0xF0F0F0F0` leaves the high nibbles
//!   as `16·q4` in place (read unsigned), whose exact sum is shifted back.
//! - Q5_K: as Q4_K, its 32 qs bytes at `48 + 32g`, with the fifth bit of each weight
//!   (bit `2g` or `2g + 1` of the super-block's qh byte `b`, loaded by every lane of the
//!   super-block) put on top of its nibble: weights up to 31, no `16·q4` trick.
//! - Q6_K: piece `4u + j` (`n = j / 2`, `e = j mod 2`) takes the 32 ql bytes `32j ..` of
//!   super-block `u` whole: their low nibbles are elements `128n + 32e + t`, their high
//!   nibbles elements `128n + 64 + 32e + t` (activation blocks `8u + 4n + e` and
//!   `8u + 4n + 2 + e`, the piece's two blocks), with the 2-bit fields `e` and `2 + e` of
//!   the qh bytes `32n + t` on top, and the scales `sc[e / 16]` of each 16 elements. Its
//!   ql and qh bytes are read as 4-byte words from the word boundary at or below them (a
//!   super-block is 210 bytes: every other one starts 2 bytes past a boundary), 9 words
//!   each, joined a word at a time where the run is not aligned. Each weight byte
//!   `(ql nibble | field << 4) − 32` is formed in place as `((ql | field·16) + 0x60) ⊕ 0x80`,
//!   a signed byte with no carry between bytes.
//! - Q4_0 and Q4_1: piece `p` is blocks `2p`, `2p + 1`, 36 bytes (9 words; the first
//!   block's quant words joined across its 2-byte scale, as Q8_0's) or 40 (5 pairs of
//!   words); a block's low nibbles are its elements 0–15 and its high nibbles 16–31, so
//!   masking its 4 quant words, then shifting them down by 4 and masking, gives 8 words
//!   in element order. Q4_0's `q − 8` is formed bytewise as `(q + 0x78) ⊕ 0x80`.
//! - Q8_0: piece `p` is blocks `2p`, `2p + 1`, 68 bytes loaded as 17 words: the first
//!   block's quant bytes start 2 bytes into a word (each of its quant words is joined
//!   from the high half of one word and the low half of the next), the second block's
//!   are word-aligned.
//!
//! **Arithmetic.** Per block of 32 weights `w` with its integer sum `S = Σ w_i·q_i`
//! taken as `256·Σ dp4a(w, hi) + Σ dp4a(w, lo)` in one 32-bit integer, then in f32, in
//! this order:
//! - Q4_K (`w = q4`, scale `sc`, min `m`, super-block `d`, `dmin`): `S` is exact in f32
//!   (|S| < 2^24); `acc = fma(fl(d·sc)·dx, S, acc)`, `acc = fma(−fl(dmin·m)·dx, Σq, acc)`
//!   (`d·sc` and `dmin·m` are exact); Q5_K the same with `w = q5` (|S| < 2^25, rounded to
//!   f32 once);
//! - Q8_0 (`w` the signed quant, `d` the block's f16 scale): `acc = fma(fl(d·dx),
//!   fl(S), acc)` (|S| < 2^28 is rounded to f32 once); Q4_0 the same with `w = q − 8`
//!   (|S| < 2^24, exact);
//! - Q4_1 (`w = q`, scale `d`, offset `m`): `acc = fma(fl(d·dx), S, acc)`, then
//!   `acc = fma(fl(m·dx), Σq, acc)`;
//! - Q6_K (`w = q6 − 32`, super-block `d`, a signed scale `sc` per 16 weights): `S` taken
//!   per 16 weights (|S| < 2^24, exact in f32), `acc = fma(fl(d·sc)·dx, S, acc)` for the
//!   first 16 then the second (`d·sc` is exact).
//!
//! The warp sums its lanes by the butterfly. The integer sums are exact and the float
//! operations fixed, so [`dots`] reproduces every bit, and a vector's results do not
//! depend on the batch, the chunking or the launch.
//!
//! **Error.** Against the exact product of the stored weights with the unquantized
//! activations, quantization adds at most `|w_i|·(½ + 2^-7)·dx_j` per element (½ for the
//! rounding to an integer, the rest for the rounded `1/dx`), plus the f32 roundings of the
//! scale products and the sums ([`f64_check`]).

use quench_ir::func::MAX_STATIC_SHARED_BYTES;
use quench_ir::{Builder, CacheOp, Scalar, Type, Value};
use quench_models::dequant::{f16_to_f32, unpack_k_scales};

use super::format::{load_x, unpack_x};
use super::prologue;
use super::QGemvParams;
use crate::approx::F32_U;
use crate::ggml::{f16_bits_to_f32, load_u16, Bytes, Magic, Q4kLane, Q4kScales, Q5kLane};
use crate::lanes::{emit_warp_allreduce, warp_allreduce, wide_mul, words, Combine};
use crate::norm_residual::OutType;
use crate::par::par_map;
use quench_models::quant::activations::QMAX;
pub use quench_models::quant::activations::{quantize, QuantX};

/// Elements per activation block: one `dx`, one Q4_K sub-block.
const BLOCK: u32 = 32;
/// `1.5·2^23`: an f32 in `[2^23, 2^24)`, where the step is 1, for any `M + q`, |q| < 2^22.
const ROUND_MAGIC: f32 = 12_582_912.0;
/// Q4_K pieces (64 weights each) of a 256-weight super-block.
const PPU: u32 = 4;
/// Q4_K super-block bytes: `d`, `dmin`, 12 scale bytes, 128 quant bytes.
const UNIT_BYTES: u32 = 144;
/// Q5_K super-block bytes: Q4_K's header, 32 qh bytes, 128 qs bytes.
const Q5K_UNIT_BYTES: u32 = 176;
/// Q8_0 piece bytes: two blocks of an f16 scale and 32 quant bytes.
const Q8_PIECE_BYTES: u32 = 68;
/// Q4_0 and Q4_1 block bytes: an f16 scale (and for Q4_1 an f16 offset), 16 quant bytes.
const Q4_0_BLOCK_BYTES: u32 = 18;
const Q4_1_BLOCK_BYTES: u32 = 20;
/// Q6_K super-block bytes: 128 ql, 64 qh, 16 scales, `d`.
const Q6K_UNIT_BYTES: u32 = 210;
/// Q6_K byte offsets in the super-block: qh, the scales, `d`.
const Q6K_QH: u32 = 128;
const Q6K_SCALES: u32 = 192;
const Q6K_D: u32 = 208;
/// Shared bytes left for the prologue's reductions.
const SLACK: u64 = 1024;
/// Chunks are a multiple of this many columns: 32 pieces, one per lane.
const CHUNK_STEP: u32 = 32 * 64;

/// Staged bytes per column: two byte planes and the block's `(dx, Σq)`.
fn staged_bytes(cols: u32) -> u64 {
    2 * u64::from(cols) + u64::from(cols / BLOCK) * 8
}

/// Columns a pass stages at once: the whole row where the pass's vectors fit in shared
/// memory, else the largest multiple of [`CHUNK_STEP`] that fits.
pub fn chunk_cols(p: &QGemvParams) -> u32 {
    let fits =
        |cols: u32| u64::from(p.batch) * staged_bytes(cols) + SLACK <= MAX_STATIC_SHARED_BYTES;
    if fits(p.cols) {
        return p.cols;
    }
    let mut c = CHUNK_STEP;
    while c + CHUNK_STEP < p.cols && fits(c + CHUNK_STEP) {
        c += CHUNK_STEP;
    }
    c
}

/// Ways to compute the products: the kernels' own, and mistakes a kernel could make that
/// the checks must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// What the kernels compute.
    Right,
    /// Q4_K, Q5_K, Q6_K, Q4_0, Q4_1: each quant byte's nibbles taken the other way
    /// round.
    NibblesSwapped,
    /// The activations' low bytes taken as the high ones and the reverse.
    PlanesSwapped,
    /// Q8_0, Q4_0, Q4_1: each piece's two blocks' scales (and offsets) taken the other
    /// way round; Q6_K: each block's two 16-weight scales.
    ScalesSwapped,
    /// Q6_K: each weight's 2-bit high field, Q5_K: its fifth bit, taken from the other
    /// nibble's.
    FieldsSwapped,
}

impl Variant {
    /// The wrong variants that apply to weights in `format`.
    pub fn wrong(format: super::WeightFormat) -> Vec<Variant> {
        match format {
            super::WeightFormat::Q4K => vec![Variant::NibblesSwapped, Variant::PlanesSwapped],
            super::WeightFormat::Q4_0 | super::WeightFormat::Q4_1 => vec![
                Variant::NibblesSwapped,
                Variant::PlanesSwapped,
                Variant::ScalesSwapped,
            ],
            super::WeightFormat::Q5K => vec![
                Variant::NibblesSwapped,
                Variant::PlanesSwapped,
                Variant::FieldsSwapped,
            ],
            super::WeightFormat::Q6K => vec![
                Variant::NibblesSwapped,
                Variant::PlanesSwapped,
                Variant::ScalesSwapped,
                Variant::FieldsSwapped,
            ],
            _ => vec![Variant::PlanesSwapped, Variant::ScalesSwapped],
        }
    }
}

/// Each row's dot product with `x`, computed as `variant` says; [`Variant::Right`] gives
/// the kernels' bits. `w` holds `p.rows` rows of `p.cols` columns in `p.format`.
pub fn dots(p: &QGemvParams, w: &[u8], x: &[f32], variant: Variant) -> Vec<f32> {
    let qx = quantize(x);
    let rb = p.format.row_bytes(p.cols) as usize;
    let pieces = (p.cols / 64) as usize;
    let piece_dot = match p.format {
        super::WeightFormat::Q4K => q4k_piece_dot,
        super::WeightFormat::Q5K => q5k_piece_dot,
        super::WeightFormat::Q6K => q6k_piece_dot,
        super::WeightFormat::Q4_0 => q4_0_piece_dot,
        super::WeightFormat::Q4_1 => q4_1_piece_dot,
        _ => q8_0_piece_dot,
    };
    par_map(p.rows as usize, |r| {
        let row = &w[r * rb..(r + 1) * rb];
        let mut lanes = [0.0f32; 32];
        for (l, acc) in lanes.iter_mut().enumerate() {
            for piece in (l..pieces).step_by(32) {
                *acc = piece_dot(row, piece, &qx, variant, *acc);
            }
        }
        warp_allreduce(&lanes, Combine::Sum)
    })
}

/// `Σ_b w_b·q_b` over activation block `block` for the 32 weights `w(b)`, as the kernels
/// form it from the byte planes (or, for [`Variant::PlanesSwapped`], from the planes
/// exchanged).
fn block_sum(qx: &QuantX, block: usize, variant: Variant, w: impl Fn(usize) -> i64) -> i64 {
    span_sum(qx, block, 0..32, variant, w)
}

/// [`block_sum`] over the elements `range` of the block.
fn span_sum(
    qx: &QuantX,
    block: usize,
    range: std::ops::Range<usize>,
    variant: Variant,
    w: impl Fn(usize) -> i64,
) -> i64 {
    range
        .map(|b| {
            let q = qx.q[block * 32 + b];
            let (lo, hi) = (i64::from(q & 0xff), i64::from(q >> 8));
            let q = match variant {
                Variant::PlanesSwapped => 256 * (lo as u8 as i8 as i64) + (hi & 0xff),
                _ => 256 * hi + lo,
            };
            w(b) * q
        })
        .sum()
}

/// A lane's Q4_K piece of a row, added to `acc` as the kernel adds it.
fn q4k_piece_dot(row: &[u8], piece: usize, qx: &QuantX, variant: Variant, acc: f32) -> f32 {
    k_quant_piece_dot(row, piece, qx, variant, acc, false)
}

/// A lane's Q5_K piece of a row, added to `acc` as the kernel adds it.
fn q5k_piece_dot(row: &[u8], piece: usize, qx: &QuantX, variant: Variant, acc: f32) -> f32 {
    k_quant_piece_dot(row, piece, qx, variant, acc, true)
}

/// A Q4_K piece, or with `fifth` a Q5_K one (its qs bytes 32 further, the fifth bits
/// before them).
fn k_quant_piece_dot(
    row: &[u8],
    piece: usize,
    qx: &QuantX,
    variant: Variant,
    mut acc: f32,
    fifth: bool,
) -> f32 {
    let (unit, g) = (piece / PPU as usize, piece % PPU as usize);
    let unit_bytes = if fifth { Q5K_UNIT_BYTES } else { UNIT_BYTES } as usize;
    let sb = &row[unit * unit_bytes..][..unit_bytes];
    let d = f16_to_f32(u16::from_le_bytes([sb[0], sb[1]]));
    let dmin = f16_to_f32(u16::from_le_bytes([sb[2], sb[3]]));
    let mut packed = [0u8; 12];
    packed.copy_from_slice(&sb[4..16]);
    let (scales, mins) = unpack_k_scales(&packed);
    let quants = &sb[if fifth { 48 } else { 16 } + 32 * g..][..32];
    for half in 0..2 {
        let sub = 2 * g + half;
        let block = unit * 8 + sub;
        let nibble_shift = match variant {
            Variant::NibblesSwapped => 4 * (1 - half),
            _ => 4 * half,
        };
        let bit = match variant {
            Variant::FieldsSwapped => 2 * g + 1 - half,
            _ => sub,
        };
        let s = block_sum(qx, block, variant, |b| {
            let high = if fifth { (sb[16 + b] >> bit) & 1 } else { 0 };
            i64::from(((quants[b] >> nibble_shift) & 0x0f) | high << 4)
        });
        let dx = qx.dx[block];
        let a = d * f32::from(scales[sub]) * dx;
        let b = dmin * f32::from(mins[sub]) * dx;
        acc = a.mul_add(s as f32, acc);
        acc = (-b).mul_add(qx.sq[block] as f32, acc);
    }
    acc
}

/// A lane's Q6_K piece of a row, added to `acc` as the kernel adds it.
fn q6k_piece_dot(row: &[u8], piece: usize, qx: &QuantX, variant: Variant, mut acc: f32) -> f32 {
    let (unit, j) = (piece / PPU as usize, piece % PPU as usize);
    let (n, e) = (j / 2, j % 2);
    let sb = &row[unit * Q6K_UNIT_BYTES as usize..][..Q6K_UNIT_BYTES as usize];
    let d = f16_to_f32(u16::from_le_bytes([
        sb[Q6K_D as usize],
        sb[Q6K_D as usize + 1],
    ]));
    let ql = &sb[32 * j..][..32];
    let qh = &sb[Q6K_QH as usize + 32 * n..][..32];
    for h in 0..2 {
        // Elements 128n + 64h + 32e + t: activation block 4n + 2h + e of the super-block.
        let first = 128 * n + 64 * h + 32 * e;
        let block = unit * 8 + first / 32;
        let nibble = match variant {
            Variant::NibblesSwapped => 4 * (1 - h),
            _ => 4 * h,
        };
        let field = match variant {
            Variant::FieldsSwapped => 2 * e + 4 * (1 - h),
            _ => 2 * e + 4 * h,
        };
        let w = |t: usize| {
            let v = ((ql[t] >> nibble) & 0x0f) | (((qh[t] >> field) & 3) << 4);
            i64::from(v) - 32
        };
        let dx = qx.dx[block];
        for half in 0..2 {
            let s = span_sum(qx, block, 16 * half..16 * half + 16, variant, w);
            let which = match variant {
                Variant::ScalesSwapped => 1 - half,
                _ => half,
            };
            let sc = f32::from(sb[Q6K_SCALES as usize + first / 16 + which] as i8);
            acc = (d * sc * dx).mul_add(s as f32, acc);
        }
    }
    acc
}

/// A lane's Q4_0 piece (two blocks) of a row, added to `acc` as the kernel adds it.
fn q4_0_piece_dot(row: &[u8], piece: usize, qx: &QuantX, variant: Variant, acc: f32) -> f32 {
    legacy_piece_dot(row, piece, qx, variant, acc, false)
}

/// A lane's Q4_1 piece (two blocks) of a row, added to `acc` as the kernel adds it.
fn q4_1_piece_dot(row: &[u8], piece: usize, qx: &QuantX, variant: Variant, acc: f32) -> f32 {
    legacy_piece_dot(row, piece, qx, variant, acc, true)
}

/// A Q4_0 piece, or with `offset` a Q4_1 one.
fn legacy_piece_dot(
    row: &[u8],
    piece: usize,
    qx: &QuantX,
    variant: Variant,
    mut acc: f32,
    offset: bool,
) -> f32 {
    let bb = if offset {
        Q4_1_BLOCK_BYTES
    } else {
        Q4_0_BLOCK_BYTES
    } as usize;
    let bytes = &row[piece * 2 * bb..][..2 * bb];
    let half = |i: usize| f16_to_f32(u16::from_le_bytes([bytes[i], bytes[i + 1]]));
    for h in 0..2 {
        let block = 2 * piece + h;
        let qs = &bytes[bb * h + bb - 16..][..16];
        let high = |b: usize| (b >= 16) != (variant == Variant::NibblesSwapped);
        let nibble = |b: usize| i64::from((qs[b % 16] >> (4 * u8::from(high(b)))) & 0x0f);
        let g = match variant {
            Variant::ScalesSwapped => 1 - h,
            _ => h,
        };
        let (d, dx) = (half(bb * g), qx.dx[block]);
        if offset {
            let s = block_sum(qx, block, variant, nibble);
            acc = (d * dx).mul_add(s as f32, acc);
            acc = (half(bb * g + 2) * dx).mul_add(qx.sq[block] as f32, acc);
        } else {
            let s = block_sum(qx, block, variant, |b| nibble(b) - 8);
            acc = (d * dx).mul_add(s as f32, acc);
        }
    }
    acc
}

/// A lane's Q8_0 piece (two blocks) of a row, added to `acc` as the kernel adds it.
fn q8_0_piece_dot(row: &[u8], piece: usize, qx: &QuantX, variant: Variant, mut acc: f32) -> f32 {
    let bytes = &row[piece * Q8_PIECE_BYTES as usize..][..Q8_PIECE_BYTES as usize];
    let scale = |h: usize| f16_to_f32(u16::from_le_bytes([bytes[34 * h], bytes[34 * h + 1]]));
    for h in 0..2 {
        let block = 2 * piece + h;
        let quants = &bytes[34 * h + 2..][..32];
        let s = block_sum(qx, block, variant, |b| i64::from(quants[b] as i8));
        let d = match variant {
            Variant::ScalesSwapped => scale(1 - h),
            _ => scale(h),
        };
        acc = (d * qx.dx[block]).mul_add(s as f32, acc);
    }
    acc
}

/// The kernels' products judged against the exact ones: for each vector of `xs` in turn
/// (the activations as the kernel quantizes them: normalized where it normalizes) and
/// each row, the f64 product of the stored weights with the unquantized vector, its
/// tolerance, and what each wrong [`Variant`] computes.
pub struct F64Check {
    pub want: Vec<f64>,
    pub tol: Vec<f64>,
    pub wrong: Vec<(Variant, Vec<f32>)>,
}

/// [`F64Check`] of rows `w` (`p.rows` of `p.cols`, in `p.format`).
///
/// The tolerance of a row: `Σ_i |w_i|·(½ + 2^-7)·dx_j` for the quantization (½ for the
/// rounding to an integer, the rest for the rounded `1/dx`), plus `(n + 8)·2u` times
/// `Σ_i |w_i|·|q_i|·dx_j`, the magnitude of the f32 terms (`n` terms a row, each with
/// its scale products' roundings, the lanes' sums and the butterfly), plus `2u·|want|`
/// for the result's rounding to f32 and a residual's addition.
pub fn f64_check(
    p: &QGemvParams,
    w: &[u8],
    xs: &[Vec<f32>],
) -> Result<F64Check, quench_models::ModelError> {
    let (cols, rb) = (p.cols as usize, p.format.row_bytes(p.cols) as usize);
    let wf = w
        .chunks_exact(rb)
        .map(|row| quench_models::dequant::dequantize(p.format.ggml(), row, cols))
        .collect::<Result<Vec<Vec<f32>>, _>>()?;
    let terms = (2 * cols / BLOCK as usize) as f64;
    let mut out = F64Check {
        want: vec![],
        tol: vec![],
        wrong: vec![],
    };
    let variants = Variant::wrong(p.format);
    let mut wrong = vec![vec![]; variants.len()];
    for x in xs {
        let qx = quantize(x);
        for row in &wf {
            let want: f64 = row
                .iter()
                .zip(x)
                .map(|(&w, &x)| f64::from(w) * f64::from(x))
                .sum();
            let (mut quant, mut magnitude) = (0.0f64, 0.0f64);
            for (j, (wb, qb)) in row
                .chunks_exact(BLOCK as usize)
                .zip(qx.q.chunks_exact(BLOCK as usize))
                .enumerate()
            {
                let dx = f64::from(qx.dx[j]);
                quant +=
                    wb.iter().map(|w| f64::from(w.abs())).sum::<f64>() * (0.5 + 1.0 / 128.0) * dx;
                magnitude += wb
                    .iter()
                    .zip(qb)
                    .map(|(w, &q)| f64::from(w.abs()) * f64::from(q.abs()))
                    .sum::<f64>()
                    * dx;
            }
            out.tol
                .push(quant + (terms + 8.0) * 2.0 * F32_U * magnitude + 2.0 * F32_U * want.abs());
            out.want.push(want);
        }
        for (v, got) in variants.iter().zip(&mut wrong) {
            got.extend(dots(p, w, x, *v));
        }
    }
    out.wrong = variants.into_iter().zip(wrong).collect();
    Ok(out)
}

/// The block's staged activations: the pass's vectors' quantized chunk.
pub(super) struct Staged {
    /// Low bytes, `[vector][column]`, as `u32` words.
    lo: Value,
    /// High bytes, as `lo`.
    hi: Value,
    /// `(dx, Σq)` per block, `[vector][block]`, as f32 pairs.
    meta: Value,
    /// Columns staged at once.
    cols: u32,
}

impl Staged {
    pub(super) fn new(k: &mut Builder, p: &QGemvParams) -> Staged {
        let cols = chunk_cols(p);
        let words = p.batch * cols / 4;
        let lo = k.shared_array("xq_lo", Scalar::U32, words, 16);
        let hi = k.shared_array("xq_hi", Scalar::U32, words, 16);
        let meta = k.shared_array("xq_meta", Scalar::F32, p.batch * cols / BLOCK * 2, 16);
        Staged { lo, hi, meta, cols }
    }
}

/// Stores a row group's totals: `(first row of the warp, totals[vector][stream])`.
pub(super) type Store<'a> = dyn Fn(&mut Builder, Value, &[Vec<Value>]) + 'a;

/// What one pass of an integer-activation kernel works with.
pub(super) struct Pass<'a> {
    pub p: &'a QGemvParams,
    /// The matrices, as byte pointers.
    pub weights: Vec<Value>,
    /// `x`, in the activation type (the residual stream with the prologue).
    pub x: Value,
    /// `(norm_w, eps)` with the prologue.
    pub norm: Option<(Value, Value)>,
    pub n: Value,
    /// The pass's first vector.
    pub v0: Value,
    pub tid: Value,
    pub warp: Value,
    pub lane: Value,
}

impl Pass<'_> {
    fn streams(&self) -> usize {
        self.weights.len() * self.p.rows_per_warp() as usize
    }

    /// Vector `j` of the pass, or the last vector where the pass has fewer (staged like
    /// any other, its products never stored).
    fn vector(&self, k: &mut Builder, j: u32) -> Value {
        let v = k.add_const(self.v0, j);
        if j == 0 {
            return v;
        }
        let one = k.const_u32(1);
        let last = k.sub(self.n, one);
        k.min(v, last)
    }

    /// The pass: every row group of the block, each group's totals handed to `store`.
    pub(super) fn emit(&self, k: &mut Builder, staged: &Staged, store: &Store<'_>) {
        let p = self.p;
        let chunks: Vec<(u32, u32)> = (0..p.cols.div_ceil(staged.cols))
            .map(|c| (c * staged.cols, staged.cols.min(p.cols - c * staged.cols)))
            .collect();
        let whole = chunks.len() == 1;
        if whole {
            self.stage(k, staged, 0, p.cols);
        }
        let group = |k: &mut Builder, group: Value| {
            let (row0, inside, streams) = self.rows(k, group);
            let zero = k.const_f32(0.0);
            let mut accs = vec![zero; self.streams() * p.batch as usize];
            for &(c0, width) in &chunks {
                if !whole {
                    self.stage(k, staged, c0, width);
                }
                accs = self.chunk_dots(k, staged, &streams, c0, width, accs);
            }
            let totals: Vec<Vec<Value>> = accs
                .chunks(self.streams())
                .map(|v| {
                    v.iter()
                        .map(|&a| emit_warp_allreduce(k, a, Combine::Sum))
                        .collect()
                })
                .collect();
            match inside {
                Some(c) => k.if_then(c, |k| store(k, row0, &totals)),
                None => store(k, row0, &totals),
            }
        };
        if p.max_blocks != 0 && p.max_blocks < p.groups() {
            let first = k.ctaid_x();
            let groups = k.const_u32(p.groups());
            let stride = k.nctaid_x();
            k.for_range(first, groups, stride, &[], |k, g, _| {
                group(k, g);
                vec![]
            });
        } else {
            let g = k.ctaid_x();
            group(k, g);
        }
    }

    /// The warp's first row in row group `group`, whether it has rows there (absent when
    /// every warp has), and each of its rows in each matrix (row-major over (row,
    /// matrix)). A warp past the last row reads the last rows instead, so that it reaches
    /// the staging barriers with the others; its totals are not stored.
    fn rows(&self, k: &mut Builder, group: Value) -> (Value, Option<Value>, Vec<Stream>) {
        let p = self.p;
        let rpw = p.rows_per_warp();
        let first = k.mul_const(group, p.warps);
        let first = k.add(first, self.warp);
        let row0 = k.mul_const(first, rpw);
        let (row, inside) = if p.rows.is_multiple_of(p.warps * rpw) {
            (row0, None)
        } else {
            let total = k.const_u32(p.rows);
            let inside = k.lt(row0, total);
            let last = k.const_u32(p.rows - rpw);
            (k.min(row0, last), Some(inside))
        };
        let rb = p.format.row_bytes(p.cols);
        let start = wide_mul(k, row, rb);
        // A Q6_K row of an odd number of 210-byte super-blocks starts 2 bytes past a word
        // boundary where the row before it does not: its stream points at the boundary
        // below and its pieces add the 2 bytes back.
        let skewed = p.format == super::WeightFormat::Q6K && (rb / Q6K_UNIT_BYTES) % 2 == 1;
        let mut streams = vec![];
        for i in 0..rpw {
            let (start, skew) = if skewed {
                let r = k.add_const(row, i);
                let odd = k.and_const(r, 1);
                let skew = k.shl_const(odd, 1);
                let back = k.cvt(Scalar::U64, skew);
                let start = wide_mul(k, r, rb);
                (k.sub(start, back), skew)
            } else {
                let later = k.const_u64(u64::from(i * rb));
                (k.add(start, later), k.const_u32(0))
            };
            for &w in &self.weights {
                let at = k.ptr_add(w, start);
                streams.push(Stream { at, skew });
            }
        }
        (row0, inside, streams)
    }

    /// Quantize columns `c0 .. c0 + width` of the pass's vectors into `staged`, between
    /// barriers (the previous chunk's readers are done; the next readers wait for all).
    fn stage(&self, k: &mut Builder, staged: &Staged, c0: u32, width: u32) {
        let p = self.p;
        let threads = p.warps * 32;
        k.barrier();
        for j in 0..p.batch {
            let v = self.vector(k, j);
            let at = wide_mul(k, v, p.cols);
            let row = k.ptr_add(self.x, at);
            let norm = self.norm.map(|(nw, eps)| {
                let inv = prologue::emit_inv_rms(
                    k,
                    row,
                    p.cols,
                    self.tid,
                    threads,
                    eps,
                    &format!("rms{j}"),
                );
                (nw, inv)
            });
            let blocks = k.const_u32(width / BLOCK);
            let step = k.const_u32(threads);
            k.for_range(self.tid, blocks, step, &[], |k, b, _| {
                let col = k.mul_const(b, BLOCK);
                let col = k.add_const(col, c0);
                let xw = words(k, row);
                let loaded = load_x(k, p.act, xw, col, BLOCK);
                let mut xs = unpack_x(k, p.act, &loaded);
                if let Some((nw, inv)) = norm {
                    let ww = words(k, nw);
                    let loaded = load_x(k, OutType::F32, ww, col, BLOCK);
                    let ws = unpack_x(k, OutType::F32, &loaded);
                    xs = xs
                        .iter()
                        .zip(&ws)
                        .map(|(&h, &wi)| {
                            let n = k.mul(h, inv);
                            k.mul(n, wi)
                        })
                        .collect();
                }
                let local = k.mul_const(b, BLOCK);
                let local = k.add_const(local, j * staged.cols);
                self.quantize_block(k, staged, &xs, local);
                vec![]
            });
        }
        k.barrier();
    }

    /// Quantize one block's 32 values `xs` into the planes at column `local` (the
    /// vector's offset in the chunk included) and its `(dx, Σq)` into pair `local / 32`.
    fn quantize_block(&self, k: &mut Builder, staged: &Staged, xs: &[Value], local: Value) {
        let mut m = k.abs(xs[0]);
        for &x in &xs[1..] {
            let a = k.abs(x);
            m = k.max(m, a);
        }
        let qmax = k.const_f32(QMAX);
        let dx = k.div(m, qmax);
        let normal = k.const_f32(f32::MIN_POSITIVE);
        let ok = k.ge(dx, normal);
        let r = k.rcp(dx);
        let fzero = k.const_f32(0.0);
        let r = k.select(ok, r, fzero);
        let dx = k.select(ok, dx, fzero);
        // `fma(x, r, 1.5·2^23)` lands where the f32 step is 1: the integer part of its
        // bits is `M + rne(x·r)` (|x·r| < 2^22), read without a conversion; the planes
        // take the low 16 bits, the two's complement of q.
        let magic = k.const_f32(ROUND_MAGIC);
        let bits: Vec<Value> = xs
            .iter()
            .map(|&x| {
                let t = k.fma(x, r, magic);
                k.bitcast(Type::U32, t)
            })
            .collect();
        let sum = bits[1..].iter().fold(bits[0], |s, &b| k.add(s, b));
        let sum = k.add_const(sum, ROUND_MAGIC.to_bits().wrapping_mul(32).wrapping_neg());
        let sum = k.bitcast(Type::I32, sum);
        let sum = k.cvt(Scalar::F32, sum);
        // Byte `i` of a plane word holds element `4w + i`: bits `shift .. shift + 8` of its
        // `M + q`, the low byte of q (unsigned) or its high byte (the signed `q >> 8`).
        let plane = |k: &mut Builder, shift: u32| -> Vec<Value> {
            bits.chunks(4)
                .map(|four| {
                    let bytes: Vec<Value> = four
                        .iter()
                        .enumerate()
                        .map(|(i, &b)| {
                            let to = 8 * i as u32;
                            let moved = match to.cmp(&shift) {
                                std::cmp::Ordering::Greater => k.shl_const(b, to - shift),
                                std::cmp::Ordering::Less => k.shr_const(b, shift - to),
                                std::cmp::Ordering::Equal => b,
                            };
                            if shift == 0 && to == 24 {
                                // The low byte shifted to the top: nothing above it.
                                moved
                            } else {
                                k.and_const(moved, 0xff << to)
                            }
                        })
                        .collect();
                    let lo = k.or(bytes[0], bytes[1]);
                    let hi = k.or(bytes[2], bytes[3]);
                    k.or(lo, hi)
                })
                .collect()
        };
        let word = k.shr_const(local, 2);
        for (shift, base) in [(0, staged.lo), (8, staged.hi)] {
            let ws = plane(k, shift);
            for (i, four) in ws.chunks(4).enumerate() {
                let v = k.pack(Type::Vec(Scalar::U32, 4), four);
                let at = k.add_const(word, 4 * i as u32);
                let at = k.ptr_add(base, at);
                k.store(at, v);
            }
        }
        let pair = k.shr_const(local, 4);
        let at = k.ptr_add(staged.meta, pair);
        let v = k.pack(Type::Vec(Scalar::F32, 2), &[dx, sum]);
        k.store(at, v);
    }

    /// The lanes' products over columns `c0 .. c0 + width` (staged), added to `accs`
    /// (`[vector][stream]`): `unroll` pieces' loads issued before their arithmetic, the
    /// remaining pieces one step at a time, the last step's lanes without a piece idle.
    fn chunk_dots(
        &self,
        k: &mut Builder,
        staged: &Staged,
        streams: &[Stream],
        c0: u32,
        width: u32,
        accs: Vec<Value>,
    ) -> Vec<Value> {
        let p = self.p;
        let format = match p.format {
            super::WeightFormat::Q4K => {
                let g = k.and_const(self.lane, PPU - 1);
                PieceFormat::Q4K {
                    g,
                    q4lane: Q4kLane::new(k, g),
                    magic: Magic::new(k),
                }
            }
            super::WeightFormat::Q5K => {
                let g = k.and_const(self.lane, PPU - 1);
                PieceFormat::Q5K {
                    lane: Q5kLane::new(k, g),
                    magic: Magic::new(k),
                }
            }
            super::WeightFormat::Q6K => {
                let j = k.and_const(self.lane, PPU - 1);
                let n = k.shr_const(j, 1);
                let e = k.and_const(j, 1);
                let ql = k.shl_const(j, 5);
                let qh = k.shl_const(n, 5);
                let qh = k.add_const(qh, Q6K_QH);
                // The first block's pair of scales, sc[(128n + 32e) / 16].
                let n8 = k.shl_const(n, 3);
                let e2 = k.shl_const(e, 1);
                let scales = k.add(n8, e2);
                let scales = k.add_const(scales, Q6K_SCALES);
                PieceFormat::Q6K {
                    e,
                    field: e2,
                    ql,
                    qh,
                    scales,
                }
            }
            super::WeightFormat::Q4_0 => PieceFormat::Q4_0,
            super::WeightFormat::Q4_1 => PieceFormat::Q4_1,
            _ => PieceFormat::Q8_0,
        };
        let consts = Consts {
            format,
            streams,
            c0,
        };
        let pieces = width / 64;
        let main = pieces / 32 / p.unroll;
        let mut accs = accs;
        if main > 0 {
            let lo = k.const_u32(0);
            let hi = k.const_u32(main);
            let one = k.const_u32(1);
            accs = k.for_range(lo, hi, one, &accs, |k, s, c| {
                let s0 = k.mul_const(s, p.unroll);
                let loaded: Vec<Loaded> = (0..p.unroll)
                    .map(|u| {
                        let step = k.add_const(s0, u);
                        self.issue(k, staged, &consts, step)
                    })
                    .collect();
                loaded.into_iter().fold(c.to_vec(), |accs, l| {
                    self.multiply(k, staged, &consts, l, &accs)
                })
            });
        }
        for step in main * p.unroll..pieces.div_ceil(32) {
            let s = k.const_u32(step);
            let run = |k: &mut Builder, accs: &[Value]| {
                let l = self.issue(k, staged, &consts, s);
                self.multiply(k, staged, &consts, l, accs)
            };
            if (step + 1) * 32 <= pieces {
                accs = run(k, &accs);
            } else {
                let left = k.const_u32(pieces - step * 32);
                let has = k.lt(self.lane, left);
                let before = accs.clone();
                let types = vec![Type::F32; before.len()];
                accs = k.if_else(has, &types, |k| run(k, &before), |_| before.clone());
            }
        }
        accs
    }

    /// The loads of this lane's piece in step `step` of the chunk (chunk piece `32·step +
    /// lane`): each stream's bytes of it, and at one vector a pass its activations.
    fn issue(&self, k: &mut Builder, staged: &Staged, c: &Consts<'_>, step: Value) -> Loaded {
        let piece = k.shl_const(step, 5);
        let piece = k.add(piece, self.lane);
        let global = k.add_const(piece, c.c0 / 64);
        let weights = match &c.format {
            PieceFormat::Q4K { g, .. } => {
                let unit = k.shr_const(global, 2);
                let off = k.mul_const(unit, UNIT_BYTES);
                let quant_off = k.shl_const(*g, 5);
                let quant_off = k.add_const(quant_off, 16);
                c.streams
                    .iter()
                    .map(|s| {
                        let at = k.ptr_add(s.at, off);
                        let header = Bytes::load(k, at, 16, 16);
                        let qa = k.ptr_add(at, quant_off);
                        PieceBytes::Q4K(header, Bytes::load(k, qa, 32, 16))
                    })
                    .collect()
            }
            PieceFormat::Q5K { lane, .. } => {
                let unit = k.shr_const(global, 2);
                let off = k.mul_const(unit, Q5K_UNIT_BYTES);
                c.streams
                    .iter()
                    .map(|s| {
                        let at = k.ptr_add(s.at, off);
                        let (header, qh, qs) = lane.load(k, at);
                        PieceBytes::Q5K(header, qh, qs)
                    })
                    .collect()
            }
            PieceFormat::Q6K { ql, qh, scales, .. } => {
                let unit = k.shr_const(global, 2);
                let off = k.mul_const(unit, Q6K_UNIT_BYTES);
                c.streams
                    .iter()
                    .map(|s| {
                        let sb = k.add(off, s.skew);
                        let ql_at = k.add(sb, *ql);
                        let mis = k.and_const(ql_at, 3);
                        let shift = k.shl_const(mis, 3);
                        let run = |k: &mut Builder, at: Value| {
                            let at = k.and_const(at, !3);
                            let at = k.ptr_add(s.at, at);
                            let at = k.ptr_cast(Scalar::U32, at);
                            (0..9)
                                .map(|i| {
                                    let c = k.const_u32(i);
                                    let a = k.ptr_add(at, c);
                                    k.load_with(Type::U32, a, CacheOp::Nc)
                                })
                                .collect::<Vec<_>>()
                        };
                        let ql = run(k, ql_at);
                        let qh_at = k.add(sb, *qh);
                        let qh = run(k, qh_at);
                        let at = k.ptr_add(s.at, sb);
                        let sc = k.ptr_add(at, *scales);
                        let first = load_u16(k, sc);
                        let four = k.const_u32(4);
                        let sc = k.ptr_add(sc, four);
                        let second = load_u16(k, sc);
                        let da = k.const_u32(Q6K_D);
                        let da = k.ptr_add(at, da);
                        PieceBytes::Q6K {
                            ql,
                            qh,
                            shift,
                            scales: [first, second],
                            d: load_u16(k, da),
                        }
                    })
                    .collect()
            }
            PieceFormat::Q8_0 | PieceFormat::Q4_0 | PieceFormat::Q4_1 => {
                // Pieces of 68, 36 or 40 bytes: words, or pairs of them for Q4_1's.
                let (bytes, width) = match c.format {
                    PieceFormat::Q8_0 => (Q8_PIECE_BYTES, 4),
                    PieceFormat::Q4_0 => (2 * Q4_0_BLOCK_BYTES, 4),
                    _ => (2 * Q4_1_BLOCK_BYTES, 8),
                };
                let off = k.mul_const(global, bytes);
                c.streams
                    .iter()
                    .map(|s| {
                        let at = k.ptr_add(s.at, off);
                        PieceBytes::Whole(Bytes::load(k, at, bytes, width))
                    })
                    .collect()
            }
        };
        let blocks = c.format.blocks(k, piece);
        let acts =
            (self.p.batch == 1).then(|| [0, 1].map(|h| self.activations(k, staged, &blocks, h, 0)));
        Loaded {
            blocks,
            weights,
            acts,
        }
    }

    /// Vector `j`'s staged activations of a piece's block `h`: its 8 low and 8 high plane
    /// words and its `(dx, Σq)`.
    fn activations(
        &self,
        k: &mut Builder,
        staged: &Staged,
        blocks: &Blocks,
        h: u32,
        j: u32,
    ) -> Half {
        // Element offset of the block in the chunk, in words.
        let word = k.add_const(blocks.word, j * staged.cols / 4 + 8 * blocks.apart * h);
        let plane = |k: &mut Builder, base: Value| -> Vec<Value> {
            (0..2)
                .flat_map(|i| {
                    let at = k.add_const(word, 4 * i);
                    let at = k.ptr_add(base, at);
                    let v = k.load(Type::Vec(Scalar::U32, 4), at);
                    (0..4).map(|e| k.extract(v, e)).collect::<Vec<_>>()
                })
                .collect()
        };
        let lo = plane(k, staged.lo);
        let hi = plane(k, staged.hi);
        // The block's pair, at float 2·block.
        let at = k.add_const(
            blocks.pair,
            j * staged.cols / BLOCK * 2 + 2 * blocks.apart * h,
        );
        let at = k.ptr_add(staged.meta, at);
        let v = k.load(Type::Vec(Scalar::F32, 2), at);
        Half {
            lo,
            hi,
            dx: k.extract(v, 0),
            sq: k.extract(v, 1),
        }
    }

    /// Multiply a loaded piece with every vector of the pass: a stream at a time and a
    /// block of it at a time (its weights in bytes once for all vectors; a vector's sum
    /// still takes the first block before the second), each vector's activations read a
    /// block at a time.
    fn multiply(
        &self,
        k: &mut Builder,
        staged: &Staged,
        c: &Consts<'_>,
        l: Loaded,
        accs: &[Value],
    ) -> Vec<Value> {
        let streams = self.streams();
        let mut out = accs.to_vec();
        for (s, bytes) in l.weights.iter().enumerate() {
            // The stream's block `h`, what both blocks share formed once.
            let block: Box<BlockLoader<'_>> = match (&c.format, bytes) {
                (PieceFormat::Q4K { q4lane, magic, .. }, PieceBytes::Q4K(header, quants)) => {
                    let (scales, magic) = (Q4kScales::new(k, q4lane, header), *magic);
                    Box::new(move |k, h| q4k_block(k, &scales, magic, quants, h))
                }
                (PieceFormat::Q5K { lane, magic }, PieceBytes::Q5K(header, qh, qs)) => {
                    let (scales, magic) = (Q4kScales::new(k, &lane.q4k, header), *magic);
                    let high = lane.fifth_bits(k, qh);
                    Box::new(move |k, h| q5k_block(k, &scales, magic, qs, &high, h))
                }
                (PieceFormat::Q6K { field, .. }, PieceBytes::Q6K { .. }) => {
                    let piece = Q6kPiece::new(k, bytes, *field);
                    Box::new(move |k, h| piece.block(k, h))
                }
                (PieceFormat::Q4_0, PieceBytes::Whole(b)) => Box::new(|k, h| q4_0_block(k, b, h)),
                (PieceFormat::Q4_1, PieceBytes::Whole(b)) => Box::new(|k, h| q4_1_block(k, b, h)),
                (_, PieceBytes::Whole(b)) => Box::new(|k, h| q8_0_block(k, b, h)),
                _ => unreachable!("a piece's bytes are loaded for its format"),
            };
            for h in 0..2 {
                let block = block(k, h);
                for j in 0..self.p.batch {
                    let half = match &l.acts {
                        Some(a) => a[h as usize].clone(),
                        None => self.activations(k, staged, &l.blocks, h, j),
                    };
                    let at = j as usize * streams + s;
                    out[at] = block.dot(k, &half, out[at], self.p.batch > 1);
                }
            }
        }
        out
    }
}

/// A piece's block of 32 weights, ready for the byte dot products.
/// Emits the loads of one weight block (the stream's half `h`).
type BlockLoader<'a> = dyn Fn(&mut Builder, u32) -> WeightBlock + 'a;

enum WeightBlock {
    /// Q4_K: the weights in bytes — low nibbles masked in place, or high nibbles masked in
    /// place as `16·q4` (unsigned bytes, `times16`), the factor 16 taken out of the
    /// integer sum — and `(d·sc, dmin·m)`.
    Q4K {
        spread: Vec<Value>,
        times16: bool,
        dsc: Value,
        dm: Value,
    },
    /// Q8_0: the signed quant bytes, four a word, and the block's scale `d`.
    Q8_0 { quants: Vec<Value>, d: Value },
    /// Q6_K: the signed weights `q6 − 32`, four a word, and `d·sc` of each 16.
    Q6K {
        weights: Vec<Value>,
        dsc: [Value; 2],
    },
}

/// Sub-block `2g + h` of a Q4_K piece from its super-block's scales and its 32 quant
/// bytes.
fn q4k_block(
    k: &mut Builder,
    scales: &Q4kScales,
    magic: Magic,
    quants: &Bytes,
    h: u32,
) -> WeightBlock {
    let mask = if h == 0 { 0x0F0F_0F0F } else { 0xF0F0_F0F0 };
    let spread: Vec<Value> = (0..8).map(|i| k.and_const(quants.part(i), mask)).collect();
    let (dsc, dm) = scales.sub_block(k, magic, h);
    WeightBlock::Q4K {
        spread,
        times16: h == 1,
        dsc,
        dm,
    }
}

/// Sub-block `2g + h` of a Q5_K piece from its super-block's scales, its 32 qs bytes and
/// the qh words shifted down by `2g`: each weight's nibble with its fifth bit (bit `h`)
/// on top.
fn q5k_block(
    k: &mut Builder,
    scales: &Q4kScales,
    magic: Magic,
    qs: &Bytes,
    high: &[Value],
    h: u32,
) -> WeightBlock {
    let spread: Vec<Value> = (0..8)
        .map(|i| {
            let q = if h == 0 {
                qs.part(i)
            } else {
                k.shr_const(qs.part(i), 4)
            };
            let q = k.and_const(q, 0x0F0F_0F0F);
            let b = k.shl_const(high[i], 4 - h);
            let b = k.and_const(b, 0x1010_1010);
            k.or(q, b)
        })
        .collect();
    let (dsc, dm) = scales.sub_block(k, magic, h);
    WeightBlock::Q4K {
        spread,
        times16: false,
        dsc,
        dm,
    }
}

/// A Q4_0 or Q4_1 block's 4 quant words as 8 words of weights in element order: the low
/// nibbles (elements 0–15), then the high ones (16–31).
fn nibble_words(k: &mut Builder, quants: &[Value]) -> Vec<Value> {
    let low: Vec<Value> = quants
        .iter()
        .map(|&q| k.and_const(q, 0x0F0F_0F0F))
        .collect();
    let high: Vec<Value> = quants
        .iter()
        .map(|&q| {
            let q = k.shr_const(q, 4);
            k.and_const(q, 0x0F0F_0F0F)
        })
        .collect();
    low.into_iter().chain(high).collect()
}

/// Block `h` of a Q4_0 piece from its 9 words: as Q8_0's, the first block's scale is the
/// low half of word 0 and its quant word `i` joined from words `i` and `i + 1`; the
/// second's scale the high half of word 4, its quants words 5–8. The weights `q − 8` as
/// signed bytes, `(q + 0x78) ⊕ 0x80` (no byte carries into the next).
fn q4_0_block(k: &mut Builder, b: &Bytes, h: u32) -> WeightBlock {
    let quants: Vec<Value> = if h == 0 {
        (0..4)
            .map(|i| {
                let high = k.shr_const(b.part(i), 16);
                let low = k.shl_const(b.part(i + 1), 16);
                k.or(high, low)
            })
            .collect()
    } else {
        (5..9).map(|i| b.part(i)).collect()
    };
    let sign = k.const_u32(0x8080_8080);
    let quants = nibble_words(k, &quants)
        .into_iter()
        .map(|w| {
            let w = k.add_const(w, 0x7878_7878);
            k.xor(w, sign)
        })
        .collect();
    WeightBlock::Q8_0 {
        quants,
        d: b.f16(k, Q4_0_BLOCK_BYTES * h),
    }
}

/// Block `h` of a Q4_1 piece from its 10 words: `d` and `m` in word `5h`, the quants in
/// the 4 words after it; its dot product is Q4_K's with `(d, −m)` for `(d·sc, dmin·m)`.
fn q4_1_block(k: &mut Builder, b: &Bytes, h: u32) -> WeightBlock {
    let first = 5 * h as usize + 1;
    let quants: Vec<Value> = (first..first + 4).map(|i| b.part(i)).collect();
    let m = b.f16(k, Q4_1_BLOCK_BYTES * h + 2);
    WeightBlock::Q4K {
        spread: nibble_words(k, &quants),
        times16: false,
        dsc: b.f16(k, Q4_1_BLOCK_BYTES * h),
        dm: k.neg(m),
    }
}

/// Block `h` of a Q8_0 piece from its 17 words: the first block's scale is the low half
/// of word 0 and its quant word `i` the high half of word `i` joined to the low half of
/// word `i + 1`; the second block's scale is the high half of word 8, its quants words
/// 9–16.
fn q8_0_block(k: &mut Builder, b: &Bytes, h: u32) -> WeightBlock {
    if h == 0 {
        let quants = (0..8)
            .map(|i| {
                let high = k.shr_const(b.part(i), 16);
                let low = k.shl_const(b.part(i + 1), 16);
                k.or(high, low)
            })
            .collect();
        WeightBlock::Q8_0 {
            quants,
            d: b.f16(k, 0),
        }
    } else {
        WeightBlock::Q8_0 {
            quants: (9..17).map(|i| b.part(i)).collect(),
            d: b.f16(k, 34),
        }
    }
}

impl WeightBlock {
    /// `acc` plus this block's product with a staged block of activations `x`. With
    /// `both_planes_at_once` (several vectors a pass, where registers are short) a Q8_0 or
    /// Q4_0 block's weight words are each multiplied with both planes before the next.
    fn dot(&self, k: &mut Builder, x: &Half, acc: Value, both_planes_at_once: bool) -> Value {
        match self {
            WeightBlock::Q4K {
                spread,
                times16,
                dsc,
                dm,
            } => sub_block_dot(k, spread, *times16, x, *dsc, *dm, acc),
            WeightBlock::Q6K { weights, dsc } => {
                let mut acc = acc;
                for (half, &dsc) in dsc.iter().enumerate() {
                    let span = 4 * half..4 * half + 4;
                    let zero = k.const_i32(0);
                    let t = weights[span.clone()]
                        .iter()
                        .zip(&x.hi[span.clone()])
                        .fold(zero, |t, (&w, &q)| k.dp4a(w, true, q, true, t));
                    let t = k.shl_const(t, 8);
                    let t = weights[span.clone()]
                        .iter()
                        .zip(&x.lo[span])
                        .fold(t, |t, (&w, &q)| k.dp4a(w, true, q, false, t));
                    let sum = k.cvt(Scalar::F32, t);
                    let a = k.mul(dsc, x.dx);
                    acc = k.fma(a, sum, acc);
                }
                acc
            }
            WeightBlock::Q8_0 { quants, d } => {
                let zero = k.const_i32(0);
                let t = if both_planes_at_once {
                    // Each weight word meets both planes at once (then it is no longer
                    // needed); the two sums are joined after, the same integer either way.
                    let (hi, lo) = quants.iter().zip(x.hi.iter().zip(&x.lo)).fold(
                        (zero, zero),
                        |(hi, lo), (&w, (&qh, &ql))| {
                            (
                                k.dp4a(w, true, qh, true, hi),
                                k.dp4a(w, true, ql, false, lo),
                            )
                        },
                    );
                    let hi = k.shl_const(hi, 8);
                    k.add(hi, lo)
                } else {
                    let t = quants
                        .iter()
                        .zip(&x.hi)
                        .fold(zero, |t, (&w, &q)| k.dp4a(w, true, q, true, t));
                    let t = k.shl_const(t, 8);
                    quants
                        .iter()
                        .zip(&x.lo)
                        .fold(t, |t, (&w, &q)| k.dp4a(w, true, q, false, t))
                };
                let sum = k.cvt(Scalar::F32, t);
                let a = k.mul(*d, x.dx);
                k.fma(a, sum, acc)
            }
        }
    }
}

/// `acc` plus sub-block `(d·sc, dmin·m)`'s product with a staged half: `S` from the byte
/// dot products, then `fma(d·sc·dx, S, acc)` and `fma(−dmin·m·dx, Σq, ·)`. `spread` holds
/// the weights in bytes, as `16·q4` where `times16` (the sum is then `16·S`, exactly, and
/// shifted back).
fn sub_block_dot(
    k: &mut Builder,
    spread: &[Value],
    times16: bool,
    x: &Half,
    dsc: Value,
    dm: Value,
    acc: Value,
) -> Value {
    // Weight bytes below 16 read the same signed or not; 16·q4 needs them unsigned.
    let signed = !times16;
    let zero = k.const_i32(0);
    let t = spread
        .iter()
        .zip(&x.hi)
        .fold(zero, |t, (&n, &q)| k.dp4a(n, signed, q, true, t));
    let t = k.shl_const(t, 8);
    // The low bytes are unsigned: with unsigned weights too the sum is typed u32, with
    // the same bits (sums wrap modulo 2^32 either way).
    let t = if signed {
        spread
            .iter()
            .zip(&x.lo)
            .fold(t, |t, (&n, &q)| k.dp4a(n, true, q, false, t))
    } else {
        let t = k.bitcast(Type::U32, t);
        let t = spread
            .iter()
            .zip(&x.lo)
            .fold(t, |t, (&n, &q)| k.dp4a(n, false, q, false, t));
        let t = k.bitcast(Type::I32, t);
        k.shr_const(t, 4)
    };
    let sum = k.cvt(Scalar::F32, t);
    let a = k.mul(dsc, x.dx);
    let b = k.mul(dm, x.dx);
    let nb = k.neg(b);
    let acc = k.fma(a, sum, acc);
    k.fma(nb, x.sq, acc)
}

/// What a lane computes once for its pieces' format.
enum PieceFormat {
    /// `g = lane mod 4`: which pair of sub-blocks of each super-block.
    Q4K {
        g: Value,
        q4lane: Q4kLane,
        magic: Magic,
    },
    /// `g = lane mod 4`, as Q4_K, and where its fifth bits are.
    Q5K {
        lane: Q5kLane,
        magic: Magic,
    },
    /// `j = lane mod 4 = 2n + e`: the piece's ql bytes `32j ..`, qh bytes `128 + 32n ..`,
    /// its first block's two scales at `192 + 8n + 2e`, the second's 4 bytes further,
    /// and its qh fields' shift `2e`.
    Q6K {
        e: Value,
        field: Value,
        ql: Value,
        qh: Value,
        scales: Value,
    },
    Q8_0,
    Q4_0,
    Q4_1,
}

impl PieceFormat {
    /// Where piece `piece`'s activation blocks are staged: `2·piece` and the next, or for
    /// Q6_K (blocks `4n + e` and `4n + 2 + e` of the super-block) `2·piece − e` and two
    /// further.
    fn blocks(&self, k: &mut Builder, piece: Value) -> Blocks {
        match self {
            PieceFormat::Q6K { e, .. } => {
                let twice = k.shl_const(piece, 1);
                let first = k.sub(twice, *e);
                Blocks {
                    word: k.shl_const(first, 3),
                    pair: k.shl_const(first, 1),
                    apart: 2,
                }
            }
            _ => Blocks {
                word: k.shl_const(piece, 4),
                pair: k.shl_const(piece, 2),
                apart: 1,
            },
        }
    }
}

/// A piece's first activation block in the chunk's staging: its first plane word and its
/// `(dx, Σq)` pair's first float; the second block is `apart` blocks further.
struct Blocks {
    word: Value,
    pair: Value,
    apart: u32,
}

/// A row of one matrix as a lane reads it: a byte pointer, and the bytes its pieces' offsets
/// add back (a Q6_K row's start lowered to a word boundary; otherwise 0).
#[derive(Clone, Copy)]
pub(super) struct Stream {
    at: Value,
    skew: Value,
}

/// A lane's constants for a chunk's products.
struct Consts<'a> {
    format: PieceFormat,
    streams: &'a [Stream],
    /// The chunk's first column.
    c0: u32,
}

/// A stream's loads of a piece.
enum PieceBytes {
    /// The super-block header and the piece's 32 quant bytes.
    Q4K(Bytes, Bytes),
    /// The super-block header, its 32 qh bytes as words and the piece's 32 qs bytes.
    Q5K(Bytes, Vec<Value>, Bytes),
    /// 9 words from the word boundary at or below the piece's 32 ql bytes and its 32 qh
    /// bytes, the bits they are shifted by, the two scale pairs and the bits of `d`.
    Q6K {
        ql: Vec<Value>,
        qh: Vec<Value>,
        shift: Value,
        scales: [Value; 2],
        d: Value,
    },
    /// A Q8_0, Q4_0 or Q4_1 piece's bytes (68, 36 or 40).
    Whole(Bytes),
}

/// A Q6_K piece's bytes as both its blocks use them: the ql and qh words aligned, the
/// qh fields of the piece moved down by `2e`, and `d`.
struct Q6kPiece {
    ql: Vec<Value>,
    qh: Vec<Value>,
    scales: [Value; 2],
    d: Value,
}

impl Q6kPiece {
    fn new(k: &mut Builder, bytes: &PieceBytes, field: Value) -> Q6kPiece {
        let PieceBytes::Q6K {
            ql,
            qh,
            shift,
            scales,
            d,
        } = bytes
        else {
            unreachable!("Q6_K bytes")
        };
        // Word i of a run: bits `shift ..` of the 64 bits of loaded words i, i + 1 (a
        // shift by 32 gives 0).
        let c32 = k.const_u32(32);
        let back = k.sub(c32, *shift);
        let join = |k: &mut Builder, w: &[Value]| -> Vec<Value> {
            (0..8)
                .map(|i| {
                    let lo = k.shr(w[i], *shift);
                    let hi = k.shl(w[i + 1], back);
                    k.or(lo, hi)
                })
                .collect()
        };
        let ql = join(k, ql);
        let qh = join(k, qh);
        let qh = qh.iter().map(|&w| k.shr(w, field)).collect();
        Q6kPiece {
            ql,
            qh,
            scales: *scales,
            d: f16_bits_to_f32(k, *d),
        }
    }

    /// Block `h`: the low (`h = 0`) or high nibbles of the ql bytes, the qh field `2h`
    /// (after the piece's shift) on top, less 32, as signed bytes: `(v + 0x60) ⊕ 0x80`
    /// per byte (`v < 64`, so no byte carries into the next); `d·sc` of each 16 weights.
    fn block(&self, k: &mut Builder, h: u32) -> WeightBlock {
        let weights = self
            .ql
            .iter()
            .zip(&self.qh)
            .map(|(&l, &hb)| {
                let (l, hb) = if h == 0 {
                    (l, k.shl_const(hb, 4))
                } else {
                    (k.shr_const(l, 4), hb)
                };
                let l = k.and_const(l, 0x0F0F_0F0F);
                let hb = k.and_const(hb, 0x3030_3030);
                let v = k.add(l, hb);
                let v = k.add_const(v, 0x6060_6060);
                let sign = k.const_u32(0x8080_8080);
                k.xor(v, sign)
            })
            .collect();
        let pair = self.scales[h as usize];
        let dsc = [24, 16].map(|up| {
            let s = k.shl_const(pair, up);
            let s = k.bitcast(Type::I32, s);
            let s = k.shr_const(s, 24);
            let s = k.cvt(Scalar::F32, s);
            k.mul(self.d, s)
        });
        WeightBlock::Q6K { weights, dsc }
    }
}

/// A piece's loads: where its activations are staged, each stream's bytes, and at one
/// vector a pass the activations of both blocks.
struct Loaded {
    blocks: Blocks,
    weights: Vec<PieceBytes>,
    acts: Option<[Half; 2]>,
}

/// A vector's staged activations of one 32-element block.
#[derive(Clone)]
struct Half {
    lo: Vec<Value>,
    hi: Vec<Value>,
    dx: Value,
    sq: Value,
}

/// Whether the kernel of `p` takes this path (Q4_K, Q5_K, Q6_K, Q8_0, Q4_0 and Q4_1
/// weights).
pub(super) fn applies(p: &QGemvParams) -> bool {
    p.format.is_integer()
}

/// The RMSNorm prologue's staged vectors always fit whole: `batch · cols` is at most
/// [`prologue::MAX_COLS`].
const _: () = assert!(
    2 * prologue::MAX_COLS as u64 + prologue::MAX_COLS as u64 / 4 + SLACK
        <= MAX_STATIC_SHARED_BYTES
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data;

    /// Every quantized value is at most 32767 in magnitude and within `(½ + 2^-7)·dx` of
    /// its activation; blocks of zeros, and of values too small for a normal step, give
    /// zeros; the sums are the sums.
    #[test]
    fn quantization_is_within_half_a_step() {
        let mut rng = data::rng(data::test_seed());
        let mut x = data::signed(&mut rng, 32 * 64, 1.0 / 4096.0, 64.0);
        x[..32].fill(0.0);
        x[32..64].iter_mut().for_each(|v| *v *= 1e-36);
        let qx = quantize(&x);
        assert_eq!((qx.dx[0], qx.dx[1]), (0.0, 0.0));
        assert!(qx.q[..64].iter().all(|&q| q == 0));
        for (j, (xb, qb)) in x
            .chunks_exact(32)
            .zip(qx.q.chunks_exact(32))
            .enumerate()
            .skip(2)
        {
            let dx = f64::from(qx.dx[j]);
            assert!(dx > 0.0);
            assert!(
                qb.iter().any(|q| q.abs() == 32767),
                "block {j} has no full-scale value"
            );
            for (&v, &q) in xb.iter().zip(qb) {
                assert!(q.abs() <= 32767);
                let err = (f64::from(v) - f64::from(q) * dx).abs();
                assert!(err <= (0.5 + 1.0 / 128.0) * dx, "block {j}: {v} → {q}·{dx}");
            }
            assert_eq!(qx.sq[j], qb.iter().sum::<i32>());
        }
    }
}
