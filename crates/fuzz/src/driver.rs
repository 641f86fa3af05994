//! Running a target: seeded mutants of its corpus through its parser, one at a time, each
//! under `catch_unwind` and timed. A panic or an input slower than the limit is a failure:
//! its input is written to a file and the line that replays it is printed. A watchdog
//! thread catches an input that never returns (a hang) the same way and ends the process.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::mutate::mutate;
use crate::rng::Rng;
use crate::{mutate_json, Format, Target};

/// Inputs added to the corpus because they reached an outcome not seen before, at most.
const MAX_LEARNED: usize = 512;

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub iterations: u64,
    pub seed: u64,
    /// An input taking longer than this is a failure.
    pub slow: Duration,
    /// An input still running after this is a hang: the process reports it and exits.
    pub hang: Duration,
    /// Where reproducers are written (created when needed).
    pub failures_dir: PathBuf,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailureKind {
    Panic(String),
    Slow(Duration),
}

#[derive(Clone, Debug)]
pub struct Failure {
    pub index: u64,
    pub kind: FailureKind,
    /// The reproducer, if it could be written.
    pub file: Option<PathBuf>,
}

#[derive(Clone, Debug, Default)]
pub struct Slowest {
    pub index: u64,
    pub seconds: f64,
    pub bytes: usize,
    /// The input itself, for `quench-fuzz run --save-slowest`.
    pub input: Vec<u8>,
}

#[derive(Clone, Debug)]
pub struct Report {
    pub target: &'static str,
    pub seed: u64,
    pub inputs: u64,
    /// Inputs the parser accepted and those it refused with an error.
    pub accepted: u64,
    pub refused: u64,
    /// Distinct outcomes (errors with their numbers blanked out).
    pub outcomes: usize,
    /// The most frequent outcomes and their counts, most frequent first.
    pub top_outcomes: Vec<(String, u64)>,
    pub seconds: f64,
    pub slowest: Slowest,
    pub failures: Vec<Failure>,
}

/// An outcome's class: the error text without its numbers, so that "offset 12" and
/// "offset 40" count once.
fn signature(result: &Result<(), String>) -> String {
    match result {
        Ok(()) => "ok".to_owned(),
        Err(e) => e.chars().filter(|c| !c.is_ascii_digit()).take(80).collect(),
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic with a non-string payload".to_owned())
}

thread_local! {
    static PANIC_PLACE: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Keeps panics quiet (they are reported as failures) but remembers where they happened.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let place = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        PANIC_PLACE.with(|p| *p.borrow_mut() = Some(place));
    }));
}

/// Where the reproducer of input `index` goes.
pub fn reproducer_path(dir: &Path, target: &str, seed: u64, index: u64) -> PathBuf {
    dir.join(format!("{target}-seed{seed}-input{index}.bin"))
}

fn write_reproducer(
    dir: &Path,
    target: &str,
    seed: u64,
    index: u64,
    input: &[u8],
) -> Option<PathBuf> {
    let path = reproducer_path(dir, target, seed, index);
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, input))
        .map_err(|e| eprintln!("cannot write the reproducer {}: {e}", path.display()))
        .ok()?;
    Some(path)
}

/// The inputs mutants are made from, and which of them are JSON (structural mutation
/// starts from those).
struct Corpus {
    inputs: Vec<Vec<u8>>,
    json: Vec<usize>,
}

impl Corpus {
    fn push(&mut self, input: Vec<u8>) {
        if serde_json::from_slice::<serde_json::Value>(&input).is_ok() {
            self.json.push(self.inputs.len());
        }
        self.inputs.push(input);
    }
}

/// A mutant in the target's format: JSON structurally three times in four (a byte-level
/// mutant of JSON mostly tests serde_json's syntax errors), text kept UTF-8 seven times
/// in eight.
fn mutant(rng: &mut Rng, format: Format, corpus: &Corpus, dict: &[&[u8]]) -> Vec<u8> {
    if format == Format::Json && !corpus.json.is_empty() && !rng.one_in(4) {
        let base = &corpus.inputs[*rng.pick(&corpus.json)];
        if let Some(m) = mutate_json::mutate(rng, base, dict) {
            return m;
        }
    }
    let base = &corpus.inputs[rng.below(corpus.inputs.len())];
    let other = &corpus.inputs[rng.below(corpus.inputs.len())];
    let m = mutate(rng, base, other, dict);
    if format != Format::Binary && !rng.one_in(8) && std::str::from_utf8(&m).is_err() {
        return String::from_utf8_lossy(&m).into_owned().into_bytes();
    }
    m
}

