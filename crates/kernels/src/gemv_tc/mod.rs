//! Decode-time products of bf16 matrices with a few f32 activation rows on the tensor
//! cores: `y[n, rows] = x[n, cols] · Wᵀ` for any `n`, with the epilogues of the
//! matrix–vector kernels ([`Epilogue`]: plain, residual `y = W·x + r` in place on a
//! residual stream or with one bias row, SwiGLU over a gate and an up matrix). Built for
//! steps of many sequences: the weights are read from memory once per launch for up to
//! `8 · tiles` rows of `x`, and a row's outputs have the same bits whatever `n` is.
//!
//! **Layout**: `W` `[rows, cols]` bf16 row-major (`cols` a multiple of 32); `x` `[n, cols]`
//! f32; `y` `[n, rows]` f32; `r` `[n, r_stride]` f32 (`r_stride = rows` for a residual
//! stream, 0 for one bias row). Arguments: `(w, x, y, n)`, `(w, x, r, y, n, r_stride)` or
//! `(w_gate, w_up, x, y, n)`, as the matrix–vector kernels without a prologue take them.
//!
//! **Mapping**: a block computes `16 · row_tiles` rows for every row of `x`; its `warps`
//! warps split `k`: the 32-column chunks of a row go to warp `c mod warps`, each warp
//! taking its chunks in increasing order, `unroll` of them loaded before any product. For a
//! chunk, lane `l` (`g = l / 4`, `t = l mod 4`) loads 16 bytes of weight rows `g` and
//! `g + 8` of each row tile at columns `8t .. 8t + 8` with plain global loads, and the f32
//! activations of token `g` of each 8-token tile at the same columns. They are the A and B
//! fragments of two `mma.m16n8k16` (columns `8t .. 8t + 4`, then `8t + 4 .. 8t + 8`, as the
//! fragments' k pairs `2t, 2t + 1` and `2t + 8, 2t + 9`): `k` is permuted, identically
//! for A and B. The A fragments of a chunk serve every token tile of the pass. The warps'
//! accumulators then meet in shared memory, and each output is the sum of the warps'
//! partials in warp order, followed by the epilogue.
//!
//! **Accuracy**: the tensor cores multiply bf16. Each activation is split as
//! `hi = bf16(x)`, `lo = bf16(x − hi)` (the subtraction is exact), and both are multiplied
//! into the same accumulator, so `x` takes part with `|x − hi − lo| ≤ 2^-16·|x|`; the
//! products of bf16 values are exact in f32. What remains is the tensor cores' f32
//! accumulation, which [`tolerance_rel`] bounds per MMA against the exact [`reference`].
//!
//! **Batch invariance**: an output element's arithmetic is a function of `(cols, warps)`
//! only. Its k order (which warp takes which chunk, the MMA chain in each warp, the
//! warps' sum in warp order) never depends on `n`, the token tiles or the other rows
//! of `x`; the token tiles of a pass are processed identically and column `j` of an MMA's
//! result depends only on column `j` of its B operand. Padding tokens of a partial tile
//! read the last row of `x` and are never stored. So a row of `x` gets the same bits
//! alone as in a batch of any size (the tests check it at n = 1, 3, 8, 17 and 64).

#[cfg(test)]
mod tests;

use half::bf16;
use quench_ir::{Builder, FragRole, Function, MmaShape, Scalar, Type, Value};
use quench_rt::{Arg, Launch};

use crate::approx::{F32_MIN_NORMAL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{emit_unpack_bf16x2, gptr, wide_mul};
use crate::norm_residual::OutType;
use crate::params::{ParamInfo, Reader};
use crate::qgemv::swiglu_tolerance;
pub use crate::qgemv::{Addend, Epilogue};

/// Columns one warp takes at a time: two `k16` MMAs.
const CHUNK: u32 = 32;
/// Static shared memory the warps' partials may take.
const SHARED_BYTES: u32 = 48 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemvTcParams {
    pub epilogue: Epilogue,
    pub rows: u32,
    /// A multiple of 32.
    pub cols: u32,
    /// Warps per block, each taking every `warps`-th 32-column chunk: 1..=16.
    pub warps: u32,
    /// Tiles of 16 rows a warp computes, sharing each activation load: 1..=4.
    pub row_tiles: u32,
    /// Tiles of 8 rows of `x` a pass takes (the weights are read once per pass): 1..=8.
    pub tiles: u32,
    /// Chunks each warp loads before it multiplies: 1..=8.
    pub unroll: u32,
}

/// Library names, by epilogue (in [`Epilogue::ALL`] order).
const NAMES: [&str; 3] = [
    "gemv_tc_bf16_xf32",
    "gemv_tc_bf16_residual_xf32",
    "gemv_tc_bf16_swiglu_xf32",
];

pub fn name(epilogue: Epilogue) -> &'static str {
    NAMES[Epilogue::ALL
        .iter()
        .position(|&e| e == epilogue)
        .unwrap_or(0)]
}

