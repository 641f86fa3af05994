//! The prompt path: a chunk of up to [`PrefillPlan::chunk`] tokens of one session runs
//! through the model as matrices — every projection a tensor-core GEMM over the chunk's
//! rows, reading the weights the decode step reads (uploaded once; a layer's found by what
//! they are, [`super::weights`]), built by the same [`Assembler`] — and writes the chunk's keys and values
//! into the session's blocks of the shared KV cache, so that decode steps continue from
//! it. Only the chunk's last row goes through the final norm and the LM head.
//!
//! With `R` the f32 residual rows and `n` the chunk's length (one dispatch each, launched
//! directly: a chunk is long enough that launch overhead does not matter):
//!
//! ```text
//! embed                   R = table[tokens]                               [n, hidden]
//! per layer:
//!   rmsnorm_residual_f16  xn = f16(norm(R)·w)                             (R += zeros)
//!   (bias_rows_f32)       qkv = b_qkv                                     (qwen2)
//!   gemm_*_xf16           qkv (+)= xn·W_qkvᵀ        (q, k and v apart where a layer's formats differ)
//!   rope_append           q, k rotated (qwen3: per-head norms first); k, v → cache (f16)
//!   attention_prefill_f16 attn16 = f16(softmax(q·Kᵀ)·V), causal over the cache   [n/64, heads]
//!   gemm_*_xf16_residual  R += attn16·W_oᵀ
//!   rmsnorm_residual_f16  xn = f16(norm(R)·w)
//!   gemm_*_xf16_to_f16 ×2 gate16 = f16(xn·W_gateᵀ), up16 = f16(xn·W_upᵀ)   (side by side)
//!   silu_mul_f16          act16 = silu(gate16)·up16
//!   gemm_*_xf16_residual  R += act16·W_downᵀ
//! qgemv_rmsnorm           logits = W_out·(norm(R[n − 1])·w)               (the last row only)
//! argmax                  the next token (greedy)
//! ```
//!
//! **Attention** runs once a chunk on the tensor cores over the f16 cache the chunk's keys
//! and values were just appended to (so a cached prefix and earlier chunks come for
//! free): 64 queries of one head a block, keys 64 at a time up to the block's last
//! position, its f16 output what the output projection reads. Heads of sizes other than
//! 64 and 128, which that kernel does not take, run the decode attention kernel instead,
//! a row per query (its own context length, its own copy of the session's block table),
//! and round its f32 output to f16 in a pass of its own (`cast_f32_f16`).
//!
//! **Precision**: the matrix products multiply f16 on the tensor cores, summing in f32:
//! the activations they read (norm outputs, attention outputs, SwiGLU) are rounded to
//! f16 by the kernels that write them, bf16 weights are widened to f16 in registers
//! (exact for every bf16 of magnitude 2⁻¹⁷ to 65504), f16 weights are read as stored,
//! and quantized weights are dequantized in f32 and rounded to f16 in shared memory. The
//! residual stream, the q, k and v projections and RoPE stay f32 and the cache f16, as in
//! the decode step. f16's 11-bit significand rounds each operand by at most 2⁻¹¹ of it —
//! eight times finer than bf16, whose 2⁻⁸ on every activation put logits about twice as
//! far from the f64 reference as `quench check` allows. The price is f16's range: an
//! activation past ±65504 becomes infinite, so a model whose activations reach that far
//! needs its prompts fed token by token (`--prefill-chunk 0`). How far the logits land from f64: `docs/perf/NOTES.md` ("Prompt path in
//! f16").

use quench_ir::func::MAX_STATIC_SHARED_BYTES;
use quench_ir::{Function, Scalar};
use quench_kernels::argmax::{self, ArgmaxParams};
use quench_kernels::attention::decode::{self as attn_decode, DecodeParams};
use quench_kernels::attention::prefill::{self as attn_prefill, PrefillParams};
use quench_kernels::bias::{self, BiasRowsParams};
use quench_kernels::embed;
use quench_kernels::gemm::{self, BFormat, Core, Epilogue as GemmEpilogue, GemmParams, Operands};
use quench_kernels::norm_residual::{self, Norm, NormOut, NormResidualParams, OutType};
use quench_kernels::qgemv::{self, Epilogue, Prologue, QGemvParams, WeightFormat};
use quench_kernels::silu_mul::{self, SiluMulParams};
use quench_kernels::to_bf16::{self, Activation, ToBf16Params};
use quench_models::arch::ModelConfig;
use quench_rt::{Arg, DevicePtr, Executor, StreamId};

use super::catalog::{Catalog, Qkv};
use super::decoder::DeviceMemory;
use super::error::GpuError;
use super::graph::{
    self, attention_shape, gemv_shape, row_threads, u32_of, DecodeGraph, QkvRows, Reduction,
    RopeRows,
};
use super::plan::{at, resolve, Assembler, Grid, Offset, Operand, Program, Region, Resolved, Rows};
use super::weights::{LayerWeights, ModelWeights};

