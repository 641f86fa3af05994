//! A kernel prepared for interpretation: its blocks in a table, its instructions
//! numbered in program order (depth first, as [`Function::walk`] visits them), a
//! register slot for every part of every value, and the structural checks the
//! interpreter relies on, so that running never indexes past what exists.

use super::InterpError;
use crate::func::{Block, Function, Inst, Value};
use crate::ops::{Op, UnOp};
use crate::types::{Scalar, Type};

/// Where a value lives in a warp's register file: `parts` consecutive slots of 32
/// lanes from `base`, each holding one element of type `elem` (zero-extended bits).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ValInfo {
    pub base: u32,
    pub parts: u32,
    pub elem: Scalar,
}

pub(crate) struct CBlock<'f> {
    pub insts: Vec<CInst<'f>>,
}

pub(crate) struct CInst<'f> {
    /// Position in program order.
    pub id: u32,
    pub inst: &'f Inst,
    /// Block indices of the nested blocks: `[then, else]` of an `If`, `[body, _]` of a
    /// `For`.
    pub sub: [usize; 2],
}

pub(crate) struct Program<'f> {
    pub f: &'f Function,
    /// Block 0 is the function body.
    pub blocks: Vec<CBlock<'f>>,
    vals: Vec<ValInfo>,
    /// Register slots per lane.
    pub slots: usize,
    /// Whether the kernel needs the fragment layout tables (`mma`, `ldmatrix`).
    pub uses_layout: bool,
    /// Byte offset of each shared declaration.
    pub shared_offsets: Vec<u64>,
}

/// The element type and number of parts a value of type `t` occupies.
pub(crate) fn parts_of(t: Type) -> (Scalar, u32) {
    match t {
        Type::Scalar(s) => (s, 1),
        Type::Vec(s, n) => (s, n as u32),
        Type::Ptr(..) => (Scalar::U64, 1),
        Type::Frag(f) => (f.reg_type(), f.regs()),
    }
}

