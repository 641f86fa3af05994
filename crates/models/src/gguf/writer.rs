//! Writing GGUF v3 files (little-endian), for quantized checkpoints and test models.
//!
//! [`GgufHeader`] collects metadata and tensor descriptions; the tensor data follows in the
//! same order. [`GgufWriter`] holds the data in memory (borrowed) and writes everything at
//! once; [`GgufFileWriter`] writes the header to a file first and then takes one tensor at a
//! time, so that a converter never holds more than one tensor's data.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::metadata::{encode_string, MetadataValue};
use super::reader::{tensor_size, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::{GgmlType, ModelError};

struct TensorEntry {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    /// Bytes of data, computed from `dims` and `ggml_type`.
    size: u64,
}

/// The metadata and tensor descriptions of a GGUF file, in file order. Setting
/// `general.alignment` (a u32 power of two) changes the data alignment from the default 32.
#[derive(Default)]
pub struct GgufHeader {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<TensorEntry>,
    names: HashSet<String>,
    alignment: Option<u64>,
}

impl GgufHeader {
    pub fn new() -> GgufHeader {
        GgufHeader::default()
    }

    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) -> Result<(), ModelError> {
        if self.metadata.iter().any(|(k, _)| k == key) {
            return Err(ModelError::Duplicate {
                kind: "metadata key",
                name: key.to_owned(),
            });
        }
        if key == ALIGNMENT_KEY {
            match value {
                MetadataValue::U32(a) if a.is_power_of_two() => self.alignment = Some(a.into()),
                ref other => {
                    return Err(ModelError::BadMetadata {
                        key: key.to_owned(),
                        reason: format!("must be a u32 power of two, not {other:?}"),
                    })
                }
            }
        }
        self.metadata.push((key.to_owned(), value));
        Ok(())
    }

    /// Declares the next tensor; `dims` in ggml order (`dims[0]` is the row length). Returns
    /// the size its data must have.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
    ) -> Result<u64, ModelError> {
        let check = || -> Result<u64, ModelError> {
            if dims.len() > MAX_DIMS as usize {
                return Err(ModelError::AbsurdCount {
                    what: "dimension count".to_owned(),
                    count: dims.len() as u64,
                    limit: MAX_DIMS.into(),
                });
            }
            let size = tensor_size(dims, ggml_type)?;
            if self.names.contains(name) {
                return Err(ModelError::Duplicate {
                    kind: "tensor",
                    name: name.to_owned(),
                });
            }
            Ok(size)
        };
        let size = check().map_err(|e| e.in_tensor(name))?;
        self.names.insert(name.to_owned());
        self.tensors.push(TensorEntry {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ggml_type,
            size,
        });
        Ok(size)
    }

    /// Tensors declared so far.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    fn alignment(&self) -> u64 {
        self.alignment.unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Padding after `len` bytes of tensor data.
    fn padding(&self, len: u64) -> usize {
        (len.next_multiple_of(self.alignment()) - len) as usize
    }

    /// The header bytes, padded to the alignment.
    fn encode(&self) -> Vec<u8> {
        let alignment = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            encode_string(key, &mut out);
            out.extend(value.value_type().id().to_le_bytes());
            value.encode(&mut out);
        }
        let mut next = 0u64;
        for t in &self.tensors {
            encode_string(&t.name, &mut out);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.id().to_le_bytes());
            out.extend(next.to_le_bytes());
            next = (next + t.size).next_multiple_of(alignment);
        }
        out.resize((out.len() as u64).next_multiple_of(alignment) as usize, 0);
        out
    }
}

