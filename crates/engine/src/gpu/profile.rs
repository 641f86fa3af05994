//! Profiling decode steps, switched on for the whole process.
//!
//! While profiling is on ([`start`] … [`finish`]), every [`super::GpuDecoder`] loaded
//! runs instrumented kernels ([`quench_prof::instrument`]): each dispatch of the step
//! owns one fixed slot of a ring buffer on the device, so the captured graph replays with
//! the same arguments. Each instrumented step's last dispatch copies the ring, on the
//! device, into the next slot of a history of [`HISTORY_STEPS`] steps
//! ([`quench_prof::History`]); the host reads the whole history back in one copy when it
//! is full and when the decoder is dropped, and tags each step's records with the number
//! the step got when it ran. Host spans cover loading (graph assembly, weight upload,
//! kernel compilation, capture), every step (submission, read-back), the host's work
//! between the tokens of a session (sampling, detokenizing, streaming), each read of the
//! history and the ceiling measurement (when the decoder goes).
//!
//! Records still on the device of a decoder that is not dropped before [`finish`] are
//! not in the profile; [`Profile::unread`] counts them.
//!
//! Profiling may sample the steps ([`start_sampled`]): each decoder then instruments one
//! decode step in N, counting from its first, and runs the others with its plain kernels
//! (a second set of captured graphs). Every step keeps its number, so the records are of
//! steps 0, N, 2N… of a decoder that runs alone; only the instrumented steps count as
//! submitted, are copied to the history and get host spans, while every step's time is
//! kept.
//!
//! Each dispatch also gets a model of the bytes it moves and the FLOPs it performs, from
//! the step's data and an analysis of its kernel ([`quench_prof::access`]):
//!
//! - an operand the kernel reads or writes at addresses it computes from its arguments
//!   and ids alone moves its whole extent: from its offset to the next offset any
//!   dispatch uses in the same buffer (or the buffer's end);
//! - a KV cache the kernel reads through a loaded block table moves the keys (or
//!   values) of every position in the context at that step; one it writes that way, one
//!   position;
//! - other reads through loaded indices (a token's embedding row, the RoPE row of a
//!   position) are a row or two and are not counted;
//! - FLOPs: two per weight element read (a multiply-add at batch 1) and, for attention,
//!   two per cached key or value element per query head; other arithmetic is not counted.
//!
//! [`Mode::StepTimes`] leaves the kernels as they are and only times the steps that read
//! something back on the host: the baseline for the overhead of [`Mode::Dispatches`].
//! In both modes the profile keeps the tokens that decoders report with
//! [`record_tokens`], so that the two kinds of run can be checked to agree.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use quench_ir::Function;
use quench_kernels::attention::BLOCK_TOKENS;
use quench_models::arch::ModelConfig;
use quench_prof::access::{param_access, Access};
use quench_prof::{Ceilings, Dispatch, History, HostSpans, RingError};
use quench_rt::{Arg, Executor, StreamId};

use super::error::GpuError;
use super::graph::DecodeGraph;
use super::plan::{Offset, Operand, Region, Rows};
use super::stored::StoredTensors;
use super::weights::WeightData;

/// What a profile records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Instrumented kernels: GPU times of every dispatch, host spans and step times.
    Dispatches,
    /// Kernels as they are; only the host time of each step that reads something back.
    StepTimes,
}

/// Steps whose records a decoder keeps on the device before reading them back in one
/// copy (see [`start_with_history`]).
pub const HISTORY_STEPS: u32 = 64;

/// Measures the ceilings on a decoder's executor, once per decoder loaded.
pub type MeasureCeilings = Box<dyn FnMut(&mut dyn Executor) -> Result<Ceilings, String> + Send>;

pub struct ProfileOptions {
    pub mode: Mode,
    /// Called on each decoder's executor when the decoder goes, after its weights are
    /// freed ([`Mode::Dispatches`] only).
    pub ceilings: Option<MeasureCeilings>,
}

/// A decoder loaded while profiling was on.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfiledDecoder {
    /// `cuda` or `interp`.
    pub backend: &'static str,
    pub device: String,
    /// Dispatches of a one-row step.
    pub dispatches_per_step: usize,
    /// Measured on its executor once the decoder is done (its weights freed); `None`
    /// when no measurement was asked for, or while the decoder is still loaded.
    pub ceilings: Option<Result<Ceilings, String>>,
}

