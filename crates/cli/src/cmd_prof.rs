//! `quench prof`: GPU time of every kernel dispatch, from the kernels' own timestamps.
//!
//! `quench prof [OPTIONS] -- COMMAND …` runs another quench command in this process with
//! profiling on (every decode step of every GPU decoder it loads, graph replays
//! included), then writes a Chrome trace, prints a per-kernel summary with the bandwidth
//! and FLOP/s achieved against the ceilings measured in the same run, and optionally
//! draws a roofline. `--every N` instruments only one decode step in N (the others replay
//! the plain kernels), for a cheaper profile of fewer steps. With `--overhead N` it
//! instead runs the command 2·N times, plain and profiled in turn, and reports what
//! profiling costs a decode step. Without a command, library kernels are profiled one by
//! one.

use std::path::{Path, PathBuf};

use quench_engine::gpu::profile::{self, Mode, Profile, ProfileOptions};
use quench_kernels::{compare, library, run_case, CaseArg, KernelSpec};
use quench_prof::ceiling::measure_fma_flops;
use quench_prof::order::{check_order, OrderCheck};
use quench_prof::roofline::roofline_png;
use quench_prof::summary::{render, to_json};
use quench_prof::{chrome_trace, instrument, summarize, Ceilings, Dispatch, HostSpans, Ring};
use quench_rt::{CudaExecutor, Executor, InterpExecutor, StreamId};
use serde_json::{json, Value};

use crate::cmd_bench::median;
use crate::cmd_check_kernels::copy_bandwidth_gbps;
use crate::receipt;

/// Decode-step overhead of profiling that `--overhead` holds it to.
const OVERHEAD_TARGET: f64 = 0.03;
/// The FMA ceiling's launch: blocks of 256 threads and iterations per chain.
const FMA_BLOCKS: u32 = 4096;
const FMA_ITERS: u32 = 4096;
/// Timed repeats of each ceiling measurement.
const CEILING_REPS: u32 = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The interpreter: small problem sizes, times on its virtual clock (one ns per warp
    /// instruction issued).
    Interp,
    /// The GPU: each kernel's default (full-size) parameters.
    Cuda,
}

#[derive(clap::Args)]
pub struct ProfArgs {
    /// The quench command to profile, after `--` (`-- generate --device cuda "Hello"`,
    /// `-- bench --device cuda`, `-- chat …`, `-- check …`). Without one, library kernels
    /// are profiled one by one.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
    /// Where to write the Chrome trace / Perfetto JSON.
    #[arg(long, default_value = "prof-trace.json")]
    pub trace: PathBuf,
    /// Also draw the roofline (bandwidth and FLOP/s per kernel against the measured
    /// ceilings) to this PNG file.
    #[arg(long, value_name = "FILE.png")]
    pub roofline: Option<PathBuf>,
    /// Also write the summary as a JSON receipt to FILE; without FILE, print it (one line
    /// on standard output) instead of the table.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Measure what profiling costs: run the command PAIRS times plain and PAIRS times
    /// profiled, in turns, and compare the median host time of their decode steps.
    #[arg(long, value_name = "PAIRS")]
    pub overhead: Option<u32>,
    /// Instrument one decode step in N (counting from each decoder's first step) and run
    /// the others with the plain kernels: about 1/N of the cost, and records of steps 0,
    /// N, 2N… only. 1: every step.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub every: u32,
    /// Library kernels only: these kernels (comma-separated names; default: all).
    #[arg(long, value_delimiter = ',')]
    pub kernels: Vec<String>,
    /// Library kernels only: where they run.
    #[arg(long, value_enum, default_value_t = Backend::Interp)]
    pub backend: Backend,
    /// Library kernels only: launches per kernel.
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Library kernels only: seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Library kernels only: which GPU, with `--backend cuda`.
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
}

pub fn run(a: &ProfArgs) -> Result<(), String> {
    if a.every == 0 {
        return Err(
            "--every 0 instruments no step: give N of at least 1 (1 instruments every decode step)"
                .into(),
        );
    }
    if a.command.is_empty() {
        if a.overhead.is_some() || a.roofline.is_some() || a.every != 1 {
            return Err(
                "--overhead, --roofline and --every need a command to profile (after `--`)".into(),
            );
        }
        return run_library(a);
    }
    if !a.kernels.is_empty() {
        return Err(
            "--kernels profiles library kernels; it does not combine with a command".into(),
        );
    }
    let cli = crate::parse_command(&a.command)?;
    if matches!(cli, crate::Command::Prof(_)) {
        return Err("`quench prof` cannot profile itself".into());
    }
    match a.overhead {
        Some(pairs) => overhead(a, pairs, |mode| run_profiled(&cli, mode, a.every)),
        None => {
            let (profile, result) = run_profiled(&cli, Mode::Dispatches, a.every);
            result?;
            report(a, &profile)
        }
    }
}

