//! Operations of the kernel IR.
//!
//! Each operation says exactly what the hardware does: rounding on every inexact float
//! operation, `approx` versus IEEE for division and the special functions, cache
//! behaviour on memory accesses, scope and ordering on atomics and fences.

use crate::func::Block;
use crate::types::{FragType, MmaShape, Scalar, Swizzle, Type};
use crate::Value;

/// IEEE rounding direction of a float operation or conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Round {
    /// to nearest, ties to even
    Rn,
    /// toward zero
    Rz,
    /// toward -inf
    Rm,
    /// toward +inf
    Rp,
}

impl Round {
    pub const ALL: [Round; 4] = [Round::Rn, Round::Rz, Round::Rm, Round::Rp];
    pub fn name(self) -> &'static str {
        match self {
            Round::Rn => "rn",
            Round::Rz => "rz",
            Round::Rm => "rm",
            Round::Rp => "rp",
        }
    }
}

/// Two-operand arithmetic and bitwise operations. Both operands and the result share
/// one type, except shifts, whose amount is always `u32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    /// High half of the double-width integer product.
    MulHi,
    /// Float division is IEEE with the instruction's rounding; see [`Op::DivApprox`].
    Div,
    Rem,
    Min,
    Max,
    And,
    Or,
    Xor,
    Shl,
    /// Arithmetic for signed types, logical for unsigned.
    Shr,
}

impl BinOp {
    pub const ALL: [BinOp; 13] = [
        BinOp::Add,
        BinOp::Sub,
        BinOp::Mul,
        BinOp::MulHi,
        BinOp::Div,
        BinOp::Rem,
        BinOp::Min,
        BinOp::Max,
        BinOp::And,
        BinOp::Or,
        BinOp::Xor,
        BinOp::Shl,
        BinOp::Shr,
    ];
    pub fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::MulHi => "mulhi",
            BinOp::Div => "div",
            BinOp::Rem => "rem",
            BinOp::Min => "min",
            BinOp::Max => "max",
            BinOp::And => "and",
            BinOp::Or => "or",
            BinOp::Xor => "xor",
            BinOp::Shl => "shl",
            BinOp::Shr => "shr",
        }
    }
}

/// One-operand operations. Exact ones are IEEE-correct (with the given rounding where
/// inexact); `*Approx` ones are the hardware's approximations, modeled in the
/// interpreter with errors measured on the GPU (`isa/sm90/approx.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    Abs,
    /// Bitwise not (integers) or logical not (predicates).
    Not,
    /// IEEE square root, rounded.
    Sqrt(Round),
    /// IEEE reciprocal, rounded.
    Rcp(Round),
    RcpApprox,
    RsqrtApprox,
    /// 2^x, `ex2.approx.ftz.f32`
    Ex2Approx,
    /// log2(x), `lg2.approx.ftz.f32`
    Lg2Approx,
    TanhApprox,
    SinApprox,
    CosApprox,
    /// Round to integral value in float format, with the given direction.
    RoundInt(Round),
    /// Count of set bits (result `u32`).
    Popc,
    /// Count of leading zeros (result `u32`).
    Clz,
}

impl UnOp {
    pub fn is_approx(self) -> bool {
        matches!(
            self,
            UnOp::RcpApprox
                | UnOp::RsqrtApprox
                | UnOp::Ex2Approx
                | UnOp::Lg2Approx
                | UnOp::TanhApprox
                | UnOp::SinApprox
                | UnOp::CosApprox
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    pub const ALL: [CmpOp; 6] = [
        CmpOp::Eq,
        CmpOp::Ne,
        CmpOp::Lt,
        CmpOp::Le,
        CmpOp::Gt,
        CmpOp::Ge,
    ];
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
        }
    }
}

/// Cache behaviour of a load or store (PTX cache operators; `Nc` is the read-only
/// non-coherent path, `ld.global.nc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum CacheOp {
    #[default]
    Default,
    /// cache at all levels
    Ca,
    /// cache in L2 only
    Cg,
    /// streaming, likely accessed once
    Cs,
    /// last use
    Lu,
    /// don't cache, fetch again
    Cv,
    /// write-back (stores)
    Wb,
    /// write-through (stores)
    Wt,
    /// read-only data path
    Nc,
}

