//! all-MiniLM-L6-v2 from a real Hugging Face checkpoint, when `QUENCH_MINILM_DIR` names one.

use quench_cpu::Encoder;
use quench_models::arch::{ModelConfig, Naming};
use quench_models::HfCheckpoint;
use quench_text::Tokenizer;

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn minilm_embeddings_rank_similar_sentences_and_match_f64() {
    let Some(dir) = quench_testkit::minilm_dir() else {
        return;
    };
    let checkpoint = HfCheckpoint::open(&dir).unwrap();
    let config = ModelConfig::from_hf_config(checkpoint.config()).unwrap();
    assert_eq!((config.hidden, config.layers, config.heads), (384, 6, 12));
    let tokenizer = Tokenizer::from_tokenizer_json(dir.join("tokenizer.json")).unwrap();
    let reference = Encoder::<f64>::load(config.clone(), &checkpoint, Naming::HuggingFace).unwrap();
    let fast = Encoder::<f32>::load(config, &checkpoint, Naming::HuggingFace).unwrap();

    let sentences = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
        "A man is riding a horse.",
    ];
    let mut embeddings = Vec::new();
    for s in sentences {
        let tokens = tokenizer.encode(s, true).unwrap();
        let want = reference.embed(&tokens, None).unwrap();
        let got: Vec<f64> = fast
            .embed(&tokens, None)
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        assert!(
            cosine(&want, &got) >= 0.999,
            "{s:?}: cosine {}",
            cosine(&want, &got)
        );
        embeddings.push(want);
    }
    let sim = |i: usize, j: usize| cosine(&embeddings[i], &embeddings[j]);
    eprintln!(
        "MiniLM cosines: food/bread {:.3}, food/baby {:.3}, food/horse {:.3}",
        sim(0, 1),
        sim(0, 2),
        sim(0, 3)
    );
    assert!(sim(0, 1) > 0.6, "similar sentences: {}", sim(0, 1));
    assert!(sim(0, 1) > sim(0, 3) && sim(0, 3) > sim(0, 2));
    assert!(sim(0, 2) < 0.3, "unrelated sentences: {}", sim(0, 2));
}
