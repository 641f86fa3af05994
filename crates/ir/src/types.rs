//! Value types of the kernel IR.
//!
//! Every SSA value has exactly one [`Type`]. Scalars map one-to-one onto PTX register
//! types; vectors are the 2- and 4-wide groups that 8- and 16-byte memory accesses move;
//! pointers carry their address space and the element type that pointer arithmetic
//! scales by; fragments are the per-lane register slices of an MMA operand.

use std::fmt;

/// A scalar (one-register) type. `F16x2`/`BF16x2` are two halves packed in 32 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scalar {
    Pred,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    BF16,
    F32,
    F64,
    F16x2,
    BF16x2,
}

impl Scalar {
    pub const ALL: [Scalar; 15] = [
        Scalar::Pred,
        Scalar::I8,
        Scalar::I16,
        Scalar::I32,
        Scalar::I64,
        Scalar::U8,
        Scalar::U16,
        Scalar::U32,
        Scalar::U64,
        Scalar::F16,
        Scalar::BF16,
        Scalar::F32,
        Scalar::F64,
        Scalar::F16x2,
        Scalar::BF16x2,
    ];

    /// Size in bytes when stored in memory (a predicate is not storable: 0).
    pub fn bytes(self) -> u32 {
        match self {
            Scalar::Pred => 0,
            Scalar::I8 | Scalar::U8 => 1,
            Scalar::I16 | Scalar::U16 | Scalar::F16 | Scalar::BF16 => 2,
            Scalar::I32 | Scalar::U32 | Scalar::F32 | Scalar::F16x2 | Scalar::BF16x2 => 4,
            Scalar::I64 | Scalar::U64 | Scalar::F64 => 8,
        }
    }

    pub fn bits(self) -> u32 {
        if self == Scalar::Pred {
            1
        } else {
            self.bytes() * 8
        }
    }

    pub fn is_int(self) -> bool {
        self.is_signed() || self.is_unsigned()
    }

    pub fn is_signed(self) -> bool {
        matches!(self, Scalar::I8 | Scalar::I16 | Scalar::I32 | Scalar::I64)
    }

    pub fn is_unsigned(self) -> bool {
        matches!(self, Scalar::U8 | Scalar::U16 | Scalar::U32 | Scalar::U64)
    }

    /// Scalar floating point (not the packed pairs).
    pub fn is_float(self) -> bool {
        matches!(self, Scalar::F16 | Scalar::BF16 | Scalar::F32 | Scalar::F64)
    }

    pub fn is_packed(self) -> bool {
        matches!(self, Scalar::F16x2 | Scalar::BF16x2)
    }

    /// The half type inside a packed pair.
    pub fn packed_elem(self) -> Option<Scalar> {
        match self {
            Scalar::F16x2 => Some(Scalar::F16),
            Scalar::BF16x2 => Some(Scalar::BF16),
            _ => None,
        }
    }

    /// The IR/PTX spelling: `pred`, `s32`, `u8`, `f16x2`, ...
    pub fn name(self) -> &'static str {
        match self {
            Scalar::Pred => "pred",
            Scalar::I8 => "s8",
            Scalar::I16 => "s16",
            Scalar::I32 => "s32",
            Scalar::I64 => "s64",
            Scalar::U8 => "u8",
            Scalar::U16 => "u16",
            Scalar::U32 => "u32",
            Scalar::U64 => "u64",
            Scalar::F16 => "f16",
            Scalar::BF16 => "bf16",
            Scalar::F32 => "f32",
            Scalar::F64 => "f64",
            Scalar::F16x2 => "f16x2",
            Scalar::BF16x2 => "bf16x2",
        }
    }

    pub fn from_name(s: &str) -> Option<Scalar> {
        Scalar::ALL.iter().copied().find(|t| t.name() == s)
    }
}

/// Where a pointer points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AddrSpace {
    Global,
    Shared,
    Local,
}

impl AddrSpace {
    pub fn name(self) -> &'static str {
        match self {
            AddrSpace::Global => "global",
            AddrSpace::Shared => "shared",
            AddrSpace::Local => "local",
        }
    }

    pub fn from_name(s: &str) -> Option<AddrSpace> {
        [AddrSpace::Global, AddrSpace::Shared, AddrSpace::Local]
            .into_iter()
            .find(|a| a.name() == s)
    }
}

