//! Typing rules: what each operation accepts and the types of what it defines.
//!
//! Callers have checked that every operand is a defined value, so operand types are
//! read straight from the value table.

use super::InstProblem;
use crate::func::{Function, Value};
use crate::ops::*;
use crate::types::{AddrSpace, FragRole, FragType, MmaShape, Scalar, Type};

/// Why `ty` is not a type a value may have, if it is not.
pub(super) fn type_problem(ty: Type) -> Option<&'static str> {
    match ty {
        Type::Scalar(_) => None,
        Type::Vec(_, n) if n != 2 && n != 4 => Some("vectors have 2 or 4 lanes"),
        Type::Vec(Scalar::Pred, _) => Some("vector lanes cannot be predicates"),
        Type::Vec(..) if ty.bytes() > 16 => Some("vectors are at most 16 bytes"),
        Type::Vec(..) => None,
        Type::Ptr(_, Scalar::Pred) => Some("pointers cannot point to predicates"),
        Type::Ptr(..) => None,
        Type::Frag(f) if !f.is_valid() => {
            Some("the element type does not fit the fragment's shape and role")
        }
        Type::Frag(_) => None,
    }
}

fn ty(f: &Function, v: Value) -> Type {
    f.values[v.index()]
}

fn operand(
    role: impl Into<String>,
    f: &Function,
    v: Value,
    expected: impl Into<String>,
) -> InstProblem {
    InstProblem::Operand {
        role: role.into(),
        value: v,
        ty: ty(f, v),
        expected: expected.into(),
    }
}

/// `v` must have type `want`.
fn expect(f: &Function, role: &str, v: Value, want: Type) -> Result<(), InstProblem> {
    if ty(f, v) == want {
        Ok(())
    } else {
        Err(operand(role, f, v, want.to_string()))
    }
}

/// `b` must have the type of `a`.
fn same_as(f: &Function, role: &str, b: Value, a_role: &str, a: Value) -> Result<(), InstProblem> {
    let want = ty(f, a);
    if ty(f, b) == want {
        Ok(())
    } else {
        Err(operand(
            role,
            f,
            b,
            format!("{want} (the type of `{a_role}`)"),
        ))
    }
}

fn pointer(f: &Function, role: &str, v: Value) -> Result<(AddrSpace, Scalar), InstProblem> {
    match ty(f, v) {
        Type::Ptr(space, elem) => Ok((space, elem)),
        _ => Err(operand(role, f, v, "a pointer")),
    }
}

fn pointer_in(f: &Function, role: &str, v: Value, space: AddrSpace) -> Result<Scalar, InstProblem> {
    match ty(f, v) {
        Type::Ptr(s, elem) if s == space => Ok(elem),
        _ => Err(operand(
            role,
            f,
            v,
            format!("a pointer to {} memory", space.name()),
        )),
    }
}

fn scalar_of(f: &Function, op: &str, v: Value) -> Result<Scalar, InstProblem> {
    match ty(f, v) {
        Type::Scalar(s) => Ok(s),
        t => Err(InstProblem::NotDefinedOn {
            op: op.to_string(),
            ty: t,
        }),
    }
}

fn not_on(op: &str, s: Scalar) -> InstProblem {
    InstProblem::NotDefinedOn {
        op: op.to_string(),
        ty: Type::Scalar(s),
    }
}

/// Whether a value of `ty` may be moved through a pointer to `elem`.
fn fits_pointee(ty: Type, elem: Scalar) -> bool {
    matches!(ty, Type::Scalar(s) | Type::Vec(s, _) if s == elem)
}

/// The parts a vector, packed pair or fragment is made of: (count, part type).
fn parts_of(t: Type) -> Option<(u32, Scalar)> {
    match t {
        Type::Vec(s, n) => Some((n as u32, s)),
        Type::Scalar(s) => s.packed_elem().map(|e| (2, e)),
        Type::Frag(fr) => Some((fr.regs(), fr.reg_type())),
        Type::Ptr(..) => None,
    }
}