/// The host-written parts of the arena, per chunk: `[tokens | positions | context
/// lengths | zeros]`, `chunk` u32 each (the zeros, written once, are every row's
/// sequence index for the KV append: all rows use block-table row 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    chunk: u32,
}

impl Record {
    fn part(self, i: u64) -> u64 {
        4 * i * self.chunk as u64
    }
}

/// The prompt path's dispatch list, kernels and buffers, planned before anything is
/// allocated.
#[derive(Clone, Debug)]
pub struct PrefillPlan {
    /// Most tokens one chunk takes.
    pub chunk: u32,
    program: Program,
    /// The chunk record (a buffer of the program).
    record: usize,
    /// `[chunk, max_blocks]` u32: the session's block table, once per row.
    tables: usize,
    /// Zeros written once: the residual addend of the norms and (attending a row per
    /// query) the attention's split counters, left at zero by every launch.
    zero_buffers: Vec<usize>,
    max_blocks: u32,
    /// The residual rows and (a tensor-parallel rank's) partial sums (buffers).
    residual: usize,
    partial: Option<usize>,
    /// A tensor-parallel rank's segment ends, as the decode step's.
    reductions: Vec<(usize, Reduction)>,
}

impl PrefillPlan {
    /// Bytes of the arena (every buffer 256-byte aligned, none shared).
    pub fn arena_bytes(&self) -> u64 {
        self.program
            .buffers
            .iter()
            .map(|b| b.bytes.div_ceil(256) * 256)
            .sum()
    }

    /// The distinct kernels its dispatches launch.
    pub fn kernels(&self) -> &[Function] {
        &self.program.kernels
    }

    pub fn dispatches(&self) -> usize {
        self.program.dispatches.len()
    }

    /// Matrix products of a chunk on `wgmma`.
    pub fn wgmma_products(&self) -> usize {
        self.program
            .dispatches
            .iter()
            .filter(|d| matches!(d.grid, Grid::Gemm(p) if p.core.is_wgmma()))
            .count()
    }

    /// One line per dispatch of a chunk of `n` tokens ([`super::listing`]), beside
    /// `graph`, the decode step it was planned with.
    pub fn listing(&self, graph: &DecodeGraph, n: u32) -> Vec<String> {
        let p = &self.program;
        super::listing::lines(p.run_of(n), &p.kernels, &p.buffers, graph, n)
    }

    /// The labels of layer 0's dispatches, in order.
    pub fn layer_plan(&self) -> Vec<String> {
        self.program
            .dispatches
            .iter()
            .filter_map(|d| d.label.strip_prefix("layer 0: ").map(str::to_owned))
            .collect()
    }
}

/// Whether the prompt path's GEMM of format `f` takes rows of `k` elements.
pub(crate) fn gemm_takes(f: WeightFormat, k: usize) -> bool {
    k.is_multiple_of(gemm_format(f).k_multiple() as usize)
}

/// The tensor-core GEMM's name for a weight format.
fn gemm_format(f: WeightFormat) -> BFormat {
    match f {
        WeightFormat::BF16 => BFormat::Bf16,
        WeightFormat::Q8_0 => BFormat::Q8_0,
        WeightFormat::Q4_0 => BFormat::Q4_0,
        WeightFormat::Q4_1 => BFormat::Q4_1,
        WeightFormat::Q4K => BFormat::Q4K,
        WeightFormat::Q5K => BFormat::Q5K,
        WeightFormat::Q6K => BFormat::Q6K,
        WeightFormat::Q3K => BFormat::Q3K,
        WeightFormat::Q2K => BFormat::Q2K,
        WeightFormat::F16 => BFormat::F16,
    }
}

/// Why a model's prompts cannot take the chunk path (they are then fed token by token).
fn not_here(what: impl Into<String>, reason: impl Into<String>) -> GpuError {
    GpuError::Unsupported {
        what: what.into(),
        reason: reason.into(),
    }
}

/// How a chunk attends to the cache.
enum Attention {
    /// One tensor-core launch for the chunk (`attention_prefill_f16`), f16 out.
    TensorCores {
        kernel: usize,
        params: PrefillParams,
    },
    /// For head sizes that kernel does not take: the decode attention kernel with a row
    /// per query (its own context length, its own copy of the block table), f32 out into
    /// `out`, then rounded to f16 by a pass of its own (`cast`).
    PerRow {
        kernel: usize,
        params: DecodeParams,
        cast: (usize, ToBf16Params),
        /// The splits' maxima, sums and outputs.
        parts: [Operand; 3],
        counters: usize,
        out: Operand,
    },
}

