//! The decode step: the dispatch list of one step (one token for each of up to
//! [`StepShape::max_batch`] sequences, the step's **rows**), built by the one
//! [`Assembler`] of [`super::plan`] over the model's weights ([`ModelWeights`], which it
//! gathers) — every argument named symbolically, the arena planned before anything is
//! allocated. One list serves every row count: each dispatch says which steps it is part
//! of ([`Rows`]: any, one-row steps or steps of several rows), its grid grows with the
//! rows ([`Dispatch::launch_for`]), and every activation holds a row per sequence
//! (`[rows, width]`). The prompt path ([`super::prefill`]) is the same kind of program
//! for the rows of a prompt chunk, over the same weights.
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
//! them at zero. Prompts take the prompt path ([`super::prefill`]: tensor-core GEMMs over
//! whole prompt chunks) unless it is switched off; then they run through this step token
//! by token (rows at different prompt positions share steps).

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
use quench_models::arch::{ModelConfig, Naming};
use quench_rt::{Arg, Launch};

use super::catalog::{Catalog, Qkv};
use super::error::GpuError;
use super::plan::{at, Assembler, Buffer, Grid, Offset, Operand, Region};
pub use super::plan::{Dispatch, Rows};
use super::stored::StoredTensors;
use super::weights::{LayerWeights, ModelWeights};
use crate::options::KvCache;

/// The type of the activations passed between kernels (the attention and SwiGLU outputs:
/// the matrix–vector kernels' inputs besides the residual stream), and its size.
const ACT: OutType = OutType::F32;
const ACT_BYTES: u64 = 4;

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
    /// `[B, hidden]` f32: the residual stream.
    pub residual: usize,
    /// `[B, hidden]` f32, in a tensor-parallel rank's step: the output and down
    /// projections' products ([`Reduction::Sum`]).
    pub partial: Option<usize>,
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
    /// Weight bytes one step reads ([`ModelWeights::bytes_per_token`]).
    pub weight_bytes_per_token: u64,
    /// The step's buffers (its activations).
    pub(crate) activations: Vec<Buffer>,
    /// The model's weights, which the prompt path reads too.
    pub(crate) weights: ModelWeights,
    pub(crate) io: HostIo,
    pub(crate) record: StepRecord,
    /// The device's multiprocessors (the matrix–vector products' grids: [`gemv_shape`]).
    pub(crate) multiprocessors: u32,
    /// Positions one session holds.
    pub(crate) context: u32,
    /// Products of a one-row step on the tensor cores ([`Products::TensorCore`]).
    pub tensor_core_products: usize,
    /// A tensor-parallel rank's step: the ends of its segments (indices into
    /// [`DecodeGraph::dispatches`]) and how the ranks' rows are combined at each; the
    /// last segment runs to the end. Empty for a whole model's step.
    pub reductions: Vec<(usize, Reduction)>,
}

