//! Every probe kernel verifies, translates to PTX and assembles with ptxas.

use quench_isa::probe_kernels::*;

#[test]
fn every_probe_kernel_assembles() {
    let mut kernels = vec![];
    for e in MmaElem::ALL {
        kernels.push(mma_relation_probe(e).unwrap());
        kernels.push(mma_accumulator_probe(e).unwrap());
    }
    for (num, trans) in LDMATRIX_VARIANTS {
        kernels.push(ldmatrix_probe(num, trans).unwrap());
    }
    for op in ApproxOp::ALL {
        kernels.push(approx_probe(op).unwrap());
    }
    for f in &kernels {
        let ptx = quench_ptx::emit(f).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        quench_ptx::ptxas::assemble(&ptx, "sm_90").unwrap_or_else(|e| panic!("{}: {e}", f.name));
    }
}