/// Builds a prompt chunk's program over the decode step's weights, cache and logits.
struct ChunkBuilder<'a> {
    a: Assembler,
    c: &'a ModelConfig,
    catalog: &'a Catalog,
    graph: &'a DecodeGraph,
    w: &'a ModelWeights,
    chunk: u32,
    /// The chunk record, the block tables and the zero rows (buffer indices).
    record: usize,
    tables: usize,
    zeros: usize,
    /// The f32 residual rows (a buffer) and the f16 normalized rows.
    residual: usize,
    normed: Operand,
    qkv: QkvRows,
    attention: Attention,
    /// The attention's f16 output rows.
    attn16: Operand,
    /// Gate rows, then up rows (f16), each the chunk's rows long.
    gate_up16: Region,
    act16: Operand,
    /// The row norm's kernel and parameters.
    norm: (usize, NormResidualParams),
    silu: (usize, SiluMulParams),
    /// A tensor-parallel rank's chunk ([`DecodeGraph::reductions`]): the f32 rows its
    /// output and down projections write, and where it stops for the ranks' rows to meet.
    partial: Option<usize>,
    reductions: Vec<(usize, Reduction)>,
}

impl<'a> ChunkBuilder<'a> {
    /// The chunk's buffers and the kernels every layer shares.
    fn new(
        c: &'a ModelConfig,
        catalog: &'a Catalog,
        graph: &'a DecodeGraph,
        chunk: u32,
    ) -> Result<Self, GpuError> {
        let mut a = Assembler::default();
        let (hidden, hd, ffn) = (c.hidden, c.head_dim, c.ffn);
        let (q_width, kv_width) = (c.heads * hd, c.kv_heads * hd);
        let qkv_width = q_width + 2 * kv_width;
        let buffer = |a: &mut Assembler, name: &str, width: usize, bytes: u64| {
            a.buffer(name.into(), chunk as u64 * width as u64 * bytes, false)
        };
        let record = buffer(&mut a, "chunk record", 4, 4);
        let tables = buffer(&mut a, "block tables", graph.kv.max_blocks as usize, 4);
        let zeros = buffer(&mut a, "zero rows", hidden, 4);
        let residual = buffer(&mut a, "residual", hidden, 4);
        let partial = graph
            .io
            .partial
            .map(|_| buffer(&mut a, "partial sums", hidden, 4));
        let normed = at(
            Region::Act(buffer(&mut a, "normed rows (f16)", hidden, 2)),
            0,
        );
        let embed = graph::embed_params(catalog, hidden)?;
        let embed_k = a.kernel("token embedding", &embed, embed::build)?;
        let np = NormResidualParams {
            norm: Norm::Rms,
            out: NormOut::F16,
            cols: u32_of("hidden", hidden)?,
            threads: row_threads(u32_of("hidden", hidden)? / 4),
        };
        let norm_k = a.kernel("RMSNorm rows", &np, norm_residual::build)?;
        // Buffers every layer reuses: q, k and v apart where any layer's differ in
        // format (a layer of one format then takes three products too).
        let separate = catalog
            .layers
            .iter()
            .any(|l| matches!(l.qkv, Qkv::Separate(_)));
        let qkv = match separate {
            true => QkvRows {
                q: at(Region::Act(buffer(&mut a, "q", q_width, 4)), 0),
                k: at(Region::Act(buffer(&mut a, "k", kv_width, 4)), 0),
                v: at(Region::Act(buffer(&mut a, "v", kv_width, 4)), 0),
                token_stride: 0,
            },
            false => {
                let r = Region::Act(buffer(&mut a, "q|k|v", qkv_width, 4));
                QkvRows {
                    q: at(r, 0),
                    k: at(r, 4 * q_width as u64),
                    v: at(r, 4 * (q_width + kv_width) as u64),
                    token_stride: u32_of("q|k|v width", qkv_width)?,
                }
            }
        };
        let attn16 = at(
            Region::Act(buffer(&mut a, "attention output (f16)", q_width, 2)),
            0,
        );
        let attention =
            attention_kernels(&mut a, c, graph, qkv.token_stride, &mut |a, n, w, b| {
                buffer(a, n, w, b)
            })?;
        let gate_up16 = Region::Act(buffer(&mut a, "gate | up (f16)", 2 * ffn, 2));
        let act16 = at(Region::Act(buffer(&mut a, "SwiGLU (f16)", ffn, 2)), 0);
        let silu = SiluMulParams { threads: 256 };
        let silu_k = a.kernel("SwiGLU", &silu, silu_mul::build)?;
        let mut b = ChunkBuilder {
            a,
            c,
            catalog,
            graph,
            w: &graph.weights,
            chunk,
            record,
            tables,
            zeros,
            residual,
            normed,
            qkv,
            attention,
            attn16,
            gate_up16,
            act16,
            norm: (norm_k, np),
            silu: (silu_k, silu),
            partial,
            reductions: vec![],
        };
        let args = vec![
            b.record_part(0),
            b.w.part(b.w.embedding, 0),
            at(Region::Act(residual), 0),
            Operand::Value(Arg::U32(u32_of("vocab", c.vocab)?)),
        ];
        let grid = Grid::PerRow(embed.launch(1), 0);
        b.a.push(Rows::Any, "token embedding".into(), embed_k, grid, args);
        b.reduce(Reduction::Gather);
        Ok(b)
    }

