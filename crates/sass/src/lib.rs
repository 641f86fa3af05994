//! quench-sass: sm_90 machine code that quench reads and writes itself.
//!
//! - [`elf`] and [`cubin`]: read a cubin (ELF64) — sections, symbols, relocations and the
//!   `.nv.info` records ([`nvinfo`]) — and write it back byte for byte;
//! - [`build`]: write a cubin for a kernel given its code and ABI;
//! - [`codegen`]: compile a kernel from quench's IR to machine code, no ptxas involved;
//! - [`emu`]: run a kernel's machine code on the CPU, instruction by instruction through
//!   the decoder, refusing by name what it does not model.
//!
//! Every reader checks sizes and offsets against the input and names the section or
//! record that is wrong; nothing here panics on bad input.

pub mod asm;
pub mod build;
pub mod codegen;
pub mod cubin;
pub mod dis;
pub mod elf;
pub mod emu;
pub mod error;
pub mod nvinfo;
pub mod probe;
pub mod reloc;
pub mod syntax;
pub mod table;
pub mod tools;

pub use error::{Result, SassError};
