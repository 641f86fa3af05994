//! GGUF, llama.cpp's checkpoint format: a header of typed metadata and tensor infos, then
//! aligned tensor data, which is memory-mapped and handed out as borrowed byte slices.

mod cursor;
mod metadata;
mod reader;
mod vocab;
mod writer;

use std::collections::HashMap;
use std::path::Path;

pub use metadata::{MetadataArray, MetadataValue, ValueType};
pub use writer::{GgufFileWriter, GgufHeader, GgufWriter};

use crate::storage::{SharedBytes, Storage};
use crate::{GgmlType, ModelError};
use std::sync::Arc;

/// Where one tensor lives in a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (row) dimension, the reverse of PyTorch's shape.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Bytes, computed from `dims` and `ggml_type`.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A tensor's description and its bytes, borrowed from the mapped file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    /// ggml order, as in [`TensorInfo::dims`].
    pub dims: &'a [u64],
    pub ggml_type: GgmlType,
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Dequantizes the whole tensor.
    pub fn to_f32(&self) -> Result<Vec<f32>, ModelError> {
        let n = usize::try_from(self.n_elements()).map_err(|_| ModelError::BadShape {
            dims: self.dims.to_vec(),
            reason: "too many elements for this machine".to_owned(),
        })?;
        crate::dequant::dequantize(self.ggml_type, self.bytes, n)
            .map_err(|e| e.in_tensor(self.name))
    }
}

/// An open GGUF file.
pub struct GgufFile {
    storage: Arc<Storage>,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, MetadataValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    /// A summary: the metadata and tensor lists can be long.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and parses `path`. Errors name the file.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, ModelError> {
        let path = path.as_ref();
        let storage = Storage::map(path)?;
        GgufFile::parse(storage).map_err(|e| e.in_file(path))
    }

    /// Parses a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, ModelError> {
        GgufFile::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<GgufFile, ModelError> {
        let header = reader::parse_header(&storage)?;
        Ok(GgufFile {
            version: header.version,
            alignment: header.alignment,
            data_start: header.data_start,
            metadata: header.metadata,
            metadata_index: header.metadata_index,
            tensors: header.tensors,
            tensor_index: header.tensor_index,
            storage: Arc::new(storage),
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of tensor data (`general.alignment`, 32 by default).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the tensor data section.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    pub fn metadata(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All metadata entries, in file order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, &MetadataValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'a MetadataValue) -> Option<T>,
    ) -> Result<T, ModelError> {
        let value = self
            .metadata(key)
            .ok_or_else(|| ModelError::MissingMetadata {
                key: key.to_owned(),
            })?;
        convert(value).ok_or_else(|| ModelError::MetadataType {
            key: key.to_owned(),
            expected,
            found: value.type_description(),
        })
    }

    /// An integer value that fits in `u32`, whatever integer type stores it.
    pub fn get_u32(&self, key: &str) -> Result<u32, ModelError> {
        self.typed(key, "an integer in u32 range", MetadataValue::as_u32)
    }

    /// An integer value that fits in `u64`, whatever integer type stores it.
    pub fn get_u64(&self, key: &str) -> Result<u64, ModelError> {
        self.typed(key, "an integer in u64 range", MetadataValue::as_u64)
    }

    /// An integer value that fits in `i64`, whatever integer type stores it.
    pub fn get_i64(&self, key: &str) -> Result<i64, ModelError> {
        self.typed(key, "an integer in i64 range", MetadataValue::as_i64)
    }

    /// An `f32` (or an `f64` exactly representable as one).
    pub fn get_f32(&self, key: &str) -> Result<f32, ModelError> {
        self.typed(key, "f32", MetadataValue::as_f32)
    }

    pub fn get_bool(&self, key: &str) -> Result<bool, ModelError> {
        self.typed(key, "bool", MetadataValue::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<&str, ModelError> {
        self.typed(key, "string", MetadataValue::as_str)
    }

    pub fn get_array(&self, key: &str) -> Result<&MetadataArray, ModelError> {
        self.typed(key, "array", MetadataValue::as_array)
    }

    pub fn get_str_array(&self, key: &str) -> Result<&[String], ModelError> {
        self.typed(key, "array of string", |v| match v.as_array()? {
            MetadataArray::String(items) => Some(items.as_slice()),
            _ => None,
        })
    }

    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], ModelError> {
        self.typed(key, "array of f32", |v| match v.as_array()? {
            MetadataArray::F32(items) => Some(items.as_slice()),
            _ => None,
        })
    }

    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], ModelError> {
        self.typed(key, "array of i32", |v| match v.as_array()? {
            MetadataArray::I32(items) => Some(items.as_slice()),
            _ => None,
        })
    }

    /// Tensor infos, in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// All tensors with their bytes, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.tensors.iter().map(|info| self.view(info))
    }

    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError> {
        self.info_of(name).map(|info| self.view(info))
    }

    /// The stored bytes of tensor `name`, held with the file's mapping rather than copied.
    pub fn shared_bytes(&self, name: &str) -> Result<SharedBytes, ModelError> {
        let info = self.info_of(name)?;
        Ok(SharedBytes::new(self.storage.clone(), self.range(info)))
    }

    /// Lets the pages of tensor `name` leave resident memory (see [`Storage::release`]):
    /// for a loader that has copied what it needs of them.
    pub fn release(&self, name: &str) {
        if let Ok(info) = self.info_of(name) {
            self.storage.release(self.range(info));
        }
    }

    fn info_of(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_owned(),
            })
    }

    /// Where `info`'s bytes lie in the file.
    fn range(&self, info: &TensorInfo) -> std::ops::Range<usize> {
        // The header parser checked that every tensor lies inside the data section, which lies
        // inside the file, so these offsets are in bounds and fit in `usize`.
        let start = (self.data_start + info.offset) as usize;
        start..start + info.size as usize
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        TensorView {
            name: &info.name,
            dims: &info.dims,
            ggml_type: info.ggml_type,
            bytes: &self.storage[self.range(info)],
        }
    }
}
