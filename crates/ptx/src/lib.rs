//! quench-ptx: kernel IR → PTX text, and `ptxas` to check it.
//!
//! [`emit`] turns a [`quench_ir::Function`] into a complete PTX module (ISA
//! [`PTX_VERSION`], target [`PTX_TARGET`]) with one `.visible .entry`, ready for the
//! driver's JIT. [`ptxas`] finds NVIDIA's assembler and runs it on PTX text,
//! reporting the resources the kernel uses or the assembler's complaint.
//!
//! Layout: `module` writes the header, parameters and shared arrays; `regs` names
//! registers; `control` lowers `if`/`for`; `inst` emits every other operation.

mod control;
mod emitter;
mod error;
mod inst;
mod module;
pub mod ptxas;
mod ptype;
mod regs;

pub use error::PtxError;

/// PTX ISA version of the emitted modules: the one CUDA 13.0 (driver R580) accepts.
pub const PTX_VERSION: &str = "9.0";
/// Target architecture of the emitted modules.
pub const PTX_TARGET: &str = "sm_90";
/// Target of modules that use Hopper's architecture-specific instructions (`wgmma`):
/// they run on sm_90 GPUs only, never on later ones.
pub const PTX_TARGET_ARCH_SPECIFIC: &str = "sm_90a";

/// Emit a complete PTX module holding `f` as its only entry point.
///
/// Fails with [`PtxError::Unsupported`] naming the parameter, shared array or IR value
/// that PTX cannot express (for example `rem` on f32, or a pred parameter).
pub fn emit(f: &quench_ir::Function) -> Result<String, PtxError> {
    module::emit(f)
}
