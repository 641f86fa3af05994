//! Matrix products on the tensor cores for prompt processing: `C = A·Bᵀ` (or `C += A·Bᵀ`)
//! with `A` the activations, bf16 row-major `[m, k]`; `B` a weight matrix `[n, k]`,
//! row-major (each output column's operands contiguous — the layout of a linear layer's
//! weight and the `.col` operand `mma.sync` wants), stored as bf16 or in a GGUF block
//! format (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K: rows of `k` elements back to back); `C`
//! row-major `[m, n]`, f32 — or bf16 ([`Epilogue::StoreBf16`]) where the product only
//! feeds the next bf16 operand: the f32 sums rounded to nearest even as they are stored,
//! the very bits a separate `cast_f32_bf16` pass over the f32 output would give, at a
//! quarter of the memory traffic (half the stores, no second read and write).
//!
//! **Shapes.** `n` and `k` are fixed when the kernel is built (`n` a multiple of `bn`, `k`
//! of [`BFormat::k_multiple`]); `m`, the number of tokens, is a launch argument and may
//! be anything from 1 up: rows of `A` past `m` are read as row `m − 1` (their products
//! are never stored), and `C` is written for rows below `m` only. `A` and a bf16 `B` must
//! be 16-byte aligned, a quantized `B` 4-byte aligned, an f32 `C` 8-byte aligned, a
//! bf16 `C` 4-byte aligned.
//!
//! **Tiling.** A block computes a `bm × bn` tile of `C` (64 or 128 each), warps arranged
//! `bm/64 × bn/wn`, each computing `64 × wn` (`wn` 32 or 64) as `4 × wn/8`
//! `mma.sync.m16n8k16` bf16 → f32 accumulators; k advances 32 per step. The grid is
//! `[⌈m / bm⌉, n / bn]`, `m`-tiles first, so that the blocks resident at once share a few
//! columns of `B` and all of `A`, and both are read from memory about once.
//!
//! **Pipeline** (`kernel.rs`): `stages` shared-memory stages, filled by `cp.async` one
//! commit group per step, waited for with `cp.async.wait_group stages − 2`, one barrier
//! per step. A bf16 `B` is copied like `A` (`tiles.rs`). A quantized `B` is copied as its
//! stored bytes (`raw.rs`) one step further ahead, and each step dequantizes the next
//! step's bytes into one of two bf16 tile buffers (`decode.rs`) while its warps multiply
//! the current one: the weights exist as bf16 only in shared memory, a tile at a time.
//!
//! **Arithmetic.** Products of bf16 are exact in f32; how the tensor core adds them is
//! not IEEE-specified, so the check is a bound (see [`reference::tolerance`]). A quantized
//! weight is dequantized exactly as [`quench_models::dequant`] does, then rounded to bf16:
//! the product is that of `A` with `bf16(dequant(B))`, and the reference rounds the same
//! way. (For Q8_0, Q4_0 and Q4_1 the rounding is exact whenever `d·q` fits in bf16's 8
//! significant bits; in general it is not, for any format: `d` has 11.) `A` is taken in
//! bf16: f32 activations would be rounded to bf16 on their way to the tensor cores all
//! the same, so they are best rounded once, by the kernel that writes them.

mod case;
mod decode;
pub mod format;
mod kernel;
mod raw;
pub mod reference;
mod tiles;

use quench_ir::func::MAX_STATIC_SHARED_BYTES;
use quench_ir::Scalar;
use quench_rt::Launch;

pub use case::{case, exactness_case};
pub use format::BFormat;
pub use kernel::build;

use crate::error::KernelError;

/// k covered by one pipeline step.
pub const BK: u32 = 32;
/// Rows of a warp tile.
pub const WARP_M: u32 = 64;

/// What the kernel does with `C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// `C = A·Bᵀ`.
    Store,
    /// `C += A·Bᵀ` (a residual stream updated in place).
    Accumulate,
    /// `C = bf16(A·Bᵀ)`, `C` bf16: each f32 sum rounded to nearest even.
    StoreBf16,
}

impl Epilogue {
    pub const ALL: [Epilogue; 3] = [Epilogue::Store, Epilogue::Accumulate, Epilogue::StoreBf16];

    /// The element type of `C`.
    pub fn c_elem(self) -> Scalar {
        match self {
            Epilogue::Store | Epilogue::Accumulate => Scalar::F32,
            Epilogue::StoreBf16 => Scalar::BF16,
        }
    }
}

