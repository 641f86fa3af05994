//! Copies of a ring's records kept on the device, one per step, read back many at a time.
//!
//! Reading the ring back after every step puts a copy to the host, and the wait for it,
//! into every step. A [`History`] instead has each step end with a copy of the ring into
//! the next of its rooms, made on the device by the step's own last dispatch
//! ([`History::copy_dispatch`], which a captured step graph holds like any other launch),
//! and reads all the rooms filled so far back in one copy: when they are all filled, or
//! when its owner is done.
//!
//! The copy is a kernel ([`COPY_KERNEL`]) that takes its room from a counter on the
//! device, so the same launch, with the same arguments, fills the next room at every
//! replay. Measured on an H200 between replays of a decode step's graph, a driver copy
//! issued by the host after each instrumented step (`cuMemcpyDtoD`) made every later
//! step slower too: with one step in 10 instrumented, +6.5% against +0.9% without it
//! (qwen2.5-0.5b shape, 147 dispatches a step, 0.77 ms plain); the copy kernel inside the
//! graph costs nothing measurable there.

use quench_ir::{Builder, Function, Scalar, Type};
use quench_kernels::lanes::gptr;
use quench_rt::{Arg, DevicePtr, Executor, KernelId, Launch, StreamId};

use crate::ring::{Dispatch, Ring, RingError};

/// Name of the kernel that copies the ring into the history.
pub const COPY_KERNEL: &str = "prof_history_copy";
/// Threads of the copy's one block.
const COPY_THREADS: u32 = 256;

/// `prof_history_copy(rooms, ring, words, steps, counter)`: one block copies the ring's
/// `words` u64 words into room `counter mod steps` of `rooms` (rooms of `words` words back
/// to back), then adds one to `counter` (u64).
pub fn copy_kernel() -> Function {
    let mut k = Builder::new(COPY_KERNEL, COPY_THREADS);
    let rooms = k.param("rooms", gptr(Scalar::U64));
    let ring = k.param("ring", gptr(Scalar::U64));
    let words = k.param("words", Type::U32);
    let steps = k.param("steps", Type::U32);
    let counter = k.param("counter", gptr(Scalar::U64));
    let made = k.load(Type::U64, counter);
    let steps64 = k.cvt(Scalar::U64, steps);
    let room = k.rem(made, steps64);
    let words64 = k.cvt(Scalar::U64, words);
    let first = k.mul(room, words64);
    let dst = k.ptr_add(rooms, first);
    let tid = k.tid_x();
    let threads = k.const_u32(COPY_THREADS);
    k.for_range(tid, words, threads, &[], |k, i, _| {
        let from = k.ptr_add(ring, i);
        let word = k.load(Type::U64, from);
        let to = k.ptr_add(dst, i);
        k.store(to, word);
        vec![]
    });
    // Every thread has read the counter before thread 0 moves it on.
    k.barrier();
    let zero = k.const_u32(0);
    let first_thread = k.eq(tid, zero);
    k.if_then(first_thread, |k| {
        let one = k.const_u64(1);
        let next = k.add(made, one);
        k.store(counter, next);
    });
    k.finish().expect("the history copy kernel verifies")
}

/// A launch of the copy kernel, to end each step whose records the history keeps.
#[derive(Clone, Debug)]
pub struct CopyDispatch {
    pub kernel: KernelId,
    pub launch: Launch,
    pub args: Vec<Arg>,
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
    /// Copies made before those (the device counter's value at the first of them).
    made: u64,
    copy: CopyDispatch,
}

impl History {
    /// Allocate a ring of `slots` zeroed records and room for `steps` copies of it on
    /// `exec`.
    pub fn new(exec: &mut dyn Executor, slots: u32, steps: u32) -> Result<History, RingError> {
        if steps == 0 {
            return Err(RingError::HistoryEmpty);
        }
        let ring = Ring::new(exec, slots)?;
        let (ring_ptr, copy_bytes) = ring.buffer();
        // Every copy may be read back at once, into one host buffer; the copy kernel
        // counts the ring in u32 words.
        let words = u32::try_from(copy_bytes / 8).ok();
        let total = copy_bytes
            .checked_mul(steps as u64)
            .filter(|&b| usize::try_from(b).is_ok())
            .zip(words)
            .ok_or(RingError::HistoryTooLarge {
                steps,
                bytes: copy_bytes,
            });
        let room = total.and_then(|(total, words)| {
            let kernel = exec.load(&copy_kernel())?;
            // The rooms, then the copy counter.
            let ptr = exec.alloc(total + 8)?;
            let counter = ptr.offset(total);
            let copy = CopyDispatch {
                kernel,
                launch: Launch::linear(1, COPY_THREADS),
                args: vec![
                    Arg::Ptr(ptr),
                    Arg::Ptr(ring_ptr),
                    Arg::U32(words),
                    Arg::U32(steps),
                    Arg::Ptr(counter),
                ],
            };
            match exec.copy_to_device(counter, &0u64.to_le_bytes()) {
                Ok(()) => Ok((ptr, copy)),
                Err(e) => {
                    let _ = exec.free(ptr);
                    Err(e.into())
                }
            }
        });
        match room {
            Ok((ptr, copy)) => Ok(History {
                ring,
                ptr,
                steps,
                copy_bytes,
                copies: vec![],
                made: 0,
                copy,
            }),
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

    /// The dispatch that copies the ring into the next room: the last launch of every
    /// step whose records are kept, on the stream of its other launches.
    pub fn copy_dispatch(&self) -> &CopyDispatch {
        &self.copy
    }

    /// Count a step whose launches, [`History::copy_dispatch`] last, have been issued.
    /// A full history must be read first: the copy would have overwritten its oldest
    /// room.
    pub fn copied(&mut self) -> Result<(), RingError> {
        if self.is_full() {
            return Err(RingError::HistoryFull { steps: self.steps });
        }
        self.copies.push(self.ring.taken());
        Ok(())
    }

    /// Read every copy made since the previous read, in one copy from the device (which
    /// waits for the steps that made them), and free their room: per copy, in the order they were
    /// made, the records of the slots taken then, each record's `launches` counting the
    /// launches of its slot since the copy before.
    pub fn read(&mut self, exec: &mut dyn Executor) -> Result<Vec<Vec<Dispatch>>, RingError> {
        if self.copies.is_empty() {
            return Ok(vec![]);
        }
        // `new` checked that all the rooms fit in a host buffer.
        let copy = self.copy_bytes as usize;
        let mut bytes = vec![0u8; copy * self.steps as usize];
        exec.copy_to_host(self.ptr, &mut bytes)?;
        let ring = &mut self.ring;
        let steps = u64::from(self.steps);
        let out = (self.made..)
            .zip(&self.copies)
            .map(|(made, &taken)| {
                let room = (made % steps) as usize * copy;
                ring.decode(&bytes[room..room + copy], taken)
            })
            .collect();
        self.made += self.copies.len() as u64;
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
