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