    /// Ends a tensor-parallel rank's segment of the chunk here.
    fn reduce(&mut self, r: Reduction) {
        if self.partial.is_some() {
            self.reductions.push((self.a.dispatches.len(), r));
        }
    }

    /// Where the output and down projections put their products, and how: added to the
    /// residual rows, or (a tensor-parallel rank) stored apart for the host to sum.
    fn residual_update(&self) -> (Operand, GemmEpilogue) {
        match self.partial {
            Some(p) => (at(Region::Act(p), 0), GemmEpilogue::Store),
            None => (at(Region::Act(self.residual), 0), GemmEpilogue::Accumulate),
        }
    }

    fn record_part(&self, i: u64) -> Operand {
        at(
            Region::Act(self.record),
            Record { chunk: self.chunk }.part(i),
        )
    }

    /// `normed = f16(norm(R)·weight)` (`R += zeros`), a block per row.
    fn norm(&mut self, label: String, weight: Operand) {
        let (k, np) = self.norm;
        let args = vec![
            at(Region::Act(self.zeros), 0),
            at(Region::Act(self.residual), 0),
            weight,
            self.normed,
            Operand::Value(Arg::F32(self.c.norm_eps as f32)),
        ];
        self.a
            .push(Rows::Any, label, k, Grid::PerRow(np.launch(1), 0), args);
    }

    /// Layer `l`'s dispatches.
    fn layer(&mut self, l: usize) -> Result<(), GpuError> {
        let catalog = self.catalog;
        let lk = &catalog.layers[l];
        let lw = self.w.layers[l];
        let label = |what: &str| format!("layer {l}: {what}");
        self.norm(label("attention norm"), self.w.part(lw.norms, 0));
        self.qkv_projection(l, lk.qkv, lw)?;
        let rows = RopeRows {
            seq: self.record_part(3),
            pos: self.record_part(1),
            table: at(Region::Act(self.tables), 0),
            context: self.graph.context,
        };
        let (what, k, launch, args) = graph::rope_append_dispatch(
            &mut self.a,
            self.c,
            catalog,
            self.w,
            l,
            self.graph.kv,
            self.qkv,
            rows,
        )?;
        self.a
            .push(Rows::Any, label(what), k, Grid::PerRow(launch, 0), args);
        self.attention(l)?;
        let (hidden, q_width, ffn) = (self.c.hidden, self.c.heads * self.c.head_dim, self.c.ffn);
        let (r, update) = self.residual_update();
        let (attn16, wo) = (self.attn16, self.w.part(lw.attn_output, 0));
        self.gemm(
            label("output projection"),
            lk.attn_output,
            hidden,
            q_width,
            attn16,
            wo,
            r,
            update,
        )?;
        self.reduce(Reduction::Sum);

        self.norm(label("ffn norm"), self.w.part(lw.norms, 1));
        let gate = at(self.gate_up16, 0);
        let up = Operand::At(self.gate_up16, Offset::Rows(2 * ffn as u64));
        let (xn, to_f16) = (self.normed, GemmEpilogue::StoreHalf);
        let (wg, wu) = (self.w.part(lw.gate_up, 0), self.w.part(lw.gate_up, 1));
        self.gemm(
            label("gate projection"),
            lk.gate_up,
            ffn,
            hidden,
            xn,
            wg,
            gate,
            to_f16,
        )?;
        self.gemm(
            label("up projection"),
            lk.gate_up,
            ffn,
            hidden,
            xn,
            wu,
            up,
            to_f16,
        )?;
        let fw = u32_of("ffn", ffn)?;
        let (silu_k, silu) = self.silu;
        let args = vec![gate, up, self.act16, Operand::Elements(fw)];
        self.a.push(
            Rows::Any,
            label("SwiGLU"),
            silu_k,
            Grid::SiluMul(silu, fw),
            args,
        );
        let (act16, wd) = (self.act16, self.w.part(lw.down, 0));
        self.gemm(
            label("down projection"),
            lk.down,
            hidden,
            ffn,
            act16,
            wd,
            r,
            update,
        )?;
        self.reduce(Reduction::Sum);
        Ok(())
    }

