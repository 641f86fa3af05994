//! The tokenizer of a converted checkpoint: `tokenizer.ggml.*` keys from `tokenizer.json`
//! and `tokenizer_config.json`, the pre-tokenizer named as llama.cpp names it, and refusals
//! of what GGUF cannot say. (That the keys encode text as `tokenizer.json` does is checked
//! through quench's tokenizer in the CLI tests.)

mod common;
mod convert;

use std::path::Path;

use common::temp_dir;
use convert::{read_json, write_checkpoint, write_json, Shape, ADDED, BOS, EOS, MERGES, SPECIALS};
use quench_models::hf_to_gguf::{convert, ConvertOptions, TargetType};
use quench_models::safetensors::Dtype;
use quench_models::GgufFile;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A narrow llama checkpoint in a fresh directory.
fn checkpoint(tag: &str) -> std::path::PathBuf {
    let dir = temp_dir(tag);
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    write_checkpoint(&dir, &Shape::narrow("llama"), Dtype::BF16, 1, &mut rng);
    dir
}

fn convert_dir(dir: &Path) -> Result<GgufFile, String> {
    let out = dir.join("out.gguf");
    let options = ConvertOptions {
        target: TargetType::Q8_0,
        threads: 1,
    };
    convert(dir, &out, &options, &mut |_| {}).map_err(|e| e.to_string())?;
    Ok(GgufFile::open(&out).unwrap())
}

/// Edits `tokenizer.json` in `dir`.
fn edit_tokenizer(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("tokenizer.json");
    let mut v = read_json(&path);
    edit(&mut v);
    write_json(&path, &v);
}

#[test]
fn the_vocabulary_merges_and_special_tokens_are_carried() {
    let dir = checkpoint("tok-keys");
    let file = convert_dir(&dir).unwrap();
    let key = |k: &str| format!("tokenizer.ggml.{k}");
    assert_eq!(file.get_str(&key("model")).unwrap(), "gpt2");
    assert_eq!(file.get_str(&key("pre")).unwrap(), "gpt-2");

    let tokens = file.get_str_array(&key("tokens")).unwrap();
    let types = file.get_i32_array(&key("token_type")).unwrap();
    let vocab = Shape::narrow("llama").vocab;
    assert_eq!((tokens.len(), types.len()), (vocab, vocab));
    let bytes = convert::byte_chars();
    for (id, (token, &ty)) in tokens.iter().zip(types).enumerate() {
        let (want, want_ty) = match id {
            0..256 => (bytes[id].to_string(), 1),
            256..263 => {
                let (l, r) = MERGES[id - 256];
                (format!("{l}{r}"), 1)
            }
            263 | 264 => (SPECIALS[id - 263].to_owned(), 3),
            265 => (ADDED.to_owned(), 4),
            _ => (format!("[PAD{id}]"), 5),
        };
        assert_eq!((token.as_str(), ty), (want.as_str(), want_ty), "id {id}");
    }
    let merges = file.get_str_array(&key("merges")).unwrap();
    let want: Vec<String> = MERGES.iter().map(|(l, r)| format!("{l} {r}")).collect();
    assert_eq!(merges, &want[..]);
    assert_eq!(file.get_u32(&key("bos_token_id")).unwrap(), BOS);
    assert_eq!(file.get_u32(&key("eos_token_id")).unwrap(), EOS);
    assert!(file.metadata(&key("padding_token_id")).is_none());
    assert!(file.metadata(&key("unknown_token_id")).is_none());
    assert!(!file.get_bool(&key("add_bos_token")).unwrap());
    assert!(!file.get_bool(&key("add_eos_token")).unwrap());
    assert_eq!(
        file.get_str("tokenizer.chat_template").unwrap(),
        convert::TEMPLATE
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn llama_cpp_pre(dir: &Path, pre: Value, ignore_merges: bool) -> Result<String, String> {
    edit_tokenizer(dir, |t| {
        t["pre_tokenizer"] = pre;
        t["model"]["ignore_merges"] = ignore_merges.into();
    });
    let file = convert_dir(dir)?;
    Ok(file.get_str("tokenizer.ggml.pre").unwrap().to_owned())
}

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
           "use_regex": use_regex})
}

fn split(pattern: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
           "invert": false})
}

fn sequence(steps: Vec<Value>) -> Value {
    json!({"type": "Sequence", "pretokenizers": steps})
}

