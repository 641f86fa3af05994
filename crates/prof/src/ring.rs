//! The device ring buffer that instrumented kernels write their records to.

use quench_rt::{Arg, DevicePtr, Executor, RtError, StreamId};

/// Bytes per record: `[start_ns: u64, end_ns: u64, blocks_done: u32, pad: u32]`.
pub const RECORD_BYTES: usize = 24;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RingError {
    #[error("profiler ring buffer: {0}")]
    Runtime(#[from] RtError),
    #[error("the profiler ring buffer holds {slots} records and all are taken; read them with `collect` first")]
    Full { slots: u32 },
    #[error("the profiler ring buffer needs at least one record slot")]
    Empty,
}

/// One profiled kernel dispatch.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    pub kernel: String,
    pub stream: u32,
    /// `%globaltimer` at entry of block 0, in nanoseconds.
    pub start_ns: u64,
    /// `%globaltimer` when the last block finished, in nanoseconds.
    pub end_ns: u64,
    /// Blocks that counted themselves done (the grid size, once the launch completed).
    pub blocks_done: u32,
}

impl Dispatch {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// A ring buffer of records on an executor, and which launch owns each taken slot.
pub struct Ring {
    ptr: DevicePtr,
    slots: u32,
    taken: Vec<(String, u32)>,
}

impl Ring {
    /// Allocate `slots` zeroed records on `exec`.
    pub fn new(exec: &mut dyn Executor, slots: u32) -> Result<Ring, RingError> {
        if slots == 0 {
            return Err(RingError::Empty);
        }
        let ptr = exec.alloc(slots as u64 * RECORD_BYTES as u64)?;
        let ring = Ring { ptr, slots, taken: vec![] };
        ring.zero(exec)?;
        Ok(ring)
    }

    fn zero(&self, exec: &mut dyn Executor) -> Result<(), RtError> {
        exec.copy_to_device(self.ptr, &vec![0u8; self.slots as usize * RECORD_BYTES])
    }

    /// Take the next slot for a launch of `kernel` on `stream`; returns the two extra
    /// arguments of the instrumented kernel (ring pointer and slot), to append to its own.
    pub fn next(&mut self, kernel: &str, stream: StreamId) -> Result<[Arg; 2], RingError> {
        let slot = self.taken.len() as u32;
        if slot >= self.slots {
            return Err(RingError::Full { slots: self.slots });
        }
        self.taken.push((kernel.to_string(), stream.index()));
        Ok([Arg::Ptr(self.ptr), Arg::U32(slot)])
    }

    /// Read back the records of every taken slot, in launch order, and free the slots
    /// (zeroed again) for the next launches. Synchronize first: a launch still running has
    /// not written its end.
    pub fn collect(&mut self, exec: &mut dyn Executor) -> Result<Vec<Dispatch>, RingError> {
        let n = self.taken.len();
        let mut bytes = vec![0u8; n * RECORD_BYTES];
        if n > 0 {
            exec.copy_to_host(self.ptr, &mut bytes)?;
            self.zero(exec)?;
        }
        let word = |r: &[u8], at: usize| -> u64 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&r[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let out = self
            .taken
            .drain(..)
            .zip(bytes.chunks_exact(RECORD_BYTES))
            .map(|((kernel, stream), r)| Dispatch {
                kernel,
                stream,
                start_ns: word(r, 0),
                end_ns: word(r, 8),
                blocks_done: word(r, 16) as u32,
            })
            .collect();
        Ok(out)
    }

    /// Free the device buffer.
    pub fn release(self, exec: &mut dyn Executor) -> Result<(), RingError> {
        Ok(exec.free(self.ptr)?)
    }
}