    /// q, k and v (after their biases, where the model has them) as GEMMs over the
    /// normalized rows: one over the three matrices back to back, or three.
    fn qkv_projection(&mut self, l: usize, qkv: Qkv, lw: LayerWeights) -> Result<(), GpuError> {
        let (hidden, q_width, kv_width) = (
            self.c.hidden,
            self.c.heads * self.c.head_dim,
            self.c.kv_heads * self.c.head_dim,
        );
        let bias_p = BiasRowsParams { threads: 128 };
        let bias_k = match lw.qkv_bias {
            Some(_) => Some(self.a.kernel("bias rows", &bias_p, bias::build)?),
            None => None,
        };
        let project = |b: &mut Self, what: &str, format, rows: usize, part: usize, out| {
            let label = |x: &str| format!("layer {l}: {what} {x}");
            let epilogue = match (lw.qkv_bias, bias_k) {
                (Some(bias), Some(bk)) => {
                    let args = vec![
                        b.w.part(bias, part),
                        out,
                        Operand::Value(Arg::U32(u32_of("width", rows)?)),
                    ];
                    let grid = Grid::PerRow(bias_p.launch(1), 0);
                    b.a.push(Rows::Any, label("bias"), bk, grid, args);
                    GemmEpilogue::Accumulate
                }
                _ => GemmEpilogue::Store,
            };
            let (xn, w) = (b.normed, b.w.part(lw.qkv, part));
            b.gemm(
                label("projection"),
                format,
                rows,
                hidden,
                xn,
                w,
                out,
                epilogue,
            )
        };
        let out = self.qkv;
        let formats = match (qkv, out.token_stride) {
            // The biases' parts lie back to back: one row of q|k|v biases.
            (Qkv::Fused(f), 1..) => {
                return project(self, "q|k|v", f, q_width + 2 * kv_width, 0, out.q);
            }
            (Qkv::Fused(f), 0) => [f; 3],
            (Qkv::Separate(formats), 0) => formats,
            (Qkv::Separate(_), 1..) => {
                return Err(GpuError::Internal(format!(
                    "layer {l}'s q, k and v differ in format but share one buffer"
                )))
            }
        };
        let widths = [q_width, kv_width, kv_width];
        let outs = [out.q, out.k, out.v];
        for (i, what) in ["q", "k", "v"].iter().enumerate() {
            project(self, what, formats[i], widths[i], i, outs[i])?;
        }
        Ok(())
    }

    /// The chunk's attention over the cache its keys and values were just appended to,
    /// into the f16 rows the output projection reads.
    fn attention(&mut self, l: usize) -> Result<(), GpuError> {
        let label = |what: &str| format!("layer {l}: {what}");
        let (kc, vc) = (at(Region::KCache(l), 0), at(Region::VCache(l), 0));
        let table = at(Region::Act(self.tables), 0);
        let scale = Operand::Value(Arg::F32((1.0 / (self.c.head_dim as f64).sqrt()) as f32));
        let q = self.qkv.q;
        match self.attention {
            Attention::TensorCores { kernel, params } => {
                let args = vec![
                    q,
                    kc,
                    vc,
                    table,
                    Operand::Start,
                    Operand::Rows,
                    scale,
                    self.attn16,
                ];
                self.a.push(
                    Rows::Any,
                    label("attention"),
                    kernel,
                    Grid::Prefill(params),
                    args,
                );
            }
            Attention::PerRow {
                kernel,
                params,
                cast: (cast_k, cast),
                parts,
                counters,
                out,
            } => {
                let args = vec![
                    q,
                    kc,
                    vc,
                    table,
                    self.record_part(2),
                    parts[0],
                    parts[1],
                    parts[2],
                    at(Region::Act(counters), 0),
                    out,
                    scale,
                ];
                let grid = Grid::PerRow(params.launch(1), 1);
                self.a
                    .push(Rows::Any, label("attention"), kernel, grid, args);
                let qw = u32_of("q width", self.c.heads * self.c.head_dim)?;
                let args = vec![out, self.attn16, Operand::Elements(qw)];
                self.a.push(
                    Rows::Any,
                    label("attention to f16"),
                    cast_k,
                    Grid::Cast(cast, qw),
                    args,
                );
            }
        }
        Ok(())
    }

    /// The last row's `logits = W_out·(norm(R[n − 1])·w)` into the decode step's row 0,
    /// and its argmax.
    fn head(&mut self) -> Result<(), GpuError> {
        let (c, catalog, graph) = (self.c, self.catalog, self.graph);
        let hidden = c.hidden;
        let (warps, max_blocks) = gemv_shape(catalog.output, hidden, true, graph.multiprocessors);
        let hp = QGemvParams {
            format: catalog.output,
            prologue: Prologue::RmsNorm,
            epilogue: Epilogue::Plain,
            rows: u32_of("vocab", c.vocab)?,
            cols: u32_of("hidden", hidden)?,
            warps,
            unroll: if catalog.output.is_float() { 4 } else { 2 },
            act: OutType::F32,
            batch: 1,
            max_blocks,
        };
        let k = self.a.kernel("output norm + LM head", &hp, qgemv::build)?;
        let logits = at(Region::Step(graph.io.logits), 0);
        let args = vec![
            self.w.part(self.w.head, 0),
            Operand::At(
                Region::Act(self.residual),
                Offset::LastRow(4 * hidden as u64),
            ),
            self.w.part(self.w.output_norm, 0),
            logits,
            Operand::Value(Arg::F32(c.norm_eps as f32)),
            Operand::Value(Arg::U32(1)),
        ];
        let label = "output norm + LM head (last row)".to_string();
        self.a
            .push(Rows::Any, label, k, Grid::Once(hp.launch()), args);
        if let Some(next) = graph.io.next {
            let cols = u32_of("vocab", c.vocab)?;
            let p = ArgmaxParams {
                cols,
                threads: row_threads(cols / 4).max(128),
            };
            let k = self.a.kernel("argmax", &p, argmax::build)?;
            let args = vec![logits, at(Region::Step(next), 0)];
            self.a
                .push(Rows::Any, "argmax".into(), k, Grid::Once(p.launch(1)), args);
        }
        Ok(())
    }

