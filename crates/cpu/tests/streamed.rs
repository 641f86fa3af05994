//! The streamed f64 reference against the in-memory f64 decoder: the same logits (bit for bit
//! in practice; at most 1e-9 apart relatively is required) for llama, qwen2 and qwen3, from
//! f32 tensors in memory and from GGUF files in every block format the reference reads a
//! range of rows from; and one layer held at a time.
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else at random,
//! and is printed so that a failure can be replayed.

mod common;

use common::{random_decoder, tiny_config, to_gguf_layout, Filler};
use quench_cpu::{CpuError, Decoder, Logits, Matrix, StreamProgress, StreamedReference};
use quench_models::arch::{
    Arch, ArchError, Llama3Scaling, MemorySource, ModelConfig, Naming, RopeStyle, TensorSource,
};
use quench_models::gguf::GgufWriter;
use quench_models::{dequant, quant, GgmlType, GgufFile};
use quench_testkit::seed;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DECODERS: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3];

/// The in-memory f64 decoder's teacher-forced logits at every position.
fn decoder_logits(
    config: &ModelConfig,
    src: &dyn TensorSource,
    naming: Naming,
    tokens: &[u32],
) -> Matrix<f64> {
    let model = Decoder::<f64>::load(config.clone(), src, naming).unwrap();
    model
        .forward(&mut model.new_cache(), tokens, Logits::All)
        .unwrap()
}

/// Every element of `got` within 1e-9 of `want` relatively; returns how many are bit-equal.
fn assert_close(what: &str, want: &[f64], got: &[f64]) -> usize {
    assert_eq!(want.len(), got.len(), "{what}: lengths");
    let mut equal = 0;
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        assert!(
            (w - g).abs() <= 1e-9 * w.abs(),
            "{what}: element {i}: streamed {g} vs decoder {w}"
        );
        equal += usize::from(w.to_bits() == g.to_bits());
    }
    equal
}

/// The streamed logits at `from..tokens.len()` against the decoder's rows there, with the
/// output projection read `chunk` rows at a time.
fn compare(
    what: &str,
    config: &ModelConfig,
    src: &dyn TensorSource,
    naming: Naming,
    tokens: &[u32],
    from: usize,
    chunk: usize,
) {
    let want = decoder_logits(config, src, naming, tokens);
    let reference = StreamedReference::new(config.clone(), src, naming)
        .unwrap()
        .with_head_chunk_rows(chunk);
    let got = reference
        .logits(tokens, from..tokens.len(), &mut |_| {})
        .unwrap();
    assert_eq!(
        (got.logits.rows(), got.logits.cols()),
        (tokens.len() - from, config.vocab)
    );
    let mut equal = 0;
    for t in from..tokens.len() {
        let got_row = got.logits.row(t - from);
        equal += assert_close(&format!("{what}, position {t}"), want.row(t), got_row);
    }
    eprintln!(
        "{what}: {equal} of {} logits bit-equal",
        got.logits.as_slice().len()
    );
    // The logits must spread for the comparison to mean something.
    let spread = want.as_slice().iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(spread > 1.0, "{what}: logits only reach {spread}");
}

#[test]
fn streamed_logits_are_the_decoders_from_f32_tensors() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    for arch in DECODERS {
        let mut config = tiny_config(arch);
        if arch == Arch::Llama {
            config.rope_scaling = Some(Llama3Scaling {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_positions: 16,
            });
            config.rope_theta = 500.0;
        }
        let src = random_decoder(&config, rng.gen());
        let tokens = Filler::new(rng.gen()).tokens(23, config.vocab);
        // Chunks of 7 rows leave a remainder of 5 of the 61 vocabulary rows.
        compare(
            &format!("{arch:?}"),
            &config,
            &src,
            Naming::HuggingFace,
            &tokens,
            9,
            7,
        );
        // The default chunk (the whole vocabulary here) and a single position.
        compare(
            &format!("{arch:?}, last position"),
            &config,
            &src,
            Naming::HuggingFace,
            &tokens,
            22,
            usize::MAX,
        );
    }
}

