//! The catalog: which library kernel runs each part of a decoder, chosen from the model's
//! config and the format each weight is stored in.
//!
//! | part | kernel |
//! |---|---|
//! | token embedding | `embed_<table format>` (f32, bf16, f16, Q8_0, Q4_1, Q4_K, Q5_K, Q6_K tables; f16 for a table expanded at upload) |
//! | attention norm + q, k, v projections | one `qgemv_<format>_rmsnorm_xf32` over the concatenated rows when the three share a format, else three (`_rmsnorm_residual_` adding qwen2's biases) |
//! | (q/k norms +) RoPE + KV append | `rope_append_<neox\|gptj>[_qknorm]_<f16\|f32>` (the cache's type): neox for Hugging Face layout and qwen GGUF, gptj for llama GGUF; the q/k norms for qwen3 |
//! | attention | `attention_decode_merge_<f16\|f32>` (the last split merges) |
//! | output projection, down | `qgemv_<format>_residual_xf32` (adds into the residual stream) |
//! | ffn norm + gate and up | `qgemv_<format>_rmsnorm_swiglu_xf32` (both at once, SwiGLU applied) |
//! | output norm + LM head | `qgemv_<format>_rmsnorm_xf32` |
//!
//! The norms run inside the projections that read them. Activations between kernels are
//! f32 and the KV cache f16 or f32 (see [`super::graph`]).
//!
//! Matrices in bf16, f16, Q8_0, Q4_0, Q4_1 or a k-quant (Q2_K to Q6_K) are read as
//! stored; a matrix or table in another GGUF block type (Q5_0, Q5_1, the i-quants; a
//! Q2_K or Q3_K table) is
//! expanded to f16 as it is uploaded and listed in [`Catalog::widened`], and so is a
//! layer matrix whose rows the prompt path's product of its type cannot take; anything else
//! (safetensors' integer types, a tied f32 table) is refused by name.

use quench_kernels::embed::TableFormat;
use quench_kernels::qgemv::WeightFormat;
use quench_kernels::rope::RopeStyle as RopePairs;
use quench_models::arch::{DecoderLayerTensor as L, DecoderTensor, ModelConfig, Naming, RopeStyle};
use quench_models::GgmlType;

use super::error::GpuError;
use super::stored::{self, StoredTensors};

const MATRIX_FORMATS: &str =
    "matrices in BF16, F16, Q8_0, Q4_0, Q4_1 and the k-quants (Q2_K to Q6_K), and expand the other GGUF block types (Q5_0, Q5_1, the i-quants) to F16";
const TABLE_FORMATS: &str =
    "token embeddings in F32, BF16, F16, Q8_0, Q4_1, Q4_K, Q5_K or Q6_K, and expand the other GGUF block types to F16";

/// The kernels of one decode step.
#[derive(Clone, Debug, PartialEq)]
pub struct Catalog {
    pub embed: TableFormat,
    pub rope: RopePairs,
    pub layers: Vec<LayerKernels>,
    /// The LM head's format (the embedding's when the two are tied).
    pub output: WeightFormat,
    /// The tensors stored in a type no kernel reads, expanded to f16 at upload, in the
    /// order they were met.
    pub widened: Vec<Widened>,
}

/// A tensor expanded to f16 at upload, the type it is stored in, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Widened {
    pub tensor: String,
    pub stored: GgmlType,
    /// `Some(k)` where a kernel reads the type but the prompt path's product of that type
    /// does not take rows of `k` elements (Q6_K's and Q3_K's need a multiple of 512);
    /// `None` where no kernel reads the type.
    pub rows_of: Option<usize>,
}

impl Widened {
    /// What was widened, for grouping in messages: the type (`IQ2_XS`), or the type and
    /// the width its prompt products refuse (`Q6_K rows of 8960`).
    pub fn what(&self) -> String {
        match self.rows_of {
            None => self.stored.name().to_owned(),
            Some(k) => format!("{} rows of {k}", self.stored.name()),
        }
    }

    /// How many of `widened` there are of each [`Widened::what`].
    pub fn counts<'a>(
        widened: impl IntoIterator<Item = &'a Widened>,
    ) -> std::collections::BTreeMap<String, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for w in widened {
            *counts.entry(w.what()).or_default() += 1;
        }
        counts
    }
}

/// The matrix formats of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerKernels {
    pub qkv: Qkv,
    pub attn_output: WeightFormat,
    /// Gate and up share a format: one SwiGLU kernel reads both.
    pub gate_up: WeightFormat,
    pub down: WeightFormat,
}

/// How the q, k and v projections run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Qkv {
    /// One matrix–vector product over the rows of q, k and v placed back to back.
    Fused(WeightFormat),
    /// Three, when the checkpoint stores them in different formats.
    Separate([WeightFormat; 3]),
}

/// The name of a decoder tensor in `naming`.
pub(crate) fn tensor_name(t: DecoderTensor, naming: Naming) -> String {
    // Every tensor the GPU path reads has a name in both namings.
    t.name(naming).unwrap_or_default()
}

/// The matrix format of a ggml type, if a matrix–vector kernel reads it.
pub fn weight_format(t: GgmlType) -> Option<WeightFormat> {
    Some(match t {
        GgmlType::BF16 => WeightFormat::BF16,
        GgmlType::F16 => WeightFormat::F16,
        GgmlType::Q8_0 => WeightFormat::Q8_0,
        GgmlType::Q4_0 => WeightFormat::Q4_0,
        GgmlType::Q4_1 => WeightFormat::Q4_1,
        GgmlType::Q4_K => WeightFormat::Q4K,
        GgmlType::Q5_K => WeightFormat::Q5K,
        GgmlType::Q6_K => WeightFormat::Q6K,
        GgmlType::Q3_K => WeightFormat::Q3K,
        GgmlType::Q2_K => WeightFormat::Q2K,
        _ => return None,
    })
}

