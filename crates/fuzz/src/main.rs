//! quench-fuzz: runs the parser fuzz targets.
//!
//! ```text
//! quench-fuzz list
//! quench-fuzz run TARGET [--iterations N] [--seed S] [--failures DIR] [--json] [--save-slowest]
//! quench-fuzz replay TARGET FILE
//! quench-fuzz all [TARGET ...] [--iterations N] [--seed S] [--jobs J] [--failures DIR] [--receipt PATH]
//! ```
//! `all` runs each target (or those named) in its own process (so that each has its own
//! peak RSS), `--jobs` at a time, and writes the receipt.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use quench_fuzz::driver::{run, run_one, RunOptions};
use quench_fuzz::receipt::{peak_rss_kib, receipt, report_json, Checkout, RunSettings};
use serde_json::{json, Value};

/// The chat template target renders untrusted templates: their memory budget is enforced
/// by this allocator, as in the quench binary.
#[global_allocator]
static ALLOC: quench_text::BudgetAllocator = quench_text::BudgetAllocator;

const SLOW: Duration = Duration::from_secs(1);
const HANG: Duration = Duration::from_secs(20);
/// The bound on each target process's peak resident memory.
const MAX_RSS_KIB: u64 = 1 << 20;

struct Args {
    positional: Vec<String>,
    iterations: u64,
    seed: u64,
    jobs: usize,
    failures: PathBuf,
    receipt: Option<PathBuf>,
    json: bool,
    save_slowest: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        positional: Vec::new(),
        iterations: 10_000,
        seed: 1,
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        failures: PathBuf::from("target/fuzz-failures"),
        receipt: None,
        json: false,
        save_slowest: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let number =
            |name: &str, v: String| v.parse::<u64>().map_err(|e| format!("{name} {v:?}: {e}"));
        match a.as_str() {
            "--iterations" => args.iterations = number("--iterations", value("--iterations")?)?,
            "--seed" => args.seed = number("--seed", value("--seed")?)?,
            "--jobs" => args.jobs = number("--jobs", value("--jobs")?)?.max(1) as usize,
            "--failures" => args.failures = PathBuf::from(value("--failures")?),
            "--receipt" => args.receipt = Some(PathBuf::from(value("--receipt")?)),
            "--json" => args.json = true,
            "--save-slowest" => args.save_slowest = true,
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            _ => args.positional.push(a),
        }
    }
    Ok(args)
}

fn target(name: Option<&String>) -> Result<quench_fuzz::Target, String> {
    let name = name.ok_or("name a target (quench-fuzz list)")?;
    quench_fuzz::find(name).ok_or_else(|| format!("no target {name:?} (quench-fuzz list)"))
}

fn cmd_run(args: &Args) -> Result<bool, String> {
    let target = target(args.positional.get(1))?;
    let options = RunOptions {
        iterations: args.iterations,
        seed: args.seed,
        slow: SLOW,
        hang: HANG,
        failures_dir: args.failures.clone(),
    };
    let report = run(&target, &options);
    let value = report_json(&report, peak_rss_kib());
    if args.save_slowest {
        let path = args
            .failures
            .join(format!("{}-seed{}-slowest.bin", target.name, args.seed));
        std::fs::create_dir_all(&args.failures)
            .and_then(|()| std::fs::write(&path, &report.slowest.input))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("slowest input: {}", path.display());
    }
    if args.json {
        println!("{value}");
    } else {
        println!(
            "{}: {} inputs in {:.1} s, {} accepted, {} refused, {} distinct outcomes, {} failures; slowest input {} took {:.4} s; peak RSS {} MiB",
            report.target,
            report.inputs,
            report.seconds,
            report.accepted,
            report.refused,
            report.outcomes,
            report.failures.len(),
            report.slowest.index,
            report.slowest.seconds,
            value["peak_rss_kib"].as_u64().unwrap_or(0) / 1024
        );
    }
    Ok(report.failures.is_empty())
}