/// The copy bandwidth and FMA throughput of `exec`'s device; none on the interpreter,
/// whose clock counts instructions.
fn measure_ceilings(exec: &mut dyn Executor) -> Result<Ceilings, String> {
    if exec.backend() == "interp" {
        return Ok(Ceilings::default());
    }
    let copy = copy_bandwidth_gbps(exec, CEILING_REPS)? * 1e9;
    let flops =
        measure_fma_flops(exec, FMA_BLOCKS, FMA_ITERS, CEILING_REPS).map_err(|e| e.to_string())?;
    Ok(Ceilings {
        copy_bytes_per_s: Some(copy),
        flops: Some(flops),
    })
}

/// Run `command` with profiling on in `mode`, instrumenting one decode step in `every`;
/// the profile, whatever the command returned.
fn run_profiled(command: &crate::Command, mode: Mode, every: u32) -> (Profile, Result<(), String>) {
    let ceilings: Option<profile::MeasureCeilings> = match mode {
        Mode::Dispatches => Some(Box::new(measure_ceilings)),
        Mode::StepTimes => None,
    };
    let started = profile::start_sampled(
        ProfileOptions { mode, ceilings },
        every,
        profile::HISTORY_STEPS,
    )
    .map_err(|e| e.to_string());
    let result = started.and_then(|()| crate::run(command));
    let profile = profile::finish().unwrap_or_else(|| Profile {
        mode,
        every,
        host: HostSpans::new(),
        dispatches: vec![],
        decoders: vec![],
        submitted: 0,
        unread: 0,
        step_ns: vec![],
        tokens: vec![],
    });
    (profile, result)
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("writing {}: {e}", path.display()))
}

/// The `--json` file, if one was named (`--json` alone prints to standard output).
fn json_file(a: &ProfArgs) -> Option<&Path> {
    a.json.as_deref().filter(|p| p.as_os_str() != "-")
}

/// `--json`: the receipt to its file, or as one line on standard output.
fn emit_json(a: &ProfArgs, v: &Value) -> Result<(), String> {
    match json_file(a) {
        Some(p) => receipt::write_json(p, v),
        None => {
            println!("{}", serde_json::to_string(v).map_err(|e| e.to_string())?);
            Ok(())
        }
    }
}

fn device_json(d: &profile::ProfiledDecoder) -> Value {
    json!({"name": d.device, "backend": d.backend})
}

/// What a profiled run's records must show: every submitted dispatch seen running, and
/// the dispatches of each step one after another (they are serialized on one stream).
struct RecordChecks {
    /// Launches the records counted (from each record's launch counter).
    recorded: u64,
    submitted: u64,
    /// Submitted dispatches whose records were still on a decoder's device when the
    /// command ended.
    unread: u64,
    /// Records read back, one per dispatch and step (the trace's slices).
    records: usize,
    order: OrderCheck,
}

/// Overlaps listed in a receipt (the count covers all of them).
const OVERLAPS_LISTED: usize = 8;

impl RecordChecks {
    fn of(profile: &Profile) -> RecordChecks {
        RecordChecks {
            recorded: profile.dispatches.iter().map(|d| d.launches).sum(),
            submitted: profile.submitted,
            unread: profile.unread,
            records: profile.dispatches.len(),
            order: check_order(&profile.dispatches),
        }
    }

    fn failures(&self, dispatches: &[Dispatch]) -> Vec<String> {
        let mut out = vec![];
        if self.recorded != self.submitted || self.records as u64 != self.submitted {
            let unread = match self.unread {
                0 => String::new(),
                n => format!(
                    " ({n} of them still on the device of a decoder the command did not drop)"
                ),
            };
            out.push(format!(
                "the profile's {} dispatch records saw {} dispatches run, but {} were submitted{unread}",
                self.records, self.recorded, self.submitted
            ));
        }
        if let Some(o) = self.order.overlaps.first() {
            let (a, b) = (&dispatches[o.first], &dispatches[o.second]);
            out.push(format!(
                "{} of {} consecutive dispatches overlap although serialized; the first: `{}` began {} ns \
                 before `{}` ended (step {})",
                self.order.overlaps.len(),
                self.order.pairs,
                b.kernel,
                o.by_ns,
                a.kernel,
                o.step.map_or("-".to_string(), |s| s.to_string())
            ));
        }
        out
    }

    fn to_json(&self, dispatches: &[Dispatch]) -> Value {
        let overlaps: Vec<Value> = self
            .order
            .overlaps
            .iter()
            .take(OVERLAPS_LISTED)
            .map(|o| {
                json!({"step": o.step, "stream": o.stream, "first": dispatches[o.first].kernel,
                    "second": dispatches[o.second].kernel, "by_ns": o.by_ns})
            })
            .collect();
        json!({
            "dispatches_recorded": self.recorded,
            "dispatches_submitted": self.submitted,
            "dispatches_unread": self.unread,
            "dispatch_records": self.records,
            "replays_ordered": {
                "ordered": self.order.overlaps.is_empty(),
                "pairs_compared": self.order.pairs,
                "violations": self.order.overlaps.len(),
                "first_violations": overlaps,
            },
        })
    }
}

