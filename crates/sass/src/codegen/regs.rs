//! Register assignment: every IR value gets general registers (or a predicate) of its
//! own, aligned as the instructions that read it need (pairs for 64-bit addresses, four
//! for 16-byte vectors).

use quench_ir::{Function, Scalar, Type, Value};

use crate::error::Result;

use super::refuse;

/// General registers a thread may use on sm_90 (R0–R254; R255 reads as zero).
pub const MAX_REGISTERS: u32 = 255;
/// Predicates P0–P6 (P7 is always true).
const MAX_PREDICATES: u8 = 7;
/// The first register handed out: R0 and R1 are left alone (R1 is the stack pointer by
/// the ABI's convention).
const FIRST: u32 = 2;

/// Where a value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// `count` consecutive registers from `base`.
    R {
        base: u32,
        count: u32,
    },
    P(u8),
}

impl Loc {
    /// Register `base + i`'s name.
    pub fn reg(self, i: u32) -> String {
        match self {
            Loc::R { base, .. } => format!("R{}", base + i),
            Loc::P(p) => format!("P{p}"),
        }
    }
}

/// Hands out registers in order, each range aligned to its size.
pub struct Registers {
    next: u32,
    next_pred: u8,
    locs: Vec<Option<Loc>>,
}

/// How many 32-bit registers a value of `ty` takes, or `None` for a predicate.
pub fn width(ty: Type) -> Option<u32> {
    match ty {
        Type::Scalar(Scalar::Pred) => None,
        t => Some(t.bytes().div_ceil(4)),
    }
}

impl Registers {
    pub fn new(f: &Function) -> Registers {
        Registers {
            next: FIRST,
            next_pred: 0,
            locs: vec![None; f.values.len()],
        }
    }

    /// Fresh registers (or a predicate) for `v`.
    pub fn define(&mut self, f: &Function, v: Value) -> Result<Loc> {
        let loc = match width(f.ty(v)) {
            None => {
                if self.next_pred == MAX_PREDICATES {
                    return Err(refuse(
                        f,
                        format!(
                            "needs more than the {MAX_PREDICATES} predicates (register reuse is \
                             not implemented yet)"
                        ),
                    ));
                }
                self.next_pred += 1;
                Loc::P(self.next_pred - 1)
            }
            Some(count) => {
                let base = self.next.next_multiple_of(count.next_power_of_two());
                if base + count > MAX_REGISTERS {
                    return Err(refuse(
                        f,
                        format!(
                            "needs more than the {MAX_REGISTERS} registers of a thread: {} \
                             values take {} registers (register reuse is not implemented yet)",
                            f.values.len(),
                            base + count
                        ),
                    ));
                }
                self.next = base + count;
                Loc::R { base, count }
            }
        };
        self.locs[v.index()] = Some(loc);
        Ok(loc)
    }

    /// `v` lives in `loc` (an alias: a vector's element, or a value moved without a copy).
    pub fn alias(&mut self, v: Value, loc: Loc) {
        self.locs[v.index()] = Some(loc);
    }

    /// Where `v` lives; every operand is defined before its use (the verifier's rule).
    pub fn loc(&self, f: &Function, v: Value) -> Result<Loc> {
        self.locs[v.index()]
            .ok_or_else(|| refuse(f, format!("{v} is used before it has a register")))
    }

    /// Registers used, for the cubin's register count.
    pub fn used(&self) -> u32 {
        self.next
    }
}
