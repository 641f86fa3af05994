//! Safetensors: a u64 little-endian header length, a JSON header mapping tensor names to
//! `{dtype, shape, data_offsets: [begin, end]}` (offsets relative to the end of the header)
//! plus an optional `__metadata__` string map, then the raw little-endian tensor data.
//!
//! Every dtype of the format is parsed so that the layout of the whole file can be checked
//! (BERT checkpoints carry an I64 `position_ids` buffer, for one), but only F32, F16 and BF16
//! tensors can be viewed; others are refused by name when asked for.

mod header;
mod writer;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

pub use writer::SafetensorsWriter;

use crate::dequant::{bf16_to_f32, f16_to_f32};
use crate::storage::Storage;
use crate::ModelError;

/// A safetensors element type.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    BOOL,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
}

impl Dtype {
    const ALL: [Dtype; 15] = [
        Dtype::BOOL,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// The name the header uses.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::BOOL => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8_E5M2 => "F8_E5M2",
            Dtype::F8_E4M3 => "F8_E4M3",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    pub fn from_name(name: &str) -> Option<Dtype> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    pub fn size(self) -> u64 {
        match self {
            Dtype::BOOL | Dtype::U8 | Dtype::I8 | Dtype::F8_E5M2 | Dtype::F8_E4M3 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// Whether tensors of this dtype can be viewed and converted (F32, F16, BF16).
    pub fn is_supported(self) -> bool {
        matches!(self, Dtype::F32 | Dtype::F16 | Dtype::BF16)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where one tensor lives in a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafetensorsInfo {
    pub name: String,
    pub dtype: Dtype,
    /// Row-major (PyTorch) order: the last dimension is contiguous.
    pub shape: Vec<u64>,
    /// Byte range relative to the start of the data section.
    pub start: u64,
    pub end: u64,
}

/// A tensor of a supported dtype, its bytes borrowed from the mapped file. The bytes are not
/// necessarily aligned for their element type; use [`SafetensorsView::to_f32`].
#[derive(Clone, Copy, Debug)]
pub struct SafetensorsView<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [u64],
    pub bytes: &'a [u8],
}

impl SafetensorsView<'_> {
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The elements as f32 (exact: every F16 and BF16 value is an f32).
    pub fn to_f32(&self) -> Vec<f32> {
        match self.dtype {
            Dtype::F16 => convert(self.bytes, |b: [u8; 2]| f16_to_f32(u16::from_le_bytes(b))),
            Dtype::BF16 => convert(self.bytes, |b: [u8; 2]| bf16_to_f32(u16::from_le_bytes(b))),
            // Views exist only for supported dtypes, so this is F32.
            _ => convert(self.bytes, f32::from_le_bytes),
        }
    }
}

fn convert<const B: usize>(bytes: &[u8], f: impl Fn([u8; B]) -> f32) -> Vec<f32> {
    bytes.as_chunks::<B>().0.iter().map(|&b| f(b)).collect()
}

/// An open safetensors file.
pub struct SafetensorsFile {
    storage: Storage,
    data_start: u64,
    tensors: Vec<SafetensorsInfo>,
    index: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
}

impl std::fmt::Debug for SafetensorsFile {
    /// A summary: the tensor list can be long.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("tensors", &self.tensors.len())
            .field("metadata", &self.metadata)
            .finish()
    }
}

impl SafetensorsFile {
    /// Maps and parses `path`. Errors name the file.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile, ModelError> {
        let path = path.as_ref();
        let storage = Storage::map(path)?;
        SafetensorsFile::parse(storage).map_err(|e| e.in_file(path))
    }

    /// Parses a safetensors image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<SafetensorsFile, ModelError> {
        SafetensorsFile::parse(Storage::Owned(bytes))
    }

    fn parse(storage: Storage) -> Result<SafetensorsFile, ModelError> {
        let header = header::parse(&storage)?;
        let index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(SafetensorsFile {
            data_start: header.data_start,
            tensors: header.tensors,
            metadata: header.metadata,
            index,
            storage,
        })
    }

    /// The `__metadata__` map (empty when absent).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// All tensors, whatever their dtype, in header order.
    pub fn tensor_infos(&self) -> &[SafetensorsInfo] {
        &self.tensors
    }

    pub fn info(&self, name: &str) -> Option<&SafetensorsInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes; refused by name if its dtype is not F32, F16 or BF16.
    pub fn tensor(&self, name: &str) -> Result<SafetensorsView<'_>, ModelError> {
        let info = self.info(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_owned(),
        })?;
        if !info.dtype.is_supported() {
            return Err(ModelError::Unsupported {
                what: format!(
                    "safetensors dtype {} (supported: F32, F16, BF16)",
                    info.dtype
                ),
            }
            .in_tensor(name));
        }
        // The header parser checked that the range lies inside the file.
        let start = (self.data_start + info.start) as usize;
        let end = (self.data_start + info.end) as usize;
        Ok(SafetensorsView {
            name: &info.name,
            dtype: info.dtype,
            shape: &info.shape,
            bytes: &self.storage[start..end],
        })
    }
}
