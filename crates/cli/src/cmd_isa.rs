//! `quench isa probe`: measure the sm_90 machine model on the GPU and write the tables
//! the interpreter reads (`isa/sm90/`), with a receipt.

use std::path::PathBuf;

use serde_json::json;

use crate::receipt;

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Folder for the tables (mma_layout.json, approx.json).
    #[arg(long, default_value = "isa/sm90")]
    pub out: PathBuf,
    /// Where to write the receipt.
    #[arg(long, default_value = "receipts/isa-probe.json")]
    pub receipt: PathBuf,
    /// Inputs per approximate instruction.
    #[arg(long, default_value_t = 1 << 20)]
    pub samples: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: u32,
}

/// `NAME, driver VERSION, DATE` of a device description, for a table's `measured_on`.
pub fn measured_on(device: &serde_json::Value) -> String {
    format!(
        "{}, driver {}, {}",
        device["name"].as_str().unwrap_or("?"),
        device["driver"].as_str().unwrap_or("?"),
        chrono::Utc::now().format("%Y-%m-%d")
    )
}

pub fn probe(a: &ProbeArgs) -> Result<(), String> {
    let device = crate::gpu::describe(a.gpu)?;
    let mut exec = quench_rt::CudaExecutor::new(a.gpu).map_err(|e| e.to_string())?;
    let measured_on = measured_on(&device);
    eprintln!("probing {measured_on} ...");
    let outcome = quench_isa::probe::run_all(&mut exec, &measured_on, a.samples, a.seed);
    let (passed, detail) = match &outcome {
        Ok(r) => (
            true,
            json!({
                "mma_layouts": r.layout.mma.keys().collect::<Vec<_>>(),
                "ldmatrix_variants": r.layout.ldmatrix.keys().collect::<Vec<_>>(),
                "agrees_with_ptx_isa_figures": r.agrees_with_ptx_isa,
                "approx": r.approx.ops,
            }),
        ),
        Err(e) => (false, json!({ "error": e.to_string() })),
    };
    let rec = receipt::receipt(
        "isa-probe",
        device,
        json!({ "approx_samples_per_instruction": a.samples, "seed": a.seed }),
        json!("MMA relation must be exactly one matrix product (every (row, col, k) term once); ldmatrix elements distinct"),
        json!({ "passed": passed, "detail": detail }),
    );
    receipt::write_json(&a.receipt, &rec)?;
    let r = outcome.map_err(|e| e.to_string())?;
    let layout_path = a.out.join("mma_layout.json");
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    std::fs::write(&layout_path, quench_isa::probe::layout_json(&r.layout))
        .map_err(|e| format!("cannot write {}: {e}", layout_path.display()))?;
    receipt::write_json(
        &a.out.join("approx.json"),
        &serde_json::to_value(&r.approx).map_err(|e| e.to_string())?,
    )?;
    for (k, v) in &r.agrees_with_ptx_isa {
        println!(
            "mma {k}: measured; matches the PTX ISA figures: {}",
            if *v { "yes" } else { "NO" }
        );
    }
    for (k, v) in &r.layout.ldmatrix {
        println!("ldmatrix {k}: {} elements measured", v.len());
    }
    println!(
        "{:<22} {:>12} {:>12} {:>12}  domain",
        "instruction", "max ulp", "max abs", "max rel"
    );
    for e in &r.approx.ops {
        println!(
            "{:<22} {:>12.3} {:>12.3e} {:>12.3e}  {}",
            e.instruction, e.max_ulp, e.max_abs, e.max_rel, e.domain
        );
    }
    println!(
        "tables written to {}, receipt {}",
        a.out.display(),
        a.receipt.display()
    );
    Ok(())
}