/// Write the trace (and roofline), print or emit the summary of a profiled run; fail,
/// after writing them, if the records miss a dispatch or show serialized ones overlapping.
fn report(a: &ProfArgs, profile: &Profile) -> Result<(), String> {
    let Some(decoder) = profile.decoders.first() else {
        return Err(
            "the command put no decoder on a GPU (or the interpreter), so there is nothing to \
                    profile: run it with `--device cuda`"
                .into(),
        );
    };
    let checks = RecordChecks::of(profile);
    let failures = checks.failures(&profile.dispatches);
    let ceilings = match &decoder.ceilings {
        Some(Ok(c)) => *c,
        Some(Err(e)) => {
            eprintln!("ceilings not measured: {e}");
            Ceilings::default()
        }
        None => Ceilings::default(),
    };
    let trace = chrome_trace(&profile.dispatches, &profile.host);
    write(
        &a.trace,
        serde_json::to_string(&trace)
            .map_err(|e| e.to_string())?
            .as_bytes(),
    )?;
    let summary = summarize(&profile.dispatches);
    let clock = if decoder.backend == "interp" {
        " (interpreter virtual clock)"
    } else {
        ""
    };
    let sampled = match profile.every {
        1 => String::new(),
        n => format!(" (one in {n} instrumented)"),
    };
    eprintln!(
        "{} dispatches in {} decode steps{sampled} on {}{clock}; trace: {}",
        profile.dispatches.len(),
        summary.steps,
        decoder.device,
        a.trace.display()
    );
    if let Some(path) = &a.roofline {
        let title = format!("quench prof: {}, {} steps", decoder.device, summary.steps);
        write(
            path,
            &roofline_png(&summary, &ceilings, &title).map_err(|e| e.to_string())?,
        )?;
        eprintln!("roofline: {}", path.display());
    }
    if a.json.is_none() || json_file(a).is_some() {
        print!("{}", render(&summary, &ceilings));
    }
    if a.json.is_some() {
        let host: Vec<Value> = profile
            .host
            .spans()
            .iter()
            .map(|s| json!({"name": s.name, "start_ns": s.start_ns, "end_ns": s.end_ns}))
            .collect();
        let mut outcome = json!({
            "clock": if decoder.backend == "interp" { "interpreter virtual clock" } else { "%globaltimer" },
            "dispatches_per_step": decoder.dispatches_per_step,
            "decode_step_host_ms": step_stats(&profile.step_ns),
            "summary": to_json(&summary, &ceilings),
            "host_spans": host,
            "trace": a.trace,
            "roofline": a.roofline,
            "passed": failures.is_empty(),
        });
        if let (Value::Object(o), Value::Object(c)) =
            (&mut outcome, checks.to_json(&profile.dispatches))
        {
            o.extend(c);
        }
        let bound = json!({"dispatches_recorded_equal_submitted": true, "replays_ordered": true});
        let inputs = json!({"command": a.command, "every": profile.every});
        emit_json(
            a,
            &receipt::receipt("prof", device_json(decoder), inputs, bound, outcome),
        )?;
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("; ")),
    }
}

fn step_stats(step_ns: &[u64]) -> Value {
    if step_ns.is_empty() {
        return Value::Null;
    }
    let ms: Vec<f64> = step_ns.iter().map(|&n| n as f64 / 1e6).collect();
    json!({"steps": ms.len(), "median": median(ms.clone()), "min": ms.iter().copied().fold(f64::INFINITY, f64::min)})
}

/// The tokens of a plain and a profiled run of the same command, compared.
#[derive(Debug, PartialEq)]
struct TokenMatch {
    plain: usize,
    profiled: usize,
    /// Index of the first token that differs (or that one run lacks); `None`: identical.
    first_difference: Option<usize>,
}

impl TokenMatch {
    fn of(plain: &[u32], profiled: &[u32]) -> TokenMatch {
        let differs = plain.iter().zip(profiled).position(|(a, b)| a != b);
        let first_difference =
            differs.or((plain.len() != profiled.len()).then(|| plain.len().min(profiled.len())));
        TokenMatch {
            plain: plain.len(),
            profiled: profiled.len(),
            first_difference,
        }
    }

    fn to_json(&self) -> Value {
        json!({"plain_tokens": self.plain, "profiled_tokens": self.profiled,
            "identical": self.first_difference.is_none(), "first_difference": self.first_difference})
    }
}

