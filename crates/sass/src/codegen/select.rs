//! Instruction selection: each IR operation as the sm_90 instructions that compute it,
//! in the forms of the encoding tables (those ptxas emits), as SASS text.

use quench_ir::{
    AddrSpace, AtomOp, BinOp, Block, CacheOp, CmpOp, Function, Inst, MmaShape, Op, Ordering, Round,
    Scalar, Scope, ShflMode, Special, Type, UnOp, Value,
};

use super::control::{self, control};
use super::divide;
use super::ieee;
use super::refuse;
use super::regs::{width, Loc, Registers, Spills};
use super::schedule;
use super::scoreboard::Scoreboards;
use crate::cubin::PARAM_BASE;
use crate::error::{Result, SassError};
use crate::table::{Control, Tables};

/// The uniform register pair holding the global memory descriptor, loaded once at entry
/// from `c[0x0][0x208]`, as ptxas does.
const DESC: &str = "UR4";
/// Barrier registers for reconvergence after `if` and `for` (B0–B15): one per nesting
/// level.
const MAX_NESTING: usize = 16;
/// Where the static shared declarations start in the block's shared window.
const SHARED_BASE: u32 = 0x400;
/// The predicates the selector's own sequences use (a loop's bound test, a carry, a
/// predicate value brought back from a register; values get P0–P4).
const SCRATCH_P: &str = "P6";
const SCRATCH_P2: &str = "P5";

/// One line of the kernel's code: a label or an instruction.
enum Line {
    Label(String),
    /// An instruction, and the stall that replaces its latency's where it pads another's.
    Inst {
        guard: String,
        text: String,
        stall: Option<u8>,
    },
}

pub struct Selector<'f> {
    f: &'f Function,
    regs: Registers,
    spills: &'f Spills,
    lines: Vec<Line>,
    labels: u32,
    depth: usize,
    /// The position of the next instruction, as [`Registers`] numbers them.
    pos: usize,
    /// Where the innermost `if` or `for` block's `yield` moves its values.
    yield_to: Vec<Vec<Loc>>,
    /// Each parameter's offset in constant bank 0.
    param_offsets: Vec<u32>,
    /// The bits of each constant value.
    consts: std::collections::HashMap<Value, u64>,
    /// Where each constant's `MOV`s start (see [`Selector::finish`]).
    const_lines: Vec<(Value, usize)>,
}

/// How an integer or float type is handled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    U32,
    S32,
    U64,
    F32,
    F64,
}

