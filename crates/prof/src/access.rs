//! Which pointer parameters a kernel reads and writes memory through, and whether at
//! addresses computed from data the kernel itself loaded (a gather or scatter: an
//! embedding row picked by a token id, a KV cache block picked from a block table).
//!
//! A byte count per dispatch needs this: a kernel that walks a weight matrix reads all of
//! it, one that gathers from a table reads what the loaded indices pick.

use quench_ir::{Block, Function, Op, Type, Value};

/// How a kernel reaches memory through one parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    #[default]
    None,
    /// Only at addresses computed from loaded data.
    Indirect,
    /// At least once at an address computed from parameters, ids, constants and loop
    /// counters alone.
    Direct,
}

/// What a kernel does through one parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamAccess {
    pub read: Access,
    pub write: Access,
}

/// Per value: which parameters it derives from (a bit set) and whether it depends on
/// loaded data.
struct Flow {
    words: usize,
    roots: Vec<u64>,
    loaded: Vec<bool>,
}

impl Flow {
    fn roots(&self, v: Value) -> &[u64] {
        &self.roots[v.index() * self.words..(v.index() + 1) * self.words]
    }

    /// Merge `from`'s roots and loaded flag into `to`; whether `to` changed.
    fn join(&mut self, to: Value, from: Value) -> bool {
        let mut changed = false;
        for w in 0..self.words {
            let r = self.roots[from.index() * self.words + w];
            let t = &mut self.roots[to.index() * self.words + w];
            changed |= *t | r != *t;
            *t |= r;
        }
        if self.loaded[from.index()] && !self.loaded[to.index()] {
            self.loaded[to.index()] = true;
            changed = true;
        }
        changed
    }

    fn mark_loaded(&mut self, v: Value) -> bool {
        !std::mem::replace(&mut self.loaded[v.index()], true)
    }

    fn mark_param(&mut self, v: Value, param: u32) -> bool {
        let (w, bit) = (
            v.index() * self.words + param as usize / 64,
            1u64 << (param % 64),
        );
        let changed = self.roots[w] & bit == 0;
        self.roots[w] |= bit;
        changed
    }
}

fn yielded(b: &Block) -> &[Value] {
    match b.insts.last().map(|i| &i.op) {
        Some(Op::Yield(v)) => v,
        _ => &[],
    }
}

/// One pass of propagation over `b`; whether anything changed.
fn propagate(flow: &mut Flow, b: &Block) -> bool {
    let mut changed = false;
    for inst in &b.insts {
        match &inst.op {
            Op::Param(i) => changed |= inst.results.iter().any(|&r| flow.mark_param(r, *i)),
            Op::Load { .. } | Op::Atomic { .. } | Op::LdMatrix { .. } => {
                for &r in &inst.results {
                    changed |= flow.mark_loaded(r);
                }
            }
            Op::If { then_, else_, .. } => {
                changed |= propagate(flow, then_) | propagate(flow, else_);
                for (i, &r) in inst.results.iter().enumerate() {
                    for branch in [then_, else_] {
                        if let Some(&y) = yielded(branch).get(i) {
                            changed |= flow.join(r, y);
                        }
                    }
                }
            }
            Op::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                if let Some(&iv) = body.args.first() {
                    for bound in [lo, hi, step] {
                        changed |= flow.join(iv, *bound);
                    }
                }
                for (k, &x) in init.iter().enumerate() {
                    if let Some(&arg) = body.args.get(k + 1) {
                        changed |= flow.join(arg, x);
                    }
                }
                changed |= propagate(flow, body);
                let next = yielded(body).to_vec();
                for (k, &y) in next.iter().enumerate() {
                    if let Some(&arg) = body.args.get(k + 1) {
                        changed |= flow.join(arg, y);
                    }
                    if let (Some(&r), Some(&x)) = (inst.results.get(k), init.get(k)) {
                        changed |= flow.join(r, x) | flow.join(r, y);
                    }
                }
            }
            op => {
                for &r in &inst.results {
                    for x in op.operands() {
                        changed |= flow.join(r, x);
                    }
                }
            }
        }
    }
    changed
}

/// Count one access through `ptr` against the parameters its address derives from.
fn note(flow: &Flow, out: &mut [ParamAccess], ptr: Value, read: bool, write: bool) {
    let how = if flow.loaded[ptr.index()] {
        Access::Indirect
    } else {
        Access::Direct
    };
    for (p, acc) in out.iter_mut().enumerate() {
        if flow.roots(ptr)[p / 64] & (1 << (p % 64)) != 0 {
            if read {
                acc.read = acc.read.max(how);
            }
            if write {
                acc.write = acc.write.max(how);
            }
        }
    }
}

/// Record each memory access of `b`.
fn record(flow: &Flow, b: &Block, out: &mut [ParamAccess]) {
    for inst in &b.insts {
        match &inst.op {
            Op::Load { ptr, .. } | Op::LdMatrix { ptr, .. } => note(flow, out, *ptr, true, false),
            Op::Store { ptr, .. } => note(flow, out, *ptr, false, true),
            Op::Atomic { ptr, .. } => note(flow, out, *ptr, true, true),
            Op::CpAsync { dst, src, .. } => {
                note(flow, out, *src, true, false);
                note(flow, out, *dst, false, true);
            }
            Op::If { then_, else_, .. } => {
                record(flow, then_, out);
                record(flow, else_, out);
            }
            Op::For { body, .. } => record(flow, body, out),
            _ => {}
        }
    }
}

/// How `f` reaches memory through each of its parameters, in parameter order (scalar
/// parameters always [`Access::None`]). A data dependence through memory the kernel
/// wrote itself (shared memory included) counts as loaded data.
pub fn param_access(f: &Function) -> Vec<ParamAccess> {
    let words = f.params.len().div_ceil(64).max(1);
    let mut flow = Flow {
        words,
        roots: vec![0; f.values.len() * words],
        loaded: vec![false; f.values.len()],
    };
    while propagate(&mut flow, &f.body) {}
    let mut out = vec![ParamAccess::default(); f.params.len()];
    record(&flow, &f.body, &mut out);
    for (acc, p) in out.iter_mut().zip(&f.params) {
        if !matches!(p.ty, Type::Ptr(..)) {
            *acc = ParamAccess::default();
        }
    }
    out
}
