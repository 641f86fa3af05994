//! The verifier: rejects ill-formed kernels and names what it rejected — the kernel,
//! the instruction (in its text form, with its place: `body[4]/then[2]` is the third
//! instruction of the then-branch of the fifth instruction of the body) and why.
//!
//! It checks, in order:
//! - the kernel's header: names, `max_threads` in 1..=1024, parameter types, shared
//!   declarations and their total against [`MAX_STATIC_SHARED_BYTES`];
//! - every instruction: operands defined before use and visible where used (a value
//!   defined in a nested block is not visible after it), each value defined once,
//!   operand and result types per operation (`verify/typing.rs`), block structure (nested
//!   blocks end with exactly one `yield`; `return` only ends the kernel body);
//! - that every value of the kernel is defined by something;
//! - that no barrier sits under control flow that differs between the threads of a
//!   block (`verify/uniform.rs`);
//! - that no loop writes a `wgmma`'s A fragment again while the product may still read
//!   it (`verify/wgmma.rs`).

mod typing;
mod uniform;
mod wgmma;

use crate::func::{Block, Function, Inst, Value, MAX_STATIC_SHARED_BYTES, MAX_THREADS_PER_BLOCK};
use crate::ops::Op;
use crate::print::{inst_header, is_identifier};
use crate::types::{AddrSpace, Scalar, Type};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    /// A problem with the kernel as a whole (its header or value table).
    #[error("kernel `{kernel}`: {problem}")]
    Kernel {
        kernel: String,
        problem: KernelProblem,
    },
    /// A problem with one instruction: `inst` is its text, `at` its place.
    #[error("kernel `{kernel}`: `{inst}` at {at}: {problem}")]
    Inst {
        kernel: String,
        inst: String,
        at: String,
        problem: Box<InstProblem>,
    },
}

