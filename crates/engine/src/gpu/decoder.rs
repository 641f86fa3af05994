//! The decoder on a device: weights uploaded as stored, the arena and KV cache allocated
//! once, the decode step captured as a graph (once per row count used) and replayed per
//! step. A step decodes one token for each of up to `max_batch` sessions, its rows.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use quench_ir::Function;
use quench_models::arch::{ModelConfig, Naming};
use quench_rt::{
    native::NativeExecutor, Codegen, CudaExecutor, DevicePtr, Executor, GraphId, InterpExecutor,
    KernelId, StreamId,
};

mod rank;

pub(crate) use rank::{RankBuffer, Stage};

use super::arena;
use super::catalog::{Catalog, Widened};
use super::error::{size, GpuError};
use super::graph::{
    u32_of, DecodeGraph, Products, Reduction, StepRecord, StepShape, DEFAULT_MULTIPROCESSORS,
};
use super::kv::{BlockPool, GpuSession};
use super::masking::Masking;
use super::plan::{resolve, Grid, Region, Resolved, Rows, Slot};
use super::prefill::{self, PrefillPlan};
use super::profile;
use super::stored::{self, StoredTensors};
use super::weights::WeightData;
use crate::backend::Fed;
use crate::generate::constrain::apply_mask;
use crate::options::KvCache;

static NEXT_MODEL: AtomicU64 = AtomicU64::new(1);

/// Without an explicit limit, a session holds the model's context up to this many
/// positions (long-context models would otherwise reserve their whole trained context).
pub const DEFAULT_CONTEXT: usize = 8192;

/// Device memory the driver, the compiled kernels and the graph need beside the model.
const CUDA_RESERVE: u64 = 1 << 30;

/// Where the kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// An NVIDIA GPU through the driver.
    Cuda { ordinal: u32, codegen: Codegen },
    /// An NVIDIA GPU through quench's own driver over the kernel module (no libcuda).
    Native { ordinal: u32, codegen: Codegen },
    /// quench's kernel interpreter on the CPU (slow; for checking without a GPU).
    Interp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuOptions {
    /// Most positions one session holds; `None`: the model's own limit, at most
    /// [`DEFAULT_CONTEXT`]. Never above the model's limit.
    pub context: Option<usize>,
    /// Sessions whose full contexts the KV cache holds at once.
    pub sessions: usize,
    /// Capture the decode step once and replay it (otherwise each dispatch is launched
    /// every step).
    pub capture: bool,
    /// Device memory to fit in, in place of what the device reports.
    pub memory_limit: Option<u64>,
    /// Most sessions one step decodes ([`GpuDecoder::step_batch`]): the activations hold
    /// this many rows.
    pub max_batch: usize,
    /// Most tokens of a prompt one chunk of the prompt path takes (its activations are
    /// sized for this many rows); 0 feeds prompts one decode step per token. The default,
    /// [`DEFAULT_PREFILL_CHUNK`], suits most models and devices.
    pub prefill_chunk: usize,
    /// Feeds of fewer tokens take decode steps (a single token always does).
    pub prefill_min_tokens: usize,
    /// Multiply bf16 matrices on the tensor cores at every step ([`Products::TensorCore`]):
    /// the weights are read once for up to 64 rows, so steps of many rows cost little more
    /// than steps of one, and a row's logits keep the same bits whatever shares its step.
    /// Off by default: one-row steps take the matrix–vector kernels, slightly faster at one
    /// row. Matrices in other formats take the matrix–vector kernels either way.
    pub tensor_core_decode: bool,
    /// The element type of the KV cache.
    pub kv_cache: KvCache,
}

/// Tokens per prompt chunk unless told otherwise.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;
/// The shortest feed that takes the prompt path unless told otherwise: one chunk of two
/// tokens reads the weights once, two decode steps twice.
pub const DEFAULT_PREFILL_MIN_TOKENS: usize = 2;

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            context: None,
            sessions: 1,
            capture: true,
            memory_limit: None,
            max_batch: 1,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            prefill_min_tokens: DEFAULT_PREFILL_MIN_TOKENS,
            tensor_core_decode: false,
            kv_cache: KvCache::F16,
        }
    }
}

/// What was put on the device and what one step costs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSummary {
    /// `cuda` or `interp`.
    pub backend: &'static str,
    pub device: String,
    /// Dispatches of a one-row step.
    pub dispatches_per_token: usize,
    /// Dispatches of each layer in a one-row step.
    pub layer_dispatches: Vec<usize>,
    /// The labels of layer 0's dispatches in a one-row step, in order.
    pub layer_plan: Vec<String>,
    /// Dispatches of a step of several rows (the norms apart from the products that read
    /// them); `None` where a step takes one row at most.
    pub batch_dispatches_per_step: Option<usize>,
    /// The labels of layer 0's dispatches in a step of several rows (empty where a step
    /// takes one row at most).
    pub batch_layer_plan: Vec<String>,
    /// Distinct kernels compiled.
    pub kernels: usize,
    /// Weights as stored, plus RoPE tables and widened norm weights.
    pub weight_bytes: u64,
    /// Weight bytes one decode step reads.
    pub weight_bytes_per_token: u64,
    pub arena_bytes: u64,
    /// What the activations would take without sharing.
    pub activation_bytes: u64,
    pub kv_cache_bytes: u64,
    /// The KV cache's element type.
    pub kv_cache: KvCache,
    /// Positions one session holds.
    pub context: usize,
    /// Most sessions one step decodes.
    pub max_batch: usize,
    pub graph_captured: bool,
    /// Most tokens of a prompt one chunk takes; 0 where prompts are fed token by token.
    pub prefill_chunk: usize,
    /// The shortest feed that takes the prompt path.
    pub prefill_min_tokens: usize,
    /// Dispatches of one prompt chunk.
    pub prefill_dispatches: usize,
    /// The labels of layer 0's dispatches in a prompt chunk.
    pub prefill_layer_plan: Vec<String>,
    /// Bytes of the prompt path's activations.
    pub prefill_arena_bytes: u64,
    /// Matrix products of a prompt chunk on Hopper's `wgmma` (the others on `mma.sync`).
    pub prefill_wgmma_products: usize,
    /// Products of a step on the tensor cores: 0 unless
    /// [`GpuOptions::tensor_core_decode`] is on and the model has bf16 matrices.
    pub tensor_core_products: usize,
    /// The tensors stored in a type no GPU kernel reads, expanded to f16 as they were
    /// uploaded (see [`super::Catalog::widened`]).
    pub widened: Vec<Widened>,
}

/// Per row of a step, a grammar's mask of the tokens allowed next, or none.
type RowMasks<'a> = &'a dyn Fn() -> Vec<Option<Vec<u32>>>;

