//! Graph assembly: the dispatch list of one decode step (one token for each of up to
//! [`StepShape::max_batch`] sequences, the step's **rows**), with every argument named
//! symbolically — an activation, a weight, a layer's KV cache, the row count — so that the
//! arena can be planned before anything is allocated, and the list resolved to device
//! addresses once it is. One list serves every row count: each dispatch says which steps
//! it is part of ([`Rows`]: any, one-row steps or steps of several rows), its grid grows
//! with the rows ([`Dispatch::launch_for`]), and every activation holds a row per
//! sequence (`[rows, width]`).
//!
//! A one-row step, with `R` the f32 residual stream. Six dispatches a layer: the norms run
//! inside the projections that read them (every block of a `_rmsnorm_` GEMV reduces `R`
//! itself), RoPE and qwen3's per-head q/k norms inside the KV append, and the attention's
//! splits are merged by the last of them to finish. Activations pass between kernels in
//! f32 and the KV cache holds f16 (or f32, [`StepShape::kv`]): rounding them to bf16
//! instead moves the logits well past the f64 reference's bound (`quench check`), while at
//! batch 1 the activations' bytes are negligible next to the weights'.
//!
//! ```text
//! embed                        R = table[token]                           (a block per row)
//! per layer:
//!   qgemv_rmsnorm (q|k|v rows) qkv = W_qkv·(norm(R)·w) (+ bias: qwen2)   (f32; 3 GEMVs if formats differ)
//!   rope_append                q, k = per-head norm (qwen3 only), rotated at `pos`;
//!                              k, v → cache block table[pos / 16], row pos mod 16   (f16)
//!   attention_decode_merge     splits of the context → partials; the last split merges
//!                              them: attn (f32)
//!   qgemv_residual             R += W_o·attn
//!   qgemv_rmsnorm_swiglu       ffn = silu(W_gate·xf)·(W_up·xf), xf = norm(R)·w   (f32)
//!   qgemv_residual             R += W_down·ffn
//! qgemv_rmsnorm                logits = W_out·(norm(R)·w)                 (f32)
//! argmax                       next = the largest logit's index (greedy decoding)
//! ```
//!
//! A step of several rows normalizes each row once with a dispatch of its own
//! (`rmsnorm_rows`: the bits the prologue stages) and multiplies the normalized rows with
//! GEMVs without a prologue, 8 vectors a pass: a prologue stages a pass's rows in shared
//! memory, which holds two rows of 4096 columns, so that at 4096 columns the q|k|v,
//! gate/up and LM head weights would be read once per two rows. Eight dispatches a layer,
//! and one more before the LM head:
//!
//! ```text
//! per layer:
//!   rmsnorm_rows               xa = norm(R)·w_attn                        (f32, a block per row)
//!   qgemv (q|k|v rows)         qkv = W_qkv·xa (+ bias)
//!   rope_append, attention_decode_merge, qgemv_residual (o)   as above
//!   rmsnorm_rows               xf = norm(R)·w_ffn
//!   qgemv_swiglu               ffn = silu(W_gate·xf)·(W_up·xf)
//!   qgemv_residual             R += W_down·ffn
//! rmsnorm_rows, qgemv          logits = W_out·(norm(R)·w_out)
//! argmax
//! ```
//!
//! With [`Products::TensorCore`] (a server's steps of many rows) every step, one row or
//! many, takes the second form, with the products of bf16 matrices on the tensor cores
//! ([`gemv_tc`]: the weights read once for up to 64 rows, a row's bits the same at every
//! row count); matrices in other formats keep the matrix–vector kernels. Each such
//! product is built for passes of 8, 16, 32 and 64 rows (as many of these as
//! [`StepShape::max_batch`] needs), a dispatch each for the steps of the row counts it
//! serves ([`Rows::Span`]): the narrower passes hold fewer accumulators, so small steps
//! run more blocks at once, and a row's arithmetic is the same in all of them.
//!
//! **Rows.** Row `i` of a step is one sequence: its token, position, context length and
//! block-table row. The matrix–vector kernels multiply each weight row with every row's
//! vector (several vectors a pass: the weights are read from memory once per step), the
//! embedding, RoPE/append, attention (per row, kv head and split) and argmax kernels take
//! a block (or a kv head's splits) per row. **Batch invariance**: a row's arithmetic never
//! depends on the row count or on the other rows — every dot product and reduction runs
//! in the order it runs at one row, and a row normalized apart has the bits the prologue
//! stages — so a sequence's logits have the same bits whether it is stepped alone or with
//! others. A one-row step uses the kernels built for one vector a pass (their loads
//! issued as at batch 1 before), with the norms inside; steps of more rows use the wide
//! ones behind the norms' own dispatches.
//!
//! The host writes only the step record (per row: token id, position, context length; one
//! copy) and, every 16 positions or when another session takes the row, the row's block
//! table; every launch argument is fixed for a row count, so the dispatches of a row
//! count are captured as a graph once per row count used and replayed. The attention's
//! split counters start at zero (written once, with the arena) and every launch leaves
//! them at zero. Prompts run through the same step token by token (rows at different
//! prompt positions share steps), unless the prompt path ([`super::prefill`]:
//! tensor-core GEMMs over whole prompt chunks) is switched on.

use std::collections::HashMap;

use quench_ir::Function;
use quench_kernels::argmax::{self, ArgmaxParams};
use quench_kernels::attention::decode::{self as attn_decode, DecodeParams};
use quench_kernels::attention::rope_append::{self, RopeAppendParams};
use quench_kernels::attention::{KvElem, BLOCK_TOKENS};
use quench_kernels::embed::{self, EmbedParams};
use quench_kernels::gemv_tc::{self, GemvTcParams};
use quench_kernels::norm_residual::OutType;
use quench_kernels::qgemv::prologue::NORM_THREADS;
use quench_kernels::qgemv::{self, Addend, Epilogue, Prologue, QGemvParams, WeightFormat};
use quench_kernels::rmsnorm_rows::{self, RmsNormRowsParams};
use quench_kernels::rope;
use quench_kernels::KernelError;
use quench_models::arch::{
    rope_frequencies, DecoderLayerTensor as L, DecoderTensor, ModelConfig, Naming,
};
use quench_rt::{Arg, Launch};

use super::catalog::{tensor_name, Catalog, Qkv};
use super::error::GpuError;
use super::stored::{self, StoredTensors};
use crate::options::KvCache;

