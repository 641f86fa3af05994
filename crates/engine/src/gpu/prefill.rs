//! The prompt path: a chunk of up to [`PrefillPlan::chunk`] tokens of one session runs
//! through the model as matrices — every projection a tensor-core GEMM over the chunk's
//! rows, reading the very weight buffers the decode step reads (found in the decode
//! graph's weight groups, never uploaded twice) — and writes the chunk's keys and values
//! into the session's blocks of the shared KV cache, so that decode steps continue from
//! it. Only the chunk's last row goes through the final norm and the LM head.
//!
//! With `R` the f32 residual rows and `n` the chunk's length (one dispatch each, launched
//! directly: a chunk is long enough that launch overhead does not matter):
//!
//! ```text
//! embed                   R = table[tokens]                               [n, hidden]
//! per layer:
//!   rmsnorm_residual_bf16 xn = bf16(norm(R)·w)                            (R += zeros)
//!   (bias_rows_f32)       qkv = b_qkv                                     (qwen2)
//!   gemm                  qkv (+)= xn·W_qkvᵀ        (q, k and v apart when their formats differ)
//!   rope_append           q, k rotated (qwen3: per-head norms first); k, v → cache (f16)
//!   attention_prefill_f16 attn16 = bf16(softmax(q·Kᵀ)·V), causal over the cache   [n/64, heads]
//!   gemm_residual         R += attn16·W_oᵀ
//!   rmsnorm_residual_bf16 xn = bf16(norm(R)·w)
//!   gemm_to_bf16 (×2)     gate16 = bf16(xn·W_gateᵀ), up16 = bf16(xn·W_upᵀ)   (side by side)
//!   silu_mul_bf16         act16 = silu(gate16)·up16
//!   gemm_residual         R += act16·W_downᵀ
//! qgemv_rmsnorm           logits = W_out·(norm(R[n − 1])·w)               (the last row only)
//! argmax                  the next token (greedy)
//! ```
//!
//! **Attention** runs once a chunk on the tensor cores over the f16 cache the chunk's keys
//! and values were just appended to (so a cached prefix and earlier chunks come for
//! free): 64 queries of one head a block, keys 64 at a time up to the block's last
//! position, its bf16 output what the output projection reads. Heads of sizes other than
//! 64 and 128, which that kernel does not take, run the decode attention kernel instead,
//! a row per query (its own context length, its own copy of the session's block table),
//! and round its f32 output to bf16 in a pass of its own (`cast_f32_bf16`).
//!
//! **Precision**: the matrix products take bf16 activations (norm outputs, attention
//! outputs, SwiGLU) and, for quantized weights, the dequantized weights rounded to bf16,
//! while the residual stream, the q, k and v projections and RoPE stay f32 and the cache
//! f16, as in the decode step. The gate and up projections, which only the SwiGLU reads
//! (in bf16), are summed in f32 and rounded to bf16 (to nearest even) as they are
//! stored. The tensor-core attention multiplies f16: the queries are rounded to f16 as
//! it loads them, and the softmax weights (in [0, 1]) to f16 for the product with the
//! values, each a relative 2⁻¹¹ (its scores, maxima and sums stay f32). bf16's unit roundoff (2⁻⁸) is eight times the f16 cache's, and it reaches every
//! activation the products read: SmolLM2-135M after a 20-token prompt has logits up to
//! 0.14 from the f64 reference (Q4_1 weights; 0.19 with its weights widened to bf16,
//! which the products read exactly; one random prompt each), about three times the FP64
//! check's bound, and feeding the prompt's last token through the decode step
//! instead does not help (the chunk's keys and values carry the error). The path is
//! therefore off unless asked for ([`super::GpuOptions::prefill_chunk`]).

use quench_ir::func::MAX_STATIC_SHARED_BYTES;
use quench_ir::Function;
use quench_kernels::argmax::{self, ArgmaxParams};
use quench_kernels::attention::decode::{self as attn_decode, DecodeParams};
use quench_kernels::attention::prefill::{self as attn_prefill, PrefillParams};
use quench_kernels::attention::rope_append;
use quench_kernels::bias::{self, BiasRowsParams};
use quench_kernels::embed;
use quench_kernels::gemm::{self, BFormat, Epilogue as GemmEpilogue, GemmParams};
use quench_kernels::norm_residual::{self, Norm, NormResidualParams, OutType};
use quench_kernels::qgemv::{self, Epilogue, Prologue, QGemvParams, WeightFormat};
use quench_kernels::silu_mul::{self, SiluMulParams};
use quench_kernels::to_bf16::{self, Activation, ToBf16Params};
use quench_kernels::KernelError;
use quench_models::arch::{DecoderLayerTensor as L, DecoderTensor, ModelConfig, Naming};
use quench_rt::{Arg, DevicePtr, Executor, KernelId, Launch, StreamId};

