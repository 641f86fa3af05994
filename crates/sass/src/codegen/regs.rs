//! Register assignment on SSA: each value gets general registers (or a predicate) from
//! its definition to its last use, aligned as the instructions that read it need (pairs
//! for 64-bit addresses, four for 16-byte vectors), then gives them back.
//!
//! Positions are the instructions' pre-order numbers (the order the selector visits
//! them). A value used inside a loop it was defined outside of lives to the loop's end,
//! as do the loop's bounds, step and carried values (its block arguments). A vector's
//! element (`extract`) and a same-size `bitcast` share their source's registers, so their
//! uses count as uses of the source. So does an `mma`'s result its accumulator's, where
//! nothing reads the accumulator after the `mma` (the tensor cores accumulate in place,
//! as ptxas writes `HMMA R56, R152, R146, R56`): a chain of products over a loop's
//! carried accumulators then lives in the carried registers. A `pack` of 32-bit parts
//! that already lie in consecutive, aligned registers of one value (an `ldmatrix`
//! result's halves as an `mma` operand) is those registers. And a value a loop carries
//! to its next trip, defined after the last use of the value it replaces, is made in that
//! value's registers, so the loop's end copies nothing for it.

use std::collections::HashMap;

use quench_ir::{AddrSpace, Block, Function, Op, Scalar, Type, Value};

use crate::error::Result;

use super::refuse;

/// General registers a thread may use on sm_90 (R0–R254; R255 reads as zero).
pub const MAX_REGISTERS: u32 = 255;
/// Registers a thread's count holds beyond the highest its code names: every ptxas sm_90
/// cubin of the library counts two more (e.g. 22 for code that names R0–R19), so quench
/// counts the same rather than hand the hardware code that names the last two.
pub(super) const RESERVED: u32 = 2;
/// Registers the code may name: the count's limit less the reserved two.
const USABLE: u32 = MAX_REGISTERS - RESERVED;
/// Predicates P0–P4 for values (P5 and P6 are the selector's scratch, P7 always true);
/// further predicate values live in registers as 0 or 1.
const MAX_PREDICATES: usize = 5;
/// The first register handed out: R0 and R1 are left alone (R1 is the stack pointer by
/// the ABI's convention).
const FIRST: u32 = 2;

/// Where a value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// `count` consecutive registers from `base`.
    R {
        base: u32,
        count: u32,
    },
    P(u8),
}

impl Loc {
    /// Register `base + i`'s name.
    pub fn reg(self, i: u32) -> String {
        match self {
            Loc::R { base, .. } => format!("R{}", base + i),
            Loc::P(p) => format!("P{p}"),
        }
    }
}

/// How many 32-bit registers a value of `ty` takes, or `None` for a predicate.
pub fn width(ty: Type) -> Option<u32> {
    match ty {
        Type::Scalar(Scalar::Pred) => None,
        // A shared or local address is a 32-bit offset in its window.
        Type::Ptr(AddrSpace::Shared | AddrSpace::Local, _) => Some(1),
        t => Some(t.bytes().div_ceil(4)),
    }
}

/// Values kept in local memory (each thread's frame) instead of registers: stored once
/// after their definition, loaded into scratch registers before each use (a constant is
/// written again instead). Chosen one at a time, while a kernel's live values need more
/// registers than a thread may name: the earliest-defined value live where they ran out
/// that can go (a plain 32- or 64-bit value, neither a loop's nor an `if`'s, read by
/// ordinary instructions only), usually an address or bound read inside a loop.
#[derive(Clone, Default)]
pub struct Spills {
    slot: HashMap<Value, u32>,
    bytes: u32,
}

impl Spills {
    /// The bytes of a thread's frame: a multiple of 8, so that the frame's base (the stack
    /// pointer less the frame) keeps each 64-bit slot as aligned as it is in the frame.
    pub fn bytes(&self) -> u32 {
        self.bytes.next_multiple_of(8)
    }

    /// `v`'s offset in the frame, if it is spilled.
    pub fn slot(&self, v: Value) -> Option<u32> {
        self.slot.get(&v).copied()
    }

    pub fn len(&self) -> usize {
        self.slot.len()
    }

    fn add(&mut self, v: Value, words: u32) {
        let at = self.bytes.next_multiple_of(4 * words);
        self.slot.insert(v, at);
        self.bytes = at + 4 * words;
    }
}

