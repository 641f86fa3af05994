//! Decoder forward passes on tiny random models.

mod common;
#[path = "common/naive.rs"]
mod naive;

use common::{logit_violations, max_rel_diff, random_decoder, tiny_config, to_gguf_layout, Filler};
use quench_cpu::{CpuError, Decoder, Logits};
use quench_models::arch::{Arch, ArchError, ModelConfig, Naming, RopeStyle, TensorSource};

const DECODERS: [Arch; 3] = [Arch::Llama, Arch::Qwen2, Arch::Qwen3];

fn all_logits<T: quench_cpu::Real>(
    config: &ModelConfig,
    src: &dyn TensorSource,
    naming: Naming,
    tokens: &[u32],
) -> quench_cpu::Matrix<T> {
    let model = Decoder::<T>::load(config.clone(), src, naming).unwrap();
    let mut cache = model.new_cache();
    model.forward(&mut cache, tokens, Logits::All).unwrap()
}

#[test]
fn the_f64_forward_matches_a_plain_second_implementation() {
    for (i, arch) in DECODERS.into_iter().enumerate() {
        let config = tiny_config(arch);
        let src = random_decoder(&config, 50 + i as u64);
        let tokens = Filler::new(60 + i as u64).tokens(12, config.vocab);
        let got = all_logits::<f64>(&config, &src, Naming::HuggingFace, &tokens);
        let want = naive::naive_logits(&config, &src, &tokens);
        for (t, row) in want.iter().enumerate() {
            let d = max_rel_diff(row, got.row(t));
            assert!(d < 1e-12, "{arch:?}: position {t} differs by {d}");
        }
    }
}

#[test]
fn f32_logits_are_within_the_fp64_bound() {
    for (i, arch) in DECODERS.into_iter().enumerate() {
        let config = tiny_config(arch);
        let src = random_decoder(&config, 100 + i as u64);
        let tokens = Filler::new(200 + i as u64).tokens(24, config.vocab);
        let reference = all_logits::<f64>(&config, &src, Naming::HuggingFace, &tokens);
        let got = all_logits::<f32>(&config, &src, Naming::HuggingFace, &tokens);
        let (count, worst) = logit_violations(&reference, &got);
        assert_eq!(
            count, 0,
            "{arch:?}: {count} logits out of bound, worst by {worst}"
        );
        // The logits must be spread enough for the bound to mean something.
        let spread = reference
            .as_slice()
            .iter()
            .fold(0.0f64, |m, v| m.max(v.abs()));
        assert!(spread > 2.0, "{arch:?}: logits only reach {spread}");

        // Control: the wrong RoPE pairing must fail the same check.
        let mut broken = config.clone();
        broken.rope_style = RopeStyle::Adjacent;
        let wrong = all_logits::<f32>(&broken, &src, Naming::HuggingFace, &tokens);
        let (count, _) = logit_violations(&reference, &wrong);
        assert!(
            count > reference.as_slice().len() / 4,
            "{arch:?}: wrong RoPE broke only {count} logits"
        );
    }
}

#[test]
fn decoding_with_the_cache_equals_recomputing() {
    for (i, arch) in DECODERS.into_iter().enumerate() {
        let config = tiny_config(arch);
        let src = random_decoder(&config, 300 + i as u64);
        let model = Decoder::<f64>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
        let tokens = Filler::new(400 + i as u64).tokens(17, config.vocab);
        let full = {
            let mut cache = model.new_cache();
            model.forward(&mut cache, &tokens, Logits::All).unwrap()
        };
        // Prefill 5, then chunks of 3 and single tokens.
        let mut cache = model.new_cache();
        let mut fed = 0;
        for len in [5, 3, 1, 1, 3, 1, 1, 1, 1] {
            let chunk = &tokens[fed..fed + len];
            let step = model.forward(&mut cache, chunk, Logits::All).unwrap();
            let last = model
                .forward(&mut model.new_cache(), &tokens[..fed + len], Logits::Last)
                .unwrap();
            for t in 0..len {
                let d = max_rel_diff(full.row(fed + t), step.row(t));
                assert!(d < 1e-12, "{arch:?}: position {}: differs by {d}", fed + t);
            }
            assert!(max_rel_diff(full.row(fed + len - 1), last.row(0)) < 1e-12);
            fed += len;
            assert_eq!(cache.len(), fed);
        }
        // Rewinding and feeding different tokens gives what a fresh run gives.
        cache.truncate(6);
        let other = Filler::new(500 + i as u64).tokens(4, config.vocab);
        let resumed = model.forward(&mut cache, &other, Logits::All).unwrap();
        let fresh_tokens: Vec<u32> = tokens[..6].iter().chain(&other).copied().collect();
        let fresh = model
            .forward(&mut model.new_cache(), &fresh_tokens, Logits::All)
            .unwrap();
        for t in 0..4 {
            assert!(max_rel_diff(fresh.row(6 + t), resumed.row(t)) < 1e-12);
        }
    }
}

#[test]
fn gguf_layout_gives_the_same_logits() {
    for (i, arch) in DECODERS.into_iter().enumerate() {
        let config = tiny_config(arch);
        let hf = random_decoder(&config, 600 + i as u64);
        let tokens = Filler::new(700 + i as u64).tokens(20, config.vocab);
        let reference = all_logits::<f64>(&config, &hf, Naming::HuggingFace, &tokens);

        // llama.cpp permutes llama's q/k and rotates adjacent pairs; qwen is left as is.
        let permuted = arch == Arch::Llama;
        let gguf = to_gguf_layout(&hf, &config, permuted);
        let mut gguf_config = config.clone();
        if permuted {
            gguf_config.rope_style = RopeStyle::Adjacent;
        }
        let got = all_logits::<f64>(&gguf_config, &gguf, Naming::Gguf, &tokens);
        let d = max_rel_diff(reference.as_slice(), got.as_slice());
        assert!(d < 1e-12, "{arch:?}: GGUF layout differs by {d}");

        // Control: reading the permuted weights with the half-split pairing is wrong.
        if permuted {
            let wrong = all_logits::<f64>(&config, &gguf, Naming::Gguf, &tokens);
            let d = max_rel_diff(reference.as_slice(), wrong.as_slice());
            assert!(d > 0.1, "{arch:?}: permutation made no difference ({d})");
        }
    }
}

