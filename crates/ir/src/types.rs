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

/// `mma.sync` shapes the IR supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaShape {
    /// m16n8k16, A/B f16 or bf16, C/D f32.
    M16N8K16,
    /// m16n8k32, A/B s8, C/D s32.
    M16N8K32,
}

impl MmaShape {
    pub fn name(self) -> &'static str {
        match self {
            MmaShape::M16N8K16 => "m16n8k16",
            MmaShape::M16N8K32 => "m16n8k32",
        }
    }

    pub fn from_name(s: &str) -> Option<MmaShape> {
        [MmaShape::M16N8K16, MmaShape::M16N8K32]
            .into_iter()
            .find(|m| m.name() == s)
    }

    /// (m, n, k)
    pub fn dims(self) -> (u32, u32, u32) {
        match self {
            MmaShape::M16N8K16 => (16, 8, 16),
            MmaShape::M16N8K32 => (16, 8, 32),
        }
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
        elems * self.elem.bytes() / 4 / 32
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