/// The type of the activations passed between kernels (the attention and SwiGLU outputs:
/// the matrix–vector kernels' inputs besides the residual stream), and its size.
const ACT: OutType = OutType::F32;
const ACT_BYTES: u64 = 4;

/// Where a dispatch argument points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Region {
    /// An activation (index into [`DecodeGraph::activations`]).
    Act(usize),
    /// A group of weights uploaded back to back (index into [`DecodeGraph::weights`]).
    Weights(usize),
    KCache(usize),
    VCache(usize),
}

/// One argument of a dispatch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Operand {
    /// `bytes` into a region.
    At(Region, u64),
    Value(Arg),
    /// The step's row count (u32).
    Rows,
}

/// The steps a dispatch is part of. The matrix–vector products that read a normalized
/// input differ: a one-row step normalizes inside each product, a step of several rows
/// with a dispatch of its own and then multiplies several vectors a pass. The tensor-core
/// products come in variants by row count ([`Rows::Span`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    /// Steps of any row count.
    Any,
    /// One-row steps.
    One,
    /// Steps of two rows or more.
    Many,
    /// Steps of `least ..= most` rows.
    Span { least: u32, most: u32 },
}

impl Rows {
    /// Whether a step of `rows` rows includes the dispatch.
    pub fn includes(self, rows: u32) -> bool {
        match self {
            Rows::Any => true,
            Rows::One => rows == 1,
            Rows::Many => rows > 1,
            Rows::Span { least, most } => (least..=most).contains(&rows),
        }
    }
}

/// One kernel launch of the step.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    /// What it computes, for messages: `layer 3: attention`.
    pub label: String,
    /// Index into [`DecodeGraph::kernels`].
    pub kernel: usize,
    /// The launch in a one-row step (or, for [`Rows::Many`], per row).
    pub launch: Launch,
    /// The steps it is part of.
    pub rows: Rows,
    /// The grid axis that grows with the rows (one block, or one kv head's blocks, per
    /// row); `None` where the grid is the same for any row count.
    pub per_row: Option<usize>,
    pub(crate) args: Vec<Operand>,
}

impl Dispatch {
    /// The launch in a step of `rows` rows (one that [`Dispatch::rows`] includes).
    pub fn launch_for(&self, rows: u32) -> Launch {
        let mut launch = self.launch;
        if let Some(axis) = self.per_row {
            launch.grid[axis] *= rows;
        }
        launch
    }
}

/// An activation buffer of the step.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Activation {
    pub name: String,
    pub bytes: u64,
    /// Read or written by the host between steps: live for the whole step.
    pub host: bool,
}

/// What a weight is uploaded from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum WeightData {
    /// A tensor's stored bytes, as they are.
    Stored(String),
    /// Values computed or widened on the host (norm weights, biases, RoPE tables).
    Floats(Vec<f32>),
}

/// Weights uploaded back to back (q, k and v rows of one layer form one matrix).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WeightGroup {
    /// Each part with its byte length.
    pub parts: Vec<(WeightData, u64)>,
}

impl WeightGroup {
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|(_, b)| b).sum()
    }

    /// Byte offset of part `i`.
    fn offset(&self, i: usize) -> u64 {
        self.parts[..i].iter().map(|(_, b)| b).sum()
    }
}

/// The paged KV cache the step reads and appends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Physical blocks of 16 positions, shared by all sessions.
    pub n_blocks: u32,
    /// Block-table row length (a session's longest context is `max_blocks · 16`).
    pub max_blocks: u32,
    /// Bytes of one layer's keys (or values): `n_blocks · kv_heads · 16 · head_dim`
    /// elements.
    pub layer_bytes: u64,
    /// The element type of the keys and values.
    pub elem: KvElem,
}

/// Host-visible activations; `B` is [`StepShape::max_batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostIo {
    /// The step record, `[4, B]` u32: per row the token, the position, the context length
    /// (position + 1), then the row's own index (written once: row `i` reads block-table
    /// row `i`). See [`StepRecord`].
    pub step: usize,
    /// `[B, max_blocks]` u32: each row's block table.
    pub table: usize,
    /// `[B, vocab]` f32.
    pub logits: usize,
    /// Zeros, written once: the attention kernels' split counters (one per row and kv
    /// head), which every launch leaves at zero again.
    pub zeros: usize,
    /// `[B]` u32: the index of each row's largest logit (greedy decoding's next token),
    /// when the vocabulary suits the argmax kernel (a multiple of 4).
    pub next: Option<usize>,
}

/// Where the parts of the step record lie: `[tokens | positions | context lengths |
/// row indices]`, each `max_batch` u32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepRecord {
    pub max_batch: usize,
}

impl StepRecord {
    pub fn bytes(self) -> u64 {
        16 * self.max_batch as u64
    }

    /// Byte offset of part `i` (0 tokens, 1 positions, 2 context lengths, 3 row indices).
    pub fn part(self, i: u64) -> u64 {
        4 * i * self.max_batch as u64
    }

    /// The bytes the host writes before a step (tokens, positions and context lengths;
    /// the row indices after them are written once): `rows` of `(token, position)`.
    pub fn write(self, rows: &[(u32, u32)]) -> Vec<u8> {
        let mut words = vec![0u32; 3 * self.max_batch];
        for (i, &(token, pos)) in rows.iter().enumerate() {
            words[i] = token;
            words[self.max_batch + i] = pos;
            words[2 * self.max_batch + i] = pos + 1;
        }
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The row indices, `0..max_batch`, as written once at [`Self::part`] 3.
    pub fn row_indices(self) -> Vec<u8> {
        (0..self.max_batch as u32)
            .flat_map(|i| i.to_le_bytes())
            .collect()
    }
}

/// Sizes the step is built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    /// Most positions one session holds.
    pub context: usize,
    /// Sessions whose full contexts the shared cache holds at once.
    pub sessions: usize,
    /// Most rows (sequences) one step decodes: every activation holds this many rows.
    pub max_batch: usize,
    /// The element type of the KV cache.
    pub kv: KvCache,
}

/// The assembled decode step.
#[derive(Clone, Debug)]
pub struct DecodeGraph {
    /// Distinct kernels, each built once.
    pub kernels: Vec<Function>,
    /// The dispatches of every row count, in order ([`DecodeGraph::step`] picks a step's).
    pub dispatches: Vec<Dispatch>,
    /// Dispatches of each layer in a one-row step.
    pub layer_dispatches: Vec<usize>,
    pub kv: KvLayout,
    /// Weight bytes one step reads: every matrix and norm weight, not the RoPE tables nor
    /// (unless it is also the LM head) the embedding table, of which it reads one row.
    pub weight_bytes_per_token: u64,
    pub(crate) activations: Vec<Activation>,
    pub(crate) weights: Vec<WeightGroup>,
    pub(crate) io: HostIo,
    pub(crate) record: StepRecord,
    /// The device's multiprocessors (the matrix–vector products' grids: [`gemv_shape`]).
    pub(crate) multiprocessors: u32,
}

