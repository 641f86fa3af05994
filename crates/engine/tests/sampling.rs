//! Sampling on hand-made and random distributions.

use quench_engine::generate::{
    apply_repetition_penalty, argmax, min_p_filter, top_k_filter, top_p_filter, Candidate, Sampler,
    SamplingParams,
};
use quench_engine::EngineError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_logits(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(-5.0f32..5.0)).collect()
}

fn sampled(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        repetition_penalty: 1.0,
        seed,
        ..SamplingParams::greedy()
    }
}

fn candidates(probs: &[f64]) -> Vec<Candidate> {
    probs
        .iter()
        .enumerate()
        .map(|(i, &prob)| Candidate {
            token: i as u32,
            prob,
        })
        .collect()
}

fn tokens(c: &[Candidate]) -> Vec<u32> {
    c.iter().map(|c| c.token).collect()
}

#[test]
fn greedy_and_top_k_1_pick_the_argmax() {
    for seed in 0..20 {
        let logits = random_logits(seed, 97);
        let best = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap();
        assert_eq!(argmax(&logits), Some(best));
        let mut greedy = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(greedy.sample(&logits, &[]).unwrap(), best);
        let mut top1 = Sampler::new(sampled(1.5, 1, 1.0, 0.0, seed)).unwrap();
        assert_eq!(top1.sample(&logits, &[]).unwrap(), best);
    }
    // Ties go to the lowest id, for both.
    let tied = [0.5, 2.0, -1.0, 2.0];
    assert_eq!(argmax(&tied), Some(1));
    let mut top1 = Sampler::new(sampled(1.0, 1, 1.0, 0.0, 3)).unwrap();
    assert_eq!(top1.sample(&tied, &[]).unwrap(), 1);
}

#[test]
fn the_same_seed_draws_the_same_tokens() {
    let params = sampled(0.9, 40, 0.95, 0.02, 1234);
    let draw = |params: &SamplingParams| {
        let mut s = Sampler::new(params.clone()).unwrap();
        (0..50)
            .map(|i| s.sample(&random_logits(i, 200), &[]).unwrap())
            .collect::<Vec<_>>()
    };
    let a = draw(&params);
    assert_eq!(a, draw(&params));
    let other = SamplingParams {
        seed: 1235,
        ..params
    };
    assert_ne!(a, draw(&other));
}

#[test]
fn draws_follow_the_distribution() {
    // Logits ln(4), ln(3), ln(2), ln(1): probabilities 0.4, 0.3, 0.2, 0.1.
    let logits: Vec<f32> = [4.0f32, 3.0, 2.0, 1.0].iter().map(|p| p.ln()).collect();
    let mut s = Sampler::new(sampled(1.0, 0, 1.0, 0.0, 7)).unwrap();
    let n = 20_000;
    let mut counts = [0usize; 4];
    for _ in 0..n {
        counts[s.sample(&logits, &[]).unwrap() as usize] += 1;
    }
    for (i, want) in [0.4, 0.3, 0.2, 0.1].iter().enumerate() {
        let got = counts[i] as f64 / n as f64;
        // Five standard deviations of a binomial proportion.
        let sd = (want * (1.0 - want) / n as f64).sqrt();
        assert!((got - want).abs() < 5.0 * sd, "token {i}: {got} vs {want}");
    }
}

#[test]
fn filters_keep_what_they_should() {
    let sorted = candidates(&[0.5, 0.2, 0.15, 0.1, 0.05]);

    let mut c = sorted.clone();
    top_k_filter(&mut c, 2);
    assert_eq!(tokens(&c), [0, 1]);
    let mut c = sorted.clone();
    top_k_filter(&mut c, 0);
    assert_eq!(c, sorted);

    // Cumulative: 0.5, 0.7, 0.85, 0.95, 1.0.
    for (p, kept) in [
        (0.3, 1),
        (0.5, 1),
        (0.6, 2),
        (0.7, 2),
        (0.71, 3),
        (0.9, 4),
        (1.0, 5),
    ] {
        let mut c = sorted.clone();
        top_p_filter(&mut c, p);
        assert_eq!(c.len(), kept, "top_p {p}");
    }

    // Relative to the top probability 0.5: thresholds 0.05, 0.1, 0.2, 0.5.
    for (m, kept) in [(0.1, 5), (0.2, 4), (0.4, 2), (1.0, 1), (0.0, 5)] {
        let mut c = sorted.clone();
        min_p_filter(&mut c, m);
        assert_eq!(c.len(), kept, "min_p {m}");
    }
}

#[test]
fn the_distribution_applies_every_filter_and_renormalizes() {
    // Probabilities 0.4, 0.3, 0.2, 0.1 at temperature 1.
    let logits: Vec<f32> = [1.0f32, 4.0, 2.0, 3.0].iter().map(|p| p.ln()).collect();
    let dist = |params| {
        Sampler::new(params)
            .unwrap()
            .distribution(&logits, &[])
            .unwrap()
    };

    let all = dist(sampled(1.0, 0, 1.0, 0.0, 0));
    assert_eq!(tokens(&all), [1, 3, 2, 0]);
    for (c, want) in all.iter().zip([0.4, 0.3, 0.2, 0.1]) {
        assert!((c.prob - want).abs() < 1e-6);
    }
    // top-p 0.75 keeps 0.4 + 0.3 + 0.2 → renormalized over 0.9.
    let p = dist(sampled(1.0, 0, 0.75, 0.0, 0));
    assert_eq!(tokens(&p), [1, 3, 2]);
    assert!((p[0].prob - 0.4 / 0.9).abs() < 1e-6);
    // min-p 0.6 keeps those ≥ 0.24.
    let m = dist(sampled(1.0, 0, 1.0, 0.6, 0));
    assert_eq!(tokens(&m), [1, 3]);
    assert!((m[1].prob - 0.3 / 0.7).abs() < 1e-6);
    // top-k 3 first, then top-p over the renormalized three (0.444, 0.333, 0.222): 0.7 → two.
    let kp = dist(sampled(1.0, 3, 0.7, 0.0, 0));
    assert_eq!(tokens(&kp), [1, 3]);
    // Temperature 2 flattens: probabilities ∝ sqrt(4, 3, 2, 1).
    let t = dist(sampled(2.0, 0, 1.0, 0.0, 0));
    let total: f64 = [4.0f64, 3.0, 2.0, 1.0].iter().map(|p| p.sqrt()).sum();
    assert!((t[0].prob - 2.0 / total).abs() < 1e-6);
    // Masked (−∞) logits are never candidates.
    let masked = [f32::NEG_INFINITY, 0.0, 0.0];
    let d = Sampler::new(sampled(1.0, 0, 1.0, 0.0, 0))
        .unwrap()
        .distribution(&masked, &[])
        .unwrap();
    assert_eq!(tokens(&d), [1, 2]);
}

