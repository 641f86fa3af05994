//! Kernels: functions made of blocks of instructions over SSA values.

use crate::ops::Op;
use crate::types::{Scalar, Type};

/// An SSA value: an index into [`Function::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

impl Value {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One instruction: an operation and the values it defines.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    pub results: Vec<Value>,
    pub op: Op,
}

/// A straight-line list of instructions with block arguments (used by `For` bodies
/// for the induction variable and the carried values). Nested blocks end with a
/// terminator (`Yield`); the function body may end with `Return` or just fall off.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Block {
    pub args: Vec<Value>,
    pub insts: Vec<Inst>,
}

/// A kernel parameter: a global pointer or a scalar, passed by value.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: String,
    pub ty: Type,
}

/// A statically sized shared-memory array.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedDecl {
    pub name: String,
    pub elem: Scalar,
    pub len: u32,
    /// Alignment in bytes (a power of two, at least the element size).
    pub align: u32,
}

impl SharedDecl {
    pub fn bytes(&self) -> u64 {
        self.elem.bytes() as u64 * self.len as u64
    }
}

/// Static shared memory a block may use on sm_90 without opting in to more.
pub const MAX_STATIC_SHARED_BYTES: u64 = 48 * 1024;
/// Threads per block on sm_90.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;

/// A kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Function {
    pub name: String,
    pub params: Vec<Param>,
    pub shared: Vec<SharedDecl>,
    /// `.maxntid`: the most threads per block this kernel is launched with.
    pub max_threads: u32,
    /// Type of every value, indexed by [`Value`].
    pub values: Vec<Type>,
    pub body: Block,
}

impl Function {
    pub fn ty(&self, v: Value) -> Type {
        self.values[v.index()]
    }

    /// Bytes of static shared memory, each declaration placed at its alignment.
    pub fn shared_bytes(&self) -> u64 {
        let mut off = 0u64;
        for d in &self.shared {
            off = off.next_multiple_of(d.align.max(1) as u64) + d.bytes();
        }
        off
    }

    /// Byte offset of each shared declaration in the block's shared memory.
    pub fn shared_offsets(&self) -> Vec<u64> {
        let mut off = 0u64;
        self.shared
            .iter()
            .map(|d| {
                let start = off.next_multiple_of(d.align.max(1) as u64);
                off = start + d.bytes();
                start
            })
            .collect()
    }

    /// Visit every instruction, depth first, in program order.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Inst)) {
        walk_block(&self.body, f);
    }
}

fn walk_block<'a>(b: &'a Block, f: &mut impl FnMut(&'a Inst)) {
    for inst in &b.insts {
        f(inst);
        match &inst.op {
            Op::If { then_, else_, .. } => {
                walk_block(then_, f);
                walk_block(else_, f);
            }
            Op::For { body, .. } => walk_block(body, f),
            _ => {}
        }
    }
}