/// Library names, by format (in [`BFormat::ALL`] order) and epilogue (in
/// [`Epilogue::ALL`] order).
const NAMES: [[&str; 3]; 6] = [
    ["gemm_bf16", "gemm_bf16_residual", "gemm_bf16_to_bf16"],
    ["gemm_q8_0", "gemm_q8_0_residual", "gemm_q8_0_to_bf16"],
    ["gemm_q4_0", "gemm_q4_0_residual", "gemm_q4_0_to_bf16"],
    ["gemm_q4_1", "gemm_q4_1_residual", "gemm_q4_1_to_bf16"],
    ["gemm_q4_k", "gemm_q4_k_residual", "gemm_q4_k_to_bf16"],
    ["gemm_q6_k", "gemm_q6_k_residual", "gemm_q6_k_to_bf16"],
];

pub fn name(format: BFormat, epilogue: Epilogue) -> &'static str {
    let f = match format {
        BFormat::Bf16 => 0,
        BFormat::Q8_0 => 1,
        BFormat::Q4_0 => 2,
        BFormat::Q4_1 => 3,
        BFormat::Q4K => 4,
        BFormat::Q6K => 5,
    };
    let e = match epilogue {
        Epilogue::Store => 0,
        Epilogue::Accumulate => 1,
        Epilogue::StoreBf16 => 2,
    };
    NAMES[f][e]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmParams {
    pub format: BFormat,
    pub epilogue: Epilogue,
    /// Columns of `C` (rows of `B`).
    pub n: u32,
    /// The reduction length.
    pub k: u32,
    /// Block tile: 64 or 128 each.
    pub bm: u32,
    pub bn: u32,
    /// Warp tile columns: 32 or 64 (warp tiles are `64 × wn`).
    pub wn: u32,
    /// Shared-memory pipeline stages, 2..=4.
    pub stages: u32,
}

impl GemmParams {
    pub fn name(&self) -> &'static str {
        name(self.format, self.epilogue)
    }

    pub fn threads(&self) -> u32 {
        (self.bm / WARP_M) * (self.bn / self.wn) * 32
    }

    pub fn launch(&self, m: u32) -> Launch {
        Launch {
            grid: [m.div_ceil(self.bm), self.n / self.bn, 1],
            block: [self.threads(), 1, 1],
            dynamic_shared_bytes: 0,
        }
    }

    /// Static shared memory the kernel declares (each array 128-byte aligned).
    pub fn shared_bytes(&self) -> u64 {
        let a = self.stages * self.bm * BK * 2;
        let arrays = if self.format.is_quantized() {
            vec![
                a,
                2 * self.bn * BK * 2,
                self.stages * self.bn * self.format.staged_stride() * 4,
            ]
        } else {
            vec![a, self.stages * self.bn * BK * 2]
        };
        arrays
            .iter()
            .map(|&b| (b as u64).next_multiple_of(128))
            .sum()
    }

    fn check(&self) -> Result<(), KernelError> {
        let fail = |reason: String| Err(KernelError::unsupported(self.name(), reason));
        if ![64, 128].contains(&self.bm) || ![64, 128].contains(&self.bn) {
            return fail(format!(
                "bm = {}, bn = {}: each must be 64 or 128",
                self.bm, self.bn
            ));
        }
        if ![32, 64].contains(&self.wn) {
            return fail(format!("wn = {}: must be 32 or 64", self.wn));
        }
        if !(2..=4).contains(&self.stages) {
            return fail(format!("stages = {}: must be 2, 3 or 4", self.stages));
        }
        if self.n == 0 || !self.n.is_multiple_of(self.bn) {
            return fail(format!(
                "n = {} must be a positive multiple of bn = {}",
                self.n, self.bn
            ));
        }
        let km = self.format.k_multiple();
        if self.k == 0 || !self.k.is_multiple_of(km) {
            return fail(format!(
                "k = {} must be a positive multiple of {km} for {:?} weights",
                self.k, self.format
            ));
        }
        if self.n / self.bn > 65535 {
            return fail(format!(
                "n = {} over bn = {} gives more than 65535 column tiles",
                self.n, self.bn
            ));
        }
        let smem = self.shared_bytes();
        if smem > MAX_STATIC_SHARED_BYTES {
            return fail(format!(
                "{} stages of {}×{} tiles need {smem} bytes of shared memory, more than {MAX_STATIC_SHARED_BYTES}",
                self.stages, self.bm, self.bn
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
