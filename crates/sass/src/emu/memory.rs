//! The memories a kernel sees: global memory (allocations at made-up 64-bit addresses,
//! every access checked against them) and a block's shared memory.

use quench_ir::interp::GlobalMemory;

use super::EmuError;

/// Global memory as the emulator reads and writes it: whole, aligned accesses inside one
/// allocation, or a fault naming the instruction at `at`.
pub trait Memory {
    fn read(&mut self, at: u64, addr: u64, out: &mut [u8]) -> Result<(), EmuError>;
    fn write(&mut self, at: u64, addr: u64, bytes: &[u8]) -> Result<(), EmuError>;
}

/// The interpreter's memory, so that machine code runs on the buffers an
/// [`quench_ir::interp`] device holds (quench's executor does this for its own SASS).
impl Memory for GlobalMemory {
    fn read(&mut self, at: u64, addr: u64, out: &mut [u8]) -> Result<(), EmuError> {
        aligned(at, "global", addr, out.len())?;
        let len = out.len();
        GlobalMemory::read(self, addr, out).map_err(|_| global_fault(at, addr, len))
    }

    fn write(&mut self, at: u64, addr: u64, bytes: &[u8]) -> Result<(), EmuError> {
        aligned(at, "global", addr, bytes.len())?;
        GlobalMemory::write(self, addr, bytes).map_err(|_| global_fault(at, addr, bytes.len()))
    }
}

/// The instruction at `at` touched `len` bytes at `addr`, outside every allocation.
fn global_fault(at: u64, addr: u64, len: usize) -> EmuError {
    EmuError::Fault {
        at,
        space: "global",
        addr,
        len,
    }
}

/// Where the first allocation starts: high enough that a small integer mistaken for a
/// pointer faults, and 64-bit so that address arithmetic needs its carries.
const FIRST: u64 = 0x7f10_0000_0000;
/// Space left between allocations (and their alignment), so that running off the end of
/// one faults instead of landing in the next.
const GAP: u64 = 0x1_0000;

/// Flat global memory: disjoint allocations, each a byte vector.
#[derive(Clone, Debug, Default)]
pub struct Global {
    /// `(base, bytes)`, in increasing address order.
    allocs: Vec<(u64, Vec<u8>)>,
}

impl Global {
    pub fn new() -> Global {
        Global::default()
    }

    /// Allocates `data` and returns its address.
    pub fn alloc(&mut self, data: Vec<u8>) -> u64 {
        let base = match self.allocs.last() {
            Some((b, d)) => (b + d.len() as u64 + GAP).next_multiple_of(GAP),
            None => FIRST,
        };
        self.allocs.push((base, data));
        base
    }

    /// The contents of the allocation at `base`.
    pub fn get(&self, base: u64) -> Option<&[u8]> {
        self.allocs
            .iter()
            .find(|(b, _)| *b == base)
            .map(|(_, d)| d.as_slice())
    }

    /// The allocation holding `[addr, addr + len)` and the offset of `addr` in it.
    fn locate(&mut self, addr: u64, len: usize) -> Option<(&mut Vec<u8>, usize)> {
        let i = self
            .allocs
            .partition_point(|(b, _)| *b <= addr)
            .checked_sub(1)?;
        let (base, data) = &mut self.allocs[i];
        let off = addr - *base;
        let end = off.checked_add(len as u64)?;
        (end <= data.len() as u64).then_some((data, off as usize))
    }
}

impl Memory for Global {
    fn read(&mut self, at: u64, addr: u64, out: &mut [u8]) -> Result<(), EmuError> {
        let len = out.len();
        aligned(at, "global", addr, len)?;
        let (data, off) = self.locate(addr, len).ok_or(global_fault(at, addr, len))?;
        out.copy_from_slice(&data[off..off + len]);
        Ok(())
    }

    fn write(&mut self, at: u64, addr: u64, bytes: &[u8]) -> Result<(), EmuError> {
        let len = bytes.len();
        aligned(at, "global", addr, len)?;
        let (data, off) = self.locate(addr, len).ok_or(global_fault(at, addr, len))?;
        data[off..off + len].copy_from_slice(bytes);
        Ok(())
    }
}

/// An access of `len` bytes must be aligned to `len` (the hardware faults otherwise).
pub fn aligned(at: u64, space: &'static str, addr: u64, len: usize) -> Result<(), EmuError> {
    if addr.is_multiple_of(len as u64) {
        Ok(())
    } else {
        Err(EmuError::Misaligned {
            at,
            space,
            addr,
            len,
        })
    }
}

/// The shared-memory window of one block. ptxas addresses a kernel's shared variables
/// from 0x400 (it builds the base as `0x400 + (SR_CgaCtaId << 24)`): the first KiB of the
/// window is reserved on sm_90, and an access there is a fault here.
#[derive(Clone, Debug)]
pub struct Shared {
    bytes: Vec<u8>,
}

pub const SHARED_BASE: u64 = 0x400;

impl Shared {
    /// A window of `size` bytes of the kernel's own, which start out as a poison pattern
    /// (shared memory is not zeroed at launch).
    pub fn new(size: usize) -> Shared {
        Shared {
            bytes: vec![0xA5; size],
        }
    }

    fn range(&self, at: u64, addr: u64, len: usize) -> Result<std::ops::Range<usize>, EmuError> {
        let fault = EmuError::Fault {
            at,
            space: "shared",
            addr,
            len,
        };
        let off = addr.checked_sub(SHARED_BASE).ok_or(fault.clone())?;
        let end = off.checked_add(len as u64).ok_or(fault.clone())?;
        aligned(at, "shared", addr, len)?;
        if end > self.bytes.len() as u64 {
            return Err(fault);
        }
        Ok(off as usize..end as usize)
    }

    pub fn read(&self, at: u64, addr: u64, out: &mut [u8]) -> Result<(), EmuError> {
        let r = self.range(at, addr, out.len())?;
        out.copy_from_slice(&self.bytes[r]);
        Ok(())
    }

    pub fn write(&mut self, at: u64, addr: u64, bytes: &[u8]) -> Result<(), EmuError> {
        let r = self.range(at, addr, bytes.len())?;
        self.bytes[r].copy_from_slice(bytes);
        Ok(())
    }
}
