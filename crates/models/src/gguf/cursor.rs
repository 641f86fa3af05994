//! A bounds-checked little-endian reader over the GGUF header bytes.
//!
//! Every read names what it was reading, so that a truncated file is reported as
//! "tensor info 12 name at offset 4410 needs 31 bytes but only 7 remain".

use crate::ModelError;

pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Cursor<'a> {
        Cursor { bytes, pos: 0 }
    }

    pub(crate) fn position(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    pub(crate) fn take(
        &mut self,
        n: u64,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], ModelError> {
        if n > self.remaining() {
            return Err(ModelError::Truncated {
                what: what(),
                offset: self.position(),
                needed: n,
                available: self.remaining(),
            });
        }
        // `n <= remaining`, which is a `usize`, so the cast is lossless.
        let slice = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(slice)
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], ModelError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, ModelError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: impl FnOnce() -> String) -> Result<u16, ModelError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, ModelError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, ModelError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 byte length, then UTF-8 bytes (no terminator).
    pub(crate) fn string(&mut self, what: impl Fn() -> String) -> Result<String, ModelError> {
        let len = self.u64(|| format!("{} length", what()))?;
        let bytes = self.take(len, &what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| ModelError::InvalidUtf8 { what: what() })
    }

    /// Reads a count of items that each take at least `min_item_bytes`, refusing a count that
    /// cannot fit in the rest of the file. Even a count that fits may be huge in a large mapped
    /// file, so reserve room with [`capacity_for`], not the count itself.
    pub(crate) fn count(
        &mut self,
        min_item_bytes: u64,
        what: impl Fn() -> String,
    ) -> Result<u64, ModelError> {
        let count = self.u64(&what)?;
        let limit = self.remaining() / min_item_bytes.max(1);
        if count > limit {
            return Err(ModelError::AbsurdCount {
                what: what(),
                count,
                limit,
            });
        }
        Ok(count)
    }
}

/// Room to reserve up front for `count` items: collections then grow only as items actually
/// parse, so a lying count in a large file costs nothing before it is caught.
pub(crate) fn capacity_for(count: u64) -> usize {
    count.min(4096) as usize
}
