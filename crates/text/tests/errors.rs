//! Bad inputs are refused with errors that name what is wrong, never with a panic.

mod common;

use common::{strings, tests_dir};
use quench_text::{GgufVocab, TextError, Tokenizer};

fn gpt2_vocab() -> GgufVocab {
    GgufVocab {
        model: "gpt2".into(),
        pre: Some("gpt2".into()),
        tokens: ["a", "b", "ab"].map(String::from).to_vec(),
        merges: Some(vec!["a b".into()]),
        ..GgufVocab::default()
    }
}

fn err_text(r: Result<Tokenizer, TextError>) -> String {
    r.expect_err("should be refused").to_string()
}

#[test]
fn gguf_vocab_refusals_name_the_problem() {
    let empty = GgufVocab {
        tokens: vec![],
        ..gpt2_vocab()
    };
    assert!(matches!(
        Tokenizer::from_gguf_vocab(&empty),
        Err(TextError::NoVocab)
    ));

    let unknown = GgufVocab {
        model: "rwkv".into(),
        ..gpt2_vocab()
    };
    assert!(err_text(Tokenizer::from_gguf_vocab(&unknown)).contains("\"rwkv\""));

    let pre = GgufVocab {
        pre: Some("deepseek-coder".into()),
        ..gpt2_vocab()
    };
    let msg = err_text(Tokenizer::from_gguf_vocab(&pre));
    assert!(
        msg.contains("\"deepseek-coder\"") && msg.contains("tokenizer.ggml.pre"),
        "{msg}"
    );

    let no_merges = GgufVocab {
        merges: None,
        ..gpt2_vocab()
    };
    assert!(err_text(Tokenizer::from_gguf_vocab(&no_merges)).contains("tokenizer.ggml.merges"));

    let bad_merge = GgufVocab {
        merges: Some(vec!["ab".into()]),
        ..gpt2_vocab()
    };
    assert!(err_text(Tokenizer::from_gguf_vocab(&bad_merge)).contains("merge 0"));

    let no_scores = GgufVocab {
        model: "llama".into(),
        ..gpt2_vocab()
    };
    assert!(err_text(Tokenizer::from_gguf_vocab(&no_scores)).contains("tokenizer.ggml.scores"));

    let short_scores = GgufVocab {
        model: "llama".into(),
        scores: Some(vec![0.0]),
        ..gpt2_vocab()
    };
    assert!(err_text(Tokenizer::from_gguf_vocab(&short_scores))
        .contains("has 1 entries but the vocabulary has 3"));

    let bad_bos = GgufVocab {
        bos_id: Some(99),
        ..gpt2_vocab()
    };
    assert!(err_text(Tokenizer::from_gguf_vocab(&bad_bos)).contains("tokenizer.ggml.bos_token_id"));

    let bad_types = GgufVocab {
        token_types: Some(vec![1]),
        ..gpt2_vocab()
    };
    assert!(err_text(Tokenizer::from_gguf_vocab(&bad_types)).contains("tokenizer.ggml.token_type"));

    let bert_no_unk = GgufVocab {
        model: "bert".into(),
        ..gpt2_vocab()
    };
    assert!(err_text(Tokenizer::from_gguf_vocab(&bert_no_unk))
        .contains("tokenizer.ggml.unknown_token_id"));
}

fn small_json() -> serde_json::Value {
    let text = std::fs::read_to_string(tests_dir().join("fixtures/wordpiece_small.tokenizer.json"))
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

fn json_err(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut j = small_json();
    edit(&mut j);
    err_text(Tokenizer::from_tokenizer_json_str(&j.to_string()))
}

#[test]
fn tokenizer_json_refusals_name_the_field() {
    assert!(json_err(|j| j["model"]["type"] = "Unigram".into()).contains("\"Unigram\""));
    assert!(json_err(|j| j["model"]
        .as_object_mut()
        .unwrap()
        .remove("vocab")
        .map(drop)
        .unwrap())
    .contains("model.vocab"));
    assert!(json_err(|j| j["model"]["unk_token"] = 5.into()).contains("model.unk_token"));
    assert!(
        json_err(|j| j["normalizer"]["type"] = "Precompiled".into()).contains("\"Precompiled\"")
    );
    assert!(
        json_err(|j| j["pre_tokenizer"]["type"] = "Metaspace".into()).contains("\"Metaspace\"")
    );
    assert!(json_err(|j| j["decoder"]["type"] = "CTC".into()).contains("\"CTC\""));
    assert!(json_err(|j| j["added_tokens"][0]["id"] = (-1).into()).contains("added_tokens[0].id"));
    assert!(json_err(|j| j["model"]["vocab"]["zzz-extra"] = 99999.into()).contains("99999"));
    assert!(json_err(|j| {
        j["pre_tokenizer"] = serde_json::json!({"type": "Split", "pattern": {"Regex": "\\s"}, "behavior": "Contiguous", "invert": false});
    })
    .contains("\"Contiguous\""));
    let msg = err_text(Tokenizer::from_tokenizer_json_str("{ not json"));
    assert!(msg.starts_with("tokenizer.json:"), "{msg}");
    let msg = err_text(Tokenizer::from_tokenizer_json(
        tests_dir().join("fixtures/no-such-file.json"),
    ));
    assert!(msg.contains("no-such-file.json"), "{msg}");
}

#[test]
fn decoding_an_unknown_id_is_an_error() {
    let tok = Tokenizer::from_gguf_vocab(&gpt2_vocab()).unwrap();
    assert!(matches!(
        tok.decode(&[0, 7], false),
        Err(TextError::UnknownId(7))
    ));
    let mut stream = tok.decode_stream(false);
    assert!(stream.step(3).is_err());
}

/// Deterministic pseudo-random text over awkward characters: every tokenizer encodes it,
/// decodes its ids, and streams them without panicking.
#[test]
fn odd_input_never_panics() {
    let bpe_fixture = common::fixture("bpe_small.json");
    let bpe = Tokenizer::from_gguf_vocab(&GgufVocab {
        model: "gpt2".into(),
        pre: Some("llama-bpe".into()),
        tokens: strings(&bpe_fixture["tokens"]),
        merges: Some(strings(&bpe_fixture["merges"])),
        ..GgufVocab::default()
    })
    .unwrap();
    let wp =
        Tokenizer::from_tokenizer_json(tests_dir().join("fixtures/wordpiece_small.tokenizer.json"))
            .unwrap();
    let alphabet: Vec<char> =
        "a Z\t\n\r\u{0}\u{301}\u{200d}\u{fffd}\u{feff}'s’9١²你ア🏳️‍🌈\u{10ffff}<|im_start|>[CLS]▁#"
            .chars()
            .collect();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..300 {
        let len = (state % 40) as usize;
        let text: String = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                alphabet[(state % alphabet.len() as u64) as usize]
            })
            .collect();
        for tok in [&bpe, &wp] {
            let ids = tok.encode(&text, true).unwrap();
            tok.decode(&ids, true).unwrap();
            let mut stream = tok.decode_stream(false);
            for id in ids {
                stream.step(id).unwrap();
            }
            stream.finish().unwrap();
        }
    }
}
