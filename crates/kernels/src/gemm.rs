//! Matrix products on the tensor cores for prompt processing: `C = A·Bᵀ` (or `C += A·Bᵀ`)
//! with `A` the activations, row-major `[m, k]` of the operand type ([`Operands`]); `B`
//! a weight matrix `[n, k]`, row-major (each output column's operands contiguous — the
//! layout of a linear layer's weight and the `.col` operand `mma.sync` wants), stored as
//! bf16, f16 or in a GGUF block format (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K: rows of `k`
//! elements back to back); `C` row-major `[m, n]`, f32 — or of the operand type
//! ([`Epilogue::StoreHalf`]) where the product only feeds the next operand: the f32 sums
//! rounded to nearest even as they are stored, the very bits a separate rounding pass
//! over the f32 output (`cast_f32_bf16` for bf16) would give, at a quarter of the memory
//! traffic (half the stores, no second read and write).
//!
//! **Operands.** The tensor cores multiply 16-bit values: `A` and the shared-memory tiles
//! of `B` are bf16 ([`Operands::Bf16`]) or f16 ([`Operands::F16`]). bf16 keeps f32's
//! range with 8 significant bits; f16 has 11, eight times finer, which is what keeps an
//! LLM's logits near an f64 reference where bf16 activations (and weights dequantized to
//! bf16) put them too far from it. The price is f16's range: values past ±65504 become
//! infinities (the activations' producer must keep them in range), and those below 2^-14
//! lose bits as subnormals (2^-24 apart). With f16 operands, bf16 weights are copied to
//! shared memory as stored and each fragment register converted to f16 after `ldmatrix`
//! (widened to f32 exactly, then `cvt.rn`): a bf16 weight within f16's range comes
//! through exactly when `|w| ≥ 2^-17` (8 significant bits above the subnormal step
//! 2^-24) and rounds to f16's subnormals below that. f16 weights ([`BFormat::F16`]) need
//! f16 operands; bf16 operands refuse them by name.
//!
//! **Shapes.** `n` and `k` are fixed when the kernel is built (`n` a multiple of `bn`, `k`
//! of [`BFormat::k_multiple`]); `m`, the number of tokens, is a launch argument and may
//! be anything from 1 up: rows of `A` past `m` are read as row `m − 1` (their products
//! are never stored), and `C` is written for rows below `m` only. `A` and a bf16 or f16
//! `B` must be 16-byte aligned, a quantized `B` 4-byte aligned, an f32 `C` 8-byte
//! aligned, a 16-bit `C` 4-byte aligned.
//!
//! **Tiling.** A block computes a `bm × bn` tile of `C` (64 or 128 each), warps arranged
//! `bm/64 × bn/wn`, each computing `64 × wn` (`wn` 32 or 64) as `4 × wn/8`
//! `mma.sync.m16n8k16` (bf16 or f16) → f32 accumulators; k advances 32 per step. The grid
//! is `[⌈m / bm⌉, n / bn]`, `m`-tiles first, so that the blocks resident at once share a
//! few columns of `B` and all of `A`, and both are read from memory about once.
//!
//! With [`Core::Wgmma`] or [`Core::WgmmaProducer`] the products run on Hopper's warpgroup
//! MMA instead (`wg.rs`): warpgroups of 64 weight rows against all of the block's tokens,
//! `bm` 64, 128 or 256.
//!
//! **Pipeline** (`kernel.rs`): `stages` shared-memory stages, filled by `cp.async` one
//! commit group per step, waited for with `cp.async.wait_group stages − 2`, one barrier
//! per step. A bf16 or f16 `B` is copied like `A` (`tiles.rs`). A quantized `B` is copied
//! as its stored bytes (`raw.rs`) one step further ahead, and each step dequantizes the
//! next step's bytes into one of two tile buffers of the operand type (`decode.rs`) while
//! its warps multiply the current one: the weights exist as 16-bit values only in shared
//! memory, a tile at a time.
//!
//! **Arithmetic.** Products of bf16, or of f16, are exact in f32; how the tensor core adds
//! them is not IEEE-specified, so the check is a bound (see [`reference::tolerance`]). A
//! quantized weight is dequantized exactly as [`quench_models::dequant`] does, then
//! rounded to the operand type: the product is that of `A` with `bf16(dequant(B))` or
//! `f16(dequant(B))`, and the reference rounds the same way. (For Q8_0, Q4_0 and Q4_1 the
//! rounding is exact whenever `d·q` fits in the type's significant bits — 8 or 11; in
//! general it is not, for any format: `d` has 11, times `q`'s 4 to 8.) `A` is taken in
//! the operand type: f32 activations would be rounded to it on their way to the tensor
//! cores all the same, so they are best rounded once, by the kernel that writes them.

