//! The encoder's weights on the device.
//!
//! Linear layers are uploaded as bf16: they are the `B` operand of the tensor-core matrix
//! products (`gemm_bf16_residual`), which read bf16 only. Their activations are rounded to
//! bf16 as well, so each product carries about 2^-9 relative error per operand; through
//! six layers with LayerNorms between them this keeps sentence embeddings within cosine
//! 0.999 of the f64 reference. Everything else stays f32: the embedding tables (the
//! gather is exact), the biases and the LayerNorm parameters. q, k and v are stored as one
//! `[3·hidden, hidden]` matrix (and one bias), so that one product makes all three.

use half::bf16;
use quench_models::arch::{BertLayerTensor as L, BertTensor, ModelConfig, Naming, TensorSource};
use quench_rt::{DevicePtr, Executor};

use crate::gpu::GpuError;

/// A linear layer: `[rows, cols]` bf16 weight and `[rows]` f32 bias.
pub(super) struct Dense {
    pub weight: DevicePtr,
    pub bias: DevicePtr,
}

/// LayerNorm scale and shift, f32.
pub(super) struct Norm {
    pub weight: DevicePtr,
    pub bias: DevicePtr,
}

pub(super) struct Layer {
    pub qkv: Dense,
    pub attn_output: Dense,
    pub attn_norm: Norm,
    pub up: Dense,
    pub down: Dense,
    pub output_norm: Norm,
}

pub(super) struct Weights {
    /// `[vocab, hidden]` f32.
    pub word: DevicePtr,
    /// `[max_positions, hidden]` f32: each position's row plus token type 0's row (the
    /// only type a single text has), summed once at load.
    pub position_type: DevicePtr,
    pub embedding_norm: Norm,
    pub layers: Vec<Layer>,
    /// Every allocation above, to free.
    pub allocations: Vec<DevicePtr>,
    pub bytes: u64,
}

/// Reads tensors by name, checks their shapes and uploads them.
struct Uploader<'a> {
    src: &'a dyn TensorSource,
    naming: Naming,
    prefix: &'static str,
    exec: &'a mut dyn Executor,
    allocations: Vec<DevicePtr>,
    bytes: u64,
}

impl Uploader<'_> {
    fn read(&self, t: BertTensor, dims: &[usize]) -> Result<Vec<f32>, GpuError> {
        let name = t.name(self.naming, self.prefix);
        let (found, data) = self.src.get(&name)?;
        if found != dims {
            return Err(GpuError::Shape {
                tensor: name,
                expected: dims.to_vec(),
                found,
            });
        }
        Ok(data)
    }

    fn put(&mut self, what: &str, bytes: &[u8]) -> Result<DevicePtr, GpuError> {
        let during = || format!("uploading {what}");
        let p = self
            .exec
            .alloc(bytes.len().max(1) as u64)
            .map_err(GpuError::runtime(during()))?;
        self.allocations.push(p);
        self.exec
            .copy_to_device(p, bytes)
            .map_err(GpuError::runtime(during()))?;
        self.bytes += bytes.len() as u64;
        Ok(p)
    }

    fn f32s(&mut self, what: &str, v: &[f32]) -> Result<DevicePtr, GpuError> {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.put(what, &bytes)
    }

    fn bf16s(&mut self, what: &str, v: &[f32]) -> Result<DevicePtr, GpuError> {
        let bytes: Vec<u8> = v
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_bits().to_le_bytes())
            .collect();
        self.put(what, &bytes)
    }

    fn norm(&mut self, w: BertTensor, b: BertTensor, dim: usize) -> Result<Norm, GpuError> {
        let (wv, bv) = (self.read(w, &[dim])?, self.read(b, &[dim])?);
        Ok(Norm {
            weight: self.f32s("a LayerNorm weight", &wv)?,
            bias: self.f32s("a LayerNorm bias", &bv)?,
        })
    }

    /// Linear layers stacked row-wise into one (q, k, v → q|k|v).
    fn dense(
        &mut self,
        parts: &[(BertTensor, BertTensor)],
        rows: usize,
        cols: usize,
    ) -> Result<Dense, GpuError> {
        let (mut w, mut b) = (
            Vec::with_capacity(parts.len() * rows * cols),
            Vec::with_capacity(parts.len() * rows),
        );
        for &(wt, bt) in parts {
            w.extend(self.read(wt, &[rows, cols])?);
            b.extend(self.read(bt, &[rows])?);
        }
        Ok(Dense {
            weight: self.bf16s("a linear layer's weight", &w)?,
            bias: self.f32s("a linear layer's bias", &b)?,
        })
    }
}

