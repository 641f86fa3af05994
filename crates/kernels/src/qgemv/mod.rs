//! Decode-time matrix–vector products over bf16, f16 and GGUF-quantized weights,
//! dequantized inside the kernel (the weights are read once, in their stored form), with
//! fused epilogues:
//! - [`Epilogue::Plain`]: `y = W·x` (f32);
//! - [`Epilogue::Residual`]: `y = W·x + r` (f32; `y` may be `r`, updating a residual
//!   stream in place);
//! - [`Epilogue::SwiGlu`]: `y = silu(W_g·x) · (W_u·x)` (in the activation type), the gate and up
//!   projections of a SwiGLU block in one pass. For one concatenated `[2·ffn, hidden]`
//!   matrix, pass its first half as `w_gate` and the address `ffn · row_bytes` further as
//!   `w_up`.
//!
//! With the [`Prologue::RmsNorm`] prologue (f32 activations only) the kernel reads the
//! f32 residual stream in place of `x` and forms `x = RMSNorm(R)·w` itself
//! ([`prologue`]): the `_rmsnorm_` kernels take `(…, x, norm_w, [r,] y, eps, …)`, `x`
//! being `R`, which `y` must not alias.
//!
//! **Batches**: every kernel multiplies the matrix with `n` vectors (a launch argument:
//! a decode step of `n` sequences), [`QGemvParams::batch`] of them per pass: a warp loads
//! and dequantizes each piece of its rows once per pass and multiplies it with every
//! vector of the pass, so the weights come from device memory once per launch whatever
//! `n` is (later passes read them again, from cache). With the prologue each pass stages its
//! vectors' normalized rows in shared memory. `n` (and, for the residual form,
//! `r_stride`) are the last arguments: see [`build`].
//!
//! **Layout**: `W` `[rows, cols]` row-major in GGUF layout (rows back to back, each a
//! whole number of blocks; see [`mod@format`] for the units lanes take); `x` `[n, cols]`
//! in the activation type [`QGemvParams::act`] (bf16, or f32 where the rounding of the
//! activations to bf16 costs too much accuracy: the `_xf32` kernels); `y` `[n, rows]`;
//! `r` `[n, r_stride]` f32 (`r_stride = rows` for a residual stream, 0 to add one bias
//! row to every product);
//! `cols` a multiple of 8 (bf16, f16), 64 (Q8_0, Q4_0, Q4_1) or 256 (Q4_K, Q5_K, Q6_K).
//! Each warp computes [`QGemvParams::rows_per_warp`] rows, which share each activation
//! load (at one vector a pass two rows of a quantized matrix; with several, up to 4
//! matrix rows), `warps` warps per block. Lane `l` takes pieces `l, l + 32, ...` of its
//! rows; the loop is unrolled `unroll` times with every weight load of a step (and, at one
//! vector a pass, every activation load) issued before any arithmetic.
//!
//! **Grid**: a block computes a row group (`warps · rows_per_warp` rows) at a time. By
//! default the launch has a block per group; with [`QGemvParams::max_blocks`] below the
//! group count it has that many, and block `b` takes groups `b, b + blocks, ...` in each
//! pass. Fewer blocks pay the fixed cost of a block fewer times, and with the prologue
//! each block normalizes a pass's vectors once for all of its groups rather than once
//! per group (for a large vocabulary that staging traffic rivals the weights').
//!
//! **Arithmetic**: each lane dequantizes a piece exactly as [`quench_models::dequant`]
//! does ([`crate::ggml`]) and accumulates `fma(w, x, acc)` in f32 over its pieces in
//! order, element by element in the piece's order; the warp sums its lanes by butterfly
//! ([`crate::lanes::emit_warp_allreduce`]). The order depends on the row's shape only,
//! never on `n`, `batch`, the other vectors or the launch, so the plain and residual
//! forms match the reference bit for bit, and a vector's products are the same bits
//! whatever batch it is in (batch invariance). The SwiGLU form adds `ex2.approx` and `div.approx` (as
//! [`crate::silu_mul`]) and is checked within a bound.
//!
//! **Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K** are the exception: their kernels quantize the activations to 16-bit
//! integers in shared memory and multiply them with the quantized weights by byte dot
//! products ([`integer`]). Their sums are exact and their float operations fixed, so they
//! too match their reference ([`integer::dots`]) bit for bit, whatever the batch; the
//! quantization's effect is bounded against the exact product ([`integer::f64_check`]).

pub mod format;
pub mod integer;
pub mod prologue;

use half::bf16;
use quench_ir::{Builder, Function, Scalar, Type, Value};
use quench_models::dequant;
use quench_rt::{Arg, Launch};

use crate::approx::{DIV_REL, EX2_REL, F32_MIN_NORMAL, F32_U};
use crate::case::{Buffer, CaseArg, Check, Control, Expected, KernelCase};
use crate::data;
use crate::error::KernelError;
use crate::lanes::{emit_warp_allreduce, gptr, warp_allreduce, wide_mul, words, Combine};
use crate::norm_residual::OutType;
use crate::par::par_map;
pub use format::WeightFormat;
use format::{load_x, unpack_x, Lane};

/// What happens to the row's dot product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    Plain,
    Residual,
    SwiGlu,
}

impl Epilogue {
    pub const ALL: [Epilogue; 3] = [Epilogue::Plain, Epilogue::Residual, Epilogue::SwiGlu];
}

/// What forms `x` before the dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prologue {
    /// `x` is read as given.
    None,
    /// `x = RMSNorm(R)·w` of the f32 row given as `x` (see [`prologue`]).
    RmsNorm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QGemvParams {
    pub format: WeightFormat,
    pub prologue: Prologue,
    pub epilogue: Epilogue,
    pub rows: u32,
    pub cols: u32,
    /// Warps (rows) per block, 1..=32.
    pub warps: u32,
    /// Pieces each lane loads before it computes, 1..=16.
    pub unroll: u32,
    /// The activations' type: `x`, and `y` of the SwiGLU form.
    pub act: OutType,
    /// Vectors multiplied per pass, 1..=[`MAX_BATCH`]: each pass reads the weights once.
    /// With the prologue `batch · cols` may not exceed [`prologue::MAX_COLS`].
    pub batch: u32,
    /// Most blocks a launch takes; 0 for no limit (a block per row group). With fewer
    /// blocks than row groups each block takes groups `b, b + blocks, ...` in turn, and
    /// with the prologue normalizes the pass's vectors once for all of them. A row's
    /// arithmetic is the same either way.
    pub max_blocks: u32,
}

