//! `config.json` parsing for the llama, qwen2, qwen3 and bert families (configs as published
//! on the Hugging Face hub, trimmed of nothing).

mod common;

use common::temp_dir;
use quench_models::{HfConfig, Llama3RopeScaling, ModelError, TokenIds};

const LLAMA_3_2_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
}"#;

const QWEN2_5_0_5B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936
}"#;

const QWEN3_0_6B: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
}"#;

const MINILM_L6: &str = r#"{
  "_name_or_path": "nreimers/MiniLM-L6-H384-uncased", "architectures": ["BertModel"],
  "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": false, "hidden_act": "gelu",
  "hidden_dropout_prob": 0.1, "hidden_size": 384, "initializer_range": 0.02,
  "intermediate_size": 1536, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
  "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6, "pad_token_id": 0,
  "position_embedding_type": "absolute", "transformers_version": "4.8.2", "type_vocab_size": 2,
  "use_cache": true, "vocab_size": 30522
}"#;

#[test]
fn llama_3_2() {
    let c = HfConfig::from_json(LLAMA_3_2_1B).unwrap();
    assert_eq!(c.architecture(), Some("LlamaForCausalLM"));
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (2048, 8192, 16)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_kv_heads(), c.head_dim()),
        (32, 8, 64)
    );
    assert_eq!(c.rms_norm_eps, Some(1e-5));
    assert_eq!(c.rope_theta, Some(500000.0));
    assert_eq!(c.vocab_size, 128256);
    assert_eq!(c.max_position_embeddings, Some(131072));
    assert_eq!(c.tie_word_embeddings, Some(true));
    assert_eq!(c.bos_token_id, Some(TokenIds(vec![128000])));
    assert_eq!(c.eos_token_id, Some(TokenIds(vec![128001, 128008, 128009])));
    assert_eq!(c.torch_dtype.as_deref(), Some("bfloat16"));
    assert_eq!(c.attention_bias, Some(false));
    assert_eq!(
        c.llama3_rope_scaling().unwrap(),
        Some(Llama3RopeScaling {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        })
    );
}

#[test]
fn qwen2_5_derives_head_dim_and_has_no_scaling() {
    let c = HfConfig::from_json(QWEN2_5_0_5B).unwrap();
    assert_eq!(c.model_type.as_deref(), Some("qwen2"));
    assert_eq!(
        (c.num_attention_heads, c.num_kv_heads(), c.head_dim()),
        (14, 2, 64)
    );
    assert_eq!(c.head_dim, None);
    assert_eq!(c.eos_token_id, Some(TokenIds(vec![151645])));
    assert_eq!(c.attention_bias, None);
    assert_eq!(c.llama3_rope_scaling().unwrap(), None);
}

#[test]
fn qwen3_head_dim_is_explicit() {
    let c = HfConfig::from_json(QWEN3_0_6B).unwrap();
    // 16 heads × 128 ≠ 1024: the explicit head_dim must win.
    assert_eq!(
        (c.hidden_size, c.num_attention_heads, c.head_dim()),
        (1024, 16, 128)
    );
    assert_eq!(c.rope_theta, Some(1e6)); // written as an integer
    assert_eq!(c.rope_scaling, None);
}

#[test]
fn bert() {
    let c = HfConfig::from_json(MINILM_L6).unwrap();
    assert_eq!(c.architecture(), Some("BertModel"));
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.head_dim()),
        (384, 6, 32)
    );
    assert_eq!(c.num_kv_heads(), 12);
    assert_eq!(c.layer_norm_eps, Some(1e-12));
    assert_eq!(c.rms_norm_eps, None);
    assert_eq!(c.type_vocab_size, Some(2));
    assert_eq!(c.hidden_act.as_deref(), Some("gelu"));
    assert_eq!(c.pad_token_id, Some(TokenIds(vec![0])));
}

fn edit(base: &str, from: &str, to: &str) -> String {
    assert!(base.contains(from), "{from}");
    base.replace(from, to)
}