fn table_format(t: GgmlType) -> Option<TableFormat> {
    TableFormat::ALL.into_iter().find(|f| f.ggml() == t)
}

impl Catalog {
    /// Chooses the kernels for `config`, checking every weight's format and shape, for a
    /// decoder with the prompt path ([`Catalog::choose_for`]).
    pub fn choose(
        config: &ModelConfig,
        src: &dyn StoredTensors,
        naming: Naming,
    ) -> Result<Catalog, GpuError> {
        Self::choose_for(config, src, naming, true)
    }

    /// As [`Catalog::choose`]; with `prompt_path`, a layer matrix whose rows the prompt
    /// path's product of its type cannot take is widened to f16 (without it, prompts go
    /// token by token and every matrix the decode step reads stays as stored).
    pub fn choose_for(
        config: &ModelConfig,
        src: &dyn StoredTensors,
        naming: Naming,
        prompt_path: bool,
    ) -> Result<Catalog, GpuError> {
        if !config.arch.is_decoder() {
            return Err(GpuError::Unsupported {
                what: format!("the {} architecture", config.arch.name()),
                reason: "it is an encoder: sentence embedders run through the GPU encoder".into(),
            });
        }
        let c = config;
        let name = |t| tensor_name(t, naming);
        let widened = std::cell::RefCell::new(vec![]);
        // A matrix's format: as stored where a kernel reads it, else f16 widened.
        let matrix = |t: DecoderTensor,
                      rows: usize,
                      cols: usize|
         -> Result<WeightFormat, GpuError> {
            let n = name(t);
            let ty = stored::matrix(src, &n, rows, cols)?.ggml_type;
            // Every matrix but the LM head is multiplied by the prompt path's GEMMs
            // too: one those cannot take goes up as f16, which keeps the prompt path.
            let in_prompt_gemm = prompt_path && t != DecoderTensor::Output;
            match weight_format(ty) {
                Some(f) if !in_prompt_gemm || super::prefill::gemm_takes(f, cols) => return Ok(f),
                Some(_) => {
                    widened.borrow_mut().push(Widened {
                        tensor: n,
                        stored: ty,
                        rows_of: Some(cols),
                    });
                    return Ok(WeightFormat::F16);
                }
                None => {}
            }
            if !stored::widens(ty) {
                return Err(GpuError::Format {
                    tensor: n,
                    format: ty.name().to_owned(),
                    supported: MATRIX_FORMATS,
                });
            }
            widened.borrow_mut().push(Widened {
                tensor: n,
                stored: ty,
                rows_of: None,
            });
            Ok(WeightFormat::F16)
        };
        let embed_name = name(DecoderTensor::TokenEmbedding);
        let table = stored::matrix(src, &embed_name, c.vocab, c.hidden)?.ggml_type;
        // A tied table serves as the LM head too: kept as stored only where both read it.
        let gather = table_format(table);
        let kept = match c.tied_embeddings {
            false => gather.map(|embed| (embed, None)),
            true => gather.zip(weight_format(table).map(Some)),
        };
        let (embed, tied_head) = match kept {
            Some(kept) => kept,
            None if stored::widens(table) => {
                widened.borrow_mut().push(Widened {
                    tensor: embed_name.clone(),
                    stored: table,
                    rows_of: None,
                });
                let head = c.tied_embeddings.then_some(WeightFormat::F16);
                (TableFormat::F16, head)
            }
            None => {
                let (tensor, supported) = match gather {
                    None => (embed_name, TABLE_FORMATS),
                    Some(_) => (
                        format!("{embed_name} (the LM head, tied to the embedding)"),
                        MATRIX_FORMATS,
                    ),
                };
                return Err(GpuError::Format {
                    tensor,
                    format: table.name().to_owned(),
                    supported,
                });
            }
        };
        let output = match tied_head {
            Some(head) => head,
            None => matrix(DecoderTensor::Output, c.vocab, c.hidden)?,
        };
        let (q_width, kv_width) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
        let mut layers = Vec::with_capacity(c.layers);
        for n in 0..c.layers {
            let t = |t| DecoderTensor::Layer(n, t);
            let q = matrix(t(L::Q), q_width, c.hidden)?;
            let k = matrix(t(L::K), kv_width, c.hidden)?;
            let v = matrix(t(L::V), kv_width, c.hidden)?;
            let gate = matrix(t(L::Gate), c.ffn, c.hidden)?;
            let up = matrix(t(L::Up), c.ffn, c.hidden)?;
            if gate != up {
                return Err(GpuError::Unsupported {
                    what: format!("layer {n}'s gate and up projections in different formats"),
                    reason: format!(
                        "{} is {gate:?} and {} is {up:?}; the fused SwiGLU kernel reads both in one format",
                        name(t(L::Gate)),
                        name(t(L::Up))
                    ),
                });
            }
            layers.push(LayerKernels {
                qkv: if q == k && k == v {
                    Qkv::Fused(q)
                } else {
                    Qkv::Separate([q, k, v])
                },
                attn_output: matrix(t(L::AttnOutput), c.hidden, q_width)?,
                gate_up: gate,
                down: matrix(t(L::Down), c.hidden, c.ffn)?,
            });
        }
        Ok(Catalog {
            widened: widened.into_inner(),
            embed,
            rope: match c.rope_style {
                RopeStyle::HalfSplit => RopePairs::NeoX,
                RopeStyle::Adjacent => RopePairs::GptJ,
            },
            layers,
            output,
        })
    }
}
