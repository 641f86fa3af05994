//! The f32 decoder on a GGUF file whose projections are Q4_1 and whose tied token embedding
//! is Q8_0 (the layout of SmolLM2's Q4_1 file) keeps those weights as blocks; its logits,
//! in prefill and in decoding, must pass the fp64 check against the f64 decoder, which
//! expands every weight exactly.
//!
//! With [`Arithmetic::GgmlRounding`] (llama.cpp's roundings: 8-bit activation blocks, f16 keys
//! and values) the same model's logits move by the scale of those roundings: they must differ
//! from the plain f32 ones and stay within that scale of f64.

mod common;

use common::{logit_violations, random_decoder, to_gguf_layout, Filler};
use quench_cpu::{Arithmetic, CpuError, Decoder, GgmlKernels, Logits, Matrix};
use quench_models::arch::{Arch, MemorySource, ModelConfig, Naming, RopeStyle, TensorSource};
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

/// The checkpoint's tensors as stored: 2-D weights in block formats (`f16_tensor` in F16),
/// vectors in f32.
fn stored_tensors(
    src: &MemorySource,
    f16_tensor: Option<&str>,
) -> Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> {
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
                _ if f16_tensor == Some(name) => {
                    (GgmlType::F16, quantize(GgmlType::F16, &data).expect("F16"))
                }
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
fn gguf_image(src: &MemorySource, c: &ModelConfig, f16_tensor: Option<&str>) -> Vec<u8> {
    let tensors = stored_tensors(src, f16_tensor);
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
    let file = GgufFile::from_bytes(gguf_image(&to_gguf_layout(&hf, &c, true), &c, None)).unwrap();
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

/// Largest `|got − want|` and how many elements of `got` differ from `other`.
fn spread(want: &Matrix<f64>, got: &Matrix<f32>, other: &Matrix<f32>) -> (f64, usize) {
    let worst = want
        .as_slice()
        .iter()
        .zip(got.as_slice())
        .map(|(w, g)| (f64::from(*g) - w).abs())
        .fold(0.0, f64::max);
    let differ = got
        .as_slice()
        .iter()
        .zip(other.as_slice())
        .filter(|(a, b)| a != b)
        .count();
    (worst, differ)
}

#[test]
fn ggml_rounding_differs_from_f32_by_the_scale_of_its_roundings() {
    let c = config();
    let hf = random_decoder(&c, 4200);
    let file = GgufFile::from_bytes(gguf_image(&to_gguf_layout(&hf, &c, true), &c, None)).unwrap();
    let read = ModelConfig::from_gguf(&file).unwrap();
    let plain = Decoder::<f32>::load(read.clone(), &file, Naming::Gguf).unwrap();
    let ggml = Decoder::<f32>::load_with_arithmetic(
        read.clone(),
        &file,
        Naming::Gguf,
        Arithmetic::GgmlRounding(GgmlKernels::Avx2),
    )
    .unwrap();
    assert_eq!(
        (plain.arithmetic(), ggml.arithmetic()),
        (Arithmetic::F32, Arithmetic::GgmlRounding(GgmlKernels::Avx2))
    );
    let reference = Decoder::<f64>::load(read, &file, Naming::Gguf).unwrap();
    let tokens = Filler::new(4201).tokens(16, c.vocab);
    let want = reference
        .forward(&mut reference.new_cache(), &tokens, Logits::All)
        .unwrap();
    let run = |d: &Decoder<f32>| {
        let mut got = Matrix::from_vec(
            tokens.len(),
            c.vocab,
            vec![f32::NAN; tokens.len() * c.vocab],
        )
        .unwrap();
        let mut cache = d.new_cache();
        // A prompt of 6, then one token at a time: both of ggml's summation orders.
        let prompt = d.forward(&mut cache, &tokens[..6], Logits::All).unwrap();
        got.as_mut_slice()[..6 * c.vocab].copy_from_slice(prompt.as_slice());
        for t in 6..tokens.len() {
            let step = d
                .forward(&mut cache, &tokens[t..t + 1], Logits::Last)
                .unwrap();
            got.row_mut(t).copy_from_slice(step.row(0));
        }
        got
    };
    let (f32_logits, ggml_logits) = (run(&plain), run(&ggml));
    check("f32", &want, &f32_logits);
    let (worst_f32, _) = spread(&want, &f32_logits, &ggml_logits);
    let (worst_ggml, differ) = spread(&want, &ggml_logits, &f32_logits);
    eprintln!(
        "largest distance to f64: f32 {worst_f32:.2e}, ggml rounding {worst_ggml:.2e}; {differ} of \
         {} logits differ between the two",
        ggml_logits.as_slice().len()
    );
    // 8-bit activations (≤ 1/254 of a block's largest value each) over a few layers: tenths
    // at most for logits of a few units, and well above the f32 path's distance.
    assert!(worst_ggml < 0.5, "ggml rounding {worst_ggml} from f64");
    assert!(
        worst_ggml > 4.0 * worst_f32,
        "ggml rounding {worst_ggml}, f32 {worst_f32}"
    );
    assert!(
        differ > ggml_logits.as_slice().len() * 9 / 10,
        "only {differ} logits differ from the f32 path's"
    );
}

#[test]
fn ggml_rounding_refuses_weights_it_cannot_round_as_llama_cpp() {
    let c = config();
    let hf = random_decoder(&c, 4300);
    let gguf = to_gguf_layout(&hf, &c, true);
    let half = "blk.1.ffn_up.weight";
    let file = GgufFile::from_bytes(gguf_image(&gguf, &c, Some(half))).unwrap();
    let read = ModelConfig::from_gguf(&file).unwrap();
    // The plain f32 decoder takes the F16 weight (expanded).
    Decoder::<f32>::load(read.clone(), &file, Naming::Gguf).unwrap();
    let refused = |src: &dyn TensorSource| match Decoder::<f32>::load_with_arithmetic(
        read.clone(),
        src,
        Naming::Gguf,
        Arithmetic::GgmlRounding(GgmlKernels::Avx2),
    ) {
        Err(e @ CpuError::GgmlRounding { .. }) => e.to_string(),
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("accepted"),
    };
    let message = refused(&file);
    assert!(
        message.contains(half) && message.contains("F16"),
        "{message}"
    );
    // Tensors without a stored type (here, in memory) are refused too.
    let message = refused(&gguf);
    assert!(message.contains("has no stored ggml type"), "{message}");
}