/// Hands out registers as values are defined and takes them back after their last use.
pub struct Registers {
    locs: Vec<Option<Loc>>,
    /// The value whose registers each value shares (itself, or an extract's source).
    root: Vec<Value>,
    /// Where in its root's registers each value starts.
    offset: Vec<u32>,
    /// Each root's last use (a position), `None` for a value never used.
    last: Vec<Option<usize>>,
    busy: [bool; MAX_REGISTERS as usize],
    /// When each register was last given back (a count of give-backs), so that a value
    /// takes the register freed longest ago: reusing one at once would chain instructions
    /// that are independent, which the schedule could otherwise interleave.
    freed: [u32; MAX_REGISTERS as usize],
    frees: u32,
    busy_pred: [bool; MAX_PREDICATES],
    /// Allocated roots, in the order they were defined.
    live: Vec<Value>,
    high_water: u32,
    /// Registers the code may name (fewer than [`USABLE`] where a block's threads would
    /// not fit the register file).
    limit: u32,
    /// Values that may be spilled (see [`Spills`]).
    spillable: Vec<bool>,
    /// The live values where registers last ran out.
    exhausted: Option<Vec<Value>>,
    /// Values whose registers the code has asked for (see [`Registers::was_read`]).
    read: std::cell::RefCell<Vec<bool>>,
}

impl Registers {
    /// Registers for `f`'s values, the code naming at most `limit`, with `spills` kept in
    /// local memory.
    pub fn new(f: &Function, limit: u32, spills: &Spills) -> Registers {
        let n = f.values.len();
        let mut root: Vec<Value> = (0..n as u32).map(Value).collect();
        // Each value's own last use, for the in-place accumulators.
        let own: Vec<Value> = root.clone();
        let mut values = Liveness::new(&own, false);
        values.block(&f.body);
        let mut loop_results = vec![false; n];
        let mut offset = vec![0u32; n];
        // The carried value each value replaces at its loop's end (where it is yielded
        // once, to one slot).
        let mut replaces: Vec<Option<Value>> = vec![None; n];
        f.walk(&mut |inst| {
            if let Op::For { body, .. } = &inst.op {
                if let Some(Op::Yield(next)) = body.insts.last().map(|i| &i.op) {
                    for (y, arg) in next.iter().zip(&body.args[1..]) {
                        if next.iter().filter(|x| *x == y).count() == 1 && y != arg {
                            replaces[y.index()] = Some(*arg);
                        }
                    }
                }
            }
        });
        // Whether every value in `r`'s registers (but the loops' results, which take them
        // after the loop) is read for the last time at or before `at`.
        let dead = |root: &[Value], loop_results: &[bool], r: Value, at: usize| {
            (0..n)
                .all(|w| root[w] != r || loop_results[w] || values.last[w].is_none_or(|l| l <= at))
        };
        let mut pos = 0;
        f.walk(&mut |inst| {
            let at = pos;
            pos += 1;
            // Not for the operations whose results share their operands' registers.
            let shares = matches!(
                inst.op,
                Op::For { .. } | Op::Extract { .. } | Op::PtrCast { .. } | Op::Bitcast { .. }
            );
            if let (Some(&v), Some(arg), false) = (
                inst.results.first(),
                inst.results.first().and_then(|v| replaces[v.index()]),
                shares,
            ) {
                let r = root[arg.index()];
                let whole = width(f.ty(arg)) == width(f.ty(r)) && width(f.ty(v)) == width(f.ty(r));
                if whole
                    && width(f.ty(r)).is_some()
                    && at > 0
                    && dead(&root, &loop_results, r, at - 1)
                {
                    root[v.index()] = r;
                    return;
                }
            }
            match &inst.op {
                Op::Mma { c, .. } => {
                    let r = root[c.index()];
                    let whole = width(f.ty(*c)) == width(f.ty(r));
                    if whole && dead(&root, &loop_results, r, at) {
                        root[inst.results[0].index()] = r;
                    }
                }
                // Shares its vector's registers, except an odd 16-bit element (shifted down
                // into a register of its own).
                Op::Extract { a, index }
                    if !(f.ty(inst.results[0]).bytes() == 2 && index % 2 == 1) =>
                {
                    let r = inst.results[0].index();
                    root[r] = root[a.index()];
                    // As the selector places it: a 16-bit element in its pair's register.
                    offset[r] = offset[a.index()]
                        + match f.ty(inst.results[0]).bytes() {
                            2 => index / 2,
                            n => index * n / 4,
                        };
                }
                Op::PtrCast { ptr, .. } => {
                    let r = inst.results[0].index();
                    (root[r], offset[r]) = (root[ptr.index()], offset[ptr.index()]);
                }
                Op::Bitcast { to, a } if to.bytes() == f.ty(*a).bytes() => {
                    let r = inst.results[0].index();
                    (root[r], offset[r]) = (root[a.index()], offset[a.index()]);
                }
                Op::Pack { parts, .. } if parts.iter().all(|p| f.ty(*p).bytes() == 4) => {
                    let r = root[parts[0].index()];
                    let o = offset[parts[0].index()];
                    let count = parts.len() as u32;
                    let in_place =
                        parts.iter().enumerate().all(|(i, p)| {
                            root[p.index()] == r && offset[p.index()] == o + i as u32
                        }) && o.is_multiple_of(count.next_power_of_two())
                            && width(f.ty(r)).is_some();
                    if in_place {
                        let v = inst.results[0].index();
                        (root[v], offset[v]) = (r, o);
                    }
                }
                Op::For { body, .. } => {
                    // The loop's results are its carried values as they stand at the end.
                    for (r, arg) in inst.results.iter().zip(&body.args[1..]) {
                        root[r.index()] = root[arg.index()];
                        loop_results[r.index()] = true;
                    }
                }
                _ => {}
            }
        });
        let mut live = Liveness::new(&root, true);
        live.block(&f.body);
        let mut last = live.last;
        // A spilled value's registers hold it from its definition to its store.
        for v in spills.slot.keys() {
            last[v.index()] = Some(live.def[v.index()]);
        }
        let spillable = spillable(f, &root);
        Registers {
            locs: vec![None; n],
            last,
            root,
            offset,
            busy: [false; MAX_REGISTERS as usize],
            freed: [0; MAX_REGISTERS as usize],
            frees: 0,
            busy_pred: [false; MAX_PREDICATES],
            live: Vec::new(),
            high_water: FIRST,
            limit: limit.min(USABLE),
            spillable,
            exhausted: None,
            read: std::cell::RefCell::new(vec![false; n]),
        }
    }