/// What a step reads back.
#[derive(Clone, Copy)]
enum Read<'a> {
    Nothing,
    /// The logits of the rows marked.
    Logits(&'a [bool]),
    /// The device's argmax of each row's logits.
    Next,
    /// The logits of the rows marked in `logits`, and the greedy next token of the rows
    /// marked in `picks`, each under its mask (asked for once the step's kernels are
    /// submitted): on the device where it has the argmax kernel, else on the host.
    Picked {
        logits: &'a [bool],
        picks: &'a [bool],
        masks: RowMasks<'a>,
    },
}

enum Out {
    Nothing,
    /// Per row: its logits, where they were read.
    Logits(Vec<Option<Vec<f32>>>),
    Next(Vec<u32>),
    /// Per row: its logits where they were read, its next token where it was picked.
    Picked(Vec<Option<Vec<f32>>>, Vec<Option<u32>>),
}

impl Out {
    fn name(&self) -> &'static str {
        match self {
            Out::Nothing => "nothing",
            Out::Logits(_) => "logits",
            Out::Next(_) => "next tokens",
            Out::Picked(..) => "logits and tokens picked",
        }
    }

    /// Adds the tokens read back (picked on the device) to the profile, if one is on.
    fn record_tokens(&self) {
        match self {
            Out::Next(t) => profile::record_tokens(t),
            Out::Picked(_, picked) => {
                profile::record_tokens(&picked.iter().flatten().copied().collect::<Vec<_>>())
            }
            Out::Nothing | Out::Logits(_) => {}
        }
    }

    /// Per row, what was read of it: its logits or the token picked.
    fn rows(self, n: usize) -> Vec<Option<Fed>> {
        match self {
            Out::Nothing => vec![None; n],
            Out::Logits(rows) => rows.into_iter().map(|r| r.map(Fed::Logits)).collect(),
            Out::Next(next) => next.into_iter().map(|t| Some(Fed::Token(t))).collect(),
            Out::Picked(logits, next) => logits
                .into_iter()
                .zip(next)
                .map(|(l, t)| t.map(Fed::Token).or(l.map(Fed::Logits)))
                .collect(),
        }
    }

    /// Every row's logits (all of them read).
    fn logits(self) -> Result<Vec<Vec<f32>>, GpuError> {
        match self {
            Out::Logits(rows) => rows
                .into_iter()
                .enumerate()
                .map(|(i, r)| r.ok_or_else(|| unread(i)))
                .collect(),
            other => Err(GpuError::Internal(format!(
                "a step read back {} where logits were asked for",
                other.name()
            ))),
        }
    }

    /// Every row's next token.
    fn next(self) -> Result<Vec<u32>, GpuError> {
        match self {
            Out::Next(next) => Ok(next),
            other => Err(GpuError::Internal(format!(
                "a step read back {} where next tokens were asked for",
                other.name()
            ))),
        }
    }
}

fn unread(row: usize) -> GpuError {
    GpuError::Internal(format!("row {row}'s logits were asked for but not read"))
}

/// The only element of what a one-row feed read back.
fn only<T>(mut rows: Vec<T>) -> Result<T, GpuError> {
    match (rows.pop(), rows.is_empty()) {
        (Some(row), true) => Ok(row),
        _ => Err(GpuError::Internal(format!(
            "a one-row feed read back {} rows",
            rows.len() + 1
        ))),
    }
}

/// Each row's greedy next token from its logits, read where the device has no argmax.
fn greedy(logits: Vec<Option<Vec<f32>>>) -> Result<Vec<u32>, GpuError> {
    logits
        .into_iter()
        .enumerate()
        .map(|(row, l)| {
            let l = l.ok_or_else(|| unread(row))?;
            crate::generate::argmax(&l).ok_or(GpuError::BadLogits { row })
        })
        .collect()
}

/// The dispatches of a step and, when steps replay graphs, the step captured per row
/// count.
struct StepLaunches {
    launches: Vec<Resolved>,
    /// The captured step of `i + 1` rows, once a step of that many has run.
    graphs: Vec<Option<GraphId>>,
}

/// The executor and everything allocated on it. One step runs at a time.
struct OnDevice {
    /// The executor and the memory allocated on it (freed last).
    mem: DeviceMemory,
    /// The step's dispatches: instrumented where every step is profiled, else plain.
    step: StepLaunches,
    /// The instrumented step, where profiling instruments one step in several.
    sampled: Option<StepLaunches>,
    /// Whether steps replay captured graphs (else each dispatch is launched).
    capture: bool,
    io: HostAddrs,
    record: StepRecord,
    /// Bytes of one row of the block tables.
    table_row: u64,
    /// Per row: the session (id, table version) whose block table the device holds.
    resident: Vec<Option<(u64, u64)>>,
    /// The ring and records of a decoder loaded while profiling.
    profile: Option<profile::Instrumented>,
    /// The prompt path, where the model's formats and shapes allow it.
    prefill: Option<prefill::OnDevice>,
    /// Grammar masks applied on the device, where the vocabulary suits the argmax kernel.
    masking: Option<Masking>,
    /// A tensor-parallel rank's segment ends ([`DecodeGraph::reductions`]).
    reductions: Vec<(usize, Reduction)>,
    /// A rank's segments captured, by (rows, segment), once each has run.
    segment_graphs: HashMap<(u32, usize), GraphId>,
}

impl Drop for OnDevice {
    fn drop(&mut self) {
        // Best effort: the executor itself releases everything when it goes. The memory
        // goes after this, with `mem`.
        let exec = &mut *self.mem.exec;
        let sampled = self.sampled.iter_mut().flat_map(|s| s.graphs.drain(..));
        let segments = self.segment_graphs.drain().map(|(_, g)| Some(g));
        for g in self
            .step
            .graphs
            .drain(..)
            .chain(sampled)
            .chain(segments)
            .flatten()
        {
            let _ = exec.release_graph(g);
        }
        if let Some(p) = self.profile.take() {
            p.release(exec);
        }
    }
}

/// An executor and the device memory allocated on it, freed when this goes: on every
/// error path of a load, and with the decoder.
pub(crate) struct DeviceMemory {
    pub exec: Box<dyn Executor + Send>,
    allocations: Vec<DevicePtr>,
}

impl DeviceMemory {
    /// `bytes` of device memory (at least one), named `what` in an error.
    pub fn alloc(&mut self, bytes: u64, what: &str) -> Result<DevicePtr, GpuError> {
        let p = self
            .exec
            .alloc(bytes.max(1))
            .map_err(GpuError::runtime(format!(
                "allocating {what} ({})",
                size(bytes)
            )))?;
        self.allocations.push(p);
        Ok(p)
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        for p in self.allocations.drain(..) {
            let _ = self.exec.free(p);
        }
    }
}

