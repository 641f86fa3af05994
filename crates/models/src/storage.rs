//! The bytes of a checkpoint file: memory-mapped from disk, or owned (tests, synthesized models).

use std::fs::File;
use std::ops::Deref;
use std::path::Path;

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
