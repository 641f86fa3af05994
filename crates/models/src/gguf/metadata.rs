//! GGUF metadata values: the thirteen value types, their parsing and lossless conversions.

use super::cursor::{capacity_for, Cursor};
use crate::ModelError;

/// Arrays of arrays are legal GGUF; deeper nesting than this is only ever an attack on the stack.
const MAX_ARRAY_DEPTH: u32 = 8;

/// The type id stored before every metadata value (and before an array's elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    const ALL: [ValueType; 13] = [
        ValueType::U8,
        ValueType::I8,
        ValueType::U16,
        ValueType::I16,
        ValueType::U32,
        ValueType::I32,
        ValueType::F32,
        ValueType::Bool,
        ValueType::String,
        ValueType::Array,
        ValueType::U64,
        ValueType::I64,
        ValueType::F64,
    ];

    pub fn from_id(id: u32) -> Option<ValueType> {
        Self::ALL.into_iter().find(|t| *t as u32 == id)
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// The fewest bytes a value of this type occupies in a file (a string's length prefix, an
    /// array's element type and count). Used to refuse counts the file cannot hold.
    fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetadataArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array, stored by element type: a vocabulary of 150 000 tokens is a `Vec<String>`,
/// and its scores a `Vec<f32>` that can be borrowed as a slice.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetadataArray>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl MetadataValue {
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(_) => ValueType::Array,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F64(_) => ValueType::F64,
        }
    }

    /// A description for error messages: `u32`, `array of string`.
    pub fn type_description(&self) -> String {
        match self {
            MetadataValue::Array(array) => format!("array of {}", array.elem_type().name()),
            other => other.value_type().name().to_owned(),
        }
    }

    /// Any integer value, widened. The converters below narrow it losslessly, so that a `u32`
    /// field that some converter wrote as `u64` or `i32` still reads.
    fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The value as `u32` if it is an integer in range.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_integer().and_then(|v| u32::try_from(v).ok())
    }

    /// The value as `u64` if it is an integer in range.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_integer().and_then(|v| u64::try_from(v).ok())
    }

    /// The value as `i64` if it is an integer in range.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_integer().and_then(|v| i64::try_from(v).ok())
    }

    /// An `f32`, or an `f64` that converts to `f32` exactly.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetadataValue::F32(v) => Some(v),
            MetadataValue::F64(v) if f64::from(v as f32) == v => Some(v as f32),
            _ => None,
        }
    }

    /// An `f64` or `f32`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetadataValue::F32(v) => Some(v.into()),
            MetadataValue::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&MetadataArray> {
        match self {
            MetadataValue::Array(v) => Some(v),
            _ => None,
        }
    }

    /// Appends the GGUF encoding of the value (without its type id) to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            MetadataValue::U8(v) => out.push(*v),
            MetadataValue::I8(v) => out.extend(v.to_le_bytes()),
            MetadataValue::U16(v) => out.extend(v.to_le_bytes()),
            MetadataValue::I16(v) => out.extend(v.to_le_bytes()),
            MetadataValue::U32(v) => out.extend(v.to_le_bytes()),
            MetadataValue::I32(v) => out.extend(v.to_le_bytes()),
            MetadataValue::F32(v) => out.extend(v.to_le_bytes()),
            MetadataValue::Bool(v) => out.push(u8::from(*v)),
            MetadataValue::String(v) => encode_string(v, out),
            MetadataValue::Array(v) => v.encode(out),
            MetadataValue::U64(v) => out.extend(v.to_le_bytes()),
            MetadataValue::I64(v) => out.extend(v.to_le_bytes()),
            MetadataValue::F64(v) => out.extend(v.to_le_bytes()),
        }
    }
}

/// Appends the little-endian bytes of every element.
fn encode_all<T, const N: usize>(items: &[T], out: &mut Vec<u8>, to_le: impl Fn(&T) -> [u8; N]) {
    for item in items {
        out.extend(to_le(item));
    }
}

