//! Embedding gather: `out[t] = table[ids[t]]`, widened or dequantized to f32 — the first
//! step of a forward pass, turning token ids into the f32 residual stream.
//!
//! **Layout**: `ids` `[n]` u32; `table` `[vocab, dim]` row-major in one of
//! [`TableFormat`] (GGUF block layout for the quantized ones, rows back to back); `out`
//! `[n, dim]` f32. One block per token (grid = n); the row is cut into groups (8 elements
//! for float tables, one 32-element block for quantized ones) walked by
//! [`crate::rows::RowWalk`]. `dim` is fixed in the kernel: a multiple of 8 for float
//! tables, of 32 for quantized ones.
//!
//! **Bad ids**: an id `≥ vocab` (a runtime argument) reads nothing and gives a row of
//! NaN, so that a wrong token shows downstream instead of reading outside the table.
//!
//! **Arithmetic**: widening is exact, and dequantization is [`crate::ggml`]'s, which gives
//! exactly [`quench_models::dequant`]'s values; the reference compares bit for bit.

use quench_ir::{Builder, CacheOp, Function, Scalar, Type, Value};
use quench_models::{dequant, GgmlType};
use quench_rt::{Arg, Launch};

use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::ggml::{self, Bytes, Magic};
use crate::lanes::{emit_unpack_bf16x2, emit_unpack_f16x2, gptr, wide_mul, words};
use crate::rows::{self, RowWalk};

/// Element formats of an embedding table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableFormat {
    F32,
    BF16,
    F16,
    Q8_0,
    Q4_1,
    /// Q4_K super-blocks of 256 (the token embedding of llama.cpp's Q4_K_M files).
    Q4K,
    /// Q5_K super-blocks of 256 (the token embedding of llama.cpp's Q5_K_M files).
    Q5K,
    /// Q6_K super-blocks of 256 (llama.cpp's Q6_K files).
    Q6K,
}

impl TableFormat {
    pub const ALL: [TableFormat; 8] = [
        TableFormat::F32,
        TableFormat::BF16,
        TableFormat::F16,
        TableFormat::Q8_0,
        TableFormat::Q4_1,
        TableFormat::Q4K,
        TableFormat::Q5K,
        TableFormat::Q6K,
    ];

