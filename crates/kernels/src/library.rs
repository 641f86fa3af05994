//! The kernel library: every kernel by name, with its parameters, its builder and its
//! case maker.

use quench_ir::{Function, Scalar};

use crate::add::{self, AddParams};
use crate::case::KernelCase;
use crate::error::KernelError;
use crate::gemm::{self, GemmParams};
use crate::gemv::{self, GemvParams};
use crate::lanes::Combine;
use crate::params::{self, ParamInfo, Params, Reader};
use crate::reduce::{self, ReduceParams};
use crate::rmsnorm::{self, RmsNormParams};
use crate::silu_mul::{self, SiluMulParams};
use crate::softmax::{self, SoftmaxParams};

/// One kernel of the library.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub params: &'static [ParamInfo],
    build: fn(&Params) -> Result<Function, KernelError>,
    case: fn(&Params, u64) -> Result<KernelCase, KernelError>,
}

impl KernelSpec {
    pub fn default_params(&self) -> Params {
        params::defaults(self.params)
    }

    /// The defaults with `key=value` items (separated by commas or spaces) applied.
    pub fn parse_params(&self, text: &str) -> Result<Params, KernelError> {
        params::parse(self.name, self.params, text)
    }

    /// The kernel's IR for these parameters (verified).
    pub fn build(&self, p: &Params) -> Result<Function, KernelError> {
        (self.build)(p)
    }

    /// A case with fresh inputs drawn from `seed` and the reference outputs.
    pub fn make_case(&self, p: &Params, seed: u64) -> Result<KernelCase, KernelError> {
        (self.case)(p, seed)
    }
}

/// Every kernel of the library, in a fixed order.
pub fn library() -> Vec<KernelSpec> {
    vec![
        KernelSpec {
            name: "add_f32",
            description: "elementwise y = a + b, f32, 16-byte vector accesses",
            params: ELEMENTWISE,
            build: |p| add::build(&add_params(Scalar::F32, p)?),
            case: |p, seed| add::case(&add_params(Scalar::F32, p)?, n_of("add_f32", p)?, seed),
        },
        KernelSpec {
            name: "add_bf16",
            description: "elementwise y = a + b, bf16 (added in f32, rounded once), 16-byte vector accesses",
            params: ELEMENTWISE,
            build: |p| add::build(&add_params(Scalar::BF16, p)?),
            case: |p, seed| add::case(&add_params(Scalar::BF16, p)?, n_of("add_bf16", p)?, seed),
        },
        KernelSpec {
            name: silu_mul::NAME,
            description: "y = silu(g)·u (SwiGLU gate), bf16 in/out, f32 math with ex2.approx and div.approx",
            params: ELEMENTWISE,
            build: |p| silu_mul::build(&silu_params(p)?),
            case: |p, seed| silu_mul::case(&silu_params(p)?, n_of(silu_mul::NAME, p)?, seed),
        },
        KernelSpec {
            name: "reduce_sum_f32",
            description: "row sums of a [rows, cols] f32 matrix, one block per row, fixed summation order",
            params: ROWS,
            build: |p| reduce::build(&reduce_params(Combine::Sum, p)?),
            case: |p, seed| reduce::case(&reduce_params(Combine::Sum, p)?, rows_of("reduce_sum_f32", p)?, seed),
        },
        KernelSpec {
            name: "reduce_max_f32",
            description: "row maxima of a [rows, cols] f32 matrix, one block per row",
            params: ROWS,
            build: |p| reduce::build(&reduce_params(Combine::Max, p)?),
            case: |p, seed| reduce::case(&reduce_params(Combine::Max, p)?, rows_of("reduce_max_f32", p)?, seed),
        },
        KernelSpec {
            name: rmsnorm::NAME,
            description: "RMS normalization of [rows, cols] bf16 by a bf16 weight, f32 math with IEEE sqrt and reciprocal",
            params: ROWS,
            build: |p| rmsnorm::build(&rmsnorm_params(p)?),
            case: |p, seed| rmsnorm::case(&rmsnorm_params(p)?, rows_of(rmsnorm::NAME, p)?, seed),
        },
        KernelSpec {
            name: softmax::NAME,
            description: "row softmax of a [rows, cols] f32 matrix, max-subtracted, ex2.approx",
            params: ROWS,
            build: |p| softmax::build(&softmax_params(p)?),
            case: |p, seed| softmax::case(&softmax_params(p)?, rows_of(softmax::NAME, p)?, seed),
        },
        KernelSpec {
            name: gemv::NAME,
            description: "y = W·x with W [rows, cols] bf16 row-major, x bf16, y f32; one warp per row, 16-byte .nc loads",
            params: GEMV,
            build: |p| gemv::build(&gemv_params(p)?),
            case: |p, seed| gemv::case(&gemv_params(p)?, seed),
        },
        KernelSpec {
            name: gemm::NAME,
            description: "C = A·B on tensor cores: A [m, k] bf16, B as [n, k] bf16, C [m, n] f32; \
                          mma.sync m16n8k16, ldmatrix, cp.async double buffering",
            params: GEMM,
            build: |p| gemm::build(&gemm_params(p)?),
            case: |p, seed| gemm::case(&gemm_params(p)?, seed),
        },
    ]
}