impl CacheOp {
    pub const ALL: [CacheOp; 9] = [
        CacheOp::Default,
        CacheOp::Ca,
        CacheOp::Cg,
        CacheOp::Cs,
        CacheOp::Lu,
        CacheOp::Cv,
        CacheOp::Wb,
        CacheOp::Wt,
        CacheOp::Nc,
    ];
    pub fn name(self) -> &'static str {
        match self {
            CacheOp::Default => "default",
            CacheOp::Ca => "ca",
            CacheOp::Cg => "cg",
            CacheOp::Cs => "cs",
            CacheOp::Lu => "lu",
            CacheOp::Cv => "cv",
            CacheOp::Wb => "wb",
            CacheOp::Wt => "wt",
            CacheOp::Nc => "nc",
        }
    }
    pub fn valid_for_load(self) -> bool {
        !matches!(self, CacheOp::Wb | CacheOp::Wt)
    }
    pub fn valid_for_store(self) -> bool {
        matches!(
            self,
            CacheOp::Default | CacheOp::Wb | CacheOp::Cg | CacheOp::Cs | CacheOp::Wt
        )
    }
}

/// Memory scope of an atomic or fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    Cta,
    Gpu,
    Sys,
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Cta => "cta",
            Scope::Gpu => "gpu",
            Scope::Sys => "sys",
        }
    }
}

/// Memory ordering of an atomic or fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ordering {
    Relaxed,
    Acquire,
    Release,
    AcqRel,
    SeqCst,
}

impl Ordering {
    pub fn name(self) -> &'static str {
        match self {
            Ordering::Relaxed => "relaxed",
            Ordering::Acquire => "acquire",
            Ordering::Release => "release",
            Ordering::AcqRel => "acq_rel",
            Ordering::SeqCst => "sc",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
    Exch,
    /// compare-and-swap: operands (ptr, compare, new)
    Cas,
}

impl AtomOp {
    pub fn name(self) -> &'static str {
        match self {
            AtomOp::Add => "add",
            AtomOp::Min => "min",
            AtomOp::Max => "max",
            AtomOp::And => "and",
            AtomOp::Or => "or",
            AtomOp::Xor => "xor",
            AtomOp::Exch => "exch",
            AtomOp::Cas => "cas",
        }
    }
}

/// `shfl.sync` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShflMode {
    /// read from lane `b`
    Idx,
    /// read from lane `lane - b` (lanes below `b` keep their own value)
    Up,
    /// read from lane `lane + b` (lanes past 31 keep their own value)
    Down,
    /// read from lane `lane ^ b`
    Bfly,
}

impl ShflMode {
    pub fn name(self) -> &'static str {
        match self {
            ShflMode::Idx => "idx",
            ShflMode::Up => "up",
            ShflMode::Down => "down",
            ShflMode::Bfly => "bfly",
        }
    }
}

/// `vote.sync` modes: `All`/`Any` give a predicate, `Ballot` a `u32` mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VoteMode {
    All,
    Any,
    Ballot,
}

impl VoteMode {
    pub fn name(self) -> &'static str {
        match self {
            VoteMode::All => "all",
            VoteMode::Any => "any",
            VoteMode::Ballot => "ballot",
        }
    }
}

/// `redux.sync` operations over 32-bit integers of the active lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduxOp {
    Add,
    Min,
    Max,
    And,
    Or,
    Xor,
}

impl ReduxOp {
    pub fn name(self) -> &'static str {
        match self {
            ReduxOp::Add => "add",
            ReduxOp::Min => "min",
            ReduxOp::Max => "max",
            ReduxOp::And => "and",
            ReduxOp::Or => "or",
            ReduxOp::Xor => "xor",
        }
    }
}

/// Hardware special registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Special {
    TidX,
    TidY,
    TidZ,
    NtidX,
    NtidY,
    NtidZ,
    CtaidX,
    CtaidY,
    CtaidZ,
    NctaidX,
    NctaidY,
    NctaidZ,
    LaneId,
    WarpId,
    /// `%clock` (u32 SM cycles)
    Clock,
    /// `%clock64` (u64 SM cycles)
    Clock64,
    /// `%globaltimer` (u64 nanoseconds)
    GlobalTimer,
}