/// Kernels built once per distinct parameters, indexed in the order first asked for.
#[derive(Default)]
pub(crate) struct KernelSet {
    kernels: Vec<Function>,
    built: HashMap<String, usize>,
}

impl KernelSet {
    /// The kernel built from `params` (built now if these parameters are new).
    pub(crate) fn get<P: std::fmt::Debug>(
        &mut self,
        part: &str,
        params: &P,
        build: impl FnOnce(&P) -> Result<Function, KernelError>,
    ) -> Result<usize, GpuError> {
        let key = format!("{params:?}");
        if let Some(&i) = self.built.get(&key) {
            return Ok(i);
        }
        let f = build(params).map_err(GpuError::kernel(part))?;
        self.kernels.push(f);
        self.built.insert(key, self.kernels.len() - 1);
        Ok(self.kernels.len() - 1)
    }

    pub(crate) fn into_kernels(self) -> Vec<Function> {
        self.kernels
    }
}

/// The RoPE cos and sin tables over `context` positions (with the checkpoint's
/// `rope_freqs` factors where it stores them).
pub(crate) fn rope_tables(
    c: &ModelConfig,
    src: &dyn StoredTensors,
    naming: Naming,
    context: u32,
) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
    let factors = match DecoderTensor::RopeFreqs.name(naming) {
        Some(n) if src.contains(&n) => Some(
            stored::vector(src, &n, c.head_dim / 2)?
                .into_iter()
                .map(f64::from)
                .collect::<Vec<_>>(),
        ),
        _ => None,
    };
    Ok(rope::table(
        &rope_frequencies(c, factors.as_deref()),
        context,
    ))
}

/// The token-embedding gather for the catalog's table format.
pub(crate) fn embed_params(catalog: &Catalog, hidden: usize) -> Result<EmbedParams, GpuError> {
    let dim = u32_of("hidden", hidden)?;
    let per_group = if catalog.embed.ggml().block_size() > 1 {
        32
    } else {
        8
    };
    Ok(EmbedParams {
        format: catalog.embed,
        dim,
        threads: row_threads(dim / per_group),
    })
}

/// RoPE + KV append over q|k|v rows `token_stride` elements apart (0: packed).
pub(crate) fn rope_append_params(
    c: &ModelConfig,
    catalog: &Catalog,
    max_blocks: u32,
    token_stride: u32,
    kv: KvElem,
) -> Result<RopeAppendParams, GpuError> {
    Ok(RopeAppendParams {
        style: catalog.rope,
        qk_norm: c.qk_norm,
        head_dim: u32_of("head_dim", c.head_dim)?,
        n_heads: u32_of("heads", c.heads)?,
        n_kv_heads: u32_of("kv_heads", c.kv_heads)?,
        max_blocks,
        // A warp per head, all heads at once where the block allows.
        threads: 32 * u32_of("heads", (c.heads + c.kv_heads).min(32))?,
        kv,
        token_stride,
    })
}

/// The kernels' element type of a KV cache of `kv`.
pub(crate) fn kv_elem(kv: KvCache) -> KvElem {
    match kv {
        KvCache::F16 => KvElem::F16,
        KvCache::F32 => KvElem::F32,
    }
}

/// Threads for a kernel walking `groups` 16-byte groups of one row.
pub(crate) fn row_threads(groups: u32) -> u32 {
    (groups.div_ceil(32) * 32).clamp(32, 256)
}

pub(crate) fn u32_of(what: &str, n: usize) -> Result<u32, GpuError> {
    u32::try_from(n).map_err(|_| GpuError::Unsupported {
        what: format!("{what} = {n}"),
        reason: "it does not fit 32 bits".into(),
    })
}

/// Decode attention's block shape for sessions of up to `context` positions over a cache
/// of `kv`: threads,
/// positions per split and the block-table row length (a whole number of splits).
///
/// Splits are short — 16 positions, one cache block, up to a context of 1024 — so that a
/// short context spreads over many blocks (`splits · kv heads · rows`: a split's block
/// walks its positions with four warps at once rather than one position after another),
/// and grow with the context beyond that so that at most [`MOST_SPLITS`] partials per
/// head are merged (within the kernel's shared memory; past it the splits grow in number
/// instead).
pub(crate) fn attention_shape(
    head_dim: u32,
    group: u32,
    context: u32,
    kv: KvElem,
) -> Result<(u32, u32, u32), GpuError> {
    let p = DecodeParams {
        head_dim,
        n_heads: group,
        n_kv_heads: 1,
        max_blocks: 1,
        split: BLOCK_TOKENS,
        threads: ATTENTION_THREADS,
        kv,
        merge: true,
        q_stride: 0,
    };
    let most = p.most_split();
    if most == 0 || p.lanes().is_none() {
        return Err(GpuError::Unsupported {
            what: format!(
                "attention with head size {head_dim} and {group} query heads per kv head"
            ),
            reason: "the decode attention kernel's block cannot hold it".into(),
        });
    }
    let split = context
        .div_ceil(MOST_SPLITS)
        .next_multiple_of(BLOCK_TOKENS)
        .clamp(BLOCK_TOKENS, most);
    let max_blocks = context.div_ceil(split) * split / BLOCK_TOKENS;
    Ok((ATTENTION_THREADS, split, max_blocks))
}

/// Threads of a decode attention block: four warps.
const ATTENTION_THREADS: u32 = 128;
/// Splits of the longest context, at most, while the split's scores fit shared memory.
const MOST_SPLITS: u32 = 64;

/// Builds the dispatch list, kernels and buffers of one decode step.
struct Assembler<'a> {
    src: &'a dyn StoredTensors,
    naming: Naming,
    kernels: KernelSet,
    dispatches: Vec<Dispatch>,
    activations: Vec<Activation>,
    weights: Vec<WeightGroup>,
    /// Rows of a step at most.
    max_batch: u32,
    /// The device's multiprocessors.
    multiprocessors: u32,
    /// How the step's products of bf16 matrices run.
    products: Products,
}

