//! One rank's share of a model: the config of the narrower model it runs and its tensors,
//! cut from the checkpoint's as stored (never dequantized).
//!
//! Rank `r` of `N` holds heads `r·H/N ..` of q (and the matching kv heads of k and v,
//! with their biases), rows `r·F/N ..` of the gate and up matrices, the same columns of
//! the output and down projections, and rows `r·V/N ..` of the token embedding and the
//! LM head. Norm weights, per-head q/k norms and RoPE factors are whole on every rank.
//! A share of rows is a contiguous run of the stored bytes; a share of columns is a run
//! of whole ggml blocks in each row, copied once when the shard is made.

use std::collections::HashMap;

use quench_models::arch::{
    ArchError, DecoderLayerTensor as L, DecoderTensor, ModelConfig, Naming, RawTensor, TensorSource,
};

use crate::gpu::catalog::tensor_name;
use crate::gpu::error::GpuError;
use crate::gpu::stored::{StoredTensor, StoredTensors};

/// How a tensor is divided between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// A share of its rows (the outermost dimension).
    Rows,
    /// A share of every row's columns.
    Columns,
}

/// Refuses a degree the model does not divide by, naming what does not divide.
pub(crate) fn check_degree(config: &ModelConfig, ranks: usize) -> Result<(), GpuError> {
    let refuse = |reason: String| GpuError::Unsupported {
        what: format!("tensor parallelism over {ranks} ranks"),
        reason,
    };
    if ranks == 0 {
        return Err(refuse("the degree must be at least 1".into()));
    }
    for (what, n) in [
        ("attention heads", config.heads),
        ("kv heads", config.kv_heads),
        ("FFN width", config.ffn),
        ("vocabulary", config.vocab),
    ] {
        if !n.is_multiple_of(ranks) {
            return Err(refuse(format!(
                "the model's {what} ({n}) do not divide by {ranks}"
            )));
        }
    }
    Ok(())
}

/// The narrower model rank `r` of `ranks` runs ([`check_degree`] first).
pub(crate) fn share_config(config: &ModelConfig, ranks: usize) -> ModelConfig {
    ModelConfig {
        heads: config.heads / ranks,
        kv_heads: config.kv_heads / ranks,
        ffn: config.ffn / ranks,
        vocab: config.vocab / ranks,
        ..config.clone()
    }
}

/// Rank `rank`'s tensors, cut from `src`.
pub(crate) struct Shard<'a> {
    src: &'a dyn StoredTensors,
    rank: usize,
    ranks: usize,
    cuts: HashMap<String, Cut>,
    /// The column shares, copied from the checkpoint.
    columns: HashMap<String, Vec<u8>>,
}