/// A decoder (llama, qwen2, qwen3) whose weights, KV cache and decode step live on a
/// device. `Send + Sync`: steps take turns on the device; one step decodes a token for
/// each of up to [`GpuDecoder::max_batch`] sessions at once, and a session's logits have
/// the same bits whichever sessions share its steps.
pub struct GpuDecoder {
    id: u64,
    config: ModelConfig,
    catalog: Catalog,
    summary: GpuSummary,
    pool: Arc<Mutex<BlockPool>>,
    device: Mutex<OnDevice>,
}

impl std::fmt::Debug for GpuDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuDecoder")
            .field("arch", &self.config.arch)
            .field("summary", &self.summary)
            .finish_non_exhaustive()
    }
}

/// The decode step `options` ask for, on a device of `multiprocessors`, and the sizes it
/// was built for; with `rank`, a tensor-parallel rank's step
/// ([`DecodeGraph::reductions`]).
pub(crate) fn assemble_step(
    config: &ModelConfig,
    catalog: &Catalog,
    src: &dyn StoredTensors,
    naming: Naming,
    options: &GpuOptions,
    multiprocessors: u32,
    rank: bool,
) -> Result<(StepShape, DecodeGraph), GpuError> {
    let shape = StepShape {
        context: context_of(config, options),
        sessions: options.sessions.max(1),
        max_batch: options.max_batch.max(1),
        kv: options.kv_cache,
    };
    let products = match options.tensor_core_decode {
        true => Products::TensorCore,
        false => Products::Gemv,
    };
    let graph = DecodeGraph::assemble_split(
        config,
        catalog,
        src,
        naming,
        shape,
        multiprocessors,
        products,
        rank,
    )?;
    Ok((shape, graph))
}

/// Positions one session holds: as asked, else the model's own limit up to
/// [`DEFAULT_CONTEXT`]; never above the model's limit.
fn context_of(config: &ModelConfig, options: &GpuOptions) -> usize {
    options
        .context
        .unwrap_or(DEFAULT_CONTEXT)
        .min(config.max_positions)
        .max(1)
}

/// Opens the executor of `backend` and the device memory it offers.
pub(crate) fn open(backend: Backend) -> Result<(Box<dyn Executor + Send>, Option<u64>), GpuError> {
    match backend {
        Backend::Cuda { ordinal, codegen } => {
            let mut exec = CudaExecutor::new(ordinal)
                .map_err(GpuError::runtime(format!("opening CUDA device {ordinal}")))?;
            exec.set_codegen(codegen);
            let total = exec.info().total_memory_bytes;
            Ok((Box::new(exec), Some(total.saturating_sub(CUDA_RESERVE))))
        }
        Backend::Native { ordinal, codegen } => {
            let mut exec = NativeExecutor::open(ordinal).map_err(GpuError::runtime(format!(
                "opening GPU {ordinal} through the kernel module"
            )))?;
            exec.set_codegen(codegen);
            let total = exec.heap_bytes();
            Ok((Box::new(exec), Some(total.saturating_sub(CUDA_RESERVE))))
        }
        Backend::Interp => Ok((Box::new(InterpExecutor::new()), None)),
    }
}

/// The decoder planned before anything is allocated: the decode step, its arena, the
/// prompt path where asked for and possible, and the profiler's share.
struct Planned {
    shape: StepShape,
    graph: DecodeGraph,
    lifetimes: Vec<arena::Lifetime>,
    arena: arena::ArenaPlan,
    profiled: Option<profile::Prepared>,
    prefill: Option<PrefillPlan>,
}

impl Planned {
    fn new(
        config: &ModelConfig,
        catalog: &Catalog,
        src: &dyn StoredTensors,
        naming: Naming,
        options: &GpuOptions,
        multiprocessors: u32,
        rank: bool,
    ) -> Result<Planned, GpuError> {
        let span = profile::span("assemble and plan the decode step");
        let (shape, mut graph) =
            assemble_step(config, catalog, src, naming, options, multiprocessors, rank)?;
        let lifetimes = graph.lifetimes();
        let arena = arena::plan(&lifetimes, 256);
        let profiled = profile::prepare(&mut graph, config, src)?;
        let prefill = match options.prefill_chunk {
            0 => None,
            chunk => match PrefillPlan::new(config, catalog, &graph, chunk) {
                Ok(p) => Some(p),
                Err(e) => {
                    eprintln!("quench: prompts are fed one token per decode step: {e}");
                    None
                }
            },
        };
        span.end();
        Ok(Planned {
            shape,
            graph,
            lifetimes,
            arena,
            profiled,
            prefill,
        })
    }

    fn kv_bytes(&self) -> u64 {
        2 * self.graph.layer_dispatches.len() as u64 * self.graph.kv.layer_bytes
    }

    fn prefill_bytes(&self) -> u64 {
        self.prefill.as_ref().map_or(0, PrefillPlan::arena_bytes)
    }

    /// Refuses, before anything is allocated, a decoder that needs more than `available`
    /// bytes of `device`.
    fn check_fits(
        &self,
        device: &str,
        available: Option<u64>,
        kv: KvCache,
    ) -> Result<(), GpuError> {
        let weights = self.graph.weight_bytes();
        let needed = weights + self.arena.bytes + self.kv_bytes() + self.prefill_bytes();
        match available {
            Some(available) if needed > available => Err(GpuError::DoesNotFit {
                device: device.to_string(),
                needed,
                available,
                breakdown: format!(
                    "weights {}, KV cache {} ({}) for {} × {} positions, activations {} for {} rows \
                     a step, prompt chunks {} for {} tokens (a smaller prompt chunk needs less)",
                    size(weights),
                    size(self.kv_bytes()),
                    kv.name(),
                    self.shape.sessions,
                    self.shape.context,
                    size(self.arena.bytes),
                    self.shape.max_batch,
                    size(self.prefill_bytes()),
                    self.prefill.as_ref().map_or(0, |p| p.chunk),
                ),
            }),
            _ => Ok(()),
        }
    }