/// How a decode step multiplies its bf16 matrices with the step's rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Products {
    /// Matrix–vector kernels: at one row the norms inside the products, at several rows
    /// up to 8 rows a pass.
    #[default]
    Gemv,
    /// Tensor-core products ([`gemv_tc`]) at every row count, one row or many, behind the
    /// norms' own dispatches: the weights are read once for up to 64 rows, in a variant
    /// whose passes fit the step's rows. Matrices in other formats (and bf16 ones whose
    /// columns are not a multiple of 32) keep the matrix–vector kernels.
    TensorCore,
}

impl Assembler<'_> {
    /// The kernel built from `params` (once per distinct parameters).
    fn kernel<P: std::fmt::Debug>(
        &mut self,
        part: &str,
        params: &P,
        build: impl FnOnce(&P) -> Result<Function, KernelError>,
    ) -> Result<usize, GpuError> {
        self.kernels.get(part, params, build)
    }

    fn act(&mut self, name: String, bytes: u64, host: bool) -> usize {
        self.activations.push(Activation { name, bytes, host });
        self.activations.len() - 1
    }

    fn group(&mut self, parts: Vec<(WeightData, u64)>) -> usize {
        self.weights.push(WeightGroup { parts });
        self.weights.len() - 1
    }

    /// A dispatch of every step whose grid axis `per_row` (if any) grows with the rows.
    fn push(
        &mut self,
        label: String,
        kernel: usize,
        launch: Launch,
        per_row: Option<usize>,
        args: Vec<Operand>,
    ) {
        self.push_in(Rows::Any, label, kernel, launch, per_row, args);
    }

    /// A dispatch of the steps `rows` includes.
    fn push_in(
        &mut self,
        rows: Rows,
        label: String,
        kernel: usize,
        launch: Launch,
        per_row: Option<usize>,
        args: Vec<Operand>,
    ) {
        self.dispatches.push(Dispatch {
            label,
            kernel,
            launch,
            rows,
            per_row,
            args,
        });
    }

    fn name(&self, t: DecoderTensor) -> String {
        tensor_name(t, self.naming)
    }

    /// A stored matrix as a weight part.
    fn stored(
        &self,
        t: DecoderTensor,
        rows: usize,
        cols: usize,
    ) -> Result<(WeightData, u64), GpuError> {
        let n = self.name(t);
        let bytes = stored::matrix(self.src, &n, rows, cols)?.bytes.len() as u64;
        Ok((WeightData::Stored(n), bytes))
    }

    fn floats(v: Vec<f32>) -> (WeightData, u64) {
        let bytes = 4 * v.len() as u64;
        (WeightData::Floats(v), bytes)
    }

    fn vector(&self, t: DecoderTensor, len: usize) -> Result<(WeightData, u64), GpuError> {
        Ok(Self::floats(stored::vector(self.src, &self.name(t), len)?))
    }

    /// The residual stream `residual` (`cols` wide) normalized by the RMSNorm `weight`, for
    /// the products that read it ([`Input::Normed`]); steps of several rows normalize it
    /// here, with a dispatch of their own, into a buffer of the arena, and so do one-row
    /// steps where a tensor-core product reads it (`readers`: the products' formats).
    /// `what` names the norm in labels, after `prefix`.
    #[allow(clippy::too_many_arguments)]
    fn norm(
        &mut self,
        prefix: &str,
        what: &str,
        residual: Operand,
        weight: Operand,
        eps: f32,
        cols: usize,
        readers: &[WeightFormat],
    ) -> Result<Normed, GpuError> {
        let tensor_cores = readers.iter().any(|&f| self.takes_tensor_cores(f, cols));
        let rows = if self.max_batch > 1 || tensor_cores {
            let label = format!("{prefix}{what}");
            let bytes = self.max_batch as u64 * cols as u64 * 4;
            let buffer = Region::Act(self.act(format!("{label}: normalized rows"), bytes, false));
            // As many threads as walk the prologue's sum: the same order, the same bits.
            let p = RmsNormRowsParams {
                cols: u32_of("hidden", cols)?,
                threads: NORM_THREADS,
            };
            let k = self.kernel(&label, &p, rmsnorm_rows::build)?;
            let args = vec![
                residual,
                weight,
                at(buffer, 0),
                Operand::Value(Arg::F32(eps)),
            ];
            // Tensor-core products read the normalized rows at every row count.
            let steps = if tensor_cores { Rows::Any } else { Rows::Many };
            self.push_in(steps, label, k, p.launch(1), Some(0), args);
            Some(at(buffer, 0))
        } else {
            None
        };
        Ok(Normed {
            what: what.to_string(),
            residual,
            weight,
            eps,
            rows,
        })
    }

    /// `y = W·x` for a `[rows, cols]` matrix at `w` (`r`: `y = W·x + r`, `r` a residual
    /// stream of a row per step row or a bias added to every row), or
    /// `y = silu(W_gate·x)·(W_up·x)` for the two matrices of `w` (SwiGLU); `x` and `y` hold
    /// a row per step row. A normalized input is formed inside the product in a one-row
    /// step (its prologue) and read from the norm's rows in steps of several rows. `what`
    /// names the product in labels, after `prefix`.
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &mut self,
        prefix: &str,
        what: &str,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        w: &[Operand],
        x: &Input,
        r: Option<(Operand, Addend)>,
        y: Operand,
    ) -> Result<(), GpuError> {
        let (prologue, label) = match x {
            Input::Plain(_) => (Prologue::None, format!("{prefix}{what}")),
            Input::Normed(n) => (Prologue::RmsNorm, format!("{prefix}{} + {what}", n.what)),
        };
        let (warps, max_blocks) = gemv_shape(
            format,
            cols,
            prologue == Prologue::RmsNorm,
            self.multiprocessors,
        );
        let p = QGemvParams {
            format,
            prologue,
            epilogue: match (w.len(), r) {
                (2, _) => Epilogue::SwiGlu,
                (_, Some(_)) => Epilogue::Residual,
                _ => Epilogue::Plain,
            },
            rows: u32_of("rows", rows)?,
            cols: u32_of("cols", cols)?,
            warps,
            unroll: if format.is_float() { 4 } else { 2 },
            act: ACT,
            batch: 1,
            max_blocks,
        };
        let args = |x: Operand, norm: Option<(Operand, f32)>| {
            let mut args = w.to_vec();
            args.push(x);
            args.extend(norm.map(|(w, _)| w));
            args.extend(r.map(|(r, _)| r));
            args.push(y);
            args.extend(norm.map(|(_, eps)| Operand::Value(Arg::F32(eps))));
            args.push(Operand::Rows);
            if let Some((_, addend)) = r {
                let stride = match addend {
                    Addend::Residual => p.rows,
                    Addend::Bias => 0,
                };
                args.push(Operand::Value(Arg::U32(stride)));
            }
            args
        };
        let (one_x, one_norm, many_x) = match x {
            Input::Plain(x) => (*x, None, Some(*x)),
            Input::Normed(n) => (n.residual, Some((n.weight, n.eps)), n.rows),
        };
        if let (Some(variants), Some(x)) = (self.tensor_core(&p), many_x) {
            let label = format!("{prefix}{what}");
            for (steps, tc) in variants {
                let k = self.kernel(&label, &tc, gemv_tc::build)?;
                self.push_in(steps, label.clone(), k, tc.launch(), None, args(x, None));
            }
            return Ok(());
        }
        let k = self.kernel(&label, &p, qgemv::build)?;
        let one_args = args(one_x, one_norm);
        let Some(many_x) = many_x.filter(|_| self.max_batch > 1) else {
            // Every step takes one row.
            self.push(label, k, p.launch(), None, one_args);
            return Ok(());
        };
        // Steps of several rows take up to 8 vectors a pass; a quantized piece is then
        // loaded one per lane at a time, which keeps the registers of 8 vectors' products
        // from spilling.
        let pw = QGemvParams {
            prologue: Prologue::None,
            batch: qgemv::widest_batch(Prologue::None, p.cols).min(self.max_batch),
            unroll: if format.is_float() { 4 } else { 1 },
            ..p
        };
        let wide_label = format!("{prefix}{what}");
        let kw = self.kernel(&wide_label, &pw, qgemv::build)?;
        self.push_in(Rows::One, label, k, p.launch(), None, one_args);
        self.push_in(
            Rows::Many,
            wide_label,
            kw,
            pw.launch(),
            None,
            args(many_x, None),
        );
        Ok(())
    }
}

