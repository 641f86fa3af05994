//! `quench check-kernels`: every library kernel on the GPU and in the interpreter on
//! the same inputs, compared element by element, then timed on the GPU at full size
//! next to the device-to-device copy bandwidth measured in the same run.

use std::path::PathBuf;

use quench_kernels::{case, library, Check, Expected, KernelCase, KernelSpec};
use quench_rt::{CudaExecutor, Executor, InterpExecutor, RtError, StreamId};
use serde_json::{json, Value};

use crate::model_args::CodegenArg;
use crate::receipt;

#[derive(clap::Args)]
pub struct CheckArgs {
    /// Only these kernels (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Timed repeats per kernel (after warm-up).
    #[arg(long, default_value_t = 50)]
    pub reps: u32,
    /// Skip the full-size timing rows.
    #[arg(long)]
    pub no_perf: bool,
    /// Time these shapes (`key=value ...`, repeatable) instead of each kernel's
    /// full-size defaults, e.g. to compare tile choices.
    #[arg(long = "shape")]
    pub shapes: Vec<String>,
    /// Compare GPU and interpreter at these parameters (`key=value ...`, repeatable)
    /// instead of each kernel's own comparison parameters
    #[arg(long = "compare-shape")]
    pub compare_shapes: Vec<String>,
    /// Skip the GPU-versus-interpreter comparison rows.
    #[arg(long)]
    pub no_compare: bool,
    /// Where to write the receipt.
    #[arg(long, default_value = "receipts/kernel-check.json")]
    pub receipt: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
    /// Where the kernels' machine code comes from: PTX finished by the driver, or quench's
    /// own code generator (each timed row then also times the PTX build, its twin).
    #[arg(long, value_enum, default_value = "ptx")]
    pub codegen: CodegenArg,
}

/// Why a kernel has no row.
enum Failure {
    /// Quench's code generator cannot compile it yet (`--codegen sass`).
    Refused(String),
    Failed(String),
}

impl From<String> for Failure {
    fn from(e: String) -> Failure {
        Failure::Failed(e)
    }
}

/// The executors of a run: the one measured, and with `--codegen sass` (where it runs
/// quench's own machine code) a PTX-built twin for the timings.
struct Gpus {
    gpu: CudaExecutor,
    twin: Option<CudaExecutor>,
}

impl Gpus {
    fn open(a: &CheckArgs) -> Result<Gpus, String> {
        let e = |e: RtError| e.to_string();
        let mut gpu = CudaExecutor::new(a.gpu).map_err(e)?;
        gpu.set_codegen(a.codegen.into());
        let twin = match a.codegen {
            CodegenArg::Ptx => None,
            CodegenArg::Sass => Some(CudaExecutor::new(a.gpu).map_err(e)?),
        };
        Ok(Gpus { gpu, twin })
    }
}

/// A case's run on the GPU, with the code generator's refusal told apart.
fn run_on(gpu: &mut CudaExecutor, c: &KernelCase) -> Result<case::CaseOutputs, Failure> {
    case::run_case(gpu, c).map_err(|e| match e {
        case::CaseError::Runtime { source, .. } if matches!(*source, RtError::Codegen { .. }) => {
            Failure::Refused(source.to_string())
        }
        e => Failure::Failed(e.to_string()),
    })
}

struct Row {
    kernel: String,
    shape: String,
    max_err: f64,
    bit_exact: bool,
    exact_kernel: bool,
    reference_ok: bool,
    ms: Option<f64>,
    /// The PTX build's time beside quench's own code's (`--codegen sass`).
    twin_ms: Option<f64>,
    gbps: Option<f64>,
    tflops: Option<f64>,
    note: String,
}

fn is_exact(c: &KernelCase) -> bool {
    c.expected.iter().all(|e| e.check == Check::Exact)
}

