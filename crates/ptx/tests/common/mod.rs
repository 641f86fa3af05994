//! Helpers shared by the integration tests: assembling with a readable failure, the
//! list of operations PTX offers per type, and kernels that use every operation.

#![allow(dead_code)] // each test binary uses a different part

pub mod kernels;

use quench_ir::{BinOp, Function, Round, Scalar, UnOp};
use quench_ptx::ptxas::AsmReport;

/// Emit and assemble `f` for sm_90, panicking with the PTX (numbered) on failure.
pub fn assemble(f: &Function) -> (String, AsmReport) {
    let ptx = quench_ptx::emit(f).unwrap_or_else(|e| panic!("emitting `{}`: {e}", f.name));
    match quench_ptx::ptxas::assemble(&ptx, "sm_90") {
        Ok(report) => {
            assert!(
                report.warnings.is_empty(),
                "ptxas warned on `{}`: {:?}\n{}",
                f.name,
                report.warnings,
                numbered(&ptx)
            );
            assert_eq!(report.kernel, f.name);
            assert!(!report.cubin.is_empty());
            (ptx, report)
        }
        Err(e) => panic!("{e}\n--- PTX of `{}` ---\n{}", f.name, numbered(&ptx)),
    }
}

pub fn numbered(text: &str) -> String {
    text.lines()
        .enumerate()
        .map(|(i, l)| format!("{:5} {l}\n", i + 1))
        .collect()
}

/// Every storable scalar type.
pub fn storable() -> Vec<Scalar> {
    Scalar::ALL
        .into_iter()
        .filter(|s| *s != Scalar::Pred)
        .collect()
}

/// Scalars that numeric conversions take: no predicates, no packed pairs.
pub fn numeric() -> Vec<Scalar> {
    Scalar::ALL
        .into_iter()
        .filter(|s| *s != Scalar::Pred && !s.is_packed())
        .collect()
}

pub fn all_unops() -> Vec<UnOp> {
    let mut ops = vec![UnOp::Neg, UnOp::Abs, UnOp::Not];
    for r in Round::ALL {
        ops.extend([UnOp::Sqrt(r), UnOp::Rcp(r), UnOp::RoundInt(r)]);
    }
    ops.extend([
        UnOp::RcpApprox,
        UnOp::RsqrtApprox,
        UnOp::Ex2Approx,
        UnOp::Lg2Approx,
        UnOp::TanhApprox,
        UnOp::SinApprox,
        UnOp::CosApprox,
        UnOp::Popc,
        UnOp::Clz,
    ]);
    ops
}

/// Two-operand ops the IR defines and sm_90 PTX has for each type (written from the
/// PTX ISA, independently of the emitter).
pub fn bin_supported(op: BinOp, s: Scalar) -> bool {
    use BinOp::*;
    match s {
        Scalar::Pred => matches!(op, And | Or | Xor),
        _ if s.is_int() => true,
        Scalar::F32 | Scalar::F64 => matches!(op, Add | Sub | Mul | Div | Min | Max),
        _ => matches!(op, Add | Sub | Mul | Min | Max),
    }
}

pub fn un_supported(op: UnOp, s: Scalar) -> bool {
    use UnOp::*;
    match op {
        Not => s == Scalar::Pred || s.is_int(),
        Neg | Abs => s.is_signed() || s.is_float() || s.is_packed(),
        Popc | Clz => s.is_int() && s.bits() >= 32,
        Sqrt(_) | Rcp(_) => matches!(s, Scalar::F32 | Scalar::F64),
        RoundInt(_) => s.is_float(),
        RcpApprox | RsqrtApprox | Ex2Approx | Lg2Approx | TanhApprox | SinApprox | CosApprox => {
            s == Scalar::F32
        }
    }
}

pub fn cmp_supported(s: Scalar) -> bool {
    s.is_int() || s.is_float()
}

/// The rounding an arithmetic op on `s` takes (floats: to nearest even).
pub fn rounding(op: BinOp, s: Scalar) -> Option<Round> {
    let rounds = matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div);
    ((s.is_float() || s.is_packed()) && rounds).then_some(Round::Rn)
}