#[test]
fn tied_output_falls_back_to_the_embedding_and_untied_requires_it() {
    let config = tiny_config(Arch::Llama);
    let mut src = random_decoder(&config, 800);
    let output = src.remove("lm_head.weight").unwrap();
    let err = Decoder::<f32>::load(config.clone(), &src, Naming::HuggingFace)
        .err()
        .unwrap();
    assert!(
        matches!(&err, CpuError::Model(ArchError::MissingTensor { name }) if name == "lm_head.weight")
    );

    // Tied: logits are the normed hidden state against the embedding rows, so putting the
    // embedding in as the output must give the same logits.
    let mut tied = config.clone();
    tied.tied_embeddings = true;
    let tokens = Filler::new(801).tokens(6, config.vocab);
    let a = all_logits::<f64>(&tied, &src, Naming::HuggingFace, &tokens);
    let embedding = src.get("model.embed_tokens.weight").unwrap();
    src.insert("lm_head.weight", embedding.0, embedding.1)
        .unwrap();
    let b = all_logits::<f64>(&config, &src, Naming::HuggingFace, &tokens);
    assert_eq!(a, b);
    assert_ne!(output.1, src.get("lm_head.weight").unwrap().1);
}

#[test]
fn wrong_shapes_and_tokens_are_refused_by_name() {
    let config = tiny_config(Arch::Qwen2);
    let mut src = random_decoder(&config, 900);
    let (_, bias) = src.remove("model.layers.1.self_attn.k_proj.bias").unwrap();
    src.insert(
        "model.layers.1.self_attn.k_proj.bias",
        vec![bias.len() - 1],
        bias[1..].to_vec(),
    )
    .unwrap();
    let err = Decoder::<f32>::load(config.clone(), &src, Naming::HuggingFace)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "tensor model.layers.1.self_attn.k_proj.bias has shape [15], but this model needs [16]"
    );

    let src = random_decoder(&config, 901);
    let model = Decoder::<f32>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
    let mut cache = model.new_cache();
    let err = model
        .forward(&mut cache, &[1, 61, 2], Logits::Last)
        .unwrap_err();
    assert!(matches!(
        err,
        CpuError::TokenOutOfRange {
            token: 61,
            vocab: 61
        }
    ));
    assert!(matches!(
        model.forward(&mut cache, &[], Logits::Last),
        Err(CpuError::NoTokens)
    ));
    assert_eq!(cache.len(), 0);

    let other = tiny_config(Arch::Qwen3);
    let other_model = Decoder::<f32>::load(
        other.clone(),
        &random_decoder(&other, 902),
        Naming::HuggingFace,
    )
    .unwrap();
    let err = model
        .forward(&mut other_model.new_cache(), &[1], Logits::Last)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "model configuration: cache was made for another model; use Decoder::new_cache"
    );
}

#[test]
fn context_overflow_is_an_error_that_leaves_the_cache_alone() {
    let config = tiny_config(Arch::Llama);
    let src = random_decoder(&config, 1000);
    let model = Decoder::<f32>::load(config.clone(), &src, Naming::HuggingFace).unwrap();
    let mut cache = model.new_cache_with_limit(10);
    assert_eq!(cache.limit(), 10);
    let tokens = Filler::new(1001).tokens(8, config.vocab);
    model.forward(&mut cache, &tokens, Logits::Last).unwrap();
    let err = model
        .forward(&mut cache, &[1, 2, 3], Logits::Last)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "context overflow: 8 positions already used plus 3 new tokens exceed the context \
         limit of 10 tokens"
    );
    assert_eq!(cache.len(), 8);
    model.forward(&mut cache, &[1, 2], Logits::Last).unwrap();
    assert_eq!(cache.len(), 10);
    // The model's own limit caps a larger request.
    assert_eq!(
        model.new_cache_with_limit(1000).limit(),
        config.max_positions
    );
}

#[test]
fn invalid_configs_are_refused_by_name() {
    let mut config = tiny_config(Arch::Llama);
    config.kv_heads = 3;
    let src = random_decoder(&tiny_config(Arch::Llama), 1100);
    let err = Decoder::<f32>::load(config, &src, Naming::HuggingFace)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "model configuration: kv_heads 3 does not divide heads = 4"
    );
    let err = Decoder::<f32>::load(tiny_config(Arch::Bert), &src, Naming::HuggingFace)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "bert models are not supported by the decoder"
    );
}

#[test]
fn earlier_positions_never_see_later_tokens() {
    let config = tiny_config(Arch::Llama);
    let src = random_decoder(&config, 1200);
    let mut tokens = Filler::new(1201).tokens(10, config.vocab);
    let a = all_logits::<f64>(&config, &src, Naming::HuggingFace, &tokens);
    tokens[9] = (tokens[9] + 1) % config.vocab as u32;
    let b = all_logits::<f64>(&config, &src, Naming::HuggingFace, &tokens);
    for t in 0..9 {
        assert_eq!(a.row(t), b.row(t), "position {t} changed");
    }
    assert!(max_rel_diff(a.row(9), b.row(9)) > 1e-3);
}