impl VerifyError {
    pub fn kernel(&self) -> &str {
        match self {
            VerifyError::Kernel { kernel, .. } | VerifyError::Inst { kernel, .. } => kernel,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelProblem {
    #[error("{what} name {name:?} is not an identifier (ASCII letters, digits and `_`, not starting with a digit)")]
    BadName { what: &'static str, name: String },
    #[error("two {what}s are named `{name}`")]
    DuplicateName { what: &'static str, name: String },
    #[error("max_threads is {0}; it must be in 1..={MAX_THREADS_PER_BLOCK}")]
    MaxThreads(u32),
    #[error("parameter `{name}` has type {ty}; parameters are global pointers or scalars other than pred")]
    ParamType { name: String, ty: Type },
    #[error("shared array `{name}` has element type {elem}, which cannot be stored")]
    SharedElem { name: String, elem: Scalar },
    #[error("shared array `{name}` has length 0 (only a kernel's one shared array may: its dynamic shared memory)")]
    SharedEmpty { name: String },
    #[error(
        "shared array `{name}` has alignment {align}; it must be a power of two and at least {min}"
    )]
    SharedAlign { name: String, align: u32, min: u32 },
    #[error("static shared memory is {used} bytes, over the limit of {limit} bytes")]
    SharedTooLarge { used: u64, limit: u64 },
    #[error("the kernel body has {0} block arguments; only loop bodies take arguments")]
    BodyArgs(usize),
    #[error("{value} (of type {ty}) is not defined by any instruction")]
    NeverDefined { value: Value, ty: Type },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InstProblem {
    // ---- values and scope ----
    #[error("{value} is not a value of this kernel, which has {count} values")]
    NoSuchValue { value: Value, count: usize },
    #[error("{0} is not defined anywhere in the kernel")]
    Undefined(Value),
    #[error("{0} is used before its definition")]
    UseBeforeDef(Value),
    #[error("{0} is defined inside a nested block and is not visible here")]
    OutOfScope(Value),
    #[error("{0} is defined a second time")]
    Redefined(Value),
    #[error("{value} has type {ty}, which is not a valid type: {why}")]
    InvalidType {
        value: Value,
        ty: Type,
        why: &'static str,
    },

    // ---- operation typing ----
    #[error("operand `{role}` ({value}) has type {ty}, expected {expected}")]
    Operand {
        role: String,
        value: Value,
        ty: Type,
        expected: String,
    },
    #[error("`{op}` is not defined on {ty}")]
    NotDefinedOn { op: String, ty: Type },
    #[error("`{op}` needs a rounding mode")]
    RoundingRequired { op: String },
    #[error("`{op}` takes no rounding mode")]
    RoundingNotAllowed { op: String },
    #[error("defines {found} results, expected {expected}")]
    ResultCount { expected: usize, found: usize },
    #[error("result {value} has type {found}, expected {expected}")]
    ResultType {
        value: Value,
        expected: Type,
        found: Type,
    },
    #[error("constants have a scalar type, not {0}")]
    ConstType(Type),
    #[error("constant bits {bits:#x} do not fit in {ty}")]
    ConstBits { bits: u64, ty: Scalar },
    #[error("parameter index {index} is out of range: the kernel has {count} parameters")]
    ParamIndex { index: u32, count: usize },
    #[error("shared array index {index} is out of range: the kernel declares {count}")]
    SharedIndex { index: u32, count: usize },
    #[error("bitcast from {from} ({} bytes) to {to} ({} bytes): sizes differ", from.bytes(), to.bytes())]
    BitcastSize { from: Type, to: Type },
    #[error("{ty} is built from {expected} parts, found {found}")]
    PartCount {
        ty: Type,
        expected: usize,
        found: usize,
    },
    #[error("part index {index} is out of range for {ty}, which has {len} parts")]
    PartIndex { index: u32, ty: Type, len: u32 },
    #[error("{access} of {ty} through {ptr}: the value must be the pointee type or a 2/4-lane vector of it")]
    MemoryType {
        access: &'static str,
        ty: Type,
        ptr: Type,
    },
    #[error("cache operator `.{cache}` {why}")]
    Cache {
        cache: &'static str,
        why: &'static str,
    },
    #[error("a fence with relaxed ordering orders nothing")]
    RelaxedFence,
    #[error("`{op}` takes {expected} operands, found {found}")]
    OperandCount {
        op: String,
        expected: usize,
        found: usize,
    },
    #[error("{what} is {value}; it must be {allowed}")]
    Immediate {
        what: &'static str,
        value: u32,
        allowed: &'static str,
    },
    #[error("ldmatrix .x{num} gives u32 (x1), vec2<u32> (x2), vec4<u32> (x4) or an A/B fragment of {num} registers, not {ty}")]
    LdMatrixType { ty: Type, num: u8 },

    // ---- structure ----
    #[error("`yield` may only end an if-branch or a loop body")]
    MisplacedYield,
    #[error("`return` may only be the last instruction of the kernel body")]
    MisplacedReturn,
    #[error("its {block} does not end with `yield`")]
    MissingYield { block: &'static str },
    #[error("its {block} has {found} block arguments, expected {expected}")]
    BlockArgs {
        block: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("block argument {value} of its {block} has type {found}, expected {expected}")]
    BlockArgType {
        block: &'static str,
        value: Value,
        expected: Type,
        found: Type,
    },
    #[error("yields {found} values, the enclosing {owner} expects {expected}")]
    YieldCount {
        owner: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("yields {value} of type {found}, the enclosing {owner} expects {expected}")]
    YieldType {
        owner: &'static str,
        value: Value,
        expected: Type,
        found: Type,
    },
    #[error("barrier under control flow that differs between threads of a block: {construct} depends on `{root}`")]
    DivergentBarrier { construct: String, root: String },
    #[error(
        "the loop's next iteration defines this wgmma's A fragment `{frag}` again while the \
         product may still be reading it (no wgmma.wait_group on the way retires its group): \
         give consecutive iterations' fragments values of their own (two steps a loop \
         body) or wait for the group"
    )]
    PendingFragment { frag: String },
}

/// Check `f`; the first problem found is returned.
pub fn verify(f: &Function) -> Result<(), VerifyError> {
    check_header(f).map_err(|problem| VerifyError::Kernel {
        kernel: f.name.clone(),
        problem,
    })?;
    let mut w = Walker {
        f,
        state: vec![Def::Unseen; f.values.len()],
        defined: defined_values(f),
    };
    w.block(&f.body, Region::Body, "body", Vec::new(), &[])?;
    if let Some(i) = w.state.iter().position(|s| *s == Def::Unseen) {
        let problem = KernelProblem::NeverDefined {
            value: Value(i as u32),
            ty: f.values[i],
        };
        return Err(VerifyError::Kernel {
            kernel: f.name.clone(),
            problem,
        });
    }
    uniform::check_barriers(f)?;
    wgmma::check_fragments(f)
}

fn check_header(f: &Function) -> Result<(), KernelProblem> {
    check_name("kernel", &f.name)?;
    if f.max_threads == 0 || f.max_threads > MAX_THREADS_PER_BLOCK {
        return Err(KernelProblem::MaxThreads(f.max_threads));
    }
    for (i, p) in f.params.iter().enumerate() {
        check_name("parameter", &p.name)?;
        if f.params[..i].iter().any(|q| q.name == p.name) {
            return Err(KernelProblem::DuplicateName {
                what: "parameter",
                name: p.name.clone(),
            });
        }
        let ok = match p.ty {
            Type::Scalar(s) => s != Scalar::Pred,
            Type::Ptr(AddrSpace::Global, e) => e != Scalar::Pred,
            _ => false,
        };
        if !ok {
            return Err(KernelProblem::ParamType {
                name: p.name.clone(),
                ty: p.ty,
            });
        }
    }
    for (i, d) in f.shared.iter().enumerate() {
        check_name("shared array", &d.name)?;
        if f.shared[..i].iter().any(|e| e.name == d.name) {
            return Err(KernelProblem::DuplicateName {
                what: "shared array",
                name: d.name.clone(),
            });
        }
        if d.elem == Scalar::Pred {
            return Err(KernelProblem::SharedElem {
                name: d.name.clone(),
                elem: d.elem,
            });
        }
        // A kernel's one array may have length 0: it is then all dynamic shared memory.
        if d.len == 0 && f.shared.len() > 1 {
            return Err(KernelProblem::SharedEmpty {
                name: d.name.clone(),
            });
        }
        if !d.align.is_power_of_two() || d.align < d.elem.bytes() {
            return Err(KernelProblem::SharedAlign {
                name: d.name.clone(),
                align: d.align,
                min: d.elem.bytes(),
            });
        }
    }
    let used = f.shared_bytes();
    if used > MAX_STATIC_SHARED_BYTES {
        return Err(KernelProblem::SharedTooLarge {
            used,
            limit: MAX_STATIC_SHARED_BYTES,
        });
    }
    if !f.body.args.is_empty() {
        return Err(KernelProblem::BodyArgs(f.body.args.len()));
    }
    Ok(())
}

fn check_name(what: &'static str, name: &str) -> Result<(), KernelProblem> {
    if is_identifier(name) {
        Ok(())
    } else {
        Err(KernelProblem::BadName {
            what,
            name: name.to_string(),
        })
    }
}

/// Which values some instruction or block argument defines.
fn defined_values(f: &Function) -> Vec<bool> {
    let mut d = vec![false; f.values.len()];
    let mut mark = |vals: &[Value]| {
        for v in vals {
            if let Some(x) = d.get_mut(v.index()) {
                *x = true;
            }
        }
    };
    f.walk(&mut |inst| {
        mark(&inst.results);
        match &inst.op {
            Op::If { then_, else_, .. } => {
                mark(&then_.args);
                mark(&else_.args);
            }
            Op::For { body, .. } => mark(&body.args),
            _ => {}
        }
    });
    d
}

/// Where a value stands during the walk.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Def {
    Unseen,
    /// Defined and visible.
    Live,
    /// Defined in a block that has ended.
    Dead,
}

#[derive(Clone, Copy, PartialEq)]
enum Region {
    Body,
    Then,
    Else,
    Loop,
}

impl Region {
    fn name(self) -> &'static str {
        match self {
            Region::Body => "kernel body",
            Region::Then => "then-branch",
            Region::Else => "else-branch",
            Region::Loop => "loop body",
        }
    }

    fn owner(self) -> &'static str {
        if self == Region::Loop {
            "for"
        } else {
            "if"
        }
    }
}

