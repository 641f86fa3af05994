//! Writing safetensors files, for synthesized test models.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use serde_json::{json, Map, Value};

use super::header::METADATA_KEY;
use super::Dtype;
use crate::ModelError;

struct PendingTensor<'a> {
    name: String,
    dtype: Dtype,
    shape: Vec<u64>,
    bytes: &'a [u8],
}

/// Collects tensors (bytes borrowed until written) and `__metadata__` entries, then writes one
/// safetensors file. Data is laid out in the order tensors were added; the header is padded
/// with spaces to a multiple of 8 bytes so that the data starts aligned.
#[derive(Default)]
pub struct SafetensorsWriter<'a> {
    tensors: Vec<PendingTensor<'a>>,
    names: HashSet<String>,
    metadata: BTreeMap<String, String>,
}

impl<'a> SafetensorsWriter<'a> {
    pub fn new() -> SafetensorsWriter<'a> {
        SafetensorsWriter::default()
    }

    pub fn set_metadata(&mut self, key: &str, value: &str) {
        self.metadata.insert(key.to_owned(), value.to_owned());
    }

    /// Adds a tensor; `shape` is row-major and `bytes` must be exactly its size.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: Dtype,
        shape: &[u64],
        bytes: &'a [u8],
    ) -> Result<(), ModelError> {
        let check = || -> Result<(), ModelError> {
            if name == METADATA_KEY || self.names.contains(name) {
                return Err(ModelError::Duplicate {
                    kind: "tensor",
                    name: name.to_owned(),
                });
            }
            let expected = shape
                .iter()
                .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| ModelError::BadShape {
                    dims: shape.to_vec(),
                    reason: "byte size overflows".to_owned(),
                })?;
            if expected != bytes.len() as u64 {
                return Err(ModelError::SizeMismatch {
                    what: format!("{dtype} data of shape {shape:?}"),
                    expected,
                    actual: bytes.len() as u64,
                });
            }
            Ok(())
        };
        check().map_err(|e| e.in_tensor(name))?;
        self.names.insert(name.to_owned());
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dtype,
            shape: shape.to_vec(),
            bytes,
        });
        Ok(())
    }

    fn header(&self) -> Vec<u8> {
        let mut entries = Map::new();
        if !self.metadata.is_empty() {
            entries.insert(METADATA_KEY.to_owned(), json!(self.metadata));
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            let end = offset + t.bytes.len() as u64;
            entries.insert(
                t.name.clone(),
                json!({ "dtype": t.dtype.name(), "shape": t.shape, "data_offsets": [offset, end] }),
            );
            offset = end;
        }
        let mut header = Value::Object(entries).to_string().into_bytes();
        header.resize(header.len().next_multiple_of(8), b' ');
        header
    }

    /// Streams the file: header length, header, data.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let header = self.header();
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        for t in &self.tensors {
            w.write_all(t.bytes)?;
        }
        Ok(())
    }

    /// The whole file image.
    pub fn to_bytes(&self) -> Vec<u8> {
        crate::storage::image_to_vec(|w| self.write_to(w))
    }

    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), ModelError> {
        crate::storage::write_image(path.as_ref(), |w| self.write_to(w))
    }
}