impl GemvTcParams {
    pub fn name(&self) -> &'static str {
        name(self.epilogue)
    }

    /// Matrices read: two for SwiGLU.
    fn matrices(&self) -> u32 {
        if self.epilogue == Epilogue::SwiGlu {
            2
        } else {
            1
        }
    }

    /// Rows a block computes.
    pub fn block_rows(&self) -> u32 {
        16 * self.row_tiles
    }

    /// Rows of `x` a pass takes.
    pub fn per_pass(&self) -> u32 {
        8 * self.tiles
    }

    /// A block per `16 · row_tiles` rows; the grid is the same for any `n`.
    pub fn launch(&self) -> Launch {
        Launch::linear(self.rows.div_ceil(self.block_rows()), self.warps * 32)
    }

    /// f32 partials one warp leaves in shared memory per row tile and matrix.
    fn partials(&self) -> u32 {
        self.warps * self.tiles * 128
    }

    pub fn check(&self) -> Result<(), KernelError> {
        let bad = |reason: String| Err(KernelError::unsupported(self.name(), reason));
        if self.cols == 0 || !self.cols.is_multiple_of(CHUNK) {
            return bad(format!(
                "cols = {} must be a positive multiple of {CHUNK}",
                self.cols
            ));
        }
        if self.rows == 0
            || !(1..=16).contains(&self.warps)
            || !(1..=4).contains(&self.row_tiles)
            || !(1..=8).contains(&self.tiles)
            || !(1..=8).contains(&self.unroll)
        {
            return bad(format!(
                "rows = {} must be positive, warps = {} in 1..=16, row_tiles = {} in 1..=4, tiles = {} in 1..=8, \
                 unroll = {} in 1..=8",
                self.rows, self.warps, self.row_tiles, self.tiles, self.unroll
            ));
        }
        if 4 * self.partials() > SHARED_BYTES {
            return bad(format!(
                "warps × tiles = {} × {}: the warps' partials need {} bytes of shared memory, more than {SHARED_BYTES}",
                self.warps,
                self.tiles,
                4 * self.partials()
            ));
        }
        Ok(())
    }
}

/// Parameters of the library entries, with the defaults the decode step uses at 4096
/// columns: two row tiles a warp, or one for SwiGLU, whose two matrices already share
/// each activation load.
pub fn params_info(epilogue: Epilogue) -> &'static [ParamInfo] {
    match epilogue {
        Epilogue::SwiGlu => PARAMS_SWIGLU,
        _ => PARAMS,
    }
}

const PARAMS: &[ParamInfo] = &params(4096, "matrix rows (the grid; the case size)", 2);

const PARAMS_SWIGLU: &[ParamInfo] =
    &params(14336, "rows of each matrix (the grid; the case size)", 1);

/// The parameters with the defaults of `rows` (and its doc) and `row_tiles`.
const fn params(rows: u64, rows_doc: &'static str, row_tiles: u64) -> [ParamInfo; 7] {
    [
        ParamInfo {
            name: "rows",
            default: rows,
            doc: rows_doc,
        },
        ParamInfo {
            name: "cols",
            default: 4096,
            doc: "matrix columns, a multiple of 32",
        },
        ParamInfo {
            name: "warps",
            default: 8,
            doc: "warps per block, splitting the columns (1..=16)",
        },
        ParamInfo {
            name: "row_tiles",
            default: row_tiles,
            doc: "tiles of 16 rows per warp (1..=4)",
        },
        ParamInfo {
            name: "tiles",
            default: 8,
            doc: "tiles of 8 activation rows per pass (1..=8)",
        },
        ParamInfo {
            name: "unroll",
            default: 2,
            doc: "32-column chunks loaded before the products (1..=8)",
        },
        ParamInfo {
            name: "n",
            default: 8,
            doc: "activation rows (a launch argument; the case size)",
        },
    ]
}

/// The library entry's parameters.
pub(crate) fn params_from(
    epilogue: Epilogue,
    r: &Reader,
) -> Result<(GemvTcParams, u32), KernelError> {
    let p = GemvTcParams {
        epilogue,
        rows: r.get("rows", 1, (1 << 31) - 1)?,
        cols: r.get("cols", 1, 1 << 24)?,
        warps: r.get("warps", 1, 16)?,
        row_tiles: r.get("row_tiles", 1, 4)?,
        tiles: r.get("tiles", 1, 8)?,
        unroll: r.get("unroll", 1, 8)?,
    };
    Ok((p, r.get("n", 1, 1 << 16)?))
}