/// The enclosing construct of a block being compiled.
#[derive(Clone, Copy)]
enum Nest<'f> {
    Body,
    If(&'f Inst),
    For(&'f Inst),
}

impl<'f> Program<'f> {
    pub fn new(f: &'f Function) -> Result<Program<'f>, InterpError> {
        let mut vals = Vec::with_capacity(f.values.len());
        let mut slots = 0u32;
        for t in &f.values {
            let (elem, parts) = parts_of(*t);
            vals.push(ValInfo {
                base: slots,
                parts,
                elem,
            });
            slots += parts;
        }
        let mut p = Program {
            f,
            blocks: vec![],
            vals,
            slots: slots as usize,
            uses_layout: false,
            shared_offsets: f.shared_offsets(),
        };
        let mut next_id = 0;
        p.add_block(&f.body, Nest::Body, &mut next_id)?;
        Ok(p)
    }

    pub fn info(&self, v: Value) -> ValInfo {
        self.vals[v.index()]
    }

    pub fn ty(&self, v: Value) -> Type {
        self.f.values[v.index()]
    }

    fn malformed(&self, problem: String) -> InterpError {
        InterpError::Malformed {
            kernel: self.f.name.clone(),
            problem,
        }
    }

    fn add_block(
        &mut self,
        b: &'f Block,
        nest: Nest<'f>,
        next_id: &mut u32,
    ) -> Result<usize, InterpError> {
        let index = self.blocks.len();
        self.blocks.push(CBlock { insts: vec![] });
        self.check_values(&b.args, "block argument")?;
        if !matches!(nest, Nest::Body) {
            match b.insts.last().map(|i| &i.op) {
                Some(Op::Yield(_) | Op::Return) => {}
                _ => {
                    return Err(
                        self.malformed("a nested block does not end with yield or return".into())
                    )
                }
            }
        }
        let mut insts = Vec::with_capacity(b.insts.len());
        for (pos, inst) in b.insts.iter().enumerate() {
            let id = *next_id;
            *next_id += 1;
            let at = |p: &Self, what: String| {
                p.malformed(format!("instruction #{id} `{}`: {what}", p.mnemonic(inst)))
            };
            self.check_values(&inst.results, "result")
                .map_err(|_| at(self, "result out of range".into()))?;
            self.check_values(&inst.op.operands(), "operand")
                .map_err(|_| at(self, "operand out of range".into()))?;
            self.check_inst(inst, nest, pos + 1 == b.insts.len())
                .map_err(|e| at(self, e))?;
            let mut sub = [0, 0];
            match &inst.op {
                Op::If { then_, else_, .. } => {
                    sub[0] = self.add_block(then_, Nest::If(inst), next_id)?;
                    sub[1] = self.add_block(else_, Nest::If(inst), next_id)?;
                }
                Op::For { body, .. } => sub[0] = self.add_block(body, Nest::For(inst), next_id)?,
                Op::Mma { .. } | Op::Wgmma { .. } | Op::LdMatrix { .. } => self.uses_layout = true,
                _ => {}
            }
            insts.push(CInst { id, inst, sub });
        }
        self.blocks[index].insts = insts;
        Ok(index)
    }

    fn check_values(&self, vs: &[Value], what: &str) -> Result<(), InterpError> {
        match vs.iter().find(|v| v.index() >= self.vals.len()) {
            Some(v) => Err(self.malformed(format!("{what} {v} is not a value of the kernel"))),
            None => Ok(()),
        }
    }

    fn types(&self, vs: &[Value]) -> Vec<Type> {
        vs.iter().map(|v| self.ty(*v)).collect()
    }

    /// Result counts, indices into the kernel's tables, terminator placement and the
    /// types of values handed between blocks.
    fn check_inst(&self, inst: &Inst, nest: Nest<'f>, last: bool) -> Result<(), String> {
        let n = inst.results.len();
        let want = |k: usize| {
            if n == k {
                Ok(())
            } else {
                Err(format!("defines {n} values, expected {k}"))
            }
        };
        match &inst.op {
            Op::Store { .. }
            | Op::Barrier
            | Op::Fence { .. }
            | Op::CpAsync { .. }
            | Op::CpAsyncCommit
            | Op::CpAsyncWait { .. }
            | Op::WgmmaFence
            | Op::WgmmaCommit
            | Op::WgmmaWait { .. }
            | Op::FenceProxyAsync
            | Op::MbarrierInit { .. }
            | Op::MbarrierArrive { .. }
            | Op::MbarrierWait { .. }
            | Op::CpAsyncMbarrierArrive { .. }
            | Op::Return => want(0),
            Op::Yield(vals) => {
                want(0)?;
                if !last {
                    return Err("yield is not the last instruction of its block".into());
                }
                let expected = match nest {
                    Nest::Body => return Err("yield outside an if or for".into()),
                    Nest::If(i) => self.types(&i.results),
                    Nest::For(i) => match &i.op {
                        Op::For { init, .. } => self.types(init),
                        _ => vec![],
                    },
                };
                if self.types(vals) != expected {
                    return Err(format!(
                        "yields {:?}, the construct carries {expected:?}",
                        self.types(vals)
                    ));
                }
                Ok(())
            }
            Op::If { results, .. } => {
                if self.types(&inst.results) != *results {
                    return Err("results do not match the declared result types".into());
                }
                Ok(())
            }
            Op::For { lo, init, body, .. } => {
                let carried = self.types(init);
                if self.types(&inst.results) != carried {
                    return Err("results do not match the carried values".into());
                }
                let mut args = vec![self.ty(*lo)];
                args.extend(carried);
                if body.args.iter().any(|v| v.index() >= self.vals.len())
                    || self.types(&body.args) != args
                {
                    return Err(
                        "body arguments are not [induction variable, carried values...]".into(),
                    );
                }
                Ok(())
            }
            Op::Param(i) if *i as usize >= self.f.params.len() => {
                Err(format!("parameter {i} does not exist"))
            }
            Op::SharedAddr { decl } if *decl as usize >= self.f.shared.len() => {
                Err(format!("shared declaration {decl} does not exist"))
            }
            Op::Select { a, b, .. } => {
                want(1)?;
                let t = self.ty(inst.results[0]);
                if self.ty(*a) != t || self.ty(*b) != t {
                    return Err("operands and result differ in type".into());
                }
                Ok(())
            }
            Op::Shfl { value, .. } => {
                want(1)?;
                if self.ty(*value) != self.ty(inst.results[0]) {
                    return Err("value and result differ in type".into());
                }
                Ok(())
            }
            _ => want(1),
        }
    }

    /// A short name of the instruction with its types, e.g. `add.rn.f32`, for errors.
    pub fn mnemonic(&self, inst: &Inst) -> String {
        let ty = |v: &Value| match self.f.values.get(v.index()) {
            Some(t) => t.to_string(),
            None => "?".to_string(),
        };
        let space = |v: &Value| match self.f.values.get(v.index()) {
            Some(Type::Ptr(s, _)) => s.name(),
            _ => "?",
        };
        let rnd =
            |r: Option<crate::ops::Round>| r.map(|r| format!(".{}", r.name())).unwrap_or_default();
        match &inst.op {
            Op::Const { ty, .. } => format!("const.{ty}"),
            Op::Param(i) => format!("param {i}"),
            Op::Special(s) => format!("mov %{}", s.name()),
            Op::Bin { op, rnd: r, a, .. } => format!("{}{}.{}", op.name(), rnd(*r), ty(a)),
            Op::Fma { rnd: r, a, .. } => format!("fma{}.{}", rnd(Some(*r)), ty(a)),
            Op::Dp4a {
                a_signed, b_signed, ..
            } => {
                format!(
                    "dp4a.{}.{}",
                    crate::print::byte_sign(*a_signed),
                    crate::print::byte_sign(*b_signed)
                )
            }
            Op::Un { op, a } => format!("{}.{}", un_mnemonic(*op), ty(a)),
            Op::DivApprox { a, .. } => format!("div.approx.{}", ty(a)),
            Op::Cmp { op, a, .. } => format!("setp.{}.{}", op.name(), ty(a)),
            Op::Select { a, .. } => format!("selp.{}", ty(a)),
            Op::Cvt { to, rnd: r, sat, a } => {
                format!(
                    "cvt{}{}.{to}.{}",
                    rnd(*r),
                    if *sat { ".sat" } else { "" },
                    ty(a)
                )
            }
            Op::Bitcast { to, a } => format!("bitcast.{to}.{}", ty(a)),
            Op::Pack { ty, .. } => format!("pack.{ty}"),
            Op::Extract { a, index } => format!("extract {index} of {}", ty(a)),
            Op::PtrAdd { ptr, .. } => format!("ptradd.{}", ty(ptr)),
            Op::PtrCast { to, ptr } => format!("ptrcast.{to}.{}", ty(ptr)),
            Op::SharedAddr { decl } => match self.f.shared.get(*decl as usize) {
                Some(d) => format!("shared_addr `{}`", d.name),
                None => format!("shared_addr {decl}"),
            },
            Op::Load { ty: t, ptr, .. } => format!("ld.{}.{t}", space(ptr)),
            Op::Store { ptr, value, .. } => format!("st.{}.{}", space(ptr), ty(value)),
            Op::Barrier => "bar.sync 0".into(),
            Op::Fence { scope, .. } => format!("fence.{}", scope.name()),
            Op::Atomic { op, ptr, a, .. } => format!("atom.{}.{}.{}", space(ptr), op.name(), ty(a)),
            Op::Shfl { mode, value, .. } => format!("shfl.sync.{}.{}", mode.name(), ty(value)),
            Op::Vote { mode, .. } => format!("vote.sync.{}", mode.name()),
            Op::Redux { op, value, .. } => format!("redux.sync.{}.{}", op.name(), ty(value)),
            Op::Mma { shape, a, .. } => format!("mma.sync.{}.{}", shape.name(), ty(a)),
            Op::LdMatrix { num, trans, .. } => {
                format!("ldmatrix.x{num}{}", if *trans { ".trans" } else { "" })
            }
            Op::CpAsync { bytes, .. } => format!("cp.async {bytes} bytes"),
            Op::CpAsyncCommit => "cp.async.commit_group".into(),
            Op::CpAsyncWait { n } => format!("cp.async.wait_group {n}"),
            Op::WgmmaDesc { .. } => "wgmma descriptor".into(),
            Op::Wgmma { shape, ab, .. } => format!("wgmma.mma_async.{}.f32.{ab}", shape.name()),
            Op::WgmmaFence => "wgmma.fence".into(),
            Op::WgmmaCommit => "wgmma.commit_group".into(),
            Op::WgmmaWait { n } => format!("wgmma.wait_group {n}"),
            Op::FenceProxyAsync => "fence.proxy.async.shared::cta".into(),
            Op::MbarrierInit { .. } => "mbarrier.init.shared::cta.b64".into(),
            Op::MbarrierArrive { .. } => "mbarrier.arrive.shared::cta.b64".into(),
            Op::MbarrierWait { .. } => "mbarrier.try_wait.parity.shared::cta.b64".into(),
            Op::CpAsyncMbarrierArrive { .. } => {
                "cp.async.mbarrier.arrive.noinc.shared::cta.b64".into()
            }
            Op::If { .. } => "if".into(),
            Op::For { .. } => "for".into(),
            Op::Yield(_) => "yield".into(),
            Op::Return => "ret".into(),
        }
    }
}

/// A unary operation as its PTX instruction is spelled, for [`Program::mnemonic`]: the
/// IR text's spelling ([`crate::print::un_name`]) except where PTX differs: `ex2` and
/// `lg2` flush subnormals (`.ftz`, as the interpreter computes them) and `round.rnd` is
/// `cvt.rndi`.
fn un_mnemonic(op: UnOp) -> String {
    match op {
        UnOp::Ex2Approx | UnOp::Lg2Approx => format!("{}.ftz", crate::print::un_name(op)),
        UnOp::RoundInt(r) => format!("cvt.{}i", r.name()),
        _ => crate::print::un_name(op),
    }
}
