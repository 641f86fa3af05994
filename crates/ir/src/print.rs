//! The text form of a kernel: a line-oriented format that [`parse`](mod@crate::parse) reads back.
//!
//! ```text
//! kernel row_sum(x: ptr<global, f32>, y: ptr<global, f32>, n: u32) max_threads=256 {
//!   shared tile: f32[256] align=16
//!   %0: ptr<global, f32> = param 0 // x
//!   %1: ptr<global, f32> = param 1 // y
//!   %2: u32 = param 2 // n
//!   %3: ptr<shared, f32> = shared_addr 0 // tile
//!   %4: u32 = special tid.x
//!   %5: f32 = const 0.0
//!   %6: u32 = special ntid.x
//!   %12: f32 = for %7: u32 = %4 to %2 step %6 iter(%8: f32 = %5) {
//!     %9: ptr<global, f32> = ptr_add %0, %7
//!     %10: f32 = load.nc %9
//!     %11: f32 = add.rn %8, %10
//!     yield %11
//!   }
//!   %13: ptr<shared, f32> = ptr_add %3, %4
//!   store %13, %12
//!   barrier
//!   %14: u32 = const 0
//!   %15: pred = cmp.eq %4, %14
//!   if %15 {
//!     %16: u32 = special ctaid.x
//!     %17: ptr<global, f32> = ptr_add %1, %16
//!     store.cs %17, %12
//!     yield
//!   }
//! }
//! ```
//!
//! # Grammar
//!
//! One item per line; `//` starts a comment that runs to the end of the line.
//!
//! ```text
//! kernel  := 'kernel' name '(' [name ':' type {',' name ':' type}] ')'
//!            'max_threads=' int [args] '{' NL {shared NL} {inst NL} '}'
//! shared  := 'shared' name ':' scalar '[' int ']' 'align=' int
//! name    := identifier | string            (strings in double quotes, with \" \\ \n \t \r \u{hex})
//! inst    := [value ':' type {',' value ':' type} '='] op
//! value   := '%' int
//! args    := 'args(' [value ':' type {',' value ':' type}] ')'
//! type    := scalar | 'vec' int '<' scalar '>' | 'ptr<' space ',' scalar '>'
//!          | 'frag<' shape ',' role ',' scalar '>'
//! scalar  := pred | s8 | s16 | s32 | s64 | u8 | u16 | u32 | u64 | f16 | bf16 | f32 | f64
//!          | f16x2 | bf16x2
//! space   := global | shared | local        shape := m16n8k16 | m16n8k32     role := a | b | c
//! ```
//!
//! Operations, with `[T]` an optional type written where the operation carries one
//! (it is left out when it equals the type of the single result) and `{.x}` an optional
//! modifier:
//!
//! | operation | text |
//! |---|---|
//! | `Const` | `const [T] literal` — `true`/`false`, a decimal integer, a float (`1.5`, `-0.0`, `1e-7`, `inf`, `-inf`) or raw bits `0x…` (NaNs, packed pairs) |
//! | `Param` | `param index` (the parameter's name follows as a comment) |
//! | `Special` | `special tid.x` (`tid.*`, `ntid.*`, `ctaid.*`, `nctaid.*`, `laneid`, `warpid`, `clock`, `clock64`, `globaltimer`) |
//! | `Bin` | `add{.rnd} %a, %b` for `add sub mul mulhi div rem min max and or xor shl shr` |
//! | `Fma` | `fma.rnd %a, %b, %c` |
//! | `Dp4a` | `dp4a.{u32,s32}.{u32,s32} %a, %b, %c` (the signedness of `a`'s bytes, then `b`'s) |
//! | `Un` | `neg abs not popc clz`, `sqrt.rnd rcp.rnd round.rnd`, `rcp.approx rsqrt.approx ex2.approx lg2.approx tanh.approx sin.approx cos.approx`, each `%a` |
//! | `DivApprox` | `div.approx %a, %b` |
//! | `Cmp` | `cmp.{eq,ne,lt,le,gt,ge} %a, %b` |
//! | `Select` | `select %cond, %a, %b` |
//! | `Cvt` | `cvt{.rnd}{.sat} [scalar] %a` |
//! | `Bitcast` | `bitcast [T] %a` |
//! | `Pack` | `pack [T] %p0, %p1, …` |
//! | `Extract` | `extract %a, index` |
//! | `PtrAdd` | `ptr_add %ptr, %index` |
//! | `PtrCast` | `ptr_cast [scalar] %ptr` (left out when the result points to it) |
//! | `SharedAddr` | `shared_addr index` (the array's name follows as a comment) |
//! | `Load` | `load{.cache} [T] %ptr` |
//! | `Store` | `store{.cache} %ptr, %value` |
//! | `Barrier` | `barrier` |
//! | `Fence` | `fence.ordering.scope` |
//! | `Atomic` | `atom.op.ordering.scope %ptr, %a{, %b}` |
//! | `Shfl` | `shfl.{idx,up,down,bfly} %value, %b, %c, %mask` |
//! | `Vote` | `vote.{all,any,ballot} %pred, %mask` |
//! | `Redux` | `redux.{add,min,max,and,or,xor} %value, %mask` |
//! | `Mma` | `mma.shape %a, %b, %c` |
//! | `LdMatrix` | `ldmatrix.x{num}{.trans} [T] %ptr` |
//! | `CpAsync` | `cp_async{.cache} %dst, %src, bytes` |
//! | `CpAsyncCommit`, `CpAsyncWait` | `cp_async.commit`, `cp_async.wait n` |
//! | `WgmmaDesc` | `wgmma_desc.{none,b32,b64,b128} %ptr, lbo, sbo` |
//! | `Wgmma` | `wgmma.shape.{f16,bf16} %a, %b, %c` |
//! | `WgmmaFence`, `WgmmaCommit`, `WgmmaWait` | `wgmma.fence`, `wgmma.commit`, `wgmma.wait n` |
//! | `FenceProxyAsync` | `fence_proxy_async` |
//! | `MbarrierInit`, `MbarrierArrive`, `MbarrierWait` | `mbarrier.init %bar, %count`, `mbarrier.arrive %bar`, `mbarrier.wait %bar, %parity` |
//! | `CpAsyncMbarrierArrive` | `cp_async.mbarrier_arrive %bar` |
//! | `If` | `if %cond [-> (T, …)] [args] {` NL then-block `} else [args] {` NL else-block `}` |
//! | `For` | `for %iv: T = %lo to %hi step %step [iter(%arg: T = %init, …)] {` NL body `}` |
//! | `Yield`, `Return` | `yield %v, …`, `return` |
//!
//! Rounding is `rn rz rm rp`; cache operators `ca cg cs lu cv wb wt nc` (the default is
//! written as no modifier); orderings `relaxed acquire release acq_rel sc`; scopes
//! `cta gpu sys`; atomic operations `add min max and or xor exch cas`.
//!
//! An `else` block that holds only `yield` is left out. The `if` result list `-> (…)`
//! is written only where it differs from the types of the result values, and `args(…)`
//! only where a block that takes no arguments has some; a `for` whose body arguments are
//! not the induction variable plus one per carried value is written
//! `for %lo to %hi step %step args(…) init(…) {`. These rules make the text exact,
//! well-formed or not: `parse(print(f)) == f` for every kernel in which each entry of
//! the value table is defined (by an instruction or a block argument) and every value
//! mentioned is in the table; the verifier checks both.