impl Assembler<'_> {
    /// Whether a product of a matrix in `format` with `cols` columns runs on the tensor
    /// cores.
    fn takes_tensor_cores(&self, format: WeightFormat, cols: usize) -> bool {
        self.products == Products::TensorCore
            && format == WeightFormat::BF16
            && cols.is_multiple_of(32)
    }

    /// The tensor-core products standing in for the matrix–vector product `p`, where the
    /// step takes them and `p`'s matrix suits them: one variant per class of row counts,
    /// each with the steps it serves.
    ///
    /// Eight warps split the columns (fewer where the row has fewer 32-column chunks):
    /// a function of the shape only, so that a row's bits never depend on the rows of the
    /// step. Two row tiles a warp (one for SwiGLU, whose two matrices already share each
    /// activation load). The variants differ only in the 8-row tiles a pass takes
    /// ([`TC_TILES`]), which a row's arithmetic does not depend on: a step takes the
    /// smallest variant whose pass holds all its rows (the widest one, in several passes,
    /// past 64 rows), since the registers a pass's accumulators need limit the blocks an
    /// SM runs at once — a one-row step on the 64-row variant runs at one block an SM.
    fn tensor_core(&self, p: &QGemvParams) -> Option<Vec<(Rows, GemvTcParams)>> {
        if !self.takes_tensor_cores(p.format, p.cols as usize) {
            return None;
        }
        let base = GemvTcParams {
            epilogue: p.epilogue,
            rows: p.rows,
            cols: p.cols,
            warps: (p.cols / 32).min(8),
            row_tiles: if p.epilogue == Epilogue::SwiGlu { 1 } else { 2 },
            tiles: 1,
            unroll: 2,
        };
        let needed = self.max_batch.div_ceil(8).min(TC_TILES[TC_TILES.len() - 1]);
        let mut variants = vec![];
        let mut least = 1;
        for tiles in TC_TILES {
            let widest = tiles >= needed;
            let most = if widest { u32::MAX } else { 8 * tiles };
            let steps = match (least, most) {
                (1, u32::MAX) => Rows::Any,
                _ => Rows::Span { least, most },
            };
            variants.push((steps, GemvTcParams { tiles, ..base }));
            if widest {
                break;
            }
            least = most + 1;
        }
        Some(variants)
    }
}

/// The 8-row tiles a pass of each tensor-core variant takes: a step of `n` rows runs the
/// first with `8 · tiles ≥ n`.
const TC_TILES: [u32; 4] = [1, 2, 4, 8];

/// Warps of a matrix–vector block (but see [`gemv_shape`]).
const GEMV_WARPS: u32 = 4;

/// Q4_K and Q8_0 products stage the whole input vector, quantized, in every block before
/// its rows ([`quench_kernels::qgemv::integer`]), and one thread quantizes each
/// 32-element block: fewer, wider blocks spend less of the product on it where the input
/// is normalized first or long. Measured on an H200 over warps 4/8/16 × 1/2/4/8 blocks a
/// multiprocessor (receipts/kernel-perf-q4k-sweep-*.json, llama-3.1-8b's Q4_K products):
/// one block of 8 warps a multiprocessor (16 warps past 8192 columns) is within 4% of the
/// fastest shape of q|k|v, gate|up and down, and 1.1–1.7× faster than 4 warps × 8; the
/// output projection (4096 columns, no norm) keeps 4 × 8.
pub(crate) fn gemv_shape(
    format: WeightFormat,
    cols: usize,
    normed: bool,
    multiprocessors: u32,
) -> (u32, u32) {
    if format.is_integer() && cols > 8192 {
        (16, multiprocessors)
    } else if format.is_integer() && normed {
        (8, multiprocessors)
    } else {
        (GEMV_WARPS, gemv_blocks(multiprocessors))
    }
}

/// What a matrix–vector product multiplies.
enum Input {
    /// Activations as they are (a row per step row).
    Plain(Operand),
    /// The residual stream under an RMSNorm ([`Assembler::norm`]).
    Normed(Normed),
}

/// The residual stream normalized by one norm weight: formed inside each product that
/// reads it in a one-row step, once by a dispatch of its own in steps of several rows.
struct Normed {
    /// The norm in labels: `attention norm`.
    what: String,
    residual: Operand,
    weight: Operand,
    eps: f32,
    /// The normalized rows (`[rows, cols]` f32) of steps of several rows; `None` where
    /// a step takes one row at most.
    rows: Option<Operand>,
}

fn at(r: Region, bytes: u64) -> Operand {
    Operand::At(r, bytes)
}

