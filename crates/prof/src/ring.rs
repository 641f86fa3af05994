//! The device ring buffer that instrumented kernels write their records to.
//!
//! The ring is laid out as planes, one `u64` per record slot in each (a structure of
//! arrays): plane [`START_PLANE`] holds the start times, [`LAUNCH_PLANE`] the launch
//! counters, and the [`LANES`] planes from [`FIRST_LANE_PLANE`] on the end-time lanes.
//! A record's words thus lie one plane stride apart. Planes start on 128-byte lines, so
//! the lanes of one launch never share a line (nor a 32-byte sector) and the reductions
//! of its blocks spread over [`LANES`] addresses; the record words of neighbouring slots
//! share lines instead, but their launches do not run at the same time. Reading every
//! record back is one copy of `PLANES × 8` bytes per slot, with no padding in between.

use quench_rt::{Arg, DevicePtr, Executor, RtError, StreamId};

/// End-time lanes per record: a block raises lane `%clock % LANES`, read by its thread 0
/// as it finishes.
///
/// Every block's reduction on one address would serialize in L2 at about 1 ns each:
/// a GEMV with 38k blocks (one warp a row, four a block, over a 151,936-row LM head)
/// took 45 µs longer that way. Over 8 lanes, even blocks finishing at 2,000 per µs
/// (the whole GPU retiring short blocks) leave each lane one reduction every 4 ns, under
/// the serialization limit; more lanes would add 8 bytes per lane to every dispatch's
/// record, copied after every step, for no gain.
pub const LANES: usize = 8;
/// Plane of `start_ns`: `%globaltimer` at entry of block 0, stored by it.
pub const START_PLANE: usize = 0;
/// Plane of the launch counter: thread 0 of block 0 adds one at entry.
pub const LAUNCH_PLANE: usize = 1;
/// First of the [`LANES`] planes of end times (`%globaltimer` when a block finished,
/// raised with an atomic max).
pub const FIRST_LANE_PLANE: usize = 2;
/// Planes of a ring: the `u64` words of one record.
pub const PLANES: usize = FIRST_LANE_PLANE + LANES;
/// Device bytes per record slot.
pub const RECORD_BYTES: usize = PLANES * 8;
/// Slots per plane are rounded up to a multiple of this, so that each plane starts on a
/// 128-byte line.
const SLOTS_PER_LINE: u32 = 128 / 8;

