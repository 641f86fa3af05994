//! Every fuzz target, a bounded number of inputs each (CI's share; `scripts/fuzz.sh` runs
//! ≥ 10^6 per target in release and writes the receipt). The seed is fixed, so a failure
//! here is reproducible as it stands; `QUENCH_SEED=N` runs other inputs. A failure names
//! the input and the reproducer file, which `quench-fuzz replay TARGET FILE` runs again.

use std::path::PathBuf;
use std::time::Duration;

use quench_fuzz::driver::{run, run_one, RunOptions};
use quench_text::BudgetAllocator;

// The template target's memory budget is enforced by this allocator, as in the binaries.
#[global_allocator]
static ALLOC: BudgetAllocator = BudgetAllocator;

fn seed() -> u64 {
    std::env::var("QUENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn fuzz(name: &str, iterations: u64) {
    let target = quench_fuzz::find(name).expect("a target of that name");
    let accepted = (target.seeds)()
        .iter()
        .filter(|s| matches!(run_one(&target, s), Ok(Ok(()))))
        .count();
    assert!(accepted > 0, "{name}: no seed input is accepted");
    let options = RunOptions {
        iterations,
        seed: seed(),
        slow: Duration::from_secs(1),
        hang: Duration::from_secs(60),
        failures_dir: PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures"),
    };
    let report = run(&target, &options);
    eprintln!(
        "{name}: {} inputs in {:.1} s (seed {}), {} accepted, {} distinct outcomes, slowest {:.4} s",
        report.inputs,
        report.seconds,
        report.seed,
        report.accepted,
        report.outcomes,
        report.slowest.seconds
    );
    assert_eq!(report.inputs, iterations);
    let failures: Vec<String> = report
        .failures
        .iter()
        .map(|f| {
            format!(
                "input {}: {:?}; reproduce: quench-fuzz replay {name} {}",
                f.index,
                f.kind,
                f.file
                    .as_ref()
                    .map_or("(not written)".into(), |p| p.display().to_string())
            )
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{name} (seed {}):\n{}",
        report.seed,
        failures.join("\n")
    );
}

#[test]
fn gguf() {
    fuzz("gguf", 50_000);
}

#[test]
fn safetensors() {
    fuzz("safetensors", 50_000);
}

#[test]
fn config() {
    fuzz("config", 50_000);
}

#[test]
fn tokenizer() {
    fuzz("tokenizer", 20_000);
}

#[test]
fn template() {
    fuzz("template", 30_000);
}

#[test]
fn request() {
    fuzz("request", 50_000);
}

#[test]
fn ir() {
    fuzz("ir", 30_000);
}

#[test]
fn cubin() {
    fuzz("cubin", 30_000);
}

#[test]
fn sass() {
    fuzz("sass", 30_000);
}