    /// What was put on the device (the weights as `catalog` chose them) and what one step
    /// costs.
    fn summary(
        &self,
        backend: &'static str,
        device: String,
        options: &GpuOptions,
        catalog: &Catalog,
    ) -> GpuSummary {
        let graph = &self.graph;
        let layer_plan = |rows: u32| -> Vec<String> {
            graph
                .step(rows)
                .filter_map(|d| d.label.strip_prefix("layer 0: ").map(str::to_owned))
                .collect()
        };
        let batched = self.shape.max_batch > 1;
        let prefill = self.prefill.as_ref();
        GpuSummary {
            backend,
            device,
            dispatches_per_token: graph.step(1).count(),
            layer_plan: layer_plan(1),
            batch_dispatches_per_step: batched.then(|| graph.step(2).count()),
            batch_layer_plan: if batched { layer_plan(2) } else { vec![] },
            layer_dispatches: graph.layer_dispatches.clone(),
            kernels: graph.kernels.len(),
            weight_bytes: graph.weight_bytes(),
            weight_bytes_per_token: graph.weight_bytes_per_token,
            arena_bytes: self.arena.bytes,
            activation_bytes: self.lifetimes.iter().map(|l| l.bytes).sum(),
            kv_cache_bytes: self.kv_bytes(),
            kv_cache: options.kv_cache,
            context: self.shape.context,
            max_batch: self.shape.max_batch,
            graph_captured: options.capture,
            prefill_chunk: prefill.map_or(0, |p| p.chunk as usize),
            prefill_min_tokens: options.prefill_min_tokens.max(2),
            prefill_dispatches: prefill.map_or(0, PrefillPlan::dispatches),
            prefill_layer_plan: prefill.map_or_else(Vec::new, PrefillPlan::layer_plan),
            prefill_arena_bytes: self.prefill_bytes(),
            prefill_wgmma_products: prefill.map_or(0, PrefillPlan::wgmma_products),
            tensor_core_products: graph.tensor_core_products,
            widened: catalog.widened.clone(),
        }
    }
}

impl GpuDecoder {
    /// Puts the decoder `config` describes on `exec`: chooses kernels, assembles and plans
    /// the decode step, refuses a model that does not fit in `available` bytes (checked
    /// before anything is allocated), uploads the weights as stored, compiles the
    /// kernels and captures the step. Whatever it allocated is freed if it fails.
    pub fn new(
        config: ModelConfig,
        src: &dyn StoredTensors,
        naming: Naming,
        exec: Box<dyn Executor + Send>,
        available: Option<u64>,
        options: &GpuOptions,
    ) -> Result<GpuDecoder, GpuError> {
        Self::build(config, src, naming, exec, available, options, false)
    }