/// Library descriptions, by epilogue.
pub(crate) fn description(epilogue: Epilogue) -> &'static str {
    match epilogue {
        Epilogue::Plain => "y = x·Wᵀ on tensor cores: bf16 W, f32 x split into bf16 hi + lo, n rows of x, batch-invariant",
        Epilogue::Residual => "y = x·Wᵀ + r on tensor cores (r a residual stream in place, or one bias row), batch-invariant",
        Epilogue::SwiGlu => {
            "y = silu(x·W_gateᵀ)·(x·W_upᵀ) on tensor cores, ex2.approx and div.approx, f32 out, batch-invariant"
        }
    }
}

/// See the module docs for the arguments.
pub fn build(p: &GemvTcParams) -> Result<Function, KernelError> {
    p.check()?;
    let threads = p.warps * 32;
    let mut k = Builder::new(p.name(), threads);
    let we = gptr(Scalar::BF16);
    let weights = match p.epilogue {
        Epilogue::SwiGlu => vec![k.param("w_gate", we), k.param("w_up", we)],
        _ => vec![k.param("w", we)],
    };
    let x = k.param("x", gptr(Scalar::F32));
    let r = (p.epilogue == Epilogue::Residual).then(|| k.param("r", gptr(Scalar::F32)));
    let y = k.param("y", gptr(Scalar::F32));
    let n = k.param("n", Type::U32);
    let r = r.map(|r| (r, k.param("r_stride", Type::U32)));
    let partials = k.shared_array("partials", Scalar::F32, p.partials(), 16);

    let tid = k.tid_x();
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    let g = k.shr_const(lane, 2);
    let t = k.and_const(lane, 3);
    let first_row = k.ctaid_x();
    let first_row = k.mul_const(first_row, p.block_rows());
    let streams = weight_streams(&mut k, p, &weights, first_row, g);
    // Lane's first column in the warp's first chunk: chunk `warp`, columns `8t ..`.
    let col0 = {
        let c = k.mul_const(warp, CHUNK);
        let t8 = k.mul_const(t, 8);
        k.add(c, t8)
    };
    let last = k.add_const(n, u32::MAX); // n − 1: padding tokens read the last row
    let frag_c = Builder::frag_type(MmaShape::M16N8K16, FragRole::C, Scalar::F32);
    let zero = k.const_f32(0.0);
    let zero_acc = k.pack(frag_c, &[zero; 4]);

    let start = k.const_u32(0);
    let step = k.const_u32(p.per_pass());
    k.for_range(start, n, step, &[], |k, pass, _| {
        // Accumulators: [tile][stream], a stream being a row tile of one matrix.
        let accs = vec![zero_acc; (p.tiles as usize) * streams.len()];
        let accs = emit_k_loop(k, p, &streams, x, col0, warp, g, pass, n, last, &accs);
        emit_combine(
            k, p, partials, &accs, tid, lane, warp, first_row, pass, n, y, r,
        );
        vec![]
    });
    Ok(k.finish()?)
}

/// Pointers (as `u32` words) to the starts of weight rows `g` and `g + 8` of each row
/// tile of each matrix, `[row tile][matrix]` order, each as a (row g, row g + 8) pair. Rows past the matrix read its last row (their outputs are not stored).
fn weight_streams(
    k: &mut Builder,
    p: &GemvTcParams,
    weights: &[Value],
    first_row: Value,
    g: Value,
) -> Vec<[Value; 2]> {
    let mut out = vec![];
    for tile in 0..p.row_tiles {
        let rows_of = |k: &mut Builder, half: u32| {
            let row = k.add(first_row, g);
            let row = k.add_const(row, 16 * tile + 8 * half);
            if p.rows.is_multiple_of(p.block_rows()) {
                row
            } else {
                let last = k.const_u32(p.rows - 1);
                k.min(row, last)
            }
        };
        let rows = [rows_of(k, 0), rows_of(k, 1)];
        for &w in weights {
            let words = k.ptr_cast(Scalar::U32, w);
            let pair = rows.map(|row| {
                let at = wide_mul(k, row, p.cols / 2);
                k.ptr_add(words, at)
            });
            out.push(pair);
        }
    }
    out
}

