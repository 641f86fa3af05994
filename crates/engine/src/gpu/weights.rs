//! The model's weights on the device, by what they are: every weight group of the decode
//! step and the prompt path, gathered once from the checkpoint and uploaded once, back to
//! back in this order. A program finds a layer's matrices as
//! `weights.layers[l].attn_output`, never by looking through another program's plan.

use quench_kernels::rope;
use quench_models::arch::{
    rope_frequencies, DecoderLayerTensor as L, DecoderTensor, ModelConfig, Naming,
};

use super::catalog::{tensor_name, Catalog};
use super::error::GpuError;
use super::plan::{at, Operand, Region};
use super::stored::{self, StoredTensors};

/// What a weight is uploaded from.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum WeightData {
    /// A tensor's stored bytes, as they are.
    Stored(String),
    /// A tensor in a type no kernel reads, expanded to f16 on the host
    /// ([`stored::widened_f16`]).
    Widened(String),
    /// Values computed or widened on the host (norm weights, biases, RoPE tables).
    Floats(Vec<f32>),
}

/// Weights uploaded back to back (q, k and v rows of one layer form one matrix).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WeightGroup {
    /// Each part with its byte length.
    pub parts: Vec<(WeightData, u64)>,
}

impl WeightGroup {
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|(_, b)| b).sum()
    }

    /// Byte offset of part `i`.
    fn offset(&self, i: usize) -> u64 {
        self.parts[..i].iter().map(|(_, b)| b).sum()
    }
}

/// One layer's weight groups (indices into [`ModelWeights::groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LayerWeights {
    /// The attention norm's weights, then the FFN norm's (f32).
    pub norms: usize,
    /// q, k and v rows, in that order, as stored.
    pub qkv: usize,
    /// q, k and v biases (f32; qwen2).
    pub qkv_bias: Option<usize>,
    /// The per-head q and k norms' weights (f32; qwen3).
    pub qk_norm: Option<usize>,
    pub attn_output: usize,
    /// Gate rows, then up rows.
    pub gate_up: usize,
    pub down: usize,
}

/// Every weight group of the model, in upload order, with what each one is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ModelWeights {
    pub groups: Vec<WeightGroup>,
    /// RoPE's cos, then sin table, over the whole context (f32).
    pub rope: usize,
    pub embedding: usize,
    pub layers: Vec<LayerWeights>,
    pub output_norm: usize,
    /// The LM head: the embedding table where the model ties them.
    pub head: usize,
}

/// Gathers the groups, naming the tensors by `naming`.
struct Gather<'a> {
    src: &'a dyn StoredTensors,
    /// Which tensors are widened to f16.
    catalog: &'a Catalog,
    naming: Naming,
    groups: Vec<WeightGroup>,
}

impl Gather<'_> {
    fn group(&mut self, parts: Vec<(WeightData, u64)>) -> usize {
        self.groups.push(WeightGroup { parts });
        self.groups.len() - 1
    }

    /// A stored `[rows, cols]` matrix, checked against its shape.
    fn stored(
        &self,
        t: DecoderTensor,
        rows: usize,
        cols: usize,
    ) -> Result<(WeightData, u64), GpuError> {
        let n = tensor_name(t, self.naming);
        let m = stored::matrix(self.src, &n, rows, cols)?;
        Ok(match self.catalog.widened.iter().any(|w| w.tensor == n) {
            false => (WeightData::Stored(n), m.bytes.len() as u64),
            true => (WeightData::Widened(n), 2 * (rows * cols) as u64),
        })
    }

    /// A stored vector of `len`, widened to f32.
    fn vector(&self, t: DecoderTensor, len: usize) -> Result<(WeightData, u64), GpuError> {
        let v = stored::vector(self.src, &tensor_name(t, self.naming), len)?;
        Ok(floats(v))
    }
}

fn floats(v: Vec<f32>) -> (WeightData, u64) {
    let bytes = 4 * v.len() as u64;
    (WeightData::Floats(v), bytes)
}