use super::catalog::{tensor_name, Catalog, Qkv};
use super::error::GpuError;
use super::graph::{
    self, attention_shape, gemv_shape, row_threads, u32_of, DecodeGraph, KernelSet, WeightData,
    WeightGroup,
};
use super::stored::{self, StoredTensors};

/// Where a pointer argument points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loc {
    /// A buffer of the prompt path's own arena.
    Act(usize),
    /// A weight group of the decode graph.
    Weights(usize),
    KCache(usize),
    VCache(usize),
    /// The decode step's logits and next-token buffers (row 0).
    Logits,
    Next,
}

/// How far into its buffer a pointer is, given the chunk's `n` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Offset {
    Fixed(u64),
    /// `n · bytes`: past `n` rows of `bytes`.
    Rows(u64),
    /// `(n − 1) · bytes`: the last row.
    LastRow(u64),
}

impl Offset {
    fn bytes(self, n: u32) -> u64 {
        match self {
            Offset::Fixed(b) => b,
            Offset::Rows(b) => n as u64 * b,
            Offset::LastRow(b) => (n as u64).saturating_sub(1) * b,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Operand {
    Ptr(Loc, Offset),
    Value(Arg),
    /// The chunk's row count.
    Rows,
    /// The chunk's first position.
    Start,
    /// `n · per_row` elements.
    Elements(u32),
}

/// How a dispatch's grid follows the chunk's rows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Grid {
    /// `launch.grid[axis]` blocks per row.
    PerRow(Launch, usize),
    Gemm(GemmParams),
    /// One thread per group of elements, `per_row` elements a row.
    Cast(ToBf16Params, u32),
    SiluMul(SiluMulParams, u32),
    /// The tensor-core attention's query tiles by heads.
    Prefill(PrefillParams),
    Once(Launch),
}

impl Grid {
    fn launch(&self, n: u32) -> Launch {
        match *self {
            Grid::PerRow(mut l, axis) => {
                l.grid[axis] *= n;
                l
            }
            Grid::Gemm(p) => p.launch(n),
            Grid::Cast(p, w) => p.launch(n * w),
            Grid::SiluMul(p, w) => p.launch(n * w),
            Grid::Prefill(p) => p.launch(n),
            Grid::Once(l) => l,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Dispatch {
    label: String,
    kernel: usize,
    grid: Grid,
    args: Vec<Operand>,
}

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
    kernels: Vec<Function>,
    dispatches: Vec<Dispatch>,
    /// Buffers of the arena: name and bytes.
    buffers: Vec<(String, u64)>,
    record: usize,
    /// `[chunk, max_blocks]` u32: the session's block table, once per row.
    tables: usize,
    /// Zeros written once: the residual addend of the norms and (attending a row per
    /// query) the attention's split counters, left at zero by every launch.
    zero_buffers: Vec<usize>,
    max_blocks: u32,
}

impl PrefillPlan {
    /// Bytes of the arena (every buffer 256-byte aligned, none shared).
    pub fn arena_bytes(&self) -> u64 {
        self.buffers
            .iter()
            .map(|(_, b)| b.div_ceil(256) * 256)
            .sum()
    }

    /// The distinct kernels its dispatches launch.
    pub fn kernels(&self) -> &[Function] {
        &self.kernels
    }

    pub fn dispatches(&self) -> usize {
        self.dispatches.len()
    }

    /// One line per dispatch of a chunk of `n` tokens ([`super::listing`]), beside
    /// `graph`, the decode step it was planned with.
    pub fn listing(&self, graph: &DecodeGraph, n: u32) -> Vec<String> {
        self.dispatches
            .iter()
            .map(|d| {
                let args: Vec<String> = d
                    .args
                    .iter()
                    .map(|a| match *a {
                        Operand::Ptr(loc, off) => {
                            let base = match loc {
                                Loc::Act(i) => self.buffers[i].0.clone(),
                                Loc::Weights(g) => graph.region_text(graph::Region::Weights(g)),
                                Loc::KCache(l) => graph.region_text(graph::Region::KCache(l)),
                                Loc::VCache(l) => graph.region_text(graph::Region::VCache(l)),
                                Loc::Logits => {
                                    graph.region_text(graph::Region::Act(graph.io.logits))
                                }
                                Loc::Next => match graph.io.next {
                                    Some(i) => graph.region_text(graph::Region::Act(i)),
                                    None => "next tokens".into(),
                                },
                            };
                            format!("{base}+{}", off.bytes(n))
                        }
                        Operand::Value(a) => super::listing::value(&a),
                        Operand::Rows => "rows".into(),
                        Operand::Start => "start".into(),
                        Operand::Elements(w) => format!("rows·{w}"),
                    })
                    .collect();
                super::listing::line(&d.label, &self.kernels[d.kernel], &d.grid.launch(n), &args)
            })
            .collect()
    }

    /// The labels of layer 0's dispatches, in order.
    pub fn layer_plan(&self) -> Vec<String> {
        self.dispatches
            .iter()
            .filter_map(|d| d.label.strip_prefix("layer 0: ").map(str::to_owned))
            .collect()
    }
}

/// The tensor-core GEMM of a weight format, if the library has one.
fn gemm_format(f: WeightFormat) -> Option<BFormat> {
    Some(match f {
        WeightFormat::BF16 => BFormat::Bf16,
        WeightFormat::Q8_0 => BFormat::Q8_0,
        WeightFormat::Q4_0 => BFormat::Q4_0,
        WeightFormat::Q4_1 => BFormat::Q4_1,
        WeightFormat::Q4K => BFormat::Q4K,
        WeightFormat::Q6K => BFormat::Q6K,
        WeightFormat::F16 => return None,
    })
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
    /// One tensor-core launch for the chunk (`attention_prefill_f16`), bf16 out.
    TensorCores {
        kernel: usize,
        params: PrefillParams,
    },
    /// For head sizes that kernel does not take: the decode attention kernel with a row
    /// per query (its own context length, its own copy of the block table), f32 out into
    /// `out`, then rounded to bf16 by a pass of its own (`cast`).
    PerRow {
        kernel: usize,
        params: DecodeParams,
        cast: (usize, ToBf16Params),
        /// The splits' maxima, sums and outputs.
        parts: [usize; 3],
        counters: usize,
        out: usize,
    },
}

struct Planner<'a> {
    src: &'a dyn StoredTensors,
    naming: Naming,
    graph: &'a DecodeGraph,
    chunk: u32,
    kernels: KernelSet,
    dispatches: Vec<Dispatch>,
    buffers: Vec<(String, u64)>,
}

impl Planner<'_> {
    fn kernel<P: std::fmt::Debug>(
        &mut self,
        part: &str,
        params: &P,
        build: impl FnOnce(&P) -> Result<Function, KernelError>,
    ) -> Result<usize, GpuError> {
        self.kernels.get(part, params, build)
    }

    /// A buffer of `width` elements of `bytes` a row, for the chunk's rows.
    fn buffer(&mut self, name: String, width: usize, bytes: u64) -> usize {
        self.buffers
            .push((name, self.chunk as u64 * width as u64 * bytes));
        self.buffers.len() - 1
    }

    fn push(&mut self, label: String, kernel: usize, grid: Grid, args: Vec<Operand>) {
        self.dispatches.push(Dispatch {
            label,
            kernel,
            grid,
            args,
        });
    }

    fn stored(
        &self,
        t: DecoderTensor,
        rows: usize,
        cols: usize,
    ) -> Result<(WeightData, u64), GpuError> {
        let n = tensor_name(t, self.naming);
        let bytes = stored::matrix(self.src, &n, rows, cols)?.bytes.len() as u64;
        Ok((WeightData::Stored(n), bytes))
    }

    fn vector(&self, t: DecoderTensor, len: usize) -> Result<(WeightData, u64), GpuError> {
        let v = stored::vector(self.src, &tensor_name(t, self.naming), len)?;
        Ok(floats(v))
    }

    /// The decode graph's weight group made of exactly `parts`, and each part's offset.
    fn group(
        &self,
        what: &str,
        parts: Vec<(WeightData, u64)>,
    ) -> Result<(usize, Vec<u64>), GpuError> {
        let offsets = parts
            .iter()
            .scan(0, |at, (_, b)| {
                let o = *at;
                *at += b;
                Some(o)
            })
            .collect();
        let want = WeightGroup { parts };
        let i = self
            .graph
            .weights
            .iter()
            .position(|g| *g == want)
            .ok_or_else(|| {
                not_here(
                    "the prompt path",
                    format!("the decode step's {what} are not where it looks"),
                )
            })?;
        Ok((i, offsets))
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
        let f = gemm_format(format).ok_or_else(|| {
            not_here(
                format!("{label} ({format:?} weights)"),
                "no tensor-core GEMM reads this format",
            )
        })?;
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
        // read the weights fewer times; a 64-row tile wastes less on short chunks).
        let bm = if self.chunk >= 256 { 128 } else { 64 };
        let p = [(128, 32), (64, 32)]
            .into_iter()
            .flat_map(|(bn, wn)| (2..=3).rev().map(move |stages| (bn, wn, stages)))
            .map(|(bn, wn, stages)| GemmParams {
                format: f,
                epilogue,
                n,
                k,
                bm,
                bn,
                wn,
                stages,
            })
            .find(|p| n.is_multiple_of(p.bn) && p.shared_bytes() <= MAX_STATIC_SHARED_BYTES)
            .ok_or_else(|| {
                not_here(
                    format!("{label} with n = {n}"),
                    "the GEMM needs n a multiple of 64",
                )
            })?;
        let kernel = self.kernel(&label, &p, gemm::build)?;
        self.push(label, kernel, Grid::Gemm(p), vec![a, b, c, Operand::Rows]);
        Ok(())
    }
}

fn floats(v: Vec<f32>) -> (WeightData, u64) {
    let bytes = 4 * v.len() as u64;
    (WeightData::Floats(v), bytes)
}

fn ptr(loc: Loc, bytes: u64) -> Operand {
    Operand::Ptr(loc, Offset::Fixed(bytes))
}

fn w(group: (usize, Vec<u64>), part: usize) -> Operand {
    ptr(Loc::Weights(group.0), group.1[part])
}

impl PrefillPlan {
    /// Plans the prompt path of `config` for chunks of `chunk` tokens beside `graph`, the
    /// decode step (whose weights, KV cache and logits it uses), built for `context`
    /// positions. Refuses, naming why, a model whose formats or shapes a kernel does not
    /// take.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: &ModelConfig,
        catalog: &Catalog,
        src: &dyn StoredTensors,
        naming: Naming,
        graph: &DecodeGraph,
        context: usize,
        chunk: usize,
    ) -> Result<PrefillPlan, GpuError> {
        let c = config;
        let (hidden, hd, ffn) = (c.hidden, c.head_dim, c.ffn);
        let (q_width, kv_width) = (c.heads * hd, c.kv_heads * hd);
        let qkv_width = q_width + 2 * kv_width;
        let eps = c.norm_eps as f32;
        let context32 = u32_of("context", context.max(1))?;
        let head_dim = u32_of("head_dim", hd)?;
        let tensor_cores = attn_prefill::HEAD_DIMS.contains(&head_dim);
        // Attending a row per query, the grid holds a row per query and kv head on its
        // second axis.
        let chunk = match tensor_cores {
            true => chunk,
            false => chunk.min(65535 / c.kv_heads.max(1)),
        }
        .max(1);
        let mut a = Planner {
            src,
            naming,
            graph,
            chunk: u32_of("prefill chunk", chunk)?,
            kernels: KernelSet::default(),
            dispatches: vec![],
            buffers: vec![],
        };
        let max_blocks = graph.kv.max_blocks;

        let record = Record { chunk: a.chunk };
        let rec = a.buffer("chunk record".into(), 4, 4);
        let tables = a.buffer("block tables".into(), max_blocks as usize, 4);
        let zeros = a.buffer("zero rows".into(), hidden, 4);
        let r = a.buffer("residual".into(), hidden, 4);
        let xn = a.buffer("normed rows (bf16)".into(), hidden, 2);
        let at = |b: usize| ptr(Loc::Act(b), 0);
        let [token, pos, ctx_len, seq] = [0, 1, 2, 3].map(|i| ptr(Loc::Act(rec), record.part(i)));
        let table = at(tables);

        // Constants the decode step uploaded.
        let (cos, sin) = graph::rope_tables(c, src, naming, context32)?;
        let rope_group = a.group("RoPE tables", vec![floats(cos), floats(sin)])?;
        let embed_group = a.group(
            "embedding table",
            vec![a.stored(DecoderTensor::TokenEmbedding, c.vocab, hidden)?],
        )?;

        let ep = graph::embed_params(catalog, hidden)?;
        let k = a.kernel("token embedding", &ep, embed::build)?;
        a.push(
            "token embedding".into(),
            k,
            Grid::PerRow(ep.launch(1), 0),
            vec![
                token,
                w(embed_group.clone(), 0),
                at(r),
                Operand::Value(Arg::U32(u32_of("vocab", c.vocab)?)),
            ],
        );

        let np = NormResidualParams {
            norm: Norm::Rms,
            out: OutType::BF16,
            cols: u32_of("hidden", hidden)?,
            threads: row_threads(u32_of("hidden", hidden)? / 4),
        };
        let norm_k = a.kernel("RMSNorm rows", &np, norm_residual::build)?;

        // Buffers every layer reuses.
        let (q_at, k_at, v_at, token_stride) = match catalog.layers.first().map(|l| l.qkv) {
            Some(Qkv::Separate(_)) => {
                let q = a.buffer("q".into(), q_width, 4);
                let k = a.buffer("k".into(), kv_width, 4);
                let v = a.buffer("v".into(), kv_width, 4);
                (at(q), at(k), at(v), 0)
            }
            _ => {
                let qkv = Loc::Act(a.buffer("q|k|v".into(), qkv_width, 4));
                (
                    ptr(qkv, 0),
                    ptr(qkv, 4 * q_width as u64),
                    ptr(qkv, 4 * (q_width + kv_width) as u64),
                    u32_of("q|k|v width", qkv_width)?,
                )
            }
        };
        let attn16 = a.buffer("attention output (bf16)".into(), q_width, 2);
        let (n_heads, n_kv_heads) = (u32_of("heads", c.heads)?, u32_of("kv_heads", c.kv_heads)?);
        let attention = if tensor_cores {
            let params = PrefillParams {
                kv: graph.kv.elem,
                head_dim,
                n_heads,
                n_kv_heads,
                max_blocks,
                q_stride: token_stride,
            };
            let kernel = a.kernel("attention", &params, attn_prefill::build)?;
            Attention::TensorCores { kernel, params }
        } else {
            let (threads, split, most_blocks) = attention_shape(
                head_dim,
                n_heads / n_kv_heads.max(1),
                context32,
                graph.kv.elem,
            )?;
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
                q_stride: token_stride,
            };
            let splits = params.n_splits() as usize;
            let cast = ToBf16Params {
                activation: Activation::Identity,
                threads: 256,
            };
            Attention::PerRow {
                kernel: a.kernel("attention", &params, attn_decode::build)?,
                params,
                cast: (a.kernel("bf16 rounding", &cast, to_bf16::build)?, cast),
                parts: [
                    a.buffer("split maxima".into(), c.heads * splits, 4),
                    a.buffer("split sums".into(), c.heads * splits, 4),
                    a.buffer("split outputs".into(), c.heads * splits * hd, 4),
                ],
                counters: a.buffer("attention split counters".into(), c.kv_heads, 4),
                out: a.buffer("attention output".into(), q_width, 4),
            }
        };
        let gate_up16 = Loc::Act(a.buffer("gate | up (bf16)".into(), 2 * ffn, 2));
        let act16 = a.buffer("SwiGLU (bf16)".into(), ffn, 2);
        let scale = Operand::Value(Arg::F32((1.0 / (hd as f64).sqrt()) as f32));
        let silu = SiluMulParams { threads: 256 };
        let silu_k = a.kernel("SwiGLU", &silu, silu_mul::build)?;
        let bias_p = BiasRowsParams { threads: 128 };

        let norm = |a: &mut Planner, label: String, weight: Operand| {
            a.push(
                label,
                norm_k,
                Grid::PerRow(np.launch(1), 0),
                vec![
                    at(zeros),
                    at(r),
                    weight,
                    at(xn),
                    Operand::Value(Arg::F32(eps)),
                ],
            );
        };

        for (l, lk) in catalog.layers.iter().enumerate() {
            let t = |t| DecoderTensor::Layer(l, t);
            let label = |what: &str| format!("layer {l}: {what}");
            let norms = a.group(
                "norm weights",
                vec![
                    a.vector(t(L::AttnNorm), hidden)?,
                    a.vector(t(L::FfnNorm), hidden)?,
                ],
            )?;
            norm(&mut a, label("attention norm"), w(norms.clone(), 0));

            let wqkv = a.group(
                "q, k and v weights",
                vec![
                    a.stored(t(L::Q), q_width, hidden)?,
                    a.stored(t(L::K), kv_width, hidden)?,
                    a.stored(t(L::V), kv_width, hidden)?,
                ],
            )?;
            let bias = if c.qkv_bias {
                let parts = vec![
                    a.vector(t(L::QBias), q_width)?,
                    a.vector(t(L::KBias), kv_width)?,
                    a.vector(t(L::VBias), kv_width)?,
                ];
                Some(a.group("q, k and v biases", parts)?)
            } else {
                None
            };
            let bias_k = match bias {
                Some(_) => Some(a.kernel("bias rows", &bias_p, bias::build)?),
                None => None,
            };
            let project = |a: &mut Planner,
                           what: &str,
                           format,
                           rows: usize,
                           part: usize,
                           out: Operand,
                           bias_part: Option<usize>| {
                if let (Some(b), Some(bk), Some(bp)) = (&bias, bias_k, bias_part) {
                    a.push(
                        label(&format!("{what} bias")),
                        bk,
                        Grid::PerRow(bias_p.launch(1), 0),
                        vec![
                            w(b.clone(), bp),
                            out,
                            Operand::Value(Arg::U32(u32_of("width", rows)?)),
                        ],
                    );
                }
                a.gemm(
                    label(&format!("{what} projection")),
                    format,
                    rows,
                    hidden,
                    at(xn),
                    w(wqkv.clone(), part),
                    out,
                    if bias_part.is_some() && bias.is_some() {
                        GemmEpilogue::Accumulate
                    } else {
                        GemmEpilogue::Store
                    },
                )
            };
            match lk.qkv {
                Qkv::Fused(f) if token_stride != 0 => {
                    // The biases' parts lie back to back: one row of q|k|v biases.
                    project(&mut a, "q|k|v", f, qkv_width, 0, q_at, Some(0))?;
                }
                Qkv::Separate(formats) if token_stride == 0 => {
                    let widths = [q_width, kv_width, kv_width];
                    let outs = [q_at, k_at, v_at];
                    for (i, what) in ["q", "k", "v"].iter().enumerate() {
                        project(&mut a, what, formats[i], widths[i], i, outs[i], Some(i))?;
                    }
                }
                _ => {
                    return Err(not_here(
                        "the prompt path of this model",
                        "its layers differ in whether q, k and v share a format",
                    ))
                }
            }

            let rp =
                graph::rope_append_params(c, catalog, max_blocks, token_stride, graph.kv.elem)?;
            let (kc, vc) = (ptr(Loc::KCache(l), 0), ptr(Loc::VCache(l), 0));
            let mut args = vec![
                q_at,
                k_at,
                v_at,
                seq,
                pos,
                table,
                w(rope_group.clone(), 0),
                w(rope_group.clone(), 1),
                Operand::Value(Arg::U32(context32)),
                kc,
                vc,
            ];
            if c.qk_norm {
                let qk = a.group(
                    "q/k norm weights",
                    vec![a.vector(t(L::QNorm), hd)?, a.vector(t(L::KNorm), hd)?],
                )?;
                args.extend([w(qk.clone(), 0), w(qk, 1), Operand::Value(Arg::F32(eps))]);
            }
            let what = if c.qk_norm {
                "q/k norm + rope + kv append"
            } else {
                "rope + kv append"
            };
            let k = a.kernel(&label(what), &rp, rope_append::build)?;
            a.push(label(what), k, Grid::PerRow(rp.launch(1), 0), args);

            match &attention {
                Attention::TensorCores { kernel, params } => a.push(
                    label("attention"),
                    *kernel,
                    Grid::Prefill(*params),
                    vec![
                        q_at,
                        kc,
                        vc,
                        table,
                        Operand::Start,
                        Operand::Rows,
                        scale,
                        at(attn16),
                    ],
                ),
                Attention::PerRow {
                    kernel,
                    params,
                    cast: (cast_k, cast),
                    parts,
                    counters,
                    out,
                } => {
                    a.push(
                        label("attention"),
                        *kernel,
                        Grid::PerRow(params.launch(1), 1),
                        vec![
                            q_at,
                            kc,
                            vc,
                            table,
                            ctx_len,
                            at(parts[0]),
                            at(parts[1]),
                            at(parts[2]),
                            at(*counters),
                            at(*out),
                            scale,
                        ],
                    );
                    let qw = u32_of("q width", q_width)?;
                    a.push(
                        label("attention to bf16"),
                        *cast_k,
                        Grid::Cast(*cast, qw),
                        vec![at(*out), at(attn16), Operand::Elements(qw)],
                    );
                }
            }
            let wo = a.group(
                "output projection",
                vec![a.stored(t(L::AttnOutput), hidden, q_width)?],
            )?;
            a.gemm(
                label("output projection"),
                lk.attn_output,
                hidden,
                q_width,
                at(attn16),
                w(wo, 0),
                at(r),
                GemmEpilogue::Accumulate,
            )?;

            norm(&mut a, label("ffn norm"), w(norms, 1));
            let wgu = a.group(
                "gate and up weights",
                vec![
                    a.stored(t(L::Gate), ffn, hidden)?,
                    a.stored(t(L::Up), ffn, hidden)?,
                ],
            )?;
            // Gate rows, then up rows, each the chunk's rows long.
            let up = Operand::Ptr(gate_up16, Offset::Rows(2 * ffn as u64));
            a.gemm(
                label("gate projection"),
                lk.gate_up,
                ffn,
                hidden,
                at(xn),
                w(wgu.clone(), 0),
                ptr(gate_up16, 0),
                GemmEpilogue::StoreBf16,
            )?;
            a.gemm(
                label("up projection"),
                lk.gate_up,
                ffn,
                hidden,
                at(xn),
                w(wgu, 1),
                up,
                GemmEpilogue::StoreBf16,
            )?;
            let fw = u32_of("ffn", ffn)?;
            a.push(
                label("SwiGLU"),
                silu_k,
                Grid::SiluMul(silu, fw),
                vec![ptr(gate_up16, 0), up, at(act16), Operand::Elements(fw)],
            );
            let down = a.group("down projection", vec![a.stored(t(L::Down), hidden, ffn)?])?;
            a.gemm(
                label("down projection"),
                lk.down,
                hidden,
                ffn,
                at(act16),
                w(down, 0),
                at(r),
                GemmEpilogue::Accumulate,
            )?;
        }

        let out_norm = a.group(
            "output norm",
            vec![a.vector(DecoderTensor::OutputNorm, hidden)?],
        )?;
        let head = if c.tied_embeddings {
            embed_group
        } else {
            a.group(
                "LM head",
                vec![a.stored(DecoderTensor::Output, c.vocab, hidden)?],
            )?
        };
        let (head_warps, head_blocks) =
            gemv_shape(catalog.output, hidden, true, graph.multiprocessors);
        let hp = QGemvParams {
            format: catalog.output,
            prologue: Prologue::RmsNorm,
            epilogue: Epilogue::Plain,
            rows: u32_of("vocab", c.vocab)?,
            cols: u32_of("hidden", hidden)?,
            warps: head_warps,
            unroll: if catalog.output.is_float() { 4 } else { 2 },
            act: OutType::F32,
            batch: 1,
            max_blocks: head_blocks,
        };
        let k = a.kernel("output norm + LM head", &hp, qgemv::build)?;
        a.push(
            "output norm + LM head (last row)".into(),
            k,
            Grid::Once(hp.launch()),
            vec![
                w(head, 0),
                Operand::Ptr(Loc::Act(r), Offset::LastRow(4 * hidden as u64)),
                w(out_norm, 0),
                ptr(Loc::Logits, 0),
                Operand::Value(Arg::F32(eps)),
                Operand::Value(Arg::U32(1)),
            ],
        );
        if graph.io.next.is_some() {
            let cols = u32_of("vocab", c.vocab)?;
            let p = ArgmaxParams {
                cols,
                threads: row_threads(cols / 4).max(128),
            };
            let k = a.kernel("argmax", &p, argmax::build)?;
            a.push(
                "argmax".into(),
                k,
                Grid::Once(p.launch(1)),
                vec![ptr(Loc::Logits, 0), ptr(Loc::Next, 0)],
            );
        }
        Ok(PrefillPlan {
            chunk: a.chunk,
            kernels: a.kernels.into_kernels(),
            dispatches: a.dispatches,
            buffers: a.buffers,
            record: rec,
            tables,
            zero_buffers: match attention {
                Attention::PerRow { counters, .. } => vec![counters, zeros, rec],
                Attention::TensorCores { .. } => vec![zeros, rec],
            },
            max_blocks,
        })
    }
}