/// Check operation `op` (its operands being defined) and return its result types.
pub(super) fn result_types(f: &Function, op: &Op) -> Result<Vec<Type>, InstProblem> {
    let t = |v: Value| ty(f, v);
    let one = |ty: Type| Ok(vec![ty]);
    match op {
        Op::Const { ty, bits } => {
            let Type::Scalar(s) = *ty else {
                return Err(InstProblem::ConstType(*ty));
            };
            let fits = match s {
                Scalar::Pred => *bits <= 1,
                s => s.bits() >= 64 || *bits >> s.bits() == 0,
            };
            if !fits {
                return Err(InstProblem::ConstBits { bits: *bits, ty: s });
            }
            one(*ty)
        }
        Op::Param(i) => match f.params.get(*i as usize) {
            Some(p) => one(p.ty),
            None => Err(InstProblem::ParamIndex {
                index: *i,
                count: f.params.len(),
            }),
        },
        Op::Special(s) => one(Type::Scalar(s.ty())),
        Op::Bin { op, rnd, a, b } => bin(f, *op, *rnd, *a, *b),
        Op::Fma { a, b, c, .. } => {
            let s = scalar_of(f, "fma", *a)?;
            if !(s.is_float() || s.is_packed()) {
                return Err(not_on("fma", s));
            }
            same_as(f, "b", *b, "a", *a)?;
            same_as(f, "c", *c, "a", *a)?;
            one(t(*a))
        }
        Op::Dp4a {
            a_signed,
            b_signed,
            a,
            b,
            c,
        } => {
            for (role, v) in [("a", *a), ("b", *b)] {
                if !matches!(ty(f, v), Type::Scalar(Scalar::U32 | Scalar::I32)) {
                    return Err(operand(role, f, v, "u32 or i32"));
                }
            }
            let acc = if *a_signed || *b_signed {
                Type::I32
            } else {
                Type::U32
            };
            expect(f, "c", *c, acc)?;
            one(acc)
        }
        Op::Un { op, a } => un(f, *op, *a),
        Op::DivApprox { a, b } => {
            expect(f, "a", *a, Type::F32)?;
            expect(f, "b", *b, Type::F32)?;
            one(Type::F32)
        }
        Op::Cmp { op, a, b } => {
            let s = scalar_of(f, &format!("cmp.{}", op.name()), *a)?;
            if !(s.is_int() || s.is_float()) {
                return Err(not_on(&format!("cmp.{}", op.name()), s));
            }
            same_as(f, "b", *b, "a", *a)?;
            one(Type::PRED)
        }
        Op::Select { cond, a, b } => {
            expect(f, "cond", *cond, Type::PRED)?;
            same_as(f, "b", *b, "a", *a)?;
            one(t(*a))
        }
        Op::Cvt { to, rnd, a, .. } => cvt(f, *to, *rnd, *a),
        Op::Bitcast { to, a } => {
            let from = t(*a);
            for x in [from, *to] {
                if matches!(x, Type::Ptr(..) | Type::Scalar(Scalar::Pred)) {
                    return Err(InstProblem::NotDefinedOn {
                        op: "bitcast".into(),
                        ty: x,
                    });
                }
            }
            if from.bytes() != to.bytes() {
                return Err(InstProblem::BitcastSize { from, to: *to });
            }
            one(*to)
        }
        Op::Pack { ty, parts } => {
            let Some((n, part)) = parts_of(*ty) else {
                return Err(InstProblem::NotDefinedOn {
                    op: "pack".into(),
                    ty: *ty,
                });
            };
            if parts.len() != n as usize {
                return Err(InstProblem::PartCount {
                    ty: *ty,
                    expected: n as usize,
                    found: parts.len(),
                });
            }
            for (i, p) in parts.iter().enumerate() {
                expect(f, &format!("part {i}"), *p, Type::Scalar(part))?;
            }
            one(*ty)
        }
        Op::Extract { a, index } => {
            let whole = t(*a);
            let Some((n, part)) = parts_of(whole) else {
                return Err(InstProblem::NotDefinedOn {
                    op: "extract".into(),
                    ty: whole,
                });
            };
            if *index >= n {
                return Err(InstProblem::PartIndex {
                    index: *index,
                    ty: whole,
                    len: n,
                });
            }
            one(Type::Scalar(part))
        }
        Op::PtrAdd { ptr, index } => {
            pointer(f, "ptr", *ptr)?;
            if !t(*index).scalar().is_some_and(Scalar::is_int) {
                return Err(operand("index", f, *index, "an integer type"));
            }
            one(t(*ptr))
        }
        Op::PtrCast { to, ptr } => {
            let (space, _) = pointer(f, "ptr", *ptr)?;
            one(Type::Ptr(space, *to))
        }
        Op::SharedAddr { decl } => match f.shared.get(*decl as usize) {
            Some(d) => one(Type::Ptr(AddrSpace::Shared, d.elem)),
            None => Err(InstProblem::SharedIndex {
                index: *decl,
                count: f.shared.len(),
            }),
        },
        Op::Load { ty, ptr, cache } => {
            let (space, elem) = pointer(f, "ptr", *ptr)?;
            if !fits_pointee(*ty, elem) {
                return Err(InstProblem::MemoryType {
                    access: "load",
                    ty: *ty,
                    ptr: t(*ptr),
                });
            }
            if !cache.valid_for_load() {
                return Err(InstProblem::Cache {
                    cache: cache.name(),
                    why: "is not valid on a load",
                });
            }
            if *cache == CacheOp::Nc && space != AddrSpace::Global {
                return Err(InstProblem::Cache {
                    cache: cache.name(),
                    why: "loads only from global memory",
                });
            }
            one(*ty)
        }
        Op::Store { ptr, value, cache } => {
            let (_, elem) = pointer(f, "ptr", *ptr)?;
            if !fits_pointee(t(*value), elem) {
                return Err(InstProblem::MemoryType {
                    access: "store",
                    ty: t(*value),
                    ptr: t(*ptr),
                });
            }
            if !cache.valid_for_store() {
                return Err(InstProblem::Cache {
                    cache: cache.name(),
                    why: "is not valid on a store",
                });
            }
            Ok(vec![])
        }
        Op::Barrier
        | Op::CpAsyncCommit
        | Op::CpAsyncWait { .. }
        | Op::WgmmaFence
        | Op::WgmmaCommit
        | Op::WgmmaWait { .. }
        | Op::FenceProxyAsync
        | Op::Return
        | Op::Yield(_) => Ok(vec![]),
        Op::WgmmaDesc { ptr, lbo, sbo, .. } => {
            pointer_in(f, "ptr", *ptr, AddrSpace::Shared)?;
            for (what, v) in [
                ("the leading byte offset", *lbo),
                ("the stride byte offset", *sbo),
            ] {
                if !v.is_multiple_of(16) || v >= 1 << 18 {
                    return Err(InstProblem::Immediate {
                        what,
                        value: v,
                        allowed: "a multiple of 16 below 2^18",
                    });
                }
            }
            one(Type::Scalar(Scalar::U64))
        }
        Op::Wgmma {
            shape, ab, a, b, c, ..
        } => wgmma(f, *shape, *ab, *a, *b, *c),
        Op::MbarrierInit { bar, count } => {
            mbarrier(f, *bar)?;
            expect(f, "count", *count, Type::U32)?;
            Ok(vec![])
        }
        Op::MbarrierArrive { bar } | Op::CpAsyncMbarrierArrive { bar } => {
            mbarrier(f, *bar)?;
            Ok(vec![])
        }
        Op::MbarrierWait { bar, parity } => {
            mbarrier(f, *bar)?;
            expect(f, "parity", *parity, Type::U32)?;
            Ok(vec![])
        }
        Op::Fence { ord, .. } => {
            if *ord == Ordering::Relaxed {
                return Err(InstProblem::RelaxedFence);
            }
            Ok(vec![])
        }
        Op::Atomic { op, ptr, a, b, .. } => atomic(f, *op, *ptr, *a, *b),
        Op::Shfl {
            value, b, c, mask, ..
        } => {
            if t(*value).scalar().is_none_or(|s| s.bits() != 32) {
                return Err(operand("value", f, *value, "a 32-bit scalar"));
            }
            expect(f, "b", *b, Type::U32)?;
            expect(f, "c", *c, Type::U32)?;
            expect(f, "mask", *mask, Type::U32)?;
            one(t(*value))
        }
        Op::Vote { mode, pred, mask } => {
            expect(f, "pred", *pred, Type::PRED)?;
            expect(f, "mask", *mask, Type::U32)?;
            one(if *mode == VoteMode::Ballot {
                Type::U32
            } else {
                Type::PRED
            })
        }
        Op::Redux { value, mask, .. } => {
            if !matches!(t(*value), Type::Scalar(Scalar::I32 | Scalar::U32)) {
                return Err(operand("value", f, *value, "s32 or u32"));
            }
            expect(f, "mask", *mask, Type::U32)?;
            one(t(*value))
        }
        Op::Mma { shape, a, b, c } => mma(f, *shape, *a, *b, *c),
        Op::LdMatrix { ty, num, ptr, .. } => {
            if !matches!(num, 1 | 2 | 4) {
                return Err(InstProblem::Immediate {
                    what: "the ldmatrix count",
                    value: *num as u32,
                    allowed: "1, 2 or 4",
                });
            }
            pointer_in(f, "ptr", *ptr, AddrSpace::Shared)?;
            let ok = match *ty {
                Type::Scalar(Scalar::U32) => *num == 1,
                Type::Vec(Scalar::U32, n) => n == *num,
                Type::Frag(fr) => {
                    fr.role != FragRole::C && fr.is_valid() && fr.regs() == *num as u32
                }
                _ => false,
            };
            if !ok {
                return Err(InstProblem::LdMatrixType { ty: *ty, num: *num });
            }
            one(*ty)
        }
        Op::CpAsync {
            dst,
            src,
            bytes,
            cache,
        } => {
            pointer_in(f, "dst", *dst, AddrSpace::Shared)?;
            pointer_in(f, "src", *src, AddrSpace::Global)?;
            if !matches!(bytes, 4 | 8 | 16) {
                return Err(InstProblem::Immediate {
                    what: "the cp.async size",
                    value: *bytes as u32,
                    allowed: "4, 8 or 16 bytes",
                });
            }
            match cache {
                CacheOp::Ca => {}
                CacheOp::Cg if *bytes == 16 => {}
                CacheOp::Cg => {
                    return Err(InstProblem::Cache {
                        cache: "cg",
                        why: "copies only 16 bytes",
                    })
                }
                other => {
                    return Err(InstProblem::Cache {
                        cache: other.name(),
                        why: "is not one of cp.async's `.ca` or `.cg`",
                    })
                }
            }
            Ok(vec![])
        }
        Op::If { cond, results, .. } => {
            expect(f, "cond", *cond, Type::PRED)?;
            Ok(results.clone())
        }
        Op::For {
            lo, hi, step, init, ..
        } => {
            if !t(*lo).scalar().is_some_and(Scalar::is_int) {
                return Err(operand("lo", f, *lo, "an integer type"));
            }
            same_as(f, "hi", *hi, "lo", *lo)?;
            same_as(f, "step", *step, "lo", *lo)?;
            Ok(init.iter().map(|v| t(*v)).collect())
        }
    }
}