    /// `C (+)= A·Bᵀ` over the chunk's rows, as `epilogue` says: `B` `[n, k]` in `format`
    /// at `b`.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &mut self,
        label: String,
        format: WeightFormat,
        n: usize,
        k: usize,
        a: Operand,
        b: Operand,
        c: Operand,
        epilogue: GemmEpilogue,
    ) -> Result<(), GpuError> {
        let f = gemm_format(format);
        let (n, k) = (u32_of("GEMM n", n)?, u32_of("GEMM k", k)?);
        if !k.is_multiple_of(f.k_multiple()) {
            return Err(not_here(
                format!("{label} with k = {k}"),
                format!(
                    "the {format:?} GEMM needs k a multiple of {}",
                    f.k_multiple()
                ),
            ));
        }
        // The widest tile the shapes, the chunk and the shared memory allow (large tiles
        // read the weights fewer times; a 64-row tile wastes less on short chunks). Under
        // 128-row tiles, 64×64 warp tiles where they fit: half the fragment loads per MMA
        // of 64×32 ones, with four warps a block; under 64-row ones, 64×32 (four warps).
        let bm = if self.chunk >= 256 { 128 } else { 64 };
        let wide = if bm == 128 { &[(128, 64)][..] } else { &[] };
        // bf16 and f16 weights on Hopper's wgmma where the chunk fills its tiles: 256
        // tokens by 128 weight rows from 1,024 tokens a chunk (1.5–1.7× the mma.sync
        // products at 2048 rows), 128 by 128 from 256.
        let wgmma_bm = match self.chunk {
            c if c >= 1024 => Some(256),
            c if c >= 256 => Some(128),
            _ => None,
        };
        let wgmma = wgmma_bm
            .filter(|_| !f.is_quantized())
            .map(|bm| GemmParams {
                format: f,
                operands: Operands::F16,
                epilogue,
                n,
                k,
                bm,
                bn: 128,
                wn: 64,
                stages: 4,
                core: Core::Wgmma,
            })
            .filter(|p| n.is_multiple_of(p.bn) && k.is_multiple_of(64));
        let p = wgmma
            .into_iter()
            .chain(
                wide.iter()
                    .chain(&[(128, 32), (64, 32)])
                    .copied()
                    .flat_map(|(bn, wn)| (2..=3).rev().map(move |stages| (bn, wn, stages)))
                    .map(|(bn, wn, stages)| GemmParams {
                        format: f,
                        operands: Operands::F16,
                        epilogue,
                        n,
                        k,
                        bm,
                        bn,
                        wn,
                        stages,
                        core: Core::MmaSync,
                    }),
            )
            .find(|p| {
                n.is_multiple_of(p.bn)
                    && (p.core.is_wgmma() || p.shared_bytes() <= MAX_STATIC_SHARED_BYTES)
            })
            .ok_or_else(|| {
                not_here(
                    format!("{label} with n = {n}"),
                    "the GEMM needs n a multiple of 64",
                )
            })?;
        let kernel = self.a.kernel(&label, &p, gemm::build)?;
        self.a.push(
            Rows::Any,
            label,
            kernel,
            Grid::Gemm(p),
            vec![a, b, c, Operand::Rows],
        );
        Ok(())
    }
}

