//! all-MiniLM-L6-v2 against sentence-transformers, when `QUENCH_MINILM_DIR` names the model
//! folder (config.json, model.safetensors, tokenizer.json): same token ids and embeddings
//! with cosine ≥ [`MIN_COSINE`] for each sentence of `fixtures/minilm_sentence_transformers.json`
//! (written by scripts/fixtures/parity/make_minilm_embeddings.py).

use quench_cpu::Encoder;
use quench_models::arch::{ModelConfig, Naming};
use quench_models::HfCheckpoint;
use quench_text::Tokenizer;
use serde_json::Value;

const MIN_COSINE: f64 = 0.9999;

const FIXTURE: &str = include_str!("fixtures/minilm_sentence_transformers.json");

struct Case {
    sentence: String,
    /// Sentences of one group are paraphrases; `None`: related to no other sentence.
    group: Option<String>,
    token_ids: Vec<u32>,
    embedding: Vec<f64>,
}

fn cases() -> Vec<Case> {
    let fixture: Value = serde_json::from_str(FIXTURE).expect("fixture is JSON");
    let list = |v: &Value, key: &str| -> Vec<Value> {
        v[key]
            .as_array()
            .unwrap_or_else(|| panic!("fixture: {key} is not a list"))
            .clone()
    };
    list(&fixture, "cases")
        .iter()
        .map(|c| Case {
            sentence: c["sentence"]
                .as_str()
                .expect("fixture: sentence")
                .to_owned(),
            group: c["group"].as_str().map(str::to_owned),
            token_ids: list(c, "token_ids")
                .iter()
                .map(|x| x.as_u64().expect("fixture: token id") as u32)
                .collect(),
            embedding: list(c, "embedding")
                .iter()
                .map(|x| x.as_f64().expect("fixture: embedding value"))
                .collect(),
        })
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "embedding widths differ");
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn minilm_embeddings_match_sentence_transformers() {
    let Some(dir) = quench_testkit::minilm_dir() else {
        return;
    };
    let checkpoint = HfCheckpoint::open(&dir).expect("open the checkpoint in QUENCH_MINILM_DIR");
    let config = ModelConfig::from_hf_config(checkpoint.config()).expect("MiniLM config");
    let tokenizer =
        Tokenizer::from_tokenizer_json(dir.join("tokenizer.json")).expect("tokenizer.json");
    let fast = Encoder::<f32>::load(config.clone(), &checkpoint, Naming::HuggingFace)
        .expect("f32 weights");
    let reference =
        Encoder::<f64>::load(config, &checkpoint, Naming::HuggingFace).expect("f64 weights");
    let cases = cases();
    assert_eq!(cases.len(), 12, "the fixture holds twelve sentences");

    let mut embeddings = Vec::new();
    let mut worst = f64::INFINITY;
    for case in &cases {
        let tokens = tokenizer.encode(&case.sentence, true).expect("tokenize");
        assert_eq!(
            tokens, case.token_ids,
            "{:?}: quench's token ids differ from sentence-transformers'",
            case.sentence
        );
        // Poisoned: a result that never arrives cannot pass for the fixture.
        let mut got = vec![f64::NAN; case.embedding.len()];
        let fast_embedding = fast.embed(&tokens, None).expect("f32 embed");
        assert_eq!(fast_embedding.len(), got.len(), "embedding width");
        for (g, v) in got.iter_mut().zip(&fast_embedding) {
            *g = f64::from(*v);
        }
        let want = reference.embed(&tokens, None).expect("f64 embed");
        for (what, emb) in [("f32", &got), ("f64", &want)] {
            let c = cosine(emb, &case.embedding);
            assert!(
                c >= MIN_COSINE,
                "{:?}: quench {what} cosine to sentence-transformers {c:.6} < {MIN_COSINE}",
                case.sentence
            );
            worst = worst.min(c);
        }
        embeddings.push(got);
    }
    eprintln!(
        "MiniLM vs sentence-transformers: {} sentences, worst 1 − cosine {:.1e}",
        cases.len(),
        1.0 - worst
    );
    // The bound tells sentences apart: no embedding passes for the next sentence's.
    for (i, emb) in embeddings.iter().enumerate() {
        let other = &cases[(i + 1) % cases.len()];
        let c = cosine(emb, &other.embedding);
        assert!(
            c < MIN_COSINE,
            "{:?} passes for {:?} ({c})",
            cases[i].sentence,
            other.sentence
        );
    }

    // Each sentence of a paraphrase group is closer to its paraphrase than to any sentence
    // unrelated to it.
    for (i, a) in cases.iter().enumerate() {
        let Some(group) = &a.group else { continue };
        for (j, b) in cases.iter().enumerate() {
            if i == j || b.group.as_ref() != Some(group) {
                continue;
            }
            let paraphrase = cosine(&embeddings[i], &embeddings[j]);
            for (k, u) in cases.iter().enumerate() {
                if u.group.is_none() {
                    let unrelated = cosine(&embeddings[i], &embeddings[k]);
                    assert!(
                        paraphrase > unrelated,
                        "{:?}: paraphrase {:?} at {paraphrase:.3} ranks below unrelated {:?} \
                         at {unrelated:.3}",
                        a.sentence,
                        b.sentence,
                        u.sentence
                    );
                }
            }
        }
    }
}