impl Special {
    pub const ALL: [Special; 17] = [
        Special::TidX,
        Special::TidY,
        Special::TidZ,
        Special::NtidX,
        Special::NtidY,
        Special::NtidZ,
        Special::CtaidX,
        Special::CtaidY,
        Special::CtaidZ,
        Special::NctaidX,
        Special::NctaidY,
        Special::NctaidZ,
        Special::LaneId,
        Special::WarpId,
        Special::Clock,
        Special::Clock64,
        Special::GlobalTimer,
    ];

    /// PTX register name without the `%`.
    pub fn name(self) -> &'static str {
        match self {
            Special::TidX => "tid.x",
            Special::TidY => "tid.y",
            Special::TidZ => "tid.z",
            Special::NtidX => "ntid.x",
            Special::NtidY => "ntid.y",
            Special::NtidZ => "ntid.z",
            Special::CtaidX => "ctaid.x",
            Special::CtaidY => "ctaid.y",
            Special::CtaidZ => "ctaid.z",
            Special::NctaidX => "nctaid.x",
            Special::NctaidY => "nctaid.y",
            Special::NctaidZ => "nctaid.z",
            Special::LaneId => "laneid",
            Special::WarpId => "warpid",
            Special::Clock => "clock",
            Special::Clock64 => "clock64",
            Special::GlobalTimer => "globaltimer",
        }
    }

    pub fn ty(self) -> Scalar {
        match self {
            Special::Clock64 | Special::GlobalTimer => Scalar::U64,
            _ => Scalar::U32,
        }
    }
}