/// Matrix shapes the IR supports: `mma.sync` (one warp) and `wgmma.mma_async` (a
/// warpgroup of four consecutive warps, `m64nNk16`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaShape {
    /// m16n8k16, A/B f16 or bf16, C/D f32.
    M16N8K16,
    /// m16n8k32, A/B s8, C/D s32.
    M16N8K32,
    /// wgmma m64n16k16, A/B f16 or bf16, C/D f32 (and the wider ones below).
    M64N16K16,
    M64N32K16,
    M64N64K16,
    M64N128K16,
    M64N256K16,
}

impl MmaShape {
    pub const ALL: [MmaShape; 7] = [
        MmaShape::M16N8K16,
        MmaShape::M16N8K32,
        MmaShape::M64N16K16,
        MmaShape::M64N32K16,
        MmaShape::M64N64K16,
        MmaShape::M64N128K16,
        MmaShape::M64N256K16,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MmaShape::M16N8K16 => "m16n8k16",
            MmaShape::M16N8K32 => "m16n8k32",
            MmaShape::M64N16K16 => "m64n16k16",
            MmaShape::M64N32K16 => "m64n32k16",
            MmaShape::M64N64K16 => "m64n64k16",
            MmaShape::M64N128K16 => "m64n128k16",
            MmaShape::M64N256K16 => "m64n256k16",
        }
    }

    pub fn from_name(s: &str) -> Option<MmaShape> {
        MmaShape::ALL.into_iter().find(|m| m.name() == s)
    }

    /// The warpgroup shape `m64nNk16`, if there is one for `n`.
    pub fn warpgroup(n: u32) -> Option<MmaShape> {
        MmaShape::ALL
            .into_iter()
            .find(|s| s.is_warpgroup() && s.dims().1 == n)
    }

    /// (m, n, k)
    pub fn dims(self) -> (u32, u32, u32) {
        match self {
            MmaShape::M16N8K16 => (16, 8, 16),
            MmaShape::M16N8K32 => (16, 8, 32),
            MmaShape::M64N16K16 => (64, 16, 16),
            MmaShape::M64N32K16 => (64, 32, 16),
            MmaShape::M64N64K16 => (64, 64, 16),
            MmaShape::M64N128K16 => (64, 128, 16),
            MmaShape::M64N256K16 => (64, 256, 16),
        }
    }

    /// Whether the shape belongs to `wgmma` (a warpgroup's 128 threads share it).
    pub fn is_warpgroup(self) -> bool {
        !matches!(self, MmaShape::M16N8K16 | MmaShape::M16N8K32)
    }

    /// Threads holding one operand: 32 for `mma.sync`, 128 for `wgmma`.
    pub fn threads(self) -> u32 {
        if self.is_warpgroup() {
            128
        } else {
            32
        }
    }
}

/// How a `wgmma` operand tile is laid out in shared memory (a matrix descriptor's
/// layout type). Each operand row (an `m` row of A, an `n` column of B) holds its `k`
/// elements contiguously ("K-major"); eight rows form a group, and `sbo` bytes separate
/// consecutive groups. Without swizzling the unit is the 8-row × 16-byte core matrix
/// (`lbo` bytes to the next one along `k`); a swizzled layout stores each row's
/// `bytes()` contiguously and XORs the 16-byte chunk index (address bits 4..) with the
/// row within a `bytes() × 8` atom (address bits 7..), on the absolute shared address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Swizzle {
    None,
    B32,
    B64,
    B128,
}

impl Swizzle {
    pub const ALL: [Swizzle; 4] = [Swizzle::None, Swizzle::B32, Swizzle::B64, Swizzle::B128];

    pub fn name(self) -> &'static str {
        match self {
            Swizzle::None => "none",
            Swizzle::B32 => "b32",
            Swizzle::B64 => "b64",
            Swizzle::B128 => "b128",
        }
    }

    pub fn from_name(s: &str) -> Option<Swizzle> {
        Swizzle::ALL.into_iter().find(|z| z.name() == s)
    }

    /// The descriptor's 2-bit layout type (bits 62–63).
    pub fn code(self) -> u64 {
        match self {
            Swizzle::None => 0,
            Swizzle::B128 => 1,
            Swizzle::B64 => 2,
            Swizzle::B32 => 3,
        }
    }

    pub fn from_code(code: u64) -> Swizzle {
        match code & 3 {
            0 => Swizzle::None,
            1 => Swizzle::B128,
            2 => Swizzle::B64,
            _ => Swizzle::B32,
        }
    }

    /// Bytes of one swizzled row (0 without swizzling).
    pub fn bytes(self) -> u32 {
        match self {
            Swizzle::None => 0,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }

    /// Apply the swizzle to a shared-memory byte address.
    pub fn apply(self, addr: u32) -> u32 {
        let bits = match self {
            Swizzle::None => return addr,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        };
        let mask = (1u32 << bits) - 1;
        addr ^ (((addr >> 7) & mask) << 4)
    }
}