/// `n` random bytes of `ggml_type` blocks with finite scales of moderate size: the f16 scales
/// at `scale_at` (byte offsets within a block) are set to values in ±`scale`.
fn random_blocks(rng: &mut ChaCha8Rng, ggml_type: GgmlType, n: usize, scale: f32) -> Vec<u8> {
    let scale_at: &[usize] = match ggml_type {
        GgmlType::Q4_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        other => panic!("no random blocks of {other}"),
    };
    let block = ggml_type.type_size() as usize;
    let mut bytes: Vec<u8> = (0..ggml_type.bytes_for(n as u64).unwrap())
        .map(|_| rng.gen())
        .collect();
    for b in bytes.chunks_exact_mut(block) {
        for &at in scale_at {
            let v = dequant::f32_to_f16(rng.gen_range(-scale..scale));
            b[at..at + 2].copy_from_slice(&v.to_le_bytes());
        }
    }
    bytes
}

/// A GGUF image of `src` (already in GGUF layout and names) with matrices stored in `types`,
/// one after another, and vectors in f32.
fn gguf_file(src: &MemorySource, types: &[GgmlType], rng: &mut ChaCha8Rng) -> GgufFile {
    let mut names: Vec<&str> = src.names().collect();
    names.sort();
    let mut tensors = vec![];
    let mut next = types.iter().cycle();
    for name in names {
        let (dims, data) = src.get(name).unwrap();
        let ty = if dims.len() == 2 {
            *next.next().unwrap()
        } else {
            GgmlType::F32
        };
        let bytes = match ty {
            GgmlType::Q4_1 => random_blocks(rng, ty, data.len(), 0.02),
            GgmlType::Q6_K => random_blocks(rng, ty, data.len(), 0.0004),
            _ => quant::quantize(ty, &data).unwrap(),
        };
        let ggml_dims: Vec<u64> = dims.iter().rev().map(|&d| d as u64).collect();
        tensors.push((name.to_owned(), ggml_dims, ty, bytes));
    }
    let mut w = GgufWriter::new();
    for (name, dims, ty, bytes) in &tensors {
        w.add_tensor(name, dims, *ty, bytes).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

/// A decoder whose every matrix is a whole number of 256-element blocks per row.
fn block_config(arch: Arch) -> ModelConfig {
    ModelConfig {
        hidden: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ffn: 256,
        vocab: 75,
        ..tiny_config(arch)
    }
}

#[test]
fn streamed_logits_are_the_decoders_from_gguf_blocks() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let formats = [
        GgmlType::Q6_K,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
        GgmlType::BF16,
        GgmlType::F16,
        GgmlType::F32,
    ];
    for (i, arch) in DECODERS.into_iter().enumerate() {
        let config = block_config(arch);
        let permuted = arch == Arch::Llama;
        let mut gguf = to_gguf_layout(&random_decoder(&config, rng.gen()), &config, permuted);
        let mut gguf_config = config.clone();
        if permuted {
            gguf_config.rope_style = RopeStyle::Adjacent;
            // GGUF's precomputed Llama 3 divisors of the RoPE frequencies.
            let divisors = (0..config.head_dim / 2)
                .map(|j| 1.0 + j as f32 / 4.0)
                .collect();
            gguf.insert("rope_freqs.weight", vec![config.head_dim / 2], divisors)
                .unwrap();
        }
        // Each model starts its matrices at another format, so that over the three the
        // embedding and the output projection come in several.
        let types: Vec<GgmlType> = formats
            .iter()
            .cycle()
            .skip(3 * i)
            .take(8)
            .copied()
            .collect();
        let file = gguf_file(&gguf, &types, &mut rng);
        let tokens = Filler::new(rng.gen()).tokens(19, config.vocab);
        compare(
            &format!("{arch:?} GGUF"),
            &gguf_config,
            &file,
            Naming::Gguf,
            &tokens,
            4,
            11,
        );
    }
}

/// The f64 bytes of one layer of `c`, counted from the shapes.
fn layer_bytes(c: &ModelConfig) -> usize {
    let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    let matrices = c.hidden * (2 * q + 2 * kv + 3 * c.ffn);
    let bias = if c.qkv_bias { q + 2 * kv } else { 0 };
    let qk_norm = if c.qk_norm { 2 * c.head_dim } else { 0 };
    8 * (matrices + 2 * c.hidden + bias + qk_norm)
}

#[test]
fn a_pass_holds_one_layer_at_a_time_and_reports_its_progress() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    for arch in DECODERS {
        let config = ModelConfig {
            layers: 4,
            ..tiny_config(arch)
        };
        let src = random_decoder(&config, rng.gen());
        let tokens = Filler::new(rng.gen()).tokens(10, config.vocab);
        let chunk = 5;
        let reference = StreamedReference::new(config.clone(), &src, Naming::HuggingFace)
            .unwrap()
            .with_head_chunk_rows(chunk);
        let mut heard = vec![];
        let out = reference
            .logits(&tokens, 0..10, &mut |p| heard.push(p))
            .unwrap();
        let s = &out.stats;
        assert_eq!(s.peak_layers, 1, "{arch:?}");
        // One layer is larger than a chunk of 5 rows here, so the peak is one layer.
        assert!(chunk * config.hidden * 8 < layer_bytes(&config));
        assert_eq!(s.peak_weight_bytes, layer_bytes(&config), "{arch:?}");
        assert_eq!((s.tokens, s.positions), (10, 10));
        assert!(s.peak_host_bytes() > s.peak_weight_bytes + s.activation_bytes);

        let mut want: Vec<StreamProgress> = (1..=4)
            .map(|done| StreamProgress::Layer { done, of: 4 })
            .collect();
        want.extend((1..=13).map(|k| StreamProgress::Head {
            done: (5 * k).min(61),
            of: 61,
        }));
        assert_eq!(heard, want, "{arch:?}");
    }
}