mod case;
mod decode;
pub mod format;
mod kernel;
mod raw;
pub mod reference;
mod tiles;
mod wg;

use half::{bf16, f16};
use quench_ir::func::MAX_STATIC_SHARED_BYTES;
use quench_ir::interp::MAX_SHARED_BYTES_PER_BLOCK;
use quench_ir::{Builder, Scalar, Value};
use quench_rt::Launch;

pub use case::{case, exactness_case};
pub use format::BFormat;

use crate::error::KernelError;
use crate::lanes::{emit_pack_bf16x2, emit_pack_f16x2};

/// The kernel for `p`: on `mma.sync` (`kernel.rs`) or on `wgmma` (`wg.rs`).
pub fn build(p: &GemmParams) -> Result<quench_ir::Function, KernelError> {
    if p.core.is_wgmma() {
        wg::build(p)
    } else {
        kernel::build(p)
    }
}

/// k covered by one pipeline step.
pub const BK: u32 = 32;
/// Rows of a warp tile.
pub const WARP_M: u32 = 64;

/// The tensor cores' operand type: the elements of `A` and of the shared-memory tiles of
/// `B` (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operands {
    /// bf16: 8 significant bits, f32's range.
    Bf16,
    /// f16: 11 significant bits, range ±65504.
    F16,
}

impl Operands {
    pub const ALL: [Operands; 2] = [Operands::Bf16, Operands::F16];

    pub fn scalar(self) -> Scalar {
        match self {
            Operands::Bf16 => Scalar::BF16,
            Operands::F16 => Scalar::F16,
        }
    }

    /// The packed pair a fragment register holds.
    pub fn pair(self) -> Scalar {
        match self {
            Operands::Bf16 => Scalar::BF16x2,
            Operands::F16 => Scalar::F16x2,
        }
    }

    /// Two f32 rounded to the type (`cvt.rn`) and packed into a 32-bit word, `lo` in the
    /// low half.
    fn emit_pack(self, k: &mut Builder, lo: Value, hi: Value) -> Value {
        match self {
            Operands::Bf16 => emit_pack_bf16x2(k, lo, hi),
            Operands::F16 => emit_pack_f16x2(k, lo, hi),
        }
    }

    /// `x` rounded to the type (to nearest even; f16 past ±65504 to infinity): the host
    /// twin of the kernels' `cvt.rn`.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Operands::Bf16 => bf16::from_f32(x).to_f32(),
            Operands::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// The unit roundoff: 2^-8 for bf16, 2^-11 for f16.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Operands::Bf16 => 2f64.powi(-8),
            Operands::F16 => 2f64.powi(-11),
        }
    }

    /// Half the spacing of the subnormals, the most a rounding to the type can move a
    /// value beyond its relative [`Operands::unit_roundoff`]: 2^-25 for f16; for bf16,
    /// 2^-134, which the bounds' 2^-126 covers (0 here).
    pub fn subnormal_half_step(self) -> f64 {
        match self {
            Operands::Bf16 => 0.0,
            Operands::F16 => 2f64.powi(-25),
        }
    }
}

/// What the kernel does with `C`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Epilogue {
    /// `C = A·Bᵀ`.
    Store,
    /// `C += A·Bᵀ` (a residual stream updated in place).
    Accumulate,
    /// `C = A·Bᵀ` rounded to the operand type (bf16 or f16, to nearest even), `C` of that
    /// type.
    StoreHalf,
}

impl Epilogue {
    pub const ALL: [Epilogue; 3] = [Epilogue::Store, Epilogue::Accumulate, Epilogue::StoreHalf];
}

