//! Models read through quench-models: GGUF files and Hugging Face checkpoints written in
//! memory or to a temporary directory from tiny random models.

mod common;

use common::{max_rel_diff, random_decoder, tiny_config, to_gguf_layout, Filler};
use quench_cpu::{Decoder, Logits};
use quench_models::arch::{
    Arch, ArchError, Llama3Scaling, MemorySource, ModelConfig, Naming, RopeStyle, TensorSource,
};
use quench_models::gguf::{GgufWriter, MetadataArray, MetadataValue};
use quench_models::safetensors::{Dtype, SafetensorsWriter};
use quench_models::{GgmlType, GgufFile, HfCheckpoint, HfConfig};

fn f32_bytes(data: &[f32]) -> Vec<u8> {
    data.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A GGUF image of `src` (already in GGUF layout) as llama.cpp would write it for `c`.
fn gguf_image(src: &MemorySource, c: &ModelConfig) -> Vec<u8> {
    let arch = c.arch.name();
    let tensors: Vec<(String, Vec<u64>, Vec<u8>)> = src
        .names()
        .map(|name| {
            let (dims, data) = src.get(name).unwrap();
            let ggml_dims = dims.iter().rev().map(|&d| d as u64).collect();
            (name.to_owned(), ggml_dims, f32_bytes(&data))
        })
        .collect();
    let mut w = GgufWriter::new();
    let u32_key = |w: &mut GgufWriter, k: &str, v: usize| {
        w.add_metadata(&format!("{arch}.{k}"), MetadataValue::U32(v as u32))
            .unwrap()
    };
    w.add_metadata("general.architecture", MetadataValue::String(arch.into()))
        .unwrap();
    u32_key(&mut w, "embedding_length", c.hidden);
    u32_key(&mut w, "block_count", c.layers);
    u32_key(&mut w, "attention.head_count", c.heads);
    u32_key(&mut w, "attention.head_count_kv", c.kv_heads);
    u32_key(&mut w, "attention.key_length", c.head_dim);
    u32_key(&mut w, "rope.dimension_count", c.head_dim);
    u32_key(&mut w, "feed_forward_length", c.ffn);
    u32_key(&mut w, "context_length", c.max_positions);
    for (k, v) in [
        ("rope.freq_base", c.rope_theta),
        ("attention.layer_norm_rms_epsilon", c.norm_eps),
    ] {
        w.add_metadata(&format!("{arch}.{k}"), MetadataValue::F32(v as f32))
            .unwrap();
    }
    let vocab = (0..c.vocab).map(|i| format!("t{i}")).collect();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        MetadataValue::Array(MetadataArray::String(vocab)),
    )
    .unwrap();
    for (name, dims, bytes) in &tensors {
        w.add_tensor(name, dims, GgmlType::F32, bytes).unwrap();
    }
    w.to_bytes()
}

#[test]
fn gguf_files_give_the_logits_of_the_hugging_face_layout() {
    for (i, arch) in [Arch::Llama, Arch::Qwen2, Arch::Qwen3]
        .into_iter()
        .enumerate()
    {
        let config = tiny_config(arch);
        let hf = random_decoder(&config, 2000 + i as u64);
        let gguf = to_gguf_layout(&hf, &config, arch == Arch::Llama);
        let file = GgufFile::from_bytes(gguf_image(&gguf, &config)).unwrap();

        let read = ModelConfig::from_gguf(&file).unwrap();
        let expected_style = match arch {
            Arch::Llama => RopeStyle::Adjacent,
            _ => RopeStyle::HalfSplit,
        };
        let want = ModelConfig {
            rope_style: expected_style,
            norm_eps: config.norm_eps as f32 as f64,
            ..config.clone()
        };
        assert_eq!(read, want, "{arch:?}");

        let tokens = Filler::new(2100 + i as u64).tokens(12, config.vocab);
        let run = |model: Decoder<f64>| {
            model
                .forward(&mut model.new_cache(), &tokens, Logits::All)
                .unwrap()
        };
        let reference = run(Decoder::load(config.clone(), &hf, Naming::HuggingFace).unwrap());
        let got = run(Decoder::load(read, &file, Naming::Gguf).unwrap());
        let d = max_rel_diff(reference.as_slice(), got.as_slice());
        // Only the f32 rounding of the stored epsilon separates the two.
        assert!(d < 1e-9, "{arch:?}: differs by {d}");
    }
}

