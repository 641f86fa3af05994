//! GGUF: header, metadata, tensor infos; then everything a loader does with a file that
//! parsed: every metadata value read through its converters, every small tensor
//! dequantized, the model config, the tokenizer (built and run) and the chat template.

use quench_models::arch::ModelConfig;
use quench_models::gguf::{GgufWriter, MetadataArray as A, MetadataValue as V};
use quench_models::{GgmlType, GgufFile};
use quench_text::Tokenizer;

use super::synth::checkpoints;
use crate::Target;

/// Tensors are dequantized only up to this many elements, so that a header claiming a
/// large tensor in a large input costs what a loader would spend, not more.
const MAX_DEQUANT_ELEMENTS: u64 = 1 << 20;

pub fn target() -> Target {
    Target {
        name: "gguf",
        about: "GGUF header, metadata and tensor infos (GgufFile::from_bytes), then config, tokenizer, template and tensors",
        seeds,
        dict: &[
            b"GGUF",
            b"general.alignment",
            b"tokenizer.ggml.tokens",
            b"tokenizer.ggml.merges",
            b"tokenizer.chat_template",
            b"llama.block_count",
            b"\x09\x00\x00\x00",
            b"\x08\x00\x00\x00",
            b"\x03\x00\x00\x00",
            b"\xff\xff\xff\xff\xff\xff\xff\xff",
        ],
        format: crate::Format::Binary,
        run,
    }
}

/// A file with every metadata type, nested arrays, and tensors of several block types.
fn all_types() -> Vec<u8> {
    let data: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let mut w = GgufWriter::new();
    let entries = [
        ("general.architecture", V::String("llama".into())),
        ("general.alignment", V::U32(64)),
        ("u8", V::U8(7)),
        ("i8", V::I8(-7)),
        ("u16", V::U16(700)),
        ("i16", V::I16(-700)),
        ("i32", V::I32(-70000)),
        ("f32", V::F32(0.5)),
        ("bool", V::Bool(true)),
        ("u64", V::U64(u64::MAX)),
        ("i64", V::I64(i64::MIN)),
        ("f64", V::F64(1e300)),
        (
            "strings",
            V::Array(A::String(vec!["a".into(), "".into(), "ü".into()])),
        ),
        (
            "nested",
            V::Array(A::Array(vec![A::U8(vec![1, 2]), A::Bool(vec![true])])),
        ),
        ("i32s", V::Array(A::I32(vec![1, -1, i32::MAX]))),
        ("f64s", V::Array(A::F64(vec![0.25]))),
    ];
    for (key, value) in entries {
        w.add_metadata(key, value).expect("valid metadata");
    }
    let tensors: [(&str, &[u64], GgmlType, usize); 6] = [
        ("f32", &[8, 2], GgmlType::F32, 64),
        ("f16", &[4], GgmlType::F16, 8),
        ("q4_0", &[64], GgmlType::Q4_0, 36),
        ("q8_0", &[32, 2], GgmlType::Q8_0, 68),
        ("q6_k", &[256], GgmlType::Q6_K, 210),
        ("empty", &[0, 3], GgmlType::F32, 0),
    ];
    for (name, dims, ty, bytes) in tensors {
        w.add_tensor(name, dims, ty, &data[..bytes])
            .expect("valid tensor");
    }
    w.to_bytes()
}

/// A SentencePiece-style vocabulary with scores and token types, and a template.
fn llama_vocab() -> Vec<u8> {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    tokens.extend(["▁", "▁a", "b", "▁ab", "c"].map(String::from));
    let n = tokens.len();
    let mut w = GgufWriter::new();
    let entries = [
        ("general.architecture", V::String("llama".into())),
        ("tokenizer.ggml.model", V::String("llama".into())),
        ("tokenizer.ggml.tokens", V::Array(A::String(tokens))),
        (
            "tokenizer.ggml.scores",
            V::Array(A::F32((0..n).map(|i| -(i as f32)).collect())),
        ),
        (
            "tokenizer.ggml.token_type",
            V::Array(A::I32((0..n).map(|i| if i < 3 { 3 } else { 1 }).collect())),
        ),
        ("tokenizer.ggml.bos_token_id", V::U32(1)),
        ("tokenizer.ggml.eos_token_id", V::U32(2)),
        ("tokenizer.ggml.unknown_token_id", V::U32(0)),
        ("tokenizer.ggml.add_bos_token", V::Bool(true)),
        (
            "tokenizer.chat_template",
            V::String(super::template::CHATML.into()),
        ),
    ];
    for (key, value) in entries {
        w.add_metadata(key, value).expect("valid metadata");
    }
    w.to_bytes()
}

