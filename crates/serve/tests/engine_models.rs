//! A model loaded from files by quench-engine (a synthetic checkpoint written to a temporary
//! directory): the server's step-by-step scheduling gives the engine's own greedy answers,
//! alone, in a batch, and across a session's turns; embedders whose files hold NaN or
//! infinite weights are answered with an error, never with `null` numbers.

mod common;

use std::path::PathBuf;

use common::TestServer;
use quench_engine::synth::{
    synthesize, write_tiny_embedder, EmbedderFormat, SynthArch, SynthDtype, SynthOptions,
    SynthShape,
};
use quench_engine::{load, GenerateOptions, LoadOptions, Prompt};
use quench_serve::{ModelSource, ModelSpec, ServeConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn synthetic_checkpoint(arch: SynthArch, seed: u64) -> TempDir {
    let dir = std::env::temp_dir().join(format!("quench-serve-{}-{seed:x}", arch.name()));
    let options = SynthOptions {
        arch,
        shape: SynthShape::Tiny,
        seed,
        dtype: SynthDtype::F32,
        max_shard_bytes: SynthOptions::DEFAULT_SHARD_BYTES,
    };
    synthesize(&dir, &options, &mut |_| {}).unwrap();
    TempDir(dir)
}

#[test]
fn engine_models_answer_as_the_engine_does() {
    let seed: u64 = rand::random();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for arch in [SynthArch::Llama, SynthArch::Qwen3] {
        let dir = synthetic_checkpoint(arch, seed);
        let model = load(&dir.0, &LoadOptions::default()).unwrap();
        let model = model.causal().unwrap();
        let options = GenerateOptions {
            max_tokens: 20,
            ..GenerateOptions::default()
        };
        let prompts: Vec<String> = (0..6)
            .map(|i| {
                let len = rng.gen_range(1..40) * (i + 1);
                (0..len)
                    .map(|_| rng.gen_range(b'a'..=b'z') as char)
                    .collect()
            })
            .collect();
        let expected: Vec<String> = prompts
            .iter()
            .map(|p| {
                model
                    .generate(
                        &mut model.new_session(),
                        Prompt::Text(p),
                        &options,
                        &mut |_| {},
                    )
                    .unwrap()
                    .text
            })
            .collect();

        let server = TestServer::start(ServeConfig {
            models: vec![ModelSpec {
                name: "synth".into(),
                source: ModelSource::Path(dir.0.clone()),
            }],
            port: 0,
            ..ServeConfig::default()
        });
        let ask = |p: &str| {
            let r = server.post(
                "/v1/completions",
                &json!({"model": "synth", "prompt": p, "max_tokens": 20, "temperature": 0}),
            );
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()["choices"][0]["text"].as_str().unwrap().to_owned()
        };
        let together: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = prompts.iter().map(|p| scope.spawn(|| ask(p))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(together, expected, "{} (seed {seed})", arch.name());

        // A session's second turn reuses its cache and still answers as the engine does.
        let turn = |p: &str| {
            let r = server.post(
                "/v1/completions",
                &json!({"model": "synth", "prompt": p, "max_tokens": 20, "temperature": 0,
                        "session_id": "s"}),
            );
            assert_eq!(r.status, 200, "{}", r.text());
            r.json()
        };
        let first = turn(&prompts[0]);
        let second = turn(" and more");
        let whole = format!(
            "{}{} and more",
            prompts[0],
            first["choices"][0]["text"].as_str().unwrap()
        );
        let want = model
            .generate(
                &mut model.new_session(),
                Prompt::Text(&whole),
                &options,
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(second["choices"][0]["text"], want.text.as_str());
        assert!(
            second["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
                > 0
        );
    }
}

/// Embedders whose checkpoints hold a NaN or an infinite weight (safetensors and GGUF): an
/// embeddings request gets 500 naming the problem, never 200 with `null` numbers, and the
/// server goes on answering, the healthy model beside them included.
#[test]
fn embedders_with_nan_or_infinite_weights_answer_500_and_the_server_goes_on() {
    let dir = std::env::temp_dir().join(format!("quench-serve-damaged-{}", std::process::id()));
    let dir = TempDir(dir);
    std::fs::create_dir_all(&dir.0).unwrap();
    let models = [
        ("healthy", EmbedderFormat::HuggingFace, None),
        (
            "nan-safetensors",
            EmbedderFormat::HuggingFace,
            Some(f32::NAN),
        ),
        (
            "inf-safetensors",
            EmbedderFormat::HuggingFace,
            Some(f32::INFINITY),
        ),
        ("nan-gguf", EmbedderFormat::Gguf, Some(f32::NAN)),
        ("inf-gguf", EmbedderFormat::Gguf, Some(f32::NEG_INFINITY)),
    ];
    let specs = models
        .iter()
        .map(|&(name, format, poison)| {
            let path = match format {
                EmbedderFormat::HuggingFace => dir.0.join(name),
                EmbedderFormat::Gguf => dir.0.join(format!("{name}.gguf")),
            };
            write_tiny_embedder(&path, format, 9, poison).unwrap();
            ModelSpec {
                name: name.into(),
                source: ModelSource::Path(path),
            }
        })
        .collect();
    let server = TestServer::start(ServeConfig {
        embedding_models: specs,
        port: 0,
        ..ServeConfig::default()
    });
    let embed = |model: &str| {
        server.post(
            "/v1/embeddings",
            &json!({"model": model, "input": ["hello there", "a second text"]}),
        )
    };
    let healthy = || {
        let r = embed("healthy");
        assert_eq!(r.status, 200, "{}", r.text());
        let body = r.json();
        let data = body["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        for d in data {
            let v = d["embedding"].as_array().unwrap();
            assert!(!v.is_empty() && v.iter().all(|x| x.as_f64().is_some_and(f64::is_finite)));
        }
    };
    healthy();
    for (name, _, _) in &models[1..] {
        for _ in 0..2 {
            let r = embed(name);
            assert_eq!(r.status, 500, "{name}: {}", r.text());
            assert!(r.json().get("data").is_none(), "{name}: {}", r.text());
            let error = &r.json()["error"];
            assert_eq!(error["type"], "server_error", "{name}");
            let message = error["message"].as_str().unwrap();
            assert!(
                message.contains("NaN or infinite") && message.contains("weights"),
                "{name}: {message}"
            );
            // The server is still up and the healthy model still answers.
            healthy();
        }
    }
    assert_eq!(server.get("/health").status, 200);
    server.stop();
}
