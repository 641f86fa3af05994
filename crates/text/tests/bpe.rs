//! Byte-level BPE against ids from Hugging Face `tokenizers` (fixtures/make_fixtures.py).

mod common;

use common::{check_decode, check_encode, check_stream, corpus_cases, fixture, strings};
use quench_text::{GgufVocab, Tokenizer};

const PRES: [&str; 5] = ["default", "gpt2", "smollm", "llama-bpe", "qwen2"];

fn small_vocab(pre: &str) -> GgufVocab {
    let f = fixture("bpe_small.json");
    GgufVocab {
        model: "gpt2".into(),
        pre: Some(pre.into()),
        tokens: strings(&f["tokens"]),
        token_types: Some(
            f["token_types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_i64().unwrap() as i32)
                .collect(),
        ),
        merges: Some(strings(&f["merges"])),
        ..GgufVocab::default()
    }
}

#[test]
fn small_bpe_matches_hf_for_every_pre_tokenizer() {
    let f = fixture("bpe_small.json");
    let cases = corpus_cases();
    let mut matched = 0;
    for pre in PRES {
        let tok = Tokenizer::from_gguf_vocab(&small_vocab(pre)).unwrap();
        matched += check_encode(
            &tok,
            &cases,
            &f["encode"][pre],
            false,
            &format!("bpe_small/{pre}"),
        );
    }
    assert_eq!(matched, PRES.len() * cases.len());
}

#[test]
fn small_bpe_decodes_like_hf() {
    let tok = Tokenizer::from_gguf_vocab(&small_vocab("gpt2")).unwrap();
    let n = check_decode(&tok, &fixture("bpe_small.json")["decode"], "bpe_small");
    assert!(n > 50);
    check_stream(&tok, &corpus_cases(), "bpe_small");
}

#[test]
#[should_panic(expected = "cases differ")]
fn the_fixture_catches_a_wrong_pre_tokenizer() {
    let f = fixture("bpe_small.json");
    let tok = Tokenizer::from_gguf_vocab(&small_vocab("gpt2")).unwrap();
    check_encode(
        &tok,
        &corpus_cases(),
        &f["encode"]["default"],
        false,
        "gpt2 ids against default's",
    );
}

#[test]
fn smollm2_gguf_matches_hf() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let (mut vocab, _) = common::gguf_meta::gguf_vocab(&path);
    assert_eq!(
        (vocab.model.as_str(), vocab.pre.as_deref()),
        ("gpt2", Some("smollm"))
    );
    let f = fixture("smollm2_expected.json");
    assert_eq!(vocab.tokens.len() as u64, f["vocab_size"].as_u64().unwrap());
    let cases = corpus_cases();
    let mut matched = 0;
    for pre in PRES {
        vocab.pre = Some(pre.into());
        let tok = Tokenizer::from_gguf_vocab(&vocab).unwrap();
        matched += check_encode(
            &tok,
            &cases,
            &f["encode"][pre],
            false,
            &format!("smollm2/{pre}"),
        );
        if pre == "smollm" {
            assert_eq!(tok.bos_id(), f["bos"].as_u64().map(|x| x as u32));
            assert_eq!(tok.eos_id(), f["eos"].as_u64().map(|x| x as u32));
            check_decode(&tok, &f["decode"], "smollm2");
            check_stream(&tok, &cases, "smollm2");
        }
    }
    eprintln!(
        "smollm2: {matched} fixture strings matched across {} pre-tokenizers",
        PRES.len()
    );
}

/// Byte-level BPE `tokenizer.json` files in the shapes SmolLM2, Llama 3, Qwen2 and GPT-2
/// ship (Digits, Split regexes, NFC, add_prefix_space, ignore_merges, template processing).
#[test]
fn bpe_tokenizer_json_variants_match_hf() {
    let f = fixture("bpe_tokenizer_json.json");
    let cases = corpus_cases();
    let variants = f["expected"].as_object().unwrap();
    assert_eq!(variants.len(), 4);
    for (name, expected) in variants {
        let path = common::tests_dir().join(format!("fixtures/bpe_{name}.tokenizer.json"));
        let tok = Tokenizer::from_tokenizer_json(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        check_encode(
            &tok,
            &cases,
            &expected["encode"],
            false,
            &format!("tokenizer.json/{name}"),
        );
        check_encode(
            &tok,
            &cases,
            &expected["encode_with_special"],
            true,
            &format!("tokenizer.json/{name}+special"),
        );
    }
}
