//! Structured control flow lowered to predicated branches, and the walk over blocks.
//!
//! `if`: `@!%p bra $Lelse_N;` then-block, `bra $Lend_N;`, `$Lelse_N:` else-block,
//! `$Lend_N:`; each branch's yield moves its values into the `if`'s result registers.
//!
//! `for iv in lo..hi step s`: the induction variable and the carried values live in
//! the body block's argument registers, which are also the loop's result registers.
//! The bound is tested at the top (zero trips when `lo >= hi`), signed or unsigned by
//! `lo`'s type; the body's yield moves the next carried values in.

use quench_ir::{Block, Inst, Op, Scalar, Value};

use crate::emitter::{Emitter, Res};
use crate::regs::RegClass;
use crate::{inst, ptype, PtxError};

pub(crate) fn emit_body(e: &mut Emitter) -> Result<(), PtxError> {
    let f = e.f;
    block(e, &f.body, None)
}

/// Where a block's `Yield` sends its values.
struct YieldTo {
    regs: Vec<String>,
    classes: Vec<RegClass>,
}

fn block(e: &mut Emitter, b: &Block, yield_to: Option<&YieldTo>) -> Result<(), PtxError> {
    let f = e.f;
    for i in &b.insts {
        e.comment(describe(i));
        let at = |msg: String| PtxError::Unsupported {
            kernel: f.name.clone(),
            at: describe(i),
            msg,
        };
        match &i.op {
            // Errors inside the nested blocks name their own instruction.
            Op::If {
                cond, then_, else_, ..
            } => {
                let to = if_head(e, i, *cond, else_).map_err(at)?;
                nested_if(e, then_, else_, to)?;
            }
            Op::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let to = for_head(e, i, [*lo, *hi, *step], init, body).map_err(at)?;
                block(e, body, Some(&to.yield_to))?;
                for_tail(e, &to);
            }
            _ => one(e, i, yield_to).map_err(at)?,
        }
    }
    Ok(())
}

fn one(e: &mut Emitter, i: &Inst, yield_to: Option<&YieldTo>) -> Res<()> {
    match &i.op {
        Op::Yield(vals) => {
            let to = yield_to.ok_or("`yield` outside an `if` or `for` block")?;
            let (src, _) = flatten(e, vals)?;
            e.parallel_copy(&to.regs, &src, &to.classes);
            Ok(())
        }
        Op::Return => {
            e.line("ret");
            Ok(())
        }
        _ => inst::emit(e, i),
    }
}

/// Registers of several values, and their classes.
fn flatten(e: &Emitter, vals: &[Value]) -> Res<(Vec<String>, Vec<RegClass>)> {
    let mut regs = Vec::new();
    let mut classes = Vec::new();
    for v in vals {
        regs.extend(e.regs(*v)?);
        classes.extend(RegClass::of_type(e.ty(*v)?)?);
    }
    Ok((regs, classes))
}

/// The branch over an `if` and its result registers.
struct IfHead {
    yield_to: YieldTo,
    else_label: Option<String>,
    end_label: String,
}

fn if_head(e: &mut Emitter, i: &Inst, cond: Value, else_: &Block) -> Res<IfHead> {
    let p = e.reg1(cond)?;
    for r in &i.results {
        e.def(*r)?;
    }
    let (regs, classes) = flatten(e, &i.results)?;
    let id = e.label_id();
    let else_empty = else_
        .insts
        .iter()
        .all(|i| matches!(&i.op, Op::Yield(v) if v.is_empty()));
    let end_label = format!("$Lend_{id}");
    let else_label = (!else_empty).then(|| format!("$Lelse_{id}"));
    e.line(format!(
        "@!{p} bra {}",
        else_label.as_ref().unwrap_or(&end_label)
    ));
    Ok(IfHead {
        yield_to: YieldTo { regs, classes },
        else_label,
        end_label,
    })
}

fn nested_if(e: &mut Emitter, then_: &Block, else_: &Block, h: IfHead) -> Result<(), PtxError> {
    block(e, then_, Some(&h.yield_to))?;
    if let Some(else_label) = &h.else_label {
        e.line(format!("bra {}", h.end_label));
        e.label(else_label);
        block(e, else_, Some(&h.yield_to))?;
    }
    e.label(&h.end_label);
    Ok(())
}

/// What closes a loop after its body: the step and the back edge.
struct ForHead {
    yield_to: YieldTo,
    iv: String,
    step: String,
    ty: Scalar,
    head: String,
    done: String,
}

fn for_head(
    e: &mut Emitter,
    i: &Inst,
    [lo, hi, step]: [Value; 3],
    init: &[Value],
    body: &Block,
) -> Res<ForHead> {
    // The verifier has checked the bounds' common integer type and the block arguments.
    let s = e.scalar(lo)?;
    let iv = e.def1(body.args[0])?;
    let carried = &body.args[1..];
    for a in carried {
        e.def(*a)?;
    }
    // The loop's results are the carried registers after the last trip.
    for (r, a) in i.results.iter().zip(carried) {
        let regs = e.regs(*a)?;
        e.regs.bind(*r, regs);
    }
    let (lo_r, hi_r, step_r) = (e.reg1(lo)?, e.reg1(hi)?, e.reg1(step)?);
    let (carried_regs, classes) = flatten(e, carried)?;
    let (init_regs, _) = flatten(e, init)?;
    let t = ptype::arith(s);
    let bits = ptype::bits(s);
    let id = e.label_id();
    let (head, done) = (format!("$Lloop_{id}"), format!("$Ldone_{id}"));
    e.line(format!("mov.{bits} {iv}, {lo_r}"));
    e.parallel_copy(&carried_regs, &init_regs, &classes);
    e.label(&head);
    let p = e.temp(RegClass::Pred);
    e.line(format!("setp.ge.{t} {p}, {iv}, {hi_r}"));
    e.line(format!("@{p} bra {done}"));
    Ok(ForHead {
        yield_to: YieldTo {
            regs: carried_regs,
            classes,
        },
        iv,
        step: step_r,
        ty: s,
        head,
        done,
    })
}

fn for_tail(e: &mut Emitter, h: &ForHead) {
    let (iv, t) = (&h.iv, ptype::arith(h.ty));
    e.line(format!("add.{t} {iv}, {iv}, {}", h.step));
    e.rextend(h.ty, iv);
    e.line(format!("bra {}", h.head));
    e.label(&h.done);
}

/// `%3, %4 = for` — the comment above each instruction and the place named in errors.
pub(crate) fn describe(i: &Inst) -> String {
    let results: Vec<String> = i.results.iter().map(|v| v.to_string()).collect();
    let name = inst::op_name(&i.op);
    if results.is_empty() {
        name
    } else {
        format!("{} = {name}", results.join(", "))
    }
}