fn bin(
    f: &Function,
    op: BinOp,
    rnd: Option<Round>,
    a: Value,
    b: Value,
) -> Result<Vec<Type>, InstProblem> {
    let s = scalar_of(f, op.name(), a)?;
    if matches!(op, BinOp::Shl | BinOp::Shr) {
        if ty(f, b) != Type::U32 {
            return Err(operand("b", f, b, "u32 (the shift amount)"));
        }
    } else {
        same_as(f, "b", b, "a", a)?;
    }
    use BinOp::*;
    let defined = if s == Scalar::Pred {
        matches!(op, And | Or | Xor)
    } else if s.is_int() {
        true
    } else if s.is_float() {
        matches!(op, Add | Sub | Mul | Min | Max)
            || (op == Div && matches!(s, Scalar::F32 | Scalar::F64))
    } else {
        // packed pairs
        matches!(op, Add | Sub | Mul | Min | Max)
    };
    if !defined {
        return Err(not_on(op.name(), s));
    }
    let inexact = (s.is_float() || s.is_packed()) && matches!(op, Add | Sub | Mul | Div);
    let name = format!("{} on {s}", op.name());
    match (inexact, rnd) {
        (true, None) => Err(InstProblem::RoundingRequired { op: name }),
        (false, Some(_)) => Err(InstProblem::RoundingNotAllowed { op: name }),
        _ => Ok(vec![Type::Scalar(s)]),
    }
}

