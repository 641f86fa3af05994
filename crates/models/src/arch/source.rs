//! Where weights come from: anything that can hand out a named tensor as f32.

use std::collections::HashMap;

use crate::{GgmlType, SharedBytes};

use super::error::{ArchError, Result};

/// A tensor as its checkpoint stores it: ggml type, shape (outermost first) and bytes.
pub struct RawTensor<'a> {
    pub ggml_type: GgmlType,
    pub dims: Vec<usize>,
    pub bytes: &'a [u8],
}

/// A checkpoint seen as named f32 tensors.
///
/// Shapes are listed outermost first, as PyTorch writes them: a linear layer's weight is
/// `[out_features, in_features]` and its data is row-major. (GGUF lists dimensions innermost
/// first; its adapter reverses them.)
pub trait TensorSource {
    /// The tensor's shape and its elements, dequantized to f32.
    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)>;

    /// Whether the checkpoint has a tensor of that name (for optional tensors).
    fn contains(&self, name: &str) -> bool;

    /// The tensor's stored bytes, where the checkpoint keeps it in a ggml type (GGUF files);
    /// `None` for sources that only hand out f32.
    fn raw(&self, name: &str) -> Result<Option<RawTensor<'_>>> {
        let _ = name;
        Ok(None)
    }

    /// The tensor's stored bytes as [`Self::raw`] gives them, held without a copy where the
    /// source can share them (a memory-mapped GGUF file); `None` where it cannot.
    fn shared(&self, name: &str) -> Result<Option<SharedBytes>> {
        let _ = name;
        Ok(None)
    }

    /// A hint from a loader that has copied what it needs of tensor `name`: its stored
    /// bytes may leave resident memory. Sources that hold nothing releasable ignore it.
    fn release(&self, name: &str) {
        let _ = name;
    }
}

/// Tensors held in memory: for building models in code and for tests.
#[derive(Clone, Debug, Default)]
pub struct MemorySource {
    tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

impl MemorySource {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a tensor; fails when `data` does not fill `dims` exactly.
    pub fn insert(&mut self, name: &str, dims: Vec<usize>, data: Vec<f32>) -> Result<()> {
        let count: usize = dims.iter().product();
        if count != data.len() {
            return Err(ArchError::Shape {
                name: name.to_owned(),
                expected: dims,
                found: vec![data.len()],
            });
        }
        self.tensors.insert(name.to_owned(), (dims, data));
        Ok(())
    }

    pub fn remove(&mut self, name: &str) -> Option<(Vec<usize>, Vec<f32>)> {
        self.tensors.remove(name)
    }

    /// Elements of every tensor held.
    pub fn parameters(&self) -> u64 {
        self.tensors
            .values()
            .map(|(_, data)| data.len() as u64)
            .sum()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
}

impl TensorSource for MemorySource {
    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        self.tensors
            .get(name)
            .cloned()
            .ok_or_else(|| ArchError::MissingTensor {
                name: name.to_owned(),
            })
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}