/// Which operand of an MMA a fragment holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FragRole {
    A,
    B,
    /// The accumulator: C going in, D coming out.
    C,
}

impl FragRole {
    pub fn name(self) -> &'static str {
        match self {
            FragRole::A => "a",
            FragRole::B => "b",
            FragRole::C => "c",
        }
    }

    pub fn from_name(s: &str) -> Option<FragRole> {
        [FragRole::A, FragRole::B, FragRole::C]
            .into_iter()
            .find(|r| r.name() == s)
    }
}

/// One lane's slice of an MMA operand: `regs()` 32-bit registers of `reg_type()`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragType {
    pub shape: MmaShape,
    pub role: FragRole,
    /// Element type of the matrix: f16/bf16/s8 for A and B, f32/s32 for C.
    pub elem: Scalar,
}

impl FragType {
    /// The 32-bit registers one lane holds.
    pub fn regs(self) -> u32 {
        let (m, n, k) = self.shape.dims();
        let elems = match self.role {
            FragRole::A => m * k,
            FragRole::B => k * n,
            FragRole::C => m * n,
        };
        elems * self.elem.bytes() / 4 / self.shape.threads()
    }

    /// The type of each register: packed pairs for 16-bit elements, `u32` holding four
    /// bytes for s8, and the element itself for 32-bit accumulators.
    pub fn reg_type(self) -> Scalar {
        match self.elem {
            Scalar::F16 => Scalar::F16x2,
            Scalar::BF16 => Scalar::BF16x2,
            Scalar::I8 | Scalar::U8 => Scalar::U32,
            other => other,
        }
    }

    /// Whether this element type is legal for the role and shape.
    pub fn is_valid(self) -> bool {
        match (self.shape, self.role) {
            (MmaShape::M16N8K16, FragRole::A | FragRole::B) => {
                matches!(self.elem, Scalar::F16 | Scalar::BF16)
            }
            (MmaShape::M16N8K16, FragRole::C) => self.elem == Scalar::F32,
            (MmaShape::M16N8K32, FragRole::A | FragRole::B) => self.elem == Scalar::I8,
            (MmaShape::M16N8K32, FragRole::C) => self.elem == Scalar::I32,
            // wgmma takes B from shared memory only (through a matrix descriptor).
            (_, FragRole::B) => false,
            (_, FragRole::A) => matches!(self.elem, Scalar::F16 | Scalar::BF16),
            (_, FragRole::C) => self.elem == Scalar::F32,
        }
    }
}

/// The type of an SSA value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    Scalar(Scalar),
    /// 2 or 4 lanes of a scalar, moved by one 8- or 16-byte access.
    Vec(Scalar, u8),
    /// Address in a space; arithmetic on it counts in elements of the pointee.
    Ptr(AddrSpace, Scalar),
    Frag(FragType),
}

impl Type {
    pub const PRED: Type = Type::Scalar(Scalar::Pred);
    pub const I32: Type = Type::Scalar(Scalar::I32);
    pub const U32: Type = Type::Scalar(Scalar::U32);
    pub const U64: Type = Type::Scalar(Scalar::U64);
    pub const F32: Type = Type::Scalar(Scalar::F32);

    pub fn scalar(self) -> Option<Scalar> {
        match self {
            Type::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// Size in bytes when stored in memory; pointers are 64-bit addresses.
    pub fn bytes(self) -> u32 {
        match self {
            Type::Scalar(s) => s.bytes(),
            Type::Vec(s, n) => s.bytes() * n as u32,
            Type::Ptr(..) => 8,
            Type::Frag(f) => f.regs() * 4,
        }
    }

    pub fn is_pred(self) -> bool {
        self == Type::PRED
    }
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Type {
    /// `f32`, `vec4<f32>`, `ptr<global, bf16>`, `frag<m16n8k16, a, bf16>`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Scalar(s) => write!(f, "{s}"),
            Type::Vec(s, n) => write!(f, "vec{n}<{s}>"),
            Type::Ptr(a, s) => write!(f, "ptr<{}, {s}>", a.name()),
            Type::Frag(t) => write!(f, "frag<{}, {}, {}>", t.shape.name(), t.role.name(), t.elem),
        }
    }
}