/// The loop over the warp's chunks: `unroll` chunks' weights loaded, then for each token
/// tile of the pass that exists its activations loaded, split and multiplied. Returns the
/// accumulators, `[tile][stream]`.
#[allow(clippy::too_many_arguments)]
fn emit_k_loop(
    k: &mut Builder,
    p: &GemvTcParams,
    streams: &[[Value; 2]],
    x: Value,
    col0: Value,
    warp: Value,
    g: Value,
    pass: Value,
    n: Value,
    last: Value,
    accs: &[Value],
) -> Vec<Value> {
    let chunks = p.cols / CHUNK;
    let per_step = p.warps * p.unroll;
    let steps = chunks / per_step;
    // Each tile's token row of `x` for this lane (`g` of the tile, or the last row).
    let x_rows: Vec<Value> = (0..p.tiles)
        .map(|i| {
            let tok = k.add(pass, g);
            let tok = k.add_const(tok, 8 * i);
            let tok = k.min(tok, last);
            let at = wide_mul(k, tok, p.cols);
            k.ptr_add(x, at)
        })
        .collect();
    let chunk_products = |k: &mut Builder, cols: &[Value], accs: &[Value]| {
        let a: Vec<Vec<[Value; 2]>> = cols.iter().map(|&c| load_weights(k, streams, c)).collect();
        let mut out = accs.to_vec();
        for (i, &xr) in x_rows.iter().enumerate() {
            let s = streams.len();
            let before = out[i * s..(i + 1) * s].to_vec();
            let multiply = |k: &mut Builder| {
                let mut acc = before.clone();
                for (u, &c) in cols.iter().enumerate() {
                    let b = load_split_activations(k, xr, c);
                    for (acc, frags) in acc.iter_mut().zip(&a[u]) {
                        for (half, fa) in frags.iter().enumerate() {
                            // hi, then lo, into the same accumulator.
                            *acc = k.mma(MmaShape::M16N8K16, *fa, b[half][0], *acc);
                            *acc = k.mma(MmaShape::M16N8K16, *fa, b[half][1], *acc);
                        }
                    }
                }
                acc
            };
            let after = if i == 0 {
                // The pass's first tile always has its first token.
                multiply(k)
            } else {
                let first = k.add_const(pass, 8 * i as u32);
                let has = k.lt(first, n);
                k.if_else(has, &vec![frag_type_c(); s], multiply, |_| before.clone())
            };
            out[i * s..(i + 1) * s].copy_from_slice(&after);
        }
        out
    };

    let mut accs = accs.to_vec();
    if steps > 0 {
        let lo = k.const_u32(0);
        let hi = k.const_u32(steps);
        let one = k.const_u32(1);
        accs = k.for_range(lo, hi, one, &accs, |k, s, carried| {
            // Chunk `(s · unroll + u) · warps + warp` for each u, as a column offset.
            let base = k.mul_const(s, per_step * CHUNK);
            let base = k.add(base, col0);
            let cols: Vec<Value> = (0..p.unroll)
                .map(|u| k.add_const(base, u * p.warps * CHUNK))
                .collect();
            chunk_products(k, &cols, carried)
        });
    }
    // Chunks left after the full steps: the next ones in the same order, one at a time;
    // a warp whose chunk is past the row has none (the condition is warp-uniform).
    let done = steps * per_step;
    for j in 0..(chunks - done).div_ceil(p.warps) {
        let offset = (done + j * p.warps) * CHUNK;
        let col = k.add_const(col0, offset);
        if done + (j + 1) * p.warps <= chunks {
            accs = chunk_products(k, &[col], &accs);
        } else {
            let chunk = k.add_const(warp, done + j * p.warps);
            let limit = k.const_u32(chunks);
            let has = k.lt(chunk, limit);
            let before = accs.clone();
            let types = vec![frag_type_c(); before.len()];
            accs = k.if_else(
                has,
                &types,
                |k| chunk_products(k, &[col], &before),
                |_| before.clone(),
            );
        }
    }
    accs
}

fn frag_type_c() -> Type {
    Builder::frag_type(MmaShape::M16N8K16, FragRole::C, Scalar::F32)
}

