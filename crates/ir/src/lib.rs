//! quench-ir: the typed SSA kernel IR with structured control flow.
//!
//! - [`types`]: value types (scalars, packed pairs, vectors, pointers, MMA fragments)
//! - [`ops`]: operations, explicit about rounding, approximation, caching and scope
//! - [`func`]: kernels, blocks, instructions
//! - [`builder`]: a Rust API to write kernels
//! - [`verify`](mod@verify): the verifier
//! - [`interp`]: the SIMT interpreter
//! - [`print`](mod@print), [`parse`](mod@parse): the text form of a kernel

pub mod builder;
pub mod func;
pub mod interp;
pub mod ops;
pub mod parse;
pub mod print;
pub mod types;
pub mod verify;

pub use builder::Builder;
pub use func::{Block, Function, Inst, Param, SharedDecl, Value};
pub use ops::*;
pub use parse::{parse, ParseError, ParseErrorKind};
pub use print::print;
pub use types::{AddrSpace, FragRole, FragType, MmaShape, Scalar, Swizzle, Type};
pub use verify::{verify, InstProblem, KernelProblem, VerifyError};