/// Blocks per multiprocessor that a matrix–vector product launches at most. Each block
/// loops over its share of the row groups, so the grid need not grow with the rows: 8
/// blocks of 4 warps keep 32 warps of loads in flight on every multiprocessor, while
/// with the RMSNorm prologue the input is normalized once per block, not once per 8 rows
/// (for a 150k-row LM head over 896 columns that staging read about as many bytes as the
/// weights).
pub(crate) const GEMV_BLOCKS_PER_SM: u32 = 8;

/// The multiprocessors assumed where the executor reports none (the interpreter): an
/// H100 SXM's or H200's 132.
pub(crate) const DEFAULT_MULTIPROCESSORS: u32 = 132;

/// The most blocks a matrix–vector product launches on a device of `multiprocessors`.
pub(crate) fn gemv_blocks(multiprocessors: u32) -> u32 {
    multiprocessors.max(1).saturating_mul(GEMV_BLOCKS_PER_SM)
}

impl DecodeGraph {
    /// Assembles the decode step of `config` with the kernels `catalog` chose, for a
    /// device of 132 multiprocessors (an H100 SXM's or H200's).
    pub fn assemble(
        config: &ModelConfig,
        catalog: &Catalog,
        src: &dyn StoredTensors,
        naming: Naming,
        shape: StepShape,
    ) -> Result<DecodeGraph, GpuError> {
        Self::assemble_for(config, catalog, src, naming, shape, DEFAULT_MULTIPROCESSORS)
    }

    /// As [`DecodeGraph::assemble`], for a device of `multiprocessors`: its matrix–vector
    /// products launch at most 8 blocks per multiprocessor, each looping over its share
    /// of the rows.
    pub fn assemble_for(
        config: &ModelConfig,
        catalog: &Catalog,
        src: &dyn StoredTensors,
        naming: Naming,
        shape: StepShape,
        multiprocessors: u32,
    ) -> Result<DecodeGraph, GpuError> {
        Self::assemble_with(
            config,
            catalog,
            src,
            naming,
            shape,
            multiprocessors,
            Products::Gemv,
        )
    }