/// The A fragments of one chunk for each stream: the first MMA's (columns `8t .. 8t + 4`)
/// and the second's (`8t + 4 .. 8t + 8`). `col` is the lane's first column.
fn load_weights(k: &mut Builder, streams: &[[Value; 2]], col: Value) -> Vec<[Value; 2]> {
    let frag_a = Builder::frag_type(MmaShape::M16N8K16, FragRole::A, Scalar::BF16);
    let words = k.shr_const(col, 1);
    let words = k.cvt(Scalar::U64, words);
    streams
        .iter()
        .map(|pair| {
            // Row g and row g + 8: four words (eight bf16) each.
            let [lo_row, hi_row] = pair.map(|base| {
                let at = k.ptr_add(base, words);
                let v = k.load(Type::Vec(Scalar::U32, 4), at);
                (0..4)
                    .map(|i| {
                        let w = k.extract(v, i);
                        k.bitcast(Type::Scalar(Scalar::BF16x2), w)
                    })
                    .collect::<Vec<_>>()
            });
            // A registers: (row g, k 2t..), (row g + 8, k 2t..), (row g, k 2t + 8..),
            // (row g + 8, k 2t + 8..).
            [0, 2].map(|w| {
                k.pack(
                    frag_a,
                    &[lo_row[w], hi_row[w], lo_row[w + 1], hi_row[w + 1]],
                )
            })
        })
        .collect()
}

/// The B fragments of one chunk for the lane's token row `xr`: for each of the two MMAs,
/// the `hi` and the `lo` parts of the activations at the lane's columns.
fn load_split_activations(k: &mut Builder, xr: Value, col: Value) -> [[Value; 2]; 2] {
    let frag_b = Builder::frag_type(MmaShape::M16N8K16, FragRole::B, Scalar::BF16);
    let col = k.cvt(Scalar::U64, col);
    let xs: Vec<Value> = (0..2)
        .flat_map(|i| {
            let at = k.add_const(col, 4 * i);
            let at = k.ptr_add(xr, at);
            let v = k.load(Type::Vec(Scalar::F32, 4), at);
            (0..4).map(|j| k.extract(v, j)).collect::<Vec<_>>()
        })
        .collect();
    let pairs: Vec<(Value, Value)> = xs.chunks(2).map(|c| split_pair(k, c[0], c[1])).collect();
    [0, 2].map(|m| {
        let hi = k.pack(frag_b, &[pairs[m].0, pairs[m + 1].0]);
        let lo = k.pack(frag_b, &[pairs[m].1, pairs[m + 1].1]);
        [hi, lo]
    })
}

/// `(hi, lo)` of two f32 as bf16 pairs: `hi = bf16(x)`, `lo = bf16(x − hi)` (round to
/// nearest even; `x − hi` is exact).
fn split_pair(k: &mut Builder, x0: Value, x1: Value) -> (Value, Value) {
    let pair = |k: &mut Builder, a: Value, b: Value| {
        let a = k.cvt(Scalar::BF16, a);
        let b = k.cvt(Scalar::BF16, b);
        k.pack(Type::Scalar(Scalar::BF16x2), &[a, b])
    };
    let hi = pair(k, x0, x1);
    let bits = k.bitcast(Type::U32, hi);
    let [h0, h1] = emit_unpack_bf16x2(k, bits);
    let d0 = k.sub(x0, h0);
    let d1 = k.sub(x1, h1);
    let lo = pair(k, d0, d1);
    (hi, lo)
}

