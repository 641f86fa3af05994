//! Synthetic checkpoints end to end: written by `synth`, loaded, described and run.

use std::path::{Path, PathBuf};

use quench_engine::synth::{
    synthesize, tiny_embedding_model, write_tiny_embedder, EmbedderFormat, SynthArch, SynthDtype,
    SynthOptions, SynthShape,
};
use quench_engine::{
    inspect, load, Device, EngineError, Format, GenerateOptions, LoadOptions, Message, ModelKind,
    Precision, Prompt, SamplingParams,
};
use quench_models::HfCheckpoint;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A fresh directory under the target's temporary folder.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn synth(arch: SynthArch, seed: u64, dtype: SynthDtype, shard: u64) -> PathBuf {
    let dir = scratch(&format!("synth-{}", arch.name()));
    let options = SynthOptions {
        arch,
        shape: SynthShape::Tiny,
        seed,
        dtype,
        max_shard_bytes: shard,
    };
    synthesize(&dir, &options, &mut |_| {}).unwrap();
    dir
}

const ARCHS: [SynthArch; 3] = [SynthArch::Llama, SynthArch::Qwen2, SynthArch::Qwen3];

#[test]
fn tiny_models_load_describe_and_generate_finite_logits() {
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    for arch in ARCHS {
        let seed = rng.gen();
        let dir = synth(
            arch,
            seed,
            SynthDtype::Bf16,
            SynthOptions::DEFAULT_SHARD_BYTES,
        );
        let model = load(&dir, &LoadOptions::default()).unwrap();
        let info = model.info().clone();
        assert_eq!(
            (info.format, info.kind),
            (Format::HuggingFace, ModelKind::Causal)
        );
        assert_eq!(info.config.arch.name(), arch.name());
        assert_eq!(info.config.vocab, 320);
        assert_eq!(info.tensor_types.keys().collect::<Vec<_>>(), ["BF16"]);
        assert_eq!(info.context_length, 256);
        assert_eq!(info.weight_bytes, info.parameters * 4);
        assert_eq!(info.kv_cache_bytes, 2 * 2 * 2 * 16 * 256 * 4);

        let model = model.causal().unwrap();
        assert!(model.has_chat_template());
        let options = GenerateOptions {
            max_tokens: 6,
            keep_logits: true,
            ignore_eos: true,
            ..GenerateOptions::default()
        };
        let mut session = model.new_session();
        let g = model
            .generate(
                &mut session,
                Prompt::Text("the cat sat on"),
                &options,
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(g.tokens.len(), 6, "{arch:?}");
        let logits = g.logits.as_ref().unwrap();
        assert_eq!(logits.len(), 6);
        for row in logits {
            assert_eq!(row.len(), 320);
            assert!(
                row.iter().all(|v| v.is_finite()),
                "{arch:?}: non-finite logit"
            );
        }
        // Greedy: every drawn token is the argmax of its row.
        for (row, &t) in logits.iter().zip(&g.tokens) {
            let best = row
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
                .unwrap()
                .0;
            assert_eq!(best as u32, t);
        }

        // The f64 reference agrees with f32 on the same tokens.
        let reference = load(
            &dir,
            &LoadOptions {
                precision: Precision::F64,
                ..LoadOptions::default()
            },
        )
        .unwrap();
        let reference = reference.causal().unwrap();
        let r = reference
            .generate(
                &mut reference.new_session(),
                Prompt::Text("the cat sat on"),
                &options,
                &mut |_| {},
            )
            .unwrap();
        let r_logits = r.logits.unwrap();
        for (a, b) in logits[0].iter().zip(&r_logits[0]) {
            assert!(
                (a - b).abs() <= 1e-4 + 1e-4 * b.abs(),
                "{arch:?}: f32 {a} vs f64 {b}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn sessions_reuse_the_shared_prefix_and_give_the_same_tokens() {
    let dir = synth(SynthArch::Qwen2, rand::random(), SynthDtype::F32, u64::MAX);
    let model = load(&dir, &LoadOptions::default()).unwrap();
    let model = model.causal().unwrap();
    let options = GenerateOptions {
        max_tokens: 4,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let mut chat = vec![Message::new("user", "hello there")];
    let rendered = model.render_chat(&chat, true).unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n"
    );
    let mut session = model.new_session();
    let first = model
        .generate(&mut session, Prompt::Chat(&chat), &options, &mut |_| {})
        .unwrap();
    assert_eq!(first.reused_tokens, 0);
    assert_eq!(session.tokens().len(), first.prompt_tokens + 3);

    chat.push(Message::new("assistant", first.text.clone()));
    chat.push(Message::new("user", "and then"));
    let second = model
        .generate(&mut session, Prompt::Chat(&chat), &options, &mut |_| {})
        .unwrap();
    assert!(second.reused_tokens >= first.prompt_tokens, "{second:?}");
    let fresh = model
        .generate(
            &mut model.new_session(),
            Prompt::Chat(&chat),
            &options,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(fresh.reused_tokens, 0);
    assert_eq!(second.tokens, fresh.tokens);

    // A session of another model is refused.
    let other = load(&dir, &LoadOptions::default()).unwrap();
    let mut foreign = other.causal().unwrap().new_session();
    let err = model
        .generate(&mut foreign, Prompt::Text("x"), &options, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, EngineError::ForeignSession), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sampling_is_reproducible_by_seed_and_streams_the_whole_text() {
    let dir = synth(SynthArch::Llama, rand::random(), SynthDtype::F16, u64::MAX);
    let model = load(&dir, &LoadOptions::default()).unwrap();
    let model = model.causal().unwrap();
    let seed = rand::random();
    let options = |seed| GenerateOptions {
        max_tokens: 12,
        ignore_eos: true,
        sampling: SamplingParams {
            temperature: 1.0,
            seed,
            ..SamplingParams::greedy()
        },
        ..GenerateOptions::default()
    };
    let run = |seed| {
        let mut streamed = String::new();
        let g = model
            .generate(
                &mut model.new_session(),
                Prompt::Text("and the"),
                &options(seed),
                &mut |p| streamed.push_str(p),
            )
            .unwrap();
        assert_eq!(streamed, g.text);
        g
    };
    let (a, b, c) = (run(seed), run(seed), run(seed ^ 1));
    assert_eq!(a.tokens, b.tokens);
    assert_ne!(a.tokens, c.tokens, "another seed draws other tokens");
    // Llama's tokenizer puts <|begin_of_text|> first.
    let tokens = model.prompt_tokens(Prompt::Text("and the")).unwrap();
    assert_eq!(
        Some(tokens[0]),
        model.tokenizer().token_to_id("<|begin_of_text|>")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sharded_checkpoints_match_single_file_ones() {
    let seed = rand::random();
    let single = synth(SynthArch::Qwen3, seed, SynthDtype::Bf16, u64::MAX);
    let sharded = synth(SynthArch::Qwen3, seed, SynthDtype::Bf16, 60_000);
    assert!(sharded.join("model.safetensors.index.json").is_file());
    assert!(!sharded.join("model.safetensors").exists());
    let (a, b) = (
        HfCheckpoint::open(&single).unwrap(),
        HfCheckpoint::open(&sharded).unwrap(),
    );
    let mut names: Vec<String> = a.tensor_infos().map(|t| t.name.clone()).collect();
    names.sort();
    let mut b_names: Vec<String> = b.tensor_infos().map(|t| t.name.clone()).collect();
    b_names.sort();
    assert_eq!(names, b_names);
    for name in &names {
        let (x, y) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
        assert_eq!(x.shape, y.shape);
        let values = x.to_f32();
        assert_eq!(values, y.to_f32(), "{name}");
        // bf16 rounds within 2⁻⁸ relative.
        let bound = if name.ends_with("norm.weight") {
            1.1
        } else {
            0.035
        } * (1.0 + 1.0 / 256.0);
        assert!(
            values.iter().all(|v| v.abs() <= bound),
            "{name} out of its init range"
        );
    }
    // Another seed gives other weights.
    let other = synth(SynthArch::Qwen3, seed ^ 1, SynthDtype::Bf16, u64::MAX);
    let c = HfCheckpoint::open(&other).unwrap();
    let name = "model.layers.0.self_attn.q_proj.weight";
    assert_ne!(
        a.tensor(name).unwrap().to_f32(),
        c.tensor(name).unwrap().to_f32()
    );
    let info = inspect(&sharded, &LoadOptions::default()).unwrap();
    assert_eq!(info.config.arch.name(), "qwen3");
    for d in [single, sharded, other] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn a_shape_of_another_architecture_is_refused() {
    let dir = scratch("shape-check");
    let options = SynthOptions {
        arch: SynthArch::Llama,
        shape: SynthShape::Llama31_8b,
        seed: 1,
        dtype: SynthDtype::Bf16,
        max_shard_bytes: SynthOptions::DEFAULT_SHARD_BYTES,
    };
    // A mismatched architecture is refused before anything is written.
    let err = synthesize(
        &dir,
        &SynthOptions {
            arch: SynthArch::Qwen2,
            ..options
        },
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("llama"), "{err}");
    assert!(!dir.join("config.json").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_inputs_are_refused_by_name() {
    let dir = scratch("bad");
    let missing = dir.join("nothing-here.gguf");
    let err = load(&missing, &LoadOptions::default()).unwrap_err();
    assert!(matches!(err, EngineError::NotFound { .. }), "{err}");

    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let junk = dir.join("junk.bin");
    std::fs::write(
        &junk,
        (0..4096).map(|_| rng.gen::<u8>()).collect::<Vec<_>>(),
    )
    .unwrap();
    let err = load(&junk, &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not a model"), "{err}");

    // A GGUF header cut short.
    let cut = dir.join("cut.gguf");
    std::fs::write(&cut, b"GGUF\x03\x00\x00\x00\x05").unwrap();
    let err = load(&cut, &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("cut.gguf"), "{err}");

    // A directory without config.json.
    let err = load(&dir, &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");

    // A checkpoint with a broken config.json.
    let model = synth(SynthArch::Llama, rng.gen(), SynthDtype::F32, u64::MAX);
    std::fs::write(model.join("config.json"), "{\"hidden_size\": 0}").unwrap();
    let err = load(&model, &LoadOptions::default()).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");

    // The GPU backend refuses f32 matrices by name (or, without a GPU, says there is none).
    let good = synth(SynthArch::Llama, rng.gen(), SynthDtype::F32, u64::MAX);
    let err = load(
        &good,
        &LoadOptions {
            device: Device::Cuda,
            ..LoadOptions::default()
        },
    )
    .err()
    .unwrap();
    let msg = err.to_string();
    assert!(
        msg.contains("no GPU") || msg.contains("stored as F32"),
        "{msg}"
    );

    // A prompt longer than the context limit.
    let small = load(
        &good,
        &LoadOptions {
            context_limit: Some(8),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!(small.info().context_limit, 8);
    let small = small.causal().unwrap();
    let long = "the cat and the dog and the bird";
    let err = small
        .generate(
            &mut small.new_session(),
            Prompt::Text(long),
            &GenerateOptions::default(),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(err.to_string().contains("context limit of 8"), "{err}");
    let err = load(&good, &LoadOptions::default())
        .unwrap()
        .embedding()
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("does not make embeddings"),
        "{err}"
    );
    for d in [dir, model, good] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn one_model_serves_sessions_on_several_threads() {
    let dir = synth(SynthArch::Qwen3, rand::random(), SynthDtype::Bf16, u64::MAX);
    let model = std::sync::Arc::new(load(&dir, &LoadOptions::default()).unwrap());
    let options = GenerateOptions {
        max_tokens: 5,
        ignore_eos: true,
        ..GenerateOptions::default()
    };
    let prompts = ["the end", "in the", "and then"];
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let m = model.causal().unwrap();
            m.generate(&mut m.new_session(), Prompt::Text(p), &options, &mut |_| {})
                .unwrap()
                .tokens
        })
        .collect();
    let threads: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (model, options, p) = (model.clone(), options.clone(), p.to_string());
            std::thread::spawn(move || {
                let m = model.causal().unwrap();
                let mut session = m.new_session();
                m.generate(&mut session, Prompt::Text(&p), &options, &mut |_| {})
                    .unwrap()
                    .tokens
            })
        })
        .collect();
    let together: Vec<Vec<u32>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(alone, together);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn chat_templates_and_end_tokens_are_found_where_checkpoints_keep_them() {
    let dir = synth(SynthArch::Qwen2, rand::random(), SynthDtype::F32, u64::MAX);
    let config_path = dir.join("tokenizer_config.json");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let messages = [Message::new("user", "hi")];
    let render = || {
        let model = load(&dir, &LoadOptions::default()).unwrap();
        let model = model.causal().unwrap();
        (
            model.render_chat(&messages, false).ok(),
            model.eos_ids().to_vec(),
        )
    };
    let (original, eos) = render();
    let original = original.unwrap();
    // After the 256 bytes and 35 merges: <|endoftext|>, <|im_start|>, <|im_end|>. Both end
    // markers end generation: <|im_end|> as the configured EOS, <|endoftext|> as an
    // end-of-turn token of the vocabulary.
    let (end_of_text, im_end) = (256 + 35, 256 + 35 + 2);
    assert_eq!(eos, [end_of_text, im_end]);

    // A list of named templates: the one named "default".
    let mut listed = config.clone();
    listed["chat_template"] = serde_json::json!([
        {"name": "tool_use", "template": "TOOLS"},
        {"name": "default", "template": config["chat_template"]},
    ]);
    std::fs::write(&config_path, listed.to_string()).unwrap();
    assert_eq!(render().0.as_deref(), Some(original.as_str()));

    // chat_template.jinja beside a config without the key.
    let mut bare = config.clone();
    bare.as_object_mut().unwrap().remove("chat_template");
    std::fs::write(&config_path, bare.to_string()).unwrap();
    assert_eq!(render().0, None);
    std::fs::write(
        dir.join("chat_template.jinja"),
        config["chat_template"].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(render().0.as_deref(), Some(original.as_str()));

    // generation_config.json lists more end tokens.
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"eos_token_id": [256, 65]}"#,
    )
    .unwrap();
    assert_eq!(render().1, [65, 256, end_of_text, im_end]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each synthetic template family gives a conversation its tools and earlier calls in its
/// own form, and text held to the family's call grammar (sampled at temperature 1 from
/// random weights) reads back as a call of the defined tool with valid arguments.
#[test]
fn tool_calls_take_each_templates_form() {
    use quench_engine::generate::OutputFormat;
    use quench_text::{ToolCall, ToolFormat};
    use serde_json::json;

    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let tool = json!({"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["days"], "additionalProperties": false}}});
    let mut asked = Message::new("assistant", "");
    asked.tool_calls = vec![ToolCall {
        id: "call_1".into(),
        name: "weather".into(),
        arguments: json!({"days": 2}),
    }];
    let mut answered = Message::new("tool", "{\"sky\": \"clear\"}");
    answered.tool_call_id = Some("call_1".into());
    let chat = [
        Message::new("system", "Be brief."),
        Message::new("user", "Weather?"),
        asked,
        answered,
    ];
    for (arch, format, call_text, result_turn) in [
        (
            SynthArch::Qwen2,
            ToolFormat::Hermes,
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"days\": 2}}\n</tool_call><|im_end|>",
            "<|im_start|>user\n<tool_response>\n{\"sky\": \"clear\"}\n</tool_response><|im_end|>",
        ),
        (
            SynthArch::Llama,
            ToolFormat::Llama3,
            "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"weather\", \"parameters\": {\"days\": 2}}<|eot_id|>",
            "<|start_header_id|>ipython<|end_header_id|>\n\n{\"sky\": \"clear\"}<|eot_id|>",
        ),
    ] {
        let seed = rng.gen();
        let dir = synth(arch, seed, SynthDtype::F32, u64::MAX);
        let model = load(&dir, &LoadOptions::default()).unwrap();
        let model = model.causal().unwrap();
        assert_eq!(model.tool_format(), Some(format), "{arch:?}");
        let text = model
            .render_chat_with_tools(&chat, std::slice::from_ref(&tool), true)
            .unwrap();
        assert!(text.contains("Be brief."), "{text}");
        assert!(text.contains("\"name\": \"weather\""), "{arch:?}: the tool is not listed: {text}");
        assert!(text.contains(call_text), "{arch:?}: {text}");
        assert!(text.contains(result_turn), "{arch:?}: {text}");
        // The system message is written once, inside the tools' turn.
        assert_eq!(text.matches("Be brief.").count(), 1, "{text}");
        // Without tools the template renders as before.
        let plain = model.render_chat(&chat[..2], true).unwrap();
        assert!(!plain.contains("weather"), "{plain}");

        let grammar = format.call_grammar(&[&tool], false);
        let grammars = model.grammars().unwrap();
        for _ in 0..3 {
            let mut constraint = grammars.constraint(&OutputFormat::Lark(grammar.clone())).unwrap();
            let options = GenerateOptions {
                max_tokens: 160,
                sampling: SamplingParams {
                    temperature: 1.0,
                    seed: rng.gen(),
                    ..SamplingParams::greedy()
                },
                ..GenerateOptions::default()
            };
            let g = model
                .generate_constrained(
                    &mut model.new_session(),
                    // The tiny model's context is shorter than the tools' prompt.
                    Prompt::Text("call"),
                    &options,
                    Some(&mut constraint),
                    &mut |_| {},
                )
                .unwrap();
            eprintln!("{arch:?}: {:?}", g.text);
            let parsed = format.parse(&g.text);
            assert_eq!(parsed.malformed, None, "{arch:?}: {:?}", g.text);
            assert_eq!(parsed.calls.len(), 1, "{arch:?}: {:?}", g.text);
            let days = parsed.calls[0].arguments["days"].as_i64();
            assert!(days.is_some_and(|d| (1..=7).contains(&d)), "{:?}", g.text);
        }
    }
}

/// The tiny embedder written as files loads and embeds as the one built in memory, in
/// both formats; with a NaN or an infinite weight its embeddings are refused, never
/// returned.
#[test]
fn the_tiny_embedder_on_file_embeds_as_in_memory_and_refuses_damaged_weights() {
    let texts = ["the cat sat", "a dog ran!"];
    let want = tiny_embedding_model(5).unwrap().embed(&texts).unwrap();
    let dir = scratch("tiny-embed");
    for format in [EmbedderFormat::HuggingFace, EmbedderFormat::Gguf] {
        let path = match format {
            EmbedderFormat::HuggingFace => dir.join("hf"),
            EmbedderFormat::Gguf => dir.join("tiny-embed.gguf"),
        };
        write_tiny_embedder(&path, format, 5, None).unwrap();
        let quench_engine::Model::Embedding(model) = load(&path, &LoadOptions::default()).unwrap()
        else {
            panic!("{format:?}: not an embedding model");
        };
        let got = model.embed(&texts).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g.tokens, w.tokens, "{format:?}");
            let diff = g
                .vector
                .iter()
                .zip(&w.vector)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-5, "{format:?}: differs by {diff}");
        }
        for (i, poison) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
            .into_iter()
            .enumerate()
        {
            let path = match format {
                EmbedderFormat::HuggingFace => dir.join(format!("hf-poisoned-{i}")),
                EmbedderFormat::Gguf => dir.join(format!("poisoned-{i}.gguf")),
            };
            write_tiny_embedder(&path, format, 5, Some(poison)).unwrap();
            let quench_engine::Model::Embedding(model) =
                load(&path, &LoadOptions::default()).unwrap()
            else {
                panic!("{format:?}: not an embedding model");
            };
            let err = model.embed(&texts).unwrap_err();
            assert!(
                matches!(err, EngineError::BadEmbedding),
                "{format:?} with {poison}: {err}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Greedy generation under a JSON grammar on the GPU (the interpreter's): each mask is
/// applied and the token picked on the device. The same generation with its logits kept
/// (which reads them back, masks and picks on the host) draws the same tokens, and both
/// reply with JSON that parses.
#[test]
fn greedy_generation_under_a_grammar_masks_on_the_device_as_on_the_host() {
    use quench_engine::generate::OutputFormat;
    let seed = rand::random();
    let dir = synth(SynthArch::Llama, seed, SynthDtype::Bf16, u64::MAX);
    let options = LoadOptions {
        device: Device::Interp,
        context_limit: Some(256),
        sessions: Some(2),
        ..LoadOptions::default()
    };
    let model = load(&dir, &options).unwrap();
    let model = model.causal().unwrap();
    let grammars = model.grammars().unwrap();
    let mut runs = vec![];
    for keep_logits in [false, true] {
        let mut constraint = grammars.constraint(&OutputFormat::JsonObject).unwrap();
        let options = GenerateOptions {
            max_tokens: 48,
            keep_logits,
            ..GenerateOptions::default()
        };
        let g = model
            .generate_constrained(
                &mut model.new_session(),
                Prompt::Text("a json object:"),
                &options,
                Some(&mut constraint),
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(g.logits.is_some(), keep_logits);
        let masks = constraint.mask_cost().masks;
        assert!(
            masks as usize >= g.tokens.len(),
            "a mask for every token drawn"
        );
        runs.push((g.tokens, g.text, g.finish, masks));
    }
    assert_eq!(runs[0], runs[1], "seed {seed}");
    let (_, text, finish, _) = &runs[0];
    eprintln!("{finish:?}: {text:?}");
    if *finish == quench_engine::FinishReason::Complete {
        serde_json::from_str::<serde_json::Value>(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    }
}