/// Uploads every weight of the BERT encoder `c` describes. Hugging Face checkpoints whose
/// names start with `bert.` (saved from a task model) are read as well.
pub(super) fn upload(
    c: &ModelConfig,
    src: &dyn TensorSource,
    naming: Naming,
    exec: &mut dyn Executor,
) -> Result<Weights, GpuError> {
    let prefix = match naming {
        Naming::HuggingFace
            if !src.contains(&BertTensor::WordEmbedding.name(naming, ""))
                && src.contains(&BertTensor::WordEmbedding.name(naming, "bert.")) =>
        {
            "bert."
        }
        _ => "",
    };
    let mut u = Uploader {
        src,
        naming,
        prefix,
        exec,
        allocations: vec![],
        bytes: 0,
    };
    let result = upload_all(c, &mut u);
    match result {
        Ok((word, position_type, embedding_norm, layers)) => Ok(Weights {
            word,
            position_type,
            embedding_norm,
            layers,
            allocations: u.allocations,
            bytes: u.bytes,
        }),
        Err(e) => {
            // Give back what was uploaded before the failure; the first error is the one to report.
            for p in u.allocations {
                let _ = u.exec.free(p);
            }
            Err(e)
        }
    }
}

type Parts = (DevicePtr, DevicePtr, Norm, Vec<Layer>);

fn upload_all(c: &ModelConfig, u: &mut Uploader) -> Result<Parts, GpuError> {
    let h = c.hidden;
    let word = u.read(BertTensor::WordEmbedding, &[c.vocab, h])?;
    let word = u.f32s("the word embeddings", &word)?;
    let mut position = u.read(BertTensor::PositionEmbedding, &[c.max_positions, h])?;
    let types = u.read(BertTensor::TypeEmbedding, &[c.type_vocab, h])?;
    for row in position.chunks_exact_mut(h) {
        row.iter_mut().zip(&types[..h]).for_each(|(p, t)| *p += t);
    }
    let position_type = u.f32s("the position embeddings", &position)?;
    let embedding_norm = u.norm(
        BertTensor::EmbeddingNormWeight,
        BertTensor::EmbeddingNormBias,
        h,
    )?;
    let mut layers = Vec::with_capacity(c.layers);
    for n in 0..c.layers {
        let t = |t| BertTensor::Layer(n, t);
        layers.push(Layer {
            qkv: u.dense(
                &[
                    (t(L::Q), t(L::QBias)),
                    (t(L::K), t(L::KBias)),
                    (t(L::V), t(L::VBias)),
                ],
                h,
                h,
            )?,
            attn_output: u.dense(&[(t(L::AttnOutput), t(L::AttnOutputBias))], h, h)?,
            attn_norm: u.norm(t(L::AttnNormWeight), t(L::AttnNormBias), h)?,
            up: u.dense(&[(t(L::Up), t(L::UpBias))], c.ffn, h)?,
            down: u.dense(&[(t(L::Down), t(L::DownBias))], h, c.ffn)?,
            output_norm: u.norm(t(L::OutputNormWeight), t(L::OutputNormBias), h)?,
        });
    }
    Ok((word, position_type, embedding_norm, layers))
}
