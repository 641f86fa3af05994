//! Copies of a ring's records kept on the device, one per step, read back many at a time.
//!
//! Reading the ring back after every step puts a copy to the host, and the wait for it,
//! into every step. A [`History`] instead has each step end with a copy of the ring into
//! the next of its slots, on the device and not waited for by the host, and reads all the
//! slots filled so far back in one copy: when they are all filled, or when its owner is
//! done.
//!
//! The copy is a kernel of its own ([`COPY_KERNEL`], a thread per 8-byte word), launched
//! on the steps' stream. A driver memory copy would do the same work, but measured on an
//! H200 between replays of a decode step's graph it cost far more than its bytes: ~45 µs
//! on the step it followed and ~40 µs on each later step (qwen2.5-0.5b shape, 147
//! dispatches a step, 0.77 ms plain), against a few µs for a kernel launch.

use quench_ir::{Builder, Function, Scalar, Type};
use quench_kernels::lanes::gptr;
use quench_rt::{Arg, DevicePtr, Executor, KernelId, Launch, StreamId};

use crate::ring::{Dispatch, Ring, RingError};

/// Name of the kernel that copies the ring into the history.
pub const COPY_KERNEL: &str = "prof_history_copy";
/// Threads per block of the copy.
const COPY_THREADS: u32 = 256;

/// `prof_history_copy(dst, src, words)`: `dst[i] = src[i]` for `i < words`, u64 words.
pub fn copy_kernel() -> Function {
    let mut k = Builder::new(COPY_KERNEL, COPY_THREADS);
    let dst = k.param("dst", gptr(Scalar::U64));
    let src = k.param("src", gptr(Scalar::U64));
    let words = k.param("words", Type::U32);
    let i = k.global_id_x();
    let inside = k.lt(i, words);
    k.if_then(inside, |k| {
        let from = k.ptr_add(src, i);
        let word = k.load(Type::U64, from);
        let to = k.ptr_add(dst, i);
        k.store(to, word);
    });
    k.finish().expect("the history copy kernel verifies")
}

/// A [`Ring`] and room on the device for `steps` copies of it.
pub struct History {
    ring: Ring,
    ptr: DevicePtr,
    steps: u32,
    /// Bytes of one copy: the ring's whole buffer.
    copy_bytes: u64,
    /// Per copy made since the previous read, in order: the ring's slots taken then.
    copies: Vec<usize>,
    copy: KernelId,
}

impl History {
    /// Allocate a ring of `slots` zeroed records and room for `steps` copies of it on
    /// `exec`.
    pub fn new(exec: &mut dyn Executor, slots: u32, steps: u32) -> Result<History, RingError> {
        if steps == 0 {
            return Err(RingError::HistoryEmpty);
        }
        let ring = Ring::new(exec, slots)?;
        let (_, copy_bytes) = ring.buffer();
        // Every copy may be read back at once, into one host buffer.
        let total = copy_bytes
            .checked_mul(steps as u64)
            .filter(|&b| usize::try_from(b).is_ok())
            .ok_or(RingError::HistoryTooLarge { steps, bytes: copy_bytes });
        let room = total.and_then(|total| {
            let copy = exec.load(&copy_kernel())?;
            Ok((exec.alloc(total)?, copy))
        });
        match room {
            Ok((ptr, copy)) => Ok(History { ring, ptr, steps, copy_bytes, copies: vec![], copy }),
            Err(e) => {
                // Best effort: the allocation error is the one worth reporting.
                let _ = ring.release(exec);
                Err(e)
            }
        }
    }

    /// Take the ring's next slot, as [`Ring::next`] does.
    pub fn next(&mut self, kernel: &str, stream: StreamId) -> Result<[Arg; 2], RingError> {
        self.ring.next(kernel, stream)
    }

    /// Copies made since the previous [`History::read`].
    pub fn copies(&self) -> u32 {
        self.copies.len() as u32
    }

    /// Whether every copy's room is taken: [`History::read`] before the next snapshot.
    pub fn is_full(&self) -> bool {
        self.copies() >= self.steps
    }

    /// Copy the ring's records into the next free room: a launch of the copy kernel on
    /// `stream` (the stream the instrumented launches ran on), after them and before the
    /// launches issued there next, which the host does not wait for.
    pub fn snapshot(&mut self, exec: &mut dyn Executor, stream: StreamId) -> Result<(), RingError> {
        if self.is_full() {
            return Err(RingError::HistoryFull { steps: self.steps });
        }
        let (ring, bytes) = self.ring.buffer();
        let words = u32::try_from(bytes / 8).map_err(|_| RingError::HistoryTooLarge { steps: self.steps, bytes })?;
        let dst = self.ptr.offset(bytes * self.copies.len() as u64);
        let launch = Launch::linear(words.div_ceil(COPY_THREADS), COPY_THREADS);
        let args = [Arg::Ptr(dst), Arg::Ptr(ring), Arg::U32(words)];
        exec.launch(self.copy, &launch, &args, stream)?;
        self.copies.push(self.ring.taken());
        Ok(())
    }

    /// Read every copy made since the previous read, in one copy from the device (which
    /// waits for the snapshots), and free their room: per copy, in the order they were
    /// made, the records of the slots taken then, each record's `launches` counting the
    /// launches of its slot since the copy before.
    pub fn read(&mut self, exec: &mut dyn Executor) -> Result<Vec<Vec<Dispatch>>, RingError> {
        if self.copies.is_empty() {
            return Ok(vec![]);
        }
        // `new` checked that all the room fits in a host buffer.
        let copy = self.copy_bytes as usize;
        let mut bytes = vec![0u8; copy * self.copies.len()];
        exec.copy_to_host(self.ptr, &mut bytes)?;
        let ring = &mut self.ring;
        let out = bytes.chunks_exact(copy).zip(&self.copies).map(|(image, &taken)| ring.decode(image, taken)).collect();
        self.copies.clear();
        Ok(out)
    }

    /// Free the ring and the copies' room.
    pub fn release(self, exec: &mut dyn Executor) -> Result<(), RingError> {
        let freed = exec.free(self.ptr);
        self.ring.release(exec)?;
        Ok(freed?)
    }
}
