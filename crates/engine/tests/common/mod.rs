//! What the engine's GPU tests share: a fresh seed per run, tiny decoders with seeded
//! random weights written as GGUF images (any layer formats, biases for qwen2, q/k norms
//! for qwen3), a model's decode step graph, and logits as bits.
#![allow(dead_code)] // each test binary uses its own part

use quench_engine::gpu::{Catalog, DecodeGraph, StepShape};
use quench_kernels::data::ggml_rows;
use quench_models::arch::{ModelConfig, Naming};
use quench_models::gguf::{GgufWriter, MetadataValue};
use quench_models::{GgmlType, GgufFile};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The seed of a test's random inputs, printed (`QUENCH_SEED` replays one).
pub use quench_testkit::seed;

/// The formats of one layer's matrices.
#[derive(Clone, Copy, Debug)]
pub struct LayerFormats {
    pub q: GgmlType,
    pub k: GgmlType,
    pub v: GgmlType,
    pub o: GgmlType,
    pub gate_up: GgmlType,
    pub down: GgmlType,
}

/// Every matrix in bf16 (the tensor cores' format).
pub const BF16: LayerFormats = LayerFormats {
    q: GgmlType::BF16,
    k: GgmlType::BF16,
    v: GgmlType::BF16,
    o: GgmlType::BF16,
    gate_up: GgmlType::BF16,
    down: GgmlType::BF16,
};

/// Quantized: q|k|v in one Q8_0 product, the rest in the other GGUF block formats.
pub const QUANTIZED: LayerFormats = LayerFormats {
    q: GgmlType::Q8_0,
    k: GgmlType::Q8_0,
    v: GgmlType::Q8_0,
    o: GgmlType::Q4_0,
    gate_up: GgmlType::Q4_1,
    down: GgmlType::Q4_K,
};

/// Layers of every GGUF block type no kernel reads as stored: Q5_0, Q5_1 and the
/// i-quants, each matrix expanded to f16 as it is uploaded.
pub const WIDENED_TYPES: [LayerFormats; 3] = [
    LayerFormats {
        q: GgmlType::Q5_1,
        k: GgmlType::IQ3_XXS,
        v: GgmlType::Q5_0,
        o: GgmlType::Q5_1,
        gate_up: GgmlType::IQ4_NL,
        down: GgmlType::IQ4_XS,
    },
    LayerFormats {
        q: GgmlType::IQ3_XXS,
        k: GgmlType::IQ3_S,
        v: GgmlType::IQ2_XXS,
        o: GgmlType::IQ2_XS,
        gate_up: GgmlType::IQ2_S,
        down: GgmlType::IQ1_S,
    },
    LayerFormats {
        q: GgmlType::IQ1_M,
        k: GgmlType::IQ1_M,
        v: GgmlType::IQ1_M,
        o: GgmlType::Q4_K,
        gate_up: GgmlType::IQ3_S,
        down: GgmlType::IQ4_XS,
    },
];

/// The type mix of llama.cpp's Q4_K_M: Q4_K matrices (and token embedding), Q6_K for v,
/// down (and the LM head); on the GPU q, k and v then take three projections.
pub const Q4_K_M: LayerFormats = LayerFormats {
    q: GgmlType::Q4_K,
    k: GgmlType::Q4_K,
    v: GgmlType::Q6_K,
    o: GgmlType::Q4_K,
    gate_up: GgmlType::Q4_K,
    down: GgmlType::Q6_K,
};

/// The type mix of llama.cpp's Q3_K_M in a layer past the first two: Q3_K matrices, Q4_K
/// for v, the output projection and down.
pub const Q3_K_M: LayerFormats = LayerFormats {
    q: GgmlType::Q3_K,
    k: GgmlType::Q3_K,
    v: GgmlType::Q4_K,
    o: GgmlType::Q4_K,
    gate_up: GgmlType::Q3_K,
    down: GgmlType::Q4_K,
};

/// The type mix of llama.cpp's Q5_K_M: [`Q4_K_M`] with Q5_K in place of Q4_K.
pub const Q5_K_M: LayerFormats = LayerFormats {
    q: GgmlType::Q5_K,
    k: GgmlType::Q5_K,
    o: GgmlType::Q5_K,
    gate_up: GgmlType::Q5_K,
    ..Q4_K_M
};

/// The sizes of a tiny decoder.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// The trained context the metadata states.
    pub context: u32,
    pub eps: f32,
}

/// A tiny decoder: `arch` is llama, qwen2 (q/k/v biases) or qwen3 (q/k norms).
#[derive(Clone, Debug)]
pub struct Tiny {
    pub arch: &'static str,
    pub shape: Shape,
    pub layers: Vec<LayerFormats>,
    pub embedding: GgmlType,
    /// `None`: tied to the embedding.
    pub output: Option<GgmlType>,
}

/// Scale magnitudes (floats: values) for weights of root-mean-square about
/// `gain / sqrt(cols)`: random quants times a scale have these spreads per unit scale.
fn weight_range(t: GgmlType, cols: usize, gain: f32) -> (f32, f32) {
    let per_scale = match t {
        GgmlType::Q8_0 => 74.0,
        GgmlType::Q4_0 => 4.6,
        GgmlType::Q4_1 => 9.0,
        GgmlType::Q4_K => 317.0,
        GgmlType::Q5_K => 636.0,
        GgmlType::Q6_K => 1350.0,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1.0,
        other => measured_spread(other),
    };
    let hi = gain / (cols as f32).sqrt() / per_scale / 0.6;
    (hi / 8.0, hi)
}

