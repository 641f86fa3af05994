//! SentencePiece-style vocabularies against ids from Hugging Face `tokenizers`.

mod common;

use common::{check_decode, check_encode, check_stream, corpus_cases, fixture, strings};
use quench_text::{GgufVocab, Tokenizer};

fn vocab() -> GgufVocab {
    let f = fixture("sentencepiece_small.json");
    let id = |k: &str| f[k].as_u64().map(|x| x as u32);
    GgufVocab {
        model: "llama".into(),
        tokens: strings(&f["tokens"]),
        scores: Some(
            f["scores"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_f64().unwrap() as f32)
                .collect(),
        ),
        token_types: Some(
            f["token_types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_i64().unwrap() as i32)
                .collect(),
        ),
        bos_id: id("bos"),
        eos_id: id("eos"),
        unk_id: id("unk"),
        ..GgufVocab::default()
    }
}

#[test]
fn synthetic_sentencepiece_matches_hf() {
    let f = fixture("sentencepiece_small.json");
    let tok = Tokenizer::from_gguf_vocab(&vocab()).unwrap();
    let cases = corpus_cases();
    check_encode(&tok, &cases, &f["encode"], false, "sentencepiece");
    check_encode(
        &tok,
        &cases,
        &f["encode_with_bos"],
        true,
        "sentencepiece+bos",
    );
}

#[test]
fn synthetic_sentencepiece_decodes_like_hf() {
    let tok = Tokenizer::from_gguf_vocab(&vocab()).unwrap();
    check_decode(
        &tok,
        &fixture("sentencepiece_small.json")["decode"],
        "sentencepiece",
    );
    check_stream(&tok, &corpus_cases(), "sentencepiece");
}

#[test]
fn byte_fallback_is_exercised() {
    let tok = Tokenizer::from_gguf_vocab(&vocab()).unwrap();
    let ids = tok.encode("你", false).unwrap();
    let pieces: Vec<&str> = ids.iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
    assert_eq!(pieces, ["▁", "<0xE4>", "<0xBD>", "<0xA0>"]);
}