/// The warps' partials summed in warp order, the epilogue applied and stored: for each
/// row tile, each matrix's partials go through shared memory in turn (SwiGLU keeps the
/// gate's sums in registers until the up's are in).
#[allow(clippy::too_many_arguments)]
fn emit_combine(
    k: &mut Builder,
    p: &GemvTcParams,
    partials: Value,
    accs: &[Value],
    tid: Value,
    lane: Value,
    warp: Value,
    first_row: Value,
    pass: Value,
    n: Value,
    y: Value,
    r: Option<(Value, Value)>,
) {
    let streams = (p.row_tiles * p.matrices()) as usize;
    let threads = p.warps * 32;
    let per_warp = p.tiles * 128;
    // Element `e` of a warp's partials: tile e / 128, token (e / 16) mod 8, row e mod 16.
    // Lane (g, t) holds (row g, tokens 2t, 2t + 1) and (row g + 8, the same tokens).
    let g = k.shr_const(lane, 2);
    let t = k.and_const(lane, 3);
    let own = {
        let w = k.mul_const(warp, per_warp);
        let tok = k.mul_const(t, 32); // token 2t → (2t)·16
        let at = k.add(w, tok);
        k.add(at, g)
    };
    // The elements this thread sums: e = tid + q · threads.
    let slots: Vec<(u32, Option<u32>)> = (0..per_warp.div_ceil(threads))
        .map(|q| {
            (
                q * threads,
                (q * threads + threads > per_warp).then_some(per_warp),
            )
        })
        .collect();
    for rt in 0..p.row_tiles {
        let mut gate: Vec<Value> = vec![];
        for m in 0..p.matrices() {
            let s = (rt * p.matrices() + m) as usize;
            k.barrier();
            for tile in 0..p.tiles as usize {
                let acc = accs[tile * streams + s];
                let base = k.add_const(own, tile as u32 * 128);
                for (reg, off) in [(0, 0), (1, 16), (2, 8), (3, 24)] {
                    let v = k.extract(acc, reg);
                    let at = k.add_const(base, off);
                    let at = k.ptr_add(partials, at);
                    k.store(at, v);
                }
            }
            k.barrier();
            let sums: Vec<Value> = slots
                .iter()
                .map(|&(q, _)| {
                    let e = k.add_const(tid, q);
                    // Past the partials (a partial last slot): sum the last element again.
                    let e = if per_warp.is_multiple_of(threads) {
                        e
                    } else {
                        let lim = k.const_u32(per_warp - 1);
                        k.min(e, lim)
                    };
                    let at = k.ptr_add(partials, e);
                    let mut sum = k.load(Type::F32, at);
                    for w in 1..p.warps {
                        let at = k.add_const(e, w * per_warp);
                        let at = k.ptr_add(partials, at);
                        let v = k.load(Type::F32, at);
                        sum = k.add(sum, v);
                    }
                    sum
                })
                .collect();
            if p.epilogue == Epilogue::SwiGlu && m == 0 {
                gate = sums;
                continue;
            }
            for (i, &(q, partial)) in slots.iter().enumerate() {
                let e = k.add_const(tid, q);
                let tile = k.shr_const(e, 7);
                let tok = k.shr_const(e, 4);
                let tok = k.and_const(tok, 7);
                let tile8 = k.shl_const(tile, 3);
                let token = k.add(pass, tile8);
                let token = k.add(token, tok);
                let row = k.and_const(e, 15);
                let row = k.add(first_row, row);
                let row = k.add_const(row, 16 * rt);
                let inside = k.lt(token, n);
                let rows = k.const_u32(p.rows);
                let row_in = k.lt(row, rows);
                let inside = k.and(inside, row_in);
                let inside = match partial {
                    Some(limit) => {
                        let lim = k.const_u32(limit);
                        let in_slot = k.lt(e, lim);
                        k.and(inside, in_slot)
                    }
                    None => inside,
                };
                let sum = sums[i];
                let gate_sum = gate.get(i).copied();
                k.if_then(inside, |k| {
                    let yrow = wide_mul(k, token, p.rows);
                    let row64 = k.cvt(Scalar::U64, row);
                    let at = k.add(yrow, row64);
                    let out = match (p.epilogue, r, gate_sum) {
                        (Epilogue::Residual, Some((r, stride)), _) => {
                            let t64 = k.cvt(Scalar::U64, token);
                            let s64 = k.cvt(Scalar::U64, stride);
                            let ra = k.mul(t64, s64);
                            let ra = k.add(ra, row64);
                            let ra = k.ptr_add(r, ra);
                            let rv = k.load(Type::F32, ra);
                            k.add(sum, rv)
                        }
                        (Epilogue::SwiGlu, _, Some(gs)) => {
                            let s = emit_silu(k, gs);
                            k.mul(s, sum)
                        }
                        _ => sum,
                    };
                    let at = k.ptr_add(y, at);
                    k.store(at, out);
                });
            }
        }
    }
}

/// `silu(g) = g / (1 + 2^(−g·log2 e))` with `ex2.approx` and `div.approx`, as the
/// matrix–vector kernels' SwiGLU computes it.
fn emit_silu(k: &mut Builder, g: Value) -> Value {
    let c = k.const_f32(-std::f32::consts::LOG2_E);
    let t = k.mul(g, c);
    let e = k.ex2_approx(t);
    let one = k.const_f32(1.0);
    let d = k.add(one, e);
    k.div_approx(g, d)
}

/// Exact products `Σ w·x` (f64) and `Σ |w·x|` of each row of `x` with each matrix row:
/// `[n, rows]`.
pub fn reference(w: &[bf16], x: &[f32], rows: usize, cols: usize) -> (Vec<f64>, Vec<f64>) {
    let n = x.len() / cols;
    let mut dot = Vec::with_capacity(n * rows);
    let mut abs = Vec::with_capacity(n * rows);
    for xv in x.chunks_exact(cols) {
        for wr in w.chunks_exact(cols) {
            let (mut s, mut a) = (0.0f64, 0.0f64);
            for (wv, xv) in wr.iter().zip(xv) {
                let p = wv.to_f64() * *xv as f64;
                s += p;
                a += p.abs();
            }
            dot.push(s);
            abs.push(a);
        }
    }
    (dot, abs)
}