/// Library names, by operand type (in [`Operands::ALL`] order), format (in
/// [`BFormat::ALL`] order) and epilogue (in [`Epilogue::ALL`] order). f16 weights with
/// bf16 operands are refused: their names only name the refusal.
const NAMES: [[[&str; 3]; 10]; 2] = [
    [
        ["gemm_bf16", "gemm_bf16_residual", "gemm_bf16_to_bf16"],
        ["gemm_f16", "gemm_f16_residual", "gemm_f16_to_bf16"],
        ["gemm_q8_0", "gemm_q8_0_residual", "gemm_q8_0_to_bf16"],
        ["gemm_q4_0", "gemm_q4_0_residual", "gemm_q4_0_to_bf16"],
        ["gemm_q4_1", "gemm_q4_1_residual", "gemm_q4_1_to_bf16"],
        ["gemm_q4_k", "gemm_q4_k_residual", "gemm_q4_k_to_bf16"],
        ["gemm_q5_k", "gemm_q5_k_residual", "gemm_q5_k_to_bf16"],
        ["gemm_q6_k", "gemm_q6_k_residual", "gemm_q6_k_to_bf16"],
        ["gemm_q3_k", "gemm_q3_k_residual", "gemm_q3_k_to_bf16"],
        ["gemm_q2_k", "gemm_q2_k_residual", "gemm_q2_k_to_bf16"],
    ],
    [
        [
            "gemm_bf16_xf16",
            "gemm_bf16_xf16_residual",
            "gemm_bf16_xf16_to_f16",
        ],
        [
            "gemm_f16_xf16",
            "gemm_f16_xf16_residual",
            "gemm_f16_xf16_to_f16",
        ],
        [
            "gemm_q8_0_xf16",
            "gemm_q8_0_xf16_residual",
            "gemm_q8_0_xf16_to_f16",
        ],
        [
            "gemm_q4_0_xf16",
            "gemm_q4_0_xf16_residual",
            "gemm_q4_0_xf16_to_f16",
        ],
        [
            "gemm_q4_1_xf16",
            "gemm_q4_1_xf16_residual",
            "gemm_q4_1_xf16_to_f16",
        ],
        [
            "gemm_q4_k_xf16",
            "gemm_q4_k_xf16_residual",
            "gemm_q4_k_xf16_to_f16",
        ],
        [
            "gemm_q5_k_xf16",
            "gemm_q5_k_xf16_residual",
            "gemm_q5_k_xf16_to_f16",
        ],
        [
            "gemm_q6_k_xf16",
            "gemm_q6_k_xf16_residual",
            "gemm_q6_k_xf16_to_f16",
        ],
        [
            "gemm_q3_k_xf16",
            "gemm_q3_k_xf16_residual",
            "gemm_q3_k_xf16_to_f16",
        ],
        [
            "gemm_q2_k_xf16",
            "gemm_q2_k_xf16_residual",
            "gemm_q2_k_xf16_to_f16",
        ],
    ],
];

pub fn name(operands: Operands, format: BFormat, epilogue: Epilogue) -> &'static str {
    let o = match operands {
        Operands::Bf16 => 0,
        Operands::F16 => 1,
    };
    let f = match format {
        BFormat::Bf16 => 0,
        BFormat::F16 => 1,
        BFormat::Q8_0 => 2,
        BFormat::Q4_0 => 3,
        BFormat::Q4_1 => 4,
        BFormat::Q4K => 5,
        BFormat::Q5K => 6,
        BFormat::Q6K => 7,
        BFormat::Q3K => 8,
        BFormat::Q2K => 9,
    };
    let e = match epilogue {
        Epilogue::Store => 0,
        Epilogue::Accumulate => 1,
        Epilogue::StoreHalf => 2,
    };
    NAMES[o][f][e]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmParams {
    /// The tensor cores' operand type: `A`'s elements and the shared-memory `B` tiles'.
    pub operands: Operands,
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
    /// Shared-memory pipeline stages, 2..=4 (3 or 4 with `wgmma`).
    pub stages: u32,
    /// Which tensor-core instructions multiply, and how the tiles arrive.
    pub core: Core,
}

/// The products' instructions (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    /// `mma.sync`, warp tiles of `64 × wn`.
    MmaSync,
    /// Hopper's `wgmma` (sm_90a): warpgroups of 64 weight rows (`bn / 64` of them)
    /// against all `bm` tokens of the block (64, 128 or 256); `wn` is unused. Every
    /// thread copies and multiplies; quantized weights are dequantized into shared
    /// memory and read there by the tensor cores.
    Wgmma,
    /// As [`Core::Wgmma`], with one more warp that only copies: it fills the stages and
    /// signals them full through mbarriers, the warpgroups signal them empty, and no
    /// block-wide barrier is left in the k-loop. bf16 and f16 weights only.
    WgmmaProducer,
}