    /// As [`DecodeGraph::assemble_for`], multiplying bf16 matrices as `products` says.
    pub fn assemble_with(
        config: &ModelConfig,
        catalog: &Catalog,
        src: &dyn StoredTensors,
        naming: Naming,
        shape: StepShape,
        multiprocessors: u32,
        products: Products,
    ) -> Result<DecodeGraph, GpuError> {
        let c = config;
        let mut a = Assembler {
            src,
            naming,
            kernels: KernelSet::default(),
            dispatches: vec![],
            activations: vec![],
            weights: vec![],
            max_batch: u32_of("rows a step", shape.max_batch.max(1))?,
            multiprocessors: multiprocessors.max(1),
            products,
        };
        // Bytes of an activation of `width` elements of `bytes` each, a row per step row.
        let rows = a.max_batch as u64;
        let per_row = |width: usize, bytes: u64| rows * width as u64 * bytes;
        let (hidden, hd) = (c.hidden, c.head_dim);
        let (q_width, kv_width) = (c.heads * hd, c.kv_heads * hd);
        let qkv_width = q_width + 2 * kv_width;
        let eps = c.norm_eps as f32;
        let context = u32_of("context", shape.context.max(1))?;
        let group = u32_of("heads per kv head", c.heads / c.kv_heads)?;
        let kv_type = kv_elem(shape.kv);
        let (attn_threads, split, max_blocks) =
            attention_shape(u32_of("head_dim", hd)?, group, context, kv_type)?;
        let n_blocks = u32_of(
            "KV cache blocks",
            shape.sessions.max(1) * context.div_ceil(BLOCK_TOKENS) as usize,
        )?;
        let kv = KvLayout {
            n_blocks,
            max_blocks,
            layer_bytes: n_blocks as u64
                * (kv_width as u64)
                * BLOCK_TOKENS as u64
                * kv_type.size() as u64,
            elem: kv_type,
        };

        // Activations the host touches, live for the whole step.
        let record = StepRecord {
            max_batch: a.max_batch as usize,
        };
        let io = HostIo {
            step: a.act("step record".into(), record.bytes(), true),
            table: a.act("block tables".into(), per_row(max_blocks as usize, 4), true),
            logits: a.act("logits".into(), per_row(c.vocab, 4), true),
            zeros: a.act(
                "attention split counters".into(),
                per_row(c.kv_heads, 4),
                true,
            ),
            next: c
                .vocab
                .is_multiple_of(4)
                .then(|| a.act("next tokens".into(), per_row(1, 4), true)),
        };
        let residual = Region::Act(a.act("residual".into(), per_row(hidden, 4), true));
        let step = Region::Act(io.step);
        let [token, pos, ctx_len, seq] = [0, 1, 2, 3].map(|i| at(step, record.part(i)));
        let table = at(Region::Act(io.table), 0);
        let counters = at(Region::Act(io.zeros), 0);
        let r0 = at(residual, 0);

        // Constants: RoPE tables over the whole context.
        let (cos, sin) = rope_tables(c, src, naming, context)?;
        let rope_group = a.group(vec![Assembler::floats(cos), Assembler::floats(sin)]);
        let rope_cos = at(Region::Weights(rope_group), 0);
        let rope_sin = at(Region::Weights(rope_group), a.weights[rope_group].offset(1));

        // Embedding.
        let table_group = a.group(vec![a.stored(
            DecoderTensor::TokenEmbedding,
            c.vocab,
            hidden,
        )?]);
        let ep = embed_params(catalog, hidden)?;
        let k = a.kernel("token embedding", &ep, embed::build)?;
        a.push(
            "token embedding".into(),
            k,
            ep.launch(1),
            Some(0),
            vec![
                token,
                at(Region::Weights(table_group), 0),
                r0,
                Operand::Value(Arg::U32(u32_of("vocab", c.vocab)?)),
            ],
        );

        let mut layer_dispatches = Vec::with_capacity(c.layers);
        for (l, lk) in catalog.layers.iter().enumerate() {
            let before = a.dispatches.len();
            let t = |t| DecoderTensor::Layer(l, t);
            let prefix = format!("layer {l}: ");
            let label = |what: &str| format!("{prefix}{what}");
            // One projection writes each row's q|k|v back to back, which RoPE and the
            // attention read in place (rows `qkv_width` apart); three write q, k and v
            // apart, each packed.
            let (q_at, k_at, v_at, token_stride) = match lk.qkv {
                Qkv::Fused(_) => {
                    let qkv = Region::Act(a.act(
                        format!("layer {l} q|k|v"),
                        per_row(qkv_width, 4),
                        false,
                    ));
                    (
                        at(qkv, 0),
                        at(qkv, 4 * q_width as u64),
                        at(qkv, 4 * (q_width + kv_width) as u64),
                        u32_of("q|k|v width", qkv_width)?,
                    )
                }
                Qkv::Separate(_) => {
                    let mut part = |what: &str, width: usize| {
                        at(
                            Region::Act(a.act(
                                format!("layer {l} {what}"),
                                per_row(width, 4),
                                false,
                            )),
                            0,
                        )
                    };
                    (
                        part("q", q_width),
                        part("k", kv_width),
                        part("v", kv_width),
                        0,
                    )
                }
            };
            let norms = a.group(vec![
                a.vector(t(L::AttnNorm), hidden)?,
                a.vector(t(L::FfnNorm), hidden)?,
            ]);
            let attn_norm = Input::Normed(a.norm(
                &prefix,
                "attention norm",
                r0,
                at(Region::Weights(norms), 0),
                eps,
                hidden,
                match &lk.qkv {
                    Qkv::Fused(f) => std::slice::from_ref(f),
                    Qkv::Separate(fs) => fs,
                },
            )?);

            // q, k, v (and their biases) back to back, so that one GEMV can read all rows.
            let wqkv = a.group(vec![
                a.stored(t(L::Q), q_width, hidden)?,
                a.stored(t(L::K), kv_width, hidden)?,
                a.stored(t(L::V), kv_width, hidden)?,
            ]);
            let bias = if c.qkv_bias {
                let parts = vec![
                    a.vector(t(L::QBias), q_width)?,
                    a.vector(t(L::KBias), kv_width)?,
                    a.vector(t(L::VBias), kv_width)?,
                ];
                Some(Region::Weights(a.group(parts)))
            } else {
                None
            };
            let wg = &a.weights[wqkv];
            let w_offsets = [0, wg.offset(1), wg.offset(2)];
            let b_offsets = [0u64, 4 * q_width as u64, 4 * (q_width + kv_width) as u64];
            match lk.qkv {
                Qkv::Fused(f) => {
                    a.gemv(
                        &prefix,
                        "q|k|v projection",
                        f,
                        qkv_width,
                        hidden,
                        &[at(Region::Weights(wqkv), 0)],
                        &attn_norm,
                        bias.map(|b| (at(b, 0), Addend::Bias)),
                        q_at,
                    )?;
                }
                Qkv::Separate(formats) => {
                    let rows = [q_width, kv_width, kv_width];
                    let ys = [q_at, k_at, v_at];
                    for (i, what) in ["q", "k", "v"].iter().enumerate() {
                        a.gemv(
                            &prefix,
                            &format!("{what} projection"),
                            formats[i],
                            rows[i],
                            hidden,
                            &[at(Region::Weights(wqkv), w_offsets[i])],
                            &attn_norm,
                            bias.map(|b| (at(b, b_offsets[i]), Addend::Bias)),
                            ys[i],
                        )?;
                    }
                }
            }

            let rp = rope_append_params(c, catalog, max_blocks, token_stride, kv.elem)?;
            let (kc, vc) = (at(Region::KCache(l), 0), at(Region::VCache(l), 0));
            let mut args = vec![
                q_at,
                k_at,
                v_at,
                seq,
                pos,
                table,
                rope_cos,
                rope_sin,
                Operand::Value(Arg::U32(context)),
                kc,
                vc,
            ];
            if c.qk_norm {
                let qk = a.group(vec![a.vector(t(L::QNorm), hd)?, a.vector(t(L::KNorm), hd)?]);
                args.extend([
                    at(Region::Weights(qk), 0),
                    at(Region::Weights(qk), 4 * hd as u64),
                    Operand::Value(Arg::F32(eps)),
                ]);
            }
            let what = if c.qk_norm {
                "q/k norm + rope + kv append"
            } else {
                "rope + kv append"
            };
            let k = a.kernel(&label(what), &rp, rope_append::build)?;
            a.push(label(what), k, rp.launch(1), Some(0), args);

            let dp = DecodeParams {
                head_dim: rp.head_dim,
                n_heads: rp.n_heads,
                n_kv_heads: rp.n_kv_heads,
                max_blocks,
                split,
                threads: attn_threads,
                kv: kv.elem,
                merge: true,
                q_stride: token_stride,
            };
            let splits = dp.n_splits() as usize;
            let part_m = Region::Act(a.act(
                format!("layer {l} split maxima"),
                per_row(c.heads * splits, 4),
                false,
            ));
            let part_l = Region::Act(a.act(
                format!("layer {l} split sums"),
                per_row(c.heads * splits, 4),
                false,
            ));
            let part_o = Region::Act(a.act(
                format!("layer {l} split outputs"),
                per_row(c.heads * splits * hd, 4),
                false,
            ));
            let attn = Region::Act(a.act(
                format!("layer {l} attention output"),
                per_row(q_width, ACT_BYTES),
                false,
            ));
            let k = a.kernel(&label("attention"), &dp, attn_decode::build)?;
            let scale = Operand::Value(Arg::F32((1.0 / (hd as f64).sqrt()) as f32));
            a.push(
                label("attention"),
                k,
                dp.launch(1),
                Some(1),
                vec![
                    q_at,
                    kc,
                    vc,
                    table,
                    ctx_len,
                    at(part_m, 0),
                    at(part_l, 0),
                    at(part_o, 0),
                    counters,
                    at(attn, 0),
                    scale,
                ],
            );

            let wo = a.group(vec![a.stored(t(L::AttnOutput), hidden, q_width)?]);
            a.gemv(
                &prefix,
                "output projection",
                lk.attn_output,
                hidden,
                q_width,
                &[at(Region::Weights(wo), 0)],
                &Input::Plain(at(attn, 0)),
                Some((r0, Addend::Residual)),
                r0,
            )?;

            let gate_up = a.group(vec![
                a.stored(t(L::Gate), c.ffn, hidden)?,
                a.stored(t(L::Up), c.ffn, hidden)?,
            ]);
            let up_at = a.weights[gate_up].offset(1);
            let ffn = Region::Act(a.act(
                format!("layer {l} ffn hidden"),
                per_row(c.ffn, ACT_BYTES),
                false,
            ));
            let ffn_norm = Input::Normed(a.norm(
                &prefix,
                "ffn norm",
                r0,
                at(Region::Weights(norms), 4 * hidden as u64),
                eps,
                hidden,
                &[lk.gate_up],
            )?);
            a.gemv(
                &prefix,
                "gate/up + SwiGLU",
                lk.gate_up,
                c.ffn,
                hidden,
                &[
                    at(Region::Weights(gate_up), 0),
                    at(Region::Weights(gate_up), up_at),
                ],
                &ffn_norm,
                None,
                at(ffn, 0),
            )?;
            let down = a.group(vec![a.stored(t(L::Down), hidden, c.ffn)?]);
            a.gemv(
                &prefix,
                "down projection",
                lk.down,
                hidden,
                c.ffn,
                &[at(Region::Weights(down), 0)],
                &Input::Plain(at(ffn, 0)),
                Some((r0, Addend::Residual)),
                r0,
            )?;
            let one_row = a.dispatches[before..]
                .iter()
                .filter(|d| d.rows.includes(1))
                .count();
            layer_dispatches.push(one_row);
        }

        let out_norm = a.group(vec![a.vector(DecoderTensor::OutputNorm, hidden)?]);
        let head = if c.tied_embeddings {
            table_group
        } else {
            a.group(vec![a.stored(DecoderTensor::Output, c.vocab, hidden)?])
        };
        let logits = at(Region::Act(io.logits), 0);
        let normed = Input::Normed(a.norm(
            "",
            "output norm",
            r0,
            at(Region::Weights(out_norm), 0),
            eps,
            hidden,
            &[catalog.output],
        )?);
        a.gemv(
            "",
            "LM head",
            catalog.output,
            c.vocab,
            hidden,
            &[at(Region::Weights(head), 0)],
            &normed,
            None,
            logits,
        )?;
        if let Some(next) = io.next {
            let cols = u32_of("vocab", c.vocab)?;
            let p = ArgmaxParams {
                cols,
                threads: row_threads(cols / 4).max(128),
            };
            let k = a.kernel("argmax", &p, argmax::build)?;
            a.push(
                "argmax".into(),
                k,
                p.launch(1),
                Some(0),
                vec![logits, at(Region::Act(next), 0)],
            );
        }

        let mut not_streamed = a.weights[rope_group].bytes();
        if !c.tied_embeddings {
            not_streamed += a.weights[table_group].bytes();
        }
        let weight_bytes_per_token =
            a.weights.iter().map(WeightGroup::bytes).sum::<u64>() - not_streamed;
        Ok(DecodeGraph {
            weight_bytes_per_token,
            kernels: a.kernels.into_kernels(),
            dispatches: a.dispatches,
            layer_dispatches,
            kv,
            activations: a.activations,
            weights: a.weights,
            io,
            record,
            multiprocessors: a.multiprocessors,
        })
    }