fn un(f: &Function, op: UnOp, a: Value) -> Result<Vec<Type>, InstProblem> {
    let name = crate::print::un_name(op);
    let s = scalar_of(f, &name, a)?;
    let defined = match op {
        UnOp::Neg | UnOp::Abs => s.is_signed() || s.is_float() || s.is_packed(),
        UnOp::Not => s.is_int() || s == Scalar::Pred,
        UnOp::Sqrt(_) | UnOp::Rcp(_) => matches!(s, Scalar::F32 | Scalar::F64),
        UnOp::RoundInt(_) => s.is_float(),
        UnOp::Popc | UnOp::Clz => s.is_int() && s.bits() >= 32,
        UnOp::RcpApprox
        | UnOp::RsqrtApprox
        | UnOp::Ex2Approx
        | UnOp::Lg2Approx
        | UnOp::TanhApprox
        | UnOp::SinApprox
        | UnOp::CosApprox => s == Scalar::F32,
    };
    if !defined {
        return Err(not_on(&name, s));
    }
    Ok(vec![if matches!(op, UnOp::Popc | UnOp::Clz) {
        Type::U32
    } else {
        Type::Scalar(s)
    }])
}

fn cvt(f: &Function, to: Scalar, rnd: Option<Round>, a: Value) -> Result<Vec<Type>, InstProblem> {
    let from = scalar_of(f, "cvt", a)?;
    for s in [from, to] {
        if s == Scalar::Pred || s.is_packed() {
            return Err(not_on("cvt", s));
        }
    }
    // Rounding selects how an inexact conversion rounds: int↔float, and float to a
    // different float type that is not wider (f16↔bf16 lose range or precision).
    let inexact = (from.is_int() && to.is_float())
        || (from.is_float() && to.is_int())
        || (from.is_float() && to.is_float() && from != to && to.bits() <= from.bits());
    let name = format!("cvt from {from} to {to}");
    match (inexact, rnd) {
        (true, None) => Err(InstProblem::RoundingRequired { op: name }),
        (false, Some(_)) => Err(InstProblem::RoundingNotAllowed { op: name }),
        _ => Ok(vec![Type::Scalar(to)]),
    }
}