/// The kernel named `name`.
pub fn find(name: &str) -> Result<KernelSpec, KernelError> {
    library().into_iter().find(|k| k.name == name).ok_or_else(|| KernelError::UnknownKernel { name: name.to_string() })
}

const MAX_N: u64 = 1 << 30;
const MAX_ROWS: u64 = (1 << 31) - 1;
const MAX_COLS: u64 = 1 << 24;

const ELEMENTWISE: &[ParamInfo] = &[
    ParamInfo { name: "n", default: 1 << 24, doc: "elements (a launch argument; the case size)" },
    ParamInfo { name: "threads", default: 256, doc: "threads per block" },
];

const ROWS: &[ParamInfo] = &[
    ParamInfo { name: "rows", default: 4096, doc: "rows (the grid; the case size)" },
    ParamInfo { name: "cols", default: 4096, doc: "row length, fixed in the kernel" },
    ParamInfo { name: "threads", default: 256, doc: "threads per block (one block per row)" },
];

const GEMV: &[ParamInfo] = &[
    ParamInfo { name: "rows", default: 8192, doc: "rows of W (outputs)" },
    ParamInfo { name: "cols", default: 8192, doc: "columns of W (inputs), a multiple of 8" },
    ParamInfo { name: "warps", default: 4, doc: "rows per block (one warp each)" },
    ParamInfo { name: "unroll", default: 4, doc: "16-byte loads in flight per lane" },
];

const GEMM: &[ParamInfo] = &[
    ParamInfo { name: "m", default: 2048, doc: "rows of A and C, a multiple of bm" },
    ParamInfo { name: "n", default: 2048, doc: "columns of C (rows of the [n, k] B operand), a multiple of bn" },
    ParamInfo { name: "k", default: 2048, doc: "the reduction length, a multiple of 32" },
    ParamInfo { name: "bm", default: 128, doc: "block tile rows: 64 or 128" },
    ParamInfo { name: "bn", default: 128, doc: "block tile columns: 64 or 128" },
];

fn threads(r: &Reader) -> Result<u32, KernelError> {
    r.get("threads", 32, 1024)
}

fn add_params(elem: Scalar, p: &Params) -> Result<AddParams, KernelError> {
    let name = if elem == Scalar::F32 { "add_f32" } else { "add_bf16" };
    let r = Reader::new(name, ELEMENTWISE, p)?;
    Ok(AddParams { elem, threads: threads(&r)? })
}

fn silu_params(p: &Params) -> Result<SiluMulParams, KernelError> {
    let r = Reader::new(silu_mul::NAME, ELEMENTWISE, p)?;
    Ok(SiluMulParams { threads: threads(&r)? })
}

fn n_of(name: &str, p: &Params) -> Result<u32, KernelError> {
    Reader::new(name, ELEMENTWISE, p)?.get("n", 1, MAX_N)
}

fn rows_of(name: &str, p: &Params) -> Result<u32, KernelError> {
    Reader::new(name, ROWS, p)?.get("rows", 1, MAX_ROWS)
}

fn reduce_params(op: Combine, p: &Params) -> Result<ReduceParams, KernelError> {
    let name = ReduceParams { op, cols: 0, threads: 0 }.name();
    let r = Reader::new(name, ROWS, p)?;
    Ok(ReduceParams { op, cols: r.get("cols", 1, MAX_COLS)?, threads: threads(&r)? })
}

fn rmsnorm_params(p: &Params) -> Result<RmsNormParams, KernelError> {
    let r = Reader::new(rmsnorm::NAME, ROWS, p)?;
    Ok(RmsNormParams { cols: r.get("cols", 1, MAX_COLS)?, threads: threads(&r)? })
}

fn softmax_params(p: &Params) -> Result<SoftmaxParams, KernelError> {
    let r = Reader::new(softmax::NAME, ROWS, p)?;
    Ok(SoftmaxParams { cols: r.get("cols", 1, MAX_COLS)?, threads: threads(&r)? })
}

fn gemv_params(p: &Params) -> Result<GemvParams, KernelError> {
    let r = Reader::new(gemv::NAME, GEMV, p)?;
    Ok(GemvParams {
        rows: r.get("rows", 1, MAX_ROWS)?,
        cols: r.get("cols", 1, MAX_COLS)?,
        warps: r.get("warps", 1, 32)?,
        unroll: r.get("unroll", 1, 16)?,
    })
}

fn gemm_params(p: &Params) -> Result<GemmParams, KernelError> {
    let r = Reader::new(gemm::NAME, GEMM, p)?;
    Ok(GemmParams {
        m: r.get("m", 1, 1 << 20)?,
        n: r.get("n", 1, 1 << 20)?,
        k: r.get("k", 1, 1 << 20)?,
        bm: r.get("bm", 64, 128)?,
        bn: r.get("bn", 64, 128)?,
    })
}
