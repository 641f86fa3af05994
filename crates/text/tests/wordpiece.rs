//! WordPiece (BERT) against ids from Hugging Face `tokenizers`.

mod common;

use common::{check_decode, check_encode, check_stream, corpus_cases, fixture, tests_dir};
use quench_text::{GgufVocab, Tokenizer};

fn small() -> Tokenizer {
    Tokenizer::from_tokenizer_json(tests_dir().join("fixtures/wordpiece_small.tokenizer.json"))
        .unwrap()
}

#[test]
fn small_wordpiece_matches_hf() {
    let f = fixture("wordpiece_small.json");
    let tok = small();
    let cases = corpus_cases();
    check_encode(&tok, &cases, &f["encode"], false, "wordpiece_small");
    check_encode(
        &tok,
        &cases,
        &f["encode_with_special"],
        true,
        "wordpiece_small+special",
    );
    check_decode(&tok, &f["decode"], "wordpiece_small");
    check_stream(&tok, &cases, "wordpiece_small");
}

/// The same vocabulary as a GGUF "bert" vocab spells it ('▁' word starts, no "##").
#[test]
fn gguf_bert_vocab_matches_hf() {
    let f = fixture("wordpiece_small.json");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tests_dir().join("fixtures/wordpiece_small.tokenizer.json"))
            .unwrap(),
    )
    .unwrap();
    let map = json["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); map.len()];
    for (text, id) in map {
        tokens[id.as_u64().unwrap() as usize] = if text.starts_with('[') && text.ends_with(']') {
            text.clone()
        } else if let Some(rest) = text.strip_prefix("##") {
            rest.to_string()
        } else {
            format!("\u{2581}{text}")
        };
    }
    let mut types = vec![1; tokens.len()];
    for id in [0, 100, 101, 102, 103] {
        types[id] = 3;
    }
    let vocab = GgufVocab {
        model: "bert".into(),
        tokens,
        token_types: Some(types),
        unk_id: Some(100),
        cls_id: Some(101),
        sep_id: Some(102),
        pad_id: Some(0),
        ..GgufVocab::default()
    };
    let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
    let cases = corpus_cases();
    check_encode(&tok, &cases, &f["encode"], false, "wordpiece_gguf");
    check_encode(
        &tok,
        &cases,
        &f["encode_with_special"],
        true,
        "wordpiece_gguf+special",
    );
}

#[test]
fn minilm_matches_hf() {
    let Some(dir) = quench_testkit::minilm_dir() else {
        return;
    };
    let f = fixture("minilm_expected.json");
    let tok = Tokenizer::from_tokenizer_json(dir.join("tokenizer.json")).unwrap();
    let cases = corpus_cases();
    check_encode(&tok, &cases, &f["encode"], false, "minilm");
    check_encode(
        &tok,
        &cases,
        &f["encode_with_special"],
        true,
        "minilm+special",
    );
    check_decode(&tok, &f["decode"], "minilm");
    check_stream(&tok, &cases, "minilm");
}
