//! Device memory: global allocations, visible to the host, and the shared memory of the
//! block being run.

use std::collections::BTreeMap;

use super::InterpError;
use crate::func::Function;

/// First address handed out; low addresses stay unmapped so null pointers fault.
const BASE: u64 = 1 << 32;
/// Unmapped bytes between allocations, so an overrun lands in no allocation.
const GAP: u64 = 1 << 16;
/// Alignment of every allocation.
const ALIGN: u64 = 256;

/// Byte-addressed device memory. Allocations are 256-byte aligned, never at address 0,
/// separated by unmapped gaps, zero-filled, and their addresses are never reused, so an
/// access through a stale pointer is reported as such rather than hitting new data.
#[derive(Debug)]
pub struct GlobalMemory {
    /// Live allocations by base address, ascending (addresses only ever grow).
    live: Vec<(u64, Vec<u8>)>,
    /// Base and size of freed allocations, to name use-after-free accesses.
    freed: BTreeMap<u64, u64>,
    next: u64,
}

impl Default for GlobalMemory {
    fn default() -> Self {
        GlobalMemory::new()
    }
}

impl GlobalMemory {
    pub fn new() -> Self {
        GlobalMemory {
            live: Vec::new(),
            freed: BTreeMap::new(),
            next: BASE,
        }
    }

    /// Allocate `bytes` zeroed bytes and return their address.
    pub fn alloc(&mut self, bytes: u64) -> Result<u64, InterpError> {
        let oom = InterpError::OutOfMemory { bytes };
        let len = usize::try_from(bytes).map_err(|_| oom.clone())?;
        let next = self
            .next
            .checked_add(bytes)
            .and_then(|e| e.checked_add(GAP))
            .and_then(|e| e.checked_next_multiple_of(ALIGN))
            .ok_or(oom.clone())?;
        let mut data = Vec::new();
        data.try_reserve_exact(len).map_err(|_| oom)?;
        data.resize(len, 0);
        let addr = self.next;
        self.live.push((addr, data));
        self.next = next;
        Ok(addr)
    }

    /// Free the allocation starting at `addr`.
    pub fn free(&mut self, addr: u64) -> Result<(), InterpError> {
        match self.live.binary_search_by_key(&addr, |a| a.0) {
            Ok(i) => {
                let (_, d) = self.live.remove(i);
                self.freed.insert(addr, d.len() as u64);
                Ok(())
            }
            Err(_) => Err(InterpError::BadFree {
                addr,
                detail: self.describe(addr, 1),
            }),
        }
    }

