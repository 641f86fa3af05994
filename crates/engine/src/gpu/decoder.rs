//! The decoder on a device: weights uploaded as stored, the arena and KV cache allocated
//! once, the decode step captured as a graph and replayed per token.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use quench_cpu::{ModelConfig, Naming};
use quench_rt::{
    Arg, CudaExecutor, DevicePtr, Executor, GraphId, InterpExecutor, KernelId, Launch, StreamId,
};

use super::arena;
use super::catalog::Catalog;
use super::error::{size, GpuError};
use super::graph::{DecodeGraph, Operand, Region, StepShape, WeightData};
use super::kv::{BlockPool, GpuSession};
use super::profile;
use super::stored::StoredTensors;

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
    Cuda { ordinal: u32 },
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
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            context: None,
            sessions: 1,
            capture: true,
            memory_limit: None,
        }
    }
}

/// What was put on the device and what one step costs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuSummary {
    /// `cuda` or `interp`.
    pub backend: &'static str,
    pub device: String,
    pub dispatches_per_token: usize,
    /// Dispatches of each layer.
    pub layer_dispatches: Vec<usize>,
    /// The labels of layer 0's dispatches, in order.
    pub layer_plan: Vec<String>,
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
    /// Positions one session holds.
    pub context: usize,
    pub graph_captured: bool,
}

/// What a step reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Read {
    Nothing,
    Logits,
    /// The device's argmax of the logits.
    Next,
}

enum Out {
    Nothing,
    Logits(Vec<f32>),
    Next(u32),
}

/// Launches of the step, resolved to device addresses.
struct Resolved {
    label: String,
    kernel: KernelId,
    launch: Launch,
    args: Vec<Arg>,
}

/// The executor and everything allocated on it. One step runs at a time.
struct OnDevice {
    exec: Box<dyn Executor + Send>,
    launches: Vec<Resolved>,
    graph: Option<GraphId>,
    step: DevicePtr,
    table: DevicePtr,
    logits: DevicePtr,
    next: Option<DevicePtr>,
    /// The session (id, table version) whose block table the device holds.
    resident: Option<(u64, u64)>,
    allocations: Vec<DevicePtr>,
    /// The ring and records of a decoder loaded while profiling.
    profile: Option<profile::Instrumented>,
}

impl Drop for OnDevice {
    fn drop(&mut self) {
        // Best effort: the executor itself releases everything when it goes.
        if let Some(g) = self.graph.take() {
            let _ = self.exec.release_graph(g);
        }
        for p in self.allocations.drain(..) {
            let _ = self.exec.free(p);
        }
        if let Some(p) = self.profile.take() {
            p.release(&mut *self.exec);
        }
    }
}

/// A decoder (llama, qwen2, qwen3) whose weights, KV cache and decode step live on a
/// device. `Send + Sync`: steps of different sessions take turns on the device.
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

/// Opens the executor of `backend` and the device memory it offers.
pub(crate) fn open(backend: Backend) -> Result<(Box<dyn Executor + Send>, Option<u64>), GpuError> {
    match backend {
        Backend::Cuda { ordinal } => {
            let exec = CudaExecutor::new(ordinal)
                .map_err(GpuError::runtime(format!("opening CUDA device {ordinal}")))?;
            let total = exec.info().total_memory_bytes;
            Ok((Box::new(exec), Some(total.saturating_sub(CUDA_RESERVE))))
        }
        Backend::Interp => Ok((Box::new(InterpExecutor::new()), None)),
    }
}

