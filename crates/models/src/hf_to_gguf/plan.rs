//! Which GGUF tensor each checkpoint tensor becomes: its name, its shape, the type it is
//! stored in, and whether its rows are reordered for llama.cpp's RoPE layout.

use crate::safetensors::SafetensorsInfo;
use crate::{GgmlType, HfConfig};

use super::arch::Arch;
use super::error::ConvertError;
use super::TargetType;

/// Hugging Face names inside `model.layers.N.`, their GGUF names inside `blk.N.`, and
/// whether the rows are a q (`Some(true)`) or k (`Some(false)`) projection, whose rows
/// llama.cpp reorders for llama. In this order within a layer in the output.
const LAYER_TENSORS: &[(&str, &str, Option<bool>)] = &[
    ("input_layernorm.weight", "attn_norm.weight", None),
    ("self_attn.q_proj.weight", "attn_q.weight", Some(true)),
    ("self_attn.q_proj.bias", "attn_q.bias", Some(true)),
    ("self_attn.k_proj.weight", "attn_k.weight", Some(false)),
    ("self_attn.k_proj.bias", "attn_k.bias", Some(false)),
    ("self_attn.v_proj.weight", "attn_v.weight", None),
    ("self_attn.v_proj.bias", "attn_v.bias", None),
    ("self_attn.q_norm.weight", "attn_q_norm.weight", None),
    ("self_attn.k_norm.weight", "attn_k_norm.weight", None),
    ("self_attn.o_proj.weight", "attn_output.weight", None),
    ("post_attention_layernorm.weight", "ffn_norm.weight", None),
    ("mlp.gate_proj.weight", "ffn_gate.weight", None),
    ("mlp.up_proj.weight", "ffn_up.weight", None),
    ("mlp.down_proj.weight", "ffn_down.weight", None),
];

/// Buffers some checkpoints save that are not weights (recomputed from the config).
const SKIPPED_LAYER_TENSORS: &[&str] = &["self_attn.rotary_emb.inv_freq"];

/// The order rows are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowOrder {
    AsStored,
    /// Within each head of `head_dim` rows, row `2i + p` of the output is row
    /// `p·head_dim/2 + i` of the checkpoint: the two halves of the head interleaved, so
    /// that adjacent-pair RoPE on the output rotates what half-split RoPE rotates on the
    /// input.
    InterleaveHalves {
        head_dim: usize,
    },
}

impl RowOrder {
    /// The checkpoint row that output row `r` comes from.
    pub fn source_row(self, r: usize) -> usize {
        match self {
            RowOrder::AsStored => r,
            RowOrder::InterleaveHalves { head_dim } => {
                let (head, j) = (r / head_dim, r % head_dim);
                head * head_dim + (j % 2) * (head_dim / 2) + j / 2
            }
        }
    }
}

/// Where a tensor's values come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    /// A checkpoint tensor, by its Hugging Face name.
    Checkpoint(String),
    /// Values computed by the converter (Llama 3's RoPE factors).
    Computed(Vec<f32>),
}

/// One tensor of the output.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedTensor {
    pub gguf_name: String,
    pub source: Source,
    /// Rows and row length (a vector is one row).
    pub rows: usize,
    pub cols: usize,
    /// Whether the tensor is a vector (GGUF dims `[cols]`) rather than a matrix.
    pub vector: bool,
    /// The type the policy asks for, and the type it is stored in (another where its rows
    /// are not whole blocks of the first).
    pub wanted: GgmlType,
    pub ggml_type: GgmlType,
    pub row_order: RowOrder,
}

impl PlannedTensor {
    /// GGUF dimensions, innermost first.
    pub fn dims(&self) -> Vec<u64> {
        if self.vector {
            vec![self.cols as u64]
        } else {
            vec![self.cols as u64, self.rows as u64]
        }
    }
}

/// Output position: the embedding (and RoPE factors) first, then layer by layer, then the
/// final norm and the LM head, as llama.cpp's converter lays files out.
type SortKey = (usize, usize, usize);

