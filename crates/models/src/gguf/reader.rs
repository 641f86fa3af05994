//! Parsing and validating the GGUF header: magic, version, metadata, tensor infos, and the
//! layout of the tensor data that follows them.
//!
//! Layout (all little-endian): `"GGUF"`, u32 version, u64 tensor count, u64 metadata count,
//! the metadata key/value pairs, the tensor infos (name, u32 n_dims, u64 dims[n_dims],
//! u32 ggml type, u64 offset), padding to `general.alignment` (default 32), then the data.
//! Tensor offsets are relative to the start of the data and multiples of the alignment.
//! Version 1 used u32 counts and is refused; versions 2 and 3 share this layout (3 added the
//! big-endian variant, which is refused too).

use std::collections::HashMap;

use super::cursor::{capacity_for, Cursor};
use super::metadata::{read_entry, MetadataValue};
use super::TensorInfo;
use crate::{GgmlType, ModelError};

pub(crate) const MAGIC: &[u8; 4] = b"GGUF";
pub(crate) const DEFAULT_ALIGNMENT: u64 = 32;
pub(crate) const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml tensors have at most four dimensions.
pub(crate) const MAX_DIMS: u32 = 4;

/// Smallest encodings, used to refuse counts the file cannot hold before allocating for them:
/// a tensor info is a name length, n_dims, type and offset; a metadata entry is a key length,
/// a value type and a one-byte value.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
const MIN_METADATA_ENTRY_BYTES: u64 = 8 + 4 + 1;

pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, MetadataValue)>,
    /// Key to position in `metadata`.
    pub metadata_index: HashMap<String, usize>,
    pub alignment: u64,
    pub tensors: Vec<TensorInfo>,
    /// Name to position in `tensors`.
    pub tensor_index: HashMap<String, usize>,
    /// Absolute file offset where tensor data starts.
    pub data_start: u64,
}

pub(crate) fn parse_header(bytes: &[u8]) -> Result<Header, ModelError> {
    let mut cur = Cursor::new(bytes);
    let magic = cur.take(4, || "magic".to_owned())?;
    if magic != MAGIC {
        return Err(ModelError::BadMagic {
            format: "GGUF",
            found: magic.to_vec(),
        });
    }
    let version = cur.u32(|| "version".to_owned())?;
    if version != 2 && version != 3 {
        if matches!(version.swap_bytes(), 2 | 3) {
            return Err(ModelError::Unsupported {
                what: "big-endian GGUF".to_owned(),
            });
        }
        return Err(ModelError::UnsupportedVersion {
            format: "GGUF",
            version,
            supported: "2, 3",
        });
    }
    let tensor_count = cur.count(MIN_TENSOR_INFO_BYTES, || "tensor count".to_owned())?;
    let metadata_count = cur.count(MIN_METADATA_ENTRY_BYTES, || "metadata count".to_owned())?;

    let (metadata, metadata_index) = read_metadata(&mut cur, metadata_count)?;
    let alignment = alignment(&metadata)?;
    let mut tensors = Vec::with_capacity(capacity_for(tensor_count));
    let mut tensor_index = HashMap::with_capacity(capacity_for(tensor_count));
    for index in 0..tensor_count {
        let info = read_tensor_info(&mut cur, index)?;
        if tensor_index
            .insert(info.name.clone(), tensors.len())
            .is_some()
        {
            return Err(ModelError::Duplicate {
                kind: "tensor",
                name: info.name,
            });
        }
        tensors.push(info);
    }

    let data_start = cur
        .position()
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| ModelError::BadHeader {
            reason: "data start overflows".to_owned(),
        })?;
    let data_len = (bytes.len() as u64).saturating_sub(data_start);
    check_data_layout(&tensors, alignment, data_len)?;
    Ok(Header {
        version,
        metadata,
        metadata_index,
        alignment,
        tensors,
        tensor_index,
        data_start,
    })
}

/// Metadata entries in file order, and each key's position among them.
type MetadataTable = (Vec<(String, MetadataValue)>, HashMap<String, usize>);