/// An operation. Operands are SSA values; nested regions (`If`, `For`) own their blocks.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A constant given by its bit pattern (zero-extended to 64 bits).
    Const {
        ty: Type,
        bits: u64,
    },
    /// The value of a kernel parameter (its index in the parameter list).
    Param(u32),
    Special(Special),
    /// `rnd` is required for inexact float ops (add/sub/mul/div on floats) and absent
    /// on integers.
    Bin {
        op: BinOp,
        rnd: Option<Round>,
        a: Value,
        b: Value,
    },
    /// Fused multiply-add, single rounding: a*b+c.
    Fma {
        rnd: Round,
        a: Value,
        b: Value,
        c: Value,
    },
    /// Four-way byte dot product with accumulate, `c + Σ_{i<4} a.byte[i]·b.byte[i]`
    /// (PTX `dp4a`), wrapping modulo 2^32. `a` and `b` are 32-bit integers whose bytes are
    /// read as signed (`a_signed`, `b_signed`) or unsigned; `c` and the result are `i32`
    /// when either is signed, else `u32`.
    Dp4a {
        a_signed: bool,
        b_signed: bool,
        a: Value,
        b: Value,
        c: Value,
    },
    Un {
        op: UnOp,
        a: Value,
    },
    /// `div.approx.f32` (full range, about 2 ulp)
    DivApprox {
        a: Value,
        b: Value,
    },
    /// Result is a predicate. Float comparisons are ordered (false on NaN) except `Ne`.
    Cmp {
        op: CmpOp,
        a: Value,
        b: Value,
    },
    Select {
        cond: Value,
        a: Value,
        b: Value,
    },
    /// Numeric conversion. `rnd` applies where the conversion is inexact
    /// (float narrowing, int→float, float→int where it selects the integer rounding);
    /// `sat` clamps to the destination range (and float to [0,1] only for float→float).
    Cvt {
        to: Scalar,
        rnd: Option<Round>,
        sat: bool,
        a: Value,
    },
    /// Reinterpret bits; source and destination have the same size.
    Bitcast {
        to: Type,
        a: Value,
    },
    /// Build a vector, packed pair (low element first) or fragment from its parts.
    Pack {
        ty: Type,
        parts: Vec<Value>,
    },
    /// Take part `index` of a vector, packed pair or fragment.
    Extract {
        a: Value,
        index: u32,
    },
    /// `ptr + index * sizeof(pointee)`; `index` is any integer type (sign-extended if
    /// signed).
    PtrAdd {
        ptr: Value,
        index: Value,
    },
    /// Same address, another pointee type.
    PtrCast {
        to: Scalar,
        ptr: Value,
    },
    /// Address of a shared-memory declaration of the function.
    SharedAddr {
        decl: u32,
    },
    /// Load a value of type `ty` (scalar or vector) from `ptr`.
    Load {
        ty: Type,
        ptr: Value,
        cache: CacheOp,
    },
    Store {
        ptr: Value,
        value: Value,
        cache: CacheOp,
    },
    /// `bar.sync 0`: all threads of the block, none under divergent control flow.
    Barrier,
    Fence {
        ord: Ordering,
        scope: Scope,
    },
    /// Returns the old value. `b` is the compare operand for `Cas`.
    Atomic {
        op: AtomOp,
        ord: Ordering,
        scope: Scope,
        ptr: Value,
        a: Value,
        b: Option<Value>,
    },
    /// Over the lanes in `mask` (u32); `b` is the lane/delta (u32), `c` the clamp value
    /// as in PTX (31 for the whole warp).
    Shfl {
        mode: ShflMode,
        value: Value,
        b: Value,
        c: Value,
        mask: Value,
    },
    Vote {
        mode: VoteMode,
        pred: Value,
        mask: Value,
    },
    Redux {
        op: ReduxOp,
        value: Value,
        mask: Value,
    },
    /// `mma.sync.aligned` D = A*B + C; result type is the C fragment type.
    Mma {
        shape: MmaShape,
        a: Value,
        b: Value,
        c: Value,
    },
    /// `ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16`: each lane gives a row
    /// address; result is a `vec{num}<u32>` (or `u32` for num = 1) or a fragment with
    /// `num` registers.
    LdMatrix {
        ty: Type,
        num: u8,
        trans: bool,
        ptr: Value,
    },
    /// `cp.async.{ca|cg}.shared.global` of `bytes` (4, 8 or 16; cg only with 16).
    CpAsync {
        dst: Value,
        src: Value,
        bytes: u8,
        cache: CacheOp,
    },
    CpAsyncCommit,
    /// Wait until at most `n` committed groups are pending.
    CpAsyncWait {
        n: u32,
    },
    /// A `wgmma` shared-memory matrix descriptor (`u64`) for the K-major operand tile at
    /// `ptr` (shared, 16-byte aligned): `lbo` and `sbo` in bytes (multiples of 16 below
    /// 2^18), laid out as `swizzle` says (see [`Swizzle`]).
    WgmmaDesc {
        ptr: Value,
        lbo: u32,
        sbo: u32,
        swizzle: Swizzle,
    },
    /// `wgmma.mma_async.sync.aligned` over a warpgroup: D = A·B + C with `shape` a
    /// warpgroup shape, A and B of element type `ab` (f16 or bf16), both K-major. `a` is
    /// an A fragment (registers) or a descriptor (`u64`), `b` a descriptor, `c` the
    /// accumulator fragment; the result has C's type. The product is asynchronous: it
    /// belongs to the group the next `wgmma.commit_group` closes, and its result and
    /// operands may be touched only after `wgmma.wait_group` has retired that group.
    Wgmma {
        shape: MmaShape,
        ab: Scalar,
        a: Value,
        b: Value,
        c: Value,
    },
    /// `wgmma.fence.sync.aligned`: orders earlier register and shared-memory writes
    /// before the `wgmma` that follow.
    WgmmaFence,
    /// `wgmma.commit_group.sync.aligned`: closes a group of `wgmma`.
    WgmmaCommit,
    /// `wgmma.wait_group.sync.aligned n`: wait until at most `n` groups are pending.
    WgmmaWait {
        n: u32,
    },
    /// `fence.proxy.async.shared::cta`: makes this thread's shared-memory writes visible
    /// to the asynchronous proxy (`wgmma` reading its operands).
    FenceProxyAsync,
    /// `mbarrier.init.shared::cta.b64 [bar], count`: the barrier object at `bar` (a shared
    /// `u64`, 8-byte aligned) expects `count` (u32, 1 to 2^20 − 1) arrivals a phase, its
    /// current phase of parity 0.
    MbarrierInit {
        bar: Value,
        count: Value,
    },
    /// `mbarrier.arrive.shared::cta.b64`: each executing thread arrives once; the
    /// arrival that completes the expected count completes the phase.
    MbarrierArrive {
        bar: Value,
    },
    /// Wait until the phase of the parity `parity` (a u32, its low bit) has completed (a
    /// `mbarrier.try_wait.parity` loop): 0 waits for the first phase, 1 for the second,
    /// 0 again for the third.
    MbarrierWait {
        bar: Value,
        parity: Value,
    },
    /// `cp.async.mbarrier.arrive.noinc.shared::cta.b64 [bar]`: the thread arrives once
    /// all the `cp.async` copies it issued before have landed (counted among the
    /// expected arrivals).
    CpAsyncMbarrierArrive {
        bar: Value,
    },
    /// Structured conditional. Each branch ends by yielding `results.len()` values.
    If {
        cond: Value,
        then_: Block,
        else_: Block,
        results: Vec<Type>,
    },
    /// Counted loop `for iv in lo..hi step step` (signed or unsigned per `lo`'s type)
    /// with loop-carried values; the body block's arguments are `[iv, carried...]`
    /// and it ends by yielding the next carried values. Results: final carried values.
    For {
        lo: Value,
        hi: Value,
        step: Value,
        init: Vec<Value>,
        body: Block,
    },
    /// Ends a nested block, handing values to the enclosing `If`/`For`.
    Yield(Vec<Value>),
    /// Ends the thread.
    Return,
}