#[test]
fn pre_tokenizers_get_llama_cpp_names() {
    let dir = checkpoint("tok-pre");
    let llama3 = sequence(vec![split(LLAMA3_SPLIT), byte_level(false)]);
    let qwen2 = sequence(vec![split(QWEN2_SPLIT), byte_level(false)]);
    let digits = json!({"type": "Digits", "individual_digits": true});
    let smollm = sequence(vec![digits.clone(), byte_level(true)]);
    assert_eq!(
        llama_cpp_pre(&dir, llama3.clone(), true).unwrap(),
        "llama-bpe"
    );
    assert_eq!(llama_cpp_pre(&dir, qwen2.clone(), false).unwrap(), "qwen2");
    assert_eq!(llama_cpp_pre(&dir, smollm, false).unwrap(), "smollm");
    assert_eq!(
        llama_cpp_pre(&dir, sequence(vec![byte_level(true)]), false).unwrap(),
        "gpt-2"
    );

    // llama.cpp ties whole-word lookup to the name; a tokenizer that differs is refused.
    let err = llama_cpp_pre(&dir, llama3, false).unwrap_err();
    assert!(
        err.contains("ignore_merges is false") && err.contains("llama-bpe"),
        "{err}"
    );
    let err = llama_cpp_pre(&dir, qwen2, true).unwrap_err();
    assert!(err.contains("ignore_merges is true"), "{err}");
    // Forms without a GGUF name: a changed regex, runs of digits, a prefix space, none.
    for pre in [
        sequence(vec![
            split(&LLAMA3_SPLIT.replace("{1,3}", "{1,4}")),
            byte_level(false),
        ]),
        sequence(vec![
            json!({"type": "Digits", "individual_digits": false}),
            byte_level(true),
        ]),
        json!({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}),
        json!({"type": "Whitespace"}),
        Value::Null,
    ] {
        let err = llama_cpp_pre(&dir, pre.clone(), false).unwrap_err();
        assert!(err.contains("has no GGUF name"), "{pre}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_template_post_processor_sets_add_bos() {
    let dir = checkpoint("tok-post");
    let template = |token: &str, id: u32| {
        json!({"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": token, "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [],
             "special_tokens": {token: {"id": token, "ids": [id], "tokens": [token]}}}
        ]})
    };
    edit_tokenizer(&dir, |t| t["post_processor"] = template(SPECIALS[0], BOS));
    let file = convert_dir(&dir).unwrap();
    assert!(file.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(!file.get_bool("tokenizer.ggml.add_eos_token").unwrap());
    assert_eq!(file.get_u32("tokenizer.ggml.bos_token_id").unwrap(), BOS);

    // A token other than the BOS at the start cannot be expressed.
    edit_tokenizer(&dir, |t| t["post_processor"] = template(SPECIALS[1], EOS));
    let err = convert_dir(&dir).unwrap_err();
    assert!(
        err.contains("post-processor adds [264]") && err.contains("BOS"),
        "{err}"
    );
    // A BERT-style post-processor is refused by name.
    edit_tokenizer(&dir, |t| {
        t["post_processor"] = json!({"type": "BertProcessing", "sep": ["<|end|>", EOS],
                                     "cls": ["<|begin|>", BOS]})
    });
    let err = convert_dir(&dir).unwrap_err();
    assert!(err.contains("post-processor BertProcessing"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn special_ids_fall_back_to_config_json_and_templates_to_the_jinja_file() {
    let dir = checkpoint("tok-fallback");
    // Merges as pairs (newer tokenizer.json) are written as GGUF's "left right".
    edit_tokenizer(&dir, |t| {
        t["model"]["merges"] = MERGES.iter().map(|(l, r)| json!([l, r])).collect();
    });
    let jinja = "{{ messages[0]['content'] }}";
    std::fs::write(dir.join("chat_template.jinja"), jinja).unwrap();
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"pad_token": SPECIALS[1]}),
    );
    let mut config = read_json(&dir.join("config.json"));
    config["bos_token_id"] = json!(EOS);
    config["eos_token_id"] = json!([BOS, EOS]);
    write_json(&dir.join("config.json"), &config);
    let file = convert_dir(&dir).unwrap();
    let merges = file.get_str_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(merges[0], format!("{} {}", MERGES[0].0, MERGES[0].1));
    assert_eq!(file.get_u32("tokenizer.ggml.bos_token_id").unwrap(), EOS);
    assert_eq!(file.get_u32("tokenizer.ggml.eos_token_id").unwrap(), BOS);
    assert_eq!(
        file.get_u32("tokenizer.ggml.padding_token_id").unwrap(),
        EOS
    );
    assert_eq!(file.get_str("tokenizer.chat_template").unwrap(), jinja);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A change to `tokenizer.json`.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn tokenizers_gguf_cannot_describe_are_refused() {
    let dir = checkpoint("tok-refuse");
    let original = read_json(&dir.join("tokenizer.json"));
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|t| t["model"]["byte_fallback"] = true.into()),
            "byte_fallback",
        ),
        (
            Box::new(|t| t["model"]["type"] = "WordPiece".into()),
            "tokenizer model \"WordPiece\"",
        ),
        (
            Box::new(|t| t["normalizer"] = json!({"type": "Lowercase"})),
            "normalizer Lowercase",
        ),
        (
            Box::new(|t| t["decoder"] = json!({"type": "Metaspace"})),
            "decoder Metaspace",
        ),
        (
            Box::new(|t| t["model"]["merges"] = json!([["a b", "c"]])),
            "merge 0",
        ),
        (
            Box::new(|t| {
                t["added_tokens"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"id": 300, "content": "<late>", "special": true}))
            }),
            "past config.json's vocab_size 300",
        ),
        (
            Box::new(|t| {
                t["added_tokens"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"id": 5, "content": "<clash>", "special": true}))
            }),
            "id 5 is both",
        ),
    ];
    for (edit, needle) in cases {
        let mut t = original.clone();
        edit(&mut t);
        write_json(&dir.join("tokenizer.json"), &t);
        let err = convert_dir(&dir).unwrap_err();
        assert!(err.contains(needle), "expected {needle:?} in: {err}");
    }
    // NFC normalization is accepted with a note.
    let mut t = original.clone();
    t["normalizer"] = json!({"type": "NFC"});
    write_json(&dir.join("tokenizer.json"), &t);
    let mut notes = Vec::new();
    let options = ConvertOptions {
        target: TargetType::Q8_0,
        threads: 1,
    };
    convert(&dir, &dir.join("out.gguf"), &options, &mut |p| {
        if let quench_models::hf_to_gguf::Progress::Note(n) = p {
            notes.push(n.to_owned());
        }
    })
    .unwrap();
    assert!(notes.iter().any(|n| n.contains("NFC")), "{notes:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