/// Most vectors one pass multiplies (each adds an accumulator per row to every lane).
pub const MAX_BATCH: u32 = 8;

/// The most vectors a pass can take for rows of `cols` columns: [`MAX_BATCH`], or with
/// the RMSNorm prologue as many normalized rows as its shared memory stages (at least 1).
pub fn widest_batch(prologue: Prologue, cols: u32) -> u32 {
    match prologue {
        Prologue::None => MAX_BATCH,
        Prologue::RmsNorm => (prologue::MAX_COLS / cols.max(1)).clamp(1, MAX_BATCH),
    }
}

/// A table of library names, by format (in [`WeightFormat::ALL`] order) and epilogue (in
/// [`Epilogue::ALL`] order): each format's stem, then `mid` (the prologue), the epilogue's
/// part and `end` (the activation type).
macro_rules! names {
    ($mid:literal, $end:literal) => {
        names!(@ $mid, $end; "gemv_bf16", "gemv_f16", "qgemv_q8_0", "qgemv_q4_0",
            "qgemv_q4_1", "qgemv_q4_k", "qgemv_q5_k", "qgemv_q6_k", "qgemv_q3_k",
            "qgemv_q2_k")
    };
    (@ $mid:literal, $end:literal; $($stem:literal),*) => {
        [$([
            concat!($stem, $mid, $end),
            concat!($stem, $mid, "_residual", $end),
            concat!($stem, $mid, "_swiglu", $end),
        ]),*]
    };
}

/// Library names of the bf16-activation kernels (`qgemv_q4_k_swiglu`).
const NAMES: [[&str; 3]; 10] = names!("", "");

/// Library names of the f32-activation kernels (`qgemv_q4_k_swiglu_xf32`).
const NAMES_XF32: [[&str; 3]; 10] = names!("", "_xf32");

/// Library names of the kernels with the RMSNorm prologue (f32 activations,
/// `qgemv_q4_k_rmsnorm_swiglu_xf32`).
const NAMES_RMSNORM: [[&str; 3]; 10] = names!("_rmsnorm", "_xf32");

/// The library name of a format, epilogue and activation type (`qgemv_q4_k_swiglu`,
/// `qgemv_q4_k_swiglu_xf32`).
pub fn name(format: WeightFormat, epilogue: Epilogue, act: OutType) -> &'static str {
    let (f, e) = indices(format, epilogue);
    match act {
        OutType::BF16 => NAMES[f][e],
        OutType::F32 => NAMES_XF32[f][e],
    }
}

/// The library name of a kernel with the RMSNorm prologue (`qgemv_q4_k_rmsnorm_swiglu_xf32`).
pub fn rmsnorm_name(format: WeightFormat, epilogue: Epilogue) -> &'static str {
    let (f, e) = indices(format, epilogue);
    NAMES_RMSNORM[f][e]
}

fn indices(format: WeightFormat, epilogue: Epilogue) -> (usize, usize) {
    let f = WeightFormat::ALL
        .iter()
        .position(|&x| x == format)
        .unwrap_or(0);
    let e = Epilogue::ALL
        .iter()
        .position(|&x| x == epilogue)
        .unwrap_or(0);
    (f, e)
}

