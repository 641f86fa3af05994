//! quench-kernels: the kernel library.
//!
//! One module per kernel family, each holding three things side by side: the **layout**
//! (shapes, strides, the thread mapping), the **builder** (IR for given parameters) and
//! the **reference** (plain Rust computing the same function — in the kernel's own
//! operation order where the kernel is exact, so the check is bit-for-bit; otherwise with
//! an error bound derived from the approximations used, and a deliberately wrong
//! reference that must fail it).
//!
//! [`library`] lists every kernel by name with its parameters; [`case`] runs a kernel
//! against its reference on any executor.

pub mod add;
pub mod approx;
pub mod argmax;
pub mod attention;
pub mod bias;
pub mod case;
pub mod data;
pub mod elementwise;
pub mod embed;
pub mod encoder_attention;
pub mod error;
pub mod gemm;
pub mod gemv;
pub mod gemv_tc;
pub mod ggml;
pub mod lanes;
mod library;
pub mod mask;
pub mod norm_residual;
mod par;
pub mod params;
pub mod qgemv;
pub mod reduce;
pub mod rmsnorm;
pub mod rmsnorm_rows;
pub mod rope;
pub mod rows;
pub mod sample;
pub mod silu_mul;
pub mod softmax;
pub mod to_bf16;

pub use case::{
    compare, compare_controls, compare_expected, run_case, time_case, Buffer, CaseArg, CaseError,
    CaseOutputs, Check, CompareReport, Control, Expected, KernelCase, Mismatch, Timing,
};
pub use error::KernelError;
pub use library::{find, library, KernelSpec};
pub use params::{ParamInfo, Params};
