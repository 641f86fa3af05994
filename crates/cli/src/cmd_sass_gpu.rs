//! `quench sass check-gpu`: every library kernel run twice on the GPU on the same inputs —
//! from the cubin the driver's JIT made of its PTX, and from that cubin disassembled by
//! quench and assembled again by quench's cubin writer — and the outputs compared bit for
//! bit. One row a kernel: instructions, how many the tables decode, whether the writer's
//! cubin equals the JIT's byte for byte and its code equals the JIT's code (every section,
//! with the relocations of the calls to the JIT's device functions), whether the outputs
//! are identical.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use quench_kernels::{case, KernelSpec};
use quench_rt::CudaExecutor;
use quench_sass::cubin::Cubin;
use quench_sass::table::Tables;
use serde_json::{json, Value};

use crate::receipt;

#[derive(clap::Args)]
pub struct CheckGpuArgs {
    /// Only these kernels (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write the receipt.
    #[arg(long, default_value = "receipts/sass-check-gpu.json")]
    pub receipt: PathBuf,
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
}

/// What the rewrite saw of one kernel's cubin.
#[derive(Clone, Debug, Default)]
struct Rewritten {
    instructions: usize,
    decoded: usize,
    same_bytes: bool,
    /// The code of every section and the relocations of code are the JIT's.
    same_code: bool,
    /// Device functions with code sections of their own (the JIT's slow paths).
    functions: usize,
}

struct Row {
    kernel: String,
    shape: String,
    rewritten: Option<Rewritten>,
    /// `Ok(identical)`, or why the kernel could not be run both ways.
    outcome: Result<bool, String>,
}

/// The JIT's cubin disassembled and assembled again, and what that showed.
fn reassemble(tables: &Tables, jit: &[u8]) -> Result<(Vec<u8>, Rewritten), String> {
    let theirs = Cubin::parse(jit).map_err(|e| format!("the JIT's cubin: {e}"))?;
    let (text, cov) =
        quench_sass::dis::disassemble(&theirs, tables).map_err(|e| format!("dis: {e}"))?;
    let ours = quench_sass::asm::assemble_cubin(&text, tables).map_err(|e| format!("asm: {e}"))?;
    let written = Cubin::parse(&ours).map_err(|e| format!("the written cubin: {e}"))?;
    // The code of every section (kernel and device functions, by name) and the
    // relocations that connect them (where a call goes, by symbol name).
    let code = |c: &Cubin| {
        let code: Vec<_> = c
            .code_functions()
            .into_iter()
            .map(|k| (k.name.clone(), c.text(k).to_vec()))
            .collect();
        let relocs: Vec<_> = c
            .code_functions()
            .into_iter()
            .flat_map(|k| {
                k.relocs.iter().map(|r| {
                    let sym = c.symbols.get(r.sym as usize).map(|s| s.name.clone());
                    (k.name.clone(), r.offset, r.r_type, sym, r.addend)
                })
            })
            .collect();
        (code, relocs)
    };
    let same_code = code(&written) == code(&theirs);
    let r = Rewritten {
        instructions: cov.instructions,
        decoded: cov.decoded,
        same_bytes: ours == jit,
        same_code,
        functions: theirs.functions.len(),
    };
    Ok((ours, r))
}

fn outputs_identical(
    spec: &KernelSpec,
    seed: u64,
    jit: &mut CudaExecutor,
    ours: &mut CudaExecutor,
) -> Result<(String, bool), String> {
    let p = spec
        .parse_params(spec.compare_params())
        .map_err(|e| e.to_string())?;
    let c = spec.make_case(&p, seed).map_err(|e| e.to_string())?;
    let a = case::run_case(jit, &c).map_err(|e| format!("from the JIT's cubin: {e}"))?;
    let b = case::run_case(ours, &c).map_err(|e| format!("from quench's cubin: {e}"))?;
    let mut identical = true;
    for e in &c.expected {
        let (x, y) = (a.get(e.buffer), b.get(e.buffer));
        identical &= x.is_some() && x == y;
    }
    Ok((c.shape.clone(), identical))
}