use std::fmt::{self, Write};

use crate::func::{Block, Function, Inst, Value};
use crate::ops::*;
use crate::types::{Scalar, Type};

/// The text form of `f` (see the module documentation for the grammar).
pub fn print(f: &Function) -> String {
    let mut p = Printer {
        f,
        out: String::new(),
    };
    p.kernel();
    p.out
}

impl fmt::Display for Function {
    fn fmt(&self, fmt: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt.write_str(&print(self))
    }
}

/// One instruction as a single line: for `if`/`for` the header without its blocks.
/// Used to name instructions in errors (the verifier's, the code generators').
pub fn inst_header(f: &Function, inst: &Inst) -> String {
    let mut s = String::new();
    results(f, inst, &mut s);
    op_text(f, inst, &mut s);
    s
}

struct Printer<'a> {
    f: &'a Function,
    out: String,
}

impl Printer<'_> {
    fn kernel(&mut self) {
        let f = self.f;
        let params: Vec<String> = f
            .params
            .iter()
            .map(|p| format!("{}: {}", name_text(&p.name), p.ty))
            .collect();
        let _ = write!(
            self.out,
            "kernel {}({}) max_threads={}",
            name_text(&f.name),
            params.join(", "),
            f.max_threads
        );
        block_args(f, " ", &f.body.args, &mut self.out);
        self.out.push_str(" {\n");
        for d in &f.shared {
            let _ = writeln!(
                self.out,
                "  shared {}: {}[{}] align={}",
                name_text(&d.name),
                d.elem,
                d.len,
                d.align
            );
        }
        self.insts(&f.body, 1);
        self.out.push_str("}\n");
    }

    fn insts(&mut self, b: &Block, depth: usize) {
        for inst in &b.insts {
            indent(depth, &mut self.out);
            self.out.push_str(&inst_header(self.f, inst));
            match &inst.op {
                Op::If { then_, else_, .. } => {
                    self.out.push_str(" {\n");
                    self.insts(then_, depth + 1);
                    indent(depth, &mut self.out);
                    if is_empty_else(else_) {
                        self.out.push_str("}\n");
                    } else {
                        self.out.push_str("} else");
                        block_args(self.f, " ", &else_.args, &mut self.out);
                        self.out.push_str(" {\n");
                        self.insts(else_, depth + 1);
                        indent(depth, &mut self.out);
                        self.out.push_str("}\n");
                    }
                }
                Op::For { body, .. } => {
                    self.out.push_str(" {\n");
                    self.insts(body, depth + 1);
                    indent(depth, &mut self.out);
                    self.out.push_str("}\n");
                }
                _ => self.out.push('\n'),
            }
        }
    }
}