/// What `--overhead` takes of each run's step times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StepStatistic {
    /// Every step instrumented: the median, robust to a slow step.
    Median,
    /// One step in several instrumented: the mean, since a median of mostly plain steps
    /// would not see the instrumented ones.
    Mean,
}

impl StepStatistic {
    fn for_every(every: u32) -> StepStatistic {
        match every {
            1 => StepStatistic::Median,
            _ => StepStatistic::Mean,
        }
    }

    fn name(self) -> &'static str {
        match self {
            StepStatistic::Median => "median",
            StepStatistic::Mean => "mean",
        }
    }

    fn of(self, ms: Vec<f64>) -> f64 {
        match self {
            StepStatistic::Median => median(ms),
            StepStatistic::Mean => ms.iter().sum::<f64>() / ms.len().max(1) as f64,
        }
    }
}

/// `--overhead`: `run` the command in `pairs` pairs of plain and profiled runs; fails,
/// after the receipt, if profiling costs more than the target or changes a token.
fn overhead(
    a: &ProfArgs,
    pairs: u32,
    mut run: impl FnMut(Mode) -> (Profile, Result<(), String>),
) -> Result<(), String> {
    if pairs == 0 {
        return Err("--overhead needs at least one pair of runs".into());
    }
    let statistic = StepStatistic::for_every(a.every);
    let mut runs = vec![];
    let mut device = Value::Null;
    let (mut plain, mut instrumented) = (vec![], vec![]);
    let mut matches = vec![];
    for pair in 0..pairs {
        let mut plain_tokens = vec![];
        for mode in [Mode::StepTimes, Mode::Dispatches] {
            let (profile, result) = run(mode);
            result?;
            if profile.step_ns.is_empty() {
                return Err(
                    "the command ran no decode step that read a token back on a GPU decoder \
                            (or the interpreter): run it with `--device cuda`"
                        .into(),
                );
            }
            if let Some(d) = profile.decoders.first() {
                device = device_json(d);
            }
            let ms: Vec<f64> = profile.step_ns.iter().map(|&n| n as f64 / 1e6).collect();
            let m = statistic.of(ms.clone());
            let name = match mode {
                Mode::StepTimes => "plain",
                Mode::Dispatches => "profiled",
            };
            let stat = statistic.name();
            eprintln!(
                "pair {}/{pairs} {name:>8}: {} decode steps, {stat} {m:.4} ms",
                pair + 1,
                ms.len()
            );
            let mut run_json = json!({"pair": pair, "mode": name, "decode_steps": ms.len(),
                "tokens": profile.tokens.len()});
            run_json[format!("{stat}_step_ms")] = json!(m);
            match mode {
                Mode::StepTimes => {
                    plain.push(m);
                    plain_tokens = profile.tokens;
                }
                Mode::Dispatches => {
                    instrumented.push(m);
                    let tokens = TokenMatch::of(&plain_tokens, &profile.tokens);
                    if let Some(i) = tokens.first_difference {
                        let pair = pair + 1;
                        eprintln!("pair {pair}/{pairs}: the profiled run's tokens differ from the plain run's at {i}");
                    }
                    run_json["tokens_match_plain"] = tokens.to_json();
                    matches.push(tokens);
                    if let (Value::Object(r), Value::Object(c)) = (
                        &mut run_json,
                        RecordChecks::of(&profile).to_json(&profile.dispatches),
                    ) {
                        r.extend(c);
                    }
                }
            }
            runs.push(run_json);
        }
    }
    let (p, q) = (median(plain), median(instrumented));
    let cost = q / p - 1.0;
    // `None` when no run recorded a token (the command's decoder reports none).
    let identical = match matches.iter().all(|m| m.plain == 0 && m.profiled == 0) {
        true => None,
        false => Some(matches.iter().all(|m| m.first_difference.is_none())),
    };
    let tokens_line = match identical {
        Some(true) => format!("tokens identical ({} per run)", matches[0].plain),
        Some(false) => "tokens DIFFER between plain and profiled runs".to_string(),
        None => "no tokens recorded to compare".to_string(),
    };
    let sampled = match a.every {
        1 => String::new(),
        n => format!(", one step in {n} instrumented"),
    };
    let line = format!(
        "decode step: {p:.4} ms plain, {q:.4} ms profiled{sampled} (medians over {pairs} runs of each run's {} step): \
         overhead {:+.2}% (target below {:.0}%); {tokens_line}",
        statistic.name(),
        100.0 * cost,
        100.0 * OVERHEAD_TARGET
    );
    match &a.json {
        Some(_) if json_file(a).is_none() => eprintln!("{line}"),
        _ => println!("{line}"),
    }
    if a.json.is_some() {
        let outcome = json!({
            "plain_step_ms": p,
            "profiled_step_ms": q,
            "overhead": cost,
            "within_target": cost < OVERHEAD_TARGET,
            "tokens_identical": identical,
            "runs": runs,
        });
        let compared = format!(
            "{} host time of the decode steps that read a token back, per run; medians over runs; \
             the tokens the decoder read back, plain against profiled run of each pair",
            statistic.name()
        );
        let inputs =
            json!({"command": a.command, "pairs": pairs, "every": a.every, "compared": compared});
        let bound = json!({"overhead_below": OVERHEAD_TARGET, "tokens_identical": true});
        emit_json(
            a,
            &receipt::receipt("prof-overhead", device, inputs, bound, outcome),
        )?;
    }
    let mut failures = vec![];
    if cost >= OVERHEAD_TARGET {
        failures.push(format!(
            "profiling cost {:.2}% of a decode step, over the {:.0}% target",
            100.0 * cost,
            100.0 * OVERHEAD_TARGET
        ));
    }
    if identical == Some(false) {
        failures.push("profiling changed the tokens the command generated".to_string());
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(failures.join("; ")),
    }
}

