//! Barriers under divergent control flow.
//!
//! `bar.sync` waits for every thread of the block, so a barrier that only some threads
//! reach hangs the block. A barrier is accepted only where every enclosing `if` tests a
//! value that is uniform (the same in all threads of the block) and every enclosing
//! `for` has uniform bounds.
//!
//! Uniform values: constants, parameters, `ntid`/`ctaid`/`nctaid`, shared-array
//! addresses, and whatever is computed from uniform values only — including loop
//! induction variables of loops with uniform bounds, loop-carried values whose initial
//! and yielded values are uniform, and `if` results under a uniform condition that
//! yields uniform values. Thread ids, lane and warp ids, clocks, loads, atomics and warp
//! collectives (shuffle, vote, reduce, MMA, ldmatrix) vary between threads.

use super::{inst_error, InstProblem, VerifyError};
use crate::func::{Block, Function, Value};
use crate::ops::{Op, Special};
use crate::print::inst_header;

pub(super) fn check_barriers(f: &Function) -> Result<(), VerifyError> {
    let vary = analyze(f);
    barriers(f, &f.body, &vary, "body", None)
}

/// For each value: `None` if it is uniform, or the value it inherits variation from
/// (a result of a thread-varying operation).
type Variation = Vec<Option<Value>>;

fn analyze(f: &Function) -> Variation {
    let mut vary = vec![None; f.values.len()];
    // Values only ever turn from uniform to varying, so this settles; loop-carried
    // values need more than one pass when a later iteration sees a varying yield.
    loop {
        let mut changed = false;
        visit(&f.body, &mut vary, &mut changed);
        if !changed {
            return vary;
        }
    }
}

fn get(vary: &Variation, v: Value) -> Option<Value> {
    vary.get(v.index()).copied().flatten()
}

fn mark(vary: &mut Variation, v: Value, source: Option<Value>, changed: &mut bool) {
    if let (Some(src), Some(slot)) = (source, vary.get_mut(v.index())) {
        if slot.is_none() {
            *slot = Some(src);
            *changed = true;
        }
    }
}

/// The values a block's final `yield` hands over.
fn yielded(b: &Block) -> &[Value] {
    match b.insts.last().map(|i| &i.op) {
        Some(Op::Yield(vals)) => vals,
        _ => &[],
    }
}

fn thread_varying(op: &Op) -> bool {
    match op {
        Op::Special(s) => !matches!(
            s,
            Special::NtidX
                | Special::NtidY
                | Special::NtidZ
                | Special::CtaidX
                | Special::CtaidY
                | Special::CtaidZ
                | Special::NctaidX
                | Special::NctaidY
                | Special::NctaidZ
        ),
        Op::Load { .. }
        | Op::Atomic { .. }
        | Op::Shfl { .. }
        | Op::Vote { .. }
        | Op::Redux { .. }
        | Op::Mma { .. }
        | Op::Wgmma { .. }
        | Op::LdMatrix { .. } => true,
        _ => false,
    }
}

fn visit(b: &Block, vary: &mut Variation, changed: &mut bool) {
    for inst in &b.insts {
        match &inst.op {
            Op::If {
                cond, then_, else_, ..
            } => {
                visit(then_, vary, changed);
                visit(else_, vary, changed);
                let c = get(vary, *cond);
                for (i, r) in inst.results.iter().enumerate() {
                    let from_branch = |blk: &Block| yielded(blk).get(i).and_then(|v| get(vary, *v));
                    let src = c
                        .or_else(|| from_branch(then_))
                        .or_else(|| from_branch(else_));
                    mark(vary, *r, src, changed);
                }
            }
            Op::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                let bounds = get(vary, *lo).or(get(vary, *hi)).or(get(vary, *step));
                if let Some(iv) = body.args.first() {
                    mark(vary, *iv, bounds, changed);
                }
                let ys = yielded(body).to_vec();
                for (i, arg) in body.args.iter().skip(1).enumerate() {
                    let src = init
                        .get(i)
                        .and_then(|v| get(vary, *v))
                        .or_else(|| ys.get(i).and_then(|v| get(vary, *v)));
                    mark(vary, *arg, src, changed);
                }
                visit(body, vary, changed);
                for (i, r) in inst.results.iter().enumerate() {
                    let src = bounds.or_else(|| body.args.get(i + 1).and_then(|v| get(vary, *v)));
                    mark(vary, *r, src, changed);
                }
            }
            op if thread_varying(op) => {
                for r in &inst.results {
                    mark(vary, *r, Some(*r), changed);
                }
            }
            op => {
                let src = op.operands().into_iter().find_map(|v| get(vary, v));
                for r in &inst.results {
                    mark(vary, *r, src, changed);
                }
            }
        }
    }
}

/// Why the code being walked may be reached by only some threads of the block.
struct Divergence {
    construct: String,
    root: Value,
}

fn barriers(
    f: &Function,
    b: &Block,
    vary: &Variation,
    path: &str,
    div: Option<&Divergence>,
) -> Result<(), VerifyError> {
    for (i, inst) in b.insts.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match &inst.op {
            Op::Barrier => {
                if let Some(d) = div {
                    let problem = InstProblem::DivergentBarrier {
                        construct: d.construct.clone(),
                        root: root_text(f, d.root),
                    };
                    return Err(inst_error(f, inst, &at, problem));
                }
            }
            Op::If {
                cond, then_, else_, ..
            } => {
                let own = get(vary, *cond).map(|root| Divergence {
                    construct: format!("`if {cond}`"),
                    root,
                });
                let d = div.or(own.as_ref());
                barriers(f, then_, vary, &format!("{at}/then"), d)?;
                barriers(f, else_, vary, &format!("{at}/else"), d)?;
            }
            Op::For {
                lo, hi, step, body, ..
            } => {
                let root = get(vary, *lo).or(get(vary, *hi)).or(get(vary, *step));
                let own = root.map(|root| Divergence {
                    construct: format!("the bounds of `for` ({lo} to {hi} step {step})"),
                    root,
                });
                barriers(f, body, vary, &format!("{at}/loop"), div.or(own.as_ref()))?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The text of the instruction that defines `v`.
fn root_text(f: &Function, v: Value) -> String {
    let mut text = None;
    f.walk(&mut |inst| {
        if text.is_none() && inst.results.contains(&v) {
            text = Some(inst_header(f, inst));
        }
    });
    text.unwrap_or_else(|| v.to_string())
}