/// An `else` that does nothing: no arguments, just `yield` with no values.
pub(crate) fn is_empty_else(b: &Block) -> bool {
    b.args.is_empty()
        && matches!(b.insts.as_slice(), [Inst { results, op: Op::Yield(v) }] if results.is_empty() && v.is_empty())
}

fn indent(depth: usize, out: &mut String) {
    for _ in 0..depth {
        out.push_str("  ");
    }
}

/// Whether `s` can be written bare: an ASCII letter or `_`, then letters, digits, `_`.
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A name bare if it is an identifier, else as a quoted string.
fn name_text(s: &str) -> String {
    if is_identifier(s) {
        return s.to_string();
    }
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn ty_text(f: &Function, v: Value) -> String {
    match f.values.get(v.index()) {
        Some(t) => t.to_string(),
        None => "?".to_string(),
    }
}

fn typed_values(f: &Function, vals: &[Value]) -> String {
    let parts: Vec<String> = vals
        .iter()
        .map(|v| format!("{v}: {}", ty_text(f, *v)))
        .collect();
    parts.join(", ")
}

fn block_args(f: &Function, sep: &str, args: &[Value], out: &mut String) {
    if !args.is_empty() {
        let _ = write!(out, "{sep}args({})", typed_values(f, args));
    }
}

fn results(f: &Function, inst: &Inst, out: &mut String) {
    if !inst.results.is_empty() {
        out.push_str(&typed_values(f, &inst.results));
        out.push_str(" = ");
    }
}

fn list(vals: &[Value]) -> String {
    let parts: Vec<String> = vals.iter().map(|v| v.to_string()).collect();
    parts.join(", ")
}

/// The type of the instruction's only result, if it has exactly one.
fn single_result(f: &Function, inst: &Inst) -> Option<Type> {
    match inst.results.as_slice() {
        [r] => f.values.get(r.index()).copied(),
        _ => None,
    }
}

/// ` T` where the op's own type is not implied by its single result.
fn explicit(f: &Function, inst: &Inst, ty: Type) -> String {
    if single_result(f, inst) == Some(ty) {
        String::new()
    } else {
        format!(" {ty}")
    }
}

fn rnd_suffix(r: Option<Round>) -> String {
    r.map(|r| format!(".{}", r.name())).unwrap_or_default()
}

fn cache_suffix(c: CacheOp) -> String {
    if c == CacheOp::Default {
        String::new()
    } else {
        format!(".{}", c.name())
    }
}

/// The text spelling of a unary operation, with its modifiers: what the parser reads
/// back, and the base of the interpreter's PTX-style mnemonics.
pub fn un_name(op: UnOp) -> String {
    match op {
        UnOp::Neg => "neg".into(),
        UnOp::Abs => "abs".into(),
        UnOp::Not => "not".into(),
        UnOp::Sqrt(r) => format!("sqrt.{}", r.name()),
        UnOp::Rcp(r) => format!("rcp.{}", r.name()),
        UnOp::RcpApprox => "rcp.approx".into(),
        UnOp::RsqrtApprox => "rsqrt.approx".into(),
        UnOp::Ex2Approx => "ex2.approx".into(),
        UnOp::Lg2Approx => "lg2.approx".into(),
        UnOp::TanhApprox => "tanh.approx".into(),
        UnOp::SinApprox => "sin.approx".into(),
        UnOp::CosApprox => "cos.approx".into(),
        UnOp::RoundInt(r) => format!("round.{}", r.name()),
        UnOp::Popc => "popc".into(),
        UnOp::Clz => "clz".into(),
    }
}

/// `dp4a`'s name for bytes read signed or unsigned.
pub(crate) fn byte_sign(signed: bool) -> &'static str {
    if signed {
        "s32"
    } else {
        "u32"
    }
}

