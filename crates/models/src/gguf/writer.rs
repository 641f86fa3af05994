//! Writing GGUF v3 files (little-endian), for quantized checkpoints and test models.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use super::metadata::{encode_string, MetadataValue};
use super::reader::{tensor_size, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS};
use crate::{GgmlType, ModelError};

struct PendingTensor<'a> {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    bytes: &'a [u8],
}

/// Collects metadata and tensors, then writes them as one GGUF file. Tensor bytes are
/// borrowed until written. Setting `general.alignment` (a u32 power of two) changes the
/// data alignment from the default 32.
#[derive(Default)]
pub struct GgufWriter<'a> {
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<PendingTensor<'a>>,
    names: HashSet<String>,
    alignment: Option<u64>,
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> GgufWriter<'a> {
        GgufWriter::default()
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

    /// Adds a tensor; `dims` in ggml order (`dims[0]` is the row length). `bytes` must hold
    /// exactly the size that `dims` and `ggml_type` call for.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        ggml_type: GgmlType,
        bytes: &'a [u8],
    ) -> Result<(), ModelError> {
        let check = || -> Result<(), ModelError> {
            if dims.len() > MAX_DIMS as usize {
                return Err(ModelError::AbsurdCount {
                    what: "dimension count".to_owned(),
                    count: dims.len() as u64,
                    limit: MAX_DIMS.into(),
                });
            }
            let expected = tensor_size(dims, ggml_type)?;
            if expected != bytes.len() as u64 {
                return Err(ModelError::SizeMismatch {
                    what: format!("{ggml_type} data of shape {dims:?}"),
                    expected,
                    actual: bytes.len() as u64,
                });
            }
            if self.names.contains(name) {
                return Err(ModelError::Duplicate {
                    kind: "tensor",
                    name: name.to_owned(),
                });
            }
            Ok(())
        };
        check().map_err(|e| e.in_tensor(name))?;
        self.names.insert(name.to_owned());
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ggml_type,
            bytes,
        });
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
        let mut header = Vec::new();
        self.write_header(&mut header);
        w.write_all(&header)?;
        let alignment = self.alignment();
        for t in &self.tensors {
            w.write_all(t.bytes)?;
            let len = t.bytes.len() as u64;
            w.write_all(&vec![0u8; (len.next_multiple_of(alignment) - len) as usize])?;
        }
        Ok(())
    }

    fn alignment(&self) -> u64 {
        self.alignment.unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Appends the header and the padding after it.
    fn write_header(&self, out: &mut Vec<u8>) {
        let alignment = self.alignment();
        out.extend_from_slice(MAGIC);
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            encode_string(key, out);
            out.extend(value.value_type().id().to_le_bytes());
            value.encode(out);
        }
        let mut next = 0u64;
        for t in &self.tensors {
            encode_string(&t.name, out);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.id().to_le_bytes());
            out.extend(next.to_le_bytes());
            next = (next + t.bytes.len() as u64).next_multiple_of(alignment);
        }
        out.resize((out.len() as u64).next_multiple_of(alignment) as usize, 0);
    }
}