#[test]
fn gguf_tensor_errors_name_the_tensor() {
    let config = tiny_config(Arch::Llama);
    let mut gguf = to_gguf_layout(&random_decoder(&config, 2200), &config, true);
    gguf.remove("blk.1.ffn_up.weight");
    let file = GgufFile::from_bytes(gguf_image(&gguf, &config)).unwrap();
    let err = Decoder::<f32>::load(ModelConfig::from_gguf(&file).unwrap(), &file, Naming::Gguf)
        .err()
        .unwrap();
    assert_eq!(err.to_string(), "tensor blk.1.ffn_up.weight not found");
}

#[test]
fn hugging_face_checkpoints_load_from_disk() {
    let config = tiny_config(Arch::Qwen2);
    let src = random_decoder(&config, 2300);
    let dir = std::env::temp_dir().join(format!("quench-cpu-hf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = format!(
        r#"{{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": {},
        "intermediate_size": {}, "num_hidden_layers": {}, "num_attention_heads": {},
        "num_key_value_heads": {}, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "vocab_size": {}, "max_position_embeddings": {},
        "tie_word_embeddings": true, "torch_dtype": "float32"}}"#,
        config.hidden,
        config.ffn,
        config.layers,
        config.heads,
        config.kv_heads,
        config.vocab,
        config.max_positions
    );
    std::fs::write(dir.join("config.json"), json).unwrap();
    let tensors: Vec<(String, Vec<u64>, Vec<u8>)> = src
        .names()
        .map(|name| {
            let (dims, data) = src.get(name).unwrap();
            (
                name.to_owned(),
                dims.iter().map(|&d| d as u64).collect(),
                f32_bytes(&data),
            )
        })
        .collect();
    let mut w = SafetensorsWriter::new();
    for (name, shape, bytes) in &tensors {
        w.add_tensor(name, Dtype::F32, shape, bytes).unwrap();
    }
    w.write(dir.join("model.safetensors")).unwrap();

    let checkpoint = HfCheckpoint::open(&dir).unwrap();
    let read = ModelConfig::from_hf_config(checkpoint.config()).unwrap();
    assert_eq!(read, config);
    let tokens = Filler::new(2301).tokens(9, config.vocab);
    let run = |model: Decoder<f64>| {
        model
            .forward(&mut model.new_cache(), &tokens, Logits::All)
            .unwrap()
    };
    let want = run(Decoder::load(config.clone(), &src, Naming::HuggingFace).unwrap());
    let got = run(Decoder::load(read, &checkpoint, Naming::HuggingFace).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(want, got);
}

#[test]
fn hugging_face_configs_map_to_model_configs() {
    let llama = HfConfig::from_json(
        r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "vocab_size": 100,
        "max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3",
        "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}}"#,
    )
    .unwrap();
    let c = ModelConfig::from_hf_config(&llama).unwrap();
    assert_eq!(
        (c.arch, c.head_dim, c.kv_heads, c.norm_eps, c.rope_theta),
        (Arch::Llama, 16, 2, 1e-5, 500000.0)
    );
    assert_eq!(
        c.rope_scaling,
        Some(Llama3Scaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_positions: 8192
        })
    );
    assert!(!c.tied_embeddings && !c.qkv_bias && !c.qk_norm);
    assert_eq!(c.rope_style, RopeStyle::HalfSplit);

    let qwen3 = HfConfig::from_json(
        r#"{"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 100, "tie_word_embeddings": true}"#,
    )
    .unwrap();
    let c = ModelConfig::from_hf_config(&qwen3).unwrap();
    assert_eq!((c.head_dim, c.qk_norm, c.tied_embeddings), (16, true, true));
    assert_eq!((c.max_positions, c.norm_eps), (32768, 1e-6));

    let refused = [
        (r#""model_type": "mistral""#, "model_type mistral models are not supported by quench's CPU forward"),
        (
            r#""model_type": "llama", "hidden_act": "gelu_pytorch_tanh""#,
            "model configuration: hidden_act \"gelu_pytorch_tanh\" is not supported (only \"silu\")",
        ),
    ];
    for (fields, message) in refused {
        let hf = HfConfig::from_json(&format!(
            r#"{{{fields}, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 100}}"#
        ))
        .unwrap();
        let err = ModelConfig::from_hf_config(&hf).unwrap_err();
        assert_eq!(err.to_string(), message);
        assert!(matches!(
            err,
            ArchError::UnsupportedArch { .. } | ArchError::Config { .. }
        ));
    }
}
