//! PTX virtual registers: one class per register width/kind, numbered per class.
//!
//! Every SSA value gets its own registers (ptxas allocates the real ones). How a value
//! type maps onto registers:
//! - scalars: one register; 8- and 16-bit integers and f16/bf16 live in `.b16`
//!   registers (8-bit integers held sign- or zero-extended to 16 bits, so that 16-bit
//!   arithmetic and compares on them are right once the result is re-extended),
//!   packed pairs in `.b32`;
//! - vectors: one register per lane; fragments: one register per 32-bit slice;
//! - pointers: global pointers are 64-bit global-window addresses, shared pointers
//!   32-bit shared-window addresses (`ld.shared [%r]`).

use quench_ir::{AddrSpace, Scalar, Type, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RegClass {
    Pred,
    B16,
    B32,
    B64,
    F32,
    F64,
}

impl RegClass {
    const ALL: [RegClass; 6] = [
        RegClass::Pred,
        RegClass::B16,
        RegClass::B32,
        RegClass::B64,
        RegClass::F32,
        RegClass::F64,
    ];

    fn index(self) -> usize {
        self as usize
    }

    fn prefix(self) -> &'static str {
        match self {
            RegClass::Pred => "%p",
            RegClass::B16 => "%rs",
            RegClass::B32 => "%r",
            RegClass::B64 => "%rd",
            RegClass::F32 => "%f",
            RegClass::F64 => "%fd",
        }
    }

    fn decl_type(self) -> &'static str {
        match self {
            RegClass::Pred => ".pred",
            RegClass::B16 => ".b16",
            RegClass::B32 => ".b32",
            RegClass::B64 => ".b64",
            RegClass::F32 => ".f32",
            RegClass::F64 => ".f64",
        }
    }

    /// The type suffix for a plain copy (`mov.b32`, `mov.pred`, ...).
    pub(crate) fn mov_type(self) -> &'static str {
        self.decl_type()
    }

    pub(crate) fn of_scalar(s: Scalar) -> RegClass {
        match s {
            Scalar::Pred => RegClass::Pred,
            Scalar::I8 | Scalar::U8 | Scalar::I16 | Scalar::U16 | Scalar::F16 | Scalar::BF16 => {
                RegClass::B16
            }
            Scalar::I32 | Scalar::U32 | Scalar::F16x2 | Scalar::BF16x2 => RegClass::B32,
            Scalar::I64 | Scalar::U64 => RegClass::B64,
            Scalar::F32 => RegClass::F32,
            Scalar::F64 => RegClass::F64,
        }
    }

    /// Register classes holding a value of `ty`, in part order.
    pub(crate) fn of_type(ty: Type) -> Result<Vec<RegClass>, String> {
        Ok(match ty {
            Type::Scalar(s) => vec![RegClass::of_scalar(s)],
            Type::Vec(s, n) => vec![RegClass::of_scalar(s); n as usize],
            Type::Ptr(AddrSpace::Global, _) => vec![RegClass::B64],
            Type::Ptr(AddrSpace::Shared, _) => vec![RegClass::B32],
            Type::Ptr(AddrSpace::Local, _) => {
                return Err("local-memory pointers are not supported in PTX output".into())
            }
            Type::Frag(f) => vec![RegClass::of_scalar(f.reg_type()); f.regs() as usize],
        })
    }
}

/// The registers of every value and the per-class counters.
pub(crate) struct Regs {
    counts: [u32; 6],
    of_value: Vec<Option<Vec<String>>>,
}

impl Regs {
    pub(crate) fn new(values: usize) -> Regs {
        Regs {
            counts: [0; 6],
            of_value: vec![None; values],
        }
    }

    pub(crate) fn fresh(&mut self, class: RegClass) -> String {
        let n = &mut self.counts[class.index()];
        let name = format!("{}{}", class.prefix(), *n);
        *n += 1;
        name
    }

    pub(crate) fn bind(&mut self, v: Value, regs: Vec<String>) {
        if let Some(slot) = self.of_value.get_mut(v.index()) {
            *slot = Some(regs);
        }
    }

    pub(crate) fn get(&self, v: Value) -> Option<&[String]> {
        self.of_value.get(v.index())?.as_deref()
    }

    /// `.reg` lines for every class in use.
    pub(crate) fn declarations(&self) -> String {
        let mut s = String::new();
        for class in RegClass::ALL {
            let n = self.counts[class.index()];
            if n > 0 {
                s += &format!("\t.reg {} {}<{}>;\n", class.decl_type(), class.prefix(), n);
            }
        }
        s
    }
}