fn op_text(f: &Function, inst: &Inst, out: &mut String) {
    let s = match &inst.op {
        Op::Const { ty, bits } => format!(
            "const{} {}",
            explicit(f, inst, *ty),
            const_literal(*ty, *bits)
        ),
        Op::Param(i) => match f.params.get(*i as usize) {
            Some(p) => format!("param {i} // {}", name_text(&p.name)),
            None => format!("param {i}"),
        },
        Op::Special(s) => format!("special {}", s.name()),
        Op::Bin { op, rnd, a, b } => format!("{}{} {a}, {b}", op.name(), rnd_suffix(*rnd)),
        Op::Fma { rnd, a, b, c } => format!("fma.{} {a}, {b}, {c}", rnd.name()),
        Op::Dp4a {
            a_signed,
            b_signed,
            a,
            b,
            c,
        } => {
            format!(
                "dp4a.{}.{} {a}, {b}, {c}",
                byte_sign(*a_signed),
                byte_sign(*b_signed)
            )
        }
        Op::Un { op, a } => format!("{} {a}", un_name(*op)),
        Op::DivApprox { a, b } => format!("div.approx {a}, {b}"),
        Op::Cmp { op, a, b } => format!("cmp.{} {a}, {b}", op.name()),
        Op::Select { cond, a, b } => format!("select {cond}, {a}, {b}"),
        Op::Cvt { to, rnd, sat, a } => format!(
            "cvt{}{}{} {a}",
            rnd_suffix(*rnd),
            if *sat { ".sat" } else { "" },
            explicit(f, inst, Type::Scalar(*to))
        ),
        Op::Bitcast { to, a } => format!("bitcast{} {a}", explicit(f, inst, *to)),
        Op::Pack { ty, parts } => {
            let sep = if parts.is_empty() { "" } else { " " };
            format!("pack{}{sep}{}", explicit(f, inst, *ty), list(parts))
        }
        Op::Extract { a, index } => format!("extract {a}, {index}"),
        Op::PtrAdd { ptr, index } => format!("ptr_add {ptr}, {index}"),
        Op::PtrCast { to, ptr } => {
            let implied = matches!(single_result(f, inst), Some(Type::Ptr(_, p)) if p == *to);
            if implied {
                format!("ptr_cast {ptr}")
            } else {
                format!("ptr_cast {to} {ptr}")
            }
        }
        Op::SharedAddr { decl } => match f.shared.get(*decl as usize) {
            Some(d) => format!("shared_addr {decl} // {}", name_text(&d.name)),
            None => format!("shared_addr {decl}"),
        },
        Op::Load { ty, ptr, cache } => format!(
            "load{}{} {ptr}",
            cache_suffix(*cache),
            explicit(f, inst, *ty)
        ),
        Op::Store { ptr, value, cache } => format!("store{} {ptr}, {value}", cache_suffix(*cache)),
        Op::Barrier => "barrier".into(),
        Op::Fence { ord, scope } => format!("fence.{}.{}", ord.name(), scope.name()),
        Op::Atomic {
            op,
            ord,
            scope,
            ptr,
            a,
            b,
        } => {
            let third = b.map(|b| format!(", {b}")).unwrap_or_default();
            format!(
                "atom.{}.{}.{} {ptr}, {a}{third}",
                op.name(),
                ord.name(),
                scope.name()
            )
        }
        Op::Shfl {
            mode,
            value,
            b,
            c,
            mask,
        } => format!("shfl.{} {value}, {b}, {c}, {mask}", mode.name()),
        Op::Vote { mode, pred, mask } => format!("vote.{} {pred}, {mask}", mode.name()),
        Op::Redux { op, value, mask } => format!("redux.{} {value}, {mask}", op.name()),
        Op::Mma { shape, a, b, c } => format!("mma.{} {a}, {b}, {c}", shape.name()),
        Op::LdMatrix {
            ty,
            num,
            trans,
            ptr,
        } => {
            format!(
                "ldmatrix.x{num}{}{} {ptr}",
                if *trans { ".trans" } else { "" },
                explicit(f, inst, *ty)
            )
        }
        Op::CpAsync {
            dst,
            src,
            bytes,
            cache,
        } => format!("cp_async{} {dst}, {src}, {bytes}", cache_suffix(*cache)),
        Op::CpAsyncCommit => "cp_async.commit".into(),
        Op::CpAsyncWait { n } => format!("cp_async.wait {n}"),
        Op::WgmmaDesc {
            ptr,
            lbo,
            sbo,
            swizzle,
        } => format!("wgmma_desc.{} {ptr}, {lbo}, {sbo}", swizzle.name()),
        Op::Wgmma {
            shape, ab, a, b, c, ..
        } => format!("wgmma.{}.{ab} {a}, {b}, {c}", shape.name()),
        Op::WgmmaFence => "wgmma.fence".into(),
        Op::WgmmaCommit => "wgmma.commit".into(),
        Op::WgmmaWait { n } => format!("wgmma.wait {n}"),
        Op::FenceProxyAsync => "fence_proxy_async".into(),
        Op::MbarrierInit { bar, count } => format!("mbarrier.init {bar}, {count}"),
        Op::MbarrierArrive { bar } => format!("mbarrier.arrive {bar}"),
        Op::MbarrierWait { bar, parity } => format!("mbarrier.wait {bar}, {parity}"),
        Op::CpAsyncMbarrierArrive { bar } => format!("cp_async.mbarrier_arrive {bar}"),
        Op::If {
            cond,
            then_,
            results,
            ..
        } => {
            let implied = inst.results.len() == results.len()
                && inst
                    .results
                    .iter()
                    .zip(results)
                    .all(|(v, t)| f.values.get(v.index()) == Some(t));
            let mut s = format!("if {cond}");
            if !implied {
                let tys: Vec<String> = results.iter().map(|t| t.to_string()).collect();
                let _ = write!(s, " -> ({})", tys.join(", "));
            }
            block_args(f, " ", &then_.args, &mut s);
            s
        }
        Op::For {
            lo,
            hi,
            step,
            init,
            body,
        } => {
            if body.args.len() == init.len() + 1 {
                let iv = body.args[0];
                let mut s = format!("for {iv}: {} = {lo} to {hi} step {step}", ty_text(f, iv));
                if !init.is_empty() {
                    let pairs: Vec<String> = body.args[1..]
                        .iter()
                        .zip(init)
                        .map(|(a, i)| format!("{a}: {} = {i}", ty_text(f, *a)))
                        .collect();
                    let _ = write!(s, " iter({})", pairs.join(", "));
                }
                s
            } else {
                format!(
                    "for {lo} to {hi} step {step} args({}) init({})",
                    typed_values(f, &body.args),
                    list(init)
                )
            }
        }
        Op::Yield(vals) if vals.is_empty() => "yield".into(),
        Op::Yield(vals) => format!("yield {}", list(vals)),
        Op::Return => "return".into(),
    };
    out.push_str(&s);
}

