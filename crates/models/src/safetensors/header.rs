//! Parsing and validating a safetensors header.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::{Dtype, SafetensorsInfo};
use crate::ModelError;

/// The reference implementation refuses headers above 100 MB; so do we, before reading one.
pub(crate) const MAX_HEADER_BYTES: u64 = 100 << 20;
pub(crate) const METADATA_KEY: &str = "__metadata__";

pub(super) struct Header {
    pub tensors: Vec<SafetensorsInfo>,
    pub metadata: BTreeMap<String, String>,
    /// Absolute file offset of the data section.
    pub data_start: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: [u64; 2],
}

/// The header object, entries in file order, duplicates refused (a plain map would silently
/// keep the last of two entries with one name).
struct RawHeader {
    tensors: Vec<(String, RawTensor)>,
    metadata: Option<BTreeMap<String, String>>,
    first_duplicate: Option<String>,
}

impl<'de> Deserialize<'de> for RawHeader {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RawHeaderVisitor)
    }
}

struct RawHeaderVisitor;

impl<'de> Visitor<'de> for RawHeaderVisitor {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let mut header = RawHeader {
            tensors: Vec::new(),
            metadata: None,
            first_duplicate: None,
        };
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) && header.first_duplicate.is_none() {
                header.first_duplicate = Some(key.clone());
            }
            if key == METADATA_KEY {
                header.metadata = Some(map.next_value()?);
            } else {
                let tensor = map.next_value()?;
                header.tensors.push((key, tensor));
            }
        }
        Ok(header)
    }
}

pub(super) fn parse(bytes: &[u8]) -> Result<Header, ModelError> {
    let file_len = bytes.len() as u64;
    let Some(len_bytes) = bytes.first_chunk::<8>() else {
        return Err(ModelError::Truncated {
            what: "header length".to_owned(),
            offset: 0,
            needed: 8,
            available: file_len,
        });
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    if header_len > MAX_HEADER_BYTES {
        return Err(ModelError::AbsurdCount {
            what: "header length".to_owned(),
            count: header_len,
            limit: MAX_HEADER_BYTES,
        });
    }
    if header_len > file_len - 8 {
        return Err(ModelError::Truncated {
            what: "header".to_owned(),
            offset: 8,
            needed: header_len,
            available: file_len - 8,
        });
    }
    let data_start = 8 + header_len;
    let json = &bytes[8..data_start as usize];
    let mut de = serde_json::Deserializer::from_slice(json);
    let raw: RawHeader =
        serde_path_to_error::deserialize(&mut de).map_err(|e| ModelError::BadHeader {
            reason: match e.path().to_string().as_str() {
                "." => e.into_inner().to_string(),
                path => format!("{path}: {}", e.into_inner()),
            },
        })?;
    // Trailing spaces are the usual padding; anything else after the object is damage.
    de.end().map_err(|e| ModelError::BadHeader {
        reason: e.to_string(),
    })?;
    if let Some(name) = raw.first_duplicate {
        return Err(ModelError::Duplicate {
            kind: "tensor",
            name,
        });
    }
    let data_len = file_len - data_start;
    let tensors = raw
        .tensors
        .into_iter()
        .map(|(name, t)| check_tensor(&name, t, data_len).map_err(|e| e.in_tensor(&name)))
        .collect::<Result<Vec<_>, _>>()?;
    check_overlaps(&tensors)?;
    Ok(Header {
        tensors,
        metadata: raw.metadata.unwrap_or_default(),
        data_start,
    })
}

fn check_tensor(name: &str, raw: RawTensor, data_len: u64) -> Result<SafetensorsInfo, ModelError> {
    let dtype = Dtype::from_name(&raw.dtype).ok_or_else(|| ModelError::Unsupported {
        what: format!("safetensors dtype {:?}", raw.dtype),
    })?;
    let [start, end] = raw.data_offsets;
    if start > end || end > data_len {
        return Err(ModelError::OutOfBounds {
            start,
            end,
            len: data_len,
        });
    }
    let expected = raw
        .shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| ModelError::BadShape {
            dims: raw.shape.clone(),
            reason: "byte size overflows".to_owned(),
        })?;
    if expected != end - start {
        return Err(ModelError::SizeMismatch {
            what: format!("{dtype} data of shape {:?}", raw.shape),
            expected,
            actual: end - start,
        });
    }
    Ok(SafetensorsInfo {
        name: name.to_owned(),
        dtype,
        shape: raw.shape,
        start,
        end,
    })
}

fn check_overlaps(tensors: &[SafetensorsInfo]) -> Result<(), ModelError> {
    let mut by_start: Vec<&SafetensorsInfo> = tensors.iter().filter(|t| t.end > t.start).collect();
    by_start.sort_by_key(|t| t.start);
    for pair in by_start.windows(2) {
        if pair[0].end > pair[1].start {
            return Err(ModelError::Overlap {
                start: pair[1].start,
                end: pair[1].end,
                other: pair[0].name.clone(),
            }
            .in_tensor(&pair[1].name));
        }
    }
    Ok(())
}
