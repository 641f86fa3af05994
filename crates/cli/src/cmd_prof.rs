//! `quench prof`: run library kernels instrumented, write a Chrome trace of their GPU
//! times and print time per kernel.

use std::path::PathBuf;

use quench_kernels::{compare, library, run_case, CaseArg, KernelSpec};
use quench_prof::{chrome_trace, instrument, shapes::small_params, summarize, summary::render, HostSpans, Ring};
use quench_rt::{CudaExecutor, Executor, InterpExecutor, StreamId};

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
    /// Only these kernels (comma-separated names; default: the whole library).
    #[arg(long, value_delimiter = ',')]
    pub kernels: Vec<String>,
    #[arg(long, value_enum, default_value_t = Backend::Interp)]
    pub backend: Backend,
    /// Launches per kernel.
    #[arg(long, default_value_t = 3)]
    pub reps: u32,
    /// Where to write the Chrome trace / Perfetto JSON.
    #[arg(long, default_value = "prof-trace.json")]
    pub trace: PathBuf,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
}

fn selected(names: &[String]) -> Result<Vec<KernelSpec>, String> {
    if names.is_empty() {
        return Ok(library());
    }
    names.iter().map(|n| quench_kernels::find(n).map_err(|e| e.to_string())).collect()
}

pub fn run(a: &ProfArgs) -> Result<(), String> {
    if a.reps == 0 {
        return Err("--reps must be at least 1".into());
    }
    let specs = selected(&a.kernels)?;
    let mut exec: Box<dyn Executor> = match a.backend {
        Backend::Interp => Box::new(InterpExecutor::new()),
        Backend::Cuda => Box::new(CudaExecutor::new(a.gpu).map_err(|e| format!("--backend cuda: {e}"))?),
    };
    let exec = exec.as_mut();
    let slots = specs.len() as u32 * a.reps;
    let mut ring = Ring::new(exec, slots).map_err(|e| e.to_string())?;
    let mut host = HostSpans::new();
    for spec in &specs {
        let params = match a.backend {
            Backend::Interp => spec.parse_params(small_params(spec.name)),
            Backend::Cuda => Ok(spec.default_params()),
        }
        .map_err(|e| e.to_string())?;
        let span = host.begin(&format!("prepare {}", spec.name));
        let mut case = spec.make_case(&params, a.seed).map_err(|e| e.to_string())?;
        case.kernel = instrument(&case.kernel).map_err(|e| e.to_string())?;
        span.end(&mut host);
        for rep in 0..a.reps {
            let mut c = case.clone();
            let extra = ring.next(spec.name, StreamId::DEFAULT).map_err(|e| e.to_string())?;
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
    let text = serde_json::to_string(&trace).map_err(|e| e.to_string())?;
    std::fs::write(&a.trace, text).map_err(|e| format!("writing {}: {e}", a.trace.display()))?;
    let clock = match a.backend {
        Backend::Interp => " (interpreter virtual clock)",
        Backend::Cuda => "",
    };
    println!("{} dispatches on {}{clock}; trace: {}", dispatches.len(), exec.device_name(), a.trace.display());
    print!("{}", render(&summarize(&dispatches)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interp_run_writes_trace_with_every_launch() {
        let trace = std::env::temp_dir().join(format!("quench-prof-test-{}.json", std::process::id()));
        let a = ProfArgs {
            kernels: vec!["add_f32".into(), "softmax_f32".into()],
            backend: Backend::Interp,
            reps: 2,
            trace: trace.clone(),
            seed: 7,
            gpu: 0,
        };
        run(&a).expect("profiled run");
        let text = std::fs::read_to_string(&trace).expect("trace written");
        std::fs::remove_file(&trace).expect("remove trace");
        let v: serde_json::Value = serde_json::from_str(&text).expect("trace parses");
        let events = v["traceEvents"].as_array().expect("traceEvents");
        let gpu: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X" && e["pid"] == 1).collect();
        let names: Vec<&str> = gpu.iter().map(|e| e["name"].as_str().expect("name")).collect();
        assert_eq!(names, ["add_f32", "add_f32", "softmax_f32", "softmax_f32"]);
        for w in gpu.windows(2) {
            let end = w[0]["ts"].as_f64().expect("ts") + w[0]["dur"].as_f64().expect("dur");
            assert!(w[0]["dur"].as_f64().expect("dur") > 0.0 && end <= w[1]["ts"].as_f64().expect("ts"), "{w:?}");
        }
        assert_eq!(events.iter().filter(|e| e["ph"] == "X" && e["pid"] == 2).count(), 2 + 4);
    }

    #[test]
    fn zero_reps_refused() {
        let a = ProfArgs {
            kernels: vec![],
            backend: Backend::Interp,
            reps: 0,
            trace: PathBuf::from("unused.json"),
            seed: 1,
            gpu: 0,
        };
        assert!(run(&a).is_err());
    }
}
