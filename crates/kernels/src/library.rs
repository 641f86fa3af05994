//! The kernel library: every kernel by name, with its parameters, its builder and its
//! case maker.

use quench_ir::{Function, Scalar};

use crate::add::{self, AddParams};
use crate::argmax::{self, ArgmaxParams};
use crate::attention::append::{self, AppendParams};
use crate::attention::decode::{self, DecodeParams};
use crate::attention::merge::{self, MergeParams};
use crate::attention::prefill::{self, PrefillParams};
use crate::attention::rope_append::{self, RopeAppendParams};
use crate::attention::KvElem;
use crate::bias::{self, BiasRowsParams};
use crate::case::KernelCase;
use crate::embed::{self, EmbedParams, TableFormat};
use crate::encoder_attention::{self, EncoderAttentionParams};
use crate::error::KernelError;
use crate::gemm::{self, BFormat, Core, Epilogue as GemmEpilogue, GemmParams, Operands};
use crate::gemv::{self, GemvParams};
use crate::gemv_tc;
use crate::lanes::Combine;
use crate::mask::{self, MaskParams};
use crate::norm_residual::{self, Norm, NormOut, NormResidualParams, OutType};
use crate::params::{self, ParamInfo, Params, Reader};
use crate::qgemv::{self, Epilogue, Prologue, QGemvParams, WeightFormat};
use crate::reduce::{self, ReduceParams};
use crate::rmsnorm::{self, RmsNormParams};
use crate::rmsnorm_rows::{self, RmsNormRowsParams};
use crate::rope::{self, RopeParams, RopeStyle};
use crate::sample::{self, SampleParams};
use crate::silu_mul::{self, SiluMulParams};
use crate::softmax::{self, SoftmaxParams};
use crate::to_bf16::{self, Activation, ToBf16Params};

/// Which builder a library entry calls, with the variant it builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Add(Scalar),
    SiluMul,
    Reduce(Combine),
    RmsNorm,
    RmsNormRows,
    Softmax,
    Gemv,
    Gemm(Operands, BFormat, GemmEpilogue),
    Embed(TableFormat),
    NormResidual(Norm, NormOut),
    Rope(RopeStyle),
    QGemv(WeightFormat, Epilogue, OutType),
    QGemvRmsNorm(WeightFormat, Epilogue),
    GemvTc(Epilogue),
    AttentionDecode(KvElem, bool),
    AttentionMerge(OutType),
    Argmax,
    MaskLogits,
    KvAppend(KvElem),
    RopeAppend(RopeStyle, bool, KvElem),
    AttentionPrefill(KvElem),
    Sample,
    ToBf16(Activation, Scalar),
    BiasRows,
    EncoderAttention,
}

/// One kernel of the library.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub params: &'static [ParamInfo],
    family: Family,
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
        let r = Reader::new(self.name, self.params, p)?;
        match self.family {
            Family::Add(elem) => add::build(&AddParams {
                elem,
                threads: threads(&r)?,
            }),
            Family::SiluMul => silu_mul::build(&SiluMulParams {
                threads: threads(&r)?,
            }),
            Family::Reduce(op) => reduce::build(&reduce_params(op, &r)?),
            Family::RmsNorm => rmsnorm::build(&rmsnorm_params(&r)?),
            Family::RmsNormRows => rmsnorm_rows::build(&rmsnorm_rows_params(&r)?),
            Family::Softmax => softmax::build(&softmax_params(&r)?),
            Family::Gemv => gemv::build(&gemv_params(&r)?),
            Family::Gemm(o, f, e) => gemm::build(&gemm_params(o, f, e, &r)?),
            Family::Embed(f) => embed::build(&embed_params(f, &r)?),
            Family::NormResidual(n, o) => norm_residual::build(&norm_residual_params(n, o, &r)?),
            Family::Rope(style) => rope::build(&rope_params(style, &r)?),
            Family::QGemv(f, e, a) => qgemv::build(&qgemv_params(f, Prologue::None, e, a, &r)?),
            Family::QGemvRmsNorm(f, e) => {
                qgemv::build(&qgemv_params(f, Prologue::RmsNorm, e, OutType::F32, &r)?)
            }
            Family::GemvTc(e) => gemv_tc::build(&gemv_tc::params_from(e, &r)?.0),
            Family::AttentionDecode(kv, merge) => decode::build(&decode_params(kv, merge, &r)?),
            Family::AttentionMerge(out) => merge::build(&merge_params(out, &r)?),
            Family::Argmax => argmax::build(&argmax_params(&r)?),
            Family::MaskLogits => mask::build(&mask_params(&r)?),
            Family::KvAppend(kv) => append::build(&append_params(kv, &r)?),
            Family::RopeAppend(style, qk_norm, kv) => {
                rope_append::build(&rope_append_params(style, qk_norm, kv, &r)?)
            }
            Family::AttentionPrefill(kv) => prefill::build(&prefill_params(kv, &r)?),
            Family::Sample => sample::build(&sample_params(&r)?),
            Family::ToBf16(a, out) => to_bf16::build(&ToBf16Params {
                activation: a,
                out,
                threads: threads(&r)?,
            }),
            Family::BiasRows => bias::build(&BiasRowsParams {
                threads: threads(&r)?,
            }),
            Family::EncoderAttention => encoder_attention::build(&encoder_attention_params(&r)?),
        }
    }

    /// A problem small enough for the interpreter to run quickly (the profiler's
    /// interpreter backend and its tests), as `key=value` text for
    /// [`KernelSpec::parse_params`]; empty for the defaults.
    pub fn small_params(&self) -> &'static str {
        self.family.small_params()
    }

    /// The problem `quench check-kernels` runs on the GPU and in the interpreter and
    /// compares element by element: larger than [`KernelSpec::small_params`], still
    /// small enough for the interpreter; empty for the defaults.
    pub fn compare_params(&self) -> &'static str {
        self.family.compare_params()
    }

    /// The full-size problems `quench check-kernels` times on the GPU (`""`: the
    /// defaults).
    pub fn perf_params(&self) -> &'static [&'static str] {
        self.family.perf_params()
    }

    /// A case with fresh inputs drawn from `seed` and the reference outputs.
    pub fn make_case(&self, p: &Params, seed: u64) -> Result<KernelCase, KernelError> {
        let r = Reader::new(self.name, self.params, p)?;
        match self.family {
            Family::Add(elem) => add::case(
                &AddParams {
                    elem,
                    threads: threads(&r)?,
                },
                n_of(&r)?,
                seed,
            ),
            Family::SiluMul => silu_mul::case(
                &SiluMulParams {
                    threads: threads(&r)?,
                },
                n_of(&r)?,
                seed,
            ),
            Family::Reduce(op) => reduce::case(&reduce_params(op, &r)?, rows_of(&r)?, seed),
            Family::RmsNorm => rmsnorm::case(&rmsnorm_params(&r)?, rows_of(&r)?, seed),
            Family::RmsNormRows => {
                rmsnorm_rows::case(&rmsnorm_rows_params(&r)?, rows_of(&r)?, seed)
            }
            Family::Softmax => softmax::case(&softmax_params(&r)?, rows_of(&r)?, seed),
            Family::Gemv => gemv::case(&gemv_params(&r)?, seed),
            Family::Gemm(o, f, e) => {
                gemm::case(&gemm_params(o, f, e, &r)?, r.get("m", 1, 1 << 24)?, seed)
            }
            Family::Embed(f) => {
                let tokens = r.get("tokens", 1, MAX_ROWS)?;
                let vocab = r.get("vocab", 1, MAX_ROWS)?;
                embed::case(&embed_params(f, &r)?, tokens, vocab, seed)
            }
            Family::NormResidual(n, o) => {
                norm_residual::case(&norm_residual_params(n, o, &r)?, rows_of(&r)?, seed)
            }
            Family::Rope(style) => {
                let tokens = r.get("tokens", 1, MAX_ROWS)?;
                let n_pos = r.get("n_pos", 2, MAX_ROWS)?;
                rope::case(&rope_params(style, &r)?, tokens, n_pos, seed)
            }
            Family::QGemv(f, e, a) => qgemv::case(
                &qgemv_params(f, Prologue::None, e, a, &r)?,
                vectors(&r)?,
                seed,
            ),
            Family::QGemvRmsNorm(f, e) => qgemv::case(
                &qgemv_params(f, Prologue::RmsNorm, e, OutType::F32, &r)?,
                vectors(&r)?,
                seed,
            ),
            Family::GemvTc(e) => {
                let (p, n) = gemv_tc::params_from(e, &r)?;
                gemv_tc::case(&p, n, seed)
            }
            Family::AttentionDecode(kv, merge) => {
                decode::case(&decode_params(kv, merge, &r)?, seed)
            }
            Family::AttentionMerge(out) => merge::case(&merge_params(out, &r)?, rows_of(&r)?, seed),
            Family::Argmax => argmax::case(&argmax_params(&r)?, rows_of(&r)?, seed),
            Family::MaskLogits => mask::case(&mask_params(&r)?, rows_of(&r)?, seed),
            Family::KvAppend(kv) => {
                let n_seqs = r.get("n_seqs", 1, 1 << 16)?;
                append::case(
                    &append_params(kv, &r)?,
                    n_seqs,
                    r.get("tokens", 1, MAX_ROWS)?,
                    seed,
                )
            }
            Family::RopeAppend(style, qk_norm, kv) => {
                let p = rope_append_params(style, qk_norm, kv, &r)?;
                let (n_seqs, n_pos) = (r.get("n_seqs", 1, 1 << 16)?, r.get("n_pos", 2, MAX_ROWS)?);
                rope_append::case(&p, n_seqs, r.get("tokens", 1, MAX_ROWS)?, n_pos, seed)
            }
            Family::AttentionPrefill(kv) => {
                let (q_start, n_q) = (r.get("q_start", 0, MAX_ROWS)?, r.get("n_q", 1, MAX_ROWS)?);
                prefill::case(&prefill_params(kv, &r)?, q_start, n_q, seed)
            }
            Family::Sample => sample::case(&sample_params(&r)?, rows_of(&r)?, seed),
            Family::ToBf16(a, out) => to_bf16::case(
                &ToBf16Params {
                    activation: a,
                    out,
                    threads: threads(&r)?,
                },
                n_of(&r)?,
                seed,
            ),
            Family::BiasRows => bias::case(
                &BiasRowsParams {
                    threads: threads(&r)?,
                },
                rows_of(&r)?,
                r.get("cols", 1, MAX_COLS)?,
                seed,
            ),
            Family::EncoderAttention => {
                let (batch, seq_len) =
                    (r.get("batch", 1, 1 << 16)?, r.get("seq_len", 1, MAX_ROWS)?);
                encoder_attention::case(&encoder_attention_params(&r)?, batch, seq_len, seed)
            }
        }
    }
}