#[test]
fn bad_requests_are_refused_by_name() {
    let config = tiny_config(Arch::Qwen3);
    let mut src = random_decoder(&config, seed());
    let reference = StreamedReference::new(config.clone(), &src, Naming::HuggingFace).unwrap();
    let none = &mut |_| {};
    let err = reference.logits(&[1, 2, 3], 1..4, none).unwrap_err();
    assert_eq!(
        err.to_string(),
        "positions 1..4 are not a non-empty range within the 3 tokens fed"
    );
    assert!(matches!(
        reference.logits(&[1, 2, 3], 2..2, none),
        Err(CpuError::Positions { .. })
    ));
    assert!(matches!(
        reference.logits(&[], 0..0, none),
        Err(CpuError::NoTokens)
    ));
    assert!(matches!(
        reference.logits(&[1, 61], 0..2, none),
        Err(CpuError::TokenOutOfRange {
            token: 61,
            vocab: 61
        })
    ));
    let long = vec![1; config.max_positions + 1];
    assert!(matches!(
        reference.logits(&long, 0..1, none),
        Err(CpuError::ContextOverflow { limit: 40, .. })
    ));

    let (dims, data) = src.remove("model.layers.1.mlp.up_proj.weight").unwrap();
    let reference = StreamedReference::new(config.clone(), &src, Naming::HuggingFace).unwrap();
    let err = reference.logits(&[1, 2], 0..2, none).unwrap_err();
    assert!(
        matches!(&err, CpuError::Model(ArchError::MissingTensor { name }) if name == "model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );
    src.insert(
        "model.layers.1.mlp.up_proj.weight",
        vec![dims[0] - 1, dims[1]],
        data[dims[1]..].to_vec(),
    )
    .unwrap();
    let reference = StreamedReference::new(config, &src, Naming::HuggingFace).unwrap();
    let err = reference.logits(&[1, 2], 0..2, none).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor model.layers.1.mlp.up_proj.weight has shape [47, 32], but this model needs \
         [48, 32]"
    );
}

#[test]
fn a_changed_token_changes_the_streamed_logits_after_it_only() {
    let config = tiny_config(Arch::Llama);
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let src = random_decoder(&config, rng.gen());
    let mut tokens = Filler::new(rng.gen()).tokens(12, config.vocab);
    let reference = StreamedReference::new(config.clone(), &src, Naming::HuggingFace).unwrap();
    let a = reference.logits(&tokens, 0..12, &mut |_| {}).unwrap();
    tokens[7] = (tokens[7] + 1) % config.vocab as u32;
    let b = reference.logits(&tokens, 0..12, &mut |_| {}).unwrap();
    for t in 0..7 {
        assert_eq!(a.logits.row(t), b.logits.row(t), "position {t} changed");
    }
    for t in 7..12 {
        let moved = a
            .logits
            .row(t)
            .iter()
            .zip(b.logits.row(t))
            .map(|(x, y)| (x - y).abs() / x.abs().max(1.0))
            .fold(0.0, f64::max);
        assert!(moved > 1e-6, "position {t} moved only {moved}");
    }
}

#[test]
fn smollm2_streamed_logits_are_the_decoders() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    let tokens = Filler::new(seed()).tokens(40, config.vocab);
    compare("SmolLM2", &config, &file, Naming::Gguf, &tokens, 20, 10_000);
}