/// Relative (to `Σ |w·x|`) error bound of a product, and how it follows.
///
/// - The split: `x = hi + lo + δ` with `|δ| ≤ 2^-16·|x|` (each bf16 rounding is within
///   `2^-8` relative), so the products see `x` within `2^-16·Σ|w·x|`; bf16 subnormal
///   `lo`s add at most `2^-133` per term, in the absolute part.
/// - The tensor cores: a warp chains `4·⌈chunks / warps⌉` MMAs (two halves of a chunk,
///   `hi` and `lo`); each is taken to add at most `2^-21` relative to the sum of its
///   terms' and accumulator's magnitudes — eight times f32's rounding, for the hardware's
///   truncating alignment of the 16 exact products and the accumulator — and the
///   accumulator is at most `Σ|w·x|` (to first order).
/// - The warps' sum: `warps − 1` f32 additions; the residual: one more (relative to the
///   result); results below 2^-126 may be flushed.
pub fn tolerance_rel(p: &GemvTcParams) -> (f64, String) {
    let chain = 4.0 * (p.cols / CHUNK).div_ceil(p.warps) as f64;
    let mma = 2f64.powi(-21);
    let split = 2f64.powi(-16);
    let combine = (p.warps as f64 - 1.0) * F32_U;
    let rel = (split + chain * mma + combine) * 1.01;
    let explain = format!(
        "{rel:.3e}·Σ|w·x|: split 2^-16, {chain} chained MMAs of 2^-21 each, {} warp sums of 2^-24",
        p.warps - 1
    );
    (rel, explain)
}

/// Per-element tolerances of the outputs of [`Epilogue::Plain`] and
/// [`Epilogue::Residual`] (`want` the exact result, `abs` the products' `Σ|w·x|`).
pub fn tolerance(p: &GemvTcParams, want: &[f64], abs: &[f64]) -> (Vec<f64>, String) {
    let (rel, explain) = tolerance_rel(p);
    let tiny = 2f64.powi(-133) * p.cols as f64 * 4.0 + F32_MIN_NORMAL;
    let tol = want
        .iter()
        .zip(abs)
        .map(|(w, a)| rel * a + F32_U * w.abs() + tiny)
        .collect();
    (
        tol,
        format!("{explain}, plus 2^-24·|want| for the residual's addition and 2^-126"),
    )
}

/// A case of `n` activation rows: bf16 weights of magnitude about `1/√cols` (random
/// signs), activations in ±[2^-6, 4], a residual in ±[2^-6, 4] updated in place (or one
/// bias row). The reference is exact (f64); the check is [`tolerance`]'s bound (for SwiGLU
/// propagated through `silu(g)·u` and the approximations of `silu`), and the control is
/// the product of the activations rounded to bf16 (a kernel that dropped `lo`).
pub fn case(p: &GemvTcParams, n: u32, seed: u64) -> Result<KernelCase, KernelError> {
    case_with(p, n, Addend::Residual, seed)
}

