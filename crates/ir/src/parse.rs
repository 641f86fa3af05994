//! Reads the text form written by [`print`](mod@crate::print) (the grammar is documented there).
//!
//! The parser checks syntax and that every value has one type; whether the kernel is
//! well formed is the verifier's question ([`verify`](mod@crate::verify)).

mod lex;

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use crate::func::{Block, Function, Inst, Param, SharedDecl, Value};
use crate::ops::*;
use crate::print::float_bits;
use crate::types::{AddrSpace, FragRole, FragType, MmaShape, Scalar, Swizzle, Type};
use lex::{Lexer, Tok, Token};

/// Blocks nested deeper than this are refused (the parser recurses per block).
pub const MAX_NESTING: usize = 200;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}, column {column}: {kind}")]
pub struct ParseError {
    pub line: u32,
    pub column: u32,
    pub kind: ParseErrorKind,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseErrorKind {
    #[error("expected {expected}, found {found}")]
    Expected { expected: String, found: String },
    #[error("unknown {what} `{name}`")]
    Unknown { what: &'static str, name: String },
    #[error("invalid number `{text}`: {why}")]
    BadNumber { text: String, why: String },
    #[error("unexpected character {0:?}")]
    BadChar(char),
    #[error("unterminated string")]
    UnterminatedString,
    #[error("invalid escape `{0}` in string")]
    BadEscape(String),
    #[error("{0} is used but never defined")]
    Undefined(Value),
    #[error("{0} is never defined: values are numbered from %0 without gaps")]
    Gap(Value),
    #[error("{value} is defined with type {second} here, but with {first} before")]
    TypeConflict {
        value: Value,
        first: Type,
        second: Type,
    },
    #[error("blocks nested deeper than {MAX_NESTING}")]
    TooDeep,
}

/// Parse one kernel.
pub fn parse(text: &str) -> Result<Function, ParseError> {
    let mut p = Parser {
        lex: Lexer::new(text),
        peeked: None,
        defs: HashMap::new(),
        uses: HashMap::new(),
        use_order: vec![],
        depth: 0,
    };
    p.kernel()
}

type Pos = (u32, u32);

struct Parser<'a> {
    lex: Lexer<'a>,
    peeked: Option<Token>,
    /// Type and place of each value's first definition.
    defs: HashMap<u32, (Type, Pos)>,
    /// Place of each value's first use, and the order of first uses.
    uses: HashMap<u32, Pos>,
    use_order: Vec<u32>,
    depth: usize,
}

const SCOPES: [Scope; 3] = [Scope::Cta, Scope::Gpu, Scope::Sys];
const ORDERINGS: [Ordering; 5] = [
    Ordering::Relaxed,
    Ordering::Acquire,
    Ordering::Release,
    Ordering::AcqRel,
    Ordering::SeqCst,
];
const ATOM_OPS: [AtomOp; 8] = [
    AtomOp::Add,
    AtomOp::Min,
    AtomOp::Max,
    AtomOp::And,
    AtomOp::Or,
    AtomOp::Xor,
    AtomOp::Exch,
    AtomOp::Cas,
];
const SHFL_MODES: [ShflMode; 4] = [ShflMode::Idx, ShflMode::Up, ShflMode::Down, ShflMode::Bfly];
const VOTE_MODES: [VoteMode; 3] = [VoteMode::All, VoteMode::Any, VoteMode::Ballot];
const REDUX_OPS: [ReduxOp; 6] = [
    ReduxOp::Add,
    ReduxOp::Min,
    ReduxOp::Max,
    ReduxOp::And,
    ReduxOp::Or,
    ReduxOp::Xor,
];

fn by_name<T: Copy>(all: &[T], name: impl Fn(T) -> &'static str, s: &str) -> Option<T> {
    all.iter().copied().find(|x| name(*x) == s)
}

/// The modifiers after an operation's base name (`atom.add.relaxed.gpu`), consumed in
/// order; whatever is left over is an error.
struct Mods<'m> {
    base: &'m str,
    rest: Vec<&'m str>,
    pos: Pos,
}

impl<'m> Mods<'m> {
    /// Take the next modifier if `f` recognises it.
    fn take<T>(&mut self, f: impl Fn(&str) -> Option<T>) -> Option<T> {
        let first = self.rest.first()?;
        let v = f(first)?;
        self.rest.remove(0);
        Some(v)
    }