    /// After registers ran out: adds the value to spill next to `spills`, if one can go.
    pub fn spill_more(&self, f: &Function, spills: &mut Spills) -> bool {
        let Some(live) = &self.exhausted else {
            return false;
        };
        let next = live
            .iter()
            .find(|v| self.spillable[v.index()] && spills.slot(**v).is_none());
        match next.and_then(|v| Some((*v, width(f.ty(*v))?))) {
            Some((v, words)) => {
                spills.add(v, words);
                true
            }
            None => false,
        }
    }

    /// `v`, spilled, lives in `loc` (scratch registers it was loaded into) until
    /// [`Registers::unload`].
    pub fn load(&mut self, v: Value, loc: Loc) {
        self.locs[v.index()] = Some(loc);
    }

    /// Gives back the scratch registers `v` was loaded into.
    pub fn unload(&mut self, v: Value) {
        if let Some(Loc::R { base, count }) = self.locs[v.index()].take() {
            self.release(base, count);
        }
    }

    /// Registers `base..base + count` are free again.
    fn release(&mut self, base: u32, count: u32) {
        self.frees += 1;
        for r in base..base + count {
            self.busy[r as usize] = false;
            self.freed[r as usize] = self.frees;
        }
    }

    /// The selector reached position `pos`: values last used before it give their
    /// registers back.
    pub fn at(&mut self, pos: usize) {
        let last = &self.last;
        let (done, live): (Vec<Value>, Vec<Value>) = self
            .live
            .iter()
            .partition(|v| last[v.index()].is_none_or(|l| l < pos));
        self.live = live;
        for v in done {
            match self.locs[v.index()] {
                Some(Loc::R { base, count }) => self.release(base, count),
                Some(Loc::P(p)) => self.busy_pred[p as usize] = false,
                None => {}
            }
        }
    }

    /// Fresh registers (or a predicate) for `v`; for an `mma` result accumulated in
    /// place or a `pack` of registers in place, those registers.
    pub fn define(&mut self, f: &Function, v: Value) -> Result<Loc> {
        let r = self.root[v.index()];
        if let (Some(Loc::R { base, .. }), Some(count)) = (self.locs[r.index()], width(f.ty(v))) {
            if r != v {
                let loc = Loc::R {
                    base: base + self.offset[v.index()],
                    count,
                };
                self.locs[v.index()] = Some(loc);
                return Ok(loc);
            }
        }
        let loc = match width(f.ty(v)) {
            // With every predicate taken, a predicate value lives in a register as 0 or 1
            // (the selector moves it through P6 where an instruction needs a predicate).
            None => match self.take_pred(f) {
                Ok(p) => Loc::P(p),
                Err(_) => Loc::R {
                    base: self.take(f, 1)?,
                    count: 1,
                },
            },
            Some(count) => Loc::R {
                base: self.take(f, count)?,
                count,
            },
        };
        self.locs[v.index()] = Some(loc);
        self.live.push(v);
        Ok(loc)
    }