impl Op {
    /// Operands, in order (not counting values used inside nested blocks).
    pub fn operands(&self) -> Vec<Value> {
        match self {
            Op::Const { .. }
            | Op::Param(_)
            | Op::Special(_)
            | Op::SharedAddr { .. }
            | Op::Barrier
            | Op::Fence { .. }
            | Op::CpAsyncCommit
            | Op::CpAsyncWait { .. }
            | Op::WgmmaFence
            | Op::WgmmaCommit
            | Op::WgmmaWait { .. }
            | Op::FenceProxyAsync
            | Op::Return => vec![],
            Op::Bin { a, b, .. } | Op::DivApprox { a, b } | Op::Cmp { a, b, .. } => vec![*a, *b],
            Op::Fma { a, b, c, .. } | Op::Dp4a { a, b, c, .. } => vec![*a, *b, *c],
            Op::Un { a, .. }
            | Op::Cvt { a, .. }
            | Op::Bitcast { a, .. }
            | Op::Extract { a, .. } => {
                vec![*a]
            }
            Op::Select { cond, a, b } => vec![*cond, *a, *b],
            Op::Pack { parts, .. } => parts.clone(),
            Op::PtrAdd { ptr, index } => vec![*ptr, *index],
            Op::PtrCast { ptr, .. } | Op::Load { ptr, .. } | Op::LdMatrix { ptr, .. } => vec![*ptr],
            Op::Store { ptr, value, .. } => vec![*ptr, *value],
            Op::Atomic { ptr, a, b, .. } => {
                let mut v = vec![*ptr, *a];
                v.extend(b.iter().copied());
                v
            }
            Op::Shfl {
                value, b, c, mask, ..
            } => vec![*value, *b, *c, *mask],
            Op::Vote { pred, mask, .. } => vec![*pred, *mask],
            Op::Redux { value, mask, .. } => vec![*value, *mask],
            Op::Mma { a, b, c, .. } | Op::Wgmma { a, b, c, .. } => vec![*a, *b, *c],
            Op::WgmmaDesc { ptr, .. } => vec![*ptr],
            Op::MbarrierInit { bar, count } => vec![*bar, *count],
            Op::MbarrierArrive { bar } | Op::CpAsyncMbarrierArrive { bar } => vec![*bar],
            Op::MbarrierWait { bar, parity } => vec![*bar, *parity],
            Op::CpAsync { dst, src, .. } => vec![*dst, *src],
            Op::If { cond, .. } => vec![*cond],
            Op::For {
                lo, hi, step, init, ..
            } => {
                let mut v = vec![*lo, *hi, *step];
                v.extend(init.iter().copied());
                v
            }
            Op::Yield(vals) => vals.clone(),
        }
    }

    /// Whether the op ends a block.
    pub fn is_terminator(&self) -> bool {
        matches!(self, Op::Yield(_) | Op::Return)
    }
}

/// A fragment type shorthand used by builders and tests.
pub fn frag(shape: MmaShape, role: crate::types::FragRole, elem: Scalar) -> Type {
    Type::Frag(FragType { shape, role, elem })
}