    /// Copy `data` to device memory at `addr` (anywhere inside one allocation).
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), InterpError> {
        let bytes = data.len() as u64;
        match self.slice_mut(addr, bytes) {
            Ok(s) => {
                s.copy_from_slice(data);
                Ok(())
            }
            Err(detail) => Err(InterpError::HostOutOfBounds {
                addr,
                bytes,
                detail,
            }),
        }
    }

    /// Copy device memory at `addr` (inside one allocation) to `out`.
    pub fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), InterpError> {
        let bytes = out.len() as u64;
        match self.slice(addr, bytes) {
            Ok(s) => {
                out.copy_from_slice(s);
                Ok(())
            }
            Err(detail) => Err(InterpError::HostOutOfBounds {
                addr,
                bytes,
                detail,
            }),
        }
    }

    /// The allocation with the highest base at or below `addr`, by index.
    fn below(&self, addr: u64) -> Option<usize> {
        self.live.partition_point(|a| a.0 <= addr).checked_sub(1)
    }

    /// The index of the allocation holding all of `[addr, addr + len)` and the range
    /// that covers in it.
    fn find(&self, addr: u64, len: u64) -> Option<(usize, std::ops::Range<usize>)> {
        let i = self.below(addr)?;
        let (base, data) = &self.live[i];
        let off = addr - base;
        let end = off.checked_add(len)?;
        (end <= data.len() as u64).then_some((i, off as usize..end as usize))
    }

    /// The bytes `[addr, addr + len)`, or a description of why they are not mapped.
    pub(crate) fn slice(&self, addr: u64, len: u64) -> Result<&[u8], String> {
        match self.find(addr, len) {
            Some((i, r)) => Ok(&self.live[i].1[r]),
            None => Err(self.describe(addr, len)),
        }
    }

    pub(crate) fn slice_mut(&mut self, addr: u64, len: u64) -> Result<&mut [u8], String> {
        match self.find(addr, len) {
            Some((i, r)) => Ok(&mut self.live[i].1[r]),
            None => Err(self.describe(addr, len)),
        }
    }

    /// What lies at `addr`, for error messages.
    fn describe(&self, addr: u64, len: u64) -> String {
        if let Some((&base, &size)) = self.freed.range(..=addr).next_back() {
            if addr < base + size.max(1) {
                return format!("inside the {size}-byte allocation at {base:#x}, which was freed");
            }
        }
        match self.below(addr).map(|i| &self.live[i]) {
            Some((base, data)) => {
                let size = data.len() as u64;
                let off = addr - base;
                if off.saturating_add(len) <= size {
                    format!("{off} bytes into the {size}-byte allocation at {base:#x}")
                } else if off < size {
                    let over = off.saturating_add(len) - size;
                    format!(
                        "runs {over} bytes past the end of the {size}-byte allocation at {base:#x}"
                    )
                } else {
                    format!(
                        "starts {} bytes past the end of the {size}-byte allocation at {base:#x}",
                        off - size
                    )
                }
            }
            None if addr < BASE => "null or invalid pointer, below every allocation".to_string(),
            None => "no allocation there".to_string(),
        }
    }
}

/// The shared memory of one block: static declarations at `Function::shared_offsets()`,
/// then the dynamic part. Its contents start as 0xff bytes (NaN as floats) in every
/// block, so that reading what was never written stands out.
pub(crate) struct SharedMem {
    pub bytes: Vec<u8>,
    /// The mbarrier objects initialized in this block, by offset.
    pub mbarriers: std::collections::BTreeMap<usize, super::mbarrier::Mbar>,
    /// Name and byte range of each declaration. The dynamic part is reached through
    /// the last declaration, so its range extends to the end of the window (as does a
    /// zero-length declaration's).
    arrays: Vec<(String, u64, u64)>,
}

pub(crate) const SHARED_POISON: u8 = 0xff;

impl SharedMem {
    pub fn new(f: &Function, dynamic: u64) -> SharedMem {
        let total = f.shared_bytes() + dynamic;
        let last = f.shared.len().saturating_sub(1);
        let arrays = f
            .shared
            .iter()
            .zip(f.shared_offsets())
            .enumerate()
            .map(|(i, (d, start))| {
                let end = if d.len == 0 || i == last {
                    total
                } else {
                    start + d.bytes()
                };
                (d.name.clone(), start, end)
            })
            .collect();
        SharedMem {
            bytes: vec![SHARED_POISON; total as usize],
            mbarriers: Default::default(),
            arrays,
        }
    }

    pub fn reset(&mut self) {
        self.bytes.fill(SHARED_POISON);
        self.mbarriers.clear();
    }

    /// Check an access of `len` bytes at `off` through a pointer derived from
    /// declaration `prov - 1` (`prov` 0: origin unknown, checked against the whole
    /// window). Returns the offset as an index, or the region the access left.
    pub fn check(&self, off: u64, len: u64, prov: u16) -> Result<usize, String> {
        let (lo, hi, region) = match prov
            .checked_sub(1)
            .and_then(|d| self.arrays.get(d as usize))
        {
            Some((name, s, e)) => (
                *s,
                *e,
                format!("shared array `{name}` (offsets {s:#x}..{e:#x})"),
            ),
            None => {
                let n = self.bytes.len() as u64;
                (0, n, format!("the block's {n} bytes of shared memory"))
            }
        };
        match off.checked_add(len) {
            Some(end) if off >= lo && end <= hi => Ok(off as usize),
            _ => Err(region),
        }
    }
}