    /// The kernel's library name (`embed_q8_0`).
    pub fn kernel_name(self) -> &'static str {
        match self {
            TableFormat::F32 => "embed_f32",
            TableFormat::BF16 => "embed_bf16",
            TableFormat::F16 => "embed_f16",
            TableFormat::Q8_0 => "embed_q8_0",
            TableFormat::Q4_1 => "embed_q4_1",
            TableFormat::Q4K => "embed_q4_k",
            TableFormat::Q5K => "embed_q5_k",
            TableFormat::Q6K => "embed_q6_k",
        }
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            TableFormat::F32 => GgmlType::F32,
            TableFormat::BF16 => GgmlType::BF16,
            TableFormat::F16 => GgmlType::F16,
            TableFormat::Q8_0 => GgmlType::Q8_0,
            TableFormat::Q4_1 => GgmlType::Q4_1,
            TableFormat::Q4K => GgmlType::Q4_K,
            TableFormat::Q5K => GgmlType::Q5_K,
            TableFormat::Q6K => GgmlType::Q6_K,
        }
    }

    /// Elements per thread step: a 16-byte load of a float row, or one quant block.
    /// Elements one thread gathers at a time (a quantized block, or a k-quant piece).
    pub fn group(self) -> u32 {
        match self {
            TableFormat::F32 | TableFormat::BF16 | TableFormat::F16 => 8,
            TableFormat::Q8_0 | TableFormat::Q4_1 | TableFormat::Q6K => 32,
            TableFormat::Q4K | TableFormat::Q5K => 64,
        }
    }

    fn row_bytes(self, dim: u32) -> u32 {
        match self {
            TableFormat::F32 => dim * 4,
            TableFormat::BF16 | TableFormat::F16 => dim * 2,
            TableFormat::Q8_0 => dim / 32 * 34,
            TableFormat::Q4_1 => dim / 32 * 20,
            TableFormat::Q4K => dim / 256 * 144,
            TableFormat::Q5K => dim / 256 * 176,
            TableFormat::Q6K => dim / 256 * 210,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EmbedParams {
    pub format: TableFormat,
    /// Row length (the model's hidden size).
    pub dim: u32,
    /// Threads per block: a multiple of 32, at most 1024.
    pub threads: u32,
}

impl EmbedParams {
    fn walk(&self) -> RowWalk {
        RowWalk {
            groups: self.dim / self.format.group(),
            threads: self.threads,
        }
    }

    /// One block per token.
    pub fn launch(&self, tokens: u32) -> Launch {
        Launch::linear(tokens, self.threads)
    }
}

/// `embed_<format>(ids, table, out, vocab)`, launched with one block per token.
pub fn build(p: &EmbedParams) -> Result<Function, KernelError> {
    let name = p.format.kernel_name();
    rows::check(name, p.dim, p.format.group(), p.threads)?;
    let block = p.format.ggml().block_size();
    if !u64::from(p.dim).is_multiple_of(block) {
        return Err(KernelError::unsupported(
            name,
            format!(
                "dim = {} is not a multiple of the {block}-element block",
                p.dim
            ),
        ));
    }
    let mut k = Builder::new(name, p.threads);
    let ids = k.param("ids", gptr(Scalar::U32));
    let table = k.param("table", gptr(Scalar::U8));
    let out = k.param("out", gptr(Scalar::F32));
    let vocab = k.param("vocab", Type::U32);
    let t = k.ctaid_x();
    let tid = k.tid_x();
    let at = k.ptr_add(ids, t);
    let id = k.load_with(Type::U32, at, CacheOp::Nc);
    let valid = k.lt(id, vocab);
    let zero = k.const_u32(0);
    let row = k.select(valid, id, zero);
    let start = wide_mul(&mut k, row, p.format.row_bytes(p.dim));
    let trow = k.ptr_add(table, start);
    let ostart = wide_mul(&mut k, t, p.dim);
    let orow = k.ptr_add(out, ostart);
    let nan = k.const_f32(f32::NAN);
    let magic = Magic::new(&mut k);
    let group = p.format.group();
    let format = p.format;

    p.walk().emit(&mut k, tid, &[], &|k, g, _| {
        let (values, runs) = emit_group(k, format, magic, trow, g);
        let values: Vec<Value> = values
            .into_iter()
            .map(|v| k.select(valid, v, nan))
            .collect();
        let firsts = match runs {
            Some(runs) => runs.to_vec(),
            None => vec![k.mul_const(g, group)],
        };
        let per_run = group / firsts.len() as u32;
        for (&first, run) in firsts.iter().zip(values.chunks(per_run as usize)) {
            let o = k.ptr_add(orow, first);
            for (i, four) in run.chunks(4).enumerate() {
                let v = k.pack(Type::Vec(Scalar::F32, 4), four);
                let c = k.const_u32(4 * i as u32);
                let at = k.ptr_add(o, c);
                k.store(at, v);
            }
        }
        vec![]
    });
    Ok(k.finish()?)
}

/// The f32 values of group `g` of the table row starting at byte pointer `trow`, and,
/// for a Q6_K piece, the row elements its two runs of 16 start at (`128hh + 16c` and 64
/// past it, [`ggml::Q6kLane`]); every other group is one run from element
/// `g · group`.
fn emit_group(
    k: &mut Builder,
    format: TableFormat,
    magic: Magic,
    trow: Value,
    g: Value,
) -> (Vec<Value>, Option<[Value; 2]>) {
    let vec4 = Type::Vec(Scalar::U32, 4);
    match format {
        TableFormat::F32 => {
            let p = k.ptr_cast(Scalar::F32, trow);
            let first = k.shl_const(g, 3);
            let p = k.ptr_add(p, first);
            let mut out = vec![];
            for half in 0..2 {
                let c = k.const_u32(4 * half);
                let at = k.ptr_add(p, c);
                let v = k.load_with(Type::Vec(Scalar::F32, 4), at, CacheOp::Nc);
                out.extend((0..4).map(|i| k.extract(v, i)));
            }
            (out, None)
        }
        TableFormat::BF16 | TableFormat::F16 => {
            let w = words(k, trow);
            let first = k.shl_const(g, 2);
            let at = k.ptr_add(w, first);
            let v = k.load_with(vec4, at, CacheOp::Nc);
            let mut out = vec![];
            for i in 0..4 {
                let word = k.extract(v, i);
                if format == TableFormat::BF16 {
                    out.extend(emit_unpack_bf16x2(k, word));
                } else {
                    out.extend(emit_unpack_f16x2(k, word));
                }
            }
            (out, None)
        }
        TableFormat::Q8_0 | TableFormat::Q4_1 => {
            let (bytes, width) = if format == TableFormat::Q8_0 {
                (34, 2)
            } else {
                (20, 4)
            };
            let off = k.mul_const(g, bytes);
            let at = k.ptr_add(trow, off);
            let b = Bytes::load(k, at, bytes, width);
            let values = if format == TableFormat::Q8_0 {
                ggml::q8_0_block(k, magic, &b, 0)
            } else {
                ggml::q4_1_block(k, magic, &b, 0)
            };
            (values, None)
        }
        TableFormat::Q4K => {
            // Group `g` is piece `g mod 4` of super-block `g / 4` (144 bytes: a 16-byte
            // header of scales, then 128 bytes of nibbles), 16-byte aligned.
            let (sb, piece) = (k.shr_const(g, 2), k.and_const(g, 3));
            let off = k.mul_const(sb, 144);
            let at = k.ptr_add(trow, off);
            let header = Bytes::load(k, at, 16, 16);
            let lane = ggml::Q4kLane::new(k, piece);
            let scales = ggml::Q4kScales::new(k, &lane, &header);
            let qs_off = k.shl_const(piece, 5);
            let qs_off = k.add_const(qs_off, 16);
            let qs_at = k.ptr_add(at, qs_off);
            let qs = Bytes::load(k, qs_at, 32, 16);
            let values = ggml::k_quant_piece(k, magic, &scales, &qs, None);
            (values, None)
        }
        TableFormat::Q5K => {
            // Group `g` is piece `g mod 4` of super-block `g / 4` (176 bytes: Q4_K's
            // 16-byte header, 32 bytes of fifth bits, 128 bytes of nibbles), 16-byte
            // aligned.
            let (sb, piece) = (k.shr_const(g, 2), k.and_const(g, 3));
            let off = k.mul_const(sb, 176);
            let at = k.ptr_add(trow, off);
            let lane = ggml::Q5kLane::new(k, piece);
            let (header, qh, qs) = lane.load(k, at);
            let scales = ggml::Q4kScales::new(k, &lane.q4k, &header);
            let high = lane.fifth_bits(k, &qh);
            let values = ggml::k_quant_piece(k, magic, &scales, &qs, Some(&high));
            (values, None)
        }
        TableFormat::Q6K => {
            // Group `g` is piece `g mod 8` of super-block `g / 8` (210 bytes: 128 of low
            // nibbles, 64 of high bits, 16 scales, f16 d), 2-byte aligned.
            let sb = k.shr_const(g, 3);
            let off = k.mul_const(sb, 210);
            let at = k.ptr_add(trow, off);
            let j = k.and_const(g, 7);
            let lane = ggml::Q6kLane::new(k, j);
            let (ql, qh, scales, d) = lane.load(k, at);
            let values = ggml::q6_k_piece(k, magic, &lane, &ql, &qh, scales, d);
            let base = k.shl_const(sb, 8);
            let runs = lane.runs.map(|r| k.add(base, r));
            (values, Some(runs))
        }
    }
}

/// The rows of `table` named by `ids`, dequantized; a row of NaN for an id `≥ vocab`.
pub fn reference(
    p: &EmbedParams,
    table: &[u8],
    vocab: u32,
    ids: &[u32],
) -> Result<Vec<f32>, KernelError> {
    let rb = p.format.row_bytes(p.dim) as usize;
    let mut out = Vec::with_capacity(ids.len() * p.dim as usize);
    for &id in ids {
        if id >= vocab {
            out.extend(std::iter::repeat_n(f32::NAN, p.dim as usize));
            continue;
        }
        let row = &table[id as usize * rb..(id as usize + 1) * rb];
        let values = dequant::dequantize(p.format.ggml(), row, p.dim as usize)
            .map_err(|e| KernelError::unsupported(p.format.kernel_name(), e.to_string()))?;
        out.extend(values);
    }
    Ok(out)
}

/// A case of `tokens` ids into a table of `vocab` random rows (floats in ±[2^-8, 4];
/// quantized rows with every bit pattern of the quants and f16 scales in ±[2^-10, 2^-4]);
/// the last id (of two or more) is `vocab`, out of range. A Q5_K table's case holds
/// [`data::q5_k_mistakes`] as controls.
pub fn case(
    p: &EmbedParams,
    tokens: u32,
    vocab: u32,
    seed: u64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    let mut rng = data::rng(seed);
    let (lo, hi) = match p.format {
        TableFormat::Q8_0
        | TableFormat::Q4_1
        | TableFormat::Q4K
        | TableFormat::Q5K
        | TableFormat::Q6K => (0.0009765625, 0.0625),
        _ => (0.00390625, 4.0),
    };
    let table = data::ggml_rows(
        &mut rng,
        p.format.ggml(),
        vocab as usize,
        p.dim as usize,
        lo,
        hi,
    );
    let mut ids: Vec<u32> = (0..tokens).map(|_| data::below(&mut rng, vocab)).collect();
    if tokens >= 2 {
        ids[tokens as usize - 1] = vocab;
    }
    let want = reference(p, &table, vocab, &ids)?;
    let n = tokens as usize * p.dim as usize;
    let expected = |data: &[f32]| Expected {
        buffer: 2,
        data: data::f32_bytes(data),
        elem: Scalar::F32,
        check: Check::Exact,
    };
    // Q5_K's mistakes, which the gathered rows must not match.
    let mistakes = match p.format {
        TableFormat::Q5K => data::q5_k_mistakes(&table),
        _ => vec![],
    };
    let controls = mistakes
        .iter()
        .map(|(what, wrong)| {
            Ok(Control {
                what: what.to_string(),
                expected: expected(&reference(p, wrong, vocab, &ids)?),
            })
        })
        .collect::<Result<_, KernelError>>()?;
    Ok(KernelCase {
        name: p.format.kernel_name().to_string(),
        shape: format!("{tokens} of {vocab}x{}", p.dim),
        kernel,
        launch: p.launch(tokens),
        buffers: vec![
            Buffer::input("ids", ids.iter().flat_map(|i| i.to_le_bytes()).collect()),
            Buffer::input("table", table),
            Buffer::output("out", n * 4),
        ],
        args: vec![
            CaseArg::Buffer(0),
            CaseArg::Buffer(1),
            CaseArg::Buffer(2),
            CaseArg::Scalar(Arg::U32(vocab)),
        ],
        expected: vec![expected(&want)],
        controls,
        bytes_moved: tokens as u64 * (4 + p.format.row_bytes(p.dim) as u64 + 4 * p.dim as u64),
        flops: 0,
    })
}