impl<'f> Selector<'f> {
    /// A selector for `f` whose code names at most `limit` registers, keeping `spills`
    /// in local memory.
    pub fn new(f: &'f Function, limit: u32, spills: &'f Spills) -> Result<Selector<'f>> {
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
            regs: Registers::new(f, limit, spills),
            spills,
            lines: Vec::new(),
            labels: 0,
            depth: 0,
            pos: 0,
            yield_to: Vec::new(),
            param_offsets,
            consts: Default::default(),
            const_lines: Vec::new(),
        };
        s.emit("", format!("ULDC.64 {DESC}, c[0x0][0x208]"));
        if spills.bytes() > 0 {
            // The stack pointer, as ptxas sets it: the top of the thread's local window,
            // less the frame.
            s.emit("", "LDC R1, c[0x0][0x28]".into());
            s.emit("", format!("IADD3 R1, R1, -{:#x}, RZ", spills.bytes()));
        }
        Ok(s)
    }

    /// After registers ran out: one more value to keep in local memory, if one can go.
    pub fn spill_more(&self, spills: &mut Spills) -> bool {
        self.regs.spill_more(self.f, spills)
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
        // The constants every reader took as an immediate need no register.
        let unread: std::collections::HashSet<usize> = self
            .const_lines
            .iter()
            .filter(|(v, _)| !self.regs.was_read(*v))
            .flat_map(|&(v, at)| at..at + width(self.f.ty(v)).unwrap_or(1) as usize)
            .collect();
        let lines = std::mem::take(&mut self.lines);
        self.lines = lines
            .into_iter()
            .enumerate()
            .filter(|(i, _)| !unread.contains(i))
            .map(|(_, l)| l)
            .collect();
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
        self.schedule();
        let f = self.f;
        let mut out = format!(
            ".kernel {}\n.registers {}\n.maxntid {} 1 1\n",
            f.name,
            self.regs.used(),
            f.max_threads
        );
        if !f.shared.is_empty() {
            out += &format!(".shared {}\n", u64::from(SHARED_BASE) + f.shared_bytes());
        }
        if self.spills.bytes() > 0 {
            out += &format!(".frame {}\n", self.spills.bytes());
        }
        for p in &f.params {
            let (size, log_align, space) = match p.ty {
                Type::Ptr(_, elem) => (8, elem.bytes().max(1).trailing_zeros(), 4),
                t => (t.bytes(), 0, 0),
            };
            out += &format!(".param {size} {size} {log_align} {space}\n");
        }
        out += &format!("{}:\n", f.name);
        let mut results = control::Results::default();
        let mut guards = control::Guards::default();
        let mut scoreboards = Scoreboards::default();
        // Each line's control bits, kept until the end: the stalls of earlier instructions
        // may be lengthened for a result, and an earlier instruction given a read
        // scoreboard when a later one overwrites its source.
        let mut controls: Vec<Option<Control>> = Vec::with_capacity(self.lines.len());
        for (i, line) in self.lines.iter().enumerate() {
            match line {
                Line::Label(_) => {
                    scoreboards.label();
                    controls.push(None);
                }
                Line::Inst { guard, text, stall } => {
                    let next = self.lines.get(i + 1).map(|l| match l {
                        Line::Inst { guard, text, .. } => Some((guard.as_str(), mnemonic(text))),
                        Line::Label(_) => None,
                    });
                    let mut c = control(mnemonic(text));
                    if let Some(s) = stall {
                        c = control::stalled(c, (*s).max(c.stall));
                    }
                    // A guard read right after, or (before a label or from a branch) any
                    // guard the code elsewhere reads; likewise any register.
                    let jumps = mnemonic(text).starts_with("BRA");
                    let guarded = match next {
                        Some(Some((g, _))) if !jumps => Some(g),
                        _ => None,
                    };
                    let guard = guard.trim().trim_start_matches(['@', '!']);
                    c = results.issue(c, Some(guard), text, &mut controls, guarded.is_none());
                    c = guards.issue(c, text, guarded);
                    c = scoreboards.issue(c, text, &mut controls);
                    controls.push(Some(c));
                }
            }
        }
        for (line, c) in self.lines.iter().zip(controls) {
            match (line, c) {
                (Line::Label(l), _) => out += &format!("{l}:\n"),
                (Line::Inst { guard, text, .. }, Some(c)) => {
                    out += &format!("        {guard}{text} ;  /* {} */\n", c.text());
                }
                (Line::Inst { .. }, None) => {}
            }
        }
        out
    }

    /// Reorders the instructions between each two labels (see [`schedule`]).
    fn schedule(&mut self) {
        let lines = std::mem::take(&mut self.lines);
        // The instructions since the last label: guard, text, stall.
        let mut run: Vec<(String, String, Option<u8>)> = Vec::new();
        let flush = |run: &mut Vec<(String, String, Option<u8>)>, out: &mut Vec<Line>| {
            let items: Vec<schedule::Item> = run
                .iter()
                .map(|(guard, text, stall)| schedule::Item {
                    guard,
                    text,
                    pinned: stall.is_some(),
                })
                .collect();
            let order = schedule::order(&items);
            let mut taken: Vec<Option<_>> = run.drain(..).map(Some).collect();
            out.extend(
                order
                    .into_iter()
                    .filter_map(|i| taken[i].take())
                    .map(|(guard, text, stall)| Line::Inst { guard, text, stall }),
            );
        };
        for line in lines {
            match line {
                Line::Label(_) => {
                    flush(&mut run, &mut self.lines);
                    self.lines.push(line);
                }
                Line::Inst { guard, text, stall } => run.push((guard, text, stall)),
            }
        }
        flush(&mut run, &mut self.lines);
    }

    fn emit(&mut self, guard: &str, text: String) {
        let beyond = control::beyond_stall(mnemonic(&text));
        self.lines.push(Line::Inst {
            guard: guard.to_string(),
            text,
            stall: None,
        });
        // A latency longer than a stall field holds: a `NOP` waits out the rest.
        if let Some(stall) = beyond {
            self.lines.push(Line::Inst {
                guard: String::new(),
                text: "NOP".into(),
                stall: Some(stall),
            });
        }
    }

    fn label(&mut self) -> String {
        self.labels += 1;
        format!(".L_q_{}", self.labels - 1)
    }

    fn block(&mut self, b: &Block) -> Result<()> {
        for inst in &b.insts {
            self.regs.at(self.pos);
            self.pos += 1;
            let loaded = self
                .load_spilled(&inst.op)
                .map_err(|e| at_inst(e, self.f, inst))?;
            self.inst(&inst.results, &inst.op)
                .map_err(|e| at_inst(e, self.f, inst))?;
            for v in loaded {
                self.regs.unload(v);
            }
            for r in &inst.results {
                self.store_spilled(*r)?;
            }
        }
        Ok(())
    }

    /// Loads the spilled operands of `op` into scratch registers (a constant is written
    /// again); the values loaded.
    fn load_spilled(&mut self, op: &Op) -> Result<Vec<Value>> {
        let f = self.f;
        if matches!(op, Op::For { .. } | Op::If { .. } | Op::Yield(_)) {
            return Ok(Vec::new());
        }
        let mut loaded = Vec::new();
        for v in op.operands() {
            let Some(slot) = self.spills.slot(v) else {
                continue;
            };
            if loaded.contains(&v) {
                continue;
            }
            let words = width(f.ty(v)).unwrap_or(1);
            let base = self.regs.scratch_run(f, words)?;
            match self.consts.get(&v).copied() {
                Some(bits) => {
                    for i in 0..words {
                        let word = (bits >> (32 * i)) as u32;
                        self.emit("", format!("MOV R{}, {word:#x}", base + i));
                    }
                }
                None => {
                    let wide = if words == 2 { ".64" } else { "" };
                    self.emit("", format!("LDL{wide} R{base}, [R1+{slot:#x}]"));
                }
            }
            self.regs.load(v, Loc::R { base, count: words });
            loaded.push(v);
        }
        Ok(loaded)
    }

    /// Stores `v` to its slot if it is spilled (a constant needs none).
    fn store_spilled(&mut self, v: Value) -> Result<()> {
        let Some(slot) = self.spills.slot(v) else {
            return Ok(());
        };
        if self.consts.contains_key(&v) {
            return Ok(());
        }
        let loc = self.regs.loc(self.f, v)?;
        let wide = if width(self.f.ty(v)) == Some(2) {
            ".64"
        } else {
            ""
        };
        self.emit("", format!("STL{wide} [R1+{slot:#x}], {}", loc.reg(0)));
        Ok(())
    }

    /// Registers for the results of an `if` or the carried values of a `for`.
    fn define_all(&mut self, values: &[Value]) -> Result<Vec<Loc>> {
        let f = self.f;
        values
            .iter()
            .map(|v| match self.regs.define(f, *v)? {
                Loc::P(_) => Err(refuse(
                    f,
                    "a predicate carried out of an if or through a loop is not compiled yet",
                )),
                loc => Ok(loc),
            })
            .collect()
    }

    /// Moves `values` into `to` as if all at once: a register is written only after every
    /// read of it, a cycle broken through R0.
    fn parallel_copy(&mut self, to: &[Loc], values: &[Value]) -> Result<()> {
        let mut pending = Vec::new();
        for (d, v) in to.iter().zip(values) {
            let (Loc::R { base: db, count }, Loc::R { base: sb, .. }) =
                (*d, self.regs.loc(self.f, *v)?)
            else {
                return Err(refuse(self.f, "a predicate yielded is not compiled yet"));
            };
            pending.extend((0..count).map(|i| (db + i, sb + i)).filter(|(d, s)| d != s));
        }
        while !pending.is_empty() {
            let free = pending
                .iter()
                .position(|(d, _)| !pending.iter().any(|(_, s)| s == d));
            match free {
                Some(i) => {
                    let (d, s) = pending.remove(i);
                    self.emit("", format!("MOV R{d}, R{s}"));
                }
                None => {
                    let d = pending[0].0;
                    self.emit("", format!("MOV R0, R{d}"));
                    for (_, s) in pending.iter_mut().filter(|(_, s)| *s == d) {
                        *s = 0;
                    }
                }
            }
        }
        Ok(())
    }

    /// `for iv in lo..hi step s`: the induction variable and the carried values live in
    /// the body's argument registers, which are also the loop's results. The bound is
    /// tested at the top (no trip when `lo >= hi`), signed or unsigned by `lo`'s type;
    /// threads leave the loop separately and meet again at a `BSYNC`.
    fn for_(&mut self, [lo, hi, step]: [Value; 3], init: &[Value], body: &Block) -> Result<()> {
        let f = self.f;
        let signed = match self.kind(lo, "for")? {
            Kind::U32 => ".U32",
            Kind::S32 => "",
            Kind::U64 | Kind::F32 | Kind::F64 => {
                return Err(refuse(f, "a loop over u64 or floats is not compiled yet"))
            }
        };
        if self.depth == MAX_NESTING {
            return Err(refuse(
                f,
                format!("control flow nested deeper than {MAX_NESTING} levels"),
            ));
        }
        let args = self.define_all(&body.args)?;
        let mut start = vec![lo];
        start.extend(init);
        self.parallel_copy(&args, &start)?;
        let (iv, hi, step) = (args[0].reg(0), self.reg(hi)?, self.reg(step)?);
        let b = format!("B{}", self.depth);
        let (head, done, after) = (self.label(), self.label(), self.label());
        self.emit("", format!("BSSY {b}, `({after})"));
        self.lines.push(Line::Label(head.clone()));
        self.emit(
            "",
            format!("ISETP.GE{signed}.AND {SCRATCH_P}, PT, {iv}, {hi}, PT"),
        );
        self.emit(&format!("@{SCRATCH_P} "), format!("BRA `({done})"));
        self.depth += 1;
        self.yield_to.push(args[1..].to_vec());
        self.block(body)?;
        self.yield_to.pop();
        self.depth -= 1;
        self.emit("", format!("IADD3 {iv}, {iv}, {step}, RZ"));
        self.emit("", format!("BRA `({head})"));
        self.lines.push(Line::Label(done));
        self.emit("", format!("BSYNC {b}"));
        self.lines.push(Line::Label(after));
        Ok(())
    }

    /// A predicate value as an instruction's predicate operand: its predicate, or for one
    /// kept in a register (all predicates taken) `scratch` set from it.
    fn pred_src(&mut self, v: Value, scratch: &str) -> Result<String> {
        match self.regs.loc(self.f, v)? {
            Loc::P(p) => Ok(format!("P{p}")),
            r => {
                let r = r.reg(0);
                self.emit("", format!("ISETP.NE.U32.AND {scratch}, PT, {r}, RZ, PT"));
                Ok(scratch.to_string())
            }
        }
    }

    /// Defines the predicate value `v`: the predicate an instruction writes it to, and for
    /// one kept in a register, that register (P6 written, then [`Selector::pred_store`]).
    fn pred_dest(&mut self, v: Value) -> Result<(String, Option<String>)> {
        Ok(match self.regs.define(self.f, v)? {
            Loc::P(p) => (format!("P{p}"), None),
            r => (SCRATCH_P.to_string(), Some(r.reg(0))),
        })
    }

    /// Keeps P6 in `r` as 0 or 1, for a predicate value defined by [`Selector::pred_dest`].
    fn pred_store(&mut self, r: Option<String>) {
        if let Some(r) = r {
            self.emit("", format!("SEL {r}, RZ, 0x1, !{SCRATCH_P}"));
        }
    }

    fn reg(&self, v: Value) -> Result<String> {
        Ok(self.regs.loc(self.f, v)?.reg(0))
    }

    fn kind(&self, v: Value, what: &str) -> Result<Kind> {
        match self.f.ty(v) {
            Type::Scalar(Scalar::U32) => Ok(Kind::U32),
            Type::Scalar(Scalar::I32) => Ok(Kind::S32),
            Type::Scalar(Scalar::F32) => Ok(Kind::F32),
            Type::Scalar(Scalar::U64) => Ok(Kind::U64),
            Type::Scalar(Scalar::F64) => Ok(Kind::F64),
            t => Err(refuse(self.f, format!("{what} on {t} is not compiled yet"))),
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
            // A constant predicate: every lane's PT through a table of all ones or zeros.
            Op::Const {
                ty: Type::Scalar(Scalar::Pred),
                bits,
            } => {
                let v = result.ok_or_else(|| refuse(f, "a constant without its result"))?;
                let (p, r) = self.pred_dest(v)?;
                let lut = if *bits & 1 == 1 { 0xff } else { 0x0 };
                self.emit("", format!("PLOP3.LUT {p}, PT, PT, PT, PT, {lut:#x}, 0x0"));
                self.pred_store(r);
            }
            Op::Const { ty, bits } => {
                if !matches!((ty, ty.bytes()), (Type::Scalar(_), 4 | 8)) {
                    return Err(refuse(
                        f,
                        format!("a constant of type {ty} is not compiled yet"),
                    ));
                }
                let v = result.ok_or_else(|| refuse(f, "a constant without its result"))?;
                self.consts.insert(v, *bits);
                let d = self.regs.define(f, v)?;
                self.const_lines.push((v, self.lines.len()));
                self.emit("", format!("MOV {}, {:#x}", d.reg(0), *bits as u32));
                if ty.bytes() == 8 {
                    let hi = format!("{:#x}", (*bits >> 32) as u32);
                    self.emit("", format!("MOV {}, {hi}", d.reg(1)));
                }
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
                let p = self.pred_src(*cond, SCRATCH_P)?;
                let (la, lb) = (self.regs.loc(f, *a)?, self.regs.loc(f, *b)?);
                let words = f.ty(*a).bytes().div_ceil(4);
                if !matches!(words, 1 | 2) {
                    return Err(refuse(
                        f,
                        "select of a value wider than 64 bits is not compiled yet",
                    ));
                }
                let v = result.ok_or_else(|| refuse(f, "select without its result"))?;
                let d = self.regs.define(f, v)?;
                for i in 0..words {
                    let (d, a, b) = (d.reg(i), la.reg(i), lb.reg(i));
                    self.emit("", format!("SEL {d}, {a}, {b}, {p}"));
                }
            }
            Op::PtrAdd { ptr, index } => {
                let (space, size) = match f.ty(*ptr) {
                    Type::Ptr(space @ (AddrSpace::Global | AddrSpace::Shared), elem) => {
                        (space, elem.bytes())
                    }
                    t => return Err(refuse(f, format!("ptr_add on {t} is not compiled yet"))),
                };
                let index_ty = f.ty(*index);
                let (p, i) = (self.reg(*ptr)?, self.regs.loc(f, *index)?);
                let d = self
                    .regs
                    .define(f, result.ok_or_else(|| refuse(f, "ptr_add"))?)?;
                match (space, index_ty) {
                    // Shared addresses are 32-bit offsets in the block's window.
                    (AddrSpace::Shared, Type::Scalar(Scalar::U32)) => self.emit(
                        "",
                        format!("IMAD {}, {}, {size:#x}, {p}", d.reg(0), i.reg(0)),
                    ),
                    (AddrSpace::Global, Type::Scalar(Scalar::U32 | Scalar::U64)) => {
                        self.emit(
                            "",
                            format!("IMAD.WIDE.U32 {}, {}, {size:#x}, {p}", d.reg(0), i.reg(0)),
                        );
                        if index_ty == Type::U64 {
                            let hi = d.reg(1);
                            self.emit("", format!("IMAD {hi}, {}, {size:#x}, {hi}", i.reg(1)));
                        }
                    }
                    _ => {
                        return Err(refuse(
                            f,
                            format!("ptr_add by a {index_ty} index is not compiled yet"),
                        ))
                    }
                }
            }
            Op::SharedAddr { decl } => {
                // The static declarations start 1 KiB into the shared window (below them
                // the space the system reserves, as ptxas lays it out), the block's
                // position in its cluster in the address's top byte.
                let at = SHARED_BASE + f.shared_offsets()[*decl as usize] as u32;
                let d = def(self)?;
                self.emit("", "S2R R0, SR_CgaCtaId".into());
                self.emit("", format!("MOV {d}, {at:#x}"));
                self.emit("", format!("LEA {d}, R0, {d}, 0x18"));
            }
            Op::Barrier => self.emit("", "BAR.SYNC.DEFER_BLOCKING 0x0".into()),
            // ptxas's lowering of `fence.acq_rel.gpu`: earlier memory operations made
            // visible at the GPU's scope, then the L1 invalidated for later loads.
            Op::Fence {
                ord: Ordering::AcqRel,
                scope: Scope::Gpu,
            } => {
                self.release_fence();
                self.emit("", "CCTL.IVALL".into());
            }
            Op::Atomic {
                op: AtomOp::Add,
                ord: Ordering::AcqRel,
                scope: Scope::Gpu,
                ptr,
                a,
                b: None,
            } if f.ty(*a) == Type::U32 && matches!(f.ty(*ptr), Type::Ptr(AddrSpace::Global, _)) => {
                let (p, a) = (self.reg(*ptr)?, self.reg(*a)?);
                let d = def(self)?;
                self.release_fence();
                self.emit(
                    "",
                    format!("ATOMG.E.ADD.STRONG.GPU PT, {d}, desc[{DESC}][{p}.64], {a}"),
                );
                self.emit("", "CCTL.IVALL".into());
            }
            Op::Atomic {
                op: AtomOp::Add,
                ord: Ordering::Relaxed,
                scope: Scope::Cta,
                ptr,
                a,
                b: None,
            } if f.ty(*a) == Type::U64 && matches!(f.ty(*ptr), Type::Ptr(AddrSpace::Shared, _)) => {
                self.shared_add64(result, *ptr, *a)?
            }
            Op::Cvt { to, rnd, sat, a } => self.cvt(result, *to, *rnd, *sat, *a)?,
            Op::Load { ty, ptr, cache } => {
                let (space, width) = self.access(*ptr, *ty, "load")?;
                let cache = match (space, cache) {
                    (_, CacheOp::Default) => "",
                    (AddrSpace::Global, CacheOp::Nc) => ".CONSTANT",
                    // Cached in L2 only: ptxas's `.STRONG.GPU`.
                    (AddrSpace::Global, CacheOp::Cg) => ".STRONG.GPU",
                    (_, other) => {
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
                if space == AddrSpace::Shared {
                    self.emit("", format!("LDS{width} {d}, [{p}]"));
                } else {
                    self.emit("", format!("LDG.E{width}{cache} {d}, desc[{DESC}][{p}.64]"));
                }
            }
            Op::Store { ptr, value, cache } => {
                let (space, width) = self.access(*ptr, f.ty(*value), "store")?;
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
                if space == AddrSpace::Shared {
                    self.emit("", format!("STS{width} [{p}], {v}"));
                } else {
                    self.emit("", format!("STG.E{width} desc[{DESC}][{p}.64], {v}"));
                }
            }
            Op::Extract { a, index } => {
                let Loc::R { base, .. } = self.regs.loc(f, *a)? else {
                    return Err(refuse(f, "extract from a predicate"));
                };
                let v = result.ok_or_else(|| refuse(f, "extract without its result"))?;
                match f.ty(v).bytes() {
                    // A 16-bit value lives in the low half of a register, whatever the high
                    // half holds: an even element is its pair's register, an odd one is
                    // shifted down.
                    2 if index % 2 == 1 => {
                        let d = self.regs.define(f, v)?.reg(0);
                        let r = format!("R{}", base + index / 2);
                        self.emit("", format!("SHF.R.U32.HI {d}, RZ, 0x10, {r}"));
                    }
                    2 => self.regs.alias(
                        v,
                        Loc::R {
                            base: base + index / 2,
                            count: 1,
                        },
                    ),
                    n if n % 4 == 0 => self.regs.alias(
                        v,
                        Loc::R {
                            base: base + index * n / 4,
                            count: n / 4,
                        },
                    ),
                    n => return Err(refuse(f, format!("extract of a {n}-byte element"))),
                }
            }
            Op::Pack { parts, .. } => {
                let sources = parts
                    .iter()
                    .map(|p| self.reg(*p))
                    .collect::<Result<Vec<_>>>()?;
                let v = result.ok_or_else(|| refuse(f, "pack without its result"))?;
                let part_bytes = parts.first().map_or(4, |p| f.ty(*p).bytes());
                let loc = self.regs.define(f, v)?;
                match part_bytes {
                    // Two 16-bit parts a register: bytes 0–1 of the first, 0–1 of the second.
                    2 => {
                        for (i, pair) in sources.chunks(2).enumerate() {
                            let hi = pair.get(1).map_or("RZ", String::as_str);
                            let d = loc.reg(i as u32);
                            self.emit("", format!("PRMT {d}, {}, 0x5410, {hi}", pair[0]));
                        }
                    }
                    // Parts already in place (a pack of consecutive registers) stay.
                    4 => {
                        for (i, s) in sources.iter().enumerate() {
                            let d = loc.reg(i as u32);
                            if d != *s {
                                self.emit("", format!("MOV {d}, {s}"));
                            }
                        }
                    }
                    n => return Err(refuse(f, format!("pack of {n}-byte parts"))),
                }
            }
            Op::Un { op, a } => self.un(result, *op, *a)?,
            // The approximate quotient as the correctly rounded one: inside any bound set
            // for the approximation, and the value the interpreter's model gives.
            Op::DivApprox { a, b } if f.ty(*a) == Type::F32 => {
                let (ra, rb) = (self.reg(*a)?, self.reg(*b)?);
                self.div_rn(result, &ra, &rb)?
            }
            Op::Dp4a {
                a_signed,
                b_signed,
                a,
                b,
                c,
            } => {
                let sign = |s: bool| if s { "S8" } else { "U8" };
                let (ra, rb, rc) = (self.reg(*a)?, self.reg(*b)?, self.reg(*c)?);
                let d = def(self)?;
                let (x, y) = (sign(*a_signed), sign(*b_signed));
                self.emit("", format!("IDP.4A.{x}.{y} {d}, {ra}, {rb}, {rc}"));
            }
            Op::Shfl {
                mode: ShflMode::Bfly,
                value,
                b,
                c,
                mask,
            } if self.consts.get(mask) == Some(&u64::from(u32::MAX))
                && f.ty(*value).bytes() == 4 =>
            {
                let (v, b, c) = (self.reg(*value)?, self.reg(*b)?, self.reg(*c)?);
                let d = def(self)?;
                self.emit("", format!("SHFL.BFLY PT, {d}, {v}, {b}, {c}"));
            }
            // A pointer to another element type: the same address.
            Op::PtrCast { ptr, .. } => {
                let v = result.ok_or_else(|| refuse(f, "ptr_cast without its result"))?;
                let loc = self.regs.loc(f, *ptr)?;
                self.regs.alias(v, loc);
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
                debug_assert_eq!(types.len(), results.len());
                let to = self.define_all(results)?;
                self.yield_to.push(to);
                self.if_(*cond, then_, else_)?;
                self.yield_to.pop();
            }
            Op::For {
                lo,
                hi,
                step,
                init,
                body,
            } => self.for_([*lo, *hi, *step], init, body)?,
            Op::Yield(values) => {
                let to = self.yield_to.last().cloned().unwrap_or_default();
                if to.len() != values.len() {
                    return Err(refuse(f, "a yield that does not match its block"));
                }
                self.parallel_copy(&to, values)?;
            }
            Op::Return => self.emit("", "EXIT".into()),
            Op::CpAsync {
                dst,
                src,
                bytes,
                cache,
            } => {
                // ptxas's forms: `.ca` of 4 bytes through L1, `.cg` of 16 bypassing it,
                // both with its L2 prefetch hint.
                let form = match (cache, bytes) {
                    (CacheOp::Ca, 4) => "LDGSTS.E.LTC128B",
                    (CacheOp::Cg, 16) => "LDGSTS.E.BYPASS.LTC128B.128",
                    _ => {
                        return Err(refuse(
                            f,
                            format!(
                                "cp.async.{} of {bytes} bytes is not compiled yet",
                                cache.name()
                            ),
                        ))
                    }
                };
                let (d, s) = (self.reg(*dst)?, self.reg(*src)?);
                self.emit("", format!("{form} [{d}], desc[{DESC}][{s}.64]"));
            }
            Op::CpAsyncCommit => self.emit("", "LDGDEPBAR".into()),
            Op::CpAsyncWait { n } => self.emit("", format!("DEPBAR.LE SB0, {n:#x}")),
            Op::LdMatrix {
                num: 4, trans, ptr, ..
            } => {
                let p = self.reg(*ptr)?;
                let d = def(self)?;
                let shape = if *trans { "MT88" } else { "M88" };
                self.emit("", format!("LDSM.16.{shape}.4 {d}, [{p}]"));
            }
            Op::Mma {
                shape: MmaShape::M16N8K16,
                a,
                b,
                c,
            } => {
                let form = match f.ty(*a) {
                    Type::Frag(t) if t.elem == Scalar::BF16 => "HMMA.16816.F32.BF16",
                    Type::Frag(t) if t.elem == Scalar::F16 => "HMMA.16816.F32",
                    t => {
                        return Err(refuse(
                            f,
                            format!("mma.m16n8k16 on {t} is not compiled yet"),
                        ))
                    }
                };
                let (ra, rb, rc) = (self.reg(*a)?, self.reg(*b)?, self.reg(*c)?);
                let d = def(self)?;
                self.emit("", format!("{form} {d}, {ra}, {rb}, {rc}"));
            }
            other => {
                return Err(refuse(
                    f,
                    format!("no selection rule for {} yet", op_name(other)),
                ))
            }
        }
        Ok(())
    }

    /// The release half of an acquire-release fence at the GPU's scope, as ptxas writes it,
    /// stalls included.
    fn release_fence(&mut self) {
        for (i, stall) in [("MEMBAR.ALL.GPU", 6), ("ERRBAR", 1), ("CGAERRBAR", 6)] {
            self.lines.push(Line::Inst {
                guard: String::new(),
                text: i.into(),
                stall: Some(stall),
            });
        }
    }

    /// Checks an access of `ty` through `ptr`: its space and its instruction's width
    /// suffix.
    fn access(&self, ptr: Value, ty: Type, what: &str) -> Result<(AddrSpace, &'static str)> {
        let space = match self.f.ty(ptr) {
            Type::Ptr(space @ (AddrSpace::Global | AddrSpace::Shared), _) => space,
            t => {
                return Err(refuse(
                    self.f,
                    format!("a {what} through {t} is not compiled yet"),
                ))
            }
        };
        match (space, ty.bytes()) {
            (AddrSpace::Global, 2) => Ok((space, ".U16")),
            (_, 4) => Ok((space, "")),
            (_, 8) => Ok((space, ".64")),
            (_, 16) => Ok((space, ".128")),
            (_, n) => Err(refuse(
                self.f,
                format!("a {what} of {n} bytes in {space:?} memory is not compiled yet"),
            )),
        }
    }

    /// Conversions: widening and narrowing integers, f32 to and from bf16 and f16, u64 and
    /// f32 to f64 and f64 to u64.
    fn cvt(
        &mut self,
        result: Option<Value>,
        to: Scalar,
        rnd: Option<Round>,
        sat: bool,
        a: Value,
    ) -> Result<()> {
        let f = self.f;
        let from = f.ty(a);
        let src = self.regs.loc(f, a)?;
        let v = result.ok_or_else(|| refuse(f, "cvt without its result"))?;
        let refused = || {
            let how = rnd.map(|r| format!(".{}", r.name())).unwrap_or_default();
            let sat = if sat { ".sat" } else { "" };
            refuse(
                f,
                format!("no selection rule for cvt{how}{sat} from {from} to {to} yet"),
            )
        };
        if sat {
            return Err(refused());
        }
        let Type::Scalar(from) = from else {
            return Err(refused());
        };
        let a = src.reg(0);
        let lines: Vec<String> = match (from, to, rnd) {
            (Scalar::U32, Scalar::U64, None)
            | (Scalar::U32 | Scalar::I32, Scalar::U32 | Scalar::I32, None) => {
                let d = self.regs.define(f, v)?;
                let mut l = vec![format!("MOV {}, {a}", d.reg(0))];
                if to == Scalar::U64 {
                    l.push(format!("MOV {}, RZ", d.reg(1)));
                }
                l
            }
            (Scalar::I32, Scalar::I64 | Scalar::U64, None) => {
                let d = self.regs.define(f, v)?;
                vec![
                    format!("MOV {}, {a}", d.reg(0)),
                    format!("SHF.R.S32.HI {}, RZ, 0x1f, {a}", d.reg(1)),
                ]
            }
            // A 16-bit value's high half is undefined: cleared when it widens, left when
            // a 32-bit one narrows.
            (Scalar::U16, Scalar::U32, None) => {
                let d = self.regs.define(f, v)?;
                vec![format!("LOP3.LUT {}, {a}, 0xffff, RZ, 0xc0, !PT", d.reg(0))]
            }
            (
                Scalar::U64 | Scalar::I64 | Scalar::U32,
                Scalar::U32 | Scalar::I32 | Scalar::U16,
                None,
            ) => {
                let d = self.regs.define(f, v)?;
                vec![format!("MOV {}, {a}", d.reg(0))]
            }
            (Scalar::F32, Scalar::BF16 | Scalar::F16, Some(Round::Rn)) => {
                let d = self.regs.define(f, v)?;
                let ty = if to == Scalar::BF16 { "BF16" } else { "F16" };
                vec![format!("F2FP.{ty}.F32.PACK_AB {}, RZ, {a}", d.reg(0))]
            }
            (Scalar::I32, Scalar::F32, Some(Round::Rn)) => {
                let d = self.regs.define(f, v)?;
                vec![format!("I2FP.F32.S32 {}, {a}", d.reg(0))]
            }
            // Toward zero, saturating, NaN to 0 (PTX's integer conversions), as ptxas writes it.
            (Scalar::F32, Scalar::U32, Some(Round::Rz)) => {
                let d = self.regs.define(f, v)?;
                vec![format!("F2I.U32.TRUNC.NTZ {}, {a}", d.reg(0))]
            }
            (Scalar::U64, Scalar::F64, Some(Round::Rn)) => {
                let d = self.regs.define(f, v)?;
                vec![format!("I2F.F64.U64 {}, {a}", d.reg(0))]
            }
            (Scalar::F32, Scalar::F64, None) => {
                let d = self.regs.define(f, v)?;
                vec![format!("F2F.F64.F32 {}, {a}", d.reg(0))]
            }
            (Scalar::F64, Scalar::U64, Some(Round::Rz | Round::Rp)) => {
                let d = self.regs.define(f, v)?;
                let how = if rnd == Some(Round::Rz) {
                    "TRUNC"
                } else {
                    "CEIL"
                };
                vec![format!("F2I.U64.F64.{how} {}, {a}", d.reg(0))]
            }
            (Scalar::BF16, Scalar::F32, None) => {
                let d = self.regs.define(f, v)?;
                vec![format!("SHF.L.U32 {}, {a}, 0x10, RZ", d.reg(0))]
            }
            (Scalar::F16, Scalar::F32, None) => {
                let d = self.regs.define(f, v)?;
                vec![format!("HADD2.F32 {}, -RZ, {a}.H0_H0", d.reg(0))]
            }
            _ => return Err(refused()),
        };
        for l in lines {
            self.emit("", l);
        }
        Ok(())
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
        if f.ty(a) == Type::PRED {
            return self.pred_logic(result, Some(op), a, Some(b));
        }
        let kind = self.kind(a, op.name())?;
        if kind == Kind::U64 {
            return self.bin64(result, op, a, b);
        }
        if (kind, op, rnd) == (Kind::F32, BinOp::Div, Some(Round::Rn)) {
            let (ra, rb) = (self.reg(a)?, self.reg(b)?);
            return self.div_rn(result, &ra, &rb);
        }
        let divisor = self.consts.get(&b).map(|&d| d as u32);
        if let (Kind::U32, BinOp::Div | BinOp::Rem, Some(d)) = (kind, op, divisor) {
            return self.divide(result, op, a, d);
        }
        // A constant operand as an immediate where the tables hold that form (the second
        // operand; the first of a commutative operation swapped in).
        let commutes = matches!(
            op,
            BinOp::Add | BinOp::Mul | BinOp::And | BinOp::Or | BinOp::Xor
        );
        let (a, b) = if commutes && self.consts.contains_key(&a) && !self.consts.contains_key(&b) {
            (b, a)
        } else {
            (a, b)
        };
        if let Some(text) = self.immediate_form(kind, op, a, b)? {
            let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
            let d = self.regs.define(f, v)?.reg(0);
            self.emit("", text.replace("{d}", &d));
            return Ok(());
        }
        let (ra, rb) = (self.reg(a)?, self.reg(b)?);
        let shift_by = self.consts.get(&b).copied();
        let text = |d: &str| -> Option<String> {
            Some(match (kind, op) {
                (Kind::F32, BinOp::Add) if rnd == Some(Round::Rn) => {
                    format!("FADD {d}, {ra}, {rb}")
                }
                (Kind::F32, BinOp::Sub) if rnd == Some(Round::Rn) => {
                    format!("FADD {d}, {ra}, -{rb}")
                }
                (Kind::F32, BinOp::Max) => format!("FMNMX {d}, {ra}, {rb}, !PT"),
                (Kind::F32, BinOp::Mul) if rnd == Some(Round::Rn) => {
                    format!("FMUL {d}, {ra}, {rb}")
                }
                (Kind::F32, _) => return None,
                (Kind::F64, BinOp::Mul) if rnd == Some(Round::Rn) => {
                    format!("DMUL {d}, {ra}, {rb}")
                }
                (Kind::F64, _) => return None,
                (_, BinOp::Add) => format!("IADD3 {d}, {ra}, {rb}, RZ"),
                (_, BinOp::Sub) => format!("IADD3 {d}, -{rb}, {ra}, RZ"),
                // ptxas's plain product: RZ as the addend (it never writes URZ there).
                (_, BinOp::Mul) => format!("IMAD {d}, {ra}, {rb}, RZ"),
                (_, BinOp::And) => format!("LOP3.LUT {d}, {ra}, {rb}, RZ, 0xc0, !PT"),
                (_, BinOp::Or) => format!("LOP3.LUT {d}, {ra}, {rb}, RZ, 0xfc, !PT"),
                (_, BinOp::Xor) => format!("LOP3.LUT {d}, {ra}, {rb}, RZ, 0x3c, !PT"),
                (_, BinOp::Shl) => format!("SHF.L.U32 {d}, {ra}, {rb}, RZ"),
                (Kind::U32, BinOp::Min) => format!("VIMNMX.U32 {d}, {ra}, {rb}, PT"),
                (Kind::U32, BinOp::Max) => format!("VIMNMX.U32 {d}, {ra}, {rb}, !PT"),
                (Kind::U32, BinOp::Shr) => format!("SHF.R.U32.HI {d}, RZ, {rb}, {ra}"),
                // The tables hold the arithmetic shift by an immediate only.
                (Kind::S32, BinOp::Shr) => {
                    format!("SHF.R.S32.HI {d}, RZ, {:#x}, {ra}", shift_by?.min(31))
                }
                (Kind::U32, BinOp::MulHi) => format!("IMAD.HI.U32 {d}, {ra}, {rb}, RZ"),
                _ => return None,
            })
        };
        if text("").is_none() {
            let how = rnd.map(|r| format!(".{}", r.name())).unwrap_or_default();
            return Err(refuse(
                f,
                format!(
                    "no selection rule for {}{how} on {} yet",
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

    /// `a op b` for a 32-bit integer constant `b` with `b` as an immediate, its destination
    /// written `{d}`, where the tables hold the form: `None` otherwise.
    fn immediate_form(&self, kind: Kind, op: BinOp, a: Value, b: Value) -> Result<Option<String>> {
        let Some(&bits) = self.consts.get(&b) else {
            return Ok(None);
        };
        if !matches!(kind, Kind::U32 | Kind::S32) || self.consts.contains_key(&a) {
            return Ok(None);
        }
        let imm = bits as u32;
        let ra = self.reg(a)?;
        let text = match (kind, op) {
            (_, BinOp::Add) => format!("IADD3 {{d}}, {ra}, {}, RZ", signed_hex(imm)),
            (_, BinOp::Sub) => format!("IADD3 {{d}}, {ra}, {}, RZ", signed_hex(imm.wrapping_neg())),
            (_, BinOp::Mul) => format!("IMAD {{d}}, {ra}, {}, RZ", signed_hex(imm)),
            (_, BinOp::And) => format!("LOP3.LUT {{d}}, {ra}, {imm:#x}, RZ, 0xc0, !PT"),
            (_, BinOp::Or) => format!("LOP3.LUT {{d}}, {ra}, {imm:#x}, RZ, 0xfc, !PT"),
            (_, BinOp::Xor) => format!("LOP3.LUT {{d}}, {ra}, {imm:#x}, RZ, 0x3c, !PT"),
            (_, BinOp::Shl) if imm < 32 => format!("SHF.L.U32 {{d}}, {ra}, {imm:#x}, RZ"),
            (Kind::U32, BinOp::Shr) if imm < 32 => {
                format!("SHF.R.U32.HI {{d}}, RZ, {imm:#x}, {ra}")
            }
            _ => return Ok(None),
        };
        Ok(encodable(&text.replace("{d}", "R0")).then_some(text))
    }

    /// `x / d` or `x % d` for a constant `d` ([`divide`]): the quotient through R0 into
    /// the result, then `x − q·d` for the remainder.
    fn divide(&mut self, result: Option<Value>, op: BinOp, a: Value, d: u32) -> Result<()> {
        let f = self.f;
        let plan = divide::plan(d).ok_or_else(|| refuse(f, "a division by the constant 0"))?;
        let x = self.reg(a)?;
        let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
        let q = self.regs.define(f, v)?.reg(0);
        let mut lines = match plan {
            divide::Plan::Shift(_) if op == BinOp::Rem => {
                vec![format!("LOP3.LUT {q}, {x}, {:#x}, RZ, 0xc0, !PT", d - 1)]
            }
            divide::Plan::Shift(k) => vec![format!("SHF.R.U32.HI {q}, RZ, {k:#x}, {x}")],
            divide::Plan::Magic { m, shift } => vec![
                format!("IMAD.HI.U32 R0, {x}, {}, RZ", signed_hex(m)),
                format!("IADD3 {q}, -R0, {x}, RZ"),
                format!("SHF.R.U32.HI {q}, RZ, 0x1, {q}"),
                format!("IADD3 {q}, R0, {q}, RZ"),
                format!("SHF.R.U32.HI {q}, RZ, {shift:#x}, {q}"),
            ],
        };
        if op == BinOp::Rem && matches!(plan, divide::Plan::Magic { .. }) {
            lines.push(format!(
                "IMAD {q}, {q}, {}, {x}",
                signed_hex(d.wrapping_neg())
            ));
        }
        for l in lines {
            self.emit("", l);
        }
        Ok(())
    }

    /// `a / b` in f32, correctly rounded ([`ieee::div_rn`]), into `result`.
    fn div_rn(&mut self, result: Option<Value>, a: &str, b: &str) -> Result<()> {
        self.ieee(result, |d, t, p| ieee::div_rn(d, a, b, t, p))
    }

    /// One of [`ieee`]'s sequences into `result`, with scratch registers and a predicate
    /// held for its length.
    fn ieee(
        &mut self,
        result: Option<Value>,
        sequence: impl FnOnce(&str, &[String], &str) -> Vec<(String, String)>,
    ) -> Result<()> {
        let f = self.f;
        let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
        let d = self.regs.define(f, v)?.reg(0);
        let scratch = self.regs.scratch(f, ieee::SCRATCH)?;
        let names: Vec<String> = scratch.iter().map(|r| format!("R{r}")).collect();
        for (guard, text) in sequence(&d, &names, SCRATCH_P2) {
            self.emit(&guard, text);
        }
        self.regs.give_back(&scratch);
        Ok(())
    }

    /// Predicate logic (`op` `None` for not) as `PLOP3.LUT` over the truth tables of
    /// its inputs `0xf0` and `0xcc` (the third input PT).
    fn pred_logic(
        &mut self,
        result: Option<Value>,
        op: Option<BinOp>,
        a: Value,
        b: Option<Value>,
    ) -> Result<()> {
        let f = self.f;
        let lut = match op {
            Some(BinOp::And) => 0xc0,
            Some(BinOp::Or) => 0xfc,
            Some(BinOp::Xor) => 0x3c,
            None => 0x0f,
            Some(other) => {
                return Err(refuse(
                    f,
                    format!("no selection rule for {} on predicates", other.name()),
                ))
            }
        };
        let pa = self.pred_src(a, SCRATCH_P)?;
        let pb = match b {
            Some(b) => self.pred_src(b, SCRATCH_P2)?,
            None => "PT".to_string(),
        };
        let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
        let (d, spilled) = self.pred_dest(v)?;
        self.emit(
            "",
            format!("PLOP3.LUT {d}, PT, {pa}, {pb}, PT, {lut:#x}, 0x0"),
        );
        self.pred_store(spilled);
        Ok(())
    }

    /// Negation, absolute value and bitwise not; the float ones as multiplications by
    /// ±1, which flip or clear the sign of everything but NaN and give NaN in its
    /// canonical form, as the GPU's `neg.f32`/`abs.f32` do.
    fn un(&mut self, result: Option<Value>, op: UnOp, a: Value) -> Result<()> {
        let f = self.f;
        if op == UnOp::Not && f.ty(a) == Type::PRED {
            return self.pred_logic(result, None, a, None);
        }
        if op == UnOp::Sqrt(Round::Rn) && f.ty(a) == Type::F32 {
            let ra = self.reg(a)?;
            return self.ieee(result, |d, t, p| ieee::sqrt_rn(d, &ra, t, p));
        }
        if op == UnOp::Ex2Approx && f.ty(a) == Type::F32 {
            // ptxas's own lowering of `ex2.approx.ftz.f32`.
            let ra = self.reg(a)?;
            let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
            let d = self.regs.define(f, v)?.reg(0);
            self.emit("", format!("MUFU.EX2 {d}, {ra}"));
            return Ok(());
        }
        // The approximate reciprocal as the exact one: inside any bound set for the
        // approximation, and the value the interpreter's model gives.
        if matches!(op, UnOp::Rcp(Round::Rn) | UnOp::RcpApprox) && f.ty(a) == Type::F32 {
            // 1 / a, the 1 in R0.
            let ra = self.reg(a)?;
            self.emit("", "MOV R0, 0x3f800000".into());
            return self.div_rn(result, "R0", &ra);
        }
        let kind = self.kind(a, "a one-operand operation")?;
        let ra = self.reg(a)?;
        let line = |d: &str| -> Option<String> {
            Some(match (kind, op) {
                (Kind::F32, UnOp::Neg) => format!("FMUL {d}, {ra}, -1"),
                (Kind::F32, UnOp::Abs) => format!("FMUL {d}, |{ra}|, 1"),
                (Kind::U32 | Kind::S32, UnOp::Neg) => format!("IADD3 {d}, -{ra}, RZ, RZ"),
                (Kind::U32 | Kind::S32, UnOp::Not) => {
                    format!("LOP3.LUT {d}, RZ, {ra}, RZ, 0x33, !PT")
                }
                _ => return None,
            })
        };
        if line("").is_none() {
            return Err(refuse(
                f,
                format!(
                    "no selection rule for {} on {} yet",
                    quench_ir::print::un_name(op),
                    f.ty(a)
                ),
            ));
        }
        let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
        let d = self.regs.define(f, v)?.reg(0);
        self.emit("", line(&d).unwrap_or_default());
        Ok(())
    }

    /// 64-bit integer addition, multiplication and bitwise logic, a register pair each
    /// (low word first): the carry through P6; the product's high word from the wide low
    /// product and the two cross products, through R0.
    fn bin64(&mut self, result: Option<Value>, op: BinOp, a: Value, b: Value) -> Result<()> {
        let f = self.f;
        if let (BinOp::Shl | BinOp::Shr, Some(&k)) = (op, self.consts.get(&b)) {
            return self.shift64(result, op, a, k);
        }
        let (a, b) = (self.regs.loc(f, a)?, self.regs.loc(f, b)?);
        let lut = match op {
            BinOp::And => Some(0xc0),
            BinOp::Or => Some(0xfc),
            BinOp::Xor => Some(0x3c),
            BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Max | BinOp::Min => None,
            _ => {
                return Err(refuse(
                    f,
                    format!("no selection rule for {} on u64 yet", op.name()),
                ))
            }
        };
        let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
        let d = self.regs.define(f, v)?;
        let (d0, d1, a0, a1, b0, b1) = (d.reg(0), d.reg(1), a.reg(0), a.reg(1), b.reg(0), b.reg(1));
        let lines = if let Some(lut) = lut {
            vec![
                format!("LOP3.LUT {d0}, {a0}, {b0}, RZ, {lut:#x}, !PT"),
                format!("LOP3.LUT {d1}, {a1}, {b1}, RZ, {lut:#x}, !PT"),
            ]
        } else if let BinOp::Max | BinOp::Min = op {
            // a > b for the maximum, b > a for the minimum, on the low words and then
            // decided by the high words (`.EX`; only the 64-bit compares ptxas's code
            // uses, see `cmp`): either way a is picked where it holds.
            let ((x0, x1), (y0, y1)) = if op == BinOp::Max {
                ((&a0, &a1), (&b0, &b1))
            } else {
                ((&b0, &b1), (&a0, &a1))
            };
            vec![
                format!("ISETP.GT.U32.AND {SCRATCH_P}, PT, {x0}, {y0}, PT"),
                format!("ISETP.GT.U32.AND.EX {SCRATCH_P}, PT, {x1}, {y1}, PT, {SCRATCH_P}"),
                format!("SEL {d0}, {a0}, {b0}, {SCRATCH_P}"),
                format!("SEL {d1}, {a1}, {b1}, {SCRATCH_P}"),
            ]
        } else if op == BinOp::Add {
            vec![
                format!("IADD3 {d0}, {SCRATCH_P}, {a0}, {b0}, RZ"),
                format!("IADD3.X {d1}, {a1}, {b1}, RZ, {SCRATCH_P}, !PT"),
            ]
        } else if op == BinOp::Sub {
            // a + ~b + 1: the low word's carry out is "no borrow" (ptxas's `-R` form), the
            // high word adds ~b's high word and that carry.
            vec![
                format!("LOP3.LUT R0, {b1}, RZ, RZ, 0xf, !PT"),
                format!("IADD3 {d0}, {SCRATCH_P}, -{b0}, {a0}, RZ"),
                format!("IADD3.X {d1}, {a1}, R0, RZ, {SCRATCH_P}, !PT"),
            ]
        } else {
            vec![
                format!("IMAD.WIDE.U32 {d0}, {a0}, {b0}, RZ"),
                format!("IMAD R0, {a0}, {b1}, RZ"),
                format!("IADD3 {d1}, {d1}, R0, RZ"),
                format!("IMAD R0, {a1}, {b0}, RZ"),
                format!("IADD3 {d1}, {d1}, R0, RZ"),
            ]
        };
        for l in lines {
            self.emit("", l);
        }
        Ok(())
    }

    /// A 64-bit shift by a constant `k`: funnel shifts across the pair below 32, one
    /// word moved and shifted from 32 on, zero from 64 on (as PTX clamps the amount).
    fn shift64(&mut self, result: Option<Value>, op: BinOp, a: Value, k: u64) -> Result<()> {
        let f = self.f;
        let a = self.regs.loc(f, a)?;
        let v = result.ok_or_else(|| refuse(f, "an operation without its result"))?;
        let d = self.regs.define(f, v)?;
        let (d0, d1, a0, a1) = (d.reg(0), d.reg(1), a.reg(0), a.reg(1));
        let lines = match (op, k) {
            (_, 0) => vec![format!("MOV {d0}, {a0}"), format!("MOV {d1}, {a1}")],
            (_, 64..) => vec![format!("MOV {d0}, RZ"), format!("MOV {d1}, RZ")],
            (BinOp::Shr, 1..=31) => vec![
                format!("SHF.R.U64 {d0}, {a0}, {k:#x}, {a1}"),
                format!("SHF.R.U32.HI {d1}, RZ, {k:#x}, {a1}"),
            ],
            (BinOp::Shr, _) => vec![
                format!("SHF.R.U32.HI {d0}, RZ, {:#x}, {a1}", k - 32),
                format!("MOV {d1}, RZ"),
            ],
            (_, 1..=31) => vec![
                format!("SHF.L.U32.HI {d1}, {a0}, {k:#x}, {a1}"),
                format!("SHF.L.U32 {d0}, {a0}, {k:#x}, RZ"),
            ],
            _ => vec![
                format!("SHF.L.U32 {d1}, {a0}, {:#x}, RZ", k - 32),
                format!("MOV {d0}, RZ"),
            ],
        };
        for l in lines {
            self.emit("", l);
        }
        Ok(())
    }

    fn cmp(&mut self, result: Option<Value>, op: CmpOp, a: Value, b: Value) -> Result<()> {
        let f = self.f;
        let kind = self.kind(a, "cmp")?;
        let name = |op: CmpOp| op.name().to_uppercase();
        if kind == Kind::U64 {
            // The low words compared into P6, the high words then decide, with P6 taken
            // where they are equal (`.EX`). Only the `.EX` forms ptxas's code compares two
            // registers with: NE, GT and GE. ptxas writes a == b as the inverse of a != b
            // and a < b as b > a; quench's own `sample_f32` with `EQ.EX` and `LT.EX`
            // between registers sampled a wrong token on the H100 (whether those forms
            // are why is not yet known). LE is b >= a.
            let (op, a, b, invert) = match op {
                CmpOp::Le => (CmpOp::Ge, b, a, false),
                CmpOp::Lt => (CmpOp::Gt, b, a, false),
                CmpOp::Eq => (CmpOp::Ne, a, b, true),
                op => (op, a, b, false),
            };
            let (la, lb) = (self.regs.loc(f, a)?, self.regs.loc(f, b)?);
            let v = result.ok_or_else(|| refuse(f, "cmp without its result"))?;
            let (p, spilled) = self.pred_dest(v)?;
            let (a0, a1, b0, b1) = (la.reg(0), la.reg(1), lb.reg(0), lb.reg(1));
            let op = name(op);
            self.emit(
                "",
                format!("ISETP.{op}.U32.AND {SCRATCH_P}, PT, {a0}, {b0}, PT"),
            );
            self.emit(
                "",
                format!("ISETP.{op}.U32.AND.EX {p}, PT, {a1}, {b1}, PT, {SCRATCH_P}"),
            );
            if invert {
                self.emit("", format!("PLOP3.LUT {p}, PT, {p}, PT, PT, 0xf, 0x0"));
            }
            self.pred_store(spilled);
            return Ok(());
        }
        let (ra, rb) = (self.reg(a)?, self.reg(b)?);
        // The forms the tables hold: every unsigned comparison; signed GE and NE; ordered
        // float EQ, GE and GT (LT and LE by swapping the operands), unordered NE.
        let (mnemonic, x, y) = match (kind, op) {
            (Kind::U32, op) => (format!("ISETP.{}.U32.AND", name(op)), ra, rb),
            (Kind::S32, CmpOp::Ge | CmpOp::Ne) => (format!("ISETP.{}.AND", name(op)), ra, rb),
            (Kind::S32, CmpOp::Le) => ("ISETP.GE.AND".to_string(), rb, ra),
            (Kind::F32, CmpOp::Ge | CmpOp::Gt) => (format!("FSETP.{}.AND", name(op)), ra, rb),
            (Kind::F32, CmpOp::Eq) => {
                // The tables hold FSETP.EQ only combined with a negated predicate: with
                // P6 made false, `and !P6` is `and true`.
                self.emit("", format!("ISETP.NE.U32.AND {SCRATCH_P}, PT, RZ, RZ, PT"));
                let v = result.ok_or_else(|| refuse(f, "cmp without its result"))?;
                let (p, spilled) = self.pred_dest(v)?;
                self.emit(
                    "",
                    format!("FSETP.EQ.AND {p}, PT, {ra}, {rb}, !{SCRATCH_P}"),
                );
                self.pred_store(spilled);
                return Ok(());
            }
            // Not equal, or unordered (a NaN operand), as the IR defines `ne`.
            (Kind::F32, CmpOp::Ne) => ("FSETP.NEU.AND".to_string(), ra, rb),
            (Kind::F32, CmpOp::Lt) => ("FSETP.GT.AND".to_string(), rb, ra),
            (Kind::F32, CmpOp::Le) => ("FSETP.GE.AND".to_string(), rb, ra),
            _ => {
                return Err(refuse(
                    f,
                    format!("no selection rule for cmp.{} on {} yet", op.name(), f.ty(a)),
                ))
            }
        };
        let v = result.ok_or_else(|| refuse(f, "cmp without its result"))?;
        let (p, spilled) = self.pred_dest(v)?;
        self.emit("", format!("{mnemonic} {p}, PT, {x}, {y}, PT"));
        self.pred_store(spilled);
        Ok(())
    }

    /// `if`: threads where `cond` is false branch past the then-block (to the else-block,
    /// if any); all meet again at a `BSYNC` on the barrier register of this nesting level,
    /// set up by `BSSY` before the branch.
    /// A 64-bit atomic add to shared memory, as ptxas writes it: the word read, the sum
    /// offered by compare-and-swap (`ATOMS.CAST.SPIN.64`, which gives 1 where it
    /// swapped), again until it takes; the result is the word it replaced.
    fn shared_add64(&mut self, result: Option<Value>, ptr: Value, a: Value) -> Result<()> {
        let f = self.f;
        if self.depth == MAX_NESTING {
            return Err(refuse(
                f,
                format!("control flow nested deeper than {MAX_NESTING} levels"),
            ));
        }
        let (p, a) = (self.reg(ptr)?, self.regs.loc(f, a)?);
        let v = result.ok_or_else(|| refuse(f, "an atomic without its result"))?;
        let old = self.regs.define(f, v)?;
        let n = self.regs.scratch_run(f, 2)?;
        let (o0, o1, a0, a1) = (old.reg(0), old.reg(1), a.reg(0), a.reg(1));
        let (n0, n1) = (format!("R{n}"), format!("R{}", n + 1));
        let b = format!("B{}", self.depth);
        let (head, after) = (self.label(), self.label());
        self.emit("", format!("BSSY {b}, `({after})"));
        self.lines.push(Line::Label(head.clone()));
        for line in [
            format!("LDS.64 {o0}, [{p}]"),
            format!("IADD3 {n0}, {SCRATCH_P}, {o0}, {a0}, RZ"),
            format!("IADD3.X {n1}, {o1}, {a1}, RZ, {SCRATCH_P}, !PT"),
            format!("ATOMS.CAST.SPIN.64 {n0}, [{p}], {o0}, {n0}"),
            format!("ISETP.EQ.U32.AND {SCRATCH_P}, PT, {n0}, 0x1, PT"),
            format!("ISETP.EQ.U32.AND.EX {SCRATCH_P}, PT, {n1}, RZ, PT, {SCRATCH_P}"),
        ] {
            self.emit("", line);
        }
        self.emit(&format!("@!{SCRATCH_P} "), format!("BRA `({head})"));
        self.emit("", format!("BSYNC {b}"));
        self.lines.push(Line::Label(after));
        self.regs.give_back(&[n, n + 1]);
        Ok(())
    }

    fn if_(&mut self, cond: Value, then_: &Block, else_: &Block) -> Result<()> {
        if self.depth == MAX_NESTING {
            return Err(refuse(
                self.f,
                format!("control flow nested deeper than {MAX_NESTING} levels"),
            ));
        }
        let b = format!("B{}", self.depth);
        let p = self.pred_src(cond, SCRATCH_P)?;
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
        } else {
            // Empty yields alone: no code, but positions as the register pass numbers
            // them, so that values are given back after their true last use.
            self.pos += else_.insts.len();
        }
        self.depth -= 1;
        self.lines.push(Line::Label(join));
        self.emit("", format!("BSYNC {b}"));
        self.lines.push(Line::Label(after));
        Ok(())
    }
}

/// An instruction's mnemonic: its text up to the first space.
fn mnemonic(text: &str) -> &str {
    text.split_whitespace().next().unwrap_or("")
}

/// Whether the encoding tables hold `text`'s form (they hold what ptxas was seen to write).
fn encodable(text: &str) -> bool {
    let (Ok(tables), Ok(parsed)) = (Tables::sm90(), crate::syntax::parse(text)) else {
        return false;
    };
    tables.encode(&parsed, Control::default(), 0).is_ok()
}

/// A 32-bit immediate as the signed fields of IMAD's forms take it (`-0x7`; MOV's field
/// is unsigned).
fn signed_hex(v: u32) -> String {
    match v as i32 {
        n if n < 0 => format!("-{:#x}", n.unsigned_abs()),
        n => format!("{n:#x}"),
    }
}

/// A refusal raised while selecting `inst` names it as the IR prints it (once: the
/// innermost instruction of nested blocks).
fn at_inst(e: SassError, f: &Function, inst: &Inst) -> SassError {
    match e {
        SassError::Codegen { kernel, msg } if !msg.contains(" (at `") => SassError::Codegen {
            kernel,
            msg: format!("{msg} (at `{}`)", quench_ir::print::inst_header(f, inst)),
        },
        e => e,
    }
}

/// The IR's name of an operation, for refusals.
fn op_name(op: &Op) -> String {
    let mut text = format!("{op:?}");
    text.truncate(text.find([' ', '{', '(']).unwrap_or(text.len()));
    text
}