/// A BERT encoder's metadata (all-MiniLM-L6-v2's numbers) with a WordPiece vocabulary.
fn bert() -> Vec<u8> {
    let tokens: Vec<String> = [
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁hello", "▁world", "s", "▁!", "▁na", "ive",
    ]
    .map(String::from)
    .to_vec();
    let mut w = GgufWriter::new();
    let entries = [
        ("general.architecture", V::String("bert".into())),
        ("bert.embedding_length", V::U32(384)),
        ("bert.attention.head_count", V::U32(12)),
        ("bert.attention.key_length", V::U32(32)),
        ("bert.block_count", V::U32(6)),
        ("bert.feed_forward_length", V::U32(1536)),
        ("bert.context_length", V::U32(512)),
        ("bert.vocab_size", V::U32(10)),
        ("bert.attention.layer_norm_epsilon", V::F32(1e-12)),
        ("tokenizer.ggml.model", V::String("bert".into())),
        ("tokenizer.ggml.tokens", V::Array(A::String(tokens))),
        (
            "tokenizer.ggml.token_type",
            V::Array(A::I32(vec![3, 2, 3, 3, 1, 1, 1, 1, 1, 1])),
        ),
        ("tokenizer.ggml.unknown_token_id", V::U32(1)),
        ("tokenizer.ggml.cls_token_id", V::U32(2)),
        ("tokenizer.ggml.seperator_token_id", V::U32(3)),
        ("tokenizer.ggml.padding_token_id", V::U32(0)),
    ];
    for (key, value) in entries {
        w.add_metadata(key, value).expect("valid metadata");
    }
    w.to_bytes()
}

fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![all_types(), llama_vocab(), bert()];
    // Written by the Python `gguf` package: another writer's layout.
    seeds.push(include_bytes!("../../../models/tests/fixtures/all_types.gguf").to_vec());
    seeds.extend(checkpoints().iter().map(|c| c.gguf.clone()));
    seeds
}

/// Reads every value through every converter: none may panic, whatever the type.
fn touch_metadata(file: &GgufFile) {
    for (key, value) in file.metadata_entries() {
        let _ = (value.as_u32(), value.as_u64(), value.as_i64());
        let _ = (
            value.as_f32(),
            value.as_f64(),
            value.as_bool(),
            value.as_str(),
        );
        let _ = value.type_description();
        let _ = (file.get_str_array(key), file.get_f32_array(key));
        let _ = file.get_i32_array(key);
    }
}

fn run(bytes: &[u8]) -> Result<(), String> {
    let file = GgufFile::from_bytes(bytes.to_vec()).map_err(|e| e.to_string())?;
    touch_metadata(&file);
    for tensor in file.tensors() {
        if tensor.n_elements() <= MAX_DEQUANT_ELEMENTS {
            let _ = tensor.to_f32();
        }
    }
    let config = ModelConfig::from_gguf(&file).map_err(|e| e.to_string());
    let tokenizer = file
        .tokenizer_vocab()
        .map_err(|e| e.to_string())
        .and_then(|v| Tokenizer::from_gguf_vocab(&v).map_err(|e| e.to_string()));
    if let Ok(tokenizer) = &tokenizer {
        super::tokenizer::exercise(tokenizer);
    }
    if let Ok(source) = file.get_str("tokenizer.chat_template") {
        super::template::render_all(source)?;
    }
    config.map(|_| ()).and(tokenizer.map(|_| ()))
}
