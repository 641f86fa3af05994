//! Errors of the runtime: each names what went wrong and with which kernel, argument,
//! handle or driver call.

/// An error from an executor.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RtError {
    /// No usable GPU: the driver library is missing or too old, or has no device.
    #[error("no GPU available: {reason}")]
    NoGpu { reason: String },

    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {name} ({message})")]
    Driver {
        call: &'static str,
        name: String,
        message: String,
    },

    /// The driver's JIT compiler rejected the PTX of a kernel.
    #[error("the CUDA driver could not compile kernel `{kernel}`: {log}")]
    Jit { kernel: String, log: String },

    /// The kernel failed verification (boxed: verifier errors carry a whole location).
    #[error(transparent)]
    Verify(Box<quench_ir::VerifyError>),

    /// The PTX code generator refused the kernel.
    #[error("kernel `{kernel}` could not be translated to PTX: {message}")]
    Ptx { kernel: String, message: String },

    /// quench's own code generator refused the kernel (`Codegen::Sass`): the operation or
    /// limit that stops it.
    #[error("quench's code generator cannot compile {message}")]
    Codegen { kernel: String, message: String },

    /// The kernel's interface cannot be used from the host (e.g. a parameter type that
    /// has no host representation).
    #[error("kernel `{kernel}`: {message}")]
    Abi { kernel: String, message: String },

    #[error("kernel `{kernel}` takes {expected} arguments, {given} given")]
    ArgCount {
        kernel: String,
        expected: usize,
        given: usize,
    },

    #[error("kernel `{kernel}` argument {index} (`{param}`): expected {expected}, given {given}")]
    ArgType {
        kernel: String,
        index: usize,
        param: String,
        expected: String,
        given: String,
    },

    /// Grid, block or shared-memory size outside what the kernel or the device allows.
    #[error("launch of kernel `{kernel}`: {message}")]
    LaunchShape { kernel: String, message: String },

    /// A kernel, stream, event or graph handle this executor did not hand out (or
    /// already released).
    #[error("unknown {kind} handle {id}")]
    UnknownHandle { kind: &'static str, id: u64 },

    /// A device pointer or copy outside every live allocation.
    #[error("invalid device memory access: {message}")]
    Memory { message: String },

    /// Graph capture misuse: capturing twice, ending a capture never begun, or an
    /// operation that cannot be captured while a capture is open.
    #[error("graph capture: {message}")]
    Capture { message: String },

    /// The interpreter stopped a kernel (out-of-bounds access, bad barrier, ...).
    #[error("kernel `{kernel}` failed in the interpreter: {message}")]
    Interp { kernel: String, message: String },

    /// The native backend (quench's own driver over the kernel module) failed.
    #[error("native backend: {0}")]
    Native(Box<crate::native::NativeError>),

    /// The interpreter's memory refused an operation.
    #[error("interpreter memory: {message}")]
    InterpMemory { message: String },
}

impl From<crate::native::NativeError> for RtError {
    fn from(e: crate::native::NativeError) -> Self {
        RtError::Native(Box::new(e))
    }
}

impl From<quench_ir::VerifyError> for RtError {
    fn from(e: quench_ir::VerifyError) -> Self {
        RtError::Verify(Box::new(e))
    }
}