#[test]
fn invalid_configs_are_refused_by_field() {
    let cases = [
        (
            edit(QWEN2_5_0_5B, r#""hidden_size": 896,"#, ""),
            "missing field `hidden_size`",
        ),
        (format!("{QWEN2_5_0_5B} {{}}"), "trailing characters"),
        (
            edit(
                QWEN2_5_0_5B,
                r#""hidden_size": 896"#,
                r#""hidden_size": "896""#,
            ),
            "config field hidden_size: invalid type",
        ),
        (
            edit(
                QWEN2_5_0_5B,
                r#""num_key_value_heads": 2"#,
                r#""num_key_value_heads": 3"#,
            ),
            "config field num_key_value_heads",
        ),
        (
            edit(
                QWEN2_5_0_5B,
                r#""hidden_size": 896"#,
                r#""hidden_size": 900"#,
            ),
            "config field hidden_size: 900 is not divisible",
        ),
        (
            edit(
                QWEN2_5_0_5B,
                r#""num_hidden_layers": 24"#,
                r#""num_hidden_layers": 0"#,
            ),
            "config field num_hidden_layers",
        ),
        (
            edit(LLAMA_3_2_1B, r#""head_dim": 64"#, r#""head_dim": 0"#),
            "config field head_dim",
        ),
        (
            edit(
                LLAMA_3_2_1B,
                r#""eos_token_id": [128001"#,
                r#""eos_token_id": [-1"#,
            ),
            "config field eos_token_id[0]",
        ),
        (
            edit(
                LLAMA_3_2_1B,
                r#""bos_token_id": 128000"#,
                r#""bos_token_id": 1e3"#,
            ),
            "a token id or a list",
        ),
        (
            edit(LLAMA_3_2_1B, r#""factor": 32.0"#, r#""factor": "x""#),
            "config field rope_scaling.factor",
        ),
    ];
    for (text, needle) in cases {
        let err = HfConfig::from_json(&text).unwrap_err();
        assert!(
            err.to_string().contains(needle),
            "expected {needle:?} in {err}"
        );
    }
}

#[test]
fn rope_scaling_variants() {
    let legacy = edit(
        LLAMA_3_2_1B,
        r#""rope_type": "llama3""#,
        r#""type": "llama3""#,
    );
    assert!(HfConfig::from_json(&legacy)
        .unwrap()
        .llama3_rope_scaling()
        .unwrap()
        .is_some());

    let yarn = edit(
        LLAMA_3_2_1B,
        r#""rope_type": "llama3""#,
        r#""rope_type": "yarn""#,
    );
    let err = HfConfig::from_json(&yarn)
        .unwrap()
        .llama3_rope_scaling()
        .unwrap_err();
    assert!(
        matches!(err, ModelError::Unsupported { .. }) && err.to_string().contains("yarn"),
        "{err}"
    );

    let partial = edit(LLAMA_3_2_1B, r#""factor": 32.0, "#, "");
    let err = HfConfig::from_json(&partial)
        .unwrap()
        .llama3_rope_scaling()
        .unwrap_err();
    assert!(err.to_string().contains("rope_scaling.factor"), "{err}");

    let default = edit(
        LLAMA_3_2_1B,
        r#""rope_type": "llama3""#,
        r#""rope_type": "default""#,
    );
    assert_eq!(
        HfConfig::from_json(&default)
            .unwrap()
            .llama3_rope_scaling()
            .unwrap(),
        None
    );
}

#[test]
fn file_errors_name_the_file() {
    let path = temp_dir("config").join("config.json");
    std::fs::write(&path, "{ not json").unwrap();
    let err = HfConfig::from_file(&path).unwrap_err();
    assert!(
        err.to_string().starts_with(&path.display().to_string()),
        "{err}"
    );
    std::fs::write(&path, MINILM_L6).unwrap();
    assert_eq!(HfConfig::from_file(&path).unwrap().vocab_size, 30522);
}

/// Found by quench-fuzz: a BERT config whose head count times head size does not fit a
/// `usize` overflowed in the check that the two make the hidden size.
#[test]
fn a_bert_head_size_whose_product_overflows_is_refused_by_name() {
    let json = edit(
        MINILM_L6,
        r#""num_attention_heads": 12,"#,
        r#""num_attention_heads": 4294967296, "head_dim": 4294967296,"#,
    );
    let hf = HfConfig::from_json(&json).expect("parses: the heads divide themselves");
    let err = quench_models::arch::ModelConfig::from_hf_config(&hf)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("head_dim"), "{err}");
}