impl Family {
    /// See [`KernelSpec::small_params`].
    fn small_params(self) -> &'static str {
        match self {
            Family::Add(_) | Family::SiluMul => "n=1003 threads=64",
            Family::Reduce(_) | Family::Softmax => "rows=3 cols=324 threads=64",
            Family::RmsNorm | Family::RmsNormRows | Family::NormResidual(..) => {
                "rows=2 cols=576 threads=32"
            }
            Family::Gemv | Family::GemvTc(_) => GEMV_SMALL,
            Family::QGemv(f, ..) | Family::QGemvRmsNorm(f, _) => match f {
                _ if f.is_float() => GEMV_SMALL,
                WeightFormat::Q4K
                | WeightFormat::Q5K
                | WeightFormat::Q6K
                | WeightFormat::Q3K
                | WeightFormat::Q2K => "rows=2 cols=768 warps=2 unroll=4",
                _ => "rows=2 cols=1024 warps=1 unroll=2",
            },
            // k: a multiple of what every weight format's tiles need (512 for Q6_K).
            Family::Gemm(Operands::Bf16, ..) | Family::Gemm(_, BFormat::Q6K | BFormat::Q3K, _) => {
                "m=32 n=128 k=512"
            }
            // f16 operands, which double the family's count: the least k of each format,
            // at least 4 k-steps.
            Family::Gemm(_, BFormat::Q4K | BFormat::Q5K | BFormat::Q2K, _) => "m=32 n=128 k=256",
            Family::Gemm(..) => "m=32 n=128 k=128",
            Family::Embed(TableFormat::Q4K | TableFormat::Q5K | TableFormat::Q6K) => {
                "tokens=3 vocab=11 dim=512 threads=32"
            }
            Family::Embed(_) => "tokens=3 vocab=11 dim=288 threads=32",
            Family::Rope(_) | Family::RopeAppend(..) => {
                "tokens=2 n_pos=9 head_dim=128 n_heads=5 n_kv_heads=1 threads=256"
            }
            Family::AttentionDecode(..) => {
                "head_dim=64 n_heads=4 n_kv_heads=2 max_blocks=16 split=64 threads=64"
            }
            Family::AttentionMerge(_) => "rows=6 head_dim=64 n_splits=5",
            Family::AttentionPrefill(_) => {
                "head_dim=64 n_heads=2 n_kv_heads=1 max_blocks=4 q_start=0 n_q=32"
            }
            Family::KvAppend(_) => {
                "tokens=7 n_seqs=3 head_dim=64 n_kv_heads=2 max_blocks=2 threads=32"
            }
            Family::Argmax => "rows=3 cols=10000 threads=256",
            Family::MaskLogits => "rows=3 cols=10000 threads=256",
            Family::Sample => "rows=3 cols=4096 threads=256",
            Family::ToBf16(..) | Family::BiasRows | Family::EncoderAttention => "",
        }
    }

    /// See [`KernelSpec::compare_params`].
    fn compare_params(self) -> &'static str {
        // The decode graph's matrix–vector forms (f32 activations), with the grid
        // capped below the row groups as the graph launches them (each block loops
        // over 8 groups).
        const DECODE_GEMV: &str = "rows=256 cols=4096 max_blocks=8";
        match self {
            Family::Add(_) | Family::SiluMul => "n=65536",
            Family::Reduce(_)
            | Family::RmsNorm
            | Family::RmsNormRows
            | Family::Softmax
            | Family::NormResidual(..) => "rows=64 cols=4096",
            // The tensor-core form has no grid cap (a block per row group).
            Family::Gemv | Family::QGemv(_, _, OutType::BF16) | Family::GemvTc(_) => {
                "rows=256 cols=4096"
            }
            Family::QGemv(_, _, OutType::F32) | Family::QGemvRmsNorm(..) => DECODE_GEMV,
            Family::Gemm(_, BFormat::Q6K | BFormat::Q3K, _) => "m=200 n=256 k=512",
            Family::Gemm(..) => "m=200 n=256 k=256",
            Family::Embed(_) => "tokens=16 vocab=1024 dim=4096",
            Family::RopeAppend(..) => "tokens=16 n_seqs=8 max_blocks=16 n_pos=1024",
            Family::Rope(_) => "tokens=16 n_pos=4096",
            Family::AttentionDecode(..) => {
                "head_dim=128 n_heads=32 n_kv_heads=8 max_blocks=64 split=64 threads=128"
            }
            Family::AttentionMerge(_) => "rows=64 head_dim=128 n_splits=8",
            Family::AttentionPrefill(_) => {
                "head_dim=128 n_heads=8 n_kv_heads=2 max_blocks=16 q_start=64 n_q=128"
            }
            Family::KvAppend(_) => "tokens=64 n_seqs=8 max_blocks=16",
            Family::Argmax => "rows=4 cols=128256",
            Family::MaskLogits => "rows=8 cols=128256",
            Family::Sample => "rows=8 cols=32768",
            Family::ToBf16(..) | Family::BiasRows | Family::EncoderAttention => "",
        }
    }

    /// See [`KernelSpec::perf_params`].
    fn perf_params(self) -> &'static [&'static str] {
        match self {
            Family::Gemv | Family::GemvTc(_) => GEMV_PERF,
            Family::QGemv(f, ..) | Family::QGemvRmsNorm(f, _) if f.is_float() => GEMV_PERF,
            Family::Gemm(_, _, GemmEpilogue::Accumulate) => GEMM_PERF_RESIDUAL,
            Family::Gemm(Operands::Bf16, BFormat::Bf16, GemmEpilogue::Store) => GEMM_PERF_BF16,
            Family::Gemm(Operands::Bf16, BFormat::Q8_0, GemmEpilogue::Store) => GEMM_PERF_Q8_0,
            Family::Gemm(..) => GEMM_PERF,
            Family::Add(_)
            | Family::SiluMul
            | Family::Reduce(_)
            | Family::RmsNorm
            | Family::RmsNormRows
            | Family::Softmax
            | Family::Embed(_)
            | Family::NormResidual(..)
            | Family::Rope(_)
            | Family::QGemv(..)
            | Family::QGemvRmsNorm(..)
            | Family::AttentionDecode(..)
            | Family::AttentionMerge(_)
            | Family::Argmax
            | Family::MaskLogits
            | Family::KvAppend(_)
            | Family::RopeAppend(..)
            | Family::AttentionPrefill(_)
            | Family::Sample
            | Family::ToBf16(..)
            | Family::BiasRows
            | Family::EncoderAttention => &[""],
        }
    }
}

/// The interpreter-sized problem of every bf16/f16 matrix–vector form.
const GEMV_SMALL: &str = "rows=5 cols=576 warps=2 unroll=2";

/// The bf16/f16 matrix–vector forms at full size: the defaults' square and llama-3.1-8b's
/// down projection.
const GEMV_PERF: &[&str] = &["rows=8192 cols=8192", "rows=4096 cols=14336"];

/// The matrix products at llama-3.1-8b prefill shapes: 512 and 2048 tokens through the
/// gate or up (14336 × 4096) and down (4096 × 14336) projections.
const GEMM_PERF: &[&str] = &[
    "m=512 n=14336 k=4096",
    "m=512 n=4096 k=14336",
    "m=2048 n=14336 k=4096",
    "m=2048 n=4096 k=14336",
];

/// bf16 at every llama-3.1-8b prefill projection, 512 and 2048 tokens through q|k|v
/// (6144 × 4096), o (4096 × 4096), gate or up and down; also at 4096³ and, at 512
/// tokens (128 blocks of 128×128), with 64-row tiles or 64×32 warp tiles (more warps
/// for the same work).
const GEMM_PERF_BF16: &[&str] = &[
    "m=512 n=6144 k=4096",
    "m=512 n=4096 k=4096",
    "m=512 n=14336 k=4096",
    "m=512 n=4096 k=14336",
    "m=2048 n=6144 k=4096",
    "m=2048 n=4096 k=4096",
    "m=2048 n=14336 k=4096",
    "m=2048 n=4096 k=14336",
    "m=512 n=4096 k=4096 bm=64",
    "m=512 n=4096 k=4096 wn=32",
    "m=4096 n=4096 k=4096",
];

/// Q8_0 as [`GEMM_PERF`], also with 128×64 tiles (64×32 warps, 3 stages).
const GEMM_PERF_Q8_0: &[&str] = &[
    "m=512 n=14336 k=4096",
    "m=512 n=4096 k=14336",
    "m=2048 n=14336 k=4096",
    "m=2048 n=4096 k=14336",
    "m=2048 n=14336 k=4096 bn=64 wn=32 stages=3",
];

/// The `C +=` forms at the down projection only.
const GEMM_PERF_RESIDUAL: &[&str] = &["m=2048 n=4096 k=14336"];

