//! SmolLM2-135M-Instruct (Q4_1 GGUF) against llama.cpp, when `QUENCH_SMOLLM2_GGUF` names the
//! model file: the eight prompts of `fixtures/llama_cpp_smollm2.json` (written by
//! scripts/fixtures/parity/make_llama_cpp_tokens.py) must tokenize to llama.cpp's prompt ids,
//! and quench's greedy decoding in [`Arithmetic::GgmlRounding`] must pick llama.cpp's 64
//! tokens, fed llama.cpp's tokens throughout (so that each step is judged on its own).
//!
//! That arithmetic rounds as llama.cpp's CPU path does (8-bit activation blocks before each
//! quantized product, f16 keys and values, ggml's summation orders). The rule is the issue's:
//! every pick identical, except at a near-tie of the f64 reference, fed the same tokens: the
//! two picks are its top two, less than [`TIE_GAP`] apart. Each such step is printed and
//! listed.
//!
//! The default f32 arithmetic is held to the FP64 check on the shortest case instead: its
//! logits stay within `0.05 + 0.003·|ref|` of f64, which llama.cpp's own roundings do not (by
//! up to half a unit), so at close calls it may pick the f64 top-1 where llama.cpp does not.

mod common;
#[path = "common/gguf_vocab.rs"]
mod gguf_vocab;

use std::time::Instant;

use common::{argmax, logit_violations};
use quench_cpu::{Arithmetic, Decoder, GgmlKernels, KvCache, Logits};
use quench_models::arch::{ModelConfig, Naming};

use quench_models::GgufFile;
use serde_json::Value;

/// f64 top-1 − top-2 logit gap below which either of the two is a correct greedy pick.
const TIE_GAP: f64 = 1e-3;

const FIXTURE: &str = include_str!("fixtures/llama_cpp_smollm2.json");

struct Case {
    name: String,
    prompt: String,
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    /// llama.cpp's top-1 − top-2 logit gap at each step, to 5 decimals.
    llama_cpp_gaps: Vec<f64>,
}

impl Case {
    fn tokens(&self) -> Vec<u32> {
        self.prompt_ids
            .iter()
            .chain(&self.generated_ids)
            .copied()
            .collect()
    }
}

fn ids(v: &Value, key: &str) -> Vec<u32> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("fixture: {key} is not a list"))
        .iter()
        .map(|x| x.as_u64().expect("fixture: token id") as u32)
        .collect()
}

fn cases() -> Vec<Case> {
    let fixture: Value = serde_json::from_str(FIXTURE).expect("fixture is JSON");
    fixture["cases"]
        .as_array()
        .expect("fixture: cases")
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().expect("fixture: name").to_owned(),
            prompt: c["prompt"].as_str().expect("fixture: prompt").to_owned(),
            prompt_ids: ids(c, "prompt_ids"),
            generated_ids: ids(c, "generated_ids"),
            llama_cpp_gaps: c["llama_cpp_top2_gap"]
                .as_array()
                .expect("fixture: llama_cpp_top2_gap")
                .iter()
                .map(|g| g.as_f64().expect("fixture: gap"))
                .collect(),
        })
        .collect()
}

/// A step where quench's pick differs from llama.cpp's, judged by the f64 reference.
#[derive(Debug)]
struct Divergence {
    case: String,
    step: usize,
    quench: u32,
    llama_cpp: u32,
    f64_top2: (u32, u32),
    f64_gap: f64,
}

impl Divergence {
    /// The one excuse: the two picks are the reference's top two, nearly tied.
    fn is_tie(&self) -> bool {
        let picks = (self.quench, self.llama_cpp);
        self.f64_gap < TIE_GAP && (self.f64_top2 == picks || self.f64_top2 == (picks.1, picks.0))
    }
}

fn judge(case: &str, step: usize, quench: u32, llama_cpp: u32, logits: &[f64]) -> Divergence {
    let (mut first, mut second) = ((0usize, f64::NEG_INFINITY), (0usize, f64::NEG_INFINITY));
    for (i, &v) in logits.iter().enumerate() {
        if v > first.1 {
            second = first;
            first = (i, v);
        } else if v > second.1 {
            second = (i, v);
        }
    }
    Divergence {
        case: case.to_owned(),
        step,
        quench,
        llama_cpp,
        f64_top2: (first.0 as u32, second.0 as u32),
        f64_gap: first.1 - second.1,
    }
}

