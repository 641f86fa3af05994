//! The live allocations of an executor, so that a free of a wrong address or a copy
//! past the end of a buffer is refused by name instead of corrupting a neighbour.

use std::collections::BTreeMap;

use crate::error::RtError;

#[derive(Debug, Default)]
pub(crate) struct Allocations {
    /// start address → size in bytes
    live: BTreeMap<u64, u64>,
}

impl Allocations {
    pub fn insert(&mut self, addr: u64, bytes: u64) {
        self.live.insert(addr, bytes);
    }

    /// Forget an allocation; `addr` must be its start.
    pub fn remove(&mut self, addr: u64) -> Result<u64, RtError> {
        self.live.remove(&addr).ok_or_else(|| RtError::Memory {
            message: format!("free of {addr:#x}, which is not the start of a live allocation"),
        })
    }

    /// Whether `addr` lies inside a live allocation or one past its end.
    pub fn contains_addr(&self, addr: u64) -> bool {
        self.containing(addr)
            .is_some_and(|(base, size)| addr - base <= size)
    }

    /// Check that a device-to-device copy of `bytes` reads and writes inside live
    /// allocations.
    pub fn check_copy(&self, dst: u64, src: u64, bytes: u64) -> Result<(), RtError> {
        self.check_range(src, bytes, "device-to-device copy (source)")?;
        self.check_range(dst, bytes, "device-to-device copy (destination)")
    }

    /// Check that `[addr, addr + bytes)` lies inside one live allocation. `what` names
    /// the operation for the message ("copy to device", ...). Empty ranges pass.
    pub fn check_range(&self, addr: u64, bytes: u64, what: &str) -> Result<(), RtError> {
        if bytes == 0 {
            return Ok(());
        }
        match self.containing(addr) {
            Some((base, size)) if addr - base < size => {
                let room = size - (addr - base);
                if bytes <= room {
                    Ok(())
                } else {
                    Err(RtError::Memory {
                        message: format!(
                            "{what} of {bytes} bytes at {addr:#x} runs past the end of the \
                             {size}-byte allocation at {base:#x} ({room} bytes left)"
                        ),
                    })
                }
            }
            _ => Err(RtError::Memory {
                message: format!(
                    "{what} of {bytes} bytes at {addr:#x}, which is not inside any live allocation"
                ),
            }),
        }
    }

    /// Start addresses of all live allocations.
    pub fn addrs(&self) -> Vec<u64> {
        self.live.keys().copied().collect()
    }

    /// The allocation starting at or below `addr`.
    fn containing(&self, addr: u64) -> Option<(u64, u64)> {
        self.live.range(..=addr).next_back().map(|(&b, &s)| (b, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_against_the_allocation_that_holds_them() {
        let mut a = Allocations::default();
        a.insert(0x1000, 256);
        a.insert(0x2000, 16);
        assert!(a.check_range(0x1000, 256, "copy").is_ok());
        assert!(a.check_range(0x10ff, 1, "copy").is_ok());
        assert!(a.check_range(0x1001, 256, "copy").is_err());
        assert!(
            a.check_range(0x1100, 1, "copy").is_err(),
            "one past the end holds no byte"
        );
        assert!(a.check_range(0x0fff, 1, "copy").is_err());
        assert!(
            a.contains_addr(0x1100),
            "one past the end is a valid pointer"
        );
        assert!(!a.contains_addr(0x1101));
        assert!(a.remove(0x1001).is_err());
        assert_eq!(a.remove(0x1000), Ok(256));
        assert!(
            a.check_range(0x1000, 1, "copy").is_err(),
            "freed memory is gone"
        );
    }
}
