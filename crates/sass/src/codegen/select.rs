//! Instruction selection: each IR operation as the sm_90 instructions that compute it,
//! in the forms of the encoding tables (those ptxas emits), as SASS text.

use quench_ir::{
    AddrSpace, BinOp, Block, CacheOp, CmpOp, Function, Op, Round, Scalar, Special, Type, Value,
};

use super::control::control;
use super::refuse;
use super::regs::{Loc, Registers};
use crate::cubin::PARAM_BASE;
use crate::error::Result;

/// The uniform register pair holding the global memory descriptor, loaded once at entry
/// from `c[0x0][0x208]`, as ptxas does.
const DESC: &str = "UR4";
/// Barrier registers for `if` reconvergence (B0–B15): one per nesting level.
const MAX_NESTING: usize = 16;

/// One line of the kernel's code: a label or an instruction.
enum Line {
    Label(String),
    Inst { guard: String, text: String },
}

pub struct Selector<'f> {
    f: &'f Function,
    regs: Registers,
    lines: Vec<Line>,
    labels: u32,
    depth: usize,
    /// Each parameter's offset in constant bank 0.
    param_offsets: Vec<u32>,
}

/// How an integer or float type is handled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    U32,
    S32,
    F32,
}

impl<'f> Selector<'f> {
    pub fn new(f: &'f Function) -> Result<Selector<'f>> {
        let mut offset = PARAM_BASE;
        let mut param_offsets = Vec::new();
        for p in &f.params {
            let size = p.ty.bytes();
            offset = offset.next_multiple_of(size.max(1));
            param_offsets.push(offset);
            offset += size;
        }
        let mut s = Selector {
            f,
            regs: Registers::new(f),
            lines: Vec::new(),
            labels: 0,
            depth: 0,
            param_offsets,
        };
        s.emit("", format!("ULDC.64 {DESC}, c[0x0][0x208]"));
        Ok(s)
    }

    /// Selects the kernel's body, then ends it with `EXIT`.
    pub fn body(&mut self) -> Result<()> {
        self.block(&self.f.body)?;
        self.emit("", "EXIT".into());
        Ok(())
    }

    /// The kernel as text: its ABI, then its code, padded to 128 bytes as ptxas pads it
    /// (a branch to itself, then `NOP`s).
    pub fn finish(mut self) -> String {
        let end = self.label();
        self.lines.push(Line::Label(end.clone()));
        self.emit("", format!("BRA `({end})"));
        while self
            .lines
            .iter()
            .filter(|l| matches!(l, Line::Inst { .. }))
            .count()
            % 8
            != 0
        {
            self.emit("", "NOP".into());
        }
        let f = self.f;
        let mut out = format!(
            ".kernel {}\n.registers {}\n.maxntid {} 1 1\n",
            f.name,
            self.regs.used(),
            f.max_threads
        );
        for p in &f.params {
            let (size, log_align, space) = match p.ty {
                Type::Ptr(_, elem) => (8, elem.bytes().max(1).trailing_zeros(), 4),
                t => (t.bytes(), 0, 0),
            };
            out += &format!(".param {size} {size} {log_align} {space}\n");
        }
        out += &format!("{}:\n", f.name);
        let mut after_variable = false;
        for line in &self.lines {
            match line {
                Line::Label(l) => {
                    out += &format!("{l}:\n");
                    // Reached from elsewhere too: wait for whatever may be in flight.
                    after_variable = true;
                }
                Line::Inst { guard, text } => {
                    let mnemonic = text.split_whitespace().next().unwrap_or("");
                    let c = control(mnemonic, after_variable);
                    after_variable = c.write_barrier != 7 || c.read_barrier != 7;
                    out += &format!("        {guard}{text} ;  /* {} */\n", c.text());
                }
            }
        }
        out
    }

    fn emit(&mut self, guard: &str, text: String) {
        self.lines.push(Line::Inst {
            guard: guard.to_string(),
            text,
        });
    }

    fn label(&mut self) -> String {
        self.labels += 1;
        format!(".L_q_{}", self.labels - 1)
    }

    fn block(&mut self, b: &Block) -> Result<()> {
        if !b.args.is_empty() {
            return Err(refuse(
                self.f,
                "block arguments (for loops) are not compiled yet",
            ));
        }
        for inst in &b.insts {
            self.inst(&inst.results, &inst.op)?;
        }
        Ok(())
    }

    fn reg(&self, v: Value) -> Result<String> {
        Ok(self.regs.loc(self.f, v)?.reg(0))
    }

    fn kind(&self, v: Value, what: &str) -> Result<Kind> {
        match self.f.ty(v) {
            Type::Scalar(Scalar::U32) => Ok(Kind::U32),
            Type::Scalar(Scalar::I32) => Ok(Kind::S32),
            Type::Scalar(Scalar::F32) => Ok(Kind::F32),
            t => Err(refuse(
                self.f,
                format!("{what} on {t:?} is not compiled yet"),
            )),
        }
    }

    fn inst(&mut self, results: &[Value], op: &Op) -> Result<()> {
        let f = self.f;
        let result = results.first().copied();
        let def = |s: &mut Self| -> Result<String> {
            let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
            Ok(s.regs.define(f, v)?.reg(0))
        };
        match op {
            Op::Param(i) => {
                let at = self.param_offsets[*i as usize];
                let width = f.params[*i as usize].ty.bytes();
                let d = def(self)?;
                let ldc = if width == 8 { "LDC.64" } else { "LDC" };
                self.emit("", format!("{ldc} {d}, c[0x0][{at:#x}]"));
            }
            Op::Special(s) => {
                let line = |d: &str| match s {
                    Special::TidX => Some(format!("S2R {d}, SR_TID.X")),
                    Special::CtaidX => Some(format!("S2R {d}, SR_CTAID.X")),
                    Special::CtaidY => Some(format!("S2R {d}, SR_CTAID.Y")),
                    Special::CtaidZ => Some(format!("S2R {d}, SR_CTAID.Z")),
                    // The launch's dimensions in constant bank 0: blockDim from 0x0,
                    // gridDim from 0xc.
                    Special::NtidX => Some(format!("LDC {d}, c[0x0][0x0]")),
                    Special::NtidY => Some(format!("LDC {d}, c[0x0][0x4]")),
                    Special::NtidZ => Some(format!("LDC {d}, c[0x0][0x8]")),
                    Special::NctaidX => Some(format!("LDC {d}, c[0x0][0xc]")),
                    Special::NctaidY => Some(format!("LDC {d}, c[0x0][0x10]")),
                    Special::NctaidZ => Some(format!("LDC {d}, c[0x0][0x14]")),
                    _ => None,
                };
                if line("").is_none() {
                    return Err(refuse(
                        f,
                        format!("special register {} is not compiled yet", s.name()),
                    ));
                }
                let d = def(self)?;
                self.emit("", line(&d).unwrap_or_default());
            }
            Op::Const { ty, bits } => {
                if ty.bytes() != 4 || !matches!(ty, Type::Scalar(_)) {
                    return Err(refuse(
                        f,
                        format!("a constant of type {ty:?} is not compiled yet"),
                    ));
                }
                let d = def(self)?;
                self.emit("", format!("MOV {d}, {:#x}", *bits as u32));
            }
            Op::Bin { op, rnd, a, b } => self.bin(result, *op, *rnd, *a, *b)?,
            Op::Fma { rnd, a, b, c } => {
                self.kind(*a, "fma")?;
                let suffix = match rnd {
                    Round::Rn => "",
                    Round::Rz => ".RZ",
                    Round::Rm => ".RM",
                    Round::Rp => ".RP",
                };
                let (a, b, c) = (self.reg(*a)?, self.reg(*b)?, self.reg(*c)?);
                let d = def(self)?;
                self.emit("", format!("FFMA{suffix} {d}, {a}, {b}, {c}"));
            }
            Op::Cmp { op, a, b } => self.cmp(result, *op, *a, *b)?,
            Op::Select { cond, a, b } => {
                let (p, a_reg, b_reg) = (self.reg(*cond)?, self.reg(*a)?, self.reg(*b)?);
                if f.ty(*a).bytes() != 4 {
                    return Err(refuse(
                        f,
                        "select of a value wider than 32 bits is not compiled yet",
                    ));
                }
                let (a, b) = (a_reg, b_reg);
                let d = def(self)?;
                self.emit("", format!("SEL {d}, {a}, {b}, {p}"));
            }
            Op::PtrAdd { ptr, index } => {
                let elem = match f.ty(*ptr) {
                    Type::Ptr(AddrSpace::Global, elem) => elem,
                    t => return Err(refuse(f, format!("ptr_add on {t:?} is not compiled yet"))),
                };
                if self.kind(*index, "ptr_add")? != Kind::U32 {
                    return Err(refuse(f, "ptr_add with a signed index is not compiled yet"));
                }
                let (p, i) = (self.reg(*ptr)?, self.reg(*index)?);
                let d = def(self)?;
                self.emit(
                    "",
                    format!("IMAD.WIDE.U32 {d}, {i}, {:#x}, {p}", elem.bytes()),
                );
            }
            Op::Load { ty, ptr, cache } => {
                let width = self.access(*ptr, *ty, "load")?;
                let cache = match cache {
                    CacheOp::Default => "",
                    CacheOp::Nc => ".CONSTANT",
                    other => {
                        return Err(refuse(
                            f,
                            format!(
                                "a load with cache operator .{} is not compiled yet",
                                other.name()
                            ),
                        ))
                    }
                };
                let p = self.reg(*ptr)?;
                let d = def(self)?;
                self.emit("", format!("LDG.E{width}{cache} {d}, desc[{DESC}][{p}.64]"));
            }
            Op::Store { ptr, value, cache } => {
                let width = self.access(*ptr, f.ty(*value), "store")?;
                if *cache != CacheOp::Default {
                    return Err(refuse(
                        f,
                        format!(
                            "a store with cache operator .{} is not compiled yet",
                            cache.name()
                        ),
                    ));
                }
                let (p, v) = (self.reg(*ptr)?, self.reg(*value)?);
                self.emit("", format!("STG.E{width} desc[{DESC}][{p}.64], {v}"));
            }
            Op::Extract { a, index } => {
                let Loc::R { base, .. } = self.regs.loc(f, *a)? else {
                    return Err(refuse(f, "extract from a predicate"));
                };
                let v = result.ok_or_else(|| refuse(f, "extract without its result"))?;
                self.regs.alias(
                    v,
                    Loc::R {
                        base: base + index,
                        count: 1,
                    },
                );
            }
            Op::Pack { parts, .. } => {
                let sources = parts
                    .iter()
                    .map(|p| self.reg(*p))
                    .collect::<Result<Vec<_>>>()?;
                let v = result.ok_or_else(|| refuse(f, "pack without its result"))?;
                let loc = self.regs.define(f, v)?;
                for (i, s) in sources.iter().enumerate() {
                    self.emit("", format!("MOV {}, {s}", loc.reg(i as u32)));
                }
            }
            Op::Bitcast { to, a } if to.bytes() == f.ty(*a).bytes() => {
                let v = result.ok_or_else(|| refuse(f, "bitcast without its result"))?;
                let loc = self.regs.loc(f, *a)?;
                self.regs.alias(v, loc);
            }
            Op::If {
                cond,
                then_,
                else_,
                results: types,
            } => {
                if !types.is_empty() {
                    return Err(refuse(f, "an if with results is not compiled yet"));
                }
                self.if_(*cond, then_, else_)?;
            }
            Op::Yield(values) if values.is_empty() => {}
            Op::Return => self.emit("", "EXIT".into()),
            other => {
                return Err(refuse(
                    f,
                    format!("no selection rule for {} yet", op_name(other)),
                ))
            }
        }
        Ok(())
    }

    /// Checks a global access of `ty` through `ptr`; the width suffix of its instruction.
    fn access(&self, ptr: Value, ty: Type, what: &str) -> Result<&'static str> {
        if !matches!(self.f.ty(ptr), Type::Ptr(AddrSpace::Global, _)) {
            return Err(refuse(
                self.f,
                format!("a {what} outside global memory is not compiled yet"),
            ));
        }
        match ty.bytes() {
            4 => Ok(""),
            8 => Ok(".64"),
            16 => Ok(".128"),
            n => Err(refuse(
                self.f,
                format!("a {what} of {n} bytes is not compiled yet"),
            )),
        }
    }

