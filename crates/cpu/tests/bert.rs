//! BERT encoder on tiny random models.

mod common;

use common::{max_rel_diff, random_bert, tiny_config, Filler};
use quench_cpu::{CpuError, Encoder};
use quench_models::arch::{Arch, Naming};

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn f32_embeddings_match_f64() {
    let config = tiny_config(Arch::Bert);
    let src = random_bert(&config, 10, "");
    let reference = Encoder::<f64>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
    let fast = Encoder::<f32>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
    let mut filler = Filler::new(11);
    for _ in 0..4 {
        let tokens = filler.tokens(19, config.vocab);
        let want = reference.embed(&tokens, None).unwrap();
        let got: Vec<f64> = fast
            .embed(&tokens, None)
            .unwrap()
            .iter()
            .map(|&v| v as f64)
            .collect();
        let norm: f64 = want.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-12, "embedding norm {norm}");
        assert!(
            cosine(&want, &got) >= 0.999_999,
            "cosine {}",
            cosine(&want, &got)
        );
        assert!(max_rel_diff(&want, &got) < 1e-5);
        // Control: another sentence is far below the embedding bound of 0.999.
        let other = reference
            .embed(&filler.tokens(19, config.vocab), None)
            .unwrap();
        assert!(cosine(&want, &other) < 0.99);
    }
}

#[test]
fn attention_sees_both_directions_and_token_types_count() {
    let config = tiny_config(Arch::Bert);
    let src = random_bert(&config, 20, "");
    let model = Encoder::<f64>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
    let mut tokens = Filler::new(21).tokens(8, config.vocab);
    let a = model.hidden_states(&tokens, None).unwrap();
    tokens[7] = (tokens[7] + 1) % config.vocab as u32;
    let b = model.hidden_states(&tokens, None).unwrap();
    assert!(
        max_rel_diff(a.row(0), b.row(0)) > 1e-3,
        "the first token ignores the last"
    );

    let zeros = vec![0; tokens.len()];
    let mut types = zeros.clone();
    types[3..].fill(1);
    assert_eq!(
        model.hidden_states(&tokens, Some(&zeros)).unwrap(),
        model.hidden_states(&tokens, None).unwrap()
    );
    let typed = model.hidden_states(&tokens, Some(&types)).unwrap();
    assert!(max_rel_diff(b.row(0), typed.row(0)) > 1e-3);
}

#[test]
fn prefixed_checkpoints_load_the_same() {
    let config = tiny_config(Arch::Bert);
    let plain = random_bert(&config, 30, "");
    let prefixed = random_bert(&config, 30, "bert.");
    let tokens = Filler::new(31).tokens(6, config.vocab);
    let a = Encoder::<f64>::load(config.clone(), &plain, Naming::HuggingFace).unwrap();
    let b = Encoder::<f64>::load(config.clone(), &prefixed, Naming::HuggingFace).unwrap();
    assert_eq!(
        a.embed(&tokens, None).unwrap(),
        b.embed(&tokens, None).unwrap()
    );
}

#[test]
fn bad_input_is_refused_by_name() {
    let config = tiny_config(Arch::Bert);
    let src = random_bert(&config, 40, "");
    let model = Encoder::<f32>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
    let long = vec![1; config.max_positions + 1];
    let err = model.embed(&long, None).unwrap_err();
    assert!(matches!(
        err,
        CpuError::ContextOverflow {
            limit: 40,
            used: 0,
            added: 41
        }
    ));
    assert!(matches!(
        model.embed(&[1, 2], Some(&[0, 2])),
        Err(CpuError::TokenTypeOutOfRange {
            token_type: 2,
            types: 2
        })
    ));
    assert!(matches!(
        model.embed(&[1, 2], Some(&[0])),
        Err(CpuError::TokenTypeCount {
            given: 1,
            tokens: 2
        })
    ));
    assert!(matches!(model.embed(&[], None), Err(CpuError::NoTokens)));
    let err = Encoder::<f32>::load(tiny_config(Arch::Llama), &src, Naming::HuggingFace)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "llama models are not supported by the BERT encoder"
    );
}
