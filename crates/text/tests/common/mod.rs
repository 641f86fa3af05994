//! Shared by the integration tests: the corpus, fixtures, and a tiny GGUF metadata reader.
#![allow(dead_code)] // each test binary uses its own part of this module

pub mod gguf_meta;

use std::path::{Path, PathBuf};

use quench_text::Tokenizer;
use serde_json::Value;

pub fn tests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests")
}

/// The corpus strings, then the whole corpus joined as one text (as make_fixtures.py does).
pub fn corpus_cases() -> Vec<String> {
    let text = std::fs::read_to_string(tests_dir().join("corpus.txt")).expect("corpus.txt");
    let mut cases: Vec<String> = text.split("\n%%%\n").map(str::to_string).collect();
    cases.push(cases.join("\n"));
    cases
}

pub fn fixture(name: &str) -> Value {
    let path = tests_dir().join("fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("fixture JSON")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("string list")
        .iter()
        .map(|x| x.as_str().expect("string").to_string())
        .collect()
}

/// Compares `encode` with the expected ids of every corpus case; reports all mismatches.
pub fn check_encode(
    tok: &Tokenizer,
    cases: &[String],
    expected: &Value,
    add_special_tokens: bool,
    label: &str,
) -> usize {
    let expected = expected.as_array().expect("expected list");
    assert!(
        !expected.is_empty() && expected.len() <= cases.len(),
        "{label}: fixture has {} cases",
        expected.len()
    );
    let mut failures = Vec::new();
    for (i, (text, want)) in cases.iter().zip(expected).enumerate() {
        let got = tok.encode(text, add_special_tokens).expect("encode");
        let want = ids(want);
        if got != want {
            let first = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(got.len().min(want.len()));
            failures.push(format!(
                "case {i} {:?}: first difference at token {first}\n  got  {:?}\n  want {:?}",
                text.chars().take(60).collect::<String>(),
                &got[first.saturating_sub(2)..(first + 6).min(got.len())],
                &want[first.saturating_sub(2)..(first + 6).min(want.len())],
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{label}: {} of {} cases differ:\n{}",
        failures.len(),
        expected.len(),
        failures.join("\n")
    );
    eprintln!(
        "{label}: {} of {} cases match token for token",
        expected.len(),
        expected.len()
    );
    expected.len()
}

/// Compares `decode` with the expected texts (`{"ids", "skip_special", "text"}` entries).
pub fn check_decode(tok: &Tokenizer, cases: &Value, label: &str) -> usize {
    let cases = cases.as_array().expect("decode cases");
    for (i, case) in cases.iter().enumerate() {
        let ids = ids(&case["ids"]);
        let skip = case["skip_special"].as_bool().expect("skip_special");
        let got = tok.decode(&ids, skip).expect("decode");
        assert_eq!(
            got,
            case["text"].as_str().expect("text"),
            "{label}: decode case {i} ids {ids:?} skip {skip}"
        );
    }
    cases.len()
}

/// Streams the ids of every case through `DecodeStream`: the pieces must join to the full
/// decode and no piece may end inside a character (a trailing U+FFFD) unless the full text
/// has one there.
pub fn check_stream(tok: &Tokenizer, cases: &[String], label: &str) {
    for text in cases {
        let ids = tok.encode(text, false).expect("encode");
        let full = tok.decode(&ids, false).expect("decode");
        let mut stream = tok.decode_stream(false);
        let mut joined = String::new();
        for &id in &ids {
            if let Some(piece) = stream.step(id).expect("step") {
                assert!(
                    !piece.ends_with('\u{FFFD}') || full.contains('\u{FFFD}'),
                    "{label}: stream emitted a broken character in {text:?}"
                );
                joined.push_str(&piece);
            }
        }
        if let Some(rest) = stream.finish().expect("finish") {
            joined.push_str(&rest);
        }
        assert_eq!(joined, full, "{label}: streamed text differs for {text:?}");
    }
}