    /// The dispatches of a step of `rows` rows, in order.
    pub fn step(&self, rows: u32) -> impl Iterator<Item = &Dispatch> {
        self.dispatches
            .iter()
            .filter(move |d| d.rows.includes(rows))
    }

    /// One line per dispatch of a step of `rows` rows ([`super::listing`]).
    pub fn listing(&self, rows: u32) -> Vec<String> {
        self.step(rows)
            .map(|d| {
                let args: Vec<String> = d.args.iter().map(|a| self.operand_text(a)).collect();
                super::listing::line(
                    &d.label,
                    &self.kernels[d.kernel],
                    &d.launch_for(rows),
                    &args,
                )
            })
            .collect()
    }

    fn operand_text(&self, op: &Operand) -> String {
        match op {
            Operand::At(region, off) => format!("{}+{off}", self.region_text(*region)),
            Operand::Value(a) => super::listing::value(a),
            Operand::Rows => "rows".into(),
        }
    }

    /// A region by what it holds.
    pub(crate) fn region_text(&self, r: Region) -> String {
        match r {
            Region::Act(i) => self.activations[i].name.clone(),
            Region::Weights(g) => super::listing::group(&self.weights[g]),
            Region::KCache(l) => format!("layer {l} keys"),
            Region::VCache(l) => format!("layer {l} values"),
        }
    }

    /// Bytes of all weights and constants.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.iter().map(WeightGroup::bytes).sum()
    }

    /// The lifetime of every activation over the dispatch list.
    pub(crate) fn lifetimes(&self) -> Vec<super::arena::Lifetime> {
        let last = self.dispatches.len().saturating_sub(1);
        let mut span: Vec<Option<(usize, usize)>> = vec![None; self.activations.len()];
        for (i, d) in self.dispatches.iter().enumerate() {
            for op in &d.args {
                if let Operand::At(Region::Act(a), _) = op {
                    let s = span[*a].get_or_insert((i, i));
                    s.1 = i;
                }
            }
        }
        self.activations
            .iter()
            .zip(span)
            .map(|(act, s)| {
                let (first, last) = if act.host {
                    (0, last)
                } else {
                    s.unwrap_or((0, 0))
                };
                super::arena::Lifetime {
                    bytes: act.bytes,
                    first,
                    last,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_shapes_fit_the_kernel() {
        for (hd, group, ctx) in [
            (64, 3, 8192),
            (128, 4, 131072),
            (64, 7, 32768),
            (32, 2, 256),
            (128, 8, 100),
        ] {
            for kv in [KvElem::F16, KvElem::F32] {
                let (threads, split, max_blocks) = attention_shape(hd, group, ctx, kv).unwrap();
                let p = DecodeParams {
                    head_dim: hd,
                    n_heads: 8 * group,
                    n_kv_heads: 8,
                    max_blocks,
                    split,
                    threads,
                    kv,
                    merge: true,
                    q_stride: 0,
                };
                attn_decode::build(&p).unwrap_or_else(|e| panic!("{hd} {group} {ctx} {kv:?}: {e}"));
                assert!(max_blocks * BLOCK_TOKENS >= ctx);
                assert!(p.n_splits() <= 64, "{} splits", p.n_splits());
            }
        }
    }

    #[test]
    fn short_contexts_take_splits_of_one_cache_block() {
        // (head size, group, context) → (split, splits)
        for (hd, group, ctx, want) in [
            (64, 7, 200, (16, 13)),
            (64, 7, 256, (16, 16)),
            (128, 4, 256, (16, 16)),
            (128, 4, 1024, (16, 64)),
            (128, 4, 4096, (64, 64)),
            (128, 4, 5000, (80, 63)),
        ] {
            let (_, split, max_blocks) = attention_shape(hd, group, ctx, KvElem::F16).unwrap();
            assert_eq!(
                (split, max_blocks * BLOCK_TOKENS / split),
                want,
                "{hd} {group} {ctx}"
            );
        }
    }
}