    fn bin(
        &mut self,
        result: Option<Value>,
        op: BinOp,
        rnd: Option<Round>,
        a: Value,
        b: Value,
    ) -> Result<()> {
        let f = self.f;
        let kind = self.kind(a, op.name())?;
        let (ra, rb) = (self.reg(a)?, self.reg(b)?);
        let text = |d: &str| -> Option<String> {
            Some(match (kind, op) {
                (Kind::F32, BinOp::Add) if rnd == Some(Round::Rn) => {
                    format!("FADD {d}, {ra}, {rb}")
                }
                (Kind::F32, BinOp::Sub) if rnd == Some(Round::Rn) => {
                    format!("FADD {d}, {ra}, -{rb}")
                }
                (Kind::F32, BinOp::Mul) if rnd == Some(Round::Rn) => {
                    format!("FMUL {d}, {ra}, {rb}")
                }
                (Kind::F32, _) => return None,
                (_, BinOp::Add) => format!("IADD3 {d}, {ra}, {rb}, RZ"),
                (_, BinOp::Sub) => format!("IADD3 {d}, -{rb}, {ra}, RZ"),
                (_, BinOp::Mul) => format!("IMAD {d}, {ra}, {rb}, URZ"),
                (_, BinOp::And) => format!("LOP3.LUT {d}, {ra}, {rb}, RZ, 0xc0, !PT"),
                (_, BinOp::Or) => format!("LOP3.LUT {d}, {ra}, {rb}, RZ, 0xfc, !PT"),
                (_, BinOp::Xor) => format!("LOP3.LUT {d}, {ra}, {rb}, RZ, 0x3c, !PT"),
                (_, BinOp::Shl) => format!("SHF.L.U32 {d}, {ra}, {rb}, RZ"),
                (Kind::U32, BinOp::Shr) => format!("SHF.R.U32.HI {d}, RZ, {rb}, {ra}"),
                _ => return None,
            })
        };
        if text("").is_none() {
            let how = rnd.map(|r| format!(".{}", r.name())).unwrap_or_default();
            return Err(refuse(
                f,
                format!(
                    "no selection rule for {}{how} on {:?} yet",
                    op.name(),
                    f.ty(a)
                ),
            ));
        }
        let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
        let d = self.regs.define(f, v)?.reg(0);
        let line = text(&d).unwrap_or_default();
        self.emit("", line);
        Ok(())
    }

