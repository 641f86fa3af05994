//! `generate --llama-cpp-rounding=BUILD` against llama.cpp itself, on prompts made up when the
//! test runs (a seed printed for replay): raw text of random words, numbers, punctuation,
//! line breaks and non-ASCII pieces, 3 to 150 words.
//!
//! For each build of llama.cpp (llama-cpp-python 0.3.36 built with AVX2 only, and with
//! AVX-512; the interpreters named by `QUENCH_LLAMA_CPP_AVX2_PYTHON` and
//! `QUENCH_LLAMA_CPP_AVX512_PYTHON`, which scripts/find-llama-cpp.sh builds) and for each
//! weight format the mode claims (SmolLM2's Q4_1 file, and a Q8_0 one the `gguf` package
//! writes from it), llama.cpp decodes every prompt greedily
//! (scripts/fixtures/parity/make_llama_cpp_tokens.py, n_ctx 512). quench, free-running in the
//! matching arithmetic, must read the same prompt ids, pick the same 48 tokens, and see the
//! same gap between its two best logits at every step (to llama.cpp's 5 decimals: the logits
//! are the same bits). Control: in the other build's arithmetic, quench's gaps differ from
//! llama.cpp's somewhere, so the comparison tells the two builds apart.
//!
//! Without the models or the interpreters the test fails in CI and reports NOT RUN elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

const PROMPTS: usize = 6;
const GENERATED: usize = 48;

fn scratch() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "llama-cpp-live-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Raw text made up from `rng`: words, numbers, punctuation, line breaks, non-ASCII pieces.
fn prompt(rng: &mut ChaCha8Rng) -> String {
    const WORDS: &[&str] = &[
        "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "river", "city",
        "world", "school", "people", "music", "water", "light", "history", "season", "because",
        "between", "known", "called", "after", "before", "small", "green", "quickly",
    ];
    const PIECES: &[&str] = &[
        ",",
        ".",
        ":",
        ";",
        "?",
        "!",
        "\n",
        "(",
        ")",
        "'s",
        "-",
        "\"",
        "naïve",
        "Straße",
        "日本語",
        "привет",
        "😀",
        "    ",
        "\t",
        "x = 3.14",
        "e-mail",
        "#tag",
    ];
    let words = rng.gen_range(3..=150);
    let mut parts: Vec<String> = Vec::with_capacity(words);
    for _ in 0..words {
        let r: f64 = rng.gen();
        parts.push(if r < 0.75 {
            WORDS[rng.gen_range(0..WORDS.len())].to_owned()
        } else if r < 0.85 {
            rng.gen_range(0..100_000u32).to_string()
        } else if r < 0.95 {
            PIECES[rng.gen_range(0..PIECES.len())].to_owned()
        } else {
            let w = WORDS[rng.gen_range(0..WORDS.len())];
            w[..1].to_uppercase() + &w[1..]
        });
    }
    parts.join(" ")
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("a list of token ids")
        .iter()
        .map(|x| x.as_u64().expect("a token id"))
        .collect()
}