/// GPU output against interpreter output, as an exact comparison.
fn gpu_vs_interp(
    c: &KernelCase,
    gpu: &case::CaseOutputs,
    cpu: &case::CaseOutputs,
) -> Result<(f64, bool), String> {
    let mut max_err = 0f64;
    let mut exact = true;
    for e in &c.expected {
        let i = cpu.get(e.buffer).ok_or("interpreter output missing")?;
        let g = gpu.get(e.buffer).ok_or("GPU output missing")?;
        let as_ref = Expected {
            buffer: e.buffer,
            data: i.to_vec(),
            elem: e.elem,
            check: Check::Exact,
        };
        let r = case::compare_expected(&c.buffers[e.buffer].name, &as_ref, g)?;
        max_err = max_err.max(r.max_abs_err);
        exact &= r.bit_exact;
    }
    Ok((max_err, exact))
}

fn reference_ok(c: &KernelCase, out: &case::CaseOutputs) -> Result<bool, String> {
    Ok(case::compare(c, out)
        .map_err(|e| e.to_string())?
        .iter()
        .all(|r| r.passed))
}

fn check_one(spec: &KernelSpec, params: &str, gpus: &mut Gpus, seed: u64) -> Result<Row, Failure> {
    let p = spec.parse_params(params).map_err(|e| e.to_string())?;
    let c = spec.make_case(&p, seed).map_err(|e| e.to_string())?;
    let gpu_out = run_on(&mut gpus.gpu, &c)?;
    let mut interp = InterpExecutor::new();
    let cpu_out = case::run_case(&mut interp, &c).map_err(|e| e.to_string())?;
    let (max_err, bit_exact) = gpu_vs_interp(&c, &gpu_out, &cpu_out)?;
    Ok(Row {
        kernel: spec.name.to_string(),
        shape: c.shape.clone(),
        max_err,
        bit_exact,
        exact_kernel: is_exact(&c),
        reference_ok: reference_ok(&c, &gpu_out)? && reference_ok(&c, &cpu_out)?,
        ms: None,
        twin_ms: None,
        gbps: None,
        tflops: None,
        note: "GPU vs interpreter".into(),
    })
}

/// Times `spec` at `shape`; `label_with_params` shows the parameters in the row.
fn perf_one(
    spec: &KernelSpec,
    shape: &str,
    label_with_params: bool,
    gpus: &mut Gpus,
    seed: u64,
    reps: u32,
) -> Result<Row, Failure> {
    let p = spec.parse_params(shape).map_err(|e| e.to_string())?;
    let c = spec.make_case(&p, seed).map_err(|e| e.to_string())?;
    let out = run_on(&mut gpus.gpu, &c)?;
    let ok = reference_ok(&c, &out)?;
    let t = case::time_case(&mut gpus.gpu, &c, 5, reps).map_err(|e| e.to_string())?;
    let twin_ms = match &mut gpus.twin {
        Some(twin) => Some(
            case::time_case(twin, &c, 5, reps)
                .map_err(|e| e.to_string())?
                .median_ms,
        ),
        None => None,
    };
    Ok(Row {
        kernel: spec.name.to_string(),
        shape: if label_with_params {
            format!("{} [{shape}]", c.shape)
        } else {
            c.shape.clone()
        },
        max_err: f64::NAN,
        bit_exact: false,
        exact_kernel: is_exact(&c),
        reference_ok: ok,
        ms: Some(t.median_ms),
        twin_ms,
        gbps: Some(c.gbps(t.median_ms)),
        tflops: (c.flops > 0).then(|| c.tflops(t.median_ms)),
        note: "GPU vs reference, timed".into(),
    })
}