impl ModelWeights {
    /// The weights of the decoder `c` describes, from `src` (each matrix stored or
    /// widened as `catalog` chose), with RoPE tables over `context` positions.
    pub fn gather(
        c: &ModelConfig,
        catalog: &Catalog,
        src: &dyn StoredTensors,
        naming: Naming,
        context: u32,
    ) -> Result<ModelWeights, GpuError> {
        let (hidden, hd) = (c.hidden, c.head_dim);
        let (q_width, kv_width) = (c.heads * hd, c.kv_heads * hd);
        let mut g = Gather {
            src,
            catalog,
            naming,
            groups: vec![],
        };
        let (cos, sin) = rope_tables(c, src, naming, context)?;
        let rope = g.group(vec![floats(cos), floats(sin)]);
        let embedding = g.group(vec![g.stored(
            DecoderTensor::TokenEmbedding,
            c.vocab,
            hidden,
        )?]);
        let mut layers = Vec::with_capacity(c.layers);
        for l in 0..c.layers {
            let t = |t| DecoderTensor::Layer(l, t);
            let norms = g.group(vec![
                g.vector(t(L::AttnNorm), hidden)?,
                g.vector(t(L::FfnNorm), hidden)?,
            ]);
            let qkv = g.group(vec![
                g.stored(t(L::Q), q_width, hidden)?,
                g.stored(t(L::K), kv_width, hidden)?,
                g.stored(t(L::V), kv_width, hidden)?,
            ]);
            let qkv_bias = match c.qkv_bias {
                true => Some(g.group(vec![
                    g.vector(t(L::QBias), q_width)?,
                    g.vector(t(L::KBias), kv_width)?,
                    g.vector(t(L::VBias), kv_width)?,
                ])),
                false => None,
            };
            let qk_norm = match c.qk_norm {
                true => Some(g.group(vec![g.vector(t(L::QNorm), hd)?, g.vector(t(L::KNorm), hd)?])),
                false => None,
            };
            let attn_output = g.group(vec![g.stored(t(L::AttnOutput), hidden, q_width)?]);
            let gate_up = g.group(vec![
                g.stored(t(L::Gate), c.ffn, hidden)?,
                g.stored(t(L::Up), c.ffn, hidden)?,
            ]);
            let down = g.group(vec![g.stored(t(L::Down), hidden, c.ffn)?]);
            layers.push(LayerWeights {
                norms,
                qkv,
                qkv_bias,
                qk_norm,
                attn_output,
                gate_up,
                down,
            });
        }
        let output_norm = g.group(vec![g.vector(DecoderTensor::OutputNorm, hidden)?]);
        let head = match c.tied_embeddings {
            true => embedding,
            false => g.group(vec![g.stored(DecoderTensor::Output, c.vocab, hidden)?]),
        };
        Ok(ModelWeights {
            groups: g.groups,
            rope,
            embedding,
            layers,
            output_norm,
            head,
        })
    }

    /// Part `part` of group `group`.
    pub fn part(&self, group: usize, part: usize) -> Operand {
        at(Region::Weights(group), self.groups[group].offset(part))
    }

    /// Bytes of all weights and constants.
    pub fn bytes(&self) -> u64 {
        self.groups.iter().map(WeightGroup::bytes).sum()
    }

    /// Weight bytes one decode step reads: every matrix and norm weight, not the RoPE
    /// tables nor (unless it is also the LM head) the embedding table, of which it reads
    /// one row.
    pub fn bytes_per_token(&self) -> u64 {
        let mut not_streamed = self.groups[self.rope].bytes();
        if self.head != self.embedding {
            not_streamed += self.groups[self.embedding].bytes();
        }
        self.bytes() - not_streamed
    }
}

/// The RoPE cos and sin tables over `context` positions (with the checkpoint's
/// `rope_freqs` factors where it stores them).
fn rope_tables(
    c: &ModelConfig,
    src: &dyn StoredTensors,
    naming: Naming,
    context: u32,
) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
    let factors = match DecoderTensor::RopeFreqs.name(naming) {
        Some(n) if src.contains(&n) => Some(
            stored::vector(src, &n, c.head_dim / 2)?
                .into_iter()
                .map(f64::from)
                .collect::<Vec<_>>(),
        ),
        _ => None,
    };
    Ok(rope::table(
        &rope_frequencies(c, factors.as_deref()),
        context,
    ))
}