/// What was recorded between [`start`] and [`finish`].
#[derive(Debug)]
pub struct Profile {
    pub mode: Mode,
    /// Each decoder instrumented one decode step in this many ([`Mode::Dispatches`]).
    pub every: u32,
    pub host: HostSpans,
    /// Every record read back, in step order, each tagged with its step, label, bytes
    /// and FLOPs.
    pub dispatches: Vec<Dispatch>,
    pub decoders: Vec<ProfiledDecoder>,
    /// Dispatches the host submitted while instrumented: per instrumented step, the
    /// graph's dispatches (replayed) or the launches made one by one.
    pub submitted: u64,
    /// Of those, the dispatches whose records were still on the device of a decoder
    /// when profiling finished (drop decoders first to have them all).
    pub unread: u64,
    /// Host time of each step that read a token or logits back, from its first copy to
    /// the end of its read-back (the profile read included), in nanoseconds; instrumented
    /// or not.
    pub step_ns: Vec<u64>,
    /// The tokens decoders reported reading back ([`record_tokens`]), in order, in either
    /// mode: a plain and a profiled run of the same command must agree on them.
    pub tokens: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("profiling is already on in this process")]
    AlreadyOn,
    #[error("profiling needs room on the device for at least one step's records")]
    NoHistory,
    #[error("profiling instruments one decode step in N, with N at least 1 (1: every step)")]
    NoSteps,
}

struct Recorder {
    /// Which profile this is, so that a decoder from an earlier one records nothing here.
    id: u64,
    profile: Profile,
    ceilings: Option<MeasureCeilings>,
    /// Steps recorded so far: the next step's number.
    steps: u32,
    /// Steps of records each decoder keeps on the device.
    history_steps: u32,
    /// Each decoder instruments one decode step in this many.
    every: u32,
}

static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn recorder() -> std::sync::MutexGuard<'static, Option<Recorder>> {
    RECORDER.lock().unwrap_or_else(|e| e.into_inner())
}

/// Switch profiling on for the process, each decoder keeping [`HISTORY_STEPS`] steps of
/// records on the device.
pub fn start(options: ProfileOptions) -> Result<(), ProfileError> {
    start_with_history(options, HISTORY_STEPS)
}

/// Switch profiling on for the process, each decoder keeping `history_steps` steps of
/// records on the device between reads: [`quench_prof::RECORD_BYTES`] per dispatch and
/// step of device memory, against one read (and wait) every `history_steps` steps.
pub fn start_with_history(options: ProfileOptions, history_steps: u32) -> Result<(), ProfileError> {
    start_sampled(options, 1, history_steps)
}

/// As [`start_with_history`], each decoder instrumenting only one decode step in
/// `every` (from its first) and running the others with its plain kernels: about
/// `1 / every` of the cost of instrumenting every step, and records of those steps only.
/// With `every` 1 (every step) a decoder compiles and captures the instrumented kernels
/// only; otherwise both sets.
pub fn start_sampled(
    options: ProfileOptions,
    every: u32,
    history_steps: u32,
) -> Result<(), ProfileError> {
    if history_steps == 0 {
        return Err(ProfileError::NoHistory);
    }
    if every == 0 {
        return Err(ProfileError::NoSteps);
    }
    let mut r = recorder();
    if r.is_some() {
        return Err(ProfileError::AlreadyOn);
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    *r = Some(Recorder {
        id,
        profile: Profile {
            mode: options.mode,
            every,
            host: HostSpans::new(),
            dispatches: vec![],
            decoders: vec![],
            submitted: 0,
            unread: 0,
            step_ns: vec![],
            tokens: vec![],
        },
        ceilings: options.ceilings,
        steps: 0,
        history_steps,
        every,
    });
    Ok(())
}

/// Switch profiling off and return what was recorded (`None` if it was off), the
/// dispatches in step order.
pub fn finish() -> Option<Profile> {
    let mut profile = recorder().take()?.profile;
    // Decoders read their histories at different times; within a step the order is
    // the submission order, which the stable sort keeps.
    profile.dispatches.sort_by_key(|d| d.step);
    Some(profile)
}

/// The mode profiling is on in, if it is.
pub fn mode() -> Option<Mode> {
    recorder().as_ref().map(|r| r.profile.mode)
}

/// Add the tokens a step read back to the profile (in either mode), so that runs with
/// and without instrumentation can be compared token by token. Does nothing while
/// profiling is off.
pub fn record_tokens(tokens: &[u32]) {
    if let Some(r) = recorder().as_mut() {
        r.profile.tokens.extend_from_slice(tokens);
    }
}

/// A host span of the profile ([`Mode::Dispatches`]), recorded by [`HostSpan::end`] or
/// when dropped.
pub(crate) struct HostSpan(Option<(String, Instant)>);

pub(crate) fn span(name: &str) -> HostSpan {
    let on = recorder()
        .as_ref()
        .is_some_and(|r| r.profile.mode == Mode::Dispatches);
    HostSpan(on.then(|| (name.to_string(), Instant::now())))
}

impl HostSpan {
    pub(crate) fn end(self) {}
}

impl Drop for HostSpan {
    fn drop(&mut self) {
        if let Some((name, start)) = self.0.take() {
            if let Some(r) = recorder().as_mut() {
                r.profile.host.record(&name, start, Instant::now());
            }
        }
    }
}

/// Bytes and FLOPs of one dispatch: fixed, plus per position of the context.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Work {
    bytes: u64,
    bytes_per_position: u64,
    flops: u64,
    flops_per_position: u64,
}

