//! `wgmma` reads its A fragment's registers until `wgmma.wait_group` retires its group.
//! In a loop, a fragment defined in the body lives in the same registers every
//! iteration, so the next iteration's definition must come after a wait that retires
//! the group of the product reading it; otherwise the product may read the new values.

use super::{inst_error, InstProblem, VerifyError};
use crate::func::{Block, Function};
use crate::ops::Op;
use crate::types::Type;

pub(super) fn check_fragments(f: &Function) -> Result<(), VerifyError> {
    walk(f, &f.body, "body", false)
}

fn walk(f: &Function, b: &Block, path: &str, in_loop: bool) -> Result<(), VerifyError> {
    if in_loop {
        loop_body(f, b, path)?;
    }
    for (i, inst) in b.insts.iter().enumerate() {
        let at = format!("{path}[{i}]");
        match &inst.op {
            Op::If { then_, else_, .. } => {
                walk(f, then_, &format!("{at}/then"), false)?;
                walk(f, else_, &format!("{at}/else"), false)?;
            }
            Op::For { body, .. } => walk(f, body, &format!("{at}/loop"), true)?,
            _ => {}
        }
    }
    Ok(())
}

/// Each product of the body whose A fragment the body defines: from the product around
/// the back edge to the fragment's definition, some wait must retire its group.
fn loop_body(f: &Function, b: &Block, path: &str) -> Result<(), VerifyError> {
    for (u, inst) in b.insts.iter().enumerate() {
        let Op::Wgmma { a, .. } = &inst.op else {
            continue;
        };
        if !matches!(f.ty(*a), Type::Frag(_)) {
            continue;
        }
        let Some(d) = b.insts.iter().position(|i| i.results.contains(a)) else {
            continue;
        };
        let around = b.insts[u + 1..].iter().chain(&b.insts[..d]);
        if !retired(around.map(|i| &i.op)) {
            let problem = InstProblem::PendingFragment {
                frag: a.to_string(),
            };
            return Err(inst_error(f, inst, &format!("{path}[{u}]"), problem));
        }
    }
    Ok(())
}

/// Whether, along `ops` after a product, a wait retires the group it belongs to: the
/// first commit closes it, later commits are newer groups, and `wait_group n` retires
/// all but the newest `n`.
fn retired<'a>(ops: impl Iterator<Item = &'a Op>) -> bool {
    let mut newer: Option<u32> = None;
    for op in ops {
        match (op, newer) {
            (Op::WgmmaCommit, None) => newer = Some(0),
            (Op::WgmmaCommit, Some(n)) => newer = Some(n + 1),
            (Op::WgmmaWait { n }, Some(j)) if j >= *n => return true,
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_retires_the_groups_but_the_newest_n() {
        let (c, w) = (Op::WgmmaCommit, |n| Op::WgmmaWait { n });
        assert!(retired([c.clone(), w(0)].iter()));
        assert!(!retired([c.clone(), w(1)].iter()));
        assert!(retired([c.clone(), c.clone(), w(1)].iter()));
        assert!(
            !retired([w(0), c.clone()].iter()),
            "a wait before the commit"
        );
        assert!(!retired(std::iter::empty()));
    }
}
