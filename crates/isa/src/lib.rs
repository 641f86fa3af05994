//! quench-isa: the machine model of sm_90 recovered by measurement.
//!
//! Probe kernels ([`probe_kernels`]) run on the GPU; their outputs become the tables
//! under `isa/sm90/` that the interpreter reads: MMA fragment and `ldmatrix` layouts
//! ([`mma_layout`]) and the error of approximate instructions ([`approx`]).
//! [`probe`] runs them all through an executor. [`latency`] builds the latency and
//! throughput probes behind `isa/sm90/latencies.json`.

pub mod approx;
pub mod latency;
pub mod mma_layout;
pub mod probe;
pub mod probe_kernels;

#[derive(Debug, thiserror::Error)]
pub enum IsaError {
    #[error("probe: {0}")]
    Probe(String),
    #[error("probe kernel does not verify: {0}")]
    Verify(#[from] quench_ir::VerifyError),
    #[error(transparent)]
    Runtime(#[from] quench_rt::RtError),
}