/// Largest logit minus the second largest, in f32 as llama.cpp's fixture script takes it.
fn top2_gap(logits: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in logits {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    first - second
}

/// Feeds one case's prompt, then llama.cpp's tokens one at a time, handing `each_step` the
/// step and the logits it was decided on.
fn replay(case: &Case, decoder: &Decoder<f32>, mut each_step: impl FnMut(usize, &[f32])) {
    let mut cache = decoder.new_cache_with_limit(case.prompt_ids.len() + 64);
    let mut logits = decoder
        .forward(&mut cache, &case.prompt_ids, Logits::Last)
        .expect("prefill");
    for (step, &token) in case.generated_ids.iter().enumerate() {
        each_step(step, logits.row(0));
        if step + 1 < case.generated_ids.len() {
            logits = decoder
                .forward(&mut cache, &[token], Logits::Last)
                .expect("decode step");
        }
    }
}

/// quench's greedy picks for one case, fed llama.cpp's tokens; each differing pick is judged
/// by the f64 reference, which is fed (in one batch) only up to where it is needed. Returns
/// the largest distance between quench's top-1 − top-2 gap and llama.cpp's.
fn judge_picks(
    case: &Case,
    decoder: &Decoder<f32>,
    reference: &Decoder<f64>,
    divergences: &mut Vec<Divergence>,
) -> f64 {
    let tokens = case.tokens();
    let mut reference_cache: Option<KvCache<f64>> = None;
    let mut gap_distance = 0.0f64;
    replay(case, decoder, |step, logits| {
        let gap = f64::from(top2_gap(logits));
        gap_distance = gap_distance.max((gap - case.llama_cpp_gaps[step]).abs());
        let (got, want) = (argmax(logits).expect("logits"), case.generated_ids[step]);
        if got != want {
            let position = case.prompt_ids.len() + step;
            let rc = reference_cache.get_or_insert_with(|| reference.new_cache());
            let fed = rc.len();
            let exact = reference
                .forward(rc, &tokens[fed..position], Logits::Last)
                .expect("f64 forward");
            divergences.push(judge(&case.name, step, got, want, exact.row(0)));
        }
    });
    gap_distance
}

/// Every logit of every position of one case, fed llama.cpp's tokens: f32 within
/// `0.05 + 0.003·|ref|` of f64.
fn check_every_logit(case: &Case, fast: &Decoder<f32>, reference: &Decoder<f64>) {
    let tokens = case.tokens();
    let mut got = fast
        .forward(&mut fast.new_cache(), &tokens, Logits::All)
        .expect("f32 forward");
    let want = reference
        .forward(&mut reference.new_cache(), &tokens, Logits::All)
        .expect("f64 forward");
    let (count, worst) = logit_violations(&want, &got);
    assert_eq!(
        count,
        0,
        "{}: {count} of {} logits out of bound, worst by {worst}",
        case.name,
        want.as_slice().len()
    );
    // The check must be able to fail: a logit moved just past its bound is caught.
    let r = want.as_slice()[7];
    got.as_mut_slice()[7] = (r + 0.051 + 0.003 * r.abs() + 1e-3) as f32;
    assert_eq!(logit_violations(&want, &got).0, 1);
    eprintln!(
        "{}: {} positions × {} logits of f32 within the fp64 bound",
        case.name,
        tokens.len(),
        want.cols()
    );
}

#[test]
fn smollm2_greedy_tokens_match_llama_cpp() {
    let Some(path) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let start = Instant::now();
    let file = GgufFile::open(&path).expect("open the GGUF named by QUENCH_SMOLLM2_GGUF");
    let config = ModelConfig::from_gguf(&file).expect("SmolLM2 config");
    let tokenizer = gguf_vocab::gguf_tokenizer(&file);
    let ggml = Decoder::<f32>::load_with_arithmetic(
        config.clone(),
        &file,
        Naming::Gguf,
        // The fixture's llama.cpp was built with -DGGML_NATIVE=OFF: AVX2.
        Arithmetic::GgmlRounding(GgmlKernels::Avx2),
    )
    .expect("weights for llama.cpp's rounding");
    let fast = Decoder::<f32>::load(config.clone(), &file, Naming::Gguf).expect("f32 weights");
    let reference = Decoder::<f64>::load(config, &file, Naming::Gguf).expect("f64 weights");
    let cases = cases();
    assert_eq!(cases.len(), 8, "the fixture holds eight prompts");

    let mut divergences = Vec::new();
    let mut gap_distance = 0.0f64;
    for case in &cases {
        let prompt = tokenizer.encode(&case.prompt, true).expect("tokenize");
        assert_eq!(
            prompt, case.prompt_ids,
            "{}: quench's prompt tokens differ from llama.cpp's",
            case.name
        );
        assert_eq!(case.generated_ids.len(), 64, "{}: 64 tokens", case.name);
        assert_eq!(case.llama_cpp_gaps.len(), 64, "{}: 64 gaps", case.name);
        gap_distance = gap_distance.max(judge_picks(case, &ggml, &reference, &mut divergences));
    }
    for d in &divergences {
        eprintln!(
            "{} step {}: quench {}, llama.cpp {}; f64 top two {:?}, {:.1e} apart: {}",
            d.case,
            d.step,
            d.quench,
            d.llama_cpp,
            d.f64_top2,
            d.f64_gap,
            if d.is_tie() { "a tie" } else { "REJECTED" }
        );
    }
    let ties = divergences.iter().filter(|d| d.is_tie()).count();
    let steps = cases.len() * 64;
    eprintln!(
        "SmolLM2 vs llama.cpp (ggml rounding): {} of {steps} greedy picks identical, {ties} \
         divergences at f64 ties, {} rejected ({:.0} s)",
        steps - divergences.len(),
        divergences.len() - ties,
        start.elapsed().as_secs_f64()
    );
    let rejected: Vec<&Divergence> = divergences.iter().filter(|d| !d.is_tie()).collect();
    assert!(
        rejected.is_empty(),
        "greedy picks that differ from llama.cpp without an f64 tie (gap < {TIE_GAP}) to \
         explain them: {rejected:#?}"
    );
    // Not only the picks: the margin between the best two logits is llama.cpp's at every
    // step, to the fixture's 5 decimals (rounding ggml's way reproduces its logits; a
    // different rounding moves these margins by hundredths to tenths).
    eprintln!("largest distance to llama.cpp's top-1 − top-2 gaps: {gap_distance:.1e}");
    assert!(
        gap_distance <= 6e-6,
        "top-1 − top-2 gaps differ from llama.cpp's by up to {gap_distance}"
    );
    // The gap check can fail: the default arithmetic misses llama.cpp's gaps.
    let mut f32_distance = 0.0f64;
    replay(&cases[0], &fast, |step, logits| {
        let gap = f64::from(top2_gap(logits));
        f32_distance = f32_distance.max((gap - cases[0].llama_cpp_gaps[step]).abs());
    });
    eprintln!(
        "{}: the f32 arithmetic's gaps differ by up to {f32_distance:.2}",
        cases[0].name
    );
    assert!(
        f32_distance > 1e-2,
        "f32 arithmetic within {f32_distance} of llama.cpp's gaps"
    );

    let shortest = cases
        .iter()
        .min_by_key(|c| c.prompt_ids.len())
        .expect("fixture has cases");
    check_every_logit(shortest, &fast, &reference);
}

#[test]
fn only_near_ties_of_the_reference_excuse_a_divergence() {
    // Reference logits: token 2 leads token 0 by 0.2, token 0 leads token 1 by 0.0005.
    let logits = [1.0, 0.9995, 1.2, -3.0];
    // Not a tie: quench on the top-1, llama.cpp 0.2 below it, or the other way round.
    assert!(!judge("t", 0, 2, 0, &logits).is_tie());
    assert!(!judge("t", 0, 0, 2, &logits).is_tie());
    // Close to each other but not the top two.
    assert!(!judge("t", 0, 0, 1, &logits).is_tie());
    // A near-exact tie between the top two goes either way; a gap of 1e-3 is no tie.
    let tied = [1.0, 0.9995, 0.2];
    assert!(judge("t", 0, 1, 0, &tied).is_tie());
    assert!(judge("t", 0, 0, 1, &tied).is_tie());
    assert!(!judge("t", 0, 0, 1, &[1.0, 0.999, 0.2]).is_tie());
}