const fn spec(
    name: &'static str,
    description: &'static str,
    params: &'static [ParamInfo],
    family: Family,
) -> KernelSpec {
    KernelSpec {
        name,
        description,
        params,
        family,
    }
}

/// Every kernel of the library, in a fixed order.
pub fn library() -> Vec<KernelSpec> {
    let mut all = vec![
        spec("add_f32", "elementwise y = a + b, f32, 16-byte vector accesses", ELEMENTWISE, Family::Add(Scalar::F32)),
        spec(
            "add_bf16",
            "elementwise y = a + b, bf16 (added in f32, rounded once), 16-byte vector accesses",
            ELEMENTWISE,
            Family::Add(Scalar::BF16),
        ),
        spec(
            silu_mul::NAME,
            "y = silu(g)·u (SwiGLU gate), f16 in/out, f32 math with ex2.approx and div.approx",
            ELEMENTWISE,
            Family::SiluMul,
        ),
        spec(
            "reduce_sum_f32",
            "row sums of a [rows, cols] f32 matrix, one block per row, fixed summation order",
            ROWS,
            Family::Reduce(Combine::Sum),
        ),
        spec(
            "reduce_max_f32",
            "row maxima of a [rows, cols] f32 matrix, one block per row",
            ROWS,
            Family::Reduce(Combine::Max),
        ),
        spec(
            rmsnorm::NAME,
            "RMS normalization of [rows, cols] bf16 by a bf16 weight, f32 math with IEEE sqrt and reciprocal",
            ROWS,
            Family::RmsNorm,
        ),
        spec(
            rmsnorm_rows::NAME,
            "RMS normalization of [rows, cols] f32 residual rows by an f32 weight -> f32, the bits the \
             matrix-vector kernels' RMSNorm prologue stages (same block size); IEEE ops, fixed order",
            RMSNORM_ROWS,
            Family::RmsNormRows,
        ),
        spec(
            softmax::NAME,
            "row softmax of a [rows, cols] f32 matrix, max-subtracted, ex2.approx",
            ROWS,
            Family::Softmax,
        ),
        spec(
            gemv::NAME,
            "y = W·x with W [rows, cols] bf16 row-major, x bf16, y f32; one warp per row, 16-byte .nc loads",
            GEMV,
            Family::Gemv,
        ),
    ];
    // bf16 operands first (all but f16 weights, which they refuse), then f16 operands.
    for o in Operands::ALL {
        for f in BFormat::ALL {
            if o == Operands::Bf16 && f == BFormat::F16 {
                continue;
            }
            for e in GemmEpilogue::ALL {
                let params = match f {
                    BFormat::Bf16 | BFormat::F16 => GEMM_FLOAT,
                    BFormat::Q5K => GEMM_Q5K,
                    BFormat::Q6K => GEMM_Q6K,
                    BFormat::Q3K => GEMM_Q3K,
                    _ => GEMM_QUANT,
                };
                all.push(spec(
                    gemm::name(o, f, e),
                    gemm_description(o, f, e),
                    params,
                    Family::Gemm(o, f, e),
                ));
            }
        }
    }
    for f in TableFormat::ALL {
        all.push(spec(
            f.kernel_name(),
            embed_description(f),
            EMBED,
            Family::Embed(f),
        ));
    }
    for (norm, out) in [
        (Norm::Rms, NormOut::BF16),
        (Norm::Rms, NormOut::F16),
        (Norm::Rms, NormOut::F32),
        (Norm::Layer, NormOut::BF16),
        (Norm::Layer, NormOut::F32),
    ] {
        let p = NormResidualParams {
            norm,
            out,
            cols: 0,
            threads: 0,
        };
        let description = match (norm, out) {
            (Norm::Rms, NormOut::BF16) => {
                "h = x + residual (f32, written back), y = RMSNorm(h)·w (f32 weight) -> bf16; IEEE ops, fixed order"
            }
            (Norm::Rms, NormOut::F16) => {
                "h = x + residual (f32, written back), y = RMSNorm(h)·w (f32 weight) -> f16; IEEE ops, fixed order"
            }
            (Norm::Rms, NormOut::F32) => {
                "h = x + residual (f32, written back), y = RMSNorm(h)·w (f32 weight) -> f32; IEEE ops, fixed order"
            }
            (Norm::Layer, NormOut::BF16) => {
                "h = x + residual (f32, written back), y = LayerNorm(h)·w + b (f32) -> bf16; IEEE ops, two-pass variance"
            }
            (Norm::Layer, NormOut::F16) => {
                "h = x + residual (f32, written back), y = LayerNorm(h)·w + b (f32) -> f16; IEEE ops, two-pass variance"
            }
            (Norm::Layer, NormOut::F32) => {
                "h = x + residual (f32, written back), y = LayerNorm(h)·w + b (f32) -> f32; IEEE ops, two-pass variance"
            }
        };
        all.push(spec(
            p.name(),
            description,
            ROWS,
            Family::NormResidual(norm, out),
        ));
    }
    all.push(spec(
        RopeStyle::NeoX.kernel_name(),
        "RoPE in place on q and k (f32), rotate-half pairs (i, i + d/2), per-token positions, cos/sin tables",
        ROPE,
        Family::Rope(RopeStyle::NeoX),
    ));
    all.push(spec(
        RopeStyle::GptJ.kernel_name(),
        "RoPE in place on q and k (f32), adjacent pairs (2i, 2i + 1), per-token positions, cos/sin tables",
        ROPE,
        Family::Rope(RopeStyle::GptJ),
    ));
    for act in [OutType::BF16, OutType::F32] {
        for f in WeightFormat::ALL {
            for e in Epilogue::ALL {
                // Plain bf16 is `gemv_bf16` above.
                if (f, e, act) != (WeightFormat::BF16, Epilogue::Plain, OutType::BF16) {
                    let params = if f.is_float() {
                        QGEMV_FLOAT
                    } else {
                        QGEMV_QUANT
                    };
                    let (name, description) =
                        (qgemv::name(f, e, act), qgemv_description(f, e, act));
                    all.push(spec(name, description, params, Family::QGemv(f, e, act)));
                }
            }
        }
    }
    for f in WeightFormat::ALL {
        for e in Epilogue::ALL {
            let params = if f.is_float() {
                QGEMV_FLOAT
            } else {
                QGEMV_QUANT
            };
            let (name, description) = (qgemv::rmsnorm_name(f, e), qgemv_rmsnorm_description(e));
            all.push(spec(name, description, params, Family::QGemvRmsNorm(f, e)));
        }
    }
    for e in Epilogue::ALL {
        all.push(spec(
            gemv_tc::name(e),
            gemv_tc::description(e),
            gemv_tc::params_info(e),
            Family::GemvTc(e),
        ));
    }
    for kv in KvElem::ALL {
        for merged in [false, true] {
            all.push(spec(
                decode::name(kv, merged),
                decode_description(kv, merged),
                ATTENTION_DECODE,
                Family::AttentionDecode(kv, merged),
            ));
        }
    }
    all.push(spec(
        merge::NAME,
        "decode attention: merge the splits' (max, sum, output) partials into each head's output, bf16",
        ATTENTION_MERGE,
        Family::AttentionMerge(OutType::BF16),
    ));
    all.push(spec(
        merge::NAME_F32,
        "decode attention: merge the splits' (max, sum, output) partials into each head's output, f32",
        ATTENTION_MERGE,
        Family::AttentionMerge(OutType::F32),
    ));
    for kv in KvElem::ALL {
        all.push(spec(
            prefill::name(kv),
            prefill_description(kv),
            ATTENTION_PREFILL,
            Family::AttentionPrefill(kv),
        ));
    }
    for kv in KvElem::ALL {
        all.push(spec(
            append::name(kv),
            append_description(kv),
            KV_APPEND,
            Family::KvAppend(kv),
        ));
    }
    for kv in KvElem::ALL {
        for qk_norm in [false, true] {
            for style in [RopeStyle::NeoX, RopeStyle::GptJ] {
                let description = rope_append_description(style, qk_norm, kv);
                all.push(spec(
                    rope_append::name(style, qk_norm, kv),
                    description,
                    ROPE_APPEND,
                    Family::RopeAppend(style, qk_norm, kv),
                ));
            }
        }
    }
    all.push(spec(
        argmax::NAME,
        "index of each row's largest f32 logit (u32), lowest index on ties, NaN skipped; one block per row",
        ARGMAX,
        Family::Argmax,
    ));
    all.push(spec(
        mask::NAME,
        "a grammar's token mask applied in place: each listed row's logits that its mask (u32 bit words) \
         does not allow set to -inf; one block per mask",
        MASK,
        Family::MaskLogits,
    ));
    all.push(spec(
        sample::NAME,
        "sample a token per row: temperature, top-k, top-p (per-row settings, host-drawn uniform); \
         integer radix selection and scan, deterministic",
        SAMPLE,
        Family::Sample,
    ));
    all.push(spec(
        "cast_f32_bf16",
        "y = bf16(x), f32 in, bf16 out (round to nearest even), 16-byte loads",
        ELEMENTWISE,
        Family::ToBf16(Activation::Identity, Scalar::BF16),
    ));
    all.push(spec(
        "cast_f32_f16",
        "y = f16(x), f32 in, f16 out (round to nearest even, ±65504 at most), 16-byte loads",
        ELEMENTWISE,
        Family::ToBf16(Activation::Identity, Scalar::F16),
    ));
    all.push(spec(
        "gelu_f32_bf16",
        "y = gelu(x), erf form (BERT's), f32 in, bf16 out; erfc by A&S 7.1.26 with ex2.approx",
        ELEMENTWISE,
        Family::ToBf16(Activation::GeluErf, Scalar::BF16),
    ));
    all.push(spec(
        "gelu_f32_f16",
        "y = gelu(x), erf form (BERT's), f32 in, f16 out; erfc by A&S 7.1.26 with ex2.approx",
        ELEMENTWISE,
        Family::ToBf16(Activation::GeluErf, Scalar::F16),
    ));
    all.push(spec(
        bias::NAME,
        "y[r, :] = b for every row (a bias, before a matrix product that accumulates into y), f32",
        BIAS_ROWS,
        Family::BiasRows,
    ));
    all.push(spec(
        encoder_attention::NAME,
        "bidirectional attention over a padded batch (per-text lengths mask the padding keys), q|k|v rows f32, \
         one warp per query, online softmax with ex2.approx; bf16 out",
        ENCODER_ATTENTION,
        Family::EncoderAttention,
    ));
    all
}