impl QGemvParams {
    pub fn name(&self) -> &'static str {
        match self.prologue {
            Prologue::None => name(self.format, self.epilogue, self.act),
            Prologue::RmsNorm => rmsnorm_name(self.format, self.epilogue),
        }
    }

    fn pieces(&self) -> u32 {
        self.cols / self.format.unit_elems() * self.format.pieces_per_unit()
    }

    /// Row groups: the rows a block of `warps` warps computes at once.
    pub fn groups(&self) -> u32 {
        self.rows.div_ceil(self.warps * self.rows_per_warp())
    }

    /// Whether the grid is capped below one block per row group, so that blocks loop.
    fn capped(&self) -> bool {
        self.max_blocks != 0 && self.max_blocks < self.groups()
    }

    pub fn launch(&self) -> Launch {
        let blocks = if self.capped() {
            self.max_blocks
        } else {
            self.groups()
        };
        Launch::linear(blocks, self.warps * 32)
    }

    /// Rows each warp computes; its rows share each activation load (and its widening).
    ///
    /// - One vector a pass: two rows of a quantized matrix (the dequantizing kernels are
    ///   bound by instructions, not bandwidth) when the rows pair up evenly; the SwiGLU
    ///   form already pairs its two matrices.
    /// - Several vectors a pass: every row reads all of the pass's activations, which
    ///   (from cache, `batch · cols` values a row) outweigh the row's own weights, so a
    ///   warp takes as many rows as its registers hold without spilling: each row adds a
    ///   dequantized piece and `batch` accumulators per matrix. At most 4 matrix rows for
    ///   bf16 and f16 (8-element pieces: 4 rows, or 2 of each SwiGLU matrix), 2 for the
    ///   quantized formats (32- and 64-element pieces: 2 rows, or 1 of each SwiGLU
    ///   matrix), halved until they divide `rows`.
    ///
    /// A row's arithmetic is the same whatever the count.
    pub fn rows_per_warp(&self) -> u32 {
        let matrices = if self.epilogue == Epilogue::SwiGlu {
            2
        } else {
            1
        };
        let most = match (self.batch, self.format.is_float()) {
            (1, true) => 1,
            (1, false) => 2 / matrices,
            (_, true) => 4 / matrices,
            (_, false) => 2 / matrices,
        };
        let mut r = most;
        while !self.rows.is_multiple_of(r) {
            r /= 2;
        }
        r
    }

    fn check(&self) -> Result<(), KernelError> {
        let unit = self.format.unit_elems();
        if self.cols == 0 || !self.cols.is_multiple_of(unit) {
            return Err(KernelError::unsupported(
                self.name(),
                format!("cols = {} must be a positive multiple of {unit}", self.cols),
            ));
        }
        if self.rows == 0
            || !(1..=32).contains(&self.warps)
            || !(1..=16).contains(&self.unroll)
            || !(1..=MAX_BATCH).contains(&self.batch)
        {
            return Err(KernelError::unsupported(
                self.name(),
                format!(
                    "rows = {} must be positive, warps = {} in 1..=32, unroll = {} in 1..=16, batch = {} in 1..={MAX_BATCH}",
                    self.rows, self.warps, self.unroll, self.batch
                ),
            ));
        }
        if self.prologue == Prologue::RmsNorm {
            if self.act != OutType::F32 {
                return Err(KernelError::unsupported(
                    self.name(),
                    "the RMSNorm prologue forms f32 activations: act must be F32",
                ));
            }
            if self.cols * self.batch > prologue::MAX_COLS {
                return Err(KernelError::unsupported(
                    self.name(),
                    format!(
                        "batch × cols = {} × {} is more than the {} values the RMSNorm prologue stages in shared memory",
                        self.batch,
                        self.cols,
                        prologue::MAX_COLS
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The weight parameter's pointee: the element type of a float matrix, bytes otherwise.
    fn weight_elem(&self) -> Scalar {
        match self.format {
            WeightFormat::BF16 => Scalar::BF16,
            WeightFormat::F16 => Scalar::F16,
            _ => Scalar::U8,
        }
    }
}

/// `<name>(w, x, y, n)`, `<name>_residual(w, x, r, y, n, r_stride)` or
/// `<name>_swiglu(w_gate, w_up, x, y, n)`; with the RMSNorm prologue `norm_w` follows `x`
/// and `eps` follows `y`. `n` (u32) is the number of vectors, `r_stride` (u32) the
/// elements between consecutive vectors' rows of `r`.
pub fn build(p: &QGemvParams) -> Result<Function, KernelError> {
    p.check()?;
    let threads = p.warps * 32;
    let mut k = Builder::new(p.name(), threads);
    let we = gptr(p.weight_elem());
    let weights = match p.epilogue {
        Epilogue::SwiGlu => vec![k.param("w_gate", we), k.param("w_up", we)],
        _ => vec![k.param("w", we)],
    };
    let x = k.param("x", gptr(p.act.scalar()));
    let norm_w = (p.prologue == Prologue::RmsNorm).then(|| k.param("norm_w", gptr(Scalar::F32)));
    let r = (p.epilogue == Epilogue::Residual).then(|| k.param("r", gptr(Scalar::F32)));
    let y_elem = if p.epilogue == Epilogue::SwiGlu {
        p.act.scalar()
    } else {
        Scalar::F32
    };
    let y = k.param("y", gptr(y_elem));
    let norm = norm_w.map(|nw| (nw, k.param("eps", Type::F32)));
    let n = k.param("n", Type::U32);
    let r = r.map(|r| (r, k.param("r_stride", Type::U32)));
    let tid = k.tid_x();
    // The block's copies of the pass's vectors: normalized, or for the integer formats quantized.
    let quantized = integer::applies(p).then(|| integer::Staged::new(&mut k, p));
    let staged = norm
        .filter(|_| quantized.is_none())
        .map(|_| k.shared_array("x", Scalar::F32, p.batch * p.cols, 16));
    let lane = k.and_const(tid, 31);
    let warp = k.shr_const(tid, 5);
    // One block per row group: the block's rows are fixed before the passes begin.
    // Capped: the block loops over groups `ctaid, ctaid + nctaid, ...` in each pass.
    let own = (!p.capped() && quantized.is_none()).then(|| {
        let block = k.ctaid_x();
        RowGroup::emit(&mut k, p, block, warp, &weights)
    });

    let zero = k.const_u32(0);
    let per_pass = k.const_u32(p.batch);
    k.for_range(zero, n, per_pass, &[], |k, v0, _| {
        // Vector `v0 + j` of the pass, and whether it exists (the first always does):
        // emitted where used rather than kept live across the products.
        let vector = |k: &mut Builder, j: u32| k.add_const(v0, j);
        let valid = |k: &mut Builder, j: u32| {
            (j > 0).then(|| {
                let v = vector(k, j);
                k.lt(v, n)
            })
        };
        if let (Some(xs), Some((nw, eps))) = (staged, norm) {
            // The previous pass's warps are done with the staged rows.
            k.barrier();
            for j in 0..p.batch {
                let stage = |k: &mut Builder| {
                    let v = vector(k, j);
                    let at = wide_mul(k, v, p.cols);
                    let src = k.ptr_add(x, at);
                    let at = k.const_u32(j * p.cols);
                    let dst = k.ptr_add(xs, at);
                    prologue::emit_stage_normalized(
                        k,
                        src,
                        nw,
                        eps,
                        p.cols,
                        tid,
                        threads,
                        dst,
                        &format!("rms{j}"),
                    );
                };
                match valid(k, j) {
                    Some(c) => k.if_then(c, stage),
                    None => stage(k),
                }
            }
            k.barrier();
        }
        // Where vector `j`'s activations are read: the staged row, or `x`'s.
        let x_of = |k: &mut Builder, j: u32| match staged {
            Some(xs) => {
                let at = k.const_u32(j * p.cols);
                k.ptr_add(xs, at)
            }
            None => {
                let v = vector(k, j);
                let at = wide_mul(k, v, p.cols);
                k.ptr_add(x, at)
            }
        };
        // Lane 0 stores the totals (`[vector][stream]`) of the warp's rows from `row0` on.
        let store = |k: &mut Builder, row0: Value, totals: &[Vec<Value>]| {
            let rows: Vec<Value> = (0..p.rows_per_warp())
                .map(|i| k.add_const(row0, i))
                .collect();
            let is_first = k.eq(lane, zero);
            k.if_then(is_first, |k| {
                for j in 0..p.batch {
                    let store = |k: &mut Builder| {
                        let v = vector(k, j);
                        let yrow = wide_mul(k, v, p.rows);
                        let rrow = r.map(|(r, stride)| {
                            let v64 = k.cvt(Scalar::U64, v);
                            let s64 = k.cvt(Scalar::U64, stride);
                            let at = k.mul(v64, s64);
                            k.ptr_add(r, at)
                        });
                        let ys = k.ptr_add(y, yrow);
                        let t = &totals[j as usize];
                        for (i, &row) in rows.iter().enumerate() {
                            let at = k.ptr_add(ys, row);
                            let out = match (p.epilogue, rrow) {
                                (Epilogue::Residual, Some(rr)) => {
                                    let ra = k.ptr_add(rr, row);
                                    let rv = k.load(Type::F32, ra);
                                    k.add(t[i], rv)
                                }
                                (Epilogue::SwiGlu, _) => {
                                    let s = emit_silu(k, t[2 * i]);
                                    let v = k.mul(s, t[2 * i + 1]);
                                    match p.act {
                                        OutType::BF16 => k.cvt(Scalar::BF16, v),
                                        OutType::F32 => v,
                                    }
                                }
                                _ => t[i],
                            };
                            k.store(at, out);
                        }
                    };
                    match valid(k, j) {
                        Some(c) => k.if_then(c, store),
                        None => store(k),
                    }
                }
            });
        };
        let body = |k: &mut Builder, g: &RowGroup| {
            let totals = emit_dots(k, p, &g.streams, &x_of, &valid, lane);
            store(k, g.rows[0], &totals);
        };
        // A group's products; warps past the last row (of the last group) have none.
        let products = |k: &mut Builder, g: &RowGroup| {
            if p.rows.is_multiple_of(p.warps * p.rows_per_warp()) {
                body(k, g);
            } else {
                let total = k.const_u32(p.rows);
                let inside = k.lt(g.rows[0], total);
                k.if_then(inside, |k| body(k, g));
            }
        };
        match (&quantized, &own) {
            (Some(staged), _) => {
                let weights = weights.iter().map(|&w| k.ptr_cast(Scalar::U8, w)).collect();
                let pass = integer::Pass {
                    p,
                    weights,
                    x,
                    norm,
                    n,
                    v0,
                    tid,
                    warp,
                    lane,
                };
                pass.emit(k, staged, &store);
            }
            (_, Some(g)) => products(k, g),
            _ => {
                let first = k.ctaid_x();
                let groups = k.const_u32(p.groups());
                let stride = k.nctaid_x();
                k.for_range(first, groups, stride, &[], |k, group, _| {
                    let g = RowGroup::emit(k, p, group, warp, &weights);
                    products(k, &g);
                    vec![]
                });
            }
        }
        vec![]
    });
    Ok(k.finish()?)
}

/// One warp's rows of row group `group` (a block's worth: `warps · rows_per_warp` rows)
/// and where they start in each matrix.
struct RowGroup {
    /// The warp's rows, the first `rows[0]`.
    rows: Vec<Value>,
    /// Byte pointers to each row's start in each matrix: row-major over (row, matrix).
    streams: Vec<Value>,
}

impl RowGroup {
    fn emit(
        k: &mut Builder,
        p: &QGemvParams,
        group: Value,
        warp: Value,
        weights: &[Value],
    ) -> RowGroup {
        let first = k.mul_const(group, p.warps);
        let first = k.add(first, warp);
        let rpw = p.rows_per_warp();
        let row0 = k.mul_const(first, rpw);
        let rb = p.format.row_bytes(p.cols);
        let rows: Vec<Value> = (0..rpw).map(|i| k.add_const(row0, i)).collect();
        let mut streams = vec![];
        for &row in &rows {
            let start = wide_mul(k, row, rb);
            for &w in weights {
                let b = k.ptr_cast(Scalar::U8, w);
                streams.push(k.ptr_add(b, start));
            }
        }
        RowGroup { rows, streams }
    }
}

/// `silu(g) = g / (1 + 2^(−g·log2 e))` with `ex2.approx` and `div.approx`, as
/// [`crate::silu_mul`] computes it.
fn emit_silu(k: &mut Builder, g: Value) -> Value {
    let c = k.const_f32(-std::f32::consts::LOG2_E);
    let t = k.mul(g, c);
    let e = k.ex2_approx(t);
    let one = k.const_f32(1.0);
    let d = k.add(one, e);
    k.div_approx(g, d)
}

/// One warp's dot products of its row of each matrix (`wrows`, byte pointers) with each
/// vector `j` of the pass (its activations at `x_of(j)`; `valid(j)`, where present, says
/// whether it exists): the unrolled main loop, the remaining pieces, the butterflies.
/// Every lane gets the totals, `[vector][matrix row]`.
///
/// Each step issues the loads of its pieces' weights before any arithmetic; a single
/// vector's activations are loaded with them, while with several each vector's are loaded
/// when it is multiplied with the dequantized pieces (keeping `batch` vectors' activations
/// in flight would not fit the registers), a word at a time for all of the warp's rows.
/// The arithmetic of a vector and row is the same either way.
fn emit_dots(
    k: &mut Builder,
    p: &QGemvParams,
    wrows: &[Value],
    x_of: &dyn Fn(&mut Builder, u32) -> Value,
    valid: &dyn Fn(&mut Builder, u32) -> Option<Value>,
    lane: Value,
) -> Vec<Vec<Value>> {
    let f = p.format;
    let ppu = f.pieces_per_unit();
    let j = k.and_const(lane, ppu - 1);
    let consts = Lane::new(k, f, j);
    let runs = consts.x_runs(k);
    let single = p.batch == 1;
    let x0 = single.then(|| {
        let x = x_of(k, 0);
        words(k, x)
    });
    // Piece l + 32i is sub-piece j of unit l / ppu + (32 / ppu)·i.
    let unit_lane = k.shr_const(lane, ppu.trailing_zeros());
    let units_per_step = 32 / ppu;
    let streams = wrows.len();
    // Activations in one 16-byte load.
    let per_word = match p.act {
        OutType::BF16 => 8,
        OutType::F32 => 4,
    };

    // Issue a piece's loads for unit `unit`: each matrix, then (one vector) the activations.
    let issue = |k: &mut Builder, unit: Value| {
        let raws: Vec<_> = wrows.iter().map(|&wr| consts.load(k, wr, unit)).collect();
        let xs = x0.map(|xw| {
            let first = k.mul_const(unit, f.unit_elems());
            runs.iter()
                .flat_map(|&(off, len)| {
                    let at = k.add(first, off);
                    load_x(k, p.act, xw, at, len)
                })
                .collect::<Vec<Value>>()
        });
        (raws, xs, unit)
    };
    let fold = |k: &mut Builder, ws: &[Value], xv: &[Value], acc: Value| {
        ws.iter()
            .zip(xv)
            .fold(acc, |acc, (&w, &x)| k.fma(w, x, acc))
    };
    let fma_piece = |k: &mut Builder,
                     loaded: (Vec<format::Raw>, Option<Vec<Value>>, Value),
                     accs: &[Value]| {
        let (raws, x0, unit) = loaded;
        if let Some(x0) = x0 {
            let xv = unpack_x(k, p.act, &x0);
            return raws
                .iter()
                .zip(accs)
                .map(|(raw, &acc)| {
                    let ws = raw.decode(k);
                    fold(k, &ws, &xv, acc)
                })
                .collect::<Vec<Value>>();
        }
        let ws: Vec<Vec<Value>> = raws.iter().map(|raw| raw.decode(k)).collect();
        let mut out = accs.to_vec();
        for v in 0..p.batch as usize {
            let before = out[v * streams..(v + 1) * streams].to_vec();
            // A 16-byte word of activations at a time, so that few are live at once.
            let multiply = |k: &mut Builder| {
                let mut accs = before.clone();
                let x = x_of(k, v as u32);
                let xw = words(k, x);
                let first = k.mul_const(unit, f.unit_elems());
                let mut e = 0;
                for &(off, len) in &runs {
                    let start = k.add(first, off);
                    for w in 0..len / per_word {
                        let at = k.add_const(start, w * per_word);
                        let loaded = load_x(k, p.act, xw, at, per_word);
                        let xv = unpack_x(k, p.act, &loaded);
                        for (acc, wv) in accs.iter_mut().zip(&ws) {
                            *acc = fold(k, &wv[e..e + per_word as usize], &xv, *acc);
                        }
                        e += per_word as usize;
                    }
                }
                accs
            };
            let after = match valid(k, v as u32) {
                Some(c) => k.if_else(c, &vec![Type::F32; streams], multiply, |_| before.clone()),
                None => multiply(k),
            };
            out[v * streams..(v + 1) * streams].copy_from_slice(&after);
        }
        out
    };

    let step_pieces = 32 * p.unroll;
    let main = p.pieces() / step_pieces;
    let zero = k.const_f32(0.0);
    let mut accs = vec![zero; streams * p.batch as usize];
    if main > 0 {
        let lo = k.const_u32(0);
        let hi = k.const_u32(main);
        let one = k.const_u32(1);
        accs = k.for_range(lo, hi, one, &accs, |k, s, c| {
            let base = k.mul_const(s, units_per_step * p.unroll);
            let base = k.add(base, unit_lane);
            let loaded: Vec<_> = (0..p.unroll)
                .map(|u| {
                    let unit = k.add_const(base, units_per_step * u);
                    issue(k, unit)
                })
                .collect();
            let mut accs = c.to_vec();
            for l in loaded {
                accs = fma_piece(k, l, &accs);
            }
            accs
        });
    }
    // Remaining pieces, 32 per step; the last step may leave lanes without a piece.
    let mut done = main * step_pieces;
    while done < p.pieces() {
        let unit = k.add_const(unit_lane, done / ppu);
        let step = |k: &mut Builder, accs: &[Value]| {
            let l = issue(k, unit);
            fma_piece(k, l, accs)
        };
        if done + 32 <= p.pieces() {
            accs = step(k, &accs);
        } else {
            let left = k.const_u32(p.pieces() - done);
            let has = k.lt(lane, left);
            let before = accs.clone();
            let types = vec![Type::F32; before.len()];
            accs = k.if_else(has, &types, |k| step(k, &before), |_| before.clone());
        }
        done += 32;
    }
    accs.chunks(streams)
        .map(|v| {
            v.iter()
                .map(|&a| emit_warp_allreduce(k, a, Combine::Sum))
                .collect()
        })
        .collect()
}

/// Each row's dot product with `x` (values of the activation type), in the kernel's
/// order: `w` holds `rows` GGUF rows.
pub fn dots(p: &QGemvParams, w: &[u8], xf: &[f32]) -> Result<Vec<f32>, KernelError> {
    if integer::applies(p) {
        return Ok(integer::dots(p, w, xf, integer::Variant::Right));
    }
    let f = p.format;
    let (cols, rb) = (p.cols as usize, f.row_bytes(p.cols) as usize);
    let pieces: Vec<Vec<u32>> = (0..f.pieces_per_unit())
        .map(|j| f.piece_elements(j))
        .collect();
    let rows = par_map(p.rows as usize, |r| {
        let wr = dequant::dequantize(f.ggml(), &w[r * rb..(r + 1) * rb], cols)?;
        let mut lanes = [0.0f32; 32];
        for (l, acc) in lanes.iter_mut().enumerate() {
            for piece in (l..p.pieces() as usize).step_by(32) {
                let ppu = f.pieces_per_unit() as usize;
                let first = piece / ppu * f.unit_elems() as usize;
                for &e in &pieces[piece % ppu] {
                    let i = first + e as usize;
                    *acc = wr[i].mul_add(xf[i], *acc);
                }
            }
        }
        Ok(warp_allreduce(&lanes, Combine::Sum))
    });
    rows.into_iter()
        .collect::<Result<_, quench_models::ModelError>>()
        .map_err(|e| KernelError::unsupported(p.name(), e.to_string()))
}

/// `v` rounded once to the activation type.
fn round_act(act: OutType, v: f64) -> f64 {
    match act {
        OutType::BF16 => bf16::from_f64(v).to_f64(),
        OutType::F32 => v as f32 as f64,
    }
}

/// Values of the activation type (exactly representable) as its bytes.
fn act_bytes(act: OutType, v: &[f64]) -> Vec<u8> {
    let f: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    match act {
        OutType::BF16 => data::bf16_bytes(&data::to_bf16(&f)),
        OutType::F32 => data::f32_bytes(&f),
    }
}

/// `silu(g)·u` in f64, rounded once to the activation type.
pub fn swiglu(act: OutType, g: &[f32], u: &[f32]) -> Vec<f64> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| round_act(act, g as f64 * u as f64 / (1.0 + (-(g as f64)).exp())))
        .collect()
}

/// A deliberately wrong SwiGLU: the sigmoid taken as `1 / (1 + 2^-g)`, as a kernel that
/// forgot the log2(e) scaling in front of `ex2` would compute.
pub fn swiglu_without_log2e(act: OutType, g: &[f32], u: &[f32]) -> Vec<f64> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| round_act(act, g as f64 * u as f64 / (1.0 + (-(g as f64)).exp2())))
        .collect()
}

/// Tolerance of the SwiGLU output against [`swiglu`] of the exact (kernel-order) dot
/// products `g`, `u`, and how it follows.
///
/// Before its rounding to the activation type the kernel's value is `y·(1 + η)` with
/// `|η| ≤ η̄ = 2u·|g|·1.01 + EX2 + DIV + 2u` (the rounded exponent `g·fl(−log2 e)`,
/// magnified by `2^t`'s sensitivity `ln 2·|t| = |g|`; `ex2.approx`; the sum `1 + e`;
/// `div.approx`; the product with `u`). Both roundings to the activation type (the
/// kernel's, of bf16 only, and the reference's) add at most `b` relative each (`2^-8` for
/// bf16, `2^-24` for f32), so `|got − want| ≤ |y|·(η̄ + b·(2 + η̄))` with
/// `|y| ≤ |want| / (1 − b)`; results below 2^-126 may be flushed.
pub fn swiglu_tolerance(act: OutType, g: &[f32], want: &[f64]) -> (Vec<f64>, String) {
    let gmax = g.iter().map(|v| (*v as f64).abs()).fold(0.0, f64::max);
    let eta = 2.0 * F32_U * gmax * 1.01 + EX2_REL + DIV_REL + 2.0 * F32_U;
    let b = match act {
        OutType::BF16 => 2f64.powi(-8),
        OutType::F32 => F32_U,
    };
    let rel = (eta + b * (2.0 + eta)) / (1.0 - b);
    let tol = want
        .iter()
        .map(|w| w.abs() * rel + F32_MIN_NORMAL)
        .collect();
    let explain = format!(
        "{rel:.3e}·|want| + 2^-126: η = {eta:.2e} (2u·max|g| with max|g| = {gmax:.3e}, ex2.approx {EX2_REL:.2e}, \
         div.approx {DIV_REL:.2e}, two roundings) plus the two roundings to {act:?} ({b:.1e} each)"
    );
    (tol, explain)
}

/// The magnitude range of the random weights (float formats) or of the f16 scales
/// (quantized ones) that gives dot products of a few units: the root-mean-square weight
/// is about `1 / sqrt(cols)`, and activations are of order 2. The SwiGLU check needs
/// such gates: for much larger ones both `silu` and its wrong twin saturate alike.
fn weight_range(f: WeightFormat, cols: u32) -> (f32, f32) {
    let target = 1.0 / (cols as f32).sqrt();
    // Root-mean-square weight per unit of scale, for random quant bytes: the quant's
    // spread, times the spread of the sub-block scale where there is one.
    let per_scale = match f {
        WeightFormat::BF16 | WeightFormat::F16 => 1.0,
        WeightFormat::Q8_0 => 74.0,
        WeightFormat::Q4_0 => 4.6,
        WeightFormat::Q4_1 => 9.0,
        WeightFormat::Q4K => 317.0,
        WeightFormat::Q5K => 636.0,
        WeightFormat::Q6K => 1350.0,
        // Quants −4..=3 (RMS 2.35) times scales −32..=31 (RMS 18.5).
        WeightFormat::Q3K => 43.0,
        // Quants 0..=3 times scales 0..=15 (RMS 16.5) less mins 0..=15 times `dmin`
        // (RMS 8.8): about 18.
        WeightFormat::Q2K => 18.0,
    };
    // Magnitudes uniform in [hi/8, hi] have a root mean square of about 0.6·hi.
    let hi = target / per_scale / 0.6;
    (hi / 8.0, hi)
}

/// The check of integer-activation products against the exact ones
/// ([`integer::f64_check`]) plus `added` (a residual or bias, repeated; empty for none) in
/// output `buffer`, with the wrong variants as controls.
fn exact_bound(buffer: usize, c: &integer::F64Check, added: &[f32]) -> (Expected, Vec<Control>) {
    let add = |i: usize| {
        if added.is_empty() {
            0.0
        } else {
            added[i % added.len()]
        }
    };
    let want: Vec<f64> = c
        .want
        .iter()
        .enumerate()
        .map(|(i, w)| w + f64::from(add(i)))
        .collect();
    let tol = c
        .tol
        .iter()
        .zip(&want)
        .map(|(t, w)| t + F32_U * w.abs())
        .collect();
    let explain =
        "Σ|w|·(½ + 2^-7)·dx (the activations' quantization) + (n + 8)·2u·Σ|w·q|·dx (f32 terms) \
                   + 2u·|dot| + u·|result| of the exact product"
            .to_string();
    let check = Check::Bound { tol, explain };
    let bytes = |v: &[f64]| {
        act_bytes(
            OutType::F32,
            &v.iter().map(|&x| x as f32 as f64).collect::<Vec<_>>(),
        )
    };
    let controls = c
        .wrong
        .iter()
        .map(|(variant, got)| {
            let got: Vec<f64> = got
                .iter()
                .enumerate()
                .map(|(i, &g)| f64::from(g + add(i)))
                .collect();
            Control {
                what: format!("products with {variant:?}"),
                expected: Expected {
                    buffer,
                    data: bytes(&got),
                    elem: Scalar::F32,
                    check: check.clone(),
                },
            }
        })
        .collect();
    (
        Expected {
            buffer,
            data: bytes(&want),
            elem: Scalar::F32,
            check,
        },
        controls,
    )
}

/// `v` with `added` (repeated along it; empty: nothing) added.
fn with_added(v: &[f32], added: &[f32]) -> Vec<f32> {
    if added.is_empty() {
        return v.to_vec();
    }
    v.iter()
        .enumerate()
        .map(|(i, a)| a + added[i % added.len()])
        .collect()
}

/// What the residual form adds to the products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addend {
    /// Each vector's own row of a residual stream, updated in place (`r_stride = rows`).
    Residual,
    /// One bias row added to every vector's products (`r_stride = 0`), `y` apart.
    Bias,
}