/// The root-mean-square of random blocks of `t` at unit scale, measured.
fn measured_spread(t: GgmlType) -> f32 {
    use rand::SeedableRng;
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let n = 64 * 256;
    let bytes = ggml_rows(&mut rng, t, 1, n, 1.0, 1.0);
    // A type quench does not read (for refusal tests) gets unit spread.
    let Ok(v) = quench_models::dequant::dequantize(t, &bytes, n) else {
        return 1.0;
    };
    let mean_square = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / n as f64;
    mean_square.sqrt() as f32
}

/// The model's GGUF image. Every matrix has full gain: logits of a few units, which with
/// f32 activations and an f16 KV cache stay within ~2e-3 of the f64 reference.
pub fn gguf(m: &Tiny, rng: &mut ChaCha8Rng) -> GgufFile {
    let (a, s) = (m.arch, m.shape);
    let mut tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = vec![];
    let mut matrix = |name: String, t: GgmlType, rows: usize, cols: usize, rng: &mut ChaCha8Rng| {
        let (lo, hi) = weight_range(t, cols, 1.0);
        let bytes = ggml_rows(rng, t, rows, cols, lo, hi);
        tensors.push((name, vec![cols as u64, rows as u64], t, bytes));
    };
    let (qw, kvw) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    matrix(
        "token_embd.weight".into(),
        m.embedding,
        s.vocab,
        s.hidden,
        rng,
    );
    if let Some(t) = m.output {
        matrix("output.weight".into(), t, s.vocab, s.hidden, rng);
    }
    for (l, f) in m.layers.iter().enumerate() {
        let n = |x: &str| format!("blk.{l}.{x}");
        matrix(n("attn_q.weight"), f.q, qw, s.hidden, rng);
        matrix(n("attn_k.weight"), f.k, kvw, s.hidden, rng);
        matrix(n("attn_v.weight"), f.v, kvw, s.hidden, rng);
        matrix(n("attn_output.weight"), f.o, s.hidden, qw, rng);
        matrix(n("ffn_gate.weight"), f.gate_up, s.ffn, s.hidden, rng);
        matrix(n("ffn_up.weight"), f.gate_up, s.ffn, s.hidden, rng);
        matrix(n("ffn_down.weight"), f.down, s.hidden, s.ffn, rng);
    }
    let mut vector = |name: String, len: usize, lo: f32, hi: f32, rng: &mut ChaCha8Rng| {
        let bytes = (0..len)
            .flat_map(|_| rng.gen_range(lo..hi).to_le_bytes())
            .collect();
        tensors.push((name, vec![len as u64], GgmlType::F32, bytes));
    };
    vector("output_norm.weight".into(), s.hidden, 0.5, 1.5, rng);
    for l in 0..m.layers.len() {
        let n = |x: &str| format!("blk.{l}.{x}");
        vector(n("attn_norm.weight"), s.hidden, 0.5, 1.5, rng);
        vector(n("ffn_norm.weight"), s.hidden, 0.5, 1.5, rng);
        if a == "qwen2" {
            vector(n("attn_q.bias"), qw, -0.5, 0.5, rng);
            vector(n("attn_k.bias"), kvw, -0.5, 0.5, rng);
            vector(n("attn_v.bias"), kvw, -0.5, 0.5, rng);
        }
        if a == "qwen3" {
            vector(n("attn_q_norm.weight"), s.head_dim, 0.5, 1.5, rng);
            vector(n("attn_k_norm.weight"), s.head_dim, 0.5, 1.5, rng);
        }
    }
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{a}.{k}");
    let u32_of = |n: usize| MetadataValue::U32(n as u32);
    let meta = [
        (
            "general.architecture".to_string(),
            MetadataValue::String(a.into()),
        ),
        (key("embedding_length"), u32_of(s.hidden)),
        (key("block_count"), u32_of(m.layers.len())),
        (key("feed_forward_length"), u32_of(s.ffn)),
        (key("attention.head_count"), u32_of(s.heads)),
        (key("attention.head_count_kv"), u32_of(s.kv_heads)),
        (key("attention.key_length"), u32_of(s.head_dim)),
        (key("context_length"), MetadataValue::U32(s.context)),
        (
            key("attention.layer_norm_rms_epsilon"),
            MetadataValue::F32(s.eps),
        ),
        (key("rope.freq_base"), MetadataValue::F32(10000.0)),
        (key("vocab_size"), u32_of(s.vocab)),
    ];
    for (k, v) in meta {
        w.add_metadata(&k, v).expect("metadata");
    }
    for (name, dims, t, bytes) in &tensors {
        w.add_tensor(name, dims, *t, bytes).expect("tensor");
    }
    GgufFile::from_bytes(w.to_bytes()).expect("a GGUF image")
}

/// The model's config, its kernel catalog and its decode step graph for `shape`.
pub fn step_graph(file: &GgufFile, shape: StepShape) -> (ModelConfig, Catalog, DecodeGraph) {
    let config = ModelConfig::from_gguf(file).expect("a config");
    let catalog = Catalog::choose(&config, file, Naming::Gguf).expect("kernels");
    let graph =
        DecodeGraph::assemble(&config, &catalog, file, Naming::Gguf, shape).expect("a step");
    (config, catalog, graph)
}

/// Logits as bits, to compare them exactly.
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}
