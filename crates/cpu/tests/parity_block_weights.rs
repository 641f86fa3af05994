//! The f32 decoder on a GGUF file whose projections are Q4_1 and whose tied token embedding
//! is Q8_0 (the layout of SmolLM2's Q4_1 file) keeps those weights as blocks; its logits,
//! in prefill and in decoding, must pass the fp64 check against the f64 decoder, which
//! expands every weight exactly.

mod common;

use common::{logit_violations, random_decoder, to_gguf_layout, Filler};
use quench_cpu::{
    Arch, Decoder, Logits, Matrix, MemorySource, ModelConfig, Naming, RopeStyle, TensorSource,
};
use quench_models::dequant::f32_to_f16;
use quench_models::gguf::{GgufWriter, MetadataArray, MetadataValue};
use quench_models::quant::quantize;
use quench_models::{GgmlType, GgufFile};

/// A llama model whose every matrix width is a whole number of 32-element blocks.
fn config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        ffn: 96,
        vocab: 67,
        max_positions: 40,
        norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_style: RopeStyle::HalfSplit,
        tied_embeddings: true,
        qkv_bias: false,
        qk_norm: false,
        type_vocab: 2,
    }
}

/// Q4_1 as llama.cpp's reference quantizer does it: per block, `m` the minimum and
/// `d = (max − min)/15`, `q = round((x − m)/d)`.
fn quantize_q4_1(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks_exact(32) {
        let min = block.iter().copied().fold(f32::INFINITY, f32::min);
        let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let d = (max - min) / 15.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f32_to_f16(d).to_le_bytes());
        out.extend(f32_to_f16(min).to_le_bytes());
        let q = |v: f32| ((v - min) * inv).round().clamp(0.0, 15.0) as u8;
        out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
    }
    out
}

/// The checkpoint's tensors as stored: 2-D weights in block formats, vectors in f32.
fn stored_tensors(src: &MemorySource) -> Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> {
    let mut names: Vec<&str> = src.names().collect();
    names.sort_unstable();
    names
        .into_iter()
        .map(|name| {
            let (dims, data) = src.get(name).expect("tensor");
            let ggml_dims: Vec<u64> = dims.iter().rev().map(|&d| d as u64).collect();
            let (ty, bytes) = match (dims.len(), name) {
                (1, _) => (
                    GgmlType::F32,
                    data.iter().flat_map(|v| v.to_le_bytes()).collect(),
                ),
                (_, "token_embd.weight") => (
                    GgmlType::Q8_0,
                    quantize(GgmlType::Q8_0, &data).expect("Q8_0"),
                ),
                _ => (GgmlType::Q4_1, quantize_q4_1(&data)),
            };
            (name.to_owned(), ggml_dims, ty, bytes)
        })
        .collect()
}

/// The checkpoint as a GGUF image of a llama model.
fn gguf_image(src: &MemorySource, c: &ModelConfig) -> Vec<u8> {
    let tensors = stored_tensors(src);
    let mut w = GgufWriter::new();
    let put = |w: &mut GgufWriter, k: &str, v: MetadataValue| {
        w.add_metadata(k, v).expect("metadata");
    };
    put(
        &mut w,
        "general.architecture",
        MetadataValue::String("llama".into()),
    );
    for (k, v) in [
        ("embedding_length", c.hidden),
        ("block_count", c.layers),
        ("attention.head_count", c.heads),
        ("attention.head_count_kv", c.kv_heads),
        ("feed_forward_length", c.ffn),
        ("context_length", c.max_positions),
    ] {
        put(&mut w, &format!("llama.{k}"), MetadataValue::U32(v as u32));
    }
    put(
        &mut w,
        "llama.attention.layer_norm_rms_epsilon",
        MetadataValue::F32(c.norm_eps as f32),
    );
    let vocab = (0..c.vocab).map(|i| format!("t{i}")).collect();
    put(
        &mut w,
        "tokenizer.ggml.tokens",
        MetadataValue::Array(MetadataArray::String(vocab)),
    );
    for (name, dims, ty, bytes) in &tensors {
        w.add_tensor(name, dims, *ty, bytes).expect("tensor");
    }
    w.to_bytes()
}

fn check(what: &str, want: &Matrix<f64>, got: &Matrix<f32>) {
    let (count, worst) = logit_violations(want, got);
    assert_eq!(
        count, 0,
        "{what}: {count} logits out of bound, worst by {worst}"
    );
}

#[test]
fn block_weights_pass_the_fp64_check_in_prefill_and_decode() {
    let c = config();
    let hf = random_decoder(&c, 4100);
    let file = GgufFile::from_bytes(gguf_image(&to_gguf_layout(&hf, &c, true), &c)).unwrap();
    let read = ModelConfig::from_gguf(&file).unwrap();
    for (name, ty) in [
        ("token_embd.weight", GgmlType::Q8_0),
        ("blk.1.ffn_down.weight", GgmlType::Q4_1),
    ] {
        assert_eq!(file.tensor(name).unwrap().ggml_type, ty, "{name}");
    }
    let fast = Decoder::<f32>::load(read.clone(), &file, Naming::Gguf).unwrap();
    let reference = Decoder::<f64>::load(read, &file, Naming::Gguf).unwrap();
    let tokens = Filler::new(4101).tokens(20, c.vocab);

    // Prefill: several tokens at once, every position's logits.
    let want = reference
        .forward(&mut reference.new_cache(), &tokens, Logits::All)
        .unwrap();
    let got = fast
        .forward(&mut fast.new_cache(), &tokens, Logits::All)
        .unwrap();
    check("prefill", &want, &got);

    // Decode: a prefix, then one token at a time.
    let mut cache = fast.new_cache();
    let prefix = 5;
    let first = fast
        .forward(&mut cache, &tokens[..prefix], Logits::Last)
        .unwrap();
    let row = |m: &Matrix<f64>, t: usize| Matrix::from_vec(1, c.vocab, m.row(t).to_vec()).unwrap();
    check("decode, prefix", &row(&want, prefix - 1), &first);
    for t in prefix..tokens.len() {
        let step = fast
            .forward(&mut cache, &tokens[t..t + 1], Logits::Last)
            .unwrap();
        check(&format!("decode step at {t}"), &row(&want, t), &step);
    }
}
