//! Every library kernel at its default parameters, emitted as PTX and assembled by
//! `ptxas` for sm_90; prints the registers and spills of each.

use quench_kernels::library;
use quench_ptx::ptxas::assemble;

#[test]
fn every_kernel_assembles() {
    let mut failures = vec![];
    for spec in library() {
        let f = spec
            .build(&spec.default_params())
            .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        let ptx = match quench_ptx::emit(&f) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{}: PTX emission failed: {e}", spec.name));
                continue;
            }
        };
        match assemble(&ptx, "sm_90") {
            Ok(r) => {
                eprintln!(
                    "{:<16} registers {:>3}  spill stores {:>3} B  spill loads {:>3} B  shared {:>6} B  stack {:>3} B",
                    spec.name, r.registers, r.spill_store_bytes, r.spill_load_bytes, r.shared_bytes, r.stack_frame_bytes
                );
                if r.spill_store_bytes > 0 || r.spill_load_bytes > 0 {
                    failures.push(format!("{}: spills registers", spec.name));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", spec.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The wgmma products assemble for sm_90a without spills and without a warning (ptxas
/// warns when it has to serialize the asynchronous products). One known exception: the
/// copier-warp variant with 256×128 tiles spills 32 bytes at 166 registers (computing
/// the copier's row pointers as it copies instead of holding them does not change it).
#[test]
fn wgmma_gemms_assemble_without_warnings() {
    use quench_kernels::gemm::{BFormat, Core, Epilogue, GemmParams, Operands};
    let mut failures = vec![];
    for (operands, format) in [
        (Operands::F16, BFormat::Bf16),
        (Operands::F16, BFormat::F16),
        (Operands::Bf16, BFormat::Bf16),
    ] {
        for (bm, bn, stages) in [(64, 128, 3), (128, 128, 4), (256, 128, 4), (256, 64, 4)] {
            for (epilogue, core) in Epilogue::ALL
                .into_iter()
                .flat_map(|e| [(e, Core::Wgmma), (e, Core::WgmmaProducer)])
            {
                let p = GemmParams {
                    operands,
                    format,
                    epilogue,
                    n: 4096,
                    k: 4096,
                    bm,
                    bn,
                    wn: 64,
                    stages,
                    core,
                };
                let known = core == Core::WgmmaProducer && (bm, bn) == (256, 128);
                if let Err(e) = assemble_gemm(&p, if known { 32 } else { 0 }) {
                    failures.push(format!("{core:?} bm {bm} bn {bn}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The wgmma products of quantized weights (dequantized in shared memory) assemble
/// without spills or warnings at the tiles the prompt path would take.
#[test]
fn quantized_wgmma_gemms_assemble_without_spills() {
    use quench_kernels::gemm::{BFormat, Core, Epilogue, GemmParams, Operands};
    let mut failures = vec![];
    for format in BFormat::ALL.into_iter().filter(|f| f.is_quantized()) {
        for (bm, bn) in [(128, 128), (256, 128)] {
            let p = GemmParams {
                operands: Operands::F16,
                format,
                epilogue: Epilogue::Store,
                n: 4096,
                k: 4096,
                bm,
                bn,
                wn: 64,
                stages: 3,
                core: Core::Wgmma,
            };
            if let Err(e) = assemble_gemm(&p, 0) {
                failures.push(format!("bm {bm} bn {bn}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Assemble the product `p`; an error names spills past `spill_limit` bytes, warnings or
/// a rejection. Prints the registers.
fn assemble_gemm(p: &quench_kernels::gemm::GemmParams, spill_limit: u32) -> Result<(), String> {
    let f = quench_kernels::gemm::build(p).map_err(|e| e.to_string())?;
    let ptx = quench_ptx::emit(&f).map_err(|e| e.to_string())?;
    if p.core.is_wgmma() && !ptx.contains(".target sm_90a") {
        return Err(format!("{}: not emitted for sm_90a", p.name()));
    }
    let r = assemble(&ptx, "sm_90").map_err(|e| format!("{}: {e}", p.name()))?;
    eprintln!(
        "{} {:?} bm {} bn {}: {} registers",
        p.name(),
        p.core,
        p.bm,
        p.bn,
        r.registers
    );
    if r.spill_store_bytes > spill_limit || !r.warnings.is_empty() {
        return Err(format!(
            "{}: spills {} B, warnings {:?}",
            p.name(),
            r.spill_store_bytes,
            r.warnings
        ));
    }
    Ok(())
}
