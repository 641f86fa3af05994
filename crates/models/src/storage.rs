//! The bytes of a checkpoint file: memory-mapped from disk, or owned (tests, synthesized models).

use std::fs::File;
use std::ops::{Deref, Range};
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

use crate::ModelError;

pub(crate) enum Storage {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    /// Maps `path` read-only.
    pub(crate) fn map(path: &Path) -> Result<Storage, ModelError> {
        let io_err = |source| ModelError::Io {
            file: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        // An empty file cannot be mapped on every platform; it is also never a valid checkpoint,
        // and the format parsers report that better from an empty buffer.
        if file.metadata().map_err(io_err)?.len() == 0 {
            return Ok(Storage::Owned(Vec::new()));
        }
        // SAFETY: the map is read-only. Another process truncating or rewriting the file while it
        // is mapped would make these bytes change under us (or fault); like every mmap-based
        // checkpoint reader we accept that, as checkpoints are not modified while being served.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Ok(Storage::Mapped(map))
    }
}

impl Storage {
    /// Tells the kernel that `range` will not be read again for a while: the whole pages
    /// inside it leave this process's resident memory (they stay in the page cache, and
    /// reading them again maps them back). Owned bytes are left as they are.
    pub(crate) fn release(&self, range: Range<usize>) {
        let Storage::Mapped(map) = self else {
            return;
        };
        const PAGE: usize = 4096;
        let (start, end) = (range.start.next_multiple_of(PAGE), range.end / PAGE * PAGE);
        if start < end && end <= map.len() {
            #[cfg(unix)]
            // SAFETY: the map is private to this Storage and read-only; dropping its pages
            // only makes the next read fault them in again from the file.
            unsafe {
                // Advice is a hint: a refusal changes nothing but memory use.
                let _ = map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    end - start,
                );
            }
        }
    }
}

/// Bytes of a checkpoint that a model keeps using after loading (weights multiplied as
/// stored): a range of a shared [`Storage`], memory-mapped or owned, so that a mapped
/// file's bytes are held once — by the mapping — and not copied.
#[derive(Clone)]
pub struct SharedBytes {
    storage: Arc<Storage>,
    range: Range<usize>,
}

impl SharedBytes {
    pub(crate) fn new(storage: Arc<Storage>, range: Range<usize>) -> SharedBytes {
        debug_assert!(range.end <= storage.len());
        SharedBytes { storage, range }
    }
}

impl From<Vec<u8>> for SharedBytes {
    fn from(bytes: Vec<u8>) -> SharedBytes {
        let range = 0..bytes.len();
        SharedBytes::new(Arc::new(Storage::Owned(bytes)), range)
    }
}

impl Deref for SharedBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.storage[self.range.clone()]
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match *self.storage {
            Storage::Mapped(_) => "mapped",
            Storage::Owned(_) => "owned",
        };
        write!(f, "SharedBytes({} {kind} bytes)", self.range.len())
    }
}

impl Deref for Storage {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mapped(map) => map,
            Storage::Owned(bytes) => bytes,
        }
    }
}

/// The file image `write_to` produces, collected in memory.
pub(crate) fn image_to_vec(write_to: impl FnOnce(&mut Vec<u8>) -> std::io::Result<()>) -> Vec<u8> {
    let mut out = Vec::new();
    write_to(&mut out).expect("writing to a Vec cannot fail");
    out
}

/// Writes the file image `write_to` produces to `path`; errors name the file.
pub(crate) fn write_image(
    path: &Path,
    write_to: impl FnOnce(&mut std::io::BufWriter<File>) -> std::io::Result<()>,
) -> Result<(), ModelError> {
    use std::io::Write;
    let io_err = |source| ModelError::Io {
        file: path.to_owned(),
        source,
    };
    let mut file = std::io::BufWriter::new(File::create(path).map_err(io_err)?);
    write_to(&mut file)
        .and_then(|()| file.flush())
        .map_err(io_err)
}