fn atomic(
    f: &Function,
    op: AtomOp,
    ptr: Value,
    a: Value,
    b: Option<Value>,
) -> Result<Vec<Type>, InstProblem> {
    let elem = match ty(f, ptr) {
        Type::Ptr(AddrSpace::Global | AddrSpace::Shared, e) => e,
        _ => {
            return Err(operand(
                "ptr",
                f,
                ptr,
                "a pointer to global or shared memory",
            ))
        }
    };
    let ta = ty(f, a);
    if ta != Type::Scalar(elem) {
        return Err(InstProblem::MemoryType {
            access: "atomic",
            ty: ta,
            ptr: ty(f, ptr),
        });
    }
    use Scalar::*;
    let defined = match op {
        AtomOp::Add => matches!(
            elem,
            I32 | U32 | I64 | U64 | F16 | BF16 | F16x2 | BF16x2 | F32 | F64
        ),
        AtomOp::Min | AtomOp::Max | AtomOp::And | AtomOp::Or | AtomOp::Xor => {
            matches!(elem, I32 | U32 | I64 | U64)
        }
        AtomOp::Exch | AtomOp::Cas => elem.bits() == 32 || elem.bits() == 64,
    };
    let name = format!("atom.{}", op.name());
    if !defined {
        return Err(not_on(&name, elem));
    }
    match (op, b) {
        (AtomOp::Cas, Some(b)) => same_as(f, "b", b, "a", a)?,
        (AtomOp::Cas, None) => {
            return Err(InstProblem::OperandCount {
                op: name,
                expected: 3,
                found: 2,
            })
        }
        (_, Some(_)) => {
            return Err(InstProblem::OperandCount {
                op: name,
                expected: 2,
                found: 3,
            })
        }
        (_, None) => {}
    }
    Ok(vec![ta])
}