    /// Take the next modifier, which must be one that `f` recognises.
    fn need<T>(
        &mut self,
        what: &'static str,
        f: impl Fn(&str) -> Option<T>,
    ) -> Result<T, ParseError> {
        match self.rest.first().copied() {
            Some(m) => {
                let v = f(m).ok_or_else(|| {
                    self.err(ParseErrorKind::Expected {
                        expected: format!("{what} after `{}`", self.base),
                        found: format!("`.{m}`"),
                    })
                })?;
                self.rest.remove(0);
                Ok(v)
            }
            None => Err(self.err(ParseErrorKind::Expected {
                expected: format!("{what} after `{}`", self.base),
                found: "none".into(),
            })),
        }
    }

    fn flag(&mut self, name: &str) -> bool {
        self.take(|m| (m == name).then_some(())).is_some()
    }

    fn done(&self) -> Result<(), ParseError> {
        match self.rest.first() {
            None => Ok(()),
            Some(m) => Err(self.err(ParseErrorKind::Unknown {
                what: "modifier",
                name: format!("{}.{m}", self.base),
            })),
        }
    }

    fn err(&self, kind: ParseErrorKind) -> ParseError {
        ParseError {
            line: self.pos.0,
            column: self.pos.1,
            kind,
        }
    }
}

fn round_name(s: &str) -> Option<Round> {
    by_name(&Round::ALL, Round::name, s)
}

fn cache_name(s: &str) -> Option<CacheOp> {
    by_name(&CacheOp::ALL, CacheOp::name, s)
}