/// The chunk's attention kernels: on the tensor cores where the head size suits them,
/// else the decode kernel a row per query (with the buffers `buffer` makes).
fn attention_kernels(
    a: &mut Assembler,
    c: &ModelConfig,
    graph: &DecodeGraph,
    q_stride: u32,
    buffer: &mut dyn FnMut(&mut Assembler, &str, usize, u64) -> usize,
) -> Result<Attention, GpuError> {
    let head_dim = u32_of("head_dim", c.head_dim)?;
    let (n_heads, n_kv_heads) = (u32_of("heads", c.heads)?, u32_of("kv_heads", c.kv_heads)?);
    let max_blocks = graph.kv.max_blocks;
    if attn_prefill::HEAD_DIMS.contains(&head_dim) {
        let params = PrefillParams {
            kv: graph.kv.elem,
            head_dim,
            n_heads,
            n_kv_heads,
            max_blocks,
            q_stride,
        };
        let kernel = a.kernel("attention", &params, attn_prefill::build)?;
        return Ok(Attention::TensorCores { kernel, params });
    }
    let group = n_heads / n_kv_heads.max(1);
    let (threads, split, most_blocks) =
        attention_shape(head_dim, group, graph.context, graph.kv.elem)?;
    if most_blocks != max_blocks {
        return Err(not_here(
            "the prompt path's attention",
            "its block tables differ from the decode step's",
        ));
    }
    let params = DecodeParams {
        head_dim,
        n_heads,
        n_kv_heads,
        max_blocks,
        split,
        threads,
        kv: graph.kv.elem,
        merge: true,
        q_stride,
    };
    let splits = params.n_splits() as usize;
    let cast = ToBf16Params {
        activation: Activation::Identity,
        out: Scalar::F16,
        threads: 256,
    };
    let kernel = a.kernel("attention", &params, attn_decode::build)?;
    let cast_k = a.kernel("f16 rounding", &cast, to_bf16::build)?;
    let (heads, hd) = (c.heads, c.head_dim);
    let mut part = |name: &str, width: usize| at(Region::Act(buffer(a, name, width, 4)), 0);
    let parts = [
        part("split maxima", heads * splits),
        part("split sums", heads * splits),
        part("split outputs", heads * splits * hd),
    ];
    let counters = buffer(a, "attention split counters", c.kv_heads, 4);
    let out = at(Region::Act(buffer(a, "attention output", heads * hd, 4)), 0);
    Ok(Attention::PerRow {
        kernel,
        params,
        cast: (cast_k, cast),
        parts,
        counters,
        out,
    })
}

impl PrefillPlan {
    /// Plans the prompt path of `config` for chunks of `chunk` tokens beside `graph`, the
    /// decode step (whose weights, KV cache and logits it uses). Refuses, naming why, a
    /// model whose formats or shapes a kernel does not take.
    pub fn new(
        config: &ModelConfig,
        catalog: &Catalog,
        graph: &DecodeGraph,
        chunk: usize,
    ) -> Result<PrefillPlan, GpuError> {
        // Attending a row per query, the grid holds a row per query and kv head on its
        // second axis.
        let tensor_cores = attn_prefill::HEAD_DIMS.contains(&u32_of("head_dim", config.head_dim)?);
        let chunk = match tensor_cores {
            true => chunk,
            false => chunk.min(65535 / config.kv_heads.max(1)),
        }
        .max(1);
        let mut b = ChunkBuilder::new(config, catalog, graph, u32_of("prefill chunk", chunk)?)?;
        for l in 0..catalog.layers.len() {
            b.layer(l)?;
        }
        b.head()?;
        let zero_buffers = match b.attention {
            Attention::PerRow { counters, .. } => vec![counters, b.zeros, b.record],
            Attention::TensorCores { .. } => vec![b.zeros, b.record],
        };
        Ok(PrefillPlan {
            chunk: b.chunk,
            record: b.record,
            tables: b.tables,
            zero_buffers,
            max_blocks: graph.kv.max_blocks,
            residual: b.residual,
            partial: b.partial,
            reductions: b.reductions,
            program: b.a.finish(),
        })
    }
}

/// Where the decode step's memory the prompt path uses lives.
pub(crate) struct Bases {
    pub weights: DevicePtr,
    /// Offset of each weight group.
    pub group_at: Vec<u64>,
    pub kv: DevicePtr,
    pub kv_layer_bytes: u64,
    /// The decode step's arena and the offset of each of its buffers.
    pub step: DevicePtr,
    pub step_at: Vec<u64>,
}

/// The prompt path on a device: its arena and resolved launches.
pub(crate) struct OnDevice {
    pub chunk: u32,
    launches: Vec<Resolved>,
    record: DevicePtr,
    record_layout: Record,
    tables: DevicePtr,
    max_blocks: u32,
    pub residual: DevicePtr,
    pub partial: Option<DevicePtr>,
    /// A tensor-parallel rank's segment ends ([`PrefillPlan`]).
    pub reductions: Vec<(usize, Reduction)>,
}