#[test]
fn repetition_penalty_discourages_seen_tokens_once() {
    let mut logits = vec![2.0, -2.0, 1.0, 4.0];
    apply_repetition_penalty(&mut logits, &[0, 1, 0, 9], 2.0);
    assert_eq!(logits, [1.0, -4.0, 1.0, 4.0]);

    // Through the sampler: the greedy choice moves off a repeated token.
    let params = SamplingParams {
        repetition_penalty: 1.5,
        ..SamplingParams::greedy()
    };
    let mut s = Sampler::new(params).unwrap();
    assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[]).unwrap(), 0);
    assert_eq!(s.sample(&[3.0, 2.5, 0.0], &[0]).unwrap(), 1);
}

#[test]
fn bad_parameters_and_logits_are_refused_by_name() {
    let bad = [
        (sampled(-1.0, 0, 1.0, 0.0, 0), "temperature"),
        (sampled(f32::NAN, 0, 1.0, 0.0, 0), "temperature"),
        (sampled(1.0, 0, 0.0, 0.0, 0), "top_p"),
        (sampled(1.0, 0, 1.5, 0.0, 0), "top_p"),
        (sampled(1.0, 0, 1.0, -0.1, 0), "min_p"),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..SamplingParams::greedy()
            },
            "repetition_penalty",
        ),
    ];
    for (params, name) in bad {
        match Sampler::new(params) {
            Err(EngineError::Sampling { param, .. }) => assert_eq!(param, name),
            other => panic!("{name}: {other:?}"),
        }
    }
    for params in [sampled(1.0, 0, 1.0, 0.0, 0), SamplingParams::greedy()] {
        let mut s = Sampler::new(params).unwrap();
        assert!(matches!(
            s.sample(&[0.0, f32::NAN], &[]),
            Err(EngineError::BadLogits { what: "NaN" })
        ));
        // +infinity would make every other probability 0 (and inf - inf NaN): refused too.
        let e = s.sample(&[0.0, f32::INFINITY, 1.0], &[]).unwrap_err();
        assert!(
            matches!(e, EngineError::BadLogits { what: "+infinity" }),
            "{e:?}"
        );
        assert!(e.to_string().contains("+infinity"), "{e}");
        assert!(s.sample(&[f32::NEG_INFINITY; 3], &[]).is_err());
    }
}

/// argmax passes NaN over, so that a NaN first does not win by comparing above nothing,
/// and has no answer for logits that are all NaN (the GPU's greedy step then refuses the
/// row instead of drawing token 0).
#[test]
fn argmax_passes_nan_over() {
    assert_eq!(argmax(&[f32::NAN; 4]), None);
    assert_eq!(argmax(&[]), None);
    assert_eq!(argmax(&[f32::NAN, 1.0, 3.0, f32::NAN, 2.0]), Some(2));
    assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), Some(1));
    assert_eq!(argmax(&[1.0, f32::INFINITY]), Some(1));
}

#[test]
fn bias_and_penalties_move_the_choice() {
    let logits = [1.0f32, 0.9, 0.0];
    let with = |bias: Vec<(u32, f32)>, presence: f32, frequency: f32| SamplingParams {
        logit_bias: bias,
        presence_penalty: presence,
        frequency_penalty: frequency,
        ..SamplingParams::greedy()
    };
    let draws = |params: SamplingParams, n: usize| {
        let mut s = Sampler::new(params).unwrap();
        (0..n)
            .map(|_| s.sample(&logits, &[]).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(draws(with(vec![], 0.0, 0.0), 3), [0, 0, 0]);
    assert_eq!(draws(with(vec![(2, 5.0)], 0.0, 0.0), 2), [2, 2]);
    assert_eq!(draws(with(vec![(0, -100.0)], 0.0, 0.0), 1), [1]);
    // Token 0 drawn once loses 0.2 and falls below token 1; once 1 is drawn too, both
    // have lost 0.2 (once, however often drawn) and 0 leads again.
    assert_eq!(draws(with(vec![], 0.2, 0.0), 4), [0, 1, 0, 0]);
    // 0.06 per draw: 0 leads until drawn twice (1.0 - 0.12 < 0.9).
    assert_eq!(draws(with(vec![], 0.0, 0.06), 3), [0, 0, 1]);
    // An id past the logits is ignored.
    assert_eq!(draws(with(vec![(7, 100.0)], 0.0, 0.0), 1), [0]);
    for bad in [
        with(vec![(0, 101.0)], 0.0, 0.0),
        with(vec![], 2.5, 0.0),
        with(vec![], 0.0, -2.1),
    ] {
        assert!(Sampler::new(bad).is_err());
    }
}