/// Whether a word starts a type.
fn is_type_word(w: &str) -> bool {
    Scalar::from_name(w).is_some()
        || w == "ptr"
        || w == "frag"
        || w.strip_prefix("vec")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

impl Parser<'_> {
    // ---- tokens ------------------------------------------------------------------

    fn peek(&mut self) -> Result<&Token, ParseError> {
        if self.peeked.is_none() {
            self.peeked = Some(self.lex.next_token()?);
        }
        // Just filled above.
        Ok(self.peeked.as_ref().expect("peeked token"))
    }

    fn next(&mut self) -> Result<Token, ParseError> {
        match self.peeked.take() {
            Some(t) => Ok(t),
            None => self.lex.next_token(),
        }
    }

    fn at(t: &Token, kind: ParseErrorKind) -> ParseError {
        ParseError {
            line: t.line,
            column: t.col,
            kind,
        }
    }

    fn expected(t: &Token, expected: impl Into<String>) -> ParseError {
        Self::at(
            t,
            ParseErrorKind::Expected {
                expected: expected.into(),
                found: t.tok.describe(),
            },
        )
    }

    fn peek_is(&mut self, tok: &Tok) -> Result<bool, ParseError> {
        Ok(&self.peek()?.tok == tok)
    }

    fn peek_word(&mut self, w: &str) -> Result<bool, ParseError> {
        Ok(matches!(&self.peek()?.tok, Tok::Word(x) if x == w))
    }

    fn eat(&mut self, tok: &Tok) -> Result<bool, ParseError> {
        let yes = self.peek_is(tok)?;
        if yes {
            self.next()?;
        }
        Ok(yes)
    }

    fn punct(&mut self, c: char) -> Result<(), ParseError> {
        let t = self.next()?;
        if t.tok == Tok::Punct(c) {
            Ok(())
        } else {
            Err(Self::expected(&t, format!("`{c}`")))
        }
    }

    fn keyword(&mut self, w: &str) -> Result<(), ParseError> {
        let t = self.next()?;
        match &t.tok {
            Tok::Word(x) if x == w => Ok(()),
            _ => Err(Self::expected(&t, format!("`{w}`"))),
        }
    }

    fn word(&mut self, what: &str) -> Result<(String, Token), ParseError> {
        let t = self.next()?;
        match &t.tok {
            Tok::Word(w) => Ok((w.clone(), t)),
            _ => Err(Self::expected(&t, what)),
        }
    }

    fn end_of_line(&mut self) -> Result<(), ParseError> {
        let t = self.next()?;
        if t.tok == Tok::Newline {
            Ok(())
        } else {
            Err(Self::expected(&t, "end of line"))
        }
    }

    fn skip_newlines(&mut self) -> Result<(), ParseError> {
        while self.eat(&Tok::Newline)? {}
        Ok(())
    }

    fn uint<T: TryFrom<u64>>(&mut self, what: &str) -> Result<T, ParseError> {
        let t = self.next()?;
        let Tok::Number(text) = &t.tok else {
            return Err(Self::expected(&t, what));
        };
        let bad = |why: &str| {
            Self::at(
                &t,
                ParseErrorKind::BadNumber {
                    text: text.clone(),
                    why: why.into(),
                },
            )
        };
        let n: u64 = text
            .parse()
            .map_err(|_| bad("expected a non-negative decimal integer"))?;
        T::try_from(n).map_err(|_| bad("out of range"))
    }

    fn name(&mut self, what: &str) -> Result<String, ParseError> {
        let t = self.next()?;
        match t.tok {
            Tok::Word(w) if !w.contains('.') => Ok(w),
            Tok::Str(s) => Ok(s),
            _ => Err(Self::expected(&t, what)),
        }
    }

    // ---- values ------------------------------------------------------------------

    fn value_token(&mut self, what: &str) -> Result<(Value, Pos), ParseError> {
        let t = self.next()?;
        match t.tok {
            Tok::Value(v) => Ok((Value(v), (t.line, t.col))),
            _ => Err(Self::expected(&t, what)),
        }
    }

    /// A use of a value.
    fn operand(&mut self) -> Result<Value, ParseError> {
        let (v, pos) = self.value_token("an operand (`%N`)")?;
        self.note_use(v, pos);
        Ok(v)
    }

    fn note_use(&mut self, v: Value, pos: Pos) {
        if let Entry::Vacant(e) = self.uses.entry(v.0) {
            e.insert(pos);
            self.use_order.push(v.0);
        }
    }

    fn operands(&mut self, n: usize) -> Result<Vec<Value>, ParseError> {
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if i > 0 {
                self.punct(',')?;
            }
            out.push(self.operand()?);
        }
        Ok(out)
    }

    /// Comma-separated operands up to the end of the line (or a closing `)`).
    fn operand_list(&mut self) -> Result<Vec<Value>, ParseError> {
        let mut out = vec![];
        if matches!(self.peek()?.tok, Tok::Newline | Tok::Punct(')')) {
            return Ok(out);
        }
        loop {
            out.push(self.operand()?);
            if !self.eat(&Tok::Punct(','))? {
                return Ok(out);
            }
        }
    }

    fn define(&mut self, v: Value, ty: Type, pos: Pos) -> Result<(), ParseError> {
        match self.defs.get(&v.0) {
            Some((first, _)) if *first != ty => Err(ParseError {
                line: pos.0,
                column: pos.1,
                kind: ParseErrorKind::TypeConflict {
                    value: v,
                    first: *first,
                    second: ty,
                },
            }),
            Some(_) => Ok(()),
            None => {
                self.defs.insert(v.0, (ty, pos));
                Ok(())
            }
        }
    }

    /// `%v: T`, defining `%v`.
    fn typed_def(&mut self) -> Result<(Value, Type), ParseError> {
        let (v, pos) = self.value_token("a value (`%N`)")?;
        self.punct(':')?;
        let ty = self.ty()?;
        self.define(v, ty, pos)?;
        Ok((v, ty))
    }

    /// `args(%a: T, ...)` after the keyword.
    fn args_list(&mut self) -> Result<Vec<Value>, ParseError> {
        self.punct('(')?;
        let mut out = vec![];
        if self.eat(&Tok::Punct(')'))? {
            return Ok(out);
        }
        loop {
            out.push(self.typed_def()?.0);
            if !self.eat(&Tok::Punct(','))? {
                self.punct(')')?;
                return Ok(out);
            }
        }
    }

    fn opt_args(&mut self) -> Result<Vec<Value>, ParseError> {
        if self.peek_word("args")? {
            self.next()?;
            self.args_list()
        } else {
            Ok(vec![])
        }
    }

    // ---- types -------------------------------------------------------------------

    fn scalar(&mut self) -> Result<Scalar, ParseError> {
        let (w, t) = self.word("a scalar type")?;
        Scalar::from_name(&w).ok_or_else(|| {
            Self::at(
                &t,
                ParseErrorKind::Unknown {
                    what: "scalar type",
                    name: w,
                },
            )
        })
    }

    fn ty(&mut self) -> Result<Type, ParseError> {
        let (w, t) = self.word("a type")?;
        if let Some(s) = Scalar::from_name(&w) {
            return Ok(Type::Scalar(s));
        }
        let unknown = |what, name: String| Self::at(&t, ParseErrorKind::Unknown { what, name });
        match w.as_str() {
            "ptr" => {
                self.punct('<')?;
                let (sp, st) = self.word("an address space")?;
                let space = AddrSpace::from_name(&sp).ok_or_else(|| {
                    Self::at(
                        &st,
                        ParseErrorKind::Unknown {
                            what: "address space",
                            name: sp,
                        },
                    )
                })?;
                self.punct(',')?;
                let elem = self.scalar()?;
                self.punct('>')?;
                Ok(Type::Ptr(space, elem))
            }
            "frag" => {
                self.punct('<')?;
                let (sh, sht) = self.word("an MMA shape")?;
                let shape = MmaShape::from_name(&sh).ok_or_else(|| {
                    Self::at(
                        &sht,
                        ParseErrorKind::Unknown {
                            what: "MMA shape",
                            name: sh,
                        },
                    )
                })?;
                self.punct(',')?;
                let (r, rt) = self.word("a fragment role")?;
                let role = FragRole::from_name(&r).ok_or_else(|| {
                    Self::at(
                        &rt,
                        ParseErrorKind::Unknown {
                            what: "fragment role",
                            name: r,
                        },
                    )
                })?;
                self.punct(',')?;
                let elem = self.scalar()?;
                self.punct('>')?;
                Ok(Type::Frag(FragType { shape, role, elem }))
            }
            _ => match w.strip_prefix("vec").map(|n| n.parse::<u8>()) {
                Some(Ok(lanes)) => {
                    self.punct('<')?;
                    let elem = self.scalar()?;
                    self.punct('>')?;
                    Ok(Type::Vec(elem, lanes))
                }
                _ => Err(unknown("type", w)),
            },
        }
    }

    /// A type written after an operation, or the type of its single result.
    fn op_type(&mut self, results: &[(Value, Type)], base: &str) -> Result<Type, ParseError> {
        if let Tok::Word(w) = &self.peek()?.tok {
            if is_type_word(w) {
                return self.ty();
            }
        }
        match results {
            [(_, t)] => Ok(*t),
            _ => {
                let t = self.next()?;
                Err(Self::expected(
                    &t,
                    format!("a type after `{base}` (it has no single result to take it from)"),
                ))
            }
        }
    }

    // ---- kernel --------------------------------------------------------------------

    fn kernel(&mut self) -> Result<Function, ParseError> {
        self.skip_newlines()?;
        self.keyword("kernel")?;
        let name = self.name("the kernel's name")?;
        self.punct('(')?;
        let mut params = vec![];
        if !self.eat(&Tok::Punct(')'))? {
            loop {
                let pname = self.name("a parameter name")?;
                self.punct(':')?;
                let ty = self.ty()?;
                params.push(Param { name: pname, ty });
                if !self.eat(&Tok::Punct(','))? {
                    self.punct(')')?;
                    break;
                }
            }
        }
        self.keyword("max_threads")?;
        self.punct('=')?;
        let max_threads = self.uint("the thread count")?;
        let args = self.opt_args()?;
        self.punct('{')?;
        self.end_of_line()?;
        self.skip_newlines()?;
        let mut shared = vec![];
        while self.peek_word("shared")? {
            self.next()?;
            let sname = self.name("a shared array name")?;
            self.punct(':')?;
            let elem = self.scalar()?;
            self.punct('[')?;
            let len = self.uint("the array length")?;
            self.punct(']')?;
            self.keyword("align")?;
            self.punct('=')?;
            let align = self.uint("the alignment in bytes")?;
            self.end_of_line()?;
            self.skip_newlines()?;
            shared.push(SharedDecl {
                name: sname,
                elem,
                len,
                align,
            });
        }
        let insts = self.block_insts()?;
        self.punct('}')?;
        self.skip_newlines()?;
        let t = self.next()?;
        if t.tok != Tok::Eof {
            return Err(Self::expected(&t, "end of input after the kernel"));
        }
        let values = self.value_table()?;
        Ok(Function {
            name,
            params,
            shared,
            max_threads,
            values,
            body: Block { args, insts },
        })
    }

    /// Every used value must be defined, and the numbers must cover `0..n` (they index
    /// the kernel's value table).
    fn value_table(&self) -> Result<Vec<Type>, ParseError> {
        for v in &self.use_order {
            if !self.defs.contains_key(v) {
                let (line, column) = self.uses[v];
                return Err(ParseError {
                    line,
                    column,
                    kind: ParseErrorKind::Undefined(Value(*v)),
                });
            }
        }
        let n = self.defs.len();
        if let Some(missing) = (0..n as u32).find(|v| !self.defs.contains_key(v)) {
            // Some definition numbered past the gap shows where the numbering breaks.
            let (line, column) = self
                .defs
                .iter()
                .filter(|(v, _)| **v > missing)
                .min_by_key(|(v, _)| **v)
                .map_or((1, 1), |(_, (_, pos))| *pos);
            return Err(ParseError {
                line,
                column,
                kind: ParseErrorKind::Gap(Value(missing)),
            });
        }
        Ok((0..n as u32).map(|v| self.defs[&v].0).collect())
    }

    /// Instructions up to (not including) the closing `}`.
    fn block_insts(&mut self) -> Result<Vec<Inst>, ParseError> {
        let mut insts = vec![];
        loop {
            self.skip_newlines()?;
            match self.peek()?.tok {
                Tok::Punct('}') => return Ok(insts),
                Tok::Eof => {
                    let t = self.next()?;
                    return Err(Self::expected(&t, "`}`"));
                }
                _ => {}
            }
            insts.push(self.inst()?);
            self.end_of_line()?;
        }
    }

    /// `{` NL instructions `}` with the given block arguments.
    fn nested_block(&mut self, args: Vec<Value>) -> Result<Block, ParseError> {
        let open = self.peek()?.clone();
        self.punct('{')?;
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(Self::at(&open, ParseErrorKind::TooDeep));
        }
        self.end_of_line()?;
        let insts = self.block_insts()?;
        self.punct('}')?;
        self.depth -= 1;
        Ok(Block { args, insts })
    }

    fn inst(&mut self) -> Result<Inst, ParseError> {
        let mut results = vec![];
        if matches!(self.peek()?.tok, Tok::Value(_)) {
            loop {
                results.push(self.typed_def()?);
                if !self.eat(&Tok::Punct(','))? {
                    self.punct('=')?;
                    break;
                }
            }
        }
        let op = self.op(&results)?;
        Ok(Inst {
            results: results.into_iter().map(|(v, _)| v).collect(),
            op,
        })
    }

    fn op(&mut self, results: &[(Value, Type)]) -> Result<Op, ParseError> {
        let (word, t) = self.word("an operation")?;
        let mut parts = word.split('.');
        let base = parts.next().unwrap_or_default();
        let mut m = Mods {
            base,
            rest: parts.collect(),
            pos: (t.line, t.col),
        };
        let op = match base {
            "const" => {
                m.done()?;
                let ty = self.op_type(results, base)?;
                let bits = self.const_bits(ty)?;
                Op::Const { ty, bits }
            }
            "param" => {
                m.done()?;
                Op::Param(self.uint("a parameter index")?)
            }
            "special" => {
                m.done()?;
                let (w, wt) = self.word("a special register")?;
                let s = by_name(&Special::ALL, Special::name, &w).ok_or_else(|| {
                    Self::at(
                        &wt,
                        ParseErrorKind::Unknown {
                            what: "special register",
                            name: w,
                        },
                    )
                })?;
                Op::Special(s)
            }
            "div" if m.flag("approx") => {
                m.done()?;
                let v = self.operands(2)?;
                Op::DivApprox { a: v[0], b: v[1] }
            }
            "fma" => {
                let rnd = m.need("a rounding mode", round_name)?;
                m.done()?;
                let v = self.operands(3)?;
                Op::Fma {
                    rnd,
                    a: v[0],
                    b: v[1],
                    c: v[2],
                }
            }
            "dp4a" => {
                let sign = |s: &str| match s {
                    "s32" => Some(true),
                    "u32" => Some(false),
                    _ => None,
                };
                let a_signed = m.need("`u32` or `s32` (the bytes of a)", sign)?;
                let b_signed = m.need("`u32` or `s32` (the bytes of b)", sign)?;
                m.done()?;
                let v = self.operands(3)?;
                Op::Dp4a {
                    a_signed,
                    b_signed,
                    a: v[0],
                    b: v[1],
                    c: v[2],
                }
            }
            "cmp" => {
                let op = m.need("a comparison", |s| by_name(&CmpOp::ALL, CmpOp::name, s))?;
                m.done()?;
                let v = self.operands(2)?;
                Op::Cmp {
                    op,
                    a: v[0],
                    b: v[1],
                }
            }
            "select" => {
                m.done()?;
                let v = self.operands(3)?;
                Op::Select {
                    cond: v[0],
                    a: v[1],
                    b: v[2],
                }
            }
            "cvt" => {
                let rnd = m.take(round_name);
                let sat = m.flag("sat");
                m.done()?;
                let at = self.peek()?.clone();
                let to = match self.op_type(results, base)? {
                    Type::Scalar(s) => s,
                    other => {
                        let expected = "a scalar type to convert to".into();
                        return Err(Self::at(
                            &at,
                            ParseErrorKind::Expected {
                                expected,
                                found: other.to_string(),
                            },
                        ));
                    }
                };
                Op::Cvt {
                    to,
                    rnd,
                    sat,
                    a: self.operand()?,
                }
            }
            "bitcast" => {
                m.done()?;
                let to = self.op_type(results, base)?;
                Op::Bitcast {
                    to,
                    a: self.operand()?,
                }
            }
            "pack" => {
                m.done()?;
                let ty = self.op_type(results, base)?;
                Op::Pack {
                    ty,
                    parts: self.operand_list()?,
                }
            }
            "extract" => {
                m.done()?;
                let a = self.operand()?;
                self.punct(',')?;
                Op::Extract {
                    a,
                    index: self.uint("a part index")?,
                }
            }
            "ptr_add" => {
                m.done()?;
                let v = self.operands(2)?;
                Op::PtrAdd {
                    ptr: v[0],
                    index: v[1],
                }
            }
            "ptr_cast" => {
                m.done()?;
                let to = self.ptr_cast_target(results)?;
                Op::PtrCast {
                    to,
                    ptr: self.operand()?,
                }
            }
            "shared_addr" => {
                m.done()?;
                Op::SharedAddr {
                    decl: self.uint("a shared array index")?,
                }
            }
            "load" => {
                let cache = m.take(cache_name).unwrap_or_default();
                m.done()?;
                let ty = self.op_type(results, base)?;
                Op::Load {
                    ty,
                    ptr: self.operand()?,
                    cache,
                }
            }
            "store" => {
                let cache = m.take(cache_name).unwrap_or_default();
                m.done()?;
                let v = self.operands(2)?;
                Op::Store {
                    ptr: v[0],
                    value: v[1],
                    cache,
                }
            }
            "barrier" => {
                m.done()?;
                Op::Barrier
            }
            "fence" => {
                let ord = m.need("an ordering", |s| by_name(&ORDERINGS, Ordering::name, s))?;
                let scope = m.need("a scope", |s| by_name(&SCOPES, Scope::name, s))?;
                m.done()?;
                Op::Fence { ord, scope }
            }
            "atom" => {
                let op = m.need("an atomic operation", |s| {
                    by_name(&ATOM_OPS, AtomOp::name, s)
                })?;
                let ord = m.need("an ordering", |s| by_name(&ORDERINGS, Ordering::name, s))?;
                let scope = m.need("a scope", |s| by_name(&SCOPES, Scope::name, s))?;
                m.done()?;
                let v = self.operands(2)?;
                let b = if self.eat(&Tok::Punct(','))? {
                    Some(self.operand()?)
                } else {
                    None
                };
                Op::Atomic {
                    op,
                    ord,
                    scope,
                    ptr: v[0],
                    a: v[1],
                    b,
                }
            }
            "shfl" => {
                let mode = m.need("a shuffle mode", |s| {
                    by_name(&SHFL_MODES, ShflMode::name, s)
                })?;
                m.done()?;
                let v = self.operands(4)?;
                Op::Shfl {
                    mode,
                    value: v[0],
                    b: v[1],
                    c: v[2],
                    mask: v[3],
                }
            }
            "vote" => {
                let mode = m.need("a vote mode", |s| by_name(&VOTE_MODES, VoteMode::name, s))?;
                m.done()?;
                let v = self.operands(2)?;
                Op::Vote {
                    mode,
                    pred: v[0],
                    mask: v[1],
                }
            }
            "redux" => {
                let op = m.need("a reduction", |s| by_name(&REDUX_OPS, ReduxOp::name, s))?;
                m.done()?;
                let v = self.operands(2)?;
                Op::Redux {
                    op,
                    value: v[0],
                    mask: v[1],
                }
            }
            "mma" => {
                let shape = m.need("an MMA shape", MmaShape::from_name)?;
                m.done()?;
                let v = self.operands(3)?;
                Op::Mma {
                    shape,
                    a: v[0],
                    b: v[1],
                    c: v[2],
                }
            }
            "ldmatrix" => {
                let num = m.need("a matrix count (`x1`, `x2`, `x4`)", |s| {
                    s.strip_prefix('x')?.parse::<u8>().ok()
                })?;
                let trans = m.flag("trans");
                m.done()?;
                let ty = self.op_type(results, base)?;
                Op::LdMatrix {
                    ty,
                    num,
                    trans,
                    ptr: self.operand()?,
                }
            }
            "wgmma" if m.flag("fence") => {
                m.done()?;
                Op::WgmmaFence
            }
            "wgmma" if m.flag("commit") => {
                m.done()?;
                Op::WgmmaCommit
            }
            "wgmma" if m.flag("wait") => {
                m.done()?;
                Op::WgmmaWait {
                    n: self.uint("a group count")?,
                }
            }
            "wgmma" => {
                let shape = m.need("a warpgroup MMA shape", |s| {
                    MmaShape::from_name(s).filter(|s| s.is_warpgroup())
                })?;
                let ab = m.need("an operand type (`f16`, `bf16`)", |s| {
                    Scalar::from_name(s).filter(|s| matches!(s, Scalar::F16 | Scalar::BF16))
                })?;
                m.done()?;
                let v = self.operands(3)?;
                Op::Wgmma {
                    shape,
                    ab,
                    a: v[0],
                    b: v[1],
                    c: v[2],
                }
            }
            "wgmma_desc" => {
                let swizzle = m.need(
                    "a swizzle (`none`, `b32`, `b64`, `b128`)",
                    Swizzle::from_name,
                )?;
                m.done()?;
                let ptr = self.operand()?;
                self.punct(',')?;
                let lbo = self.uint("a leading byte offset")?;
                self.punct(',')?;
                Op::WgmmaDesc {
                    ptr,
                    lbo,
                    sbo: self.uint("a stride byte offset")?,
                    swizzle,
                }
            }
            "mbarrier" if m.flag("init") => {
                m.done()?;
                let v = self.operands(2)?;
                Op::MbarrierInit {
                    bar: v[0],
                    count: v[1],
                }
            }
            "mbarrier" if m.flag("arrive") => {
                m.done()?;
                Op::MbarrierArrive {
                    bar: self.operand()?,
                }
            }
            "mbarrier" if m.flag("wait") => {
                m.done()?;
                let v = self.operands(2)?;
                Op::MbarrierWait {
                    bar: v[0],
                    parity: v[1],
                }
            }
            "cp_async" if m.flag("mbarrier_arrive") => {
                m.done()?;
                Op::CpAsyncMbarrierArrive {
                    bar: self.operand()?,
                }
            }
            "fence_proxy_async" => {
                m.done()?;
                Op::FenceProxyAsync
            }
            "cp_async" if m.flag("commit") => {
                m.done()?;
                Op::CpAsyncCommit
            }
            "cp_async" if m.flag("wait") => {
                m.done()?;
                Op::CpAsyncWait {
                    n: self.uint("a group count")?,
                }
            }
            "cp_async" => {
                let cache = m.take(cache_name).unwrap_or_default();
                m.done()?;
                let v = self.operands(2)?;
                self.punct(',')?;
                Op::CpAsync {
                    dst: v[0],
                    src: v[1],
                    bytes: self.uint("a byte count")?,
                    cache,
                }
            }
            "if" => {
                m.done()?;
                self.if_op(results)?
            }
            "for" => {
                m.done()?;
                self.for_op()?
            }
            "yield" => {
                m.done()?;
                Op::Yield(self.operand_list()?)
            }
            "return" => {
                m.done()?;
                Op::Return
            }
            _ => {
                if let Some(op) = by_name(&BinOp::ALL, BinOp::name, base) {
                    let rnd = m.take(round_name);
                    m.done()?;
                    let v = self.operands(2)?;
                    Op::Bin {
                        op,
                        rnd,
                        a: v[0],
                        b: v[1],
                    }
                } else if let Some(op) = self.un_op(&mut m)? {
                    Op::Un {
                        op,
                        a: self.operand()?,
                    }
                } else {
                    return Err(Self::at(
                        &t,
                        ParseErrorKind::Unknown {
                            what: "operation",
                            name: word,
                        },
                    ));
                }
            }
        };
        Ok(op)
    }

    fn un_op(&mut self, m: &mut Mods) -> Result<Option<UnOp>, ParseError> {
        let approx = |m: &mut Mods, op: UnOp| -> Result<UnOp, ParseError> {
            m.need("`approx`", |s| (s == "approx").then_some(()))?;
            Ok(op)
        };
        let base = m.base;
        let op = match base {
            "neg" => UnOp::Neg,
            "abs" => UnOp::Abs,
            "not" => UnOp::Not,
            "popc" => UnOp::Popc,
            "clz" => UnOp::Clz,
            "sqrt" => UnOp::Sqrt(m.need("a rounding mode", round_name)?),
            "round" => UnOp::RoundInt(m.need("a rounding mode", round_name)?),
            "rcp" if m.flag("approx") => UnOp::RcpApprox,
            "rcp" => UnOp::Rcp(m.need("a rounding mode or `approx`", round_name)?),
            "rsqrt" => approx(m, UnOp::RsqrtApprox)?,
            "ex2" => approx(m, UnOp::Ex2Approx)?,
            "lg2" => approx(m, UnOp::Lg2Approx)?,
            "tanh" => approx(m, UnOp::TanhApprox)?,
            "sin" => approx(m, UnOp::SinApprox)?,
            "cos" => approx(m, UnOp::CosApprox)?,
            _ => return Ok(None),
        };
        m.done()?;
        Ok(Some(op))
    }

    /// `ptr_cast`'s pointee: written, or that of the single pointer result.
    fn ptr_cast_target(&mut self, results: &[(Value, Type)]) -> Result<Scalar, ParseError> {
        if let Tok::Word(w) = &self.peek()?.tok {
            if is_type_word(w) {
                return self.scalar();
            }
        }
        match results {
            [(_, Type::Ptr(_, p))] => Ok(*p),
            _ => {
                let t = self.next()?;
                Err(Self::expected(
                    &t,
                    "a pointee type after `ptr_cast` (its result is not a single pointer)",
                ))
            }
        }
    }

    fn const_bits(&mut self, ty: Type) -> Result<u64, ParseError> {
        let t = self.next()?;
        let text = match &t.tok {
            Tok::Number(n) => n.clone(),
            Tok::Word(w) if matches!(w.as_str(), "true" | "false" | "inf") => w.clone(),
            _ => return Err(Self::expected(&t, "a constant")),
        };
        let bad = |why: String| {
            Self::at(
                &t,
                ParseErrorKind::BadNumber {
                    text: text.clone(),
                    why,
                },
            )
        };
        if let Some(hex) = text.strip_prefix("0x") {
            return u64::from_str_radix(hex, 16)
                .map_err(|_| bad("not a 64-bit hexadecimal number".into()));
        }
        let Type::Scalar(s) = ty else {
            return Err(bad(format!(
                "a constant of type {ty} is written as raw bits (`0x…`)"
            )));
        };
        match s {
            Scalar::Pred => match text.as_str() {
                "true" => Ok(1),
                "false" => Ok(0),
                _ => Err(bad("a predicate is `true` or `false`".into())),
            },
            s if s.is_int() => {
                let n: i128 = text
                    .parse()
                    .map_err(|_| bad("expected a decimal integer".into()))?;
                let (lo, hi) = if s.is_signed() {
                    (-(1i128 << (s.bits() - 1)), (1i128 << (s.bits() - 1)) - 1)
                } else {
                    (0, (1i128 << s.bits()) - 1)
                };
                if n < lo || n > hi {
                    return Err(bad(format!("does not fit in {s}")));
                }
                let mask = if s.bits() == 64 {
                    u64::MAX
                } else {
                    (1u64 << s.bits()) - 1
                };
                Ok(n as u64 & mask)
            }
            s if s.is_float() => {
                float_bits(s, &text).ok_or_else(|| bad(format!("not a {s} number")))
            }
            s => Err(bad(format!(
                "a {s} constant is written as raw bits (`0x…`)"
            ))),
        }
    }

    /// After `if`: `%cond [-> (T, ...)] [args(...)] {` then-block `} [else ...]`.
    fn if_op(&mut self, results: &[(Value, Type)]) -> Result<Op, ParseError> {
        let cond = self.operand()?;
        let types = if self.eat(&Tok::Arrow)? {
            self.punct('(')?;
            let mut tys = vec![];
            if !self.eat(&Tok::Punct(')'))? {
                loop {
                    tys.push(self.ty()?);
                    if !self.eat(&Tok::Punct(','))? {
                        self.punct(')')?;
                        break;
                    }
                }
            }
            tys
        } else {
            results.iter().map(|(_, t)| *t).collect()
        };
        let then_args = self.opt_args()?;
        let then_ = self.nested_block(then_args)?;
        let else_ = if self.peek_word("else")? {
            self.next()?;
            let args = self.opt_args()?;
            self.nested_block(args)?
        } else {
            Block {
                args: vec![],
                insts: vec![Inst {
                    results: vec![],
                    op: Op::Yield(vec![]),
                }],
            }
        };
        Ok(Op::If {
            cond,
            then_,
            else_,
            results: types,
        })
    }

    /// After `for`: either `%iv: T = %lo to %hi step %s [iter(%a: T = %init, ...)]` or
    /// `%lo to %hi step %s args(...) init(...)`, then the body.
    fn for_op(&mut self) -> Result<Op, ParseError> {
        let (first, pos) = self.value_token("the induction variable or lower bound")?;
        let (lo, hi, step, init, args);
        if self.eat(&Tok::Punct(':'))? {
            let ty = self.ty()?;
            self.define(first, ty, pos)?;
            self.punct('=')?;
            lo = self.operand()?;
            self.keyword("to")?;
            hi = self.operand()?;
            self.keyword("step")?;
            step = self.operand()?;
            let mut a = vec![first];
            let mut i = vec![];
            if self.peek_word("iter")? {
                self.next()?;
                self.punct('(')?;
                loop {
                    a.push(self.typed_def()?.0);
                    self.punct('=')?;
                    i.push(self.operand()?);
                    if !self.eat(&Tok::Punct(','))? {
                        self.punct(')')?;
                        break;
                    }
                }
            }
            args = a;
            init = i;
        } else {
            // `first` was the lower bound.
            self.note_use(first, pos);
            lo = first;
            self.keyword("to")?;
            hi = self.operand()?;
            self.keyword("step")?;
            step = self.operand()?;
            self.keyword("args")?;
            args = self.args_list()?;
            self.keyword("init")?;
            self.punct('(')?;
            init = self.operand_list()?;
            self.punct(')')?;
        }
        let body = self.nested_block(args)?;
        Ok(Op::For {
            lo,
            hi,
            step,
            init,
            body,
        })
    }
}