    /// `count` registers held by no value, for a sequence's intermediate results; given
    /// back with [`Registers::give_back`].
    pub fn scratch(&mut self, f: &Function, count: u32) -> Result<Vec<u32>> {
        (0..count).map(|_| self.take(f, 1)).collect()
    }

    /// `count` consecutive registers held by no value, aligned as [`Registers::define`]
    /// aligns a value of that many; the first's number.
    pub fn scratch_run(&mut self, f: &Function, count: u32) -> Result<u32> {
        self.take(f, count)
    }

    pub fn give_back(&mut self, regs: &[u32]) {
        for &r in regs {
            self.release(r, 1);
        }
    }

    /// A free run of `count` registers, aligned to its size rounded up to a power of two:
    /// of those below the most registers used so far, the one given back longest ago;
    /// else the lowest.
    fn take(&mut self, f: &Function, count: u32) -> Result<u32> {
        let align = count.next_power_of_two();
        let limit = self.limit;
        let free = |b: u32| {
            b + count <= limit && !self.busy[b as usize..(b + count) as usize].contains(&true)
        };
        let runs = (FIRST.next_multiple_of(align)..limit).step_by(align as usize);
        let oldest = runs
            .clone()
            .filter(|&b| b + count <= self.high_water && free(b))
            .min_by_key(|&b| {
                self.freed[b as usize..(b + count) as usize]
                    .iter()
                    .max()
                    .copied()
            });
        let found = oldest.or_else(|| runs.clone().find(|&b| free(b)));
        let Some(base) = found else {
            self.exhausted = Some(self.live.clone());
            return Err(refuse(
                f,
                format!(
                    "needs more than the {limit} registers a thread's code may name at {} \
                     threads a block: {} live values hold them all, and none of them can be \
                     spilled to local memory",
                    f.max_threads,
                    self.live.len()
                ),
            ));
        };
        self.busy[base as usize..(base + count) as usize].fill(true);
        self.high_water = self.high_water.max(base + count);
        Ok(base)
    }

    fn take_pred(&mut self, f: &Function) -> Result<u8> {
        let p = self.busy_pred.iter().position(|b| !b).ok_or_else(|| {
            let live: Vec<String> = self
                .live
                .iter()
                .filter(|v| matches!(self.locs[v.index()], Some(Loc::P(_))))
                .map(|v| v.to_string())
                .collect();
            refuse(
                f,
                format!(
                    "needs more than the {MAX_PREDICATES} predicates at once (live: {})",
                    live.join(", ")
                ),
            )
        })?;
        self.busy_pred[p] = true;
        Ok(p as u8)
    }

    /// `v` lives in `loc`, its root's registers (a vector's element, a same-size bitcast,
    /// a loop's result).
    pub fn alias(&mut self, v: Value, loc: Loc) {
        self.locs[v.index()] = Some(loc);
    }

    /// Where `v` lives; every operand is defined before its use (the verifier's rule).
    pub fn loc(&self, f: &Function, v: Value) -> Result<Loc> {
        let mut read = self.read.borrow_mut();
        read[v.index()] = true;
        read[self.root[v.index()].index()] = true;
        drop(read);
        self.locs[v.index()]
            .or(self.locs[self.root[v.index()].index()])
            .ok_or_else(|| refuse(f, format!("{v} is used before it has a register")))
    }

    /// Whether the code asked for `v`'s registers ([`Registers::loc`]), as an operand or
    /// to share them: a constant never asked for was folded into its readers as an
    /// immediate, and the instructions writing it can go.
    pub fn was_read(&self, v: Value) -> bool {
        self.read.borrow()[v.index()]
    }

    /// The cubin's register count: the registers the code names and the reserved two.
    pub fn used(&self) -> u32 {
        self.high_water + RESERVED
    }
}