fn inst_error(f: &Function, inst: &Inst, at: &str, problem: InstProblem) -> VerifyError {
    VerifyError::Inst {
        kernel: f.name.clone(),
        inst: inst_header(f, inst),
        at: at.to_string(),
        problem: Box::new(problem),
    }
}

struct Walker<'a> {
    f: &'a Function,
    state: Vec<Def>,
    defined: Vec<bool>,
}

impl Walker<'_> {
    fn use_value(&self, v: Value) -> Result<(), InstProblem> {
        match self.state.get(v.index()) {
            Some(Def::Live) => Ok(()),
            Some(Def::Dead) => Err(InstProblem::OutOfScope(v)),
            Some(Def::Unseen) if self.defined[v.index()] => Err(InstProblem::UseBeforeDef(v)),
            Some(Def::Unseen) => Err(InstProblem::Undefined(v)),
            None => Err(InstProblem::NoSuchValue {
                value: v,
                count: self.state.len(),
            }),
        }
    }

    /// Define `v` in `scope`, with a valid type.
    fn define(&mut self, v: Value, scope: &mut Vec<Value>) -> Result<Type, InstProblem> {
        let count = self.state.len();
        let Some(state) = self.state.get_mut(v.index()) else {
            return Err(InstProblem::NoSuchValue { value: v, count });
        };
        if *state != Def::Unseen {
            return Err(InstProblem::Redefined(v));
        }
        *state = Def::Live;
        scope.push(v);
        let ty = self.f.values[v.index()];
        match typing::type_problem(ty) {
            Some(why) => Err(InstProblem::InvalidType { value: v, ty, why }),
            None => Ok(ty),
        }
    }

    /// Walk block `b`; `scope` holds its arguments, already defined by the caller, and
    /// its `yield` must hand over values of `yield_types`.
    fn block(
        &mut self,
        b: &Block,
        region: Region,
        path: &str,
        mut scope: Vec<Value>,
        yield_types: &[Type],
    ) -> Result<(), VerifyError> {
        let last = b.insts.len().saturating_sub(1);
        for (i, inst) in b.insts.iter().enumerate() {
            let at = format!("{path}[{i}]");
            let f = self.f;
            let fail = |problem| inst_error(f, inst, &at, problem);
            match inst.op {
                Op::Yield(_) if region == Region::Body || i != last => {
                    return Err(fail(InstProblem::MisplacedYield))
                }
                Op::Return if region != Region::Body || i != last => {
                    return Err(fail(InstProblem::MisplacedReturn))
                }
                _ => {}
            }
            for v in inst.op.operands() {
                self.use_value(v).map_err(fail)?;
            }
            let expected = typing::result_types(self.f, &inst.op).map_err(fail)?;
            match &inst.op {
                Op::If {
                    results,
                    then_,
                    else_,
                    ..
                } => {
                    for (blk, r) in [(then_, Region::Then), (else_, Region::Else)] {
                        self.nested(inst, &at, blk, r, &[], results)?;
                    }
                }
                Op::For { lo, init, body, .. } => {
                    let mut arg_types = vec![self.f.values[lo.index()]];
                    arg_types.extend(init.iter().map(|v| self.f.values[v.index()]));
                    self.nested(inst, &at, body, Region::Loop, &arg_types, &expected)?;
                }
                Op::Yield(vals) => self.check_yield(vals, region, yield_types).map_err(fail)?,
                _ => {}
            }
            if inst.results.len() != expected.len() {
                return Err(fail(InstProblem::ResultCount {
                    expected: expected.len(),
                    found: inst.results.len(),
                }));
            }
            for (r, want) in inst.results.iter().zip(&expected) {
                let found = self.define(*r, &mut scope).map_err(fail)?;
                if found != *want {
                    return Err(fail(InstProblem::ResultType {
                        value: *r,
                        expected: *want,
                        found,
                    }));
                }
            }
        }
        for v in scope {
            self.state[v.index()] = Def::Dead;
        }
        Ok(())
    }

    /// A nested block of `inst`: its arguments must have `arg_types`, it must end with
    /// a `yield` of `yield_types`.
    fn nested(
        &mut self,
        inst: &Inst,
        at: &str,
        b: &Block,
        region: Region,
        arg_types: &[Type],
        yield_types: &[Type],
    ) -> Result<(), VerifyError> {
        let block = region.name();
        let f = self.f;
        let fail = |problem| inst_error(f, inst, at, problem);
        if b.args.len() != arg_types.len() {
            return Err(fail(InstProblem::BlockArgs {
                block,
                expected: arg_types.len(),
                found: b.args.len(),
            }));
        }
        if !matches!(
            b.insts.last(),
            Some(Inst {
                op: Op::Yield(_),
                ..
            })
        ) {
            return Err(fail(InstProblem::MissingYield { block }));
        }
        let mut scope = vec![];
        for (a, want) in b.args.iter().zip(arg_types) {
            let found = self.define(*a, &mut scope).map_err(fail)?;
            if found != *want {
                return Err(fail(InstProblem::BlockArgType {
                    block,
                    value: *a,
                    expected: *want,
                    found,
                }));
            }
        }
        let suffix = match region {
            Region::Then => "then",
            Region::Else => "else",
            _ => "loop",
        };
        self.block(b, region, &format!("{at}/{suffix}"), scope, yield_types)
    }

    fn check_yield(
        &self,
        vals: &[Value],
        region: Region,
        want: &[Type],
    ) -> Result<(), InstProblem> {
        let owner = region.owner();
        if vals.len() != want.len() {
            return Err(InstProblem::YieldCount {
                owner,
                expected: want.len(),
                found: vals.len(),
            });
        }
        for (v, t) in vals.iter().zip(want) {
            // Operands were checked to be defined, so `v` indexes the value table.
            let found = self.f.values[v.index()];
            if found != *t {
                return Err(InstProblem::YieldType {
                    owner,
                    value: *v,
                    expected: *t,
                    found,
                });
            }
        }
        Ok(())
    }
}