/// The GGUF name of a Hugging Face tensor, where to put it, and whether it is a q or k
/// projection; `None` for buffers that are dropped.
fn gguf_name(hf: &str) -> Result<Option<(String, SortKey, Option<bool>)>, ConvertError> {
    match hf {
        "model.embed_tokens.weight" => {
            return Ok(Some(("token_embd.weight".into(), (0, 0, 0), None)))
        }
        "model.norm.weight" => return Ok(Some(("output_norm.weight".into(), (2, 0, 0), None))),
        "lm_head.weight" => return Ok(Some(("output.weight".into(), (2, 0, 1), None))),
        _ => {}
    }
    let unknown = || ConvertError::Tensor {
        name: hf.to_owned(),
        reason: "not a weight of a llama, qwen2 or qwen3 model; the converter does not know \
                 its GGUF name"
            .into(),
    };
    let rest = hf.strip_prefix("model.layers.").ok_or_else(unknown)?;
    let (layer, suffix) = rest.split_once('.').ok_or_else(unknown)?;
    let layer: usize = layer.parse().map_err(|_| unknown())?;
    if SKIPPED_LAYER_TENSORS.contains(&suffix) {
        return Ok(None);
    }
    let (rank, (_, gguf, qk)) = LAYER_TENSORS
        .iter()
        .enumerate()
        .find(|(_, (h, _, _))| *h == suffix)
        .ok_or_else(unknown)?;
    Ok(Some((format!("blk.{layer}.{gguf}"), (1, layer, rank), *qk)))
}

/// What a tensor is, for the choice of its type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Vector,
    /// The token embedding; `tied` when it is the LM head too.
    Embedding {
        tied: bool,
    },
    Output,
    /// A matrix of layer `layer` of `layers`, in a model whose query heads share each
    /// key/value head `gqa` ways.
    Layer {
        matrix: LayerMatrix,
        layer: usize,
        layers: usize,
        gqa: usize,
    },
}

/// The matrices of a layer llama.cpp's mixes may give more bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LayerMatrix {
    /// The v projection.
    Value,
    /// The FFN down matrix.
    Down,
    /// The attention's output projection.
    AttnOutput,
    Other,
}

/// llama.cpp's rule for the layers whose v and down matrices get more bits in its _M
/// mixes: the first and last eighth of the layers, and every third one between.
fn use_more_bits(layer: usize, layers: usize) -> bool {
    layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2
}

/// The type llama.cpp's mix `target` gives a layer matrix (its `llama_tensor_get_type` for
/// these mixes, dense models):
/// - Q4_K_M, Q5_K_M: v and down in Q6_K in the layers [`use_more_bits`] names.
/// - Q3_K_M: v in Q5_K in layers 0 and 1, Q4_K after; down in Q5_K in the first
///   sixteenth of the layers, Q4_K after; the output projection in Q4_K.
/// - Q2_K: v in Q4_K where four or more query heads share a key/value head, else Q3_K;
///   down and the output projection in Q3_K.
/// - IQ4_XS (no importance data): v in Q5_K where four or more query heads share a
///   key/value head; down in Q5_K in the first eighth of the layers.
/// - Every other matrix: the mix's own type.
fn mix_layer_type(
    target: TargetType,
    matrix: LayerMatrix,
    layer: usize,
    layers: usize,
    gqa: usize,
) -> GgmlType {
    use LayerMatrix::*;
    match (target, matrix) {
        (TargetType::Q4_K_M | TargetType::Q5_K_M, Value | Down) if use_more_bits(layer, layers) => {
            GgmlType::Q6_K
        }
        (TargetType::Q3_K_M, Value) if layer < 2 => GgmlType::Q5_K,
        (TargetType::Q3_K_M, Down) if layer < layers / 16 => GgmlType::Q5_K,
        (TargetType::Q3_K_M, Value | Down | AttnOutput) => GgmlType::Q4_K,
        (TargetType::Q2_K, Value) if gqa >= 4 => GgmlType::Q4_K,
        (TargetType::Q2_K, Value | Down | AttnOutput) => GgmlType::Q3_K,
        (TargetType::IQ4_XS, Value) if gqa >= 4 => GgmlType::Q5_K,
        (TargetType::IQ4_XS, Down) if layer < layers / 8 => GgmlType::Q5_K,
        _ => target.ggml_type(),
    }
}

