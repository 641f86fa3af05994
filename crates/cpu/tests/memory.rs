//! What an f32 decoder holds in memory: a GGUF file of k-quant matrices, memory-mapped,
//! runs with its weights held once — the mapping's pages, multiplied as stored — not
//! copied. Measured on this process (Linux's peak resident set, reset before the load):
//! loading a ~40 MiB Q4_K/Q6_K file and decoding a token (which reads every weight) adds at
//! most 1.2× the file's size at the peak, and at least half of it (the measure sees the
//! weights).
//!
//! One test in its own binary, so that nothing else runs in the process while it measures.

use std::fs;

use quench_cpu::{Decoder, Logits};
use quench_models::arch::{
    Arch, DecoderLayerTensor as L, DecoderTensor, ModelConfig, Naming, RopeStyle,
};
use quench_models::gguf::GgufWriter;
use quench_models::{dequant, GgmlType, GgufFile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A llama of 4 layers, width 1024, FFN 4096, a vocabulary of 4096.
fn config() -> ModelConfig {
    ModelConfig {
        arch: Arch::Llama,
        hidden: 1024,
        layers: 4,
        heads: 8,
        kv_heads: 8,
        head_dim: 128,
        ffn: 4096,
        vocab: 4096,
        max_positions: 64,
        norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        rope_style: RopeStyle::Adjacent,
        tied_embeddings: false,
        qkv_bias: false,
        qk_norm: false,
        type_vocab: 0,
    }
}

/// Random blocks of `ty` for `n` elements, their f16 scales (`d`, and Q4_K's `dmin`) small.
fn blocks(rng: &mut ChaCha8Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let scales: &[usize] = match ty {
        GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        other => panic!("no random blocks of {other}"),
    };
    let size = ty.type_size() as usize;
    let mut bytes: Vec<u8> = (0..ty.bytes_for(n as u64).expect("whole blocks"))
        .map(|_| rng.gen())
        .collect();
    for b in bytes.chunks_exact_mut(size) {
        for &at in scales {
            let v = dequant::f32_to_f16(rng.gen_range(-1e-3..1e-3));
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

/// The model as a GGUF image: Q4_K matrices and table, a Q6_K head, f32 norms.
fn image(c: &ModelConfig, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut tensors = vec![];
    let mut add = |t: DecoderTensor, ty: GgmlType, dims: &[usize], rng: &mut ChaCha8Rng| {
        let n: usize = dims.iter().product();
        let bytes = match ty {
            GgmlType::F32 => (0..n).flat_map(|_| 1f32.to_le_bytes()).collect(),
            _ => blocks(rng, ty, n),
        };
        let ggml_dims: Vec<u64> = dims.iter().rev().map(|&d| d as u64).collect();
        tensors.push((
            t.name(Naming::Gguf).expect("a GGUF name"),
            ggml_dims,
            ty,
            bytes,
        ));
    };
    let (h, q) = (c.hidden, c.heads * c.head_dim);
    let kv = c.kv_heads * c.head_dim;
    add(
        DecoderTensor::TokenEmbedding,
        GgmlType::Q4_K,
        &[c.vocab, h],
        rng,
    );
    add(DecoderTensor::Output, GgmlType::Q6_K, &[c.vocab, h], rng);
    add(DecoderTensor::OutputNorm, GgmlType::F32, &[h], rng);
    for l in 0..c.layers {
        let t = |t| DecoderTensor::Layer(l, t);
        add(t(L::AttnNorm), GgmlType::F32, &[h], rng);
        add(t(L::FfnNorm), GgmlType::F32, &[h], rng);
        add(t(L::Q), GgmlType::Q4_K, &[q, h], rng);
        add(t(L::K), GgmlType::Q4_K, &[kv, h], rng);
        add(t(L::V), GgmlType::Q4_K, &[kv, h], rng);
        add(t(L::AttnOutput), GgmlType::Q4_K, &[h, q], rng);
        add(t(L::Gate), GgmlType::Q4_K, &[c.ffn, h], rng);
        add(t(L::Up), GgmlType::Q4_K, &[c.ffn, h], rng);
        add(t(L::Down), GgmlType::Q4_K, &[h, c.ffn], rng);
    }
    let mut w = GgufWriter::new();
    for (name, dims, ty, bytes) in &tensors {
        w.add_tensor(name, dims, *ty, bytes).expect("a tensor");
    }
    w.to_bytes()
}

/// A field of /proc/self/status, in bytes.
fn status(field: &str) -> u64 {
    let s = fs::read_to_string("/proc/self/status").expect("/proc/self/status (Linux)");
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    kib * 1024
}

/// Resets the peak resident set (VmHWM) to the current one.
fn reset_peak() {
    fs::write("/proc/self/clear_refs", "5")
        .expect("resetting the peak RSS (/proc/self/clear_refs)");
}

#[test]
fn a_mapped_k_quant_file_is_held_once() {
    let c = config();
    let path = std::env::temp_dir().join(format!("quench-memory-{}.gguf", std::process::id()));
    let file_bytes = {
        let mut rng = ChaCha8Rng::seed_from_u64(quench_testkit::seed());
        let image = image(&c, &mut rng);
        fs::write(&path, &image).expect("writing the GGUF file");
        image.len() as u64
    };
    let before = status("VmRSS:");
    reset_peak();
    let file = GgufFile::open(&path).expect("a GGUF file");
    let decoder = Decoder::<f32>::load(c, &file, Naming::Gguf).expect("loads");
    let logits = decoder
        .forward(&mut decoder.new_cache(), &[1, 2], Logits::Last)
        .expect("a step");
    assert!(logits.as_slice().iter().all(|v| v.is_finite()));
    let peak = status("VmHWM:") - before;
    let _ = fs::remove_file(&path);
    let ratio = peak as f64 / file_bytes as f64;
    eprintln!(
        "file {:.1} MiB, peak resident growth {:.1} MiB ({ratio:.2}× the file); decoder holds {:.1} MiB",
        file_bytes as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        decoder.weight_bytes() as f64 / 1048576.0
    );
    assert!(ratio >= 0.5, "the measure missed the weights: {ratio:.2}×");
    assert!(ratio <= 1.2, "peak resident growth {ratio:.2}× the file");
}