fn selected(names: &[String]) -> Result<Vec<KernelSpec>, String> {
    if names.is_empty() {
        return Ok(library());
    }
    names
        .iter()
        .map(|n| quench_kernels::find(n).map_err(|e| e.to_string()))
        .collect()
}

/// Library kernels one by one, each checked against its reference.
fn run_library(a: &ProfArgs) -> Result<(), String> {
    if a.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    let specs = selected(&a.kernels)?;
    let mut exec: Box<dyn Executor> = match a.backend {
        Backend::Interp => Box::new(InterpExecutor::new()),
        Backend::Cuda => {
            Box::new(CudaExecutor::new(a.gpu).map_err(|e| format!("--backend cuda: {e}"))?)
        }
    };
    let exec = exec.as_mut();
    let slots = specs.len() as u32 * a.reps;
    let mut ring = Ring::new(exec, slots).map_err(|e| e.to_string())?;
    let mut host = HostSpans::new();
    for spec in &specs {
        let params = match a.backend {
            Backend::Interp => spec.parse_params(spec.small_params()),
            Backend::Cuda => Ok(spec.default_params()),
        }
        .map_err(|e| e.to_string())?;
        let span = host.begin(&format!("prepare {}", spec.name));
        let mut case = spec.make_case(&params, a.seed).map_err(|e| e.to_string())?;
        case.kernel = instrument(&case.kernel).map_err(|e| e.to_string())?;
        span.end(&mut host);
        for rep in 0..a.reps {
            let mut c = case.clone();
            let extra = ring
                .next(spec.name, StreamId::DEFAULT)
                .map_err(|e| e.to_string())?;
            c.args.extend(extra.map(CaseArg::Scalar));
            let span = host.begin(&format!("run {}", spec.name));
            let out = run_case(exec, &c).map_err(|e| e.to_string())?;
            span.end(&mut host);
            if rep == 0 {
                for r in compare(&c, &out).map_err(|e| e.to_string())? {
                    if !r.passed {
                        return Err(format!(
                            "{} ({}): the instrumented kernel fails its check: {r}",
                            spec.name, c.shape
                        ));
                    }
                }
            }
        }
    }
    let dispatches = ring.collect(exec).map_err(|e| e.to_string())?;
    ring.release(exec).map_err(|e| e.to_string())?;
    let trace = chrome_trace(&dispatches, &host);
    write(
        &a.trace,
        serde_json::to_string(&trace)
            .map_err(|e| e.to_string())?
            .as_bytes(),
    )?;
    let clock = match a.backend {
        Backend::Interp => " (interpreter virtual clock)",
        Backend::Cuda => "",
    };
    eprintln!(
        "{} dispatches on {}{clock}; trace: {}",
        dispatches.len(),
        exec.device_name(),
        a.trace.display()
    );
    let summary = summarize(&dispatches);
    match a.json {
        None => print!("{}", render(&summary, &Ceilings::default())),
        Some(_) => emit_json(
            a,
            &json!({"format": "quench-prof-kernels/1", "device": exec.device_name(),
            "summary": to_json(&summary, &Ceilings::default()), "trace": a.trace}),
        )?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(command: &[&str]) -> ProfArgs {
        ProfArgs {
            command: command.iter().map(|s| s.to_string()).collect(),
            trace: PathBuf::from("unused.json"),
            roofline: None,
            json: None,
            overhead: None,
            every: 1,
            kernels: vec![],
            backend: Backend::Interp,
            reps: 3,
            seed: 1,
            gpu: 0,
        }
    }

    #[test]
    fn interp_run_writes_trace_with_every_launch() {
        let trace =
            std::env::temp_dir().join(format!("quench-prof-test-{}.json", std::process::id()));
        let a = ProfArgs {
            kernels: vec!["add_f32".into(), "softmax_f32".into()],
            reps: 2,
            trace: trace.clone(),
            seed: 7,
            ..args(&[])
        };
        run(&a).expect("profiled run");
        let text = std::fs::read_to_string(&trace).expect("trace written");
        std::fs::remove_file(&trace).expect("remove trace");
        let v: serde_json::Value = serde_json::from_str(&text).expect("trace parses");
        let events = v["traceEvents"].as_array().expect("traceEvents");
        let gpu: Vec<&serde_json::Value> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == 1)
            .collect();
        let names: Vec<&str> = gpu
            .iter()
            .map(|e| e["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, ["add_f32", "add_f32", "softmax_f32", "softmax_f32"]);
        for w in gpu.windows(2) {
            let end = w[0]["ts"].as_f64().expect("ts") + w[0]["dur"].as_f64().expect("dur");
            assert!(
                w[0]["dur"].as_f64().expect("dur") > 0.0 && end <= w[1]["ts"].as_f64().expect("ts"),
                "{w:?}"
            );
        }
        assert_eq!(
            events
                .iter()
                .filter(|e| e["ph"] == "X" && e["pid"] == 2)
                .count(),
            2 + 4
        );
    }

    #[test]
    fn bad_requests_are_refused_by_name() {
        let a = ProfArgs {
            reps: 0,
            ..args(&[])
        };
        assert!(run(&a).unwrap_err().contains("--reps"));
        let e = run(&ProfArgs {
            overhead: Some(2),
            ..args(&[])
        })
        .unwrap_err();
        assert!(e.contains("need a command"), "{e}");
        let e = run(&args(&["prof", "--", "devices"])).unwrap_err();
        assert!(e.contains("cannot profile itself"), "{e}");
        let e = run(&args(&["no-such-command"])).unwrap_err();
        assert!(e.contains("no-such-command"), "{e}");
        let e = run(&ProfArgs {
            kernels: vec!["add_f32".into()],
            ..args(&["devices"])
        })
        .unwrap_err();
        assert!(e.contains("--kernels"), "{e}");
        let e = run(&ProfArgs {
            every: 0,
            ..args(&["generate"])
        })
        .unwrap_err();
        assert!(e.contains("--every 0 instruments no step"), "{e}");
        let e = run(&ProfArgs {
            every: 4,
            ..args(&[])
        })
        .unwrap_err();
        assert!(e.contains("--every need a command"), "{e}");
    }

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("quench-prof-{}-{name}", std::process::id()))
    }

    /// Two steps of three dispatches on the interpreter.
    fn fake_profile() -> Profile {
        let mut host = HostSpans::new();
        let t = std::time::Instant::now();
        host.record("step 0: submit", t, t);
        let mut dispatches = vec![];
        for step in 0..2u32 {
            for (i, kernel) in ["qgemv_q8_0_xf32", "attention_decode_f16", "argmax_f32"]
                .iter()
                .enumerate()
            {
                let start = 10_000 * step as u64 + 1_000 * i as u64;
                dispatches.push(quench_prof::Dispatch {
                    kernel: kernel.to_string(),
                    label: format!("part {i}"),
                    step: Some(step),
                    start_ns: start,
                    end_ns: start + 500,
                    launches: 1,
                    lanes_ended: 4,
                    bytes: 1_000 * (i as u64 + 1),
                    flops: if i == 0 { 2_000 } else { 0 },
                    ..quench_prof::Dispatch::default()
                });
            }
        }
        Profile {
            mode: Mode::Dispatches,
            every: 1,
            host,
            dispatches,
            decoders: vec![profile::ProfiledDecoder {
                backend: "interp",
                device: "the interpreter".into(),
                dispatches_per_step: 3,
                ceilings: Some(Ok(Ceilings {
                    copy_bytes_per_s: Some(4e9),
                    flops: Some(1e10),
                })),
            }],
            submitted: 6,
            unread: 0,
            step_ns: vec![1_000_000, 1_200_000],
            tokens: vec![17, 3, 3, 60],
        }
    }

    #[test]
    fn report_writes_trace_roofline_and_json() {
        let (trace, png, json) = (
            temp("trace.json"),
            temp("roofline.png"),
            temp("summary.json"),
        );
        let a = ProfArgs {
            trace: trace.clone(),
            roofline: Some(png.clone()),
            json: Some(json.clone()),
            ..args(&["generate"])
        };
        report(&a, &fake_profile()).expect("reported");
        let t: Value =
            serde_json::from_str(&std::fs::read_to_string(&trace).expect("trace")).expect("parses");
        let gpu = t["traceEvents"]
            .as_array()
            .expect("events")
            .iter()
            .filter(|e| e["pid"] == 1 && e["ph"] == "X")
            .count();
        assert_eq!(gpu, 6);
        assert!(std::fs::read(&png)
            .expect("png")
            .starts_with(b"\x89PNG\r\n\x1a\n"));
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        assert_eq!(
            (j["format"].as_str(), j["kind"].as_str()),
            (Some(receipt::FORMAT), Some("prof"))
        );
        let o = &j["outcome"];
        assert_eq!(
            (
                o["dispatches_recorded"].as_u64(),
                o["dispatches_submitted"].as_u64()
            ),
            (Some(6), Some(6))
        );
        assert_eq!(o["dispatch_records"], 6);
        assert_eq!(o["replays_ordered"]["ordered"], true);
        assert_eq!(
            (
                o["replays_ordered"]["pairs_compared"].as_u64(),
                o["replays_ordered"]["violations"].as_u64()
            ),
            (Some(4), Some(0))
        );
        assert_eq!(
            (
                o["passed"].as_bool(),
                j["bound"]["replays_ordered"].as_bool()
            ),
            (Some(true), Some(true))
        );
        assert_eq!(o["summary"]["steps"], 2);
        assert_eq!(o["summary"]["kernels"].as_array().expect("rows").len(), 3);
        assert_eq!(o["summary"]["ceilings"]["copy_bytes_per_s"], 4e9);
        assert_eq!(o["decode_step_host_ms"]["steps"], 2);
        assert_eq!(j["device"]["backend"], "interp");
        assert_eq!(j["inputs"]["every"], 1);
        for p in [trace, png, json] {
            std::fs::remove_file(p).expect("remove");
        }

        // A profile whose records do not match the submissions fails, with its receipt.
        let unused = temp("unused.json");
        let json = temp("lost.json");
        let a = ProfArgs {
            trace: unused.clone(),
            json: Some(json.clone()),
            ..args(&["generate"])
        };
        let mut lost = fake_profile();
        lost.submitted = 7;
        let e = report(&a, &lost).unwrap_err();
        assert!(
            e.contains("6 dispatch records saw 6 dispatches run, but 7 were submitted"),
            "{e}"
        );
        assert!(!e.contains("still on the device"), "{e}");
        // Records left on a decoder's device are named as such.
        lost.unread = 1;
        let e = report(&a, &lost).unwrap_err();
        assert!(
            e.contains("but 7 were submitted (1 of them still on the device"),
            "{e}"
        );
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        assert_eq!(j["outcome"]["dispatches_unread"], 1);
        // A dispatch whose launch was not seen (its counter did not move) is not recorded.
        let mut unseen = fake_profile();
        unseen.dispatches[4].launches = 0;
        let e = report(&a, &unseen).unwrap_err();
        assert!(
            e.contains("saw 5 dispatches run, but 6 were submitted"),
            "{e}"
        );
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        assert_eq!(
            (
                j["outcome"]["dispatches_recorded"].as_u64(),
                j["outcome"]["passed"].as_bool()
            ),
            (Some(5), Some(false))
        );

        // Serialized dispatches that overlap fail, named, with their receipt.
        let mut overlapping = fake_profile();
        overlapping.dispatches[5].start_ns = overlapping.dispatches[4].end_ns - 30;
        let e = report(&a, &overlapping).unwrap_err();
        assert!(
            e.contains("1 of 4 consecutive")
                && e.contains("`argmax_f32` began 30 ns before `attention_decode_f16`"),
            "{e}"
        );
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        let order = &j["outcome"]["replays_ordered"];
        assert_eq!(
            (order["ordered"].as_bool(), order["violations"].as_u64()),
            (Some(false), Some(1))
        );
        assert_eq!(
            order["first_violations"][0],
            json!({"step": 1, "stream": 0, "first": "attention_decode_f16",
            "second": "argmax_f32", "by_ns": 30})
        );
        for p in [unused, json] {
            std::fs::remove_file(p).expect("remove");
        }
    }

    #[test]
    fn overhead_alternates_runs_and_compares_median_steps() {
        let json = temp("overhead.json");
        let a = ProfArgs {
            json: Some(json.clone()),
            overhead: Some(2),
            ..args(&["bench"])
        };
        let mut modes = vec![];
        overhead(&a, 2, |mode| {
            modes.push(mode);
            let mut p = fake_profile();
            p.mode = mode;
            // Plain steps of 1 ms, profiled ones 2% longer (one slow outlier each).
            let base = if mode == Mode::StepTimes {
                1_000_000
            } else {
                1_020_000
            };
            p.step_ns = vec![base, base, 9 * base];
            (p, Ok(()))
        })
        .expect("measured");
        assert_eq!(
            modes,
            [
                Mode::StepTimes,
                Mode::Dispatches,
                Mode::StepTimes,
                Mode::Dispatches
            ]
        );
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        assert_eq!(
            (j["kind"].as_str(), j["bound"]["overhead_below"].as_f64()),
            (Some("prof-overhead"), Some(0.03))
        );
        let o = &j["outcome"];
        assert!(
            (o["overhead"].as_f64().expect("overhead") - 0.02).abs() < 1e-9,
            "{j}"
        );
        assert_eq!(o["within_target"], true);
        let runs = o["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), 4);
        assert_eq!(
            (
                o["tokens_identical"].as_bool(),
                j["bound"]["tokens_identical"].as_bool()
            ),
            (Some(true), Some(true))
        );
        assert_eq!(
            runs[1]["tokens_match_plain"],
            json!({"plain_tokens": 4, "profiled_tokens": 4,
            "identical": true, "first_difference": null})
        );
        assert_eq!(
            (
                runs[3]["dispatches_recorded"].as_u64(),
                runs[3]["replays_ordered"]["violations"].as_u64()
            ),
            (Some(6), Some(0))
        );

        // A profiled run whose tokens differ (here from the third on, in the second
        // pair) fails within the target, and the receipt says where.
        let mut calls = 0;
        let e = overhead(&a, 2, |mode| {
            calls += 1;
            let mut p = fake_profile();
            p.mode = mode;
            if calls == 4 {
                p.tokens[2] += 1;
            }
            (p, Ok(()))
        })
        .unwrap_err();
        assert!(
            e.contains("changed the tokens") && !e.contains("target"),
            "{e}"
        );
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        let o = &j["outcome"];
        assert_eq!(
            (
                o["tokens_identical"].as_bool(),
                o["within_target"].as_bool()
            ),
            (Some(false), Some(true))
        );
        assert_eq!(o["runs"][1]["tokens_match_plain"]["identical"], true);
        assert_eq!(o["runs"][3]["tokens_match_plain"]["first_difference"], 2);
        // A run that stops early differs where the shorter one ends.
        assert_eq!(
            TokenMatch::of(&[1, 2, 3], &[1, 2]).first_difference,
            Some(2)
        );
        assert_eq!(TokenMatch::of(&[1, 2], &[1, 2]).first_difference, None);

        // No tokens recorded by any run: nothing compared, and no failure for it.
        overhead(&a, 1, |mode| {
            let mut p = fake_profile();
            p.mode = mode;
            p.tokens.clear();
            (p, Ok(()))
        })
        .expect("measured");
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        assert_eq!(j["outcome"]["tokens_identical"], Value::Null);

        // Over the target: the receipt says so, and the command fails.
        let e = overhead(&a, 1, |mode| {
            let mut p = fake_profile();
            p.mode = mode;
            p.step_ns = vec![if mode == Mode::StepTimes {
                1_000_000
            } else {
                1_100_000
            }];
            (p, Ok(()))
        })
        .unwrap_err();
        assert!(e.contains("10.00%"), "{e}");
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        std::fs::remove_file(&json).expect("remove");
        assert_eq!(j["outcome"]["within_target"], false);

        // A command that ran no GPU decode step is refused.
        let e = overhead(&a, 1, |mode| {
            let mut p = fake_profile();
            p.mode = mode;
            p.step_ns.clear();
            (p, Ok(()))
        })
        .unwrap_err();
        assert!(e.contains("no decode step"), "{e}");
    }

    #[test]
    fn overhead_of_one_step_in_n_compares_mean_steps() {
        // One profiled step in three costs 6% more: 2% on the mean, none on the median.
        let json = temp("overhead-every.json");
        let a = ProfArgs {
            json: Some(json.clone()),
            overhead: Some(1),
            every: 3,
            ..args(&["bench"])
        };
        overhead(&a, 1, |mode| {
            let mut p = fake_profile();
            p.mode = mode;
            p.every = 3;
            p.step_ns = match mode {
                Mode::StepTimes => vec![1_000_000; 6],
                Mode::Dispatches => [1_060_000, 1_000_000, 1_000_000].repeat(2),
            };
            (p, Ok(()))
        })
        .expect("measured");
        let j: Value =
            serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parses");
        std::fs::remove_file(&json).expect("remove");
        assert_eq!(j["inputs"]["every"], 3);
        assert!(
            j["inputs"]["compared"]
                .as_str()
                .expect("compared")
                .starts_with("mean host time"),
            "{j}"
        );
        let o = &j["outcome"];
        assert!(
            (o["overhead"].as_f64().expect("overhead") - 0.02).abs() < 1e-9,
            "{j}"
        );
        assert!(
            (o["runs"][1]["mean_step_ms"].as_f64().expect("mean") - 1.02).abs() < 1e-9,
            "{j}"
        );
        assert_eq!(StepStatistic::for_every(1), StepStatistic::Median);
    }

    #[test]
    fn a_command_without_a_gpu_decoder_is_refused() {
        // `cc --list` runs no decoder: the profile is empty, which is an error, not a
        // silent empty trace.
        let e = run(&args(&["cc", "--list"])).unwrap_err();
        assert!(e.contains("nothing to profile"), "{e}");
    }
}