/// The type a tensor is meant for, and the type it is stored in: vectors in F32. With one
/// type throughout, the token embedding and LM head in Q8_0 (8 bits keep the logits close,
/// and Q8_0 is a format the GPU reads as an embedding table) and other matrices in the
/// target type. In llama.cpp's mixes, as llama.cpp chooses: the LM head (or a tied
/// embedding) in Q6_K, the token embedding in the mix's type, and the layer matrices as
/// [`mix_layer_type`] says. Rows that are not whole blocks of the type fall back to Q8_0,
/// then F16.
fn choose_type(role: Role, cols: usize, target: TargetType) -> (GgmlType, GgmlType) {
    let base = target.ggml_type();
    let wanted = match role {
        Role::Vector => return (GgmlType::F32, GgmlType::F32),
        Role::Embedding { .. } | Role::Output if !target.is_llama_cpp_mix() => GgmlType::Q8_0,
        Role::Output | Role::Embedding { tied: true } => GgmlType::Q6_K,
        Role::Embedding { tied: false } => base,
        Role::Layer {
            matrix,
            layer,
            layers,
            gqa,
        } if target.is_llama_cpp_mix() => mix_layer_type(target, matrix, layer, layers, gqa),
        Role::Layer { .. } => base,
    };
    let fits = |t: GgmlType| (cols as u64).is_multiple_of(t.block_size());
    let stored = [wanted, GgmlType::Q8_0, GgmlType::F16]
        .into_iter()
        .find(|&t| fits(t))
        .unwrap_or(GgmlType::F16);
    (wanted, stored)
}

/// Plans every tensor of the output, in order.
pub fn plan(
    arch: Arch,
    config: &HfConfig,
    infos: &[&SafetensorsInfo],
    rope_factors: Option<Vec<f32>>,
    target: TargetType,
) -> Result<Vec<PlannedTensor>, ConvertError> {
    let tied = config.tie_word_embeddings.unwrap_or(false);
    let head_dim = config.head_dim();
    let mut planned: Vec<(SortKey, PlannedTensor)> = Vec::new();
    for info in infos {
        if !info.dtype.is_supported() {
            return Err(ConvertError::Unsupported {
                what: format!(
                    "tensor {} stored as {} (the converter reads F32, F16 and BF16)",
                    info.name, info.dtype
                ),
            });
        }
        // A tied checkpoint that saves its LM head anyway saves a copy of the embedding.
        if tied && info.name == "lm_head.weight" {
            continue;
        }
        let Some((name, key, qk)) = gguf_name(&info.name)? else {
            continue;
        };
        let bad_shape = |reason: String| ConvertError::Tensor {
            name: info.name.clone(),
            reason,
        };
        let (rows, cols, vector) = match info.shape[..] {
            [n] => (1, n as usize, true),
            [r, c] => (r as usize, c as usize, false),
            _ => {
                return Err(bad_shape(format!(
                    "shape {:?}; weights are vectors or matrices",
                    info.shape
                )))
            }
        };
        let row_order = match qk {
            Some(is_q) if arch.interleaves_rope_rows() => {
                let heads = if is_q {
                    config.num_attention_heads
                } else {
                    config.num_kv_heads()
                };
                let len = if vector { cols } else { rows };
                if len != heads * head_dim || !head_dim.is_multiple_of(2) {
                    return Err(bad_shape(format!(
                        "{len} rows are not {heads} heads of an even {head_dim}"
                    )));
                }
                RowOrder::InterleaveHalves { head_dim }
            }
            _ => RowOrder::AsStored,
        };
        let role = match (name.as_str(), key) {
            _ if vector => Role::Vector,
            ("token_embd.weight", _) => Role::Embedding { tied },
            ("output.weight", _) => Role::Output,
            (_, (_, layer, _)) => Role::Layer {
                matrix: match name.rsplit_once(&format!("blk.{layer}.")) {
                    Some((_, "attn_v.weight")) => LayerMatrix::Value,
                    Some((_, "ffn_down.weight")) => LayerMatrix::Down,
                    Some((_, "attn_output.weight")) => LayerMatrix::AttnOutput,
                    _ => LayerMatrix::Other,
                },
                layer,
                layers: config.num_hidden_layers,
                gqa: config.num_attention_heads / config.num_kv_heads().max(1),
            },
        };
        let (wanted, ggml_type) = choose_type(role, cols, target);
        planned.push((
            key,
            PlannedTensor {
                gguf_name: name,
                source: Source::Checkpoint(info.name.clone()),
                rows,
                cols,
                vector,
                wanted,
                ggml_type,
                row_order,
            },
        ));
    }
    check_complete(arch, config, infos)?;
    if let Some(factors) = rope_factors {
        planned.push((
            (0, 0, 1),
            PlannedTensor {
                gguf_name: "rope_freqs.weight".into(),
                rows: 1,
                cols: factors.len(),
                vector: true,
                wanted: GgmlType::F32,
                ggml_type: GgmlType::F32,
                row_order: RowOrder::AsStored,
                source: Source::Computed(factors),
            },
        ));
    }
    planned.sort_by_key(|(key, _)| *key);
    Ok(planned.into_iter().map(|(_, t)| t).collect())
}