/// The token-embedding gather for the catalog's table format.
pub(crate) fn embed_params(catalog: &Catalog, hidden: usize) -> Result<EmbedParams, GpuError> {
    let dim = u32_of("hidden", hidden)?;
    Ok(EmbedParams {
        format: catalog.embed,
        dim,
        threads: row_threads(dim / catalog.embed.group()),
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
/// instead). The split returned is the longest: each sequence takes the shortest that
/// spreads its own length over the splits (`DecodeParams::split_for`), so a session
/// opened for a long context is not slower while its context is short.
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

/// Builds the dispatch list and buffers of one decode step over the model's weights.
struct StepBuilder<'a> {
    a: Assembler,
    c: &'a ModelConfig,
    catalog: &'a Catalog,
    w: &'a ModelWeights,
    /// Rows of a step at most.
    max_batch: u32,
    /// The device's multiprocessors.
    multiprocessors: u32,
    /// How the step's products of bf16 matrices run.
    products: Products,
    kv: KvLayout,
    /// Positions one session holds.
    context: u32,
    /// Decode attention's threads and positions per split ([`attention_shape`]).
    attention: (u32, u32),
    io: HostIo,
    record: StepRecord,
    /// The residual stream, `[rows, hidden]` f32.
    residual: Operand,
    /// Products of a one-row step on the tensor cores.
    tensor_core_products: usize,
    /// A tensor-parallel rank's step: where it stops for the ranks' rows to be combined.
    reductions: Vec<(usize, Reduction)>,
}

/// Where a tensor-parallel rank's step stops for the ranks' rows to be combined
/// ([`DecodeGraph::reductions`]): each rank holds a share of the heads, of the FFN's width
/// and of the vocabulary, and a copy of the residual stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    /// Each rank gathered the embedding rows of the tokens in its share of the vocabulary
    /// (a row of NaN for the others): each row of the residual is its token's rank's row.
    Gather,
    /// Each rank multiplied its share of a matrix's columns (the output or the down
    /// projection) into the partial buffer: the residual gains the ranks' products, added
    /// in rank order.
    Sum,
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

/// Where a layer's q, k and v rows lie: each an f32 row per step row, and the elements
/// from one token's row to the next (0 where each is packed apart).
#[derive(Clone, Copy)]
pub(crate) struct QkvRows {
    pub q: Operand,
    pub k: Operand,
    pub v: Operand,
    pub token_stride: u32,
}

impl<'a> StepBuilder<'a> {
    /// The step's sizes, KV layout and the buffers the host touches (live for the whole
    /// step).
    fn new(
        c: &'a ModelConfig,
        catalog: &'a Catalog,
        w: &'a ModelWeights,
        shape: StepShape,
        multiprocessors: u32,
        products: Products,
        rank: bool,
    ) -> Result<Self, GpuError> {
        let max_batch = u32_of("rows a step", shape.max_batch.max(1))?;
        let per_row = |width: usize, bytes: u64| max_batch as u64 * width as u64 * bytes;
        let context = u32_of("context", shape.context.max(1))?;
        let group = u32_of("heads per kv head", c.heads / c.kv_heads)?;
        let elem = kv_elem(shape.kv);
        let (threads, split, max_blocks) =
            attention_shape(u32_of("head_dim", c.head_dim)?, group, context, elem)?;
        let n_blocks = u32_of(
            "KV cache blocks",
            shape.sessions.max(1) * context.div_ceil(BLOCK_TOKENS) as usize,
        )?;
        let kv_width = (c.kv_heads * c.head_dim) as u64;
        let kv = KvLayout {
            n_blocks,
            max_blocks,
            layer_bytes: n_blocks as u64 * kv_width * BLOCK_TOKENS as u64 * elem.size() as u64,
            elem,
        };
        let mut a = Assembler::default();
        let record = StepRecord {
            max_batch: max_batch as usize,
        };
        let mut host = |name: &str, bytes: u64| a.buffer(name.into(), bytes, true);
        let io = HostIo {
            step: host("step record", record.bytes()),
            table: host("block tables", per_row(max_blocks as usize, 4)),
            logits: host("logits", per_row(c.vocab, 4)),
            zeros: host("attention split counters", per_row(c.kv_heads, 4)),
            next: c
                .vocab
                .is_multiple_of(4)
                .then(|| host("next tokens", per_row(1, 4))),
            residual: host("residual", per_row(c.hidden, 4)),
            partial: rank.then(|| host("partial sums", per_row(c.hidden, 4))),
        };
        let residual = at(Region::Act(io.residual), 0);
        Ok(StepBuilder {
            a,
            c,
            catalog,
            w,
            max_batch,
            multiprocessors: multiprocessors.max(1),
            products,
            kv,
            context,
            attention: (threads, split),
            io,
            record,
            residual,
            tensor_core_products: 0,
            reductions: vec![],
        })
    }

    /// Bytes of a buffer of `width` elements of `bytes` each, a row per step row.
    fn per_row(&self, width: usize, bytes: u64) -> u64 {
        self.max_batch as u64 * width as u64 * bytes
    }

    /// A buffer for the step's rows, live while its readers run.
    fn region(&mut self, name: String, width: usize, bytes: u64) -> Region {
        let bytes = self.per_row(width, bytes);
        Region::Act(self.a.buffer(name, bytes, false))
    }

    /// The start of a new [`StepBuilder::region`].
    fn buffer(&mut self, name: String, width: usize, bytes: u64) -> Operand {
        at(self.region(name, width, bytes), 0)
    }

    /// Part `i` of the step record (0 tokens, 1 positions, 2 context lengths, 3 row
    /// indices).
    fn record_part(&self, i: u64) -> Operand {
        at(Region::Act(self.io.step), self.record.part(i))
    }

    fn block_tables(&self) -> Operand {
        at(Region::Act(self.io.table), 0)
    }

    /// `R = table[token]`, a block per row.
    fn embed(&mut self) -> Result<(), GpuError> {
        let ep = embed_params(self.catalog, self.c.hidden)?;
        let k = self.a.kernel("token embedding", &ep, embed::build)?;
        let args = vec![
            self.record_part(0),
            self.w.part(self.w.embedding, 0),
            self.residual,
            Operand::Value(Arg::U32(u32_of("vocab", self.c.vocab)?)),
        ];
        let grid = Grid::PerRow(ep.launch(1), 0);
        self.a
            .push(Rows::Any, "token embedding".into(), k, grid, args);
        self.reduce(Reduction::Gather);
        Ok(())
    }

    /// Where the output and down projections put their products: added to the residual
    /// in place, or (a tensor-parallel rank) written apart for the host to sum.
    fn residual_update(&self) -> (Option<(Operand, Addend)>, Operand) {
        match self.io.partial {
            Some(partial) => (None, at(Region::Act(partial), 0)),
            None => (Some((self.residual, Addend::Residual)), self.residual),
        }
    }

    /// Ends a tensor-parallel rank's segment of the step here.
    fn reduce(&mut self, r: Reduction) {
        if self.io.partial.is_some() {
            self.reductions.push((self.a.dispatches.len(), r));
        }
    }

    /// Layer `l`'s dispatches: the attention block, then the feed-forward block.
    fn layer(&mut self, l: usize) -> Result<(), GpuError> {
        let catalog = self.catalog;
        let lk = &catalog.layers[l];
        let lw = self.w.layers[l];
        let prefix = format!("layer {l}: ");
        let (hidden, q_width) = (self.c.hidden, self.c.heads * self.c.head_dim);
        let qkv = self.qkv_rows(l, lk.qkv)?;
        let formats = match &lk.qkv {
            Qkv::Fused(f) => std::slice::from_ref(f),
            Qkv::Separate(fs) => fs,
        };
        let weight = self.w.part(lw.norms, 0);
        let attn_norm = Input::Normed(self.norm(&prefix, "attention norm", weight, formats)?);
        self.qkv_projection(&prefix, lk.qkv, lw, &attn_norm, qkv)?;
        let rows = RopeRows {
            seq: self.record_part(3),
            pos: self.record_part(1),
            table: self.block_tables(),
            context: self.context,
        };
        let (what, k, launch, args) =
            rope_append_dispatch(&mut self.a, self.c, catalog, self.w, l, self.kv, qkv, rows)?;
        self.a.push(
            Rows::Any,
            format!("{prefix}{what}"),
            k,
            Grid::PerRow(launch, 0),
            args,
        );
        let attn = self.attention(l, qkv)?;
        let (addend, out) = self.residual_update();
        self.gemv(
            &prefix,
            "output projection",
            lk.attn_output,
            hidden,
            q_width,
            &[self.w.part(lw.attn_output, 0)],
            &Input::Plain(attn),
            addend,
            out,
        )?;
        self.reduce(Reduction::Sum);
        self.ffn(&prefix, l)
    }

    /// The layer's q, k and v buffers: one projection writes each row's q|k|v back to
    /// back, which RoPE and the attention read in place; three write them apart, each
    /// packed.
    fn qkv_rows(&mut self, l: usize, qkv: Qkv) -> Result<QkvRows, GpuError> {
        let (q_width, kv_width) = (
            self.c.heads * self.c.head_dim,
            self.c.kv_heads * self.c.head_dim,
        );
        Ok(match qkv {
            Qkv::Fused(_) => {
                let width = q_width + 2 * kv_width;
                let r = self.region(format!("layer {l} q|k|v"), width, 4);
                QkvRows {
                    q: at(r, 0),
                    k: at(r, 4 * q_width as u64),
                    v: at(r, 4 * (q_width + kv_width) as u64),
                    token_stride: u32_of("q|k|v width", width)?,
                }
            }
            Qkv::Separate(_) => QkvRows {
                q: self.buffer(format!("layer {l} q"), q_width, 4),
                k: self.buffer(format!("layer {l} k"), kv_width, 4),
                v: self.buffer(format!("layer {l} v"), kv_width, 4),
                token_stride: 0,
            },
        })
    }

    /// q, k and v (plus their biases) from the normalized input: one product over the
    /// three matrices back to back, or three where their formats differ.
    fn qkv_projection(
        &mut self,
        prefix: &str,
        qkv: Qkv,
        lw: LayerWeights,
        x: &Input,
        out: QkvRows,
    ) -> Result<(), GpuError> {
        let (hidden, q_width, kv_width) = (
            self.c.hidden,
            self.c.heads * self.c.head_dim,
            self.c.kv_heads * self.c.head_dim,
        );
        let bias = |i: usize| lw.qkv_bias.map(|b| (self.w.part(b, i), Addend::Bias));
        match qkv {
            Qkv::Fused(f) => self.gemv(
                prefix,
                "q|k|v projection",
                f,
                q_width + 2 * kv_width,
                hidden,
                &[self.w.part(lw.qkv, 0)],
                x,
                // The biases' parts lie back to back: one row of q|k|v biases.
                bias(0),
                out.q,
            ),
            Qkv::Separate(formats) => {
                let rows = [q_width, kv_width, kv_width];
                let ys = [out.q, out.k, out.v];
                for (i, what) in ["q", "k", "v"].iter().enumerate() {
                    self.gemv(
                        prefix,
                        &format!("{what} projection"),
                        formats[i],
                        rows[i],
                        hidden,
                        &[self.w.part(lw.qkv, i)],
                        x,
                        bias(i),
                        ys[i],
                    )?;
                }
                Ok(())
            }
        }
    }

    /// Decode attention over the cache, its splits merged by the last to finish; returns
    /// the attention output (`[rows, q width]`).
    fn attention(&mut self, l: usize, qkv: QkvRows) -> Result<Operand, GpuError> {
        let c = self.c;
        let (threads, split) = self.attention;
        let hd = c.head_dim;
        let dp = DecodeParams {
            head_dim: u32_of("head_dim", hd)?,
            n_heads: u32_of("heads", c.heads)?,
            n_kv_heads: u32_of("kv_heads", c.kv_heads)?,
            max_blocks: self.kv.max_blocks,
            split,
            threads,
            kv: self.kv.elem,
            merge: true,
            q_stride: qkv.token_stride,
        };
        let splits = dp.n_splits() as usize;
        let part_m = self.buffer(format!("layer {l} split maxima"), c.heads * splits, 4);
        let part_l = self.buffer(format!("layer {l} split sums"), c.heads * splits, 4);
        let part_o = self.buffer(format!("layer {l} split outputs"), c.heads * splits * hd, 4);
        let attn = self.buffer(
            format!("layer {l} attention output"),
            c.heads * hd,
            ACT_BYTES,
        );
        let label = format!("layer {l}: attention");
        let k = self.a.kernel(&label, &dp, attn_decode::build)?;
        let scale = Operand::Value(Arg::F32((1.0 / (hd as f64).sqrt()) as f32));
        let args = vec![
            qkv.q,
            at(Region::KCache(l), 0),
            at(Region::VCache(l), 0),
            self.block_tables(),
            self.record_part(2),
            part_m,
            part_l,
            part_o,
            at(Region::Act(self.io.zeros), 0),
            attn,
            scale,
        ];
        self.a
            .push(Rows::Any, label, k, Grid::PerRow(dp.launch(1), 1), args);
        Ok(attn)
    }

    /// `R += W_down·(silu(W_gate·xf)·(W_up·xf))`, `xf = norm(R)·w_ffn`.
    fn ffn(&mut self, prefix: &str, l: usize) -> Result<(), GpuError> {
        let catalog = self.catalog;
        let lk = &catalog.layers[l];
        let lw = self.w.layers[l];
        let (hidden, ffn) = (self.c.hidden, self.c.ffn);
        let hidden_rows = self.buffer(format!("layer {l} ffn hidden"), ffn, ACT_BYTES);
        let weight = self.w.part(lw.norms, 1);
        let ffn_norm = Input::Normed(self.norm(prefix, "ffn norm", weight, &[lk.gate_up])?);
        self.gemv(
            prefix,
            "gate/up + SwiGLU",
            lk.gate_up,
            ffn,
            hidden,
            &[self.w.part(lw.gate_up, 0), self.w.part(lw.gate_up, 1)],
            &ffn_norm,
            None,
            hidden_rows,
        )?;
        let (addend, out) = self.residual_update();
        self.gemv(
            prefix,
            "down projection",
            lk.down,
            hidden,
            ffn,
            &[self.w.part(lw.down, 0)],
            &Input::Plain(hidden_rows),
            addend,
            out,
        )?;
        self.reduce(Reduction::Sum);
        Ok(())
    }

    /// `logits = W_out·(norm(R)·w_out)`, then (where the vocabulary suits the kernel) each
    /// row's largest logit.
    fn head(&mut self) -> Result<(), GpuError> {
        let (c, catalog) = (self.c, self.catalog);
        let logits = at(Region::Act(self.io.logits), 0);
        let weight = self.w.part(self.w.output_norm, 0);
        let normed = Input::Normed(self.norm("", "output norm", weight, &[catalog.output])?);
        self.gemv(
            "",
            "LM head",
            catalog.output,
            c.vocab,
            c.hidden,
            &[self.w.part(self.w.head, 0)],
            &normed,
            None,
            logits,
        )?;
        if let Some(next) = self.io.next {
            let cols = u32_of("vocab", c.vocab)?;
            let p = ArgmaxParams {
                cols,
                threads: row_threads(cols / 4).max(128),
            };
            let k = self.a.kernel("argmax", &p, argmax::build)?;
            let args = vec![logits, at(Region::Act(next), 0)];
            self.a.push(
                Rows::Any,
                "argmax".into(),
                k,
                Grid::PerRow(p.launch(1), 0),
                args,
            );
        }
        Ok(())
    }

    /// The residual stream normalized by the RMSNorm `weight`, for the products that
    /// read it ([`Input::Normed`]); steps of several rows normalize it here, with a
    /// dispatch of their own, into a buffer of the arena, and so do one-row steps where a
    /// tensor-core product reads it (`readers`: the products' formats). `what` names the
    /// norm in labels, after `prefix`.
    fn norm(
        &mut self,
        prefix: &str,
        what: &str,
        weight: Operand,
        readers: &[WeightFormat],
    ) -> Result<Normed, GpuError> {
        let (cols, eps) = (self.c.hidden, self.c.norm_eps as f32);
        let residual = self.residual;
        let tensor_cores = readers.iter().any(|&f| self.takes_tensor_cores(f, cols));
        let rows = if self.max_batch > 1 || tensor_cores {
            let label = format!("{prefix}{what}");
            let buffer = self.buffer(format!("{label}: normalized rows"), cols, 4);
            // As many threads as walk the prologue's sum: the same order, the same bits.
            let p = RmsNormRowsParams {
                cols: u32_of("hidden", cols)?,
                threads: NORM_THREADS,
            };
            let k = self.a.kernel(&label, &p, rmsnorm_rows::build)?;
            let args = vec![residual, weight, buffer, Operand::Value(Arg::F32(eps))];
            // Tensor-core products read the normalized rows at every row count.
            let steps = if tensor_cores { Rows::Any } else { Rows::Many };
            self.a
                .push(steps, label, k, Grid::PerRow(p.launch(1), 0), args);
            Some(buffer)
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
        // The integer Q6_K products read each matrix in 4-byte words from its start: a
        // matrix placed after another of an odd number of odd-length rows (an odd FFN
        // width) would start between words.
        let unaligned = w.iter().any(|op| match op {
            Operand::At(_, Offset::Fixed(bytes)) => bytes % 4 != 0,
            _ => false,
        });
        if format == WeightFormat::Q6K && unaligned {
            return Err(GpuError::Unsupported {
                what: label,
                reason: "a Q6_K matrix that starts between 4-byte words (an odd number of \
                         rows of an odd number of super-blocks before it)"
                    .into(),
            });
        }
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
            // A Q6_K piece loads 21 words a row (its unaligned runs a word wider): two
            // pieces in flight spill the SwiGLU product's registers.
            unroll: match format {
                _ if format.is_float() => 4,
                WeightFormat::Q6K => 1,
                _ => 2,
            },
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
                let k = self.a.kernel(&label, &tc, gemv_tc::build)?;
                let grid = Grid::Once(tc.launch());
                self.tensor_core_products += usize::from(steps.includes(1));
                self.a.push(steps, label.clone(), k, grid, args(x, None));
            }
            return Ok(());
        }
        let k = self.a.kernel(&label, &p, qgemv::build)?;
        let one_args = args(one_x, one_norm);
        let Some(many_x) = many_x.filter(|_| self.max_batch > 1) else {
            // Every step takes one row.
            self.a
                .push(Rows::Any, label, k, Grid::Once(p.launch()), one_args);
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
        let kw = self.a.kernel(&wide_label, &pw, qgemv::build)?;
        self.a
            .push(Rows::One, label, k, Grid::Once(p.launch()), one_args);
        let many_args = args(many_x, None);
        self.a.push(
            Rows::Many,
            wide_label,
            kw,
            Grid::Once(pw.launch()),
            many_args,
        );
        Ok(())
    }

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

/// Where RoPE + KV append finds each row's sequence (its block-table row), position and
/// block table, and the positions the RoPE tables cover.
pub(crate) struct RopeRows {
    pub seq: Operand,
    pub pos: Operand,
    pub table: Operand,
    pub context: u32,
}

/// Layer `l`'s RoPE (qwen3: the per-head q/k norms first) and KV append over `qkv`, for
/// the decode step and the prompt chunk alike: what it does (for its label), its kernel,
/// its launch for one row (a block per row) and its arguments.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rope_append_dispatch(
    a: &mut Assembler,
    c: &ModelConfig,
    catalog: &Catalog,
    w: &ModelWeights,
    l: usize,
    kv: KvLayout,
    qkv: QkvRows,
    rows: RopeRows,
) -> Result<(&'static str, usize, Launch, Vec<Operand>), GpuError> {
    let rp = rope_append_params(c, catalog, kv.max_blocks, qkv.token_stride, kv.elem)?;
    let mut args = vec![
        qkv.q,
        qkv.k,
        qkv.v,
        rows.seq,
        rows.pos,
        rows.table,
        w.part(w.rope, 0),
        w.part(w.rope, 1),
        Operand::Value(Arg::U32(rows.context)),
        at(Region::KCache(l), 0),
        at(Region::VCache(l), 0),
    ];
    if let Some(qk) = w.layers[l].qk_norm {
        args.extend([
            w.part(qk, 0),
            w.part(qk, 1),
            Operand::Value(Arg::F32(c.norm_eps as f32)),
        ]);
    }
    let what = match c.qk_norm {
        true => "q/k norm + rope + kv append",
        false => "rope + kv append",
    };
    let k = a.kernel(&format!("layer {l}: {what}"), &rp, rope_append::build)?;
    Ok((what, k, rp.launch(1), args))
}

/// The 8-row tiles a pass of each tensor-core variant takes: a step of `n` rows runs the
/// first with `8 · tiles ≥ n`.
const TC_TILES: [u32; 4] = [1, 2, 4, 8];

/// Warps of a matrix–vector block (but see [`gemv_shape`]).
const GEMV_WARPS: u32 = 4;

/// The integer formats' products (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) stage the whole
/// input vector, quantized, in every block before its rows
/// ([`quench_kernels::qgemv::integer`]), and one thread quantizes each 32-element block:
/// fewer, wider blocks spend less of the product on it where the input is normalized
/// first or long. Measured on an H200 over warps 4/8/16 × 1/2/4/8 blocks a
/// multiprocessor (receipts/kernel-perf-q4k-sweep-*.json, llama-3.1-8b's Q4_K products):
/// one block of 8 warps a multiprocessor (16 warps past 8192 columns) is within 4% of the
/// fastest shape of q|k|v, gate|up and down, and 1.1–1.7× faster than 4 warps × 8; the
/// output projection (4096 columns, no norm) keeps 4 × 8, and so do rows of fewer than
/// 2048 columns, whose staging is short (SmolLM2's 576).
pub(crate) fn gemv_shape(
    format: WeightFormat,
    cols: usize,
    normed: bool,
    multiprocessors: u32,
) -> (u32, u32) {
    if format.is_integer() && cols > 8192 {
        (16, multiprocessors)
    } else if format.is_integer() && normed && cols >= 2048 {
        (8, multiprocessors)
    } else {
        (GEMV_WARPS, gemv_blocks(multiprocessors))
    }
}

/// What a matrix–vector product multiplies.
enum Input {
    /// Activations as they are (a row per step row).
    Plain(Operand),
    /// The residual stream under an RMSNorm ([`StepBuilder::norm`]).
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
        let split = false;
        Self::assemble_split(
            config,
            catalog,
            src,
            naming,
            shape,
            multiprocessors,
            products,
            split,
        )
    }

    /// As [`DecodeGraph::assemble_with`]; with `split`, the step of one tensor-parallel
    /// rank (`config` is the rank's share of the model): it stops at each
    /// [`DecodeGraph::reductions`] point for the ranks' rows to be combined.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn assemble_split(
        config: &ModelConfig,
        catalog: &Catalog,
        src: &dyn StoredTensors,
        naming: Naming,
        shape: StepShape,
        multiprocessors: u32,
        products: Products,
        split: bool,
    ) -> Result<DecodeGraph, GpuError> {
        let context = u32_of("context", shape.context.max(1))?;
        let weights = ModelWeights::gather(config, catalog, src, naming, context)?;
        let mut s = StepBuilder::new(
            config,
            catalog,
            &weights,
            shape,
            multiprocessors,
            products,
            split,
        )?;
        s.embed()?;
        let mut layer_dispatches = Vec::with_capacity(catalog.layers.len());
        for l in 0..catalog.layers.len() {
            let before = s.a.dispatches.len();
            s.layer(l)?;
            let one_row = s.a.dispatches[before..]
                .iter()
                .filter(|d| d.rows.includes(1))
                .count();
            layer_dispatches.push(one_row);
        }
        s.head()?;
        let StepBuilder {
            a,
            kv,
            io,
            record,
            multiprocessors,
            tensor_core_products,
            reductions,
            ..
        } = s;
        let program = a.finish();
        Ok(DecodeGraph {
            weight_bytes_per_token: weights.bytes_per_token(),
            kernels: program.kernels,
            dispatches: program.dispatches,
            layer_dispatches,
            kv,
            activations: program.buffers,
            weights,
            io,
            record,
            multiprocessors,
            context,
            tensor_core_products,
            reductions,
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
        super::listing::lines(
            self.step(rows),
            &self.kernels,
            &self.activations,
            self,
            rows,
        )
    }

    /// A region by what it holds.
    pub(crate) fn region_text(&self, r: Region) -> String {
        match r {
            Region::Act(i) | Region::Step(i) => self.activations[i].name.clone(),
            Region::Weights(g) => super::listing::group(&self.weights.groups[g]),
            Region::KCache(l) => format!("layer {l} keys"),
            Region::VCache(l) => format!("layer {l} values"),
        }
    }

    /// Bytes of all weights and constants.
    pub fn weight_bytes(&self) -> u64 {
        self.weights.bytes()
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
    fn matrix_vector_grids_follow_the_format_and_the_width() {
        let sms = 132;
        let narrow = (GEMV_WARPS, gemv_blocks(sms));
        for f in [WeightFormat::Q4K, WeightFormat::Q6K, WeightFormat::Q8_0] {
            assert_eq!(gemv_shape(f, 4096, true, sms), (8, sms), "{f:?} normalized");
            assert_eq!(gemv_shape(f, 14336, false, sms), (16, sms), "{f:?} long");
            assert_eq!(gemv_shape(f, 4096, false, sms), narrow, "{f:?} plain");
            assert_eq!(gemv_shape(f, 576, true, sms), narrow, "{f:?} narrow rows");
        }
        for f in [WeightFormat::BF16, WeightFormat::Q3K] {
            assert_eq!(gemv_shape(f, 4096, true, sms), narrow, "{f:?}");
            assert_eq!(gemv_shape(f, 14336, false, sms), narrow, "{f:?}");
        }
    }

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