/// Device-to-device copy bandwidth (bytes read + written per second), median of
/// `reps` copies of 1 GiB after warm-up.
pub fn copy_bandwidth_gbps(exec: &mut dyn Executor, reps: u32) -> Result<f64, String> {
    let bytes: u64 = 1 << 30;
    let e = |x: quench_rt::RtError| x.to_string();
    let src = exec.alloc(bytes).map_err(e)?;
    let dst = exec.alloc(bytes).map_err(e)?;
    // Random-looking contents, not zeros.
    let pattern: Vec<u8> = (0..bytes as usize / 64)
        .map(|i| (i.wrapping_mul(2654435761) >> 7) as u8)
        .collect();
    for chunk in 0..64u64 {
        exec.copy_to_device(src.offset(chunk * pattern.len() as u64), &pattern)
            .map_err(e)?;
    }
    let mut times = vec![];
    for i in 0..reps + 3 {
        let a = exec.record_event(StreamId::DEFAULT).map_err(e)?;
        exec.copy_device_to_device(dst, src, bytes).map_err(e)?;
        let b = exec.record_event(StreamId::DEFAULT).map_err(e)?;
        let ms = exec.elapsed_ms(a, b).map_err(e)? as f64;
        exec.release_event(a).map_err(e)?;
        exec.release_event(b).map_err(e)?;
        if i >= 3 {
            times.push(ms);
        }
    }
    exec.free(src).map_err(e)?;
    exec.free(dst).map_err(e)?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    Ok(2.0 * bytes as f64 / (median * 1e-3) / 1e9)
}

/// One result in a line: the comparison's verdict, or the time (and the PTX twin's).
fn progress_line(r: &Row) -> String {
    match (r.ms, r.twin_ms) {
        (Some(ms), Some(twin)) => format!("{ms:.4} ms (PTX build {twin:.4} ms)"),
        (Some(ms), None) => format!("{ms:.4} ms"),
        (None, _) => format!(
            "max err {:.3e}, bit-exact {}, reference {}",
            r.max_err,
            if r.bit_exact { "yes" } else { "no" },
            if r.reference_ok { "pass" } else { "FAIL" }
        ),
    }
}

fn row_json(r: &Row, copy: f64) -> Value {
    json!({
        "kernel": r.kernel, "shape": r.shape, "what": r.note,
        "max_abs_err_vs_interpreter": if r.max_err.is_nan() { Value::Null } else { json!(r.max_err) },
        "bit_exact_vs_interpreter": if r.ms.is_some() { Value::Null } else { json!(r.bit_exact) },
        "exact_kernel": r.exact_kernel,
        "reference_check_passed": r.reference_ok,
        "median_ms": r.ms, "ptx_build_median_ms": r.twin_ms, "gbps": r.gbps, "percent_of_copy_bandwidth": r.gbps.map(|g| 100.0 * g / copy),
        "tflops": r.tflops,
    })
}

/// The library kernels named in `only` (all of them when it is empty); an error when none
/// matches.
pub fn selected(only: &[String]) -> Result<Vec<KernelSpec>, String> {
    let specs: Vec<KernelSpec> = library()
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
        .collect();
    if specs.is_empty() {
        return Err(format!(
            "no library kernel matches {only:?} (see `quench cc --list`)"
        ));
    }
    Ok(specs)
}