pub fn run(a: &CheckGpuArgs) -> Result<(), String> {
    let tables = Tables::sm90()?;
    let device = crate::gpu::describe(a.gpu)?;
    let specs = crate::cmd_check_kernels::selected(&a.only)?;
    let mut jit = CudaExecutor::new(a.gpu).map_err(|e| e.to_string())?;
    let mut ours = CudaExecutor::new(a.gpu).map_err(|e| e.to_string())?;
    let seen: Arc<Mutex<BTreeMap<String, Rewritten>>> = Arc::default();
    let record = Arc::clone(&seen);
    ours.set_cubin_rewrite(Box::new(move |name, cubin| {
        let (bytes, r) = reassemble(tables, cubin)?;
        record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_string(), r);
        Ok(bytes)
    }));
    let mut rows = vec![];
    for s in &specs {
        eprintln!("running {} both ways ...", s.name);
        let outcome = outputs_identical(s, a.seed, &mut jit, &mut ours);
        let rewritten = seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(s.name)
            .cloned();
        let (shape, outcome) = match outcome {
            Ok((shape, same)) => (shape, Ok(same)),
            Err(e) => (String::new(), Err(e)),
        };
        rows.push(Row {
            kernel: s.name.to_string(),
            shape,
            rewritten,
            outcome,
        });
    }
    println!(
        "{:<28} {:<24} {:>7} {:>8} {:>10} {:>9} {:>10}",
        "kernel", "shape", "instrs", "decoded", "same bytes", "same code", "identical"
    );
    let yes = |b: bool| if b { "yes" } else { "NO" };
    for r in &rows {
        let w = r.rewritten.clone().unwrap_or_default();
        let identical = match &r.outcome {
            Ok(b) => yes(*b).to_string(),
            Err(e) => format!("FAILED: {e}"),
        };
        println!(
            "{:<28} {:<24} {:>7} {:>8} {:>10} {:>9} {:>10}",
            r.kernel,
            r.shape,
            w.instructions,
            w.decoded,
            if w.same_bytes { "yes" } else { "no" },
            yes(w.same_code),
            identical
        );
    }
    let identical = rows.iter().filter(|r| r.outcome == Ok(true)).count();
    let instructions: usize = rows
        .iter()
        .filter_map(|r| r.rewritten.as_ref())
        .map(|w| w.instructions)
        .sum();
    let passed = identical == rows.len();
    println!(
        "{identical} of {} kernels ({instructions} instructions) give identical outputs from quench's cubins; {}",
        rows.len(),
        if passed { "all passed" } else { "CHECKS FAILED" }
    );
    let row_json = |r: &Row| -> Value {
        let w = r.rewritten.clone().unwrap_or_default();
        json!({
            "kernel": r.kernel, "shape": r.shape,
            "instructions": w.instructions, "decoded": w.decoded,
            "cubin_bytes_equal": w.same_bytes, "code_equal": w.same_code,
            "device_functions": w.functions,
            "outputs_identical": r.outcome.as_ref().ok(),
            "error": r.outcome.as_ref().err(),
        })
    };
    let rec = receipt::receipt(
        "sass-check-gpu",
        device,
        json!({ "seed": a.seed }),
        json!("every output buffer of each kernel bit-identical between the JIT's cubin and quench's disassembled and reassembled one"),
        json!({
            "passed": passed,
            "kernels": rows.len(),
            "identical": identical,
            "instructions": instructions,
            "rows": rows.iter().map(row_json).collect::<Vec<_>>(),
        }),
    );
    receipt::write_json(&a.receipt, &rec)?;
    if passed {
        Ok(())
    } else {
        Err(format!(
            "{} of {} kernels differ or failed (receipt {})",
            rows.len() - identical,
            rows.len(),
            a.receipt.display()
        ))
    }
}
