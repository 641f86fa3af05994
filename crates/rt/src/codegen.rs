//! Where the machine code of the kernels an executor loads comes from.

use quench_ir::Function;

use crate::error::RtError;

/// The machine code of the kernels an executor loads: on a GPU, from PTX through the
/// driver or from quench's own code generator; in the interpreter's executor, the IR
/// interpreted or quench's code run from its bytes in the SASS emulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Codegen {
    /// PTX, finished by the driver's JIT (ptxas); in the interpreter's executor, the IR
    /// itself.
    #[default]
    Ptx,
    /// sm_90 SASS from quench's own code generator, no ptxas involved; a kernel it cannot
    /// compile fails to load with [`RtError::Codegen`].
    Sass,
}

/// `f` as a cubin of quench's own SASS, or why the code generator refuses it.
pub(crate) fn own_cubin(f: &Function) -> Result<Vec<u8>, RtError> {
    quench_sass::codegen::compile_cubin(f).map_err(|e| RtError::Codegen {
        kernel: f.name.clone(),
        message: e.to_string(),
    })
}
