//! Fences and atomic read-modify-write operations.

use quench_ir::{AtomOp, Ordering, Scalar, Scope, Type, Value};

use crate::emitter::{Emitter, Res};

/// The IR has no relaxed fences; the other orderings map one to one.
pub(super) fn fence(e: &mut Emitter, ord: Ordering, scope: Scope) -> Res<()> {
    e.line(format!("fence.{}.{}", ord.name(), scope.name()));
    Ok(())
}

/// The `.op.type` of an atomic on `s`, or why there is none.
fn op_type(op: AtomOp, s: Scalar) -> Res<String> {
    let none = || {
        Err(format!(
            "atomic `{}` on {s} has no PTX instruction",
            op.name()
        ))
    };
    let bits = || format!("b{}", s.bits());
    let t = match op {
        AtomOp::Add => match s {
            Scalar::I32 | Scalar::U32 | Scalar::U64 | Scalar::F32 | Scalar::F64 => {
                s.name().to_string()
            }
            // Two's complement addition is the same for both signs; PTX has only u64.
            Scalar::I64 => "u64".into(),
            Scalar::F16 | Scalar::BF16 | Scalar::F16x2 | Scalar::BF16x2 => format!("noftz.{s}"),
            _ => return none(),
        },
        AtomOp::Min | AtomOp::Max => match s {
            Scalar::I32 | Scalar::U32 | Scalar::I64 | Scalar::U64 => s.name().to_string(),
            _ => return none(),
        },
        AtomOp::And | AtomOp::Or | AtomOp::Xor if s.is_int() && s.bits() >= 32 => bits(),
        AtomOp::Exch | AtomOp::Cas if s.bits() >= 32 => bits(),
        _ => return none(),
    };
    Ok(format!("{}.{t}", op.name()))
}

/// `atom.{sem}.{scope}.{space}.{op}.{type}`. PTX atomics take relaxed, acquire,
/// release or acq_rel; a sequentially consistent one is a `fence.sc` followed by an
/// acquire atomic, as CUDA's own C++ atomics implement seq_cst read-modify-writes.
#[allow(clippy::too_many_arguments)]
pub(super) fn atomic(
    e: &mut Emitter,
    d: Value,
    op: AtomOp,
    ord: Ordering,
    scope: Scope,
    ptr: Value,
    a: Value,
    b: Option<Value>,
) -> Res<()> {
    let space = match e.ty(ptr)? {
        Type::Ptr(s, _) => s,
        t => return Err(format!("{ptr} is a {t}, not a pointer")),
    };
    let ot = op_type(op, e.scalar(a)?)?;
    let operands = match b {
        Some(b) => format!("{}, {}", e.reg1(a)?, e.reg1(b)?),
        None => e.reg1(a)?,
    };
    let sem = match ord {
        Ordering::SeqCst => {
            e.line(format!("fence.sc.{}", scope.name()));
            Ordering::Acquire.name()
        }
        o => o.name(),
    };
    let (pr, dr) = (e.reg1(ptr)?, e.def1(d)?);
    e.line(format!(
        "atom.{sem}.{}.{}.{ot} {dr}, [{pr}], {operands}",
        scope.name(),
        space.name()
    ));
    Ok(())
}