/// A constant's literal: the value where it prints exactly, else its raw bits.
fn const_literal(ty: Type, bits: u64) -> String {
    let hex = format!("0x{bits:x}");
    let Type::Scalar(s) = ty else { return hex };
    if s != Scalar::Pred && s.bits() < 64 && bits >> s.bits() != 0 {
        return hex;
    }
    match s {
        Scalar::Pred => match bits {
            0 => "false".into(),
            1 => "true".into(),
            _ => hex,
        },
        s if s.is_unsigned() => bits.to_string(),
        s if s.is_signed() => {
            let shift = 64 - s.bits();
            (((bits << shift) as i64) >> shift).to_string()
        }
        s if s.is_float() => {
            let text = float_text(s, bits);
            // Only a literal that reads back to the same bits is exact.
            match text {
                Some(t) if float_bits(s, &t) == Some(bits) => t,
                _ => hex,
            }
        }
        _ => hex,
    }
}

fn float_text(s: Scalar, bits: u64) -> Option<String> {
    let x = match s {
        Scalar::F16 => half::f16::from_bits(bits as u16).to_f64(),
        Scalar::BF16 => half::bf16::from_bits(bits as u16).to_f64(),
        Scalar::F32 => f32::from_bits(bits as u32) as f64,
        Scalar::F64 => f64::from_bits(bits),
        _ => return None,
    };
    if x.is_nan() {
        return None;
    }
    if x.is_infinite() {
        return Some(if x > 0.0 { "inf" } else { "-inf" }.into());
    }
    // Shortest text that reads back to the same value in the type's own precision
    // (f16/bf16 values are exact in f32).
    Some(match s {
        Scalar::F64 => format!("{x:?}"),
        _ => format!("{:?}", x as f32),
    })
}

/// The bits of float literal `text` in scalar type `s` (shared with the parser).
pub(crate) fn float_bits(s: Scalar, text: &str) -> Option<u64> {
    let x: f64 = match text {
        "inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        t => {
            // Rust accepts "nan" and "infinity"; the format spells those as raw bits.
            if !t
                .bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
            {
                return None;
            }
            if s == Scalar::F32 {
                return t.parse::<f32>().ok().map(|x| x.to_bits() as u64);
            }
            t.parse::<f64>().ok()?
        }
    };
    match s {
        Scalar::F16 => Some(half::f16::from_f64(x).to_bits() as u64),
        Scalar::BF16 => Some(half::bf16::from_f64(x).to_bits() as u64),
        Scalar::F32 => Some((x as f32).to_bits() as u64),
        Scalar::F64 => Some(x.to_bits()),
        _ => None,
    }
}