fn read_metadata(cur: &mut Cursor<'_>, count: u64) -> Result<MetadataTable, ModelError> {
    let mut entries = Vec::with_capacity(capacity_for(count));
    let mut index = HashMap::with_capacity(capacity_for(count));
    for i in 0..count {
        let (key, value) = read_entry(cur, i)?;
        if index.insert(key.clone(), entries.len()).is_some() {
            return Err(ModelError::Duplicate {
                kind: "metadata key",
                name: key,
            });
        }
        entries.push((key, value));
    }
    Ok((entries, index))
}

/// `general.alignment` if present: the spec makes it a u32; it must be a power of two.
fn alignment(metadata: &[(String, MetadataValue)]) -> Result<u64, ModelError> {
    let Some((_, value)) = metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match value {
        MetadataValue::U32(a) if a.is_power_of_two() => Ok(u64::from(*a)),
        other => Err(ModelError::BadMetadata {
            key: ALIGNMENT_KEY.to_owned(),
            reason: format!(
                "must be a u32 power of two, found {} {other:?}",
                other.type_description()
            ),
        }),
    }
}

fn read_tensor_info(cur: &mut Cursor<'_>, index: u64) -> Result<TensorInfo, ModelError> {
    let name = cur.string(|| format!("tensor info {index} name"))?;
    read_tensor_fields(cur, name.clone()).map_err(|e| e.in_tensor(&name))
}

fn read_tensor_fields(cur: &mut Cursor<'_>, name: String) -> Result<TensorInfo, ModelError> {
    let n_dims = cur.u32(|| "n_dims".to_owned())?;
    if n_dims > MAX_DIMS {
        return Err(ModelError::AbsurdCount {
            what: "dimension count".to_owned(),
            count: n_dims.into(),
            limit: MAX_DIMS.into(),
        });
    }
    let dims = (0..n_dims)
        .map(|i| cur.u64(|| format!("dimension {i}")))
        .collect::<Result<Vec<u64>, _>>()?;
    let ggml_type = GgmlType::from_id(cur.u32(|| "type".to_owned())?)?;
    let offset = cur.u64(|| "data offset".to_owned())?;
    let size = tensor_size(&dims, ggml_type)?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        size,
    })
}

/// Bytes taken by a tensor of `dims` (ggml order: `dims[0]` is the row length) and `ggml_type`.
pub(crate) fn tensor_size(dims: &[u64], ggml_type: GgmlType) -> Result<u64, ModelError> {
    let bad = |reason: String| ModelError::BadShape {
        dims: dims.to_vec(),
        reason,
    };
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad("element count overflows".to_owned()))?;
    let row = dims.first().copied().unwrap_or(1);
    if row % ggml_type.block_size() != 0 {
        return Err(bad(format!(
            "row of {row} elements is not a whole number of {ggml_type} blocks ({})",
            ggml_type.block_size()
        )));
    }
    ggml_type
        .bytes_for(n_elements)
        .ok_or_else(|| bad("byte size overflows".to_owned()))
}

/// Every tensor must start on the alignment, end inside the data, and not overlap another.
fn check_data_layout(
    tensors: &[TensorInfo],
    alignment: u64,
    data_len: u64,
) -> Result<(), ModelError> {
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    let mut previous: Option<&TensorInfo> = None;
    for t in by_offset {
        let err = |e: ModelError| e.in_tensor(&t.name);
        if t.offset % alignment != 0 {
            return Err(err(ModelError::Misaligned {
                offset: t.offset,
                alignment,
            }));
        }
        let end = t.offset.checked_add(t.size).filter(|&end| end <= data_len);
        let Some(end) = end else {
            return Err(err(ModelError::OutOfBounds {
                start: t.offset,
                end: t.offset.saturating_add(t.size),
                len: data_len,
            }));
        };
        if t.size == 0 {
            continue;
        }
        // Sorted by offset and overlap-free so far, the last non-empty tensor ends last.
        if let Some(p) = previous.filter(|p| p.offset + p.size > t.offset) {
            return Err(err(ModelError::Overlap {
                start: t.offset,
                end,
                other: p.name.clone(),
            }));
        }
        previous = Some(t);
    }
    Ok(())
}