/// As [`case`], with the residual form adding `addend`.
pub fn case_with(
    p: &GemvTcParams,
    n: u32,
    addend: Addend,
    seed: u64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    if n == 0 {
        return Err(KernelError::unsupported(
            p.name(),
            "a case needs at least one activation row",
        ));
    }
    let mut rng = data::rng(seed);
    let (rows, cols, nv) = (p.rows as usize, p.cols as usize, n as usize);
    let hi = 1.0 / (cols as f32).sqrt() / 0.6;
    let ws: Vec<Vec<bf16>> = (0..p.matrices())
        .map(|_| data::to_bf16(&data::signed(&mut rng, rows * cols, hi / 8.0, hi)))
        .collect();
    let x = data::signed(&mut rng, nv * cols, 0.015625, 4.0);
    // What a kernel that dropped `lo` would multiply.
    let x_hi: Vec<f32> = data::to_bf16(&x).iter().map(|v| v.to_f32()).collect();
    let exact: Vec<(Vec<f64>, Vec<f64>)> =
        ws.iter().map(|w| reference(w, &x, rows, cols)).collect();
    let wrong: Vec<Vec<f64>> = ws
        .iter()
        .map(|w| reference(w, &x_hi, rows, cols).0)
        .collect();

    let mut buffers: Vec<Buffer> = ws
        .iter()
        .enumerate()
        .map(|(i, w)| Buffer::input(if i == 0 { "w" } else { "w_up" }, data::bf16_bytes(w)))
        .collect();
    buffers.push(Buffer::input("x", data::f32_bytes(&x)));
    let mut args: Vec<CaseArg> = (0..buffers.len()).map(CaseArg::Buffer).collect();
    let outputs = nv * rows;
    let (tol, explain) = tolerance(p, &exact[0].0, &exact[0].1);
    let f32s = |v: &[f64]| data::f32_bytes(&v.iter().map(|&x| x as f32).collect::<Vec<_>>());
    let (want, control, tol, explain, y, r_stride) = match p.epilogue {
        Epilogue::Plain => {
            buffers.push(Buffer::output("y", outputs * 4));
            (
                exact[0].0.clone(),
                wrong[0].clone(),
                tol,
                explain,
                buffers.len() - 1,
                None,
            )
        }
        Epilogue::Residual => {
            let (added, stride) = match addend {
                Addend::Residual => (data::signed(&mut rng, outputs, 0.015625, 4.0), p.rows),
                Addend::Bias => (data::signed(&mut rng, rows, 0.015625, 4.0), 0),
            };
            let plus = |v: &[f64]| -> Vec<f64> {
                v.iter()
                    .enumerate()
                    .map(|(i, d)| d + added[i % added.len()] as f64)
                    .collect()
            };
            let (want, control) = (plus(&exact[0].0), plus(&wrong[0]));
            let (tol, explain) = tolerance(p, &want, &exact[0].1);
            let y = match addend {
                Addend::Residual => {
                    // y and r are the same buffer: the residual stream updated in place.
                    buffers.push(Buffer::in_out("r", data::f32_bytes(&added)));
                    let i = buffers.len() - 1;
                    args.push(CaseArg::Buffer(i));
                    i
                }
                Addend::Bias => {
                    buffers.push(Buffer::input("bias", data::f32_bytes(&added)));
                    args.push(CaseArg::Buffer(buffers.len() - 1));
                    buffers.push(Buffer::output("y", outputs * 4));
                    buffers.len() - 1
                }
            };
            (want, control, tol, explain, y, Some(stride))
        }
        Epilogue::SwiGlu => {
            buffers.push(Buffer::output("y", outputs * 4));
            let (g, u) = (&exact[0].0, &exact[1].0);
            let silu = |g: f64| g / (1.0 + (-g).exp());
            let want: Vec<f64> = g.iter().zip(u).map(|(&g, &u)| silu(g) * u).collect();
            let control: Vec<f64> = wrong[0]
                .iter()
                .zip(&wrong[1])
                .map(|(&g, &u)| silu(g) * u)
                .collect();
            let (tol_g, _) = tolerance(p, g, &exact[0].1);
            let (tol_u, _) = tolerance(p, u, &exact[1].1);
            let g32: Vec<f32> = g.iter().map(|&v| v as f32).collect();
            let (tol_silu, silu_explain) = swiglu_tolerance(OutType::F32, &g32, &want);
            // |silu'| ≤ 1.1: the products' errors carried through silu(g)·u.
            let tol = (0..want.len())
                .map(|i| {
                    1.1 * tol_g[i] * (u[i].abs() + tol_u[i])
                        + (silu(g[i]).abs() + 1.1 * tol_g[i]) * tol_u[i]
                        + tol_silu[i] * 1.01
                })
                .collect();
            let explain = format!(
                "each product within {} (propagated: |silu'| ≤ 1.1), plus silu·u's own: {silu_explain}",
                tolerance_rel(p).1
            );
            (want, control, tol, explain, buffers.len() - 1, None)
        }
    };
    args.push(CaseArg::Buffer(y));
    args.push(CaseArg::Scalar(Arg::U32(n)));
    args.extend(r_stride.map(|s| CaseArg::Scalar(Arg::U32(s))));
    let check = Check::Bound { tol, explain };
    let expected = Expected {
        buffer: y,
        data: f32s(&want),
        elem: Scalar::F32,
        check: check.clone(),
    };
    let control = Control {
        what: "activations rounded to bf16 (lo dropped)".into(),
        expected: Expected {
            buffer: y,
            data: f32s(&control),
            elem: Scalar::F32,
            check,
        },
    };
    let w_bytes = 2 * (p.matrices() as usize * rows * cols) as u64;
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!(
            "{}x{} times {n} rows, {} a pass",
            p.rows,
            p.cols,
            p.per_pass()
        ),
        kernel,
        launch: p.launch(),
        buffers,
        args,
        expected: vec![expected],
        controls: vec![control],
        bytes_moved: w_bytes + 4 * (nv * cols) as u64 + 4 * outputs as u64,
        flops: 2 * p.matrices() as u64 * (nv * rows * cols) as u64,
    })
}