/// Runs `python` with `args`; panics with its output if it fails.
fn python(python: &str, args: &[&str]) -> String {
    let out = Command::new(python)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    assert!(
        out.status.success(),
        "{python} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// llama.cpp's greedy decoding of `prompts` from `model`: the fixture script's cases.
fn llama_cpp(python_bin: &str, model: &Path, prompts: &Path, out: &Path) -> Vec<Value> {
    let script = repo().join("scripts/fixtures/parity/make_llama_cpp_tokens.py");
    let generated = GENERATED.to_string();
    python(
        python_bin,
        &[
            script.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--prompts",
            prompts.to_str().unwrap(),
            "--generated",
            &generated,
            "--context",
            "512",
            "--out",
            out.to_str().unwrap(),
        ],
    );
    let fixture: Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    fixture["cases"].as_array().expect("cases").clone()
}

/// What quench's greedy decoding of `case`'s prompt gives in `build`'s arithmetic: prompt ids,
/// tokens, and the top-1 − top-2 logit gap at each step rounded as the fixture rounds it.
fn quench(model: &Path, case: &Value, build: &str, dir: &Path) -> (Vec<u64>, Vec<u64>, Vec<f64>) {
    let logits_file = dir.join("logits.json");
    let rounding = format!("--llama-cpp-rounding={build}");
    let n = GENERATED.to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_quench"))
        .args([
            "generate",
            "-q",
            "-m",
            model.to_str().unwrap(),
            "--temperature",
            "0",
            "--max-tokens",
            &n,
            // llama.cpp's side picks a fixed count of tokens, past any end of text.
            "--ignore-eos",
            &rounding,
            "--logits-out",
            logits_file.to_str().unwrap(),
            // Made-up prompts may begin with '-': end the options first.
            "--",
            case["prompt"].as_str().unwrap(),
        ])
        .env("QUENCH_HOME", dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Value = serde_json::from_slice(&std::fs::read(&logits_file).unwrap()).unwrap();
    let gaps = got["logits"]
        .as_array()
        .expect("logits")
        .iter()
        .map(|step| {
            let mut top = [f32::NEG_INFINITY; 2];
            for v in step.as_array().expect("a step's logits") {
                let v = v.as_f64().expect("a logit") as f32;
                if v > top[0] {
                    top = [v, top[0]];
                } else if v > top[1] {
                    top[1] = v;
                }
            }
            // Python's round(gap, 5): the exact value to 5 decimals, ties to even.
            format!("{:.5}", f64::from(top[0] - top[1]))
                .parse::<f64>()
                .expect("a number")
        })
        .collect();
    (ids(&got["prompt_tokens"]), ids(&got["tokens"]), gaps)
}

#[test]
fn llama_cpp_rounding_picks_llama_cpp_s_tokens_on_fresh_prompts() {
    let Some(q4_1) = quench_testkit::smollm2_gguf() else {
        return;
    };
    let builds = [
        ("avx2", "avx512", "QUENCH_LLAMA_CPP_AVX2_PYTHON"),
        ("avx512", "avx2", "QUENCH_LLAMA_CPP_AVX512_PYTHON"),
    ];
    let mut pythons = Vec::new();
    for (build, other, var) in builds {
        let what = format!(
            "a Python with llama-cpp-python 0.3.36 built for {build} (scripts/find-llama-cpp.sh {build})"
        );
        let Some(python) = quench_testkit::env(var, &what) else {
            return;
        };
        pythons.push((build, other, python));
    }
    let dir = scratch();
    let seed = quench_testkit::seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let prompts: Vec<String> = (0..PROMPTS).map(|_| prompt(&mut rng)).collect();
    let prompts_file = dir.join("prompts.json");
    std::fs::write(&prompts_file, serde_json::to_vec(&prompts).unwrap()).unwrap();

    // The Q8_0 file, written by the `gguf` package from the Q4_1 one.
    let q8_0 = dir.join("smollm2-q8_0.gguf");
    python(
        &pythons[0].2,
        &[
            repo()
                .join("scripts/fixtures/parity/requantize_gguf.py")
                .to_str()
                .unwrap(),
            q4_1.to_str().unwrap(),
            q8_0.to_str().unwrap(),
            "q8_0",
        ],
    );

    let mut failures = Vec::new();
    for (build, other, python_bin) in &pythons {
        // The interpreter must hold the build it is named for.
        let info = python(
            python_bin,
            &[
                "-c",
                "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())",
            ],
        );
        assert_eq!(
            info.contains("AVX512 = 1"),
            *build == "avx512",
            "the {build} interpreter's llama.cpp: {info}"
        );
        for (format, model) in [("Q4_1", q4_1.as_path()), ("Q8_0", q8_0.as_path())] {
            let cases = llama_cpp(python_bin, model, &prompts_file, &dir.join("cases.json"));
            assert_eq!(cases.len(), PROMPTS);
            let mut other_gaps_differ = 0;
            for (i, case) in cases.iter().enumerate() {
                let want_gaps: Vec<f64> = case["llama_cpp_top2_gap"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|g| g.as_f64().unwrap())
                    .collect();
                let (prompt_ids, tokens, gaps) = quench(model, case, build, &dir);
                let label = format!("{build} {format} prompt {i} ({} tokens)", prompt_ids.len());
                if prompt_ids != ids(&case["prompt_ids"]) {
                    failures.push(format!("{label}: prompt ids differ"));
                    continue;
                }
                let want = ids(&case["generated_ids"]);
                if let Some(step) = (0..GENERATED).find(|&s| tokens[s] != want[s]) {
                    failures.push(format!(
                        "{label}: token {step} is {} where llama.cpp picked {} (its gap {})",
                        tokens[step], want[step], want_gaps[step]
                    ));
                } else if gaps != want_gaps {
                    let step = (0..GENERATED).find(|&s| gaps[s] != want_gaps[s]).unwrap();
                    failures.push(format!(
                        "{label}: step {step}'s top-2 gap {} where llama.cpp's is {}",
                        gaps[step], want_gaps[step]
                    ));
                }
                if format == "Q4_1" {
                    let (_, other_tokens, other_gaps) = quench(model, case, other, &dir);
                    other_gaps_differ +=
                        usize::from(other_tokens != want || other_gaps != want_gaps);
                }
            }
            if format == "Q4_1" {
                assert!(
                    other_gaps_differ > 0,
                    "control: quench in {other}'s arithmetic matched llama.cpp's {build} build on \
                     every prompt, so this comparison cannot tell the builds apart"
                );
                eprintln!(
                    "control: {other}'s arithmetic differs from the {build} build on \
                     {other_gaps_differ} of {PROMPTS} prompts"
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        failures.is_empty(),
        "seed {seed}: {} of {} runs differ from llama.cpp:\n{}",
        failures.len(),
        4 * PROMPTS,
        failures.join("\n")
    );
}
