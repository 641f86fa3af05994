//! The library's kernels assembled by ptxas: the corpus the cubin and SASS tests read.

#![allow(dead_code)]

use std::sync::OnceLock;

pub struct Assembled {
    pub name: String,
    pub cubin: Vec<u8>,
}

/// Every library kernel with its default parameters, through quench's PTX and ptxas; `None`
/// (after `not_run`) when ptxas is missing.
pub fn library() -> Option<&'static [Assembled]> {
    static CORPUS: OnceLock<Option<Vec<Assembled>>> = OnceLock::new();
    CORPUS
        .get_or_init(|| {
            quench_ptx::ptxas::find_ptxas().ok()?;
            let mut out = Vec::new();
            for spec in quench_kernels::library() {
                let params = spec.parse_params("").expect("defaults parse");
                let f = spec.build(&params).expect("library kernel builds");
                let ptx = quench_ptx::emit(&f).expect("library kernel emits PTX");
                let r = quench_ptx::ptxas::assemble(&ptx, "sm_90")
                    .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
                out.push(Assembled {
                    name: spec.name.to_string(),
                    cubin: r.cubin,
                });
            }
            Some(out)
        })
        .as_deref()
        .or_else(|| {
            // Every test that needed the corpus reports that it did not run.
            quench_testkit::ok(quench_ptx::ptxas::find_ptxas());
            None
        })
}