impl<'a> Shard<'a> {
    /// Rank `rank` of `ranks` of the model `config` (whole) describes, its tensors named
    /// by `naming`.
    pub fn new(
        src: &'a dyn StoredTensors,
        config: &ModelConfig,
        naming: Naming,
        rank: usize,
        ranks: usize,
    ) -> Result<Shard<'a>, GpuError> {
        let mut cuts = HashMap::new();
        let mut cut = |t: DecoderTensor, c: Cut| cuts.insert(tensor_name(t, naming), c);
        cut(DecoderTensor::TokenEmbedding, Cut::Rows);
        cut(DecoderTensor::Output, Cut::Rows);
        for l in 0..config.layers {
            for t in [
                L::Q,
                L::K,
                L::V,
                L::QBias,
                L::KBias,
                L::VBias,
                L::Gate,
                L::Up,
            ] {
                cut(DecoderTensor::Layer(l, t), Cut::Rows);
            }
            for t in [L::AttnOutput, L::Down] {
                cut(DecoderTensor::Layer(l, t), Cut::Columns);
            }
        }
        let mut shard = Shard {
            src,
            rank,
            ranks,
            cuts,
            columns: HashMap::new(),
        };
        let column_cut: Vec<String> = shard
            .cuts
            .iter()
            .filter(|&(_, &c)| c == Cut::Columns)
            .map(|(name, _)| name.clone())
            .collect();
        for name in column_cut {
            let bytes = shard.columns_of(&name)?;
            shard.columns.insert(name, bytes);
        }
        Ok(shard)
    }

    /// The rank's share of every row of matrix `name`: whole ggml blocks.
    fn columns_of(&self, name: &str) -> Result<Vec<u8>, GpuError> {
        let t = self.src.stored(name)?;
        let [rows, cols] = t.dims[..] else {
            return Err(GpuError::Shape {
                tensor: name.to_owned(),
                expected: vec![0, 0],
                found: t.dims.clone(),
            });
        };
        let share = cols / self.ranks;
        let block = t.ggml_type.block_size() as usize;
        if !share.is_multiple_of(block) {
            return Err(GpuError::Unsupported {
                what: format!("tensor parallelism over {} ranks", self.ranks),
                reason: format!(
                    "{name} ({}) would be cut inside its blocks of {block}: each rank's {share} \
                     of its {cols} columns",
                    t.ggml_type.name()
                ),
            });
        }
        let row_bytes = t.bytes.len() / rows.max(1);
        let share_bytes = row_bytes / self.ranks;
        let start = self.rank * share_bytes;
        Ok(t.bytes
            .chunks_exact(row_bytes)
            .flat_map(|row| &row[start..start + share_bytes])
            .copied()
            .collect())
    }

    /// The share `[start, start + len)` of `n` units this rank holds.
    fn share(&self, n: usize) -> (usize, usize) {
        let len = n / self.ranks;
        (self.rank * len, len)
    }
}

impl TensorSource for Shard<'_> {
    /// The rank's share of a vector (a bias); anything else whole.
    fn get(&self, name: &str) -> quench_models::arch::Result<(Vec<usize>, Vec<f32>)> {
        let (dims, data) = self.src.get(name)?;
        match (self.cuts.get(name), &dims[..]) {
            (Some(Cut::Rows), &[n]) => {
                let (start, len) = self.share(n);
                Ok((vec![len], data[start..start + len].to_vec()))
            }
            (Some(_), _) => Err(ArchError::Tensor {
                name: name.to_owned(),
                source: "a matrix cut between tensor-parallel ranks is read as stored".into(),
            }),
            (None, _) => Ok((dims, data)),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.src.contains(name)
    }

    fn raw(&self, name: &str) -> quench_models::arch::Result<Option<RawTensor<'_>>> {
        if !self.cuts.contains_key(name) {
            return self.src.raw(name);
        }
        let stored = self.stored(name).map_err(|e| ArchError::Tensor {
            name: name.to_owned(),
            source: e.to_string().into(),
        })?;
        Ok(Some(RawTensor {
            ggml_type: stored.ggml_type,
            dims: stored.dims,
            bytes: stored.bytes,
        }))
    }
}

impl StoredTensors for Shard<'_> {
    fn stored(&self, name: &str) -> Result<StoredTensor<'_>, GpuError> {
        let t = self.src.stored(name)?;
        match self.cuts.get(name) {
            None => Ok(t),
            Some(Cut::Rows) => {
                let rows = t.dims.first().copied().unwrap_or(0);
                let (start, len) = self.share(rows);
                let row_bytes = t.bytes.len() / rows.max(1);
                let mut dims = t.dims;
                dims[0] = len;
                Ok(StoredTensor {
                    ggml_type: t.ggml_type,
                    dims,
                    bytes: &t.bytes[start * row_bytes..(start + len) * row_bytes],
                })
            }
            Some(Cut::Columns) => {
                let bytes = self
                    .columns
                    .get(name)
                    .ok_or_else(|| GpuError::Internal(format!("{name}'s columns were not cut")))?;
                let mut dims = t.dims;
                if let Some(cols) = dims.last_mut() {
                    *cols /= self.ranks;
                }
                Ok(StoredTensor {
                    ggml_type: t.ggml_type,
                    dims,
                    bytes,
                })
            }
        }
    }
}