impl Core {
    /// From the library parameter `wgmma`: 0, 1 or 2.
    pub fn from_param(x: u32) -> Core {
        match x {
            0 => Core::MmaSync,
            1 => Core::Wgmma,
            _ => Core::WgmmaProducer,
        }
    }

    pub fn is_wgmma(self) -> bool {
        self != Core::MmaSync
    }
}

impl GemmParams {
    pub fn name(&self) -> &'static str {
        name(self.operands, self.format, self.epilogue)
    }

    /// The element type of `C`: f32, or the operand type for [`Epilogue::StoreHalf`].
    pub fn c_elem(&self) -> Scalar {
        match self.epilogue {
            Epilogue::Store | Epilogue::Accumulate => Scalar::F32,
            Epilogue::StoreHalf => self.operands.scalar(),
        }
    }

    /// Whether the kernel converts `B`'s fragments from bf16 to f16 (bf16 weights, f16
    /// operands).
    pub fn converts_b(&self) -> bool {
        self.format == BFormat::Bf16 && self.operands == Operands::F16
    }

    pub fn threads(&self) -> u32 {
        if self.core.is_wgmma() {
            self.bn / 64 * 128
                + if self.core == Core::WgmmaProducer {
                    32
                } else {
                    0
                }
        } else {
            (self.bm / WARP_M) * (self.bn / self.wn) * 32
        }
    }

    pub fn launch(&self, m: u32) -> Launch {
        Launch {
            grid: [m.div_ceil(self.bm), self.n / self.bn, 1],
            block: [self.threads(), 1, 1],
            dynamic_shared_bytes: if self.core.is_wgmma() {
                self.shared_bytes() as u32
            } else {
                0
            },
        }
    }

    /// Shared memory the kernel takes: static arrays (each 128-byte aligned), or with
    /// `wgmma` the dynamic stages of A and B tiles.
    pub fn shared_bytes(&self) -> u64 {
        if self.core.is_wgmma() && self.format.is_quantized() {
            // Activation stages, two dequantized buffers, stages of stored bytes.
            let step = wg::SUB * BK;
            let raw = self.stages * wg::SUB * self.bn * self.format.staged_stride() * 4;
            return ((self.stages * self.bm + 2 * self.bn) * step * 2 + raw) as u64;
        }
        if self.core.is_wgmma() {
            let tiles = (self.stages * (self.bm + self.bn) * wg::SUB * BK * 2) as u64;
            // The copier's full and empty mbarriers, 8 bytes each.
            let bars = if self.core == Core::WgmmaProducer {
                2 * self.stages as u64 * 8
            } else {
                0
            };
            return tiles + bars;
        }
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
        if self.format == BFormat::F16 && self.operands == Operands::Bf16 {
            return fail(
                "f16 weights need f16 operands (Operands::F16): bf16 operands would round \
                 away 3 of their 11 significant bits"
                    .into(),
            );
        }
        if self.core.is_wgmma() {
            if self.format.is_quantized() && self.core == Core::WgmmaProducer {
                return fail("the copier-warp wgmma products take bf16 or f16 weights only".into());
            }
            if ![64, 128, 256].contains(&self.bm) || ![64, 128].contains(&self.bn) {
                return fail(format!(
                    "bm = {}, bn = {}: with wgmma bm must be 64, 128 or 256 and bn 64 or 128",
                    self.bm, self.bn
                ));
            }
            if !(3..=4).contains(&self.stages) {
                return fail(format!(
                    "stages = {}: with wgmma must be 3 or 4",
                    self.stages
                ));
            }
            let step = wg::SUB * BK;
            if self.k == 0 || !self.k.is_multiple_of(step) {
                return fail(format!(
                    "k = {} must be a positive multiple of {step} for the wgmma products",
                    self.k
                ));
            }
        } else if ![64, 128].contains(&self.bm) || ![64, 128].contains(&self.bn) {
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
        if self.core.is_wgmma() && smem > MAX_SHARED_BYTES_PER_BLOCK {
            return fail(format!(
                "{} stages of {}×{} tiles need {smem} bytes of shared memory, more than {MAX_SHARED_BYTES_PER_BLOCK}",
                self.stages, self.bm, self.bn
            ));
        }
        if !self.core.is_wgmma() && smem > MAX_STATIC_SHARED_BYTES {
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