impl GpuDecoder {
    /// Puts the decoder `config` describes on `exec`: chooses kernels, assembles and plans
    /// the decode step, refuses a model that does not fit in `available` bytes (checked
    /// before anything is allocated), uploads the weights as stored, compiles the
    /// kernels and captures the step.
    pub fn new(
        config: ModelConfig,
        src: &dyn StoredTensors,
        naming: Naming,
        mut exec: Box<dyn Executor + Send>,
        available: Option<u64>,
        options: &GpuOptions,
    ) -> Result<GpuDecoder, GpuError> {
        config.validate()?;
        let catalog = Catalog::choose(&config, src, naming)?;
        let context = options
            .context
            .unwrap_or(DEFAULT_CONTEXT)
            .min(config.max_positions)
            .max(1);
        let shape = StepShape {
            context,
            sessions: options.sessions.max(1),
        };
        let assembly = profile::span("assemble and plan the decode step");
        let mut graph = DecodeGraph::assemble(&config, &catalog, src, naming, shape)?;
        let lifetimes = graph.lifetimes();
        let plan = arena::plan(&lifetimes, 256);
        let profiled = profile::prepare(&mut graph, &config, src)?;
        assembly.end();
        let weight_bytes = graph.weight_bytes();
        let kv_bytes = 2 * config.layers as u64 * graph.kv.layer_bytes;
        let needed = weight_bytes + plan.bytes + kv_bytes;
        let device = exec.device_name();
        if let Some(available) = options.memory_limit.or(available) {
            if needed > available {
                return Err(GpuError::DoesNotFit {
                    device,
                    needed,
                    available,
                    breakdown: format!(
                        "weights {}, KV cache {} for {} × {} positions, activations {}",
                        size(weight_bytes),
                        size(kv_bytes),
                        shape.sessions,
                        context,
                        size(plan.bytes)
                    ),
                });
            }
        }

        let ceilings = profiled
            .as_ref()
            .and_then(|_| profile::measure_ceilings(&mut *exec));
        let mut allocations = vec![];
        let result = place(&mut *exec, &graph, &plan, src, &mut allocations);
        let result = result.and_then(|(mut launches, io)| {
            let instrumented = match profiled {
                Some(p) => {
                    let (state, slots) = profile::attach(p, &mut *exec, ceilings)?;
                    for (l, slot) in launches.iter_mut().zip(slots) {
                        l.args.extend(slot);
                    }
                    Some(state)
                }
                None => None,
            };
            Ok((launches, io, instrumented))
        });
        let (launches, io, instrumented) = match result {
            Ok(r) => r,
            Err(e) => {
                for p in allocations {
                    let _ = exec.free(p);
                }
                return Err(e);
            }
        };
        let mut on_device = OnDevice {
            exec,
            launches,
            graph: None,
            step: io.step,
            table: io.table,
            logits: io.logits,
            next: io.next,
            resident: None,
            allocations,
            profile: instrumented,
        };
        if options.capture {
            let span = profile::span("capture the decode step");
            on_device.graph = Some(capture(&mut on_device)?);
            span.end();
        }
        let summary = GpuSummary {
            backend: on_device.exec.backend(),
            device,
            dispatches_per_token: graph.dispatches.len(),
            layer_plan: graph
                .dispatches
                .iter()
                .filter_map(|d| d.label.strip_prefix("layer 0: ").map(str::to_owned))
                .collect(),
            layer_dispatches: graph.layer_dispatches.clone(),
            kernels: graph.kernels.len(),
            weight_bytes,
            weight_bytes_per_token: graph.weight_bytes_per_token,
            arena_bytes: plan.bytes,
            activation_bytes: lifetimes.iter().map(|l| l.bytes).sum(),
            kv_cache_bytes: kv_bytes,
            context,
            graph_captured: options.capture,
        };
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

    /// Feeds `tokens` after the positions `session` holds, one decode step each, and
    /// returns the logits of the last. On error the session keeps the positions whose
    /// steps completed.
    pub fn feed(&self, session: &mut GpuSession, tokens: &[u32]) -> Result<Vec<f32>, GpuError> {
        self.check_feed(session, tokens)?;
        let (last, before) = tokens.split_last().ok_or(GpuError::NoTokens)?;
        for &token in before {
            self.step(session, token, Read::Nothing)?;
        }
        match self.step(session, *last, Read::Logits)? {
            Out::Logits(l) => Ok(l),
            _ => Ok(vec![]),
        }
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
        let limit = self.context_limit();
        if session.len() + tokens.len() > limit {
            return Err(GpuError::ContextFull {
                limit,
                used: session.len(),
                added: tokens.len(),
            });
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.config.vocab) {
            return Err(GpuError::Token {
                token,
                vocab: self.config.vocab,
            });
        }
        Ok(())
    }

    /// As [`GpuDecoder::feed`], returning only the index of the largest logit of the last
    /// token (the next token of greedy decoding): computed on the device and read back as
    /// 4 bytes where the vocabulary suits the argmax kernel, else from the logits.
    pub fn feed_greedy(&self, session: &mut GpuSession, tokens: &[u32]) -> Result<u32, GpuError> {
        self.check_feed(session, tokens)?;
        let (last, before) = tokens.split_last().ok_or(GpuError::NoTokens)?;
        for &token in before {
            self.step(session, token, Read::Nothing)?;
        }
        match self.step(session, *last, Read::Next)? {
            Out::Next(t) => Ok(t),
            Out::Logits(l) => Ok(quench_cpu::argmax(&l).unwrap_or(0)),
            Out::Nothing => Ok(0),
        }
    }

    /// One decode step of `session` with `token`, reading back what `read` asks for.
    fn step(&self, session: &mut GpuSession, token: u32, read: Read) -> Result<Out, GpuError> {
        let pos = session.reserve_next()?;
        let mut d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        let d = &mut *d;
        let mut timer = profile::StepTimer::start(session.id);
        let during = |what: &str| format!("decode step at position {pos}: {what}");
        if d.resident != Some((session.id, session.version)) {
            let table: Vec<u8> = session
                .blocks
                .iter()
                .flat_map(|b| b.to_le_bytes())
                .collect();
            d.exec
                .copy_to_device(d.table, &table)
                .map_err(GpuError::runtime(during(
                    "writing the block table (or the previous step's kernels)",
                )))?;
            d.resident = Some((session.id, session.version));
        }
        let record: Vec<u8> = [token, pos as u32, pos as u32 + 1, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        d.exec
            .copy_to_device(d.step, &record)
            .map_err(GpuError::runtime(during(
                "writing the token (or the previous step's kernels)",
            )))?;
        match d.graph {
            Some(g) => d
                .exec
                .replay(g, StreamId::DEFAULT)
                .map_err(GpuError::runtime(during("replaying the graph")))?,
            None => {
                for l in &d.launches {
                    d.exec
                        .launch(l.kernel, &l.launch, &l.args, StreamId::DEFAULT)
                        .map_err(GpuError::runtime(during(&l.label)))?;
                }
            }
        }
        profile::submitted(&mut timer);
        // A copy waits for the step, so a kernel that failed on the device shows here. A
        // step that reads nothing is not waited for: the next step's copies are ordered
        // after it, and a feed always ends with a read.
        let read_back = during("the step's kernels or the read-back");
        let out = match (read, d.next) {
            (Read::Nothing, _) => Out::Nothing,
            (Read::Next, Some(next)) => {
                let mut bytes = [0u8; 4];
                d.exec
                    .copy_to_host(next, &mut bytes)
                    .map_err(GpuError::runtime(read_back))?;
                Out::Next(u32::from_le_bytes(bytes))
            }
            (Read::Logits, _) | (Read::Next, None) => {
                let mut bytes = vec![0u8; 4 * self.config.vocab];
                d.exec
                    .copy_to_host(d.logits, &mut bytes)
                    .map_err(GpuError::runtime(read_back))?;
                Out::Logits(
                    bytes
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )
            }
        };
        let read_back = !matches!(out, Out::Nothing);
        profile::step_done(
            timer,
            d.profile.as_mut(),
            &mut *d.exec,
            d.launches.len(),
            pos + 1,
            read_back,
        )?;
        session.advance();
        Ok(out)
    }
}

/// Device addresses of the host-visible activations.
struct HostAddrs {
    step: DevicePtr,
    table: DevicePtr,
    logits: DevicePtr,
    next: Option<DevicePtr>,
}

/// Allocates the weights, arena and KV cache, uploads the weights and zeros, compiles
/// the kernels and resolves every launch. Returns the launches and the addresses the
/// host reads and writes.
fn place(
    exec: &mut dyn Executor,
    graph: &DecodeGraph,
    plan: &arena::ArenaPlan,
    src: &dyn StoredTensors,
    allocations: &mut Vec<DevicePtr>,
) -> Result<(Vec<Resolved>, HostAddrs), GpuError> {
    let mut alloc =
        |exec: &mut dyn Executor, bytes: u64, what: &str| -> Result<DevicePtr, GpuError> {
            let p = exec.alloc(bytes.max(1)).map_err(GpuError::runtime(format!(
                "allocating {what} ({})",
                size(bytes)
            )))?;
            allocations.push(p);
            Ok(p)
        };

    // Weights, each group 256-byte aligned, parts back to back.
    let mut group_at = Vec::with_capacity(graph.weights.len());
    let mut total = 0u64;
    for g in &graph.weights {
        group_at.push(total);
        total += g.bytes().div_ceil(256) * 256;
    }
    let upload = profile::span("upload the weights");
    let weights = alloc(exec, total, "the weights")?;
    for (g, &start) in graph.weights.iter().zip(&group_at) {
        let mut at = start;
        for (data, bytes) in &g.parts {
            let dst = weights.offset(at);
            match data {
                WeightData::Stored(name) => {
                    let t = src.stored(name)?;
                    exec.copy_to_device(dst, t.bytes)
                        .map_err(GpuError::runtime(format!("uploading {name}")))?;
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
    let arena = alloc(exec, plan.bytes, "the activation arena")?;
    let kv = alloc(
        exec,
        2 * graph.kv.layer_bytes * graph.layer_dispatches.len() as u64,
        "the KV cache",
    )?;
    let act = |i: usize| arena.offset(plan.offsets[i]);
    let zeros = &graph.activations[graph.io.zeros];
    exec.copy_to_device(act(graph.io.zeros), &vec![0u8; zeros.bytes as usize])
        .map_err(GpuError::runtime("zeroing the arena's zero buffer"))?;

    let compile = profile::span("compile the kernels");
    let mut kernels = Vec::with_capacity(graph.kernels.len());
    for f in &graph.kernels {
        kernels.push(
            exec.load(f)
                .map_err(GpuError::runtime(format!("compiling kernel `{}`", f.name)))?,
        );
    }
    compile.end();
    let resolve = |op: &Operand| -> Arg {
        match *op {
            Operand::Value(a) => a,
            Operand::At(region, off) => Arg::Ptr(
                match region {
                    Region::Act(i) => act(i),
                    Region::Weights(g) => weights.offset(group_at[g]),
                    Region::KCache(l) => kv.offset(2 * l as u64 * graph.kv.layer_bytes),
                    Region::VCache(l) => kv.offset((2 * l as u64 + 1) * graph.kv.layer_bytes),
                }
                .offset(off),
            ),
        }
    };
    let launches = graph
        .dispatches
        .iter()
        .map(|d| Resolved {
            label: d.label.clone(),
            kernel: kernels[d.kernel],
            launch: d.launch,
            args: d.args.iter().map(resolve).collect(),
        })
        .collect();
    let addrs = HostAddrs {
        step: act(graph.io.step),
        table: act(graph.io.table),
        logits: act(graph.io.logits),
        next: graph.io.next.map(act),
    };
    Ok((launches, addrs))
}

/// Records the step's launches as one graph. A launch the executor refuses names its
/// dispatch; the capture is closed either way.
fn capture(d: &mut OnDevice) -> Result<GraphId, GpuError> {
    let s = StreamId::DEFAULT;
    d.exec
        .begin_capture(s)
        .map_err(GpuError::runtime("capturing the decode step"))?;
    let mut failed = None;
    for l in &d.launches {
        if let Err(e) = d.exec.launch(l.kernel, &l.launch, &l.args, s) {
            failed = Some(GpuError::Runtime {
                during: format!("capturing the decode step: {}", l.label),
                source: Box::new(e),
            });
            break;
        }
    }
    let graph = d
        .exec
        .end_capture(s)
        .map_err(GpuError::runtime("capturing the decode step"));
    match (failed, graph) {
        (None, Ok(g)) => Ok(g),
        (Some(e), Ok(g)) => {
            let _ = d.exec.release_graph(g);
            Err(e)
        }
        (Some(e), Err(_)) | (None, Err(e)) => Err(e),
    }
}