/// An mbarrier operand: a shared pointer to u64.
fn mbarrier(f: &Function, bar: Value) -> Result<(), InstProblem> {
    expect(f, "bar", bar, Type::Ptr(AddrSpace::Shared, Scalar::U64))
}

fn wgmma(
    f: &Function,
    shape: MmaShape,
    ab: Scalar,
    a: Value,
    b: Value,
    c: Value,
) -> Result<Vec<Type>, InstProblem> {
    if !shape.is_warpgroup() || !matches!(ab, Scalar::F16 | Scalar::BF16) {
        return Err(operand(
            "c",
            f,
            c,
            format!(
                "a warpgroup shape and f16 or bf16 operands, not {} {ab}",
                shape.name()
            ),
        ));
    }
    let desc = Type::Scalar(Scalar::U64);
    match ty(f, a) {
        t if t == desc => {}
        Type::Frag(fr) if fr.shape == shape && fr.role == FragRole::A && fr.elem == ab => {}
        _ => {
            return Err(operand(
                "a",
                f,
                a,
                format!("a u64 descriptor or an A fragment of {} {ab}", shape.name()),
            ))
        }
    }
    expect(f, "b", b, desc)?;
    match ty(f, c) {
        Type::Frag(fr) if fr.shape == shape && fr.role == FragRole::C && fr.is_valid() => {
            Ok(vec![ty(f, c)])
        }
        _ => Err(operand(
            "c",
            f,
            c,
            format!("a valid c fragment of {}", shape.name()),
        )),
    }
}

fn mma(
    f: &Function,
    shape: MmaShape,
    a: Value,
    b: Value,
    c: Value,
) -> Result<Vec<Type>, InstProblem> {
    let frag = |role_name: &str, v: Value, role: FragRole| -> Result<FragType, InstProblem> {
        match ty(f, v) {
            Type::Frag(fr) if fr.shape == shape && fr.role == role && fr.is_valid() => Ok(fr),
            _ => Err(operand(
                role_name,
                f,
                v,
                format!("a valid {} fragment of {}", role.name(), shape.name()),
            )),
        }
    };
    let fa = frag("a", a, FragRole::A)?;
    let fb = frag("b", b, FragRole::B)?;
    if fb.elem != fa.elem {
        return Err(operand(
            "b",
            f,
            b,
            format!("a b fragment of {} elements (matching `a`)", fa.elem),
        ));
    }
    frag("c", c, FragRole::C)?;
    Ok(vec![ty(f, c)])
}
