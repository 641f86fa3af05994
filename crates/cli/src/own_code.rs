//! Kernels run on the GPU from quench's own machine code (`--codegen sass`): each case's
//! kernel compiled by quench's code generator, handed to the loader in place of the cubin
//! the driver's JIT makes of its PTX.

use std::sync::{Arc, Mutex, PoisonError};

use quench_kernels::KernelCase;
use quench_rt::CudaExecutor;

/// Where kernels' machine code comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Codegen {
    /// PTX, finished by the driver's JIT (ptxas)
    Ptx,
    /// sm_90 SASS from quench's own code generator; kernels it cannot compile yet are
    /// listed with the operation that stops them
    Sass,
}

/// A kernel's name and the cubin quench's code generator made of it.
type Compiled = (String, Vec<u8>);

/// The cubin the next kernel load takes, set by [`OwnCode::prepare`].
#[derive(Clone, Default)]
pub struct OwnCode {
    next: Arc<Mutex<Option<Compiled>>>,
}

impl OwnCode {
    /// Makes `exec` load the cubins this prepares instead of the JIT's.
    pub fn install(&self, exec: &mut CudaExecutor) {
        let next = Arc::clone(&self.next);
        exec.set_cubin_rewrite(Box::new(move |name, _jit| {
            match next.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
                Some((kernel, cubin)) if kernel == name => Ok(cubin.clone()),
                _ => Err(format!("no cubin of quench's code generator for {name}")),
            }
        }));
    }

    /// Compiles `c`'s kernel for the next load; `Err` with the code generator's refusal.
    pub fn prepare(&self, c: &KernelCase) -> Result<(), String> {
        let cubin = quench_sass::codegen::compile_cubin(&c.kernel).map_err(|e| e.to_string())?;
        *self.next.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((c.kernel.name.clone(), cubin));
        Ok(())
    }
}
