//! `quench info --dispatches`: the GPU plan of a synthetic checkpoint, printed without a
//! GPU, line for line as the engine assembles it.

use std::path::Path;
use std::process::{Command, Output};

fn quench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quench"))
        .args(args)
        .output()
        .expect("quench runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A tiny llama checkpoint (2 layers, bf16) in a directory of its own.
fn tiny(tag: &str) -> std::path::PathBuf {
    tiny_in(tag, "bf16")
}

/// As [`tiny`], with weights in `dtype`.
fn tiny_in(tag: &str, dtype: &str) -> std::path::PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("dispatches-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = quench(&[
        "synth",
        "--shape",
        "tiny",
        "--arch",
        "llama",
        "--seed",
        "5",
        "--dtype",
        dtype,
        dir.to_str().expect("a UTF-8 path"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    dir
}

#[test]
fn the_plan_lists_every_dispatch_of_a_step_and_a_chunk() {
    let dir = tiny("plan");
    let model = dir.to_str().unwrap();
    let out = quench(&["info", model, "--dispatches", "--prefill-chunk", "24"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let chunk = lines
        .iter()
        .position(|l| *l == "prompt chunk of 24 tokens")
        .expect("the chunk's header");
    assert_eq!(lines[0], "decode step of 1 row");
    let (step, prompt) = (&lines[1..chunk], &lines[chunk + 1..]);
    // A one-row step: the embedding, six dispatches a layer, the LM head, the argmax.
    let layers = step.iter().filter(|l| l.contains(": attention |")).count();
    assert!(layers >= 1, "{stdout}");
    assert_eq!(step.len(), 1 + 6 * layers + 2, "{stdout}");
    assert!(
        step[0].starts_with("token embedding | embed_"),
        "{}",
        step[0]
    );
    assert!(
        step.last().unwrap().starts_with("argmax | argmax"),
        "{stdout}"
    );
    // Every line: label | kernel #fingerprint | launch | arguments.
    for l in step.iter().chain(prompt) {
        let parts: Vec<&str> = l.splitn(4, " | ").collect();
        assert_eq!(parts.len(), 4, "{l}");
        assert!(
            parts[1].contains(" #") && parts[2].starts_with("grid ["),
            "{l}"
        );
    }
    // The chunk's GEMMs grow with its 24 rows; its head reads the last row's residual.
    assert!(prompt
        .iter()
        .any(|l| l.contains("q|k|v projection | gemm_")));
    let head = prompt
        .iter()
        .find(|l| l.starts_with("output norm + LM head (last row)"))
        .expect("the chunk's LM head");
    let hidden_bytes_23_rows = head
        .split(", ")
        .find_map(|a| a.strip_prefix("residual+"))
        .expect("the residual argument");
    assert_ne!(hidden_bytes_23_rows, "0", "{head}");

    // Several rows: the norms get dispatches of their own.
    let out = quench(&["info", model, "--dispatches", "--rows", "3"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let three = text(&out.stdout);
    assert!(three.starts_with("decode step of 3 rows\n"));
    assert!(three.lines().count() > lines[..chunk].len(), "{three}");
    assert!(three.contains(": attention norm | rmsnorm_rows"), "{three}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn f16_weights_list_their_prompt_chunk_on_the_tensor_cores() {
    let dir = tiny_in("f16", "f16");
    let out = quench(&[
        "info",
        dir.to_str().unwrap(),
        "--dispatches",
        "--prefill-chunk",
        "8",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let chunk = stdout
        .split("prompt chunk of 8 tokens")
        .nth(1)
        .unwrap_or_else(|| panic!("no prompt chunk listed: {stdout}"));
    assert!(chunk.contains("| gemm_f16_xf16"), "{stdout}");
    assert!(chunk.contains("| rmsnorm_residual_f16"), "{stdout}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_plan_requests_are_refused_by_name() {
    let dir = tiny("bad");
    let model = dir.to_str().unwrap();
    let out = quench(&["info", model, "--dispatches", "--rows", "0"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--rows"),
        "{}",
        text(&out.stderr)
    );
    let out = quench(&["info", model, "--rows", "2"]);
    assert_eq!(out.status.code(), Some(2), "--rows needs --dispatches");
    std::fs::remove_dir_all(&dir).unwrap();
}
