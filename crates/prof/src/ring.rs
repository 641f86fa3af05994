//! The device ring buffer that instrumented kernels write their records to.

use quench_rt::{Arg, DevicePtr, Executor, RtError, StreamId};

/// Bytes per record: `[start_ns: u64, end_ns: u64, blocks: u32, pad: u32]`.
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
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dispatch {
    /// The kernel's name.
    pub kernel: String,
    /// What the dispatch computes (`layer 3: attention`); empty where the caller gave
    /// nothing more than the kernel.
    pub label: String,
    pub stream: u32,
    /// The step (one decode token) the dispatch belongs to, where the caller runs steps.
    pub step: Option<u32>,
    /// `%globaltimer` at entry of block 0, in nanoseconds.
    pub start_ns: u64,
    /// `%globaltimer` when the last block finished, in nanoseconds.
    pub end_ns: u64,
    /// Blocks that counted themselves done in this launch (the grid size, once it
    /// completed).
    pub blocks_done: u32,
    /// Bytes of device memory the dispatch reads and writes (0: not modeled).
    pub bytes: u64,
    /// Floating-point operations it performs (0: not modeled).
    pub flops: u64,
}

impl Dispatch {
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// A taken slot: whose records it holds, and its block count at the previous reading.
struct Slot {
    kernel: String,
    stream: u32,
    blocks_seen: u32,
}

/// A ring buffer of records on an executor, and which launch owns each taken slot.
pub struct Ring {
    ptr: DevicePtr,
    slots: u32,
    taken: Vec<Slot>,
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

    /// Take the next slot for launches of `kernel` on `stream`; returns the two extra
    /// arguments of the instrumented kernel (ring pointer and slot), to append to its own.
    /// A slot may serve one launch per [`Ring::read`] (a captured graph's dispatch keeps
    /// its slot for every replay).
    pub fn next(&mut self, kernel: &str, stream: StreamId) -> Result<[Arg; 2], RingError> {
        let slot = self.taken.len() as u32;
        if slot >= self.slots {
            return Err(RingError::Full { slots: self.slots });
        }
        self.taken.push(Slot { kernel: kernel.to_string(), stream: stream.index(), blocks_seen: 0 });
        Ok([Arg::Ptr(self.ptr), Arg::U32(slot)])
    }

    /// Read the record of every taken slot, in slot order, keeping the slots. Each
    /// record's `blocks_done` counts the blocks since the previous reading: 0 for a slot
    /// whose launch has not run again since (its times are then the earlier launch's).
    /// Synchronize first, or read with a copy that waits: a launch still running has not
    /// written its end.
    pub fn read(&mut self, exec: &mut dyn Executor) -> Result<Vec<Dispatch>, RingError> {
        let mut bytes = vec![0u8; self.taken.len() * RECORD_BYTES];
        if !bytes.is_empty() {
            exec.copy_to_host(self.ptr, &mut bytes)?;
        }
        let word = |r: &[u8], at: usize| -> u64 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&r[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let out = self
            .taken
            .iter_mut()
            .zip(bytes.chunks_exact(RECORD_BYTES))
            .map(|(slot, r)| {
                let blocks = word(r, 16) as u32;
                let done = blocks.wrapping_sub(slot.blocks_seen);
                slot.blocks_seen = blocks;
                Dispatch {
                    kernel: slot.kernel.clone(),
                    stream: slot.stream,
                    start_ns: word(r, 0),
                    end_ns: word(r, 8),
                    blocks_done: done,
                    ..Dispatch::default()
                }
            })
            .collect();
        Ok(out)
    }

    /// Read every taken slot as [`Ring::read`] does, then free the slots (zeroed again)
    /// for the next launches.
    pub fn collect(&mut self, exec: &mut dyn Executor) -> Result<Vec<Dispatch>, RingError> {
        let out = self.read(exec)?;
        if !self.taken.is_empty() {
            self.zero(exec)?;
            self.taken.clear();
        }
        Ok(out)
    }

    /// Free the device buffer.
    pub fn release(self, exec: &mut dyn Executor) -> Result<(), RingError> {
        Ok(exec.free(self.ptr)?)
    }
}