impl MetadataArray {
    pub fn elem_type(&self) -> ValueType {
        match self {
            MetadataArray::U8(_) => ValueType::U8,
            MetadataArray::I8(_) => ValueType::I8,
            MetadataArray::U16(_) => ValueType::U16,
            MetadataArray::I16(_) => ValueType::I16,
            MetadataArray::U32(_) => ValueType::U32,
            MetadataArray::I32(_) => ValueType::I32,
            MetadataArray::F32(_) => ValueType::F32,
            MetadataArray::Bool(_) => ValueType::Bool,
            MetadataArray::String(_) => ValueType::String,
            MetadataArray::Array(_) => ValueType::Array,
            MetadataArray::U64(_) => ValueType::U64,
            MetadataArray::I64(_) => ValueType::I64,
            MetadataArray::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            MetadataArray::U8(v) => v.len(),
            MetadataArray::I8(v) => v.len(),
            MetadataArray::U16(v) => v.len(),
            MetadataArray::I16(v) => v.len(),
            MetadataArray::U32(v) => v.len(),
            MetadataArray::I32(v) => v.len(),
            MetadataArray::F32(v) => v.len(),
            MetadataArray::Bool(v) => v.len(),
            MetadataArray::String(v) => v.len(),
            MetadataArray::Array(v) => v.len(),
            MetadataArray::U64(v) => v.len(),
            MetadataArray::I64(v) => v.len(),
            MetadataArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends element type, count and elements.
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend(self.elem_type().id().to_le_bytes());
        out.extend((self.len() as u64).to_le_bytes());
        match self {
            MetadataArray::U8(v) => out.extend(v),
            MetadataArray::I8(v) => encode_all(v, out, |x| x.to_le_bytes()),
            MetadataArray::U16(v) => encode_all(v, out, |x| x.to_le_bytes()),
            MetadataArray::I16(v) => encode_all(v, out, |x| x.to_le_bytes()),
            MetadataArray::U32(v) => encode_all(v, out, |x| x.to_le_bytes()),
            MetadataArray::I32(v) => encode_all(v, out, |x| x.to_le_bytes()),
            MetadataArray::F32(v) => encode_all(v, out, |x| x.to_le_bytes()),
            MetadataArray::Bool(v) => encode_all(v, out, |x| [u8::from(*x)]),
            MetadataArray::String(v) => v.iter().for_each(|s| encode_string(s, out)),
            MetadataArray::Array(v) => v.iter().for_each(|a| a.encode(out)),
            MetadataArray::U64(v) => encode_all(v, out, |x| x.to_le_bytes()),
            MetadataArray::I64(v) => encode_all(v, out, |x| x.to_le_bytes()),
            MetadataArray::F64(v) => encode_all(v, out, |x| x.to_le_bytes()),
        }
    }
}

pub(crate) fn encode_string(s: &str, out: &mut Vec<u8>) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// Reads one key/value pair.
pub(crate) fn read_entry(
    cur: &mut Cursor<'_>,
    index: u64,
) -> Result<(String, MetadataValue), ModelError> {
    let key = cur.string(|| format!("metadata key {index}"))?;
    let what = || format!("metadata {key} value type");
    let type_id = cur.u32(what)?;
    let ty = ValueType::from_id(type_id).ok_or_else(|| ModelError::UnknownValueType {
        key: key.clone(),
        type_id,
    })?;
    let value = read_value(cur, &key, ty, 0)?;
    Ok((key, value))
}

fn read_value(
    cur: &mut Cursor<'_>,
    key: &str,
    ty: ValueType,
    depth: u32,
) -> Result<MetadataValue, ModelError> {
    let what = || format!("metadata {key} value");
    Ok(match ty {
        ValueType::U8 => MetadataValue::U8(cur.u8(what)?),
        ValueType::I8 => MetadataValue::I8(cur.u8(what)? as i8),
        ValueType::U16 => MetadataValue::U16(cur.u16(what)?),
        ValueType::I16 => MetadataValue::I16(cur.u16(what)? as i16),
        ValueType::U32 => MetadataValue::U32(cur.u32(what)?),
        ValueType::I32 => MetadataValue::I32(cur.u32(what)? as i32),
        ValueType::F32 => MetadataValue::F32(f32::from_bits(cur.u32(what)?)),
        ValueType::U64 => MetadataValue::U64(cur.u64(what)?),
        ValueType::I64 => MetadataValue::I64(cur.u64(what)? as i64),
        ValueType::F64 => MetadataValue::F64(f64::from_bits(cur.u64(what)?)),
        ValueType::Bool => MetadataValue::Bool(read_bool(cur, key)?),
        ValueType::String => MetadataValue::String(cur.string(what)?),
        ValueType::Array => MetadataValue::Array(read_array(cur, key, depth)?),
    })
}

fn read_bool(cur: &mut Cursor<'_>, key: &str) -> Result<bool, ModelError> {
    match cur.u8(|| format!("metadata {key} value"))? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(ModelError::BadMetadata {
            key: key.to_owned(),
            reason: format!("bool byte is {other}, not 0 or 1"),
        }),
    }
}