    fn cmp(&mut self, result: Option<Value>, op: CmpOp, a: Value, b: Value) -> Result<()> {
        let f = self.f;
        let kind = self.kind(a, "cmp")?;
        let (ra, rb) = (self.reg(a)?, self.reg(b)?);
        let name = |op: CmpOp| op.name().to_uppercase();
        // The forms the tables hold: every unsigned comparison; signed GE and NE; ordered
        // float EQ, GE and GT (LT and LE by swapping the operands).
        let (mnemonic, x, y) = match (kind, op) {
            (Kind::U32, op) => (format!("ISETP.{}.U32.AND", name(op)), ra, rb),
            (Kind::S32, CmpOp::Ge | CmpOp::Ne) => (format!("ISETP.{}.AND", name(op)), ra, rb),
            (Kind::S32, CmpOp::Le) => ("ISETP.GE.AND".to_string(), rb, ra),
            (Kind::F32, CmpOp::Eq | CmpOp::Ge | CmpOp::Gt) => {
                (format!("FSETP.{}.AND", name(op)), ra, rb)
            }
            (Kind::F32, CmpOp::Lt) => ("FSETP.GT.AND".to_string(), rb, ra),
            (Kind::F32, CmpOp::Le) => ("FSETP.GE.AND".to_string(), rb, ra),
            _ => {
                return Err(refuse(
                    f,
                    format!(
                        "no selection rule for cmp.{} on {:?} yet",
                        op.name(),
                        f.ty(a)
                    ),
                ))
            }
        };
        let v = result.ok_or_else(|| refuse(f, "cmp without its result"))?;
        let p = self.regs.define(f, v)?.reg(0);
        self.emit("", format!("{mnemonic} {p}, PT, {x}, {y}, PT"));
        Ok(())
    }