/// Where the decode step's buffers the prompt path uses live.
pub(crate) struct Bases {
    pub weights: DevicePtr,
    /// Offset of each weight group.
    pub group_at: Vec<u64>,
    pub kv: DevicePtr,
    pub kv_layer_bytes: u64,
    pub logits: DevicePtr,
    pub next: Option<DevicePtr>,
}

#[derive(Clone, Copy, Debug)]
enum Slot {
    Ptr(DevicePtr, Offset),
    Arg(Arg),
    Rows,
    Start,
    Elements(u32),
}

struct Resolved {
    label: String,
    kernel: KernelId,
    grid: Grid,
    args: Vec<Slot>,
}

/// The prompt path on a device: its arena and resolved launches.
pub(crate) struct OnDevice {
    pub chunk: u32,
    launches: Vec<Resolved>,
    record: DevicePtr,
    record_layout: Record,
    tables: DevicePtr,
    max_blocks: u32,
}

/// Allocates the arena (pushed onto `allocations`), zeroes what must start at zero,
/// compiles the kernels and resolves every launch.
pub(crate) fn place(
    exec: &mut dyn Executor,
    plan: &PrefillPlan,
    bases: &Bases,
    allocations: &mut Vec<DevicePtr>,
) -> Result<OnDevice, GpuError> {
    let bytes = plan.arena_bytes();
    let arena = exec.alloc(bytes.max(1)).map_err(GpuError::runtime(
        "allocating the prompt path's activations",
    ))?;
    allocations.push(arena);
    let mut offsets = Vec::with_capacity(plan.buffers.len());
    let mut total = 0;
    for (_, b) in &plan.buffers {
        offsets.push(total);
        total += b.div_ceil(256) * 256;
    }
    for &z in &plan.zero_buffers {
        exec.copy_to_device(
            arena.offset(offsets[z]),
            &vec![0u8; plan.buffers[z].1 as usize],
        )
        .map_err(GpuError::runtime("zeroing the prompt path's buffers"))?;
    }
    let mut kernels = Vec::with_capacity(plan.kernels.len());
    for f in &plan.kernels {
        kernels.push(
            exec.load(f)
                .map_err(GpuError::runtime(format!("compiling kernel `{}`", f.name)))?,
        );
    }
    let base = |loc: Loc| -> Result<DevicePtr, GpuError> {
        Ok(match loc {
            Loc::Act(i) => arena.offset(offsets[i]),
            Loc::Weights(g) => bases.weights.offset(bases.group_at[g]),
            Loc::KCache(l) => bases.kv.offset(2 * l as u64 * bases.kv_layer_bytes),
            Loc::VCache(l) => bases.kv.offset((2 * l as u64 + 1) * bases.kv_layer_bytes),
            Loc::Logits => bases.logits,
            Loc::Next => bases.next.ok_or_else(|| {
                not_here(
                    "argmax on the device",
                    "the vocabulary is not a multiple of 4",
                )
            })?,
        })
    };
    let mut launches = Vec::with_capacity(plan.dispatches.len());
    for d in &plan.dispatches {
        let mut args = Vec::with_capacity(d.args.len());
        for op in &d.args {
            args.push(match *op {
                Operand::Ptr(loc, off) => Slot::Ptr(base(loc)?, off),
                Operand::Value(a) => Slot::Arg(a),
                Operand::Rows => Slot::Rows,
                Operand::Start => Slot::Start,
                Operand::Elements(w) => Slot::Elements(w),
            });
        }
        launches.push(Resolved {
            label: d.label.clone(),
            kernel: kernels[d.kernel],
            grid: d.grid,
            args,
        });
    }
    Ok(OnDevice {
        chunk: plan.chunk,
        launches,
        record: arena.offset(offsets[plan.record]),
        record_layout: Record { chunk: plan.chunk },
        tables: arena.offset(offsets[plan.tables]),
        max_blocks: plan.max_blocks,
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
        let n = tokens.len() as u32;
        let during = |what: &str| format!("prompt chunk of {n} tokens at position {start}: {what}");
        let c = self.chunk as usize;
        let mut words = vec![0u32; 3 * c];
        for (i, &t) in tokens.iter().enumerate() {
            words[i] = t;
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
            .map_err(GpuError::runtime(during("writing the block tables")))?;
        for l in &self.launches {
            let args: Vec<Arg> = l
                .args
                .iter()
                .map(|s| match *s {
                    Slot::Ptr(p, off) => Arg::Ptr(p.offset(off.bytes(n))),
                    Slot::Arg(a) => a,
                    Slot::Rows => Arg::U32(n),
                    Slot::Start => Arg::U32(start),
                    Slot::Elements(w) => Arg::U32(n * w),
                })
                .collect();
            exec.launch(l.kernel, &l.grid.launch(n), &args, StreamId::DEFAULT)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_the_rows() {
        assert_eq!(Offset::Fixed(12).bytes(7), 12);
        assert_eq!(Offset::Rows(8).bytes(3), 24);
        assert_eq!(Offset::LastRow(8).bytes(3), 16);
        assert_eq!(Offset::LastRow(8).bytes(1), 0);
    }

    #[test]
    fn grids_grow_with_the_rows() {
        let l = Launch {
            grid: [4, 2, 1],
            block: [128, 1, 1],
            dynamic_shared_bytes: 0,
        };
        assert_eq!(Grid::PerRow(l, 1).launch(5).grid, [4, 10, 1]);
        assert_eq!(Grid::Once(l).launch(5).grid, [4, 2, 1]);
    }
}