    /// As [`GpuDecoder::new`]; with `rank`, one rank of a tensor-parallel model
    /// ([`super::TensorParallel`]; `config` is the rank's share), whose step stops at
    /// each [`DecodeGraph::reductions`] point and which only its model steps.
    pub(crate) fn build(
        config: ModelConfig,
        src: &dyn StoredTensors,
        naming: Naming,
        exec: Box<dyn Executor + Send>,
        available: Option<u64>,
        options: &GpuOptions,
        rank: bool,
    ) -> Result<GpuDecoder, GpuError> {
        config.validate()?;
        let catalog = Catalog::choose_for(&config, src, naming, options.prefill_chunk > 0)?;
        let sms = exec.multiprocessors().unwrap_or(DEFAULT_MULTIPROCESSORS);
        let mut planned = Planned::new(&config, &catalog, src, naming, options, sms, rank)?;
        let device = exec.device_name();
        let available = options.memory_limit.or(available);
        planned.check_fits(&device, available, options.kv_cache)?;

        // From here on `mem` frees what was allocated if a later step fails.
        let mut mem = DeviceMemory {
            exec,
            allocations: vec![],
        };
        let (mut launches, io, bases) = place(&mut mem, &planned.graph, &planned.arena, src)?;
        let prefill = match &planned.prefill {
            Some(p) => Some(prefill::place(&mut mem, p, &bases)?),
            None => None,
        };
        let (profile, sampled) = match planned.profiled.take() {
            Some(p) => {
                let (state, sampled) = instrument(&mut mem, p, &mut launches, &planned.graph)?;
                (Some(state), sampled)
            }
            None => (None, None),
        };
        let graph = &planned.graph;
        let rows = planned.shape.max_batch;
        let masking = match io.next {
            Some(_) => Some(Masking::new(
                &mut mem,
                u32_of("vocab", config.vocab)?,
                rows,
            )?),
            None => None,
        };
        let launches_of = |launches| StepLaunches {
            launches,
            graphs: vec![None; rows],
        };
        let mut on_device = OnDevice {
            mem,
            step: launches_of(launches),
            sampled: sampled.map(launches_of),
            capture: options.capture,
            io,
            record: graph.record,
            table_row: 4 * graph.kv.max_blocks as u64,
            resident: vec![None; rows],
            profile,
            prefill,
            masking,
            reductions: graph.reductions.clone(),
            segment_graphs: HashMap::new(),
        };
        // A tensor-parallel rank captures its segments as they first run.
        if options.capture && !rank {
            // The one-row step now; steps of more rows when they first run.
            let span = profile::span("capture the decode step");
            let d = &mut on_device;
            d.step.graphs[0] = Some(capture(&mut *d.mem.exec, &d.step.launches, 1)?);
            if let Some(s) = d.sampled.as_mut() {
                s.graphs[0] = Some(capture(&mut *d.mem.exec, &s.launches, 1)?);
            }
            span.end();
        }
        let summary = planned.summary(on_device.mem.exec.backend(), device, options, &catalog);
        Ok(GpuDecoder {
            id: NEXT_MODEL.fetch_add(1, Ordering::Relaxed),
            config,
            catalog,
            summary,
            pool: BlockPool::new(graph.kv.n_blocks),
            device: Mutex::new(on_device),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub fn summary(&self) -> &GpuSummary {
        &self.summary
    }

    /// Most positions one session holds.
    pub fn context_limit(&self) -> usize {
        self.summary.context
    }

    /// An empty session.
    pub fn new_session(&self) -> GpuSession {
        GpuSession::new(self.id, self.context_limit(), self.pool.clone())
    }

    /// Most sessions one step decodes.
    pub fn max_batch(&self) -> usize {
        self.summary.max_batch
    }

    /// Feeds `tokens` after the positions `session` holds, one decode step each, and
    /// returns the logits of the last. On error the session keeps the positions whose
    /// steps completed.
    pub fn feed(&self, session: &mut GpuSession, tokens: &[u32]) -> Result<Vec<f32>, GpuError> {
        self.check_feed(session, tokens)?;
        if self.takes_prompt_path(tokens) {
            return only(
                self.prefill(session, tokens, Read::Logits(&[true]))?
                    .logits()?,
            );
        }
        let (last, before) = tokens.split_last().ok_or(GpuError::NoTokens)?;
        for &token in before {
            self.step(&mut [(&mut *session, token)], Read::Nothing)?;
        }
        only(
            self.step(&mut [(session, *last)], Read::Logits(&[true]))?
                .logits()?,
        )
    }

    /// Whether a feed of `tokens` goes through the prompt path.
    fn takes_prompt_path(&self, tokens: &[u32]) -> bool {
        self.summary.prefill_chunk > 0 && tokens.len() >= self.summary.prefill_min_tokens.max(2)
    }

    /// Refuses a feed that cannot run: no tokens, another model's session, a context
    /// overflow, a token outside the vocabulary.
    fn check_feed(&self, session: &GpuSession, tokens: &[u32]) -> Result<(), GpuError> {
        if tokens.is_empty() {
            return Err(GpuError::NoTokens);
        }
        if session.model != self.id {
            return Err(GpuError::ForeignSession);
        }
        check_room(
            tokens,
            session.len(),
            self.context_limit(),
            self.config.vocab,
        )?;
        Ok(())
    }

    /// As [`GpuDecoder::feed`], returning only the index of the largest logit of the last
    /// token (the next token of greedy decoding): computed on the device and read back as
    /// 4 bytes where the vocabulary suits the argmax kernel, else from the logits.
    pub fn feed_greedy(&self, session: &mut GpuSession, tokens: &[u32]) -> Result<u32, GpuError> {
        self.feed_greedy_masked(session, tokens, &|| None)
    }

    /// As [`GpuDecoder::feed_greedy`], the largest logit among those `mask` allows (a
    /// grammar's mask: bit `t mod 32` of word `t / 32` set when token `t` is allowed; all
    /// tokens where it gives none). `mask` is called once the last step's kernels are
    /// submitted; the mask is applied on the device where the vocabulary suits the argmax
    /// kernel (the logits are not read back), else on the host.
    pub fn feed_greedy_masked(
        &self,
        session: &mut GpuSession,
        tokens: &[u32],
        mask: &dyn Fn() -> Option<Vec<u32>>,
    ) -> Result<u32, GpuError> {
        self.check_feed(session, tokens)?;
        let masks = || vec![mask()];
        let read = Read::Picked {
            logits: &[false],
            picks: &[true],
            masks: &masks,
        };
        let picked = if self.takes_prompt_path(tokens) {
            self.prefill(session, tokens, read)?
        } else {
            let (last, before) = tokens.split_last().ok_or(GpuError::NoTokens)?;
            for &token in before {
                self.step(&mut [(&mut *session, token)], Read::Nothing)?;
            }
            self.step(&mut [(session, *last)], read)?
        };
        match only(picked.rows(1))? {
            Some(Fed::Token(t)) => Ok(t),
            _ => Err(GpuError::Internal("a picked row read back no token".into())),
        }
    }

    /// Readies `session` to take `token` in the next step: refuses another model's
    /// session, a token outside the vocabulary and a full context, and takes the KV block
    /// the new position needs (once: asking again before the step takes nothing more).
    /// [`GpuDecoder::step_batch`] does this for every row; doing it first, row by row,
    /// tells which row would make the step fail.
    pub fn prepare_row(&self, session: &mut GpuSession, token: u32) -> Result<(), GpuError> {
        if session.model != self.id {
            return Err(GpuError::ForeignSession);
        }
        if token as usize >= self.config.vocab {
            return Err(GpuError::Token {
                token,
                vocab: self.config.vocab,
            });
        }
        let limit = self.context_limit();
        if session.len() >= limit {
            return Err(GpuError::ContextFull {
                limit,
                used: session.len(),
                added: 1,
            });
        }
        session.reserve_next().map(|_| ())
    }

    /// One decode step of several sessions, its rows: row `i` feeds token `rows[i].1`
    /// after the positions session `rows[i].0` holds. Returns each row's logits. A row's
    /// logits have the same bits as if its session were stepped alone. At most
    /// [`GpuDecoder::max_batch`] rows; on error no session has advanced (though a row may
    /// keep the KV block it took for the step).
    pub fn step_batch(
        &self,
        rows: &mut [(&mut GpuSession, u32)],
    ) -> Result<Vec<Vec<f32>>, GpuError> {
        let all = vec![true; rows.len()];
        self.step(rows, Read::Logits(&all))?.logits()
    }

    /// As [`GpuDecoder::step_batch`], returning each row's greedy next token (the index
    /// of its largest logit; computed on the device where the vocabulary suits the argmax
    /// kernel).
    pub fn step_batch_greedy(
        &self,
        rows: &mut [(&mut GpuSession, u32)],
    ) -> Result<Vec<u32>, GpuError> {
        self.step(rows, Read::Next)?.next()
    }

    /// Feeds each row's tokens after the positions its session holds. A row of as many
    /// tokens as takes the prompt path (a prompt's chunk) runs through it alone; the
    /// others share decode steps: step `j` decodes token `j` of every such row that has
    /// one, so rows of different lengths run together. Returns, per row, the logits of its last token, or why that row could
    /// not be fed (as [`GpuDecoder::feed`] refuses, or its KV block could not be had);
    /// such a row drops out without disturbing the others. The outer error is a step
    /// that failed as a whole, or more rows than [`GpuDecoder::max_batch`]; each session
    /// then holds the positions whose steps completed.
    #[allow(clippy::type_complexity)]
    pub fn feed_batch(
        &self,
        rows: &mut [(&mut GpuSession, &[u32])],
    ) -> Result<Vec<Result<Vec<f32>, GpuError>>, GpuError> {
        let fed = self.feed_batch_picking(rows, &[], &Vec::new)?;
        Ok(fed
            .into_iter()
            .map(|r| match r? {
                Fed::Logits(l) => Ok(l),
                Fed::Token(_) => Err(GpuError::Internal("a row was picked, not read".into())),
            })
            .collect())
    }

    /// As [`GpuDecoder::feed_batch`], where each row with `picks[i]` set gets back only
    /// its greedy next token under its mask (`masks()[i]`; every token where it gives
    /// none): the mask applied and the token picked on the device where the vocabulary
    /// suits the argmax kernel, so the row's logits are not read back. `masks` is called
    /// once the first step that needs them has been submitted.
    #[allow(clippy::type_complexity)]
    pub fn feed_batch_picking(
        &self,
        rows: &mut [(&mut GpuSession, &[u32])],
        picks: &[bool],
        masks: RowMasks<'_>,
    ) -> Result<Vec<Result<Fed, GpuError>>, GpuError> {
        if rows.len() > self.max_batch() {
            return Err(GpuError::BatchTooLarge {
                rows: rows.len(),
                max: self.max_batch(),
            });
        }
        let picks: Vec<bool> = (0..rows.len())
            .map(|i| picks.get(i).copied().unwrap_or(false))
            .collect();
        let unread = || GpuError::Internal("a fed row read back nothing".into());
        let mut out: Vec<Result<Fed, GpuError>> = rows
            .iter()
            .map(|(s, tokens)| self.check_feed(s, tokens).map(|_| Fed::Logits(vec![])))
            .collect();
        let prompted: Vec<bool> = rows
            .iter()
            .map(|(_, tokens)| self.takes_prompt_path(tokens))
            .collect();
        for (i, (session, tokens)) in rows.iter_mut().enumerate() {
            if prompted[i] && out[i].is_ok() {
                let mask = || vec![masks().get(i).cloned().flatten()];
                let read = Read::Picked {
                    logits: &[!picks[i]],
                    picks: &[picks[i]],
                    masks: &mask,
                };
                out[i] = self
                    .prefill(session, tokens, read)
                    .and_then(|o| only(o.rows(1))?.ok_or_else(unread));
            }
        }
        let longest = rows.iter().map(|(_, t)| t.len()).max().unwrap_or(0);
        for j in 0..longest {
            let mut live = vec![];
            let mut step_rows = vec![];
            let (mut want, mut pick) = (vec![], vec![]);
            for (i, (session, tokens)) in rows.iter_mut().enumerate() {
                if prompted[i] || out[i].is_err() || j >= tokens.len() {
                    continue;
                }
                if let Err(e) = self.prepare_row(session, tokens[j]) {
                    out[i] = Err(e);
                    continue;
                }
                live.push(i);
                step_rows.push((&mut **session, tokens[j]));
                let last = j + 1 == tokens.len();
                want.push(last && !picks[i]);
                pick.push(last && picks[i]);
            }
            if step_rows.is_empty() {
                continue;
            }
            let step_masks = || {
                let all = masks();
                live.iter()
                    .map(|&i| all.get(i).cloned().flatten())
                    .collect()
            };
            let read = if pick.contains(&true) {
                Read::Picked {
                    logits: &want,
                    picks: &pick,
                    masks: &step_masks,
                }
            } else if want.contains(&true) {
                Read::Logits(&want)
            } else {
                Read::Nothing
            };
            let n = step_rows.len();
            let fed = self.step(&mut step_rows, read)?.rows(n);
            for (&i, row) in live.iter().zip(fed) {
                if let Some(row) = row {
                    out[i] = Ok(row);
                }
            }
        }
        Ok(out)
    }

    /// Feeds `tokens` (checked by [`GpuDecoder::check_feed`]) through the prompt path, a
    /// chunk at a time, and reads back what `read` asks for of the last token. On error
    /// the session keeps the chunks that completed.
    fn prefill(
        &self,
        session: &mut GpuSession,
        tokens: &[u32],
        read: Read,
    ) -> Result<Out, GpuError> {
        let mut d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        let d = &mut *d;
        let Some(p) = d.prefill.as_ref() else {
            return Err(GpuError::Unsupported {
                what: "the prompt path".into(),
                reason: "this decoder was loaded without it".into(),
            });
        };
        let mut last_start = session.len();
        for piece in tokens.chunks(p.chunk as usize) {
            let start = session.len();
            last_start = start;
            let ran = (|| {
                for _ in piece {
                    session.reserve_next()?;
                    session.advance();
                }
                p.run(&mut *d.mem.exec, piece, start as u32, &session.blocks)
            })();
            if let Err(e) = ran {
                session.truncate(start);
                return Err(e);
            }
        }
        let at = session.len();
        let during = format!("prompt chunk ending at position {at}: its kernels or the read-back");
        let out = read_back(d, self.config.vocab, read, 1, during)
            .inspect_err(|_| session.truncate(last_start))?;
        out.record_tokens();
        Ok(out)
    }

    /// One decode step of `rows`, reading back what `read` asks for.
    fn step(&self, rows: &mut [(&mut GpuSession, u32)], read: Read) -> Result<Out, GpuError> {
        let n = rows.len();
        if n == 0 {
            return Err(GpuError::NoTokens);
        }
        if n > self.max_batch() {
            return Err(GpuError::BatchTooLarge {
                rows: n,
                max: self.max_batch(),
            });
        }
        for (session, token) in rows.iter_mut() {
            self.prepare_row(session, *token)?;
        }
        let mut d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        let d = &mut *d;
        if !d.reductions.is_empty() {
            return Err(GpuError::Internal(
                "a tensor-parallel rank is stepped by its model, a segment at a time".into(),
            ));
        }
        let mut timer = profile::StepTimer::start(rows[0].0.id);
        let first = rows[0].0.len();
        let during = |what: &str| match n {
            1 => format!("decode step at position {first}: {what}"),
            _ => format!("decode step of {n} sequences: {what}"),
        };
        write_rows(d, rows, 0, &during)?;
        let rows_u32 = n as u32;
        let instrumented = d.profile.as_ref().is_some_and(|p| p.instruments_next());
        let step = match d.sampled.as_mut() {
            Some(s) if instrumented => s,
            _ => &mut d.step,
        };
        if d.capture {
            let graph = match step.graphs[n - 1] {
                Some(g) => g,
                None => {
                    let span = profile::span(&format!("capture the decode step of {n} rows"));
                    let g = capture(&mut *d.mem.exec, &step.launches, rows_u32)?;
                    span.end();
                    step.graphs[n - 1] = Some(g);
                    g
                }
            };
            d.mem
                .exec
                .replay(graph, StreamId::DEFAULT)
                .map_err(GpuError::runtime(during("replaying the graph")))?;
        } else {
            for l in in_step(&step.launches, rows_u32) {
                let (launch, args) = l.at(rows_u32, 0);
                d.mem
                    .exec
                    .launch(l.kernel, &launch, &args, StreamId::DEFAULT)
                    .map_err(GpuError::runtime(during(&l.label)))?;
            }
        }
        profile::submitted(&mut timer);
        // A copy waits for the step, so a kernel that failed on the device shows here. A
        // step that reads nothing is not waited for: the next step's copies are ordered
        // after it, and a feed always ends with a read.
        let out = read_back(
            d,
            self.config.vocab,
            read,
            n,
            during("the step's kernels or the read-back"),
        )?;
        out.record_tokens();
        let read_back = !matches!(out, Out::Nothing);
        let context = rows.iter().map(|(s, _)| s.len() + 1).sum();
        profile::step_done(
            timer,
            d.profile.as_mut(),
            &mut *d.mem.exec,
            rows_u32,
            context,
            read_back,
        )?;
        for (session, _) in rows.iter_mut() {
            session.advance();
        }
        Ok(out)
    }
}

/// Refuses `tokens` after `used` positions of a context of `limit` where they overflow
/// it, or where one is outside a vocabulary of `vocab`.
pub(crate) fn check_room(
    tokens: &[u32],
    used: usize,
    limit: usize,
    vocab: usize,
) -> Result<(), GpuError> {
    if used + tokens.len() > limit {
        return Err(GpuError::ContextFull {
            limit,
            used,
            added: tokens.len(),
        });
    }
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(&token) => Err(GpuError::Token { token, vocab }),
        None => Ok(()),
    }
}

/// Writes the step's rows: each row's block table where the device holds another, and the
/// step record (tokens less `token_base`, a tensor-parallel rank's first token).
fn write_rows(
    d: &mut OnDevice,
    rows: &[(&mut GpuSession, u32)],
    token_base: u32,
    during: &dyn Fn(&str) -> String,
) -> Result<(), GpuError> {
    for (i, (session, _)) in rows.iter().enumerate() {
        if d.resident[i] == Some((session.id, session.version)) {
            continue;
        }
        let table: Vec<u8> = session
            .blocks
            .iter()
            .flat_map(|b| b.to_le_bytes())
            .collect();
        let at = d.io.table.offset(i as u64 * d.table_row);
        d.mem
            .exec
            .copy_to_device(at, &table)
            .map_err(GpuError::runtime(during(
                "writing a block table (or the previous step's kernels)",
            )))?;
        d.resident[i] = Some((session.id, session.version));
    }
    // A token below a rank's share of the vocabulary wraps past it: its embedding row is
    // another rank's.
    let entries: Vec<(u32, u32)> = rows
        .iter()
        .map(|(s, token)| (token.wrapping_sub(token_base), s.len() as u32))
        .collect();
    d.mem
        .exec
        .copy_to_device(d.io.step, &d.record.write(&entries))
        .map_err(GpuError::runtime(during(
            "writing the tokens (or the previous step's kernels)",
        )))
}

/// Reads back what `read` asks for of the first `n` rows; `during` names the work whose
/// errors show here (a copy waits for the kernels before it).
fn read_back(
    d: &mut OnDevice,
    vocab: usize,
    read: Read,
    n: usize,
    during: String,
) -> Result<Out, GpuError> {
    let failed = |e| GpuError::runtime(during.clone())(e);
    Ok(match (read, d.io.next) {
        (Read::Nothing, _) => Out::Nothing,
        (Read::Next, Some(next)) => Out::Next(read_next(d, next, n).map_err(failed)?),
        (
            Read::Picked {
                logits,
                picks,
                masks,
            },
            Some(next),
        ) if d.masking.is_some() => {
            // The step runs while the masks are computed beside it; waiting for it first
            // makes the time then spent waiting for the masks what they add to the step
            // (the masks' copy would wait for it anyway).
            d.mem.exec.synchronize().map_err(failed)?;
            // Only the rows picked on the device are masked there: the others' logits are
            // read back as computed.
            let masks: Vec<Option<Vec<u32>>> = masks()
                .into_iter()
                .zip(picks)
                .map(|(m, &p)| m.filter(|_| p))
                .collect();
            if let Some(m) = &d.masking {
                m.apply(&mut *d.mem.exec, &masks, d.io.logits, next)
                    .map_err(failed)?;
            }
            let next = read_next(d, next, n).map_err(failed)?;
            let picked = picks.iter().zip(next).map(|(&p, t)| p.then_some(t));
            let picked = picked.collect();
            Out::Picked(read_logits(d, vocab, logits).map_err(failed)?, picked)
        }
        (
            Read::Picked {
                logits,
                picks,
                masks,
            },
            _,
        ) => {
            let either: Vec<bool> = logits.iter().zip(picks).map(|(&l, &p)| l || p).collect();
            let mut rows = read_logits(d, vocab, &either).map_err(failed)?;
            let masks = masks();
            let mut picked = vec![None; n];
            for (row, slot) in picked.iter_mut().enumerate() {
                if !picks.get(row).copied().unwrap_or(false) {
                    continue;
                }
                let mut l = rows[row].take().ok_or_else(|| unread(row))?;
                if let Some(words) = masks.get(row).and_then(Option::as_deref) {
                    apply_mask(words, &mut l);
                }
                *slot = Some(crate::generate::argmax(&l).ok_or(GpuError::BadLogits { row })?);
            }
            Out::Picked(rows, picked)
        }
        (Read::Next, None) => Out::Next(greedy(
            read_logits(d, vocab, &vec![true; n]).map_err(failed)?,
        )?),
        (Read::Logits(wanted), _) => Out::Logits(read_logits(d, vocab, wanted).map_err(failed)?),
    })
}

/// The device's argmax of the first `n` rows.
fn read_next(d: &mut OnDevice, next: DevicePtr, n: usize) -> Result<Vec<u32>, quench_rt::RtError> {
    let mut bytes = vec![0u8; 4 * n];
    d.mem.exec.copy_to_host(next, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The logits of the rows marked in `wanted`, each run of consecutive rows in one copy.
fn read_logits(
    d: &mut OnDevice,
    vocab: usize,
    wanted: &[bool],
) -> Result<Vec<Option<Vec<f32>>>, quench_rt::RtError> {
    let row_bytes = 4 * vocab;
    let mut out: Vec<Option<Vec<f32>>> = vec![None; wanted.len()];
    let mut i = 0;
    while i < wanted.len() {
        if !wanted[i] {
            i += 1;
            continue;
        }
        let end = (i..wanted.len())
            .find(|&j| !wanted[j])
            .unwrap_or(wanted.len());
        let mut bytes = vec![0u8; row_bytes * (end - i)];
        d.mem
            .exec
            .copy_to_host(d.io.logits.offset((i * row_bytes) as u64), &mut bytes)?;
        for (k, row) in bytes.chunks_exact(row_bytes).enumerate() {
            out[i + k] = Some(
                row.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            );
        }
        i = end;
    }
    Ok(out)
}

/// Device addresses of the host-visible activations.
struct HostAddrs {
    step: DevicePtr,
    table: DevicePtr,
    logits: DevicePtr,
    next: Option<DevicePtr>,
    residual: DevicePtr,
    partial: Option<DevicePtr>,
}

/// Allocates the weights, arena and KV cache, uploads the weights and zeros, compiles
/// the kernels and resolves every launch. Returns the launches and the addresses the
/// host reads and writes.
fn place(
    mem: &mut DeviceMemory,
    graph: &DecodeGraph,
    plan: &arena::ArenaPlan,
    src: &dyn StoredTensors,
) -> Result<(Vec<Resolved>, HostAddrs, prefill::Bases), GpuError> {
    // Weights, each group 256-byte aligned, parts back to back.
    let groups = &graph.weights.groups;
    let mut group_at = Vec::with_capacity(groups.len());
    let mut total = 0u64;
    for g in groups {
        group_at.push(total);
        total += g.bytes().div_ceil(256) * 256;
    }
    let upload = profile::span("upload the weights");
    let weights = mem.alloc(total, "the weights")?;
    let exec = &mut *mem.exec;
    for (g, &start) in groups.iter().zip(&group_at) {
        let mut at = start;
        for (data, bytes) in &g.parts {
            let dst = weights.offset(at);
            match data {
                WeightData::Stored(name) => {
                    let t = src.stored(name)?;
                    exec.copy_to_device(dst, t.bytes)
                        .map_err(GpuError::runtime(format!("uploading {name}")))?;
                    // On the device now: the host's pages of it need not stay resident.
                    src.release(name);
                }
                WeightData::Widened(name) => {
                    let f16 = stored::widened_f16(name, &src.stored(name)?)?;
                    exec.copy_to_device(dst, &f16)
                        .map_err(GpuError::runtime(format!("uploading {name}")))?;
                    src.release(name);
                }
                WeightData::Floats(v) => {
                    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    exec.copy_to_device(dst, &b)
                        .map_err(GpuError::runtime("uploading norm weights and tables"))?;
                }
            }
            at += bytes;
        }
    }

    upload.end();
    let arena = mem.alloc(plan.bytes, "the activation arena")?;
    let kv_bytes = 2 * graph.kv.layer_bytes * graph.layer_dispatches.len() as u64;
    let kv = mem.alloc(kv_bytes, "the KV cache")?;
    let exec = &mut *mem.exec;
    let act = |i: usize| arena.offset(plan.offsets[i]);
    let zeros = &graph.activations[graph.io.zeros];
    exec.copy_to_device(act(graph.io.zeros), &vec![0u8; zeros.bytes as usize])
        .map_err(GpuError::runtime("zeroing the arena's zero buffer"))?;
    exec.copy_to_device(
        act(graph.io.step).offset(graph.record.part(3)),
        &graph.record.row_indices(),
    )
    .map_err(GpuError::runtime("writing the step's row indices"))?;

    let span = profile::span("compile the kernels");
    let kernels = compile(exec, &graph.kernels)?;
    span.end();
    let base = |r: Region| -> Result<DevicePtr, GpuError> {
        Ok(match r {
            Region::Act(i) => act(i),
            Region::Weights(g) => weights.offset(group_at[g]),
            Region::KCache(l) => kv.offset(2 * l as u64 * graph.kv.layer_bytes),
            Region::VCache(l) => kv.offset((2 * l as u64 + 1) * graph.kv.layer_bytes),
            Region::Step(_) => {
                return Err(GpuError::Unsupported {
                    what: "the decode step".into(),
                    reason: "it points into its own arena only".into(),
                })
            }
        })
    };
    let launches = resolve(&graph.dispatches, &kernels, base)?;
    let addrs = HostAddrs {
        step: act(graph.io.step),
        table: act(graph.io.table),
        logits: act(graph.io.logits),
        next: graph.io.next.map(act),
        residual: act(graph.io.residual),
        partial: graph.io.partial.map(act),
    };
    let bases = prefill::Bases {
        weights,
        group_at,
        kv,
        kv_layer_bytes: graph.kv.layer_bytes,
        step: arena,
        step_at: plan.offsets.clone(),
    };
    Ok((launches, addrs, bases))
}

/// The launches of a step of `rows` rows, in order.
fn in_step(launches: &[Resolved], rows: u32) -> impl Iterator<Item = &Resolved> {
    launches.iter().filter(move |l| l.rows.includes(rows))
}

/// Compiles `kernels` on `exec`, in order.
pub(crate) fn compile(
    exec: &mut dyn Executor,
    kernels: &[Function],
) -> Result<Vec<KernelId>, GpuError> {
    kernels
        .iter()
        .map(|f| {
            exec.load(f)
                .map_err(GpuError::runtime(format!("compiling kernel `{}`", f.name)))
        })
        .collect()
}

/// Records `launches` of a step of `rows` rows as one graph. A launch the executor
/// refuses names its dispatch; the capture is closed either way.
fn capture(exec: &mut dyn Executor, launches: &[Resolved], rows: u32) -> Result<GraphId, GpuError> {
    let s = StreamId::DEFAULT;
    let during = |what: &str| match rows {
        1 => format!("capturing the decode step{what}"),
        _ => format!("capturing the decode step of {rows} rows{what}"),
    };
    exec.begin_capture(s)
        .map_err(GpuError::runtime(during("")))?;
    let mut failed = None;
    for l in in_step(launches, rows) {
        let (launch, args) = l.at(rows, 0);
        if let Err(e) = exec.launch(l.kernel, &launch, &args, s) {
            failed = Some(GpuError::Runtime {
                during: during(&format!(": {}", l.label)),
                source: Box::new(e),
            });
            break;
        }
    }
    let graph = exec.end_capture(s).map_err(GpuError::runtime(during("")));
    match (failed, graph) {
        (None, Ok(g)) => Ok(g),
        (Some(e), Ok(g)) => {
            let _ = exec.release_graph(g);
            Err(e)
        }
        (Some(e), Err(_)) | (None, Err(e)) => Err(e),
    }
}

/// Attaches the profiler to the step's `launches`: every launch (or, profiling one step
/// in several, a copy of them with the instrumented kernels, returned beside the state)
/// gets its record slot, and each instrumented step ends by copying its records on the
/// device, inside its graph — a copy issued between replays costs far more.
fn instrument(
    mem: &mut DeviceMemory,
    mut p: profile::Prepared,
    launches: &mut Vec<Resolved>,
    graph: &DecodeGraph,
) -> Result<(profile::Instrumented, Option<Vec<Resolved>>), GpuError> {
    let exec = &mut *mem.exec;
    let mut sampled = match p.take_sampled_kernels() {
        Some(kernels) => {
            let span = profile::span("compile the instrumented kernels");
            let ids = compile(exec, &kernels)?;
            span.end();
            let sampled: Vec<Resolved> = launches
                .iter()
                .zip(&graph.dispatches)
                .map(|(l, d)| Resolved {
                    kernel: ids[d.kernel],
                    ..l.clone()
                })
                .collect();
            Some(sampled)
        }
        None => None,
    };
    let (state, slots) = profile::attach(p, exec)?;
    let instrumented = sampled.as_mut().unwrap_or(launches);
    for (l, slot) in instrumented.iter_mut().zip(slots) {
        l.args.extend(slot.map(Slot::Arg));
    }
    let copy = state.copy_dispatch();
    instrumented.push(Resolved {
        label: "copy the profiler's records".into(),
        kernel: copy.kernel,
        rows: Rows::Any,
        grid: Grid::Once(copy.launch),
        args: copy.args.iter().copied().map(Slot::Arg).collect(),
    });
    Ok((state, sampled))
}

#[cfg(test)]
mod tests {
    use super::{greedy, GpuError};

    #[test]
    fn greedy_refuses_a_row_of_nan_and_passes_nan_over_elsewhere() {
        let rows = vec![
            Some(vec![0.5, f32::NAN, 2.0]),
            Some(vec![f32::NAN; 3]),
            Some(vec![1.0, 0.0]),
        ];
        assert!(matches!(greedy(rows), Err(GpuError::BadLogits { row: 1 })));
        let rows = vec![Some(vec![f32::NAN, 1.0, 3.0]), Some(vec![2.0, 1.0])];
        assert_eq!(greedy(rows).unwrap(), [2, 0]);
    }
}