    /// `if`: threads where `cond` is false branch past the then-block (to the else-block,
    /// if any); all meet again at a `BSYNC` on the barrier register of this nesting level,
    /// set up by `BSSY` before the branch.
    fn if_(&mut self, cond: Value, then_: &Block, else_: &Block) -> Result<()> {
        if self.depth == MAX_NESTING {
            return Err(refuse(
                self.f,
                format!("ifs nested deeper than {MAX_NESTING} levels"),
            ));
        }
        let b = format!("B{}", self.depth);
        let p = self.reg(cond)?;
        let (join, after) = (self.label(), self.label());
        let has_else = else_
            .insts
            .iter()
            .any(|i| !matches!(&i.op, Op::Yield(v) if v.is_empty()));
        let skip = if !has_else {
            join.clone()
        } else {
            self.label()
        };
        self.emit("", format!("BSSY {b}, `({after})"));
        self.emit(&format!("@!{p} "), format!("BRA `({skip})"));
        self.depth += 1;
        self.block(then_)?;
        if has_else {
            self.emit("", format!("BRA `({join})"));
            self.lines.push(Line::Label(skip));
            self.block(else_)?;
        }
        self.depth -= 1;
        self.lines.push(Line::Label(join));
        self.emit("", format!("BSYNC {b}"));
        self.lines.push(Line::Label(after));
        Ok(())
    }
}

/// The IR's name of an operation, for refusals.
fn op_name(op: &Op) -> String {
    let mut text = format!("{op:?}");
    text.truncate(text.find([' ', '{', '(']).unwrap_or(text.len()));
    text
}