/// Collects metadata and tensors, then writes them as one GGUF file. Tensor bytes are
/// borrowed until written.
#[derive(Default)]
pub struct GgufWriter<'a> {
    header: GgufHeader,
    data: Vec<&'a [u8]>,
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> GgufWriter<'a> {
        GgufWriter::default()
    }

    pub fn add_metadata(&mut self, key: &str, value: MetadataValue) -> Result<(), ModelError> {
        self.header.add_metadata(key, value)
    }

    /// Adds a tensor; `dims` in ggml order (`dims[0]` is the row length). `bytes` must hold
    /// exactly the size that `dims` and `ggml_type` call for.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
        bytes: &'a [u8],
    ) -> Result<(), ModelError> {
        // Check the size before declaring, so that a refused tensor leaves no trace.
        let expected = tensor_size(dims, ggml_type).map_err(|e| e.in_tensor(name))?;
        if expected != bytes.len() as u64 {
            return Err(ModelError::SizeMismatch {
                what: format!("{ggml_type} data of shape {dims:?}"),
                expected,
                actual: bytes.len() as u64,
            }
            .in_tensor(name));
        }
        self.header.add_tensor(name, dims, ggml_type)?;
        self.data.push(bytes);
        Ok(())
    }

    /// The whole file image.
    pub fn to_bytes(&self) -> Vec<u8> {
        crate::storage::image_to_vec(|w| self.write_to(w))
    }

    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), ModelError> {
        crate::storage::write_image(path.as_ref(), |w| self.write_to(w))
    }

    /// Streams the file: the header (built in memory, it is small), then the tensor data,
    /// each tensor padded to the alignment (the last one too, as llama.cpp's writers do).
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        w.write_all(&self.header.encode())?;
        for bytes in &self.data {
            w.write_all(bytes)?;
            w.write_all(&vec![0u8; self.header.padding(bytes.len() as u64)])?;
        }
        Ok(())
    }
}

/// Writes a GGUF file tensor by tensor: [`GgufFileWriter::create`] writes the header, each
/// [`GgufFileWriter::write_tensor`] the data of the next declared tensor, and
/// [`GgufFileWriter::finish`] checks that every tensor came and makes the file durable.
pub struct GgufFileWriter {
    header: GgufHeader,
    path: PathBuf,
    out: BufWriter<File>,
    /// Index of the next tensor to write.
    next: usize,
}

impl GgufFileWriter {
    /// Creates (or truncates) `path` and writes `header` to it.
    pub fn create(
        path: impl AsRef<Path>,
        header: GgufHeader,
    ) -> Result<GgufFileWriter, ModelError> {
        let path = path.as_ref().to_owned();
        let file = File::create(&path).map_err(|source| ModelError::Io {
            file: path.clone(),
            source,
        })?;
        let mut writer = GgufFileWriter {
            out: BufWriter::with_capacity(1 << 22, file),
            header,
            path,
            next: 0,
        };
        let bytes = writer.header.encode();
        writer.put(&bytes)?;
        Ok(writer)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        self.out.write_all(bytes).map_err(|source| ModelError::Io {
            file: self.path.clone(),
            source,
        })
    }

    /// Writes the data of the next declared tensor, which must be exactly its size.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<(), ModelError> {
        let Some(entry) = self.header.tensors.get(self.next) else {
            return Err(ModelError::AbsurdCount {
                what: "tensors written".to_owned(),
                count: self.next as u64 + 1,
                limit: self.header.tensors.len() as u64,
            }
            .in_file(&self.path));
        };
        if entry.size != bytes.len() as u64 {
            return Err(ModelError::SizeMismatch {
                what: format!("{} data of shape {:?}", entry.ggml_type, entry.dims),
                expected: entry.size,
                actual: bytes.len() as u64,
            }
            .in_tensor(&entry.name)
            .in_file(&self.path));
        }
        let padding = self.header.padding(entry.size);
        self.put(bytes)?;
        self.put(&vec![0u8; padding])?;
        self.next += 1;
        Ok(())
    }

    /// Checks that every declared tensor was written, flushes, and syncs the file to disk.
    pub fn finish(mut self) -> Result<(), ModelError> {
        if let Some(missing) = self.header.tensors.get(self.next) {
            return Err(ModelError::MissingTensor {
                name: missing.name.clone(),
            }
            .in_file(&self.path));
        }
        let io_err = |source| ModelError::Io {
            file: self.path.clone(),
            source,
        };
        self.out.flush().map_err(io_err)?;
        self.out.get_ref().sync_all().map_err(io_err)
    }
}