/// Which values may be spilled: plain 32- and 64-bit values that share their registers
/// with no other value, are not a loop's or an `if`'s, and are read only by ordinary
/// instructions (not as a loop's bounds or carried values, an `if`'s condition, a yield,
/// or an `mma`'s accumulator).
fn spillable(f: &Function, root: &[Value]) -> Vec<bool> {
    let n = f.values.len();
    // How many values live in each value's registers (itself included, if it is a root).
    let mut sharing = vec![0u32; n];
    for r in root {
        sharing[r.index()] += 1;
    }
    let mut ok: Vec<bool> = (0..n)
        .map(|i| {
            let v = Value(i as u32);
            matches!(width(f.ty(v)), Some(1 | 2)) && root[i] == v && sharing[i] == 1
        })
        .collect();
    f.walk(&mut |inst| {
        let mut no = |v: &Value| ok[v.index()] = false;
        match &inst.op {
            Op::For {
                lo,
                hi,
                step,
                init,
                body,
            } => {
                [lo, hi, step].into_iter().chain(init).for_each(&mut no);
                body.args.iter().for_each(&mut no);
                inst.results.iter().for_each(&mut no);
            }
            Op::If { cond, .. } => {
                no(cond);
                inst.results.iter().for_each(&mut no);
            }
            Op::Yield(values) => values.iter().for_each(&mut no),
            Op::Mma { c, .. } => {
                no(c);
                inst.results.iter().for_each(&mut no);
            }
            _ => {}
        }
    });
    ok
}

/// The pass that finds each root's last use.
struct Liveness<'a> {
    root: &'a [Value],
    def: Vec<usize>,
    last: Vec<Option<usize>>,
    /// Enclosing loops: (position of the `for`, position of its last instruction).
    loops: Vec<(usize, usize)>,
    pos: usize,
    /// Whether a loop's carried values count as used at its end, where the next trip's
    /// values are written into their registers (for registers; not for the values
    /// themselves).
    carried_at_end: bool,
}

impl<'a> Liveness<'a> {
    fn new(root: &'a [Value], carried_at_end: bool) -> Liveness<'a> {
        let n = root.len();
        Liveness {
            root,
            def: vec![0; n],
            last: vec![None; n],
            loops: Vec::new(),
            pos: 0,
            carried_at_end,
        }
    }

    fn use_at(&mut self, v: Value, pos: usize) {
        let r = self.root[v.index()].index();
        // Defined outside a loop that encloses the use: live through the whole loop.
        let end = self
            .loops
            .iter()
            .find(|(start, _)| self.def[r] < *start)
            .map_or(pos, |&(_, end)| end);
        self.last[r] = Some(self.last[r].map_or(end, |l| l.max(end)));
    }

    fn block(&mut self, b: &Block) {
        for inst in &b.insts {
            let pos = self.pos;
            self.pos += 1;
            // A view of another value's registers (an element, a cast) defines nothing:
            // its root stays defined where it was, outside any loop the view is inside.
            let view = matches!(
                inst.op,
                Op::Extract { .. } | Op::PtrCast { .. } | Op::Bitcast { .. }
            );
            for r in &inst.results {
                let root = self.root[r.index()];
                if !view || root == *r {
                    self.def[root.index()] = pos;
                }
            }
            match &inst.op {
                Op::For {
                    lo,
                    hi,
                    step,
                    init,
                    body,
                } => {
                    for v in init.iter().chain([lo]) {
                        self.use_at(*v, pos);
                    }
                    for a in &body.args {
                        self.def[self.root[a.index()].index()] = pos;
                    }
                    let end = pos + count(body);
                    self.loops.push((pos, end));
                    // The bound and step are read at the end of every iteration, the
                    // carried values written there (the induction variable read too).
                    let carried = if self.carried_at_end {
                        &body.args[..]
                    } else {
                        &body.args[..1]
                    };
                    for v in [hi, step].into_iter().chain(carried) {
                        self.use_at(*v, end);
                    }
                    self.block(body);
                    self.loops.pop();
                }
                Op::If {
                    cond, then_, else_, ..
                } => {
                    self.use_at(*cond, pos);
                    self.block(then_);
                    self.block(else_);
                }
                op => {
                    for v in op.operands() {
                        self.use_at(v, pos);
                    }
                }
            }
        }
    }
}

/// Instructions in `b`, nested ones included.
fn count(b: &Block) -> usize {
    b.insts
        .iter()
        .map(|i| {
            1 + match &i.op {
                Op::For { body, .. } => count(body),
                Op::If { then_, else_, .. } => count(then_) + count(else_),
                _ => 0,
            }
        })
        .sum()
}