/// A case of `n` vectors: random GGUF rows (every quant pattern; scales from
/// `weight_range`, random signs, f16 subnormals included for the finest formats),
/// activations in ±[2^-6, 4], a residual in ±[2^-6, 4] updated in place. With the RMSNorm
/// prologue the activations are the residual stream to normalize, the norm weight in
/// [0.5, 1.5], eps 1e-5. A Q5_K, Q3_K or Q2_K case holds the products of the weights as
/// each of [`data::mistakes`] reads them as controls.
pub fn case(p: &QGemvParams, n: u32, seed: u64) -> Result<KernelCase, KernelError> {
    case_with(p, n, Addend::Residual, seed)
}

/// As [`case`], with the residual form adding `addend`.
pub fn case_with(
    p: &QGemvParams,
    n: u32,
    addend: Addend,
    seed: u64,
) -> Result<KernelCase, KernelError> {
    let kernel = build(p)?;
    if n == 0 {
        return Err(KernelError::unsupported(
            p.name(),
            "a case needs at least one vector",
        ));
    }
    let mut rng = data::rng(seed);
    let (lo, hi) = weight_range(p.format, p.cols);
    let (rows, cols, nv) = (p.rows as usize, p.cols as usize, n as usize);
    let matrices = if p.epilogue == Epilogue::SwiGlu { 2 } else { 1 };
    let ws: Vec<Vec<u8>> = (0..matrices)
        .map(|_| data::ggml_rows(&mut rng, p.format.ggml(), rows, cols, lo, hi))
        .collect();
    let x = data::signed(&mut rng, nv * cols, 0.015625, 4.0);
    let x: Vec<f32> = match p.act {
        OutType::BF16 => data::to_bf16(&x).iter().map(|v| v.to_f32()).collect(),
        OutType::F32 => x,
    };
    let x_bytes = act_bytes(p.act, &x.iter().map(|&v| v as f64).collect::<Vec<_>>());
    let act_size = x_bytes.len() / (nv * cols);
    // With the prologue `x` is the residual stream, and the dot products see its norm.
    let norm = (p.prologue == Prologue::RmsNorm)
        .then(|| (data::uniform(&mut rng, cols, 0.5, 1.5), 1e-5f32));
    // Each vector's products on their own: what the kernel must give whatever the batch.
    let mut d: Vec<Vec<f32>> = vec![vec![]; matrices];
    let mut seen = vec![];
    for xv in x.chunks_exact(cols) {
        let xv = match &norm {
            Some((nw, eps)) => prologue::normalize(xv, nw, p.warps * 32, *eps),
            None => xv.to_vec(),
        };
        for (m, w) in ws.iter().enumerate() {
            d[m].extend(dots(p, w, &xv)?);
        }
        seen.push(xv);
    }
    // Q5_K, Q3_K and Q2_K: each matrix read with each of the format's mistakes
    // ([`data::mistakes`]) and multiplied as the kernel multiplies:
    // `(what, [matrix][vector, row])`.
    let mut mistaken: Vec<(&str, Vec<Vec<f32>>)> = vec![];
    let readings: Vec<_> = ws
        .iter()
        .map(|w| data::mistakes(p.format.ggml(), w))
        .collect();
    if !readings[0].is_empty() {
        for (i, &(what, _)) in readings[0].iter().enumerate() {
            let mut per_matrix = vec![];
            for reading in &readings {
                let mut products = vec![];
                for xv in &seen {
                    products.extend(dots(p, &reading[i].1, xv)?);
                }
                per_matrix.push(products);
            }
            mistaken.push((what, per_matrix));
        }
    }
    // The integer formats' products are exact integer sums on quantized activations: judged
    // bit for bit against their reference and within a bound of the exact products.
    let exact = match p.epilogue {
        Epilogue::Plain | Epilogue::Residual if integer::applies(p) => Some(
            integer::f64_check(p, &ws[0], &seen)
                .map_err(|e| KernelError::unsupported(p.name(), e.to_string()))?,
        ),
        _ => None,
    };
    let w_bytes: u64 = ws.iter().map(|w| w.len() as u64).sum();
    let mut buffers: Vec<Buffer> = ws
        .into_iter()
        .enumerate()
        .map(|(i, w)| Buffer::input(if i == 0 { "w" } else { "w_up" }, w))
        .collect();
    buffers.push(Buffer::input("x", x_bytes));
    if let Some((nw, _)) = &norm {
        buffers.push(Buffer::input("norm_w", data::f32_bytes(nw)));
    }
    let mut args: Vec<CaseArg> = (0..buffers.len()).map(CaseArg::Buffer).collect();
    let outputs = nv * rows;
    let (expected, mut controls, out_bytes, r_stride, added) = match p.epilogue {
        Epilogue::Plain => {
            buffers.push(Buffer::output("y", outputs * 4));
            args.push(CaseArg::Buffer(buffers.len() - 1));
            let e = Expected {
                buffer: buffers.len() - 1,
                data: data::f32_bytes(&d[0]),
                elem: Scalar::F32,
                check: Check::Exact,
            };
            let (bound, controls) = exact
                .as_ref()
                .map(|c| exact_bound(buffers.len() - 1, c, &[]))
                .unzip();
            (
                vec![Some(e), bound].into_iter().flatten().collect(),
                controls.unwrap_or_default(),
                outputs * 4,
                None,
                vec![],
            )
        }
        Epilogue::Residual => {
            let (added, stride) = match addend {
                Addend::Residual => (data::signed(&mut rng, outputs, 0.015625, 4.0), p.rows),
                Addend::Bias => (data::signed(&mut rng, rows, 0.015625, 4.0), 0),
            };
            let want = with_added(&d[0], &added);
            let i = match addend {
                Addend::Residual => {
                    // y and r are the same buffer: the residual stream updated in place.
                    buffers.push(Buffer::in_out("r", data::f32_bytes(&added)));
                    let i = buffers.len() - 1;
                    args.extend([CaseArg::Buffer(i), CaseArg::Buffer(i)]);
                    i
                }
                Addend::Bias => {
                    buffers.push(Buffer::input("bias", data::f32_bytes(&added)));
                    buffers.push(Buffer::output("y", outputs * 4));
                    let i = buffers.len() - 1;
                    args.extend([CaseArg::Buffer(i - 1), CaseArg::Buffer(i)]);
                    i
                }
            };
            let e = Expected {
                buffer: i,
                data: data::f32_bytes(&want),
                elem: Scalar::F32,
                check: Check::Exact,
            };
            let (bound, controls) = exact.as_ref().map(|c| exact_bound(i, c, &added)).unzip();
            let expected = vec![Some(e), bound].into_iter().flatten().collect();
            (
                expected,
                controls.unwrap_or_default(),
                outputs * 4 + added.len() * 4,
                Some(stride),
                added,
            )
        }
        Epilogue::SwiGlu => {
            let want = swiglu(p.act, &d[0], &d[1]);
            let (tol, explain) = swiglu_tolerance(p.act, &d[0], &want);
            let check = Check::Bound { tol, explain };
            buffers.push(Buffer::output("y", outputs * act_size));
            let i = buffers.len() - 1;
            args.push(CaseArg::Buffer(i));
            let wrong = swiglu_without_log2e(p.act, &d[0], &d[1]);
            let elem = p.act.scalar();
            let control = Control {
                what: "sigmoid without the log2(e) scaling".into(),
                expected: Expected {
                    buffer: i,
                    data: act_bytes(p.act, &wrong),
                    elem,
                    check: check.clone(),
                },
            };
            let e = Expected {
                buffer: i,
                data: act_bytes(p.act, &want),
                elem,
                check,
            };
            (vec![e], vec![control], outputs * act_size, None, vec![])
        }
    };
    // The output of each mistaken reading must fail the check the right one passes.
    for (what, d) in &mistaken {
        let data = match p.epilogue {
            Epilogue::Plain | Epilogue::Residual => data::f32_bytes(&with_added(&d[0], &added)),
            Epilogue::SwiGlu => act_bytes(p.act, &swiglu(p.act, &d[0], &d[1])),
        };
        controls.push(Control {
            what: format!("weights read with {what}"),
            expected: Expected {
                data,
                ..expected[0].clone()
            },
        });
    }
    if let Some((_, eps)) = norm {
        args.push(CaseArg::Scalar(Arg::F32(eps)));
    }
    args.push(CaseArg::Scalar(Arg::U32(n)));
    args.extend(r_stride.map(|s| CaseArg::Scalar(Arg::U32(s))));
    let norm_bytes = if norm.is_some() { 4 * cols as u64 } else { 0 };
    Ok(KernelCase {
        name: p.name().to_string(),
        shape: format!(
            "{}x{} times {n} vectors, {} a pass",
            p.rows, p.cols, p.batch
        ),
        kernel,
        launch: p.launch(),
        buffers,
        args,
        expected,
        controls,
        bytes_moved: w_bytes + (nv * cols * act_size) as u64 + norm_bytes + out_bytes as u64,
        flops: 2 * matrices as u64 * (nv * rows * cols) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_each_unit_once() {
        for f in WeightFormat::ALL {
            let mut seen = vec![0u32; f.unit_elems() as usize];
            for j in 0..f.pieces_per_unit() {
                for e in f.piece_elements(j) {
                    seen[e as usize] += 1;
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{f:?}");
            assert_eq!(
                f.row_bytes(f.unit_elems() * 4) as u64,
                f.ggml().bytes_for(f.unit_elems() as u64 * 4).unwrap_or(0)
            );
        }
    }

    #[test]
    fn names_are_distinct() {
        let mut all: Vec<&str> = NAMES
            .iter()
            .chain(&NAMES_XF32)
            .chain(&NAMES_RMSNORM)
            .flatten()
            .copied()
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 90);
        assert_eq!(
            rmsnorm_name(WeightFormat::Q4_1, Epilogue::SwiGlu),
            "qgemv_q4_1_rmsnorm_swiglu_xf32"
        );
        assert_eq!(
            name(WeightFormat::Q4K, Epilogue::SwiGlu, OutType::BF16),
            "qgemv_q4_k_swiglu"
        );
        assert_eq!(
            name(WeightFormat::Q6K, Epilogue::Residual, OutType::F32),
            "qgemv_q6_k_residual_xf32"
        );
    }
}