/// Allocates the arena in `mem`, zeroes what must start at zero, compiles the kernels and
/// resolves every launch.
pub(crate) fn place(
    mem: &mut DeviceMemory,
    plan: &PrefillPlan,
    bases: &Bases,
) -> Result<OnDevice, GpuError> {
    let arena = mem.alloc(plan.arena_bytes(), "the prompt path's activations")?;
    let exec = &mut *mem.exec;
    let buffers = &plan.program.buffers;
    let mut offsets = Vec::with_capacity(buffers.len());
    let mut total = 0;
    for b in buffers {
        offsets.push(total);
        total += b.bytes.div_ceil(256) * 256;
    }
    for &z in &plan.zero_buffers {
        exec.copy_to_device(
            arena.offset(offsets[z]),
            &vec![0u8; buffers[z].bytes as usize],
        )
        .map_err(GpuError::runtime("zeroing the prompt path's buffers"))?;
    }
    let kernels = super::decoder::compile(exec, &plan.program.kernels)?;
    let base = |r: Region| -> Result<DevicePtr, GpuError> {
        Ok(match r {
            Region::Act(i) => arena.offset(offsets[i]),
            Region::Weights(g) => bases.weights.offset(bases.group_at[g]),
            Region::KCache(l) => bases.kv.offset(2 * l as u64 * bases.kv_layer_bytes),
            Region::VCache(l) => bases.kv.offset((2 * l as u64 + 1) * bases.kv_layer_bytes),
            Region::Step(i) => bases.step.offset(bases.step_at[i]),
        })
    };
    Ok(OnDevice {
        chunk: plan.chunk,
        launches: resolve(&plan.program.dispatches, &kernels, base)?,
        record: arena.offset(offsets[plan.record]),
        record_layout: Record { chunk: plan.chunk },
        tables: arena.offset(offsets[plan.tables]),
        max_blocks: plan.max_blocks,
        residual: arena.offset(offsets[plan.residual]),
        partial: plan.partial.map(|p| arena.offset(offsets[p])),
        reductions: plan.reductions.clone(),
    })
}

impl OnDevice {
    /// Runs `tokens` (at most [`OnDevice::chunk`]) at positions `start..` of the session
    /// whose block table is `blocks` (already holding blocks for every position of the
    /// chunk): writes the chunk's record and tables, then launches every dispatch. The
    /// last token's logits (and its argmax) land in the decode step's row 0.
    pub fn run(
        &self,
        exec: &mut dyn Executor,
        tokens: &[u32],
        start: u32,
        blocks: &[u32],
    ) -> Result<(), GpuError> {
        self.begin(exec, tokens, 0, start, blocks)?;
        self.launch(exec, 0..self.launches.len(), tokens.len() as u32, start)
    }

    /// Writes the chunk's record (its tokens less `token_base`, a tensor-parallel rank's
    /// first token) and block tables, as [`OnDevice::run`] does before launching.
    pub fn begin(
        &self,
        exec: &mut dyn Executor,
        tokens: &[u32],
        token_base: u32,
        start: u32,
        blocks: &[u32],
    ) -> Result<(), GpuError> {
        let n = tokens.len() as u32;
        let during = |what: &str| format!("prompt chunk of {n} tokens at position {start}: {what}");
        let c = self.chunk as usize;
        let mut words = vec![0u32; 3 * c];
        for (i, &t) in tokens.iter().enumerate() {
            words[i] = t.wrapping_sub(token_base);
            words[c + i] = start + i as u32;
            words[2 * c + i] = start + i as u32 + 1;
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        exec.copy_to_device(self.record.offset(self.record_layout.part(0)), &bytes)
            .map_err(GpuError::runtime(during(
                "writing the tokens (or earlier kernels)",
            )))?;
        let mut row = vec![0u32; self.max_blocks as usize];
        for (dst, b) in row.iter_mut().zip(blocks) {
            *dst = *b;
        }
        let table: Vec<u8> = (0..n)
            .flat_map(|_| row.iter().flat_map(|w| w.to_le_bytes()))
            .collect();
        exec.copy_to_device(self.tables, &table)
            .map_err(GpuError::runtime(during("writing the block tables")))
    }

    /// Launches segment `k` of a tensor-parallel rank's chunk of `n` tokens at `start`.
    pub fn segment(
        &self,
        exec: &mut dyn Executor,
        k: usize,
        n: u32,
        start: u32,
    ) -> Result<(), GpuError> {
        let first = k.checked_sub(1).map_or(0, |i| self.reductions[i].0);
        let end = self
            .reductions
            .get(k)
            .map_or(self.launches.len(), |&(end, _)| end);
        self.launch(exec, first..end, n, start)
    }

    /// Launches the dispatches in `range` for a chunk of `n` tokens at `start`.
    fn launch(
        &self,
        exec: &mut dyn Executor,
        range: std::ops::Range<usize>,
        n: u32,
        start: u32,
    ) -> Result<(), GpuError> {
        let during = |what: &str| format!("prompt chunk of {n} tokens at position {start}: {what}");
        for l in self.launches[range].iter().filter(|l| l.rows.includes(n)) {
            let (launch, args) = l.at(n, start);
            exec.launch(l.kernel, &launch, &args, StreamId::DEFAULT)
                .map_err(GpuError::runtime(during(&l.label)))?;
        }
        Ok(())
    }
}

/// Weights of the layers' matrices (q, k, v, o, gate, up, down), each multiplied once by
/// every prompt token: a prompt chunk of `t` tokens does `2 · this · t` floating-point
/// operations in its matrix products (the LM head runs for its last token only, and the
/// attention's products are not counted).
pub fn matrix_params(c: &ModelConfig) -> u64 {
    let (q_width, kv_width) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let layer = c.hidden * (2 * q_width + 2 * kv_width) + 3 * c.hidden * c.ffn;
    (c.layers * layer) as u64
}