fn cmd_replay(args: &Args) -> Result<bool, String> {
    let target = target(args.positional.get(1))?;
    let file = args
        .positional
        .get(2)
        .ok_or("name the input file to replay")?;
    let input = std::fs::read(file).map_err(|e| format!("{file}: {e}"))?;
    let started = Instant::now();
    let outcome = run_one(&target, &input);
    let took = started.elapsed().as_secs_f64();
    match outcome {
        Ok(Ok(())) => println!("{}: accepted in {took:.4} s", target.name),
        Ok(Err(e)) => println!("{}: refused in {took:.4} s: {e}", target.name),
        Err(panic) => {
            println!("{}: PANIC after {took:.4} s: {panic}", target.name);
            return Ok(false);
        }
    }
    Ok(took <= SLOW.as_secs_f64())
}

/// Runs every target (or those named after `all`) in a child process, `jobs` at a time,
/// and writes the receipt.
fn cmd_all(args: &Args) -> Result<bool, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this binary: {e}"))?;
    let chosen = &args.positional[1..];
    let names: Vec<&str> = quench_fuzz::targets()
        .iter()
        .map(|t| t.name)
        .filter(|n| chosen.is_empty() || chosen.iter().any(|c| c == n))
        .collect();
    if let Some(unknown) = chosen.iter().find(|c| !names.contains(&c.as_str())) {
        return Err(format!(
            "no fuzz target {unknown:?} (see `quench-fuzz list`)"
        ));
    }
    let checkout = Checkout::now();
    let started = Instant::now();
    let mut results: Vec<Value> = Vec::new();
    for batch in names.chunks(args.jobs) {
        let children: Vec<_> = batch
            .iter()
            .map(|name| {
                eprintln!(
                    "running {name}: {} inputs, seed {}",
                    args.iterations, args.seed
                );
                Command::new(&exe)
                    .args(["run", name, "--json", "--iterations"])
                    .arg(args.iterations.to_string())
                    .arg("--seed")
                    .arg(args.seed.to_string())
                    .arg("--failures")
                    .arg(&args.failures)
                    .stdout(Stdio::piped())
                    .spawn()
                    .map(|child| (*name, child))
                    .map_err(|e| format!("cannot start {}: {e}", exe.display()))
            })
            .collect::<Result<_, _>>()?;
        for (name, child) in children {
            let out = child
                .wait_with_output()
                .map_err(|e| format!("waiting for {name}: {e}"))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let value = text
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str::<Value>(l).ok())
                .unwrap_or_else(|| {
                    // No report: the watchdog ended it on a hang (its stderr says which
                    // input), or it crashed outright.
                    json!({
                        "target": name,
                        "inputs": 0,
                        "panics": 0,
                        "slow_inputs": 1,
                        "failures": [{"kind": "hang or crash", "detail": format!("exit status {}", out.status)}],
                    })
                });
            eprintln!(
                "{name}: {} inputs, {} panics, {} slow, slowest {:.4} s, peak RSS {} MiB",
                value["inputs"],
                value["panics"],
                value["slow_inputs"],
                value["slowest_input"]["seconds"].as_f64().unwrap_or(0.0),
                value["peak_rss_kib"].as_u64().unwrap_or(0) / 1024
            );
            results.push(value);
        }
    }
    let settings = RunSettings {
        checkout,
        iterations: args.iterations,
        seed: args.seed,
        jobs: args.jobs,
        slow_s: SLOW.as_secs_f64(),
        hang_s: HANG.as_secs_f64(),
        max_rss_kib: MAX_RSS_KIB,
        wall_s: started.elapsed().as_secs_f64(),
    };
    let (value, passed) = receipt(&settings, &results);
    let text = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())? + "\n";
    match &args.receipt {
        Some(path) => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            eprintln!("receipt: {} (passed: {passed})", path.display());
        }
        None => print!("{text}"),
    }
    Ok(passed)
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|args| match args.positional.first().map(String::as_str) {
        Some("list") => {
            for t in quench_fuzz::targets() {
                println!("{:<12} {}", t.name, t.about);
            }
            Ok(true)
        }
        Some("run") => cmd_run(&args),
        Some("replay") => cmd_replay(&args),
        Some("all") => cmd_all(&args),
        _ => Err("usage: quench-fuzz list | run TARGET | replay TARGET FILE | all (see the source's header)".to_owned()),
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("quench-fuzz: {e}");
            ExitCode::from(2)
        }
    }
}
