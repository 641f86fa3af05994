//! Every kernel of SmolLM2's decode step, at the parameters the engine builds it with
//! (the kernels of one-row steps and of steps of up to 64 rows, over an f16 and an f32
//! KV cache), emitted as PTX and
//! assembled by `ptxas` for sm_90 without register spills. Needs
//! `QUENCH_SMOLLM2_GGUF` (the SmolLM2-135M-Instruct Q4_1 GGUF file) and `ptxas`
//! (`QUENCH_PTXAS`, `PATH` or the nvidia-cuda-nvcc wheel); without them it fails in CI and
//! reports NOT RUN elsewhere (quench-testkit).

use quench_engine::gpu::{Catalog, DecodeGraph, StepShape};
use quench_engine::KvCache;
use quench_models::arch::{ModelConfig, Naming};
use quench_models::GgufFile;
use quench_ptx::ptxas::{assemble, find_ptxas};

#[test]
fn smollm2_step_kernels_assemble_without_spills() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    if quench_testkit::ok(find_ptxas()).is_none() {
        return;
    }
    let file = GgufFile::open(&path).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    let catalog = Catalog::choose(&config, &file, Naming::Gguf).unwrap();
    let mut kernels = vec![];
    for kv in [KvCache::F16, KvCache::F32] {
        let shape = StepShape {
            context: 8192,
            sessions: 1,
            max_batch: 64,
            kv,
        };
        let graph = DecodeGraph::assemble(&config, &catalog, &file, Naming::Gguf, shape).unwrap();
        for f in graph.kernels {
            if !kernels
                .iter()
                .any(|k: &quench_ir::Function| k.name == f.name)
            {
                kernels.push(f);
            }
        }
    }
    let mut failures = vec![];
    for f in &kernels {
        let ptx = quench_ptx::emit(f).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        match assemble(&ptx, "sm_90") {
            Ok(r) => {
                eprintln!(
                    "{:<28} registers {:>3}  spills {:>3}/{:>3} B",
                    f.name, r.registers, r.spill_store_bytes, r.spill_load_bytes
                );
                if r.spill_store_bytes > 0 || r.spill_load_bytes > 0 {
                    failures.push(format!("{}: spills registers", f.name));
                }
            }
            Err(e) => failures.push(format!("{}: {e}", f.name)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