/// Where each dispatch reads and writes, reduced to [`Work`] (see the module docs).
fn work_model(
    graph: &DecodeGraph,
    config: &ModelConfig,
    src: &dyn StoredTensors,
) -> Result<Vec<Work>, GpuError> {
    let end = |r: Region| match r {
        Region::Act(i) | Region::Step(i) => graph.activations[i].bytes,
        Region::Weights(g) => graph.weights.groups[g].bytes(),
        Region::KCache(_) | Region::VCache(_) => graph.kv.layer_bytes,
    };
    let key = |r: Region| match r {
        Region::Act(i) => (0, i),
        Region::Weights(g) => (1, g),
        Region::KCache(l) => (2, l),
        Region::VCache(l) => (3, l),
        Region::Step(i) => (4, i),
    };
    let mut cuts: HashMap<(u8, usize), BTreeSet<u64>> = HashMap::new();
    for d in &graph.dispatches {
        for op in &d.args {
            if let Operand::At(r, Offset::Fixed(off)) = *op {
                cuts.entry(key(r)).or_default().insert(off);
            }
        }
    }
    let extent = |r: Region, off: u64| {
        let next = cuts
            .get(&key(r))
            .and_then(|c| c.range(off + 1..).next().copied());
        next.unwrap_or_else(|| end(r)).saturating_sub(off)
    };
    // Elements of the weight parts of group `g` that start within `[from, to)`.
    let elements = |g: usize, from: u64, to: u64| -> Result<u64, GpuError> {
        let mut at = 0;
        let mut n = 0;
        for (data, bytes) in &graph.weights.groups[g].parts {
            if (from..to).contains(&at) {
                n += match data {
                    WeightData::Stored(name) | WeightData::Widened(name) => {
                        src.stored(name)?.dims.iter().product::<usize>() as u64
                    }
                    WeightData::Floats(v) => v.len() as u64,
                };
            }
            at += bytes;
        }
        Ok(n)
    };
    let cached_positions = graph.kv.n_blocks as u64 * BLOCK_TOKENS as u64;
    let position_bytes = graph.kv.layer_bytes / cached_positions.max(1);
    let position_elements = (config.kv_heads * config.head_dim) as u64;
    let heads_per_kv = (config.heads / config.kv_heads.max(1)) as u64;
    let access: Vec<_> = graph.kernels.iter().map(param_access).collect();

    let mut out = Vec::with_capacity(graph.dispatches.len());
    for d in &graph.dispatches {
        let mut w = Work::default();
        for (op, acc) in d.args.iter().zip(&access[d.kernel]) {
            let Operand::At(r, Offset::Fixed(off)) = *op else {
                continue;
            };
            let kv = matches!(r, Region::KCache(_) | Region::VCache(_));
            match (acc.read, r) {
                (Access::Direct, Region::Weights(g)) => {
                    let n = extent(r, off);
                    w.bytes += n;
                    w.flops += 2 * elements(g, off, off + n)?;
                }
                (Access::Direct, _) => w.bytes += extent(r, off),
                (Access::Indirect, _) if kv => {
                    w.bytes_per_position += position_bytes;
                    w.flops_per_position += 2 * position_elements * heads_per_kv;
                }
                _ => {}
            }
            match acc.write {
                Access::Direct => w.bytes += extent(r, off),
                Access::Indirect if kv => w.bytes += position_bytes,
                _ => {}
            }
        }
        out.push(w);
    }
    Ok(out)
}