/// The descriptions of the matrix–vector kernels, by format, epilogue and activation type.
fn qgemv_description(f: WeightFormat, e: Epilogue, act: OutType) -> &'static str {
    use Epilogue::*;
    use WeightFormat::*;
    match (f, e, act) {
        (BF16, Plain, OutType::BF16) => "y = W·x, W bf16 (see gemv_bf16)",
        (BF16, Plain, OutType::F32) => "y = W·x, W bf16 row-major, x f32, y f32; one warp per row, 16-byte .nc loads",
        (BF16, Residual, OutType::BF16) => "y = W·x + r (in place on r), W bf16 row-major, x bf16, y f32; one warp per row",
        (BF16, Residual, OutType::F32) => "y = W·x + r (in place on r), W bf16 row-major, x f32, y f32; one warp per row",
        (BF16, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu bf16, x bf16; one warp per row, ex2/div.approx",
        (BF16, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu bf16, x f32; one warp per row, ex2/div.approx",
        (F16, Plain, OutType::BF16) => "y = W·x, W f16 row-major, x bf16, y f32; one warp per row, 16-byte .nc loads",
        (F16, Plain, OutType::F32) => "y = W·x, W f16 row-major, x f32, y f32; one warp per row, 16-byte .nc loads",
        (F16, Residual, OutType::BF16) => "y = W·x + r (in place on r), W f16, x bf16, y f32; one warp per row",
        (F16, Residual, OutType::F32) => "y = W·x + r (in place on r), W f16, x f32, y f32; one warp per row",
        (F16, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu f16, x bf16; one warp per row, ex2/div.approx",
        (F16, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu f16, x f32; one warp per row, ex2/div.approx",
        (Q8_0, Plain, OutType::BF16) => "y = W·x, W Q8_0 (GGUF blocks, dequantized in-kernel), x bf16, y f32; one warp per row",
        (Q8_0, Plain, OutType::F32) => "y = W·x, W Q8_0 (GGUF blocks, dequantized in-kernel), x f32, y f32; one warp per row",
        (Q8_0, Residual, OutType::BF16) => "y = W·x + r (in place on r), W Q8_0 dequantized in-kernel, x bf16, y f32",
        (Q8_0, Residual, OutType::F32) => "y = W·x + r (in place on r), W Q8_0 dequantized in-kernel, x f32, y f32",
        (Q8_0, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu Q8_0 dequantized in-kernel, x bf16",
        (Q8_0, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu Q8_0 dequantized in-kernel, x f32",
        (Q4_0, Plain, OutType::BF16) => "y = W·x, W Q4_0 (GGUF blocks, dequantized in-kernel), x bf16, y f32; one warp per row",
        (Q4_0, Plain, OutType::F32) => "y = W·x, W Q4_0 (GGUF blocks, dequantized in-kernel), x f32, y f32; one warp per row",
        (Q4_0, Residual, OutType::BF16) => "y = W·x + r (in place on r), W Q4_0 dequantized in-kernel, x bf16, y f32",
        (Q4_0, Residual, OutType::F32) => "y = W·x + r (in place on r), W Q4_0 dequantized in-kernel, x f32, y f32",
        (Q4_0, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu Q4_0 dequantized in-kernel, x bf16",
        (Q4_0, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu Q4_0 dequantized in-kernel, x f32",
        (Q4_1, Plain, OutType::BF16) => "y = W·x, W Q4_1 (GGUF blocks, dequantized in-kernel), x bf16, y f32; one warp per row",
        (Q4_1, Plain, OutType::F32) => "y = W·x, W Q4_1 (GGUF blocks, dequantized in-kernel), x f32, y f32; one warp per row",
        (Q4_1, Residual, OutType::BF16) => "y = W·x + r (in place on r), W Q4_1 dequantized in-kernel, x bf16, y f32",
        (Q4_1, Residual, OutType::F32) => "y = W·x + r (in place on r), W Q4_1 dequantized in-kernel, x f32, y f32",
        (Q4_1, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu Q4_1 dequantized in-kernel, x bf16",
        (Q4_1, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu Q4_1 dequantized in-kernel, x f32",
        (Q4K, Plain, OutType::BF16) => "y = W·x, W Q4_K (GGUF super-blocks, dequantized in-kernel), x bf16, y f32; one warp per row",
        (Q4K, Plain, OutType::F32) => "y = W·x, W Q4_K (GGUF super-blocks, dequantized in-kernel), x f32, y f32; one warp per row",
        (Q4K, Residual, OutType::BF16) => "y = W·x + r (in place on r), W Q4_K dequantized in-kernel, x bf16, y f32",
        (Q4K, Residual, OutType::F32) => "y = W·x + r (in place on r), W Q4_K dequantized in-kernel, x f32, y f32",
        (Q4K, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu Q4_K dequantized in-kernel, x bf16",
        (Q4K, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu Q4_K dequantized in-kernel, x f32",
        (Q5K, Plain, OutType::BF16) => "y = W·x, W Q5_K (GGUF super-blocks, dequantized in-kernel), x bf16, y f32; one warp per row",
        (Q5K, Plain, OutType::F32) => "y = W·x, W Q5_K (GGUF super-blocks, dequantized in-kernel), x f32, y f32; one warp per row",
        (Q5K, Residual, OutType::BF16) => "y = W·x + r (in place on r), W Q5_K dequantized in-kernel, x bf16, y f32",
        (Q5K, Residual, OutType::F32) => "y = W·x + r (in place on r), W Q5_K dequantized in-kernel, x f32, y f32",
        (Q5K, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu Q5_K dequantized in-kernel, x bf16",
        (Q5K, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu Q5_K dequantized in-kernel, x f32",
        (Q6K, Plain, OutType::BF16) => "y = W·x, W Q6_K (GGUF super-blocks, dequantized in-kernel), x bf16, y f32; one warp per row",
        (Q6K, Plain, OutType::F32) => "y = W·x, W Q6_K (GGUF super-blocks, dequantized in-kernel), x f32, y f32; one warp per row",
        (Q6K, Residual, OutType::BF16) => "y = W·x + r (in place on r), W Q6_K dequantized in-kernel, x bf16, y f32",
        (Q6K, Residual, OutType::F32) => "y = W·x + r (in place on r), W Q6_K dequantized in-kernel, x f32, y f32",
        (Q6K, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu Q6_K dequantized in-kernel, x bf16",
        (Q6K, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu Q6_K dequantized in-kernel, x f32",
        (Q3K, Plain, OutType::BF16) => "y = W·x, W Q3_K (GGUF super-blocks, dequantized in-kernel), x bf16, y f32; one warp per row",
        (Q3K, Plain, OutType::F32) => "y = W·x, W Q3_K (GGUF super-blocks, dequantized in-kernel), x f32, y f32; one warp per row",
        (Q3K, Residual, OutType::BF16) => "y = W·x + r (in place on r), W Q3_K dequantized in-kernel, x bf16, y f32",
        (Q3K, Residual, OutType::F32) => "y = W·x + r (in place on r), W Q3_K dequantized in-kernel, x f32, y f32",
        (Q3K, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu Q3_K dequantized in-kernel, x bf16",
        (Q3K, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu Q3_K dequantized in-kernel, x f32",
        (Q2K, Plain, OutType::BF16) => "y = W·x, W Q2_K (GGUF super-blocks, dequantized in-kernel), x bf16, y f32; one warp per row",
        (Q2K, Plain, OutType::F32) => "y = W·x, W Q2_K (GGUF super-blocks, dequantized in-kernel), x f32, y f32; one warp per row",
        (Q2K, Residual, OutType::BF16) => "y = W·x + r (in place on r), W Q2_K dequantized in-kernel, x bf16, y f32",
        (Q2K, Residual, OutType::F32) => "y = W·x + r (in place on r), W Q2_K dequantized in-kernel, x f32, y f32",
        (Q2K, SwiGlu, OutType::BF16) => "y = silu(Wg·x)·(Wu·x) -> bf16, Wg/Wu Q2_K dequantized in-kernel, x bf16",
        (Q2K, SwiGlu, OutType::F32) => "y = silu(Wg·x)·(Wu·x) -> f32, Wg/Wu Q2_K dequantized in-kernel, x f32",
    }
}

/// The descriptions of the matrix–vector kernels with the RMSNorm prologue, by epilogue
/// (every weight format alike, named by the kernel).
fn qgemv_rmsnorm_description(e: Epilogue) -> &'static str {
    match e {
        Epilogue::Plain => {
            "y = W·x with x = RMSNorm(R)·w formed in-kernel from the f32 residual R (every block reduces R, \
             stages x in shared memory); y f32, one warp per row"
        }
        Epilogue::Residual => {
            "y = W·x + r with x = RMSNorm(R)·w formed in-kernel from the f32 residual R (r a bias, y not R); \
             one warp per row"
        }
        Epilogue::SwiGlu => {
            "y = silu(Wg·x)·(Wu·x) -> f32 with x = RMSNorm(R)·w formed in-kernel from the f32 residual R; \
             ex2/div.approx"
        }
    }
}

fn decode_description(kv: KvElem, merged: bool) -> &'static str {
    use KvElem::*;
    match (kv, merged) {
        (BF16, false) => {
            "decode attention, split-K over a paged bf16 KV cache (16-token blocks, block table), GQA, a split's \
             positions spread over lanes and warps; per-split max, sum and unnormalized output (f32), ex2.approx"
        }
        (F16, false) => {
            "decode attention, split-K over a paged f16 KV cache (16-token blocks, block table), GQA, a split's \
             positions spread over lanes and warps; per-split max, sum and unnormalized output (f32), ex2.approx"
        }
        (F32, false) => {
            "decode attention, split-K over a paged f32 KV cache (16-token blocks, block table), GQA, a split's \
             positions spread over lanes and warps; per-split max, sum and unnormalized output (f32), ex2.approx"
        }
        (BF16, true) => {
            "decode attention, split-K over a paged bf16 KV cache, GQA, the splits merged by the last to finish \
             (counted atomically, merged in split order); f32 out, ex2.approx"
        }
        (F16, true) => {
            "decode attention, split-K over a paged f16 KV cache, GQA, the splits merged by the last to finish \
             (counted atomically, merged in split order); f32 out, ex2.approx"
        }
        (F32, true) => {
            "decode attention, split-K over a paged f32 KV cache, GQA, the splits merged by the last to finish \
             (counted atomically, merged in split order); f32 out, ex2.approx"
        }
    }
}

fn prefill_description(kv: KvElem) -> &'static str {
    match kv {
        KvElem::BF16 => {
            "causal attention of a prompt chunk over the paged bf16 KV cache on tensor cores (mma.sync, \
             ldmatrix, cp.async), online softmax with ex2.approx, GQA; f16 out"
        }
        KvElem::F16 => {
            "causal attention of a prompt chunk over the paged f16 KV cache on tensor cores (mma.sync f16, \
             ldmatrix, cp.async), online softmax with ex2.approx, GQA; f16 out"
        }
        KvElem::F32 => {
            "causal attention of a prompt chunk over the paged f32 KV cache on tensor cores (tiles rounded to \
             f16 as they load, mma.sync f16, ldmatrix), online softmax with ex2.approx, GQA; f16 out"
        }
    }
}

fn append_description(kv: KvElem) -> &'static str {
    match kv {
        KvElem::BF16 => "write new tokens' keys and values (f32) into the paged bf16 KV cache at (sequence, position)",
        KvElem::F16 => "write new tokens' keys and values (f32) into the paged f16 KV cache at (sequence, position)",
        KvElem::F32 => "write new tokens' keys and values (f32) into the paged f32 KV cache at (sequence, position)",
    }
}

fn rope_append_description(style: RopeStyle, qk_norm: bool, kv: KvElem) -> &'static str {
    use KvElem::*;
    use RopeStyle::*;
    match (style, qk_norm, kv) {
        (NeoX, false, BF16) => "RoPE (pairs (i, i + d/2)) on q in place and on k into the paged bf16 KV cache, v appended; one kernel",
        (NeoX, false, F16) => "RoPE (pairs (i, i + d/2)) on q in place and on k into the paged f16 KV cache, v appended; one kernel",
        (NeoX, false, F32) => "RoPE (pairs (i, i + d/2)) on q in place and on k into the paged f32 KV cache, v appended; one kernel",
        (GptJ, false, BF16) => "RoPE (pairs (2i, 2i + 1)) on q in place and on k into the paged bf16 KV cache, v appended; one kernel",
        (GptJ, false, F16) => "RoPE (pairs (2i, 2i + 1)) on q in place and on k into the paged f16 KV cache, v appended; one kernel",
        (GptJ, false, F32) => "RoPE (pairs (2i, 2i + 1)) on q in place and on k into the paged f32 KV cache, v appended; one kernel",
        (NeoX, true, BF16) => {
            "per-head q/k RMSNorm, then RoPE (pairs (i, i + d/2)) on q in place and on k into the paged bf16 KV cache, v appended"
        }
        (NeoX, true, F16) => {
            "per-head q/k RMSNorm, then RoPE (pairs (i, i + d/2)) on q in place and on k into the paged f16 KV cache, v appended"
        }
        (NeoX, true, F32) => {
            "per-head q/k RMSNorm, then RoPE (pairs (i, i + d/2)) on q in place and on k into the paged f32 KV cache, v appended"
        }
        (GptJ, true, BF16) => {
            "per-head q/k RMSNorm, then RoPE (pairs (2i, 2i + 1)) on q in place and on k into the paged bf16 KV cache, v appended"
        }
        (GptJ, true, F16) => {
            "per-head q/k RMSNorm, then RoPE (pairs (2i, 2i + 1)) on q in place and on k into the paged f16 KV cache, v appended"
        }
        (GptJ, true, F32) => {
            "per-head q/k RMSNorm, then RoPE (pairs (2i, 2i + 1)) on q in place and on k into the paged f32 KV cache, v appended"
        }
    }
}

fn embed_description(f: TableFormat) -> &'static str {
    match f {
        TableFormat::F32 => "embedding gather: u32 ids -> rows of an f32 table, f32 out (NaN rows for ids >= vocab)",
        TableFormat::BF16 => {
            "embedding gather: u32 ids -> rows of a bf16 table widened to f32 (NaN rows for ids >= vocab)"
        }
        TableFormat::F16 => {
            "embedding gather: u32 ids -> rows of an f16 table widened to f32 (NaN rows for ids >= vocab)"
        }
        TableFormat::Q8_0 => {
            "embedding gather: u32 ids -> rows of a Q8_0 table dequantized to f32 (NaN rows for ids >= vocab)"
        }
        TableFormat::Q4_1 => {
            "embedding gather: u32 ids -> rows of a Q4_1 table dequantized to f32 (NaN rows for ids >= vocab)"
        }
        TableFormat::Q4K => {
            "embedding gather: u32 ids -> rows of a Q4_K table dequantized to f32 (NaN rows for ids >= vocab)"
        }
        TableFormat::Q5K => {
            "embedding gather: u32 ids -> rows of a Q5_K table dequantized to f32 (NaN rows for ids >= vocab)"
        }
        TableFormat::Q6K => {
            "embedding gather: u32 ids -> rows of a Q6_K table dequantized to f32 (NaN rows for ids >= vocab)"
        }
    }
}

/// The kernel named `name`.
pub fn find(name: &str) -> Result<KernelSpec, KernelError> {
    library()
        .into_iter()
        .find(|k| k.name == name)
        .ok_or_else(|| KernelError::UnknownKernel {
            name: name.to_string(),
        })
}

const MAX_N: u64 = 1 << 30;
const MAX_ROWS: u64 = (1 << 31) - 1;
const MAX_COLS: u64 = 1 << 24;

const ELEMENTWISE: &[ParamInfo] = &[
    ParamInfo {
        name: "n",
        default: 1 << 24,
        doc: "elements (a launch argument; the case size)",
    },
    ParamInfo {
        name: "threads",
        default: 256,
        doc: "threads per block",
    },
];

const ROWS: &[ParamInfo] = &[
    ParamInfo {
        name: "rows",
        default: 4096,
        doc: "rows (the grid; the case size)",
    },
    ParamInfo {
        name: "cols",
        default: 4096,
        doc: "row length, fixed in the kernel",
    },
    ParamInfo {
        name: "threads",
        default: 256,
        doc: "threads per block (one block per row)",
    },
];

const RMSNORM_ROWS: &[ParamInfo] = &[
    ParamInfo { name: "rows", default: 64, doc: "rows (the grid; the case size)" },
    ParamInfo { name: "cols", default: 4096, doc: "row length, a multiple of 4, fixed in the kernel" },
    ParamInfo {
        name: "threads",
        default: 128,
        doc: "threads per block (one block per row): the matrix-vector kernel's, for its prologue's bits",
    },
];

const GEMV: &[ParamInfo] = &gemv_infos(
    "columns of W (inputs), a multiple of 8",
    4,
    "16-byte loads in flight per lane",
);

/// The matrix-vector kernels' parameters: `rows`, `cols`, `warps` and `unroll`, with what
/// the format asks of `cols` and how `unroll` counts.
const fn gemv_infos(
    cols_doc: &'static str,
    unroll: u64,
    unroll_doc: &'static str,
) -> [ParamInfo; 4] {
    [
        ParamInfo {
            name: "rows",
            default: 8192,
            doc: "rows of W (outputs)",
        },
        ParamInfo {
            name: "cols",
            default: 8192,
            doc: cols_doc,
        },
        ParamInfo {
            name: "warps",
            default: 4,
            doc: "rows per block (one warp each)",
        },
        ParamInfo {
            name: "unroll",
            default: unroll,
            doc: unroll_doc,
        },
    ]
}

/// bf16 or f16 B.
const GEMM_FLOAT: &[ParamInfo] = &gemm_infos("the reduction length, a multiple of 32", 128, 64, 3);

/// Quantized B: 64×64 warp tiles over 128×128 blocks halve the fragment loads per MMA
/// of 64×32 ones; the staged bytes and the two dequantized tile buffers then leave room
/// for two stages.
const GEMM_QUANT: &[ParamInfo] = &gemm_infos(
    "the reduction length: a multiple of 64 (Q8_0, Q4_0, Q4_1) or 256 (Q4_K, Q2_K)",
    128,
    64,
    2,
);

/// Q5_K's staged bytes (84 a row and k-step, as Q6_K's) leave room for 128×64 blocks only.
const GEMM_Q5K: &[ParamInfo] = &gemm_infos("the reduction length, a multiple of 256", 64, 32, 3);

/// Q6_K's staged bytes (84 a row and k-step) leave room for 128×64 blocks only.
const GEMM_Q6K: &[ParamInfo] = &gemm_infos("the reduction length, a multiple of 512", 64, 32, 3);

/// Q3_K's staged bytes (88 a row and k-step, 92 with the row stride) leave room for two
/// stages of 128×64 blocks.
const GEMM_Q3K: &[ParamInfo] = &gemm_infos("the reduction length, a multiple of 512", 64, 32, 2);

/// The GEMM kernels' parameters, with what the format asks of `k` and the tiling's
/// defaults (`bn`, `wn`, `stages`).
const fn gemm_infos(k_doc: &'static str, bn: u64, wn: u64, stages: u64) -> [ParamInfo; 8] {
    [
        ParamInfo {
            name: "m",
            default: 2048,
            doc: "rows of A and C (tokens; a launch argument, any count)",
        },
        ParamInfo {
            name: "n",
            default: 4096,
            doc: "columns of C (rows of the [n, k] B operand), a multiple of bn",
        },
        ParamInfo {
            name: "k",
            default: 4096,
            doc: k_doc,
        },
        ParamInfo {
            name: "bm",
            default: 128,
            doc: "block tile rows: 64 or 128 (with wgmma also 256)",
        },
        ParamInfo {
            name: "bn",
            default: bn,
            doc: "block tile columns: 64 or 128",
        },
        ParamInfo {
            name: "wn",
            default: wn,
            doc: "warp tile columns (warp tiles are 64 × wn): 32 or 64",
        },
        ParamInfo {
            name: "stages",
            default: stages,
            doc: "shared-memory pipeline stages: 2, 3 or 4 (48 KiB at most)",
        },
        ParamInfo {
            name: "wgmma",
            default: 0,
            doc: "1: multiply with wgmma (sm_90a; bm the wgmma n: 64, 128 or 256; stages 3 or 4; k a multiple of 64); 2: the same with a copier warp and mbarriers (bf16 or f16 weights)",
        },
    ]
}

const EMBED: &[ParamInfo] = &[
    ParamInfo {
        name: "tokens",
        default: 64,
        doc: "token ids gathered (the grid; the case size)",
    },
    ParamInfo {
        name: "vocab",
        default: 32768,
        doc: "table rows (a launch argument; the case size)",
    },
    ParamInfo {
        name: "dim",
        default: 4096,
        doc: "row length, fixed in the kernel: a multiple of 8 (of 32 when quantized)",
    },
    ParamInfo {
        name: "threads",
        default: 256,
        doc: "threads per block (one block per token)",
    },
];

const ROPE: &[ParamInfo] = &[
    ParamInfo {
        name: "tokens",
        default: 64,
        doc: "tokens rotated (the grid; the case size)",
    },
    ParamInfo {
        name: "n_pos",
        default: 8192,
        doc: "rows of the cos/sin tables (a launch argument; the case size)",
    },
    ParamInfo {
        name: "head_dim",
        default: 128,
        doc: "elements per head, even",
    },
    ParamInfo {
        name: "n_heads",
        default: 32,
        doc: "query heads per token",
    },
    ParamInfo {
        name: "n_kv_heads",
        default: 8,
        doc: "key heads per token",
    },
    ParamInfo {
        name: "threads",
        default: 256,
        doc: "threads per block (one block per token)",
    },
];

const QGEMV_FLOAT: &[ParamInfo] = &qgemv_infos(
    "columns of W (inputs), a multiple of 8",
    4,
    "16-byte weight loads in flight per lane",
);

const QGEMV_QUANT: &[ParamInfo] = &qgemv_infos(
    "columns of W: a multiple of 64 (Q8_0, Q4_0, Q4_1) or 256 (Q4_K, Q5_K, Q6_K)",
    2,
    "pieces (64 or 32 weights) loaded per lane before computing",
);

/// [`gemv_infos`], then the batch, the grid's cap and the case's vector count.
const fn qgemv_infos(
    cols_doc: &'static str,
    unroll: u64,
    unroll_doc: &'static str,
) -> [ParamInfo; 7] {
    let [rows, cols, warps, unroll] = gemv_infos(cols_doc, unroll, unroll_doc);
    [
        rows,
        cols,
        warps,
        unroll,
        ParamInfo {
            name: "batch",
            default: 1,
            doc: "vectors multiplied per pass over the weights, 1..=8",
        },
        ParamInfo {
            name: "max_blocks",
            default: 0,
            doc: "most blocks launched, each looping over row groups (0: a block per group)",
        },
        ParamInfo {
            name: "n",
            default: 1,
            doc: "vectors (case only: the kernel takes n at launch)",
        },
    ]
}

const ATTENTION_DECODE: &[ParamInfo] = &attention_infos(
    "elements per head, a multiple of 8",
    256,
    [
        ParamInfo {
            name: "split",
            default: 64,
            doc: "positions per split: a multiple of 16 dividing max_blocks·16",
        },
        ParamInfo {
            name: "threads",
            default: 128,
            doc: "threads per block (a multiple of 32): warps take positions of a split at once",
        },
        ParamInfo {
            name: "q_stride",
            default: 0,
            doc: "elements from one sequence's queries to the next's (0: packed)",
        },
    ],
);

/// The attention kernels' parameters: the heads' shape and the block table's row length
/// (with what the kernel asks of `head_dim` and the default `max_blocks`), then `more`.
const fn attention_infos(
    head_dim_doc: &'static str,
    max_blocks: u64,
    more: [ParamInfo; 3],
) -> [ParamInfo; 7] {
    let [a, b, c] = more;
    [
        ParamInfo {
            name: "head_dim",
            default: 128,
            doc: head_dim_doc,
        },
        ParamInfo {
            name: "n_heads",
            default: 32,
            doc: "query heads",
        },
        ParamInfo {
            name: "n_kv_heads",
            default: 8,
            doc: "key/value heads (dividing n_heads)",
        },
        ParamInfo {
            name: "max_blocks",
            default: max_blocks,
            doc: "block-table row length (16 tokens a block)",
        },
        a,
        b,
        c,
    ]
}

const ATTENTION_MERGE: &[ParamInfo] = &[
    ParamInfo {
        name: "rows",
        default: 256,
        doc: "sequences × heads (the grid; the case size)",
    },
    ParamInfo {
        name: "head_dim",
        default: 128,
        doc: "elements per head (the block size), a multiple of 32",
    },
    ParamInfo {
        name: "n_splits",
        default: 16,
        doc: "splits per head",
    },
];

const ATTENTION_PREFILL: &[ParamInfo] = &attention_infos(
    "elements per head: 64 or 128",
    128,
    [
        ParamInfo {
            name: "q_start",
            default: 0,
            doc: "position of the chunk's first query (a launch argument; the case)",
        },
        ParamInfo {
            name: "n_q",
            default: 512,
            doc: "queries in the chunk (a launch argument; the case)",
        },
        ParamInfo {
            name: "q_stride",
            default: 0,
            doc: "elements from one token's queries to the next's (0: packed)",
        },
    ],
);

const KV_APPEND: &[ParamInfo] = &[
    ParamInfo {
        name: "tokens",
        default: 64,
        doc: "tokens appended (the grid; the case size)",
    },
    ParamInfo {
        name: "n_seqs",
        default: 64,
        doc: "sequences in the block table (the case size)",
    },
    ParamInfo {
        name: "head_dim",
        default: 128,
        doc: "elements per head, a multiple of 4",
    },
    ParamInfo {
        name: "n_kv_heads",
        default: 8,
        doc: "key/value heads",
    },
    ParamInfo {
        name: "max_blocks",
        default: 64,
        doc: "block-table row length (16 tokens a block)",
    },
    ParamInfo {
        name: "threads",
        default: 256,
        doc: "threads per block (one block per token)",
    },
];

const ROPE_APPEND: &[ParamInfo] = &[
    ParamInfo {
        name: "tokens",
        default: 64,
        doc: "tokens rotated and appended (the grid; the case size)",
    },
    ParamInfo {
        name: "n_seqs",
        default: 8,
        doc: "sequences in the block table (the case size)",
    },
    ParamInfo {
        name: "n_pos",
        default: 8192,
        doc: "rows of the cos/sin tables (a launch argument; the case size)",
    },
    ParamInfo {
        name: "head_dim",
        default: 128,
        doc: "elements per head, a multiple of 4",
    },
    ParamInfo {
        name: "n_heads",
        default: 32,
        doc: "query heads per token",
    },
    ParamInfo {
        name: "n_kv_heads",
        default: 8,
        doc: "key/value heads per token",
    },
    ParamInfo {
        name: "max_blocks",
        default: 64,
        doc: "block-table row length (16 tokens a block)",
    },
    ParamInfo {
        name: "threads",
        default: 256,
        doc: "threads per block (one warp per head at a time)",
    },
    ParamInfo {
        name: "token_stride",
        default: 0,
        doc: "elements from one token's q, k, v rows to the next's (0: packed)",
    },
];

const ARGMAX: &[ParamInfo] = &[
    ParamInfo {
        name: "rows",
        default: 1,
        doc: "rows (the grid; the case size)",
    },
    ParamInfo {
        name: "cols",
        default: 128256,
        doc: "vocabulary size, a multiple of 4, fixed in the kernel",
    },
    ParamInfo {
        name: "threads",
        default: 1024,
        doc: "threads per block (one block per row)",
    },
];

const MASK: &[ParamInfo] = &[
    ParamInfo {
        name: "rows",
        default: 8,
        doc: "rows of logits (the case masks every other one; the grid is the masks)",
    },
    ParamInfo {
        name: "cols",
        default: 128256,
        doc: "vocabulary size, a multiple of 4, fixed in the kernel",
    },
    ParamInfo {
        name: "threads",
        default: 256,
        doc: "threads per block (one block per mask)",
    },
];

const SAMPLE: &[ParamInfo] = &[
    ParamInfo {
        name: "rows",
        default: 8,
        doc: "rows (the grid; the case size)",
    },
    ParamInfo {
        name: "cols",
        default: 128256,
        doc: "vocabulary size, a multiple of 4, fixed in the kernel",
    },
    ParamInfo {
        name: "threads",
        default: 1024,
        doc: "threads per block (256..=1024, one block per row)",
    },
];

const BIAS_ROWS: &[ParamInfo] = &[
    ParamInfo {
        name: "rows",
        default: 512,
        doc: "rows written (the grid; the case size)",
    },
    ParamInfo {
        name: "cols",
        default: 1536,
        doc: "row length (a launch argument; the case size)",
    },
    ParamInfo {
        name: "threads",
        default: 256,
        doc: "threads per block (one block per row)",
    },
];

const ENCODER_ATTENTION: &[ParamInfo] = &[
    ParamInfo {
        name: "head_dim",
        default: 32,
        doc: "elements per head, a multiple of 32 (at most 256)",
    },
    ParamInfo {
        name: "n_heads",
        default: 12,
        doc: "heads",
    },
    ParamInfo {
        name: "warps",
        default: 4,
        doc: "queries per block (one warp each)",
    },
    ParamInfo {
        name: "batch",
        default: 8,
        doc: "texts (the grid; the case size)",
    },
    ParamInfo {
        name: "seq_len",
        default: 128,
        doc: "padded length of every text (a launch argument; the case size)",
    },
];

fn threads(r: &Reader) -> Result<u32, KernelError> {
    r.get("threads", 32, 1024)
}

fn n_of(r: &Reader) -> Result<u32, KernelError> {
    r.get("n", 1, MAX_N)
}

fn rows_of(r: &Reader) -> Result<u32, KernelError> {
    r.get("rows", 1, MAX_ROWS)
}

fn reduce_params(op: Combine, r: &Reader) -> Result<ReduceParams, KernelError> {
    Ok(ReduceParams {
        op,
        cols: r.get("cols", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}

fn rmsnorm_params(r: &Reader) -> Result<RmsNormParams, KernelError> {
    Ok(RmsNormParams {
        cols: r.get("cols", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}

fn rmsnorm_rows_params(r: &Reader) -> Result<RmsNormRowsParams, KernelError> {
    Ok(RmsNormRowsParams {
        cols: r.get("cols", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}

fn softmax_params(r: &Reader) -> Result<SoftmaxParams, KernelError> {
    Ok(SoftmaxParams {
        cols: r.get("cols", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}

fn gemv_params(r: &Reader) -> Result<GemvParams, KernelError> {
    Ok(GemvParams {
        rows: r.get("rows", 1, MAX_ROWS)?,
        cols: r.get("cols", 1, MAX_COLS)?,
        warps: r.get("warps", 1, 32)?,
        unroll: r.get("unroll", 1, 16)?,
    })
}

fn gemm_params(
    operands: Operands,
    format: BFormat,
    epilogue: GemmEpilogue,
    r: &Reader,
) -> Result<GemmParams, KernelError> {
    Ok(GemmParams {
        operands,
        format,
        epilogue,
        n: r.get("n", 1, 1 << 24)?,
        k: r.get("k", 1, 1 << 20)?,
        bm: r.get("bm", 64, 256)?,
        bn: r.get("bn", 64, 128)?,
        wn: r.get("wn", 32, 64)?,
        stages: r.get("stages", 2, 4)?,
        core: Core::from_param(r.get("wgmma", 0, 2)?),
    })
}

/// The descriptions of the matrix products, by operand type, weight format and epilogue.
fn gemm_description(o: Operands, f: BFormat, e: GemmEpilogue) -> &'static str {
    use BFormat::*;
    use GemmEpilogue::*;
    match (o, f, e) {
        (Operands::Bf16, Bf16, Store) => {
            "C = A·Bᵀ on tensor cores: A [m, k] bf16, B [n, k] bf16, C [m, n] f32, any m; \
             mma.sync m16n8k16, ldmatrix, multi-stage cp.async"
        }
        (Operands::Bf16, Bf16, Accumulate) => "C += A·Bᵀ (in place), A [m, k] bf16, B [n, k] bf16, C [m, n] f32; as gemm_bf16",
        (Operands::Bf16, Q8_0, Store) => {
            "C = A·Bᵀ, B [n, k] Q8_0 (GGUF blocks) dequantized to bf16 a tile at a time in shared memory, \
             A bf16, C f32; mma.sync"
        }
        (Operands::Bf16, Q8_0, Accumulate) => "C += A·Bᵀ (in place), B Q8_0 dequantized per tile in shared memory, A bf16, C f32",
        (Operands::Bf16, Q4_0, Store) => {
            "C = A·Bᵀ, B [n, k] Q4_0 (GGUF blocks) dequantized to bf16 a tile at a time in shared memory, \
             A bf16, C f32; mma.sync"
        }
        (Operands::Bf16, Q4_0, Accumulate) => "C += A·Bᵀ (in place), B Q4_0 dequantized per tile in shared memory, A bf16, C f32",
        (Operands::Bf16, Q4_1, Store) => {
            "C = A·Bᵀ, B [n, k] Q4_1 (GGUF blocks) dequantized to bf16 a tile at a time in shared memory, \
             A bf16, C f32; mma.sync"
        }
        (Operands::Bf16, Q4_1, Accumulate) => "C += A·Bᵀ (in place), B Q4_1 dequantized per tile in shared memory, A bf16, C f32",
        (Operands::Bf16, Q4K, Store) => {
            "C = A·Bᵀ, B [n, k] Q4_K (GGUF super-blocks) dequantized to bf16 a tile at a time in shared \
             memory, A bf16, C f32; mma.sync"
        }
        (Operands::Bf16, Q4K, Accumulate) => "C += A·Bᵀ (in place), B Q4_K dequantized per tile in shared memory, A bf16, C f32",
        (Operands::Bf16, Q5K, Store) => {
            "C = A·Bᵀ, B [n, k] Q5_K (GGUF super-blocks) dequantized to bf16 a tile at a time in shared \
             memory, A bf16, C f32; mma.sync"
        }
        (Operands::Bf16, Q5K, Accumulate) => "C += A·Bᵀ (in place), B Q5_K dequantized per tile in shared memory, A bf16, C f32",
        (Operands::Bf16, Q6K, Store) => {
            "C = A·Bᵀ, B [n, k] Q6_K (GGUF super-blocks) dequantized to bf16 a tile at a time in shared \
             memory, A bf16, C f32; mma.sync"
        }
        (Operands::Bf16, Q6K, Accumulate) => "C += A·Bᵀ (in place), B Q6_K dequantized per tile in shared memory, A bf16, C f32",
        (Operands::Bf16, Bf16, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B bf16, A bf16, C bf16; as gemm_bf16",
        (Operands::Bf16, Q8_0, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B Q8_0, A bf16, C bf16; as gemm_q8_0",
        (Operands::Bf16, Q4_0, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B Q4_0, A bf16, C bf16; as gemm_q4_0",
        (Operands::Bf16, Q4_1, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B Q4_1, A bf16, C bf16; as gemm_q4_1",
        (Operands::Bf16, Q4K, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B Q4_K, A bf16, C bf16; as gemm_q4_k",
        (Operands::Bf16, Q5K, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B Q5_K, A bf16, C bf16; as gemm_q5_k",
        (Operands::Bf16, Q6K, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B Q6_K, A bf16, C bf16; as gemm_q6_k",
        (Operands::Bf16, Q3K, Store) => {
            "C = A·Bᵀ, B [n, k] Q3_K (GGUF super-blocks) dequantized to bf16 a tile at a time in shared \
             memory, A bf16, C f32; mma.sync"
        }
        (Operands::Bf16, Q3K, Accumulate) => "C += A·Bᵀ (in place), B Q3_K dequantized per tile in shared memory, A bf16, C f32",
        (Operands::Bf16, Q3K, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B Q3_K, A bf16, C bf16; as gemm_q3_k",
        (Operands::Bf16, Q2K, Store) => {
            "C = A·Bᵀ, B [n, k] Q2_K (GGUF super-blocks) dequantized to bf16 a tile at a time in shared \
             memory, A bf16, C f32; mma.sync"
        }
        (Operands::Bf16, Q2K, Accumulate) => "C += A·Bᵀ (in place), B Q2_K dequantized per tile in shared memory, A bf16, C f32",
        (Operands::Bf16, Q2K, StoreHalf) => "C = bf16(A·Bᵀ) (f32 sums rounded to nearest even), B Q2_K, A bf16, C bf16; as gemm_q2_k",
        (Operands::Bf16, F16, _) => "f16 weights with bf16 operands: refused (the gemm_f16_xf16 kernels take them)",
        (Operands::F16, Bf16, Store) => {
            "C = A·Bᵀ on tensor cores with f16 operands: A [m, k] f16, B [n, k] bf16 converted to f16 \
             after ldmatrix (cvt.rn), C [m, n] f32, any m; mma.sync m16n8k16 f16, multi-stage cp.async"
        }
        (Operands::F16, Bf16, Accumulate) => {
            "C += A·Bᵀ (in place), A [m, k] f16, B [n, k] bf16 converted to f16, C [m, n] f32; as gemm_bf16_xf16"
        }
        (Operands::F16, Bf16, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B bf16 converted to f16, A f16, C f16; \
             as gemm_bf16_xf16"
        }
        (Operands::F16, F16, Store) => {
            "C = A·Bᵀ on tensor cores: A [m, k] f16, B [n, k] f16, C [m, n] f32, any m; mma.sync m16n8k16 \
             f16, ldmatrix, multi-stage cp.async"
        }
        (Operands::F16, F16, Accumulate) => {
            "C += A·Bᵀ (in place), A [m, k] f16, B [n, k] f16, C [m, n] f32; as gemm_f16_xf16"
        }
        (Operands::F16, F16, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B f16, A f16, C f16; as gemm_f16_xf16"
        }
        (Operands::F16, Q8_0, Store) => {
            "C = A·Bᵀ, B [n, k] Q8_0 (GGUF blocks) dequantized to f16 a tile at a time in shared \
             memory, A [m, k] f16, C f32; mma.sync f16"
        }
        (Operands::F16, Q8_0, Accumulate) => {
            "C += A·Bᵀ (in place), B Q8_0 dequantized to f16 per tile in shared memory, A f16, C f32"
        }
        (Operands::F16, Q8_0, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B Q8_0 dequantized to f16, A f16, C f16; \
             as gemm_q8_0_xf16"
        }
        (Operands::F16, Q4_0, Store) => {
            "C = A·Bᵀ, B [n, k] Q4_0 (GGUF blocks) dequantized to f16 a tile at a time in shared \
             memory, A [m, k] f16, C f32; mma.sync f16"
        }
        (Operands::F16, Q4_0, Accumulate) => {
            "C += A·Bᵀ (in place), B Q4_0 dequantized to f16 per tile in shared memory, A f16, C f32"
        }
        (Operands::F16, Q4_0, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B Q4_0 dequantized to f16, A f16, C f16; \
             as gemm_q4_0_xf16"
        }
        (Operands::F16, Q4_1, Store) => {
            "C = A·Bᵀ, B [n, k] Q4_1 (GGUF blocks) dequantized to f16 a tile at a time in shared \
             memory, A [m, k] f16, C f32; mma.sync f16"
        }
        (Operands::F16, Q4_1, Accumulate) => {
            "C += A·Bᵀ (in place), B Q4_1 dequantized to f16 per tile in shared memory, A f16, C f32"
        }
        (Operands::F16, Q4_1, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B Q4_1 dequantized to f16, A f16, C f16; \
             as gemm_q4_1_xf16"
        }
        (Operands::F16, Q4K, Store) => {
            "C = A·Bᵀ, B [n, k] Q4_K (GGUF super-blocks) dequantized to f16 a tile at a time in shared \
             memory, A [m, k] f16, C f32; mma.sync f16"
        }
        (Operands::F16, Q4K, Accumulate) => {
            "C += A·Bᵀ (in place), B Q4_K dequantized to f16 per tile in shared memory, A f16, C f32"
        }
        (Operands::F16, Q4K, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B Q4_K dequantized to f16, A f16, C f16; \
             as gemm_q4_k_xf16"
        }
        (Operands::F16, Q5K, Store) => {
            "C = A·Bᵀ, B [n, k] Q5_K (GGUF super-blocks) dequantized to f16 a tile at a time in shared \
             memory, A [m, k] f16, C f32; mma.sync f16"
        }
        (Operands::F16, Q5K, Accumulate) => {
            "C += A·Bᵀ (in place), B Q5_K dequantized to f16 per tile in shared memory, A f16, C f32"
        }
        (Operands::F16, Q5K, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B Q5_K dequantized to f16, A f16, C f16; \
             as gemm_q5_k_xf16"
        }
        (Operands::F16, Q6K, Store) => {
            "C = A·Bᵀ, B [n, k] Q6_K (GGUF super-blocks) dequantized to f16 a tile at a time in shared \
             memory, A [m, k] f16, C f32; mma.sync f16"
        }
        (Operands::F16, Q6K, Accumulate) => {
            "C += A·Bᵀ (in place), B Q6_K dequantized to f16 per tile in shared memory, A f16, C f32"
        }
        (Operands::F16, Q6K, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B Q6_K dequantized to f16, A f16, C f16; \
             as gemm_q6_k_xf16"
        }
        (Operands::F16, Q3K, Store) => {
            "C = A·Bᵀ, B [n, k] Q3_K (GGUF super-blocks) dequantized to f16 a tile at a time in shared \
             memory, A [m, k] f16, C f32; mma.sync f16"
        }
        (Operands::F16, Q3K, Accumulate) => {
            "C += A·Bᵀ (in place), B Q3_K dequantized to f16 per tile in shared memory, A f16, C f32"
        }
        (Operands::F16, Q3K, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B Q3_K dequantized to f16, A f16, C f16; \
             as gemm_q3_k_xf16"
        }
        (Operands::F16, Q2K, Store) => {
            "C = A·Bᵀ, B [n, k] Q2_K (GGUF super-blocks) dequantized to f16 a tile at a time in shared \
             memory, A [m, k] f16, C f32; mma.sync f16"
        }
        (Operands::F16, Q2K, Accumulate) => {
            "C += A·Bᵀ (in place), B Q2_K dequantized to f16 per tile in shared memory, A f16, C f32"
        }
        (Operands::F16, Q2K, StoreHalf) => {
            "C = f16(A·Bᵀ) (f32 sums rounded to nearest even), B Q2_K dequantized to f16, A f16, C f16; \
             as gemm_q2_k_xf16"
        }
    }
}

fn embed_params(format: TableFormat, r: &Reader) -> Result<EmbedParams, KernelError> {
    Ok(EmbedParams {
        format,
        dim: r.get("dim", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}

fn norm_residual_params(
    norm: Norm,
    out: NormOut,
    r: &Reader,
) -> Result<NormResidualParams, KernelError> {
    Ok(NormResidualParams {
        norm,
        out,
        cols: r.get("cols", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}

fn rope_params(style: RopeStyle, r: &Reader) -> Result<RopeParams, KernelError> {
    Ok(RopeParams {
        style,
        head_dim: r.get("head_dim", 2, 1024)?,
        n_heads: r.get("n_heads", 1, 1024)?,
        n_kv_heads: r.get("n_kv_heads", 1, 1024)?,
        threads: threads(r)?,
    })
}

fn qgemv_params(
    format: WeightFormat,
    prologue: Prologue,
    epilogue: Epilogue,
    act: OutType,
    r: &Reader,
) -> Result<QGemvParams, KernelError> {
    Ok(QGemvParams {
        format,
        prologue,
        epilogue,
        act,
        rows: r.get("rows", 1, MAX_ROWS)?,
        cols: r.get("cols", 1, MAX_COLS)?,
        warps: r.get("warps", 1, 32)?,
        unroll: r.get("unroll", 1, 16)?,
        batch: r.get("batch", 1, u64::from(qgemv::MAX_BATCH))?,
        max_blocks: r.get("max_blocks", 0, u64::from(u32::MAX))?,
    })
}

/// The vectors a matrix–vector case multiplies.
fn vectors(r: &Reader) -> Result<u32, KernelError> {
    r.get("n", 1, 1 << 16)
}

fn decode_params(kv: KvElem, merge: bool, r: &Reader) -> Result<DecodeParams, KernelError> {
    Ok(DecodeParams {
        kv,
        merge,
        head_dim: r.get("head_dim", 8, 1024)?,
        n_heads: r.get("n_heads", 1, 1024)?,
        n_kv_heads: r.get("n_kv_heads", 1, 1024)?,
        max_blocks: r.get("max_blocks", 1, 1 << 20)?,
        split: r.get("split", 16, 1 << 16)?,
        threads: threads(r)?,
        q_stride: r.get("q_stride", 0, 1 << 24)?,
    })
}

fn merge_params(out: OutType, r: &Reader) -> Result<MergeParams, KernelError> {
    Ok(MergeParams {
        head_dim: r.get("head_dim", 32, 1024)?,
        n_splits: r.get("n_splits", 1, 1 << 16)?,
        out,
    })
}

fn argmax_params(r: &Reader) -> Result<ArgmaxParams, KernelError> {
    Ok(ArgmaxParams {
        cols: r.get("cols", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}

fn mask_params(r: &Reader) -> Result<MaskParams, KernelError> {
    Ok(MaskParams {
        cols: r.get("cols", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}

fn append_params(kv: KvElem, r: &Reader) -> Result<AppendParams, KernelError> {
    Ok(AppendParams {
        kv,
        head_dim: r.get("head_dim", 4, 1024)?,
        n_kv_heads: r.get("n_kv_heads", 1, 1024)?,
        max_blocks: r.get("max_blocks", 1, 1 << 20)?,
        threads: threads(r)?,
    })
}

fn rope_append_params(
    style: RopeStyle,
    qk_norm: bool,
    kv: KvElem,
    r: &Reader,
) -> Result<RopeAppendParams, KernelError> {
    Ok(RopeAppendParams {
        style,
        qk_norm,
        kv,
        head_dim: r.get("head_dim", 4, 1024)?,
        n_heads: r.get("n_heads", 1, 1024)?,
        n_kv_heads: r.get("n_kv_heads", 1, 1024)?,
        max_blocks: r.get("max_blocks", 1, 1 << 20)?,
        threads: threads(r)?,
        token_stride: r.get("token_stride", 0, 1 << 24)?,
    })
}

fn prefill_params(kv: KvElem, r: &Reader) -> Result<PrefillParams, KernelError> {
    Ok(PrefillParams {
        kv,
        head_dim: r.get("head_dim", 8, 1024)?,
        n_heads: r.get("n_heads", 1, 1024)?,
        n_kv_heads: r.get("n_kv_heads", 1, 1024)?,
        max_blocks: r.get("max_blocks", 1, 1 << 20)?,
        q_stride: r.get("q_stride", 0, 1 << 24)?,
    })
}

fn encoder_attention_params(r: &Reader) -> Result<EncoderAttentionParams, KernelError> {
    Ok(EncoderAttentionParams {
        head_dim: r.get("head_dim", 32, 256)?,
        n_heads: r.get("n_heads", 1, 1024)?,
        warps: r.get("warps", 1, 32)?,
    })
}

fn sample_params(r: &Reader) -> Result<SampleParams, KernelError> {
    Ok(SampleParams {
        cols: r.get("cols", 1, MAX_COLS)?,
        threads: threads(r)?,
    })
}