/// Reads an array's element type, count and elements; `depth` counts the arrays around it.
fn read_array(cur: &mut Cursor<'_>, key: &str, depth: u32) -> Result<MetadataArray, ModelError> {
    if depth >= MAX_ARRAY_DEPTH {
        return Err(ModelError::BadMetadata {
            key: key.to_owned(),
            reason: format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"),
        });
    }
    let type_id = cur.u32(|| format!("metadata {key} array element type"))?;
    let elem = ValueType::from_id(type_id).ok_or_else(|| ModelError::UnknownValueType {
        key: key.to_owned(),
        type_id,
    })?;
    let count = cur.count(elem.min_encoded_size(), || {
        format!("metadata {key} array length")
    })?;
    let what = || format!("metadata {key} array element");
    Ok(match elem {
        ValueType::U8 => MetadataArray::U8(cur.take(count, what)?.to_vec()),
        ValueType::I8 => MetadataArray::I8(read_n(count, || Ok(cur.u8(what)? as i8))?),
        ValueType::U16 => MetadataArray::U16(read_n(count, || cur.u16(what))?),
        ValueType::I16 => MetadataArray::I16(read_n(count, || Ok(cur.u16(what)? as i16))?),
        ValueType::U32 => MetadataArray::U32(read_n(count, || cur.u32(what))?),
        ValueType::I32 => MetadataArray::I32(read_n(count, || Ok(cur.u32(what)? as i32))?),
        ValueType::F32 => MetadataArray::F32(read_n(count, || Ok(f32::from_bits(cur.u32(what)?)))?),
        ValueType::U64 => MetadataArray::U64(read_n(count, || cur.u64(what))?),
        ValueType::I64 => MetadataArray::I64(read_n(count, || Ok(cur.u64(what)? as i64))?),
        ValueType::F64 => MetadataArray::F64(read_n(count, || Ok(f64::from_bits(cur.u64(what)?)))?),
        ValueType::Bool => MetadataArray::Bool(read_n(count, || read_bool(cur, key))?),
        ValueType::String => MetadataArray::String(read_n(count, || cur.string(what))?),
        ValueType::Array => {
            MetadataArray::Array(read_n(count, || read_array(cur, key, depth + 1))?)
        }
    })
}

/// Collects `count` items (a count the caller has checked against the remaining bytes).
fn read_n<T>(
    count: u64,
    mut read: impl FnMut() -> Result<T, ModelError>,
) -> Result<Vec<T>, ModelError> {
    let mut items = Vec::with_capacity(capacity_for(count));
    for _ in 0..count {
        items.push(read()?);
    }
    Ok(items)
}