/// Runs one input through the target, catching a panic.
pub fn run_one(target: &Target, input: &[u8]) -> Result<Result<(), String>, String> {
    catch_unwind(AssertUnwindSafe(|| (target.run)(input))).map_err(|payload| {
        let place = PANIC_PLACE
            .with(|p| p.borrow_mut().take())
            .unwrap_or_default();
        format!("{} at {place}", panic_message(payload.as_ref()))
    })
}

/// The input now running and when it started, for the watchdog.
struct Current {
    index: u64,
    started: Instant,
    input: Arc<Vec<u8>>,
    done: bool,
}

fn start_watchdog(target: &'static str, options: &RunOptions, current: Arc<Mutex<Current>>) {
    let (seed, hang, dir) = (options.seed, options.hang, options.failures_dir.clone());
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = current.lock().unwrap_or_else(|e| e.into_inner());
        if now.done {
            return;
        }
        if now.started.elapsed() > hang {
            let file = write_reproducer(&dir, target, seed, now.index, &now.input);
            eprintln!(
                "FAIL {target} seed {seed} input {}: still running after {} s (a hang); reproduce: quench-fuzz replay {target} {}",
                now.index,
                hang.as_secs_f64(),
                file.map_or("(not written)".to_owned(), |f| f.display().to_string())
            );
            std::process::exit(3);
        }
    });
}

/// Runs `options.iterations` inputs: first every seed input unchanged, then mutants.
pub fn run(target: &Target, options: &RunOptions) -> Report {
    install_panic_hook();
    let mut corpus = Corpus {
        inputs: Vec::new(),
        json: Vec::new(),
    };
    for seed in (target.seeds)() {
        corpus.push(seed);
    }
    assert!(
        !corpus.inputs.is_empty(),
        "target {} has no seed inputs",
        target.name
    );
    let seeds = corpus.inputs.len() as u64;
    let mut dict: Vec<&[u8]> = target.dict.to_vec();
    if target.format == Format::Json {
        dict.extend_from_slice(crate::targets::JSON_DICT);
    }
    let current = Arc::new(Mutex::new(Current {
        index: 0,
        started: Instant::now(),
        input: Arc::new(Vec::new()),
        done: false,
    }));
    start_watchdog(target.name, options, current.clone());
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut report = Report {
        target: target.name,
        seed: options.seed,
        inputs: 0,
        accepted: 0,
        refused: 0,
        outcomes: 0,
        top_outcomes: Vec::new(),
        seconds: 0.0,
        slowest: Slowest::default(),
        failures: Vec::new(),
    };
    let begun = Instant::now();
    for index in 0..options.iterations {
        let input = if index < seeds {
            corpus.inputs[index as usize].clone()
        } else {
            mutant(
                &mut Rng::for_input(options.seed, index),
                target.format,
                &corpus,
                &dict,
            )
        };
        let input = Arc::new(input);
        {
            let mut now = current.lock().unwrap_or_else(|e| e.into_inner());
            now.index = index;
            now.input = input.clone();
            now.started = Instant::now();
        }
        let started = Instant::now();
        let outcome = run_one(target, &input);
        let took = started.elapsed();
        report.inputs += 1;
        if took.as_secs_f64() > report.slowest.seconds {
            report.slowest = Slowest {
                index,
                seconds: took.as_secs_f64(),
                bytes: input.len(),
                input: input.to_vec(),
            };
        }
        let failure = match outcome {
            Err(message) => Some(FailureKind::Panic(message)),
            Ok(_) if took > options.slow => Some(FailureKind::Slow(took)),
            Ok(result) => {
                match result {
                    Ok(()) => report.accepted += 1,
                    Err(_) => report.refused += 1,
                }
                let count = seen.entry(signature(&result)).or_insert(0);
                *count += 1;
                if *count == 1
                    && index >= seeds
                    && corpus.inputs.len() < seeds as usize + MAX_LEARNED
                {
                    corpus.push(input.to_vec());
                }
                None
            }
        };
        if let Some(kind) = failure {
            let file = write_reproducer(
                &options.failures_dir,
                target.name,
                options.seed,
                index,
                &input,
            );
            eprintln!(
                "FAIL {} seed {} input {index}: {}; reproduce: quench-fuzz replay {} {}",
                target.name,
                options.seed,
                match &kind {
                    FailureKind::Panic(m) => format!("panic: {m}"),
                    FailureKind::Slow(d) => format!("took {:.3} s", d.as_secs_f64()),
                },
                target.name,
                file.as_ref()
                    .map_or("(not written)".to_owned(), |f| f.display().to_string())
            );
            report.failures.push(Failure { index, kind, file });
        }
    }
    current.lock().unwrap_or_else(|e| e.into_inner()).done = true;
    report.seconds = begun.elapsed().as_secs_f64();
    report.outcomes = seen.len();
    let mut top: Vec<(String, u64)> = seen.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(8);
    report.top_outcomes = top;
    report
}