pub fn run(a: &CheckArgs) -> Result<(), String> {
    let device = crate::gpu::describe(a.gpu)?;
    let specs = selected(&a.only)?;
    let mut gpus = Gpus::open(a)?;
    let copy = copy_bandwidth_gbps(&mut gpus.gpu, 20)?;
    eprintln!("device-to-device copy: {copy:.0} GB/s");
    let mut rows = vec![];
    let mut failures = vec![];
    // Kernels quench's code generator cannot compile yet, with what stops each.
    let mut refused = std::collections::BTreeMap::new();
    // Each result is also told as soon as it is known, so that a run cut short by a time
    // limit still reports what it saw.
    let mut record = |name: &str, shape: &str, r: Result<Row, Failure>| match r {
        Ok(r) => {
            eprintln!("  {}", progress_line(&r));
            rows.push(r)
        }
        Err(Failure::Failed(e)) => {
            eprintln!("  FAILED: {e}");
            failures.push(format!("{name} {shape}: {e}"))
        }
        Err(Failure::Refused(e)) => {
            eprintln!("  not compiled: {e}");
            refused.insert(name.to_string(), e);
        }
    };
    for s in specs.iter().filter(|_| !a.no_compare) {
        let shapes: Vec<&str> = if a.compare_shapes.is_empty() {
            vec![s.compare_params()]
        } else {
            a.compare_shapes.iter().map(String::as_str).collect()
        };
        for shape in shapes {
            eprintln!("checking {} {shape} ...", s.name);
            record(s.name, shape, check_one(s, shape, &mut gpus, a.seed));
        }
    }
    if !a.no_perf {
        for s in &specs {
            let shapes: Vec<&str> = if a.shapes.is_empty() {
                s.perf_params().to_vec()
            } else {
                a.shapes.iter().map(String::as_str).collect()
            };
            for shape in shapes {
                eprintln!("timing {} {shape} ...", s.name);
                let r = perf_one(
                    s,
                    shape,
                    !a.shapes.is_empty(),
                    &mut gpus,
                    a.seed + 1,
                    a.reps,
                );
                record(s.name, shape, r);
            }
        }
    }
    println!(
        "{:<16} {:<22} {:>11} {:>10} {:>6} {:>10} {:>9} {:>7} {:>8}",
        "kernel", "shape", "max err", "bit-exact", "ref", "time ms", "GB/s", "% copy", "TFLOP/s"
    );
    for r in &rows {
        let opt =
            |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
        let exact = match (r.ms.is_some(), r.bit_exact, r.exact_kernel) {
            (true, ..) => "-".to_string(),
            (false, true, _) => "yes".into(),
            (false, false, true) => "NO".into(),
            (false, false, false) => "no (approx)".into(),
        };
        println!(
            "{:<16} {:<22} {:>11} {:>10} {:>6} {:>10} {:>9} {:>7} {:>8}",
            r.kernel,
            r.shape,
            if r.max_err.is_nan() {
                "-".into()
            } else {
                format!("{:.3e}", r.max_err)
            },
            exact,
            if r.reference_ok { "pass" } else { "FAIL" },
            opt(r.ms, 4),
            opt(r.gbps, 0),
            opt(r.gbps.map(|g| 100.0 * g / copy), 1),
            opt(r.tflops, 1)
        );
    }
    let own_code = a.codegen == CodegenArg::Sass;
    if own_code {
        for r in rows.iter().filter(|r| r.ms.is_some()) {
            if let (Some(ours), Some(twin)) = (r.ms, r.twin_ms) {
                println!(
                    "{:<16} {:<22} quench's code {ours:.4} ms, PTX build {twin:.4} ms: {:.2}x its speed",
                    r.kernel,
                    r.shape,
                    twin / ours
                );
            }
        }
        for (name, why) in &refused {
            println!("not compiled by quench's code generator: {name}: {why}");
        }
    }
    for f in &failures {
        println!("FAILED {f}");
    }
    let exact_mismatch: Vec<&str> = rows
        .iter()
        .filter(|r| r.ms.is_none() && r.exact_kernel && !r.bit_exact)
        .map(|r| r.kernel.as_str())
        .collect();
    let passed =
        failures.is_empty() && exact_mismatch.is_empty() && rows.iter().all(|r| r.reference_ok);
    println!(
        "copy bandwidth {copy:.0} GB/s; {}",
        if passed {
            "all checks passed"
        } else {
            "CHECKS FAILED"
        }
    );
    let rec = receipt::receipt(
        "kernel-check",
        device,
        json!({ "seed": a.seed, "reps": a.reps, "codegen": if own_code { "sass" } else { "ptx" } }),
        json!("exact kernels: GPU output bit-identical to the interpreter and to the reference; approximate kernels: within each case's stated bound of the reference"),
        json!({
            "passed": passed,
            "copy_bandwidth_gbps": copy,
            "rows": rows.iter().map(|r| row_json(r, copy)).collect::<Vec<_>>(),
            "failures": failures,
            "not_compiled_by_quench_codegen": refused,
            "exact_kernels_not_bit_identical": exact_mismatch,
        }),
    );
    receipt::write_json(&a.receipt, &rec)?;
    if passed {
        Ok(())
    } else {
        Err("some kernel checks failed (see the table)".into())
    }
}
