//! The executor contract: what every backend (CUDA driver, quench's native driver, CPU
//! interpreter) provides.
//!
//! Ordering: work on one stream runs in issue order. Copies are not stream-ordered
//! operations of their own: each one is ordered after all work issued before it on
//! every stream, and `copy_to_host` returns once the bytes are in `dst`.
//!
//! Graph capture: between `begin_capture(s)` and `end_capture(s)`, launches (and graph
//! replays) issued on `s` are recorded instead of run. Allocation, copies, events on a
//! capturing stream and `synchronize` are refused while any capture is open.

use quench_ir::Function;

use crate::abi::KernelAbi;
use crate::error::RtError;

/// A device address. It may point inside an allocation (see [`DevicePtr::offset`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    pub const NULL: DevicePtr = DevicePtr(0);

    pub fn addr(self) -> u64 {
        self.0
    }

    /// The address `bytes` further on.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes))
    }
}

// Handles are plain numbers scoped to the executor that made them; every use is
// looked up, so a stale or foreign handle is an `UnknownHandle` error, never a crash.
macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl $name {
            /// The handle's number, for messages and logs.
            pub fn index(self) -> u32 {
                self.0
            }
        }
    };
}

handle!(
    /// A loaded kernel of one executor.
    KernelId
);
handle!(
    /// A stream of one executor; [`StreamId::DEFAULT`] always exists.
    StreamId
);
handle!(
    /// A recorded point in a stream.
    EventId
);
handle!(
    /// A captured, replayable sequence of launches.
    GraphId
);

impl StreamId {
    pub const DEFAULT: StreamId = StreamId(0);
}

/// Launch shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

impl Launch {
    /// A one-dimensional launch with no dynamic shared memory.
    pub fn linear(blocks: u32, threads: u32) -> Launch {
        Launch {
            grid: [blocks, 1, 1],
            block: [threads, 1, 1],
            dynamic_shared_bytes: 0,
        }
    }
}

/// A kernel argument. Each variant matches exactly one parameter kind: `Ptr` a global
/// pointer, the others the scalar of the same name (IR `s32` is `I32`, and so on).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Ptr(DevicePtr),
    U8(u8),
    U16(u16),
    U32(u32),
    U64(u64),
    I8(i8),
    I16(i16),
    I32(i32),
    I64(i64),
    F16(half::f16),
    BF16(half::bf16),
    F32(f32),
    F64(f64),
}

impl Arg {
    /// The IR name of the scalar this argument carries; `None` for a pointer.
    pub fn scalar_name(&self) -> Option<&'static str> {
        Some(match self {
            Arg::Ptr(_) => return None,
            Arg::U8(_) => "u8",
            Arg::U16(_) => "u16",
            Arg::U32(_) => "u32",
            Arg::U64(_) => "u64",
            Arg::I8(_) => "s8",
            Arg::I16(_) => "s16",
            Arg::I32(_) => "s32",
            Arg::I64(_) => "s64",
            Arg::F16(_) => "f16",
            Arg::BF16(_) => "bf16",
            Arg::F32(_) => "f32",
            Arg::F64(_) => "f64",
        })
    }

    /// How the argument reads in messages: `device pointer 0x7f00`, `u32 7`.
    pub fn describe(&self) -> String {
        match self {
            Arg::Ptr(p) => format!("device pointer {:#x}", p.0),
            Arg::U8(v) => format!("u8 {v}"),
            Arg::U16(v) => format!("u16 {v}"),
            Arg::U32(v) => format!("u32 {v}"),
            Arg::U64(v) => format!("u64 {v}"),
            Arg::I8(v) => format!("s8 {v}"),
            Arg::I16(v) => format!("s16 {v}"),
            Arg::I32(v) => format!("s32 {v}"),
            Arg::I64(v) => format!("s64 {v}"),
            Arg::F16(v) => format!("f16 {v}"),
            Arg::BF16(v) => format!("bf16 {v}"),
            Arg::F32(v) => format!("f32 {v}"),
            Arg::F64(v) => format!("f64 {v}"),
        }
    }

    /// The argument's bit pattern, zero-extended to 64 bits (little-endian, so its
    /// first `size` bytes are the parameter's bytes).
    pub fn bits(&self) -> u64 {
        match *self {
            Arg::Ptr(p) => p.0,
            Arg::U8(v) => v as u64,
            Arg::U16(v) => v as u64,
            Arg::U32(v) => v as u64,
            Arg::U64(v) => v,
            Arg::I8(v) => v as u8 as u64,
            Arg::I16(v) => v as u16 as u64,
            Arg::I32(v) => v as u32 as u64,
            Arg::I64(v) => v as u64,
            Arg::F16(v) => v.to_bits() as u64,
            Arg::BF16(v) => v.to_bits() as u64,
            Arg::F32(v) => v.to_bits() as u64,
            Arg::F64(v) => v.to_bits(),
        }
    }
}

/// What every backend provides. Errors are values: no method panics on bad input.
pub trait Executor {
    /// `"cuda"`, `"native"` or `"interp"`.
    fn backend(&self) -> &'static str;
    fn device_name(&self) -> String;
    /// The device's streaming multiprocessors, where it has them (not the interpreter):
    /// what sizes grids that loop over their work.
    fn multiprocessors(&self) -> Option<u32> {
        None
    }

    /// Allocate `bytes` (> 0) of device memory.
    fn alloc(&mut self, bytes: u64) -> Result<DevicePtr, RtError>;
    /// Free an allocation; `p` must be the address `alloc` returned.
    fn free(&mut self, p: DevicePtr) -> Result<(), RtError>;
    fn copy_to_device(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), RtError>;
    fn copy_to_host(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), RtError>;
    fn copy_device_to_device(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: u64,
    ) -> Result<(), RtError>;

    /// Verify and compile a kernel; the handle stays valid for the executor's life.
    fn load(&mut self, f: &Function) -> Result<KernelId, RtError>;
    fn abi(&self, k: KernelId) -> Result<&KernelAbi, RtError>;
    /// Check the arguments and shape against the kernel's ABI and the device's limits,
    /// then launch (or record, on a capturing stream).
    fn launch(
        &mut self,
        k: KernelId,
        launch: &Launch,
        args: &[Arg],
        stream: StreamId,
    ) -> Result<(), RtError>;

    fn create_stream(&mut self) -> Result<StreamId, RtError>;
    fn record_event(&mut self, stream: StreamId) -> Result<EventId, RtError>;
    /// Milliseconds between two recorded events; waits for `end` to complete.
    fn elapsed_ms(&mut self, start: EventId, end: EventId) -> Result<f32, RtError>;
    /// Destroy an event; its handle becomes invalid.
    fn release_event(&mut self, e: EventId) -> Result<(), RtError>;

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), RtError>;
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, RtError>;
    /// Issue a captured graph's launches on `stream`, in capture order.
    fn replay(&mut self, g: GraphId, stream: StreamId) -> Result<(), RtError>;
    /// Destroy a graph; its handle becomes invalid.
    fn release_graph(&mut self, g: GraphId) -> Result<(), RtError>;

    /// Wait until all issued work on all streams has finished.
    fn synchronize(&mut self) -> Result<(), RtError>;
}