const _: () = assert!(
    LANES.is_power_of_two(),
    "the lane is the cycle counter masked"
);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RingError {
    #[error("profiler ring buffer: {0}")]
    Runtime(#[from] RtError),
    #[error("the profiler ring buffer holds {slots} records and all are taken; read them with `collect` first")]
    Full { slots: u32 },
    #[error("the profiler ring buffer needs at least one record slot")]
    Empty,
    #[error("a profiler ring buffer of {slots} records is more than one launch can address")]
    TooLarge { slots: u32 },
    #[error("the profiler's history holds {steps} copies of the records and all are taken; read them first")]
    HistoryFull { steps: u32 },
    #[error("the profiler's history needs room for at least one copy of the records")]
    HistoryEmpty,
    #[error("a profiler history of {steps} copies of {bytes} bytes each is more than this host can address")]
    HistoryTooLarge { steps: u32, bytes: u64 },
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
    /// Launches of this record's slot that ran since the previous reading: 1 for a
    /// dispatch that ran once, 0 for one that has not run since (its times are then the
    /// earlier launch's).
    pub launches: u64,
    /// End-time lanes that blocks of this launch raised, from 1 to `min(blocks, LANES)`
    /// once it has finished (which lane a block raises depends on when it finishes);
    /// 0 where `launches` is 0.
    pub lanes_ended: u32,
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

/// A taken slot: whose records it holds, and its launch counter at the previous reading.
struct Slot {
    kernel: String,
    stream: u32,
    launches_seen: u64,
}

/// A ring buffer of records on an executor, and which launch owns each taken slot.
pub struct Ring {
    ptr: DevicePtr,
    slots: u32,
    /// Words from one plane to the next: `slots` rounded up to whole lines.
    stride: u32,
    taken: Vec<Slot>,
}

impl Ring {
    /// Allocate `slots` zeroed records on `exec`.
    pub fn new(exec: &mut dyn Executor, slots: u32) -> Result<Ring, RingError> {
        if slots == 0 {
            return Err(RingError::Empty);
        }
        let stride = slots
            .checked_next_multiple_of(SLOTS_PER_LINE)
            .ok_or(RingError::TooLarge { slots })?;
        let ptr = exec.alloc(Self::bytes(stride))?;
        let ring = Ring {
            ptr,
            slots,
            stride,
            taken: vec![],
        };
        ring.zero(exec)?;
        Ok(ring)
    }

    fn bytes(stride: u32) -> u64 {
        (PLANES as u64) * stride as u64 * 8
    }

    fn zero(&self, exec: &mut dyn Executor) -> Result<(), RtError> {
        exec.copy_to_device(self.ptr, &vec![0u8; Self::bytes(self.stride) as usize])
    }

    /// Take the next slot for launches of `kernel` on `stream`; returns the two extra
    /// arguments of the instrumented kernel, to append to its own: the address of the
    /// slot's word in the first plane, and the plane stride in words.
    /// A slot may serve one launch per [`Ring::read`] (a captured graph's dispatch keeps
    /// its slot for every replay).
    pub fn next(&mut self, kernel: &str, stream: StreamId) -> Result<[Arg; 2], RingError> {
        let slot = self.taken.len() as u32;
        if slot >= self.slots {
            return Err(RingError::Full { slots: self.slots });
        }
        self.taken.push(Slot {
            kernel: kernel.to_string(),
            stream: stream.index(),
            launches_seen: 0,
        });
        Ok([
            Arg::Ptr(self.ptr.offset(8 * slot as u64)),
            Arg::U32(self.stride),
        ])
    }

    /// Read the record of every taken slot, in slot order, keeping the slots: one copy
    /// from the device. Each record's `launches` counts the launches since the previous
    /// reading. Synchronize first, or read with a copy that waits: a launch still running
    /// has not written its end.
    pub fn read(&mut self, exec: &mut dyn Executor) -> Result<Vec<Dispatch>, RingError> {
        let taken = self.taken.len();
        if taken == 0 {
            return Ok(vec![]);
        }
        // From the first plane's first word to the last plane's last taken word.
        let words = (PLANES - 1) * self.stride as usize + taken;
        let mut bytes = vec![0u8; words * 8];
        exec.copy_to_host(self.ptr, &mut bytes)?;
        Ok(self.decode(&bytes, taken))
    }

    /// The records of the first `taken` slots in `image`, a copy of the buffer from its
    /// start (at least to the last plane's word of slot `taken - 1`), as [`Ring::read`]
    /// returns them: each slot's `launches` counts from the previous image decoded or
    /// read, so images must come in the order they were taken.
    pub(crate) fn decode(&mut self, image: &[u8], taken: usize) -> Vec<Dispatch> {
        let stride = self.stride as usize;
        let word = |plane: usize, slot: usize| -> u64 {
            let at = 8 * (plane * stride + slot);
            let mut b = [0u8; 8];
            b.copy_from_slice(&image[at..at + 8]);
            u64::from_le_bytes(b)
        };
        self.taken
            .iter_mut()
            .take(taken)
            .enumerate()
            .map(|(i, slot)| {
                let counter = word(LAUNCH_PLANE, i);
                let launches = counter.wrapping_sub(slot.launches_seen);
                slot.launches_seen = counter;
                let start_ns = word(START_PLANE, i);
                let lanes = (FIRST_LANE_PLANE..PLANES).map(|p| word(p, i));
                // Lanes keep the end times of earlier launches, all before this start.
                let lanes_ended = match launches {
                    0 => 0,
                    _ => lanes.clone().filter(|&t| t != 0 && t >= start_ns).count() as u32,
                };
                Dispatch {
                    kernel: slot.kernel.clone(),
                    stream: slot.stream,
                    start_ns,
                    end_ns: lanes.max().unwrap_or(0),
                    launches,
                    lanes_ended,
                    ..Dispatch::default()
                }
            })
            .collect()
    }

    /// Slots taken so far.
    pub(crate) fn taken(&self) -> usize {
        self.taken.len()
    }

    /// The whole device buffer: its address and size in bytes.
    pub(crate) fn buffer(&self) -> (DevicePtr, u64) {
        (self.ptr, Self::bytes(self.stride))
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