/// One dispatch of the step as the profile names it.
struct Slot {
    kernel: String,
    label: String,
    work: Work,
    /// The steps the dispatch is part of: in the others its slot records nothing.
    rows: Rows,
}

/// What [`prepare`] hands to [`attach`].
pub(crate) struct Prepared {
    slots: Vec<Slot>,
    /// The instrumented kernels, in the graph's order, when profiling samples the steps
    /// (the graph keeps the plain ones); `None` when the graph's kernels were replaced.
    sampled: Option<Vec<Function>>,
}

impl Prepared {
    /// The instrumented kernels to compile beside the graph's plain ones, when only
    /// some steps are instrumented.
    pub(crate) fn take_sampled_kernels(&mut self) -> Option<Vec<Function>> {
        self.sampled.take()
    }
}

/// In [`Mode::Dispatches`]: instrument every kernel of `graph` (in place when every step
/// is instrumented, else beside it) and model each dispatch's work. `None` when profiling
/// is off or only times steps.
pub(crate) fn prepare(
    graph: &mut DecodeGraph,
    config: &ModelConfig,
    src: &dyn StoredTensors,
) -> Result<Option<Prepared>, GpuError> {
    let every = match recorder().as_ref() {
        Some(r) if r.profile.mode == Mode::Dispatches => r.every,
        _ => return Ok(None),
    };
    let work = work_model(graph, config, src)?;
    let slots = graph
        .dispatches
        .iter()
        .zip(work)
        .map(|(d, work)| Slot {
            kernel: graph.kernels[d.kernel].name.clone(),
            label: d.label.clone(),
            work,
            rows: d.rows,
        })
        .collect();
    let instrumented = graph
        .kernels
        .iter()
        .map(|k| {
            quench_prof::instrument(k).map_err(|e| GpuError::Unsupported {
                what: format!("profiling kernel `{}`", k.name),
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sampled = match every {
        1 => {
            graph.kernels = instrumented;
            None
        }
        _ => Some(instrumented),
    };
    Ok(Some(Prepared { slots, sampled }))
}

/// Run the profile's ceiling measurement on `exec`. Does nothing unless instrumenting.
fn measure_ceilings(exec: &mut dyn Executor) -> Option<Result<Ceilings, String>> {
    let mut measure = {
        let mut r = recorder();
        let r = r.as_mut().filter(|r| r.profile.mode == Mode::Dispatches)?;
        r.ceilings.take()?
    };
    let s = span("measure copy bandwidth and FMA throughput");
    let result = measure(exec);
    s.end();
    if let Some(r) = recorder().as_mut() {
        r.ceilings = Some(measure);
    }
    Some(result)
}

/// A step whose records are in the history, not yet read back.
struct Unread {
    /// Its number, `None` when it ran after the decoder's profile ended.
    step: Option<u32>,
    /// Its rows: which dispatches it ran.
    rows: u32,
    /// Its context length, which the KV cache's share of the work model grows with.
    context: u64,
}

/// The profiling state of one decoder.
pub(crate) struct Instrumented {
    history: History,
    slots: Vec<Slot>,
    profile: u64,
    /// The steps in the history, in order.
    unread: Vec<Unread>,
    /// The session whose last step read something back, and when.
    last_read: Option<(u64, Instant)>,
    /// One decode step in this many is instrumented.
    every: u32,
    /// Decode steps this decoder finished while profiling was on.
    steps: u64,
    /// Its entry in the profile's [`Profile::decoders`].
    decoder: usize,
}

fn ring_error(during: &str) -> impl FnOnce(RingError) -> GpuError + '_ {
    move |e| match e {
        RingError::Runtime(source) => GpuError::Runtime {
            during: during.to_string(),
            source: Box::new(source),
        },
        other => GpuError::Unsupported {
            what: during.to_string(),
            reason: other.to_string(),
        },
    }
}

/// Allocate the ring and its history on `exec` and register the decoder with the
/// profile. Returns the profiling state and, per dispatch, the two arguments to append
/// to its launch (its slot: the same on every replay).
pub(crate) fn attach(
    prepared: Prepared,
    exec: &mut dyn Executor,
) -> Result<(Instrumented, Vec<[Arg; 2]>), GpuError> {
    let during = "allocating the profiler's ring buffer and history";
    let slots = u32::try_from(prepared.slots.len()).map_err(|_| GpuError::Unsupported {
        what: format!("profiling {} dispatches per step", prepared.slots.len()),
        reason: "more than 2^32 records".into(),
    })?;
    let (history_steps, every) = recorder()
        .as_ref()
        .map_or((HISTORY_STEPS, 1), |r| (r.history_steps, r.every));
    let mut history = History::new(exec, slots, history_steps).map_err(ring_error(during))?;
    let args = prepared
        .slots
        .iter()
        .map(|slot| history.next(&slot.kernel, StreamId::DEFAULT))
        .collect::<Result<Vec<_>, _>>();
    let args = match args {
        Ok(args) => args,
        Err(e) => {
            let _ = history.release(exec);
            return Err(ring_error(during)(e));
        }
    };
    // Profiling may have been switched off since `prepare`: the kernels still take their
    // slots, but nothing is recorded (profile 0 is never a live one).
    let (profile, decoder) = match recorder().as_mut() {
        Some(r) => {
            r.profile.decoders.push(ProfiledDecoder {
                backend: exec.backend(),
                device: exec.device_name(),
                dispatches_per_step: prepared.slots.iter().filter(|s| s.rows.includes(1)).count(),
                ceilings: None,
            });
            (r.id, r.profile.decoders.len() - 1)
        }
        None => (0, 0),
    };
    Ok((
        Instrumented {
            history,
            slots: prepared.slots,
            profile,
            decoder,
            unread: vec![],
            last_read: None,
            every,
            steps: 0,
        },
        args,
    ))
}

impl Instrumented {
    /// The dispatch each instrumented step ends with: the copy of its records into the
    /// history, on the device.
    pub(crate) fn copy_dispatch(&self) -> &quench_prof::history::CopyDispatch {
        self.history.copy_dispatch()
    }

    /// Whether the decoder's next step runs its instrumented kernels: every
    /// [`Profile::every`]th step, from its first.
    pub(crate) fn instruments_next(&self) -> bool {
        self.steps.is_multiple_of(u64::from(self.every))
    }

    /// Read the steps still in the history into the profile, free the ring and the
    /// history, then measure the ceilings on `exec` (when the decoder goes, after its
    /// other allocations are freed). Measured at the end, the ceilings' copy and FMA
    /// bursts cannot change how the timed steps run: measured before the weights were
    /// uploaded, they left the decode steps of the same process 5–8% slower on an H200.
    pub(crate) fn release(mut self, exec: &mut dyn Executor) {
        // Best effort, as for the decoder's other allocations: steps that cannot be read
        // stay counted in the profile's `unread`.
        let _ = self.read_history(exec);
        let _ = self.history.release(exec);
        if let Some(result) = measure_ceilings(exec) {
            let mut r = recorder();
            let entry = r
                .as_mut()
                .filter(|r| r.id == self.profile)
                .and_then(|r| r.profile.decoders.get_mut(self.decoder));
            if let Some(d) = entry {
                d.ceilings = Some(result);
            }
        }
    }

    /// Read every step in the history back (one copy, which waits for them) and add
    /// their records to the profile, if it is still the one they were recorded for.
    fn read_history(&mut self, exec: &mut dyn Executor) -> Result<(), GpuError> {
        if self.unread.is_empty() {
            return Ok(());
        }
        let numbered = || self.unread.iter().filter_map(|u| u.step);
        let which = match (numbered().next(), numbered().next_back()) {
            (Some(first), Some(last)) => format!("steps {first}-{last}"),
            _ => "steps after the profile ended".to_string(),
        };
        let span = format!("read profile records of {which}");
        let during = format!("reading the profiler's records of {which}");
        let read_at = Instant::now();
        let steps = self.history.read(exec).map_err(ring_error(&during))?;
        let read_end = Instant::now();
        let unread = std::mem::take(&mut self.unread);
        let mut guard = recorder();
        let Some(r) = guard.as_mut().filter(|r| r.id == self.profile) else {
            return Ok(());
        };
        r.profile.host.record(&span, read_at, read_end);
        for (records, step) in steps.into_iter().zip(unread) {
            let Some(number) = step.step else { continue };
            // A step's graph holds only the dispatches of its row count; the other
            // slots record nothing in it.
            let ran = records
                .into_iter()
                .zip(&self.slots)
                .filter(|(_, slot)| slot.rows.includes(step.rows));
            for (mut d, slot) in ran {
                r.profile.unread -= 1;
                d.label = slot.label.clone();
                d.step = Some(number);
                d.bytes = slot.work.bytes + slot.work.bytes_per_position * step.context;
                d.flops = slot.work.flops + slot.work.flops_per_position * step.context;
                r.profile.dispatches.push(d);
            }
        }
        Ok(())
    }
}

/// The host side of one step, started before its first copy.
pub(crate) struct StepTimer {
    session: u64,
    start: Instant,
    submitted: Option<Instant>,
}

impl StepTimer {
    /// `None` when profiling is off.
    pub(crate) fn start(session: u64) -> Option<StepTimer> {
        mode().map(|_| StepTimer {
            session,
            start: Instant::now(),
            submitted: None,
        })
    }
}

/// Mark the end of the step's submission (copies and launches or replay).
pub(crate) fn submitted(timer: &mut Option<StepTimer>) {
    if let Some(t) = timer {
        t.submitted = Some(Instant::now());
    }
}

/// Close the step: number it, and if it was instrumented ([`Instrumented::instruments_next`]
/// before it ran) copy the decoder's ring into its history on the device (no wait), and
/// read the history back if that filled it; add the step time and, for an instrumented
/// step, its spans to the profile. The step ran the dispatches of a step of `rows` rows;
/// `context` is its context length, `read_back` whether it read a token or logits.
pub(crate) fn step_done(
    timer: Option<StepTimer>,
    mut prof: Option<&mut Instrumented>,
    exec: &mut dyn Executor,
    rows: u32,
    context: usize,
    read_back: bool,
) -> Result<(), GpuError> {
    let Some(timer) = timer else { return Ok(()) };
    let done_at = Instant::now();
    // The instrumented step's number in the live profile.
    let mut recorded = None;
    if let Some(p) = prof.as_deref_mut() {
        let instrumented = p.instruments_next();
        p.steps += 1;
        let dispatches = match instrumented {
            true => p.slots.iter().filter(|s| s.rows.includes(rows)).count() as u64,
            false => 0,
        };
        // Numbered (and counted) only in the profile the decoder was loaded under.
        let step = recorder().as_mut().filter(|r| r.id == p.profile).map(|r| {
            let step = r.steps;
            r.steps += 1;
            r.profile.submitted += dispatches;
            r.profile.unread += dispatches;
            step
        });
        if instrumented {
            // The step's graph ended with the history's copy dispatch, whichever profile
            // is live now: count the copy so that the rooms stay in step with the device.
            p.history.copied().map_err(|e| {
                let during = format!(
                    "decode step at position {}: keeping the profiler's records",
                    context - 1
                );
                ring_error(&during)(e)
            })?;
            p.unread.push(Unread {
                step,
                rows,
                context: context as u64,
            });
            if p.history.is_full() {
                p.read_history(exec)?;
            }
            recorded = step;
        }
    }
    let end = Instant::now();
    let mut guard = recorder();
    let Some(r) = guard.as_mut() else {
        return Ok(());
    };
    if read_back {
        r.profile
            .step_ns
            .push(end.duration_since(timer.start).as_nanos() as u64);
    }
    let Some(p) = prof.filter(|p| p.profile == r.id) else {
        return Ok(());
    };
    if let Some(step) = recorded {
        let host = &mut r.profile.host;
        if let Some((session, at)) = p.last_read {
            if session == timer.session {
                host.record("sampling and host work between tokens", at, timer.start);
            }
        }
        let submitted = timer.submitted.unwrap_or(done_at);
        host.record(&format!("step {step}: submit"), timer.start, submitted);
        host.record(
            &format!("step {step}: wait and read back"),
            submitted,
            done_at,
        );
    }
    p.last_read = read_back.then_some((timer.session, end));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn tokens_are_kept_in_either_mode_while_profiling_is_on() {
        let seed: u64 = rand::random();
        eprintln!("seed {seed}");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut tokens = || -> Vec<u32> { (0..rng.gen_range(1..9)).map(|_| rng.gen()).collect() };
        // Nothing is kept while profiling is off.
        record_tokens(&tokens());
        for mode in [Mode::StepTimes, Mode::Dispatches] {
            start(ProfileOptions {
                mode,
                ceilings: None,
            })
            .expect("profiling was off");
            let (a, b) = (tokens(), tokens());
            record_tokens(&a);
            record_tokens(&b);
            let p = finish().expect("profiling was on");
            assert_eq!(p.tokens, [a, b].concat(), "{mode:?}");
        }
    }
}