/// The Hugging Face layer tensors `arch` has.
fn layer_tensors(arch: Arch) -> impl Iterator<Item = &'static str> {
    LAYER_TENSORS
        .iter()
        .map(|(hf, _, _)| *hf)
        .filter(move |hf| {
            let bias = hf.ends_with(".bias") && !hf.contains("o_proj");
            let qk_norm = hf.contains("_norm.");
            match arch {
                Arch::Llama => !bias && !qk_norm,
                Arch::Qwen2 => !qk_norm,
                Arch::Qwen3 => !bias,
            }
        })
}

/// Every weight the config calls for is present, and no layer lies past `num_hidden_layers`.
fn check_complete(
    arch: Arch,
    config: &HfConfig,
    infos: &[&SafetensorsInfo],
) -> Result<(), ConvertError> {
    let present = |name: &str| infos.iter().any(|i| i.name == name);
    let mut required = vec![
        "model.embed_tokens.weight".to_owned(),
        "model.norm.weight".to_owned(),
    ];
    if !config.tie_word_embeddings.unwrap_or(false) {
        required.push("lm_head.weight".to_owned());
    }
    for n in 0..config.num_hidden_layers {
        required.extend(layer_tensors(arch).map(|t| format!("model.layers.{n}.{t}")));
    }
    if let Some(missing) = required.iter().find(|n| !present(n)) {
        return Err(ConvertError::Tensor {
            name: missing.clone(),
            reason: format!(
                "missing from the checkpoint ({} with {} layers{})",
                arch.gguf_name(),
                config.num_hidden_layers,
                if missing == "lm_head.weight" {
                    ", embeddings not tied"
                } else {
                    ""
                }
            ),
        });
    }
    for info in infos {
        let layer = info
            .name
            .strip_prefix("model.layers.")
            .and_then(|r| r.split_once('.'))
            .and_then(|(n, _)| n.parse::<usize>().ok());
        if layer.is_some_and(|n| n >= config.num_hidden_layers) {
            return Err(ConvertError::Tensor {
                name: info.name.clone(),
                reason: format!(
                    "layer past num_hidden_layers = {}",
                    config.num_hidden_layers
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaving_pairs_each_element_with_the_one_half_a_head_away() {
        let order = RowOrder::InterleaveHalves { head_dim: 8 };
        let rows: Vec<usize> = (0..16).map(|r| order.source_row(r)).collect();
        assert_eq!(rows, [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]);
    }

    const MATRIX: Role = Role::Layer {
        matrix: LayerMatrix::Other,
        layer: 0,
        layers: 1,
        gqa: 1,
    };

    #[test]
    fn rows_that_are_not_whole_blocks_fall_back() {
        let q4_k = TargetType::Q4_K;
        let ends = Role::Embedding { tied: false };
        use GgmlType::*;
        assert_eq!(choose_type(MATRIX, 288, q4_k), (Q4_K, Q8_0));
        assert_eq!(choose_type(MATRIX, 48, TargetType::Q4_0), (Q4_0, F16));
        assert_eq!(choose_type(MATRIX, 512, q4_k), (Q4_K, Q4_K));
        assert_eq!(choose_type(Role::Vector, 48, q4_k), (F32, F32));
        assert_eq!(choose_type(ends, 512, q4_k), (Q8_0, Q8_0));
        assert_eq!(choose_type(Role::Output, 80, q4_k), (Q8_0, F16));
        assert_eq!(choose_type(MATRIX, 288, TargetType::Q6_K), (Q6_K, Q8_0));
    }

    /// llama.cpp's Q4_K_M of a 32-layer model: 16 layers' v and down in Q6_K (the first 4,
    /// the last 4, and layers 6, 9, …, 27), the LM head in Q6_K, the embedding in Q4_K
    /// (Q6_K when tied).
    #[test]
    fn q4_k_m_gives_llama_cpps_layers_more_bits() {
        let more: Vec<usize> = (0..32).filter(|&l| use_more_bits(l, 32)).collect();
        assert_eq!(
            more,
            [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
        );
        let m = TargetType::Q4_K_M;
        let layer = |more_bits_candidate, layer| Role::Layer {
            matrix: match more_bits_candidate {
                true => LayerMatrix::Down,
                false => LayerMatrix::Other,
            },
            layer,
            layers: 32,
            gqa: 4,
        };
        use GgmlType::*;
        assert_eq!(choose_type(layer(true, 6), 4096, m).0, Q6_K);
        assert_eq!(choose_type(layer(true, 7), 4096, m).0, Q4_K);
        assert_eq!(choose_type(layer(false, 6), 4096, m).0, Q4_K);
        assert_eq!(choose_type(Role::Output, 4096, m).0, Q6_K);
        assert_eq!(
            choose_type(Role::Embedding { tied: false }, 4096, m).0,
            Q4_K
        );
        assert_eq!(choose_type(Role::Embedding { tied: true }, 4096, m).0, Q6_K);
        // llama.cpp keeps an LM head whose rows are not whole super-blocks at Q8_0.
        assert_eq!(choose_type(Role::Output, 896, m), (Q6_K, Q8_0));
        let q5 = TargetType::Q5_K_M;
        assert_eq!(choose_type(layer(true, 6), 4096, q5).0, Q6_K);
        assert_eq!(choose_type(layer(true, 7), 4096, q5).0, Q5_K);
        assert_eq!(
            choose_type(Role::Embedding { tied: false }, 4096, q5).0,
            Q5_K
        );
        let q6 = TargetType::Q6_K;
        assert_eq!(choose_type(layer(false, 7), 4096, q6).0, Q6_K);
        assert_eq!(
            choose_type(Role::Embedding { tied: false }, 4096, q6).0,
            Q6_K
        );
    }

    /// llama.cpp's Q3_K_M, Q2_K and IQ4_XS of a 32-layer model with 4 query heads a
    /// key/value head (and 2, where the rule depends on it).
    #[test]
    fn q3_k_m_q2_k_and_iq4_xs_follow_llama_cpps_rules() {
        use GgmlType::*;
        use LayerMatrix::*;
        let role = |matrix, layer, gqa| Role::Layer {
            matrix,
            layer,
            layers: 32,
            gqa,
        };
        let t = |target, role| choose_type(role, 4096, target).0;
        let m = TargetType::Q3_K_M;
        assert_eq!(t(m, role(Value, 1, 4)), Q5_K);
        assert_eq!(t(m, role(Value, 2, 4)), Q4_K);
        assert_eq!(t(m, role(Down, 1, 4)), Q5_K);
        assert_eq!(t(m, role(Down, 2, 4)), Q4_K);
        assert_eq!(t(m, role(AttnOutput, 9, 4)), Q4_K);
        assert_eq!(t(m, role(Other, 0, 4)), Q3_K);
        assert_eq!(t(m, Role::Output), Q6_K);
        assert_eq!(t(m, Role::Embedding { tied: false }), Q3_K);
        let q2 = TargetType::Q2_K;
        assert_eq!(t(q2, role(Value, 5, 4)), Q4_K);
        assert_eq!(t(q2, role(Value, 5, 2)), Q3_K);
        assert_eq!(t(q2, role(Down, 5, 4)), Q3_K);
        assert_eq!(t(q2, role(AttnOutput, 5, 4)), Q3_K);
        assert_eq!(t(q2, role(Other, 5, 4)), Q2_K);
        assert_eq!(t(q2, Role::Embedding { tied: true }), Q6_K);
        // Rows that are not whole super-blocks: Q8_0, as for the other k-quant mixes.
        assert_eq!(choose_type(role(Other, 0, 4), 896, q2), (Q2_K, Q8_0));
        let iq4 = TargetType::IQ4_XS;
        assert_eq!(t(iq4, role(Value, 20, 4)), Q5_K);
        assert_eq!(t(iq4, role(Value, 20, 2)), IQ4_XS);
        assert_eq!(t(iq4, role(Down, 3, 4)), Q5_K);
        assert_eq!(t(iq4, role(Down, 4, 4)), IQ4_XS);
        assert_eq!(t(iq4, role(AttnOutput, 0, 4)), IQ4_XS);
        assert_eq!(t(iq4, role(Other, 0, 4)), IQ4_XS);
        assert_eq!(t(iq4, Role::Output), Q6_K);
        assert_eq!(t(iq4, Role::Embedding { tied: false }), IQ4_XS);
        assert_eq!(t(iq4, Role::Embedding { tied: true }), Q6_K);
    }
}
