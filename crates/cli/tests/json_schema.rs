//! `quench generate --json-schema FILE` on a synthetic checkpoint (random weights, sampled
//! at temperature 1): the output is JSON valid against the schema; a schema that cannot be
//! compiled is an error naming the option.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "cli-{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn quench(args: &[&str], cache: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_quench"))
        .args(args)
        .env("QUENCH_HOME", cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "quench panicked: {stderr}");
    out
}

#[test]
fn generate_follows_a_json_schema() {
    let dir = scratch("json-schema");
    let cache = dir.join("cache");
    let model = dir.join("llama");
    let model = model.to_str().unwrap();
    let out = quench(
        &[
            "synth", "--arch", "llama", "--shape", "tiny", "--seed", "5", model,
        ],
        &cache,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let schema = json!({
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 99},
            "ok": {"type": "boolean"},
            "kind": {"enum": ["a", "b"]},
            "tag": {"type": "string", "maxLength": 4}
        },
        "required": ["n", "ok", "kind", "tag"],
        "additionalProperties": false
    });
    let file = dir.join("schema.json");
    std::fs::write(&file, schema.to_string()).unwrap();
    let file = file.to_str().unwrap();
    for seed in ["1", "2", "3"] {
        let out = quench(
            &[
                "generate",
                "-m",
                model,
                "--json-schema",
                file,
                "--max-tokens",
                "200",
                "--temperature",
                "1",
                "--seed",
                seed,
                "A record:",
            ],
            &cache,
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("JSON complete"), "{stderr}");
        let text = String::from_utf8(out.stdout).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!((0..=99).contains(&v["n"].as_i64().unwrap_or(-1)), "{v}");
        assert!(v["ok"].is_boolean(), "{v}");
        assert!(
            ["a", "b"].contains(&v["kind"].as_str().unwrap_or("")),
            "{v}"
        );
        assert!(
            v["tag"].as_str().is_some_and(|t| t.chars().count() <= 4),
            "{v}"
        );
        assert_eq!(v.as_object().unwrap().len(), 4, "{v}");
    }
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"type": "no-such-type"}"#).unwrap();
    let out = quench(
        &[
            "generate",
            "-m",
            model,
            "--json-schema",
            bad.to_str().unwrap(),
            "x",
        ],
        &cache,
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--json-schema") && stderr.contains("no-such-type"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
