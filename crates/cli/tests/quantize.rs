//! `quench quantize` as a user runs it: synthetic checkpoints (as `quench synth` writes
//! them, and wider ones whose rows are whole Q4_K blocks) converted to each type, then
//! loaded by quench: the CPU logits close to the checkpoint's own, greedy generation, the GPU
//! catalog's choice of kernels, and a tokenizer that encodes as `tokenizer.json` does.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use quench_cpu::{Decoder, Logits};
use quench_engine::gpu::Catalog;
use quench_engine::{GenerateOptions, LoadOptions, Message, Prompt};
use quench_models::arch::{ModelConfig, Naming, RopeStyle, TensorSource};
use quench_models::dequant::f32_to_bf16;
use quench_models::safetensors::{Dtype, SafetensorsWriter};
use quench_models::{GgmlType, GgufFile, HfCheckpoint};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "quantize-{name}-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn quench(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_quench"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "quench panicked: {stderr}");
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `quench synth --shape tiny` for `arch` into `dir/arch`.
fn synth(dir: &Path, arch: &str, seed: u64) -> PathBuf {
    let path = dir.join(arch);
    let seed = seed.to_string();
    let out = quench(&[
        "synth",
        "--arch",
        arch,
        "--shape",
        "tiny",
        "--seed",
        &seed,
        path_str(&path),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    path
}

/// `quench quantize --type target input output`; returns stderr.
fn quantize(target: &str, input: &Path, output: &Path) -> String {
    let out = quench(&[
        "quantize",
        "--type",
        target,
        path_str(input),
        path_str(output),
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    stderr
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Replaces the weights of the synthetic checkpoint in `dir` by a wider model: rows of 256
/// (whole Q4_K blocks) but a down projection of 320 (Q8_0 blocks only). The q and k
/// projections get large weights so that attention is sharp and RoPE's pairing shows in the
/// logits.
fn widen(dir: &Path, rng: &mut ChaCha8Rng) {
    let (hidden, ffn, heads, kv_heads, head_dim, layers) = (256, 320, 4, 2, 64, 2);
    let mut config = read_json(&dir.join("config.json"));
    for (k, v) in [
        ("hidden_size", hidden),
        ("intermediate_size", ffn),
        ("num_attention_heads", heads),
        ("num_key_value_heads", kv_heads),
        ("head_dim", head_dim),
        ("num_hidden_layers", layers),
    ] {
        config[k] = json!(v);
    }
    let arch = config["model_type"].as_str().unwrap().to_owned();
    let tied = config["tie_word_embeddings"].as_bool().unwrap_or(false);
    let vocab = config["vocab_size"].as_u64().unwrap() as usize;
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();

    let (q, kv) = (heads * head_dim, kv_heads * head_dim);
    let mut specs: Vec<(String, Vec<usize>, f32)> =
        vec![("model.embed_tokens.weight".into(), vec![vocab, hidden], 0.5)];
    for l in 0..layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        specs.push((p("input_layernorm.weight"), vec![hidden], 0.0));
        specs.push((p("self_attn.q_proj.weight"), vec![q, hidden], 0.15));
        specs.push((p("self_attn.k_proj.weight"), vec![kv, hidden], 0.15));
        specs.push((p("self_attn.v_proj.weight"), vec![kv, hidden], 0.05));
        if arch == "qwen2" {
            specs.push((p("self_attn.q_proj.bias"), vec![q], 0.1));
            specs.push((p("self_attn.k_proj.bias"), vec![kv], 0.1));
            specs.push((p("self_attn.v_proj.bias"), vec![kv], 0.1));
        }
        if arch == "qwen3" {
            specs.push((p("self_attn.q_norm.weight"), vec![head_dim], 0.0));
            specs.push((p("self_attn.k_norm.weight"), vec![head_dim], 0.0));
        }
        specs.push((p("self_attn.o_proj.weight"), vec![hidden, q], 0.05));
        specs.push((p("post_attention_layernorm.weight"), vec![hidden], 0.0));
        specs.push((p("mlp.gate_proj.weight"), vec![ffn, hidden], 0.05));
        specs.push((p("mlp.up_proj.weight"), vec![ffn, hidden], 0.05));
        specs.push((p("mlp.down_proj.weight"), vec![hidden, ffn], 0.05));
    }
    specs.push(("model.norm.weight".into(), vec![hidden], 0.0));
    if !tied {
        specs.push(("lm_head.weight".into(), vec![vocab, hidden], 0.05));
    }
    // Spread 0 marks norm weights: near one.
    let data: Vec<Vec<u8>> = specs
        .iter()
        .map(|(_, shape, spread)| {
            let n: usize = shape.iter().product();
            (0..n)
                .flat_map(|_| {
                    let u: f32 = rng.gen_range(-1.0..1.0);
                    let v = if *spread == 0.0 {
                        1.0 + 0.1 * u
                    } else {
                        u * spread
                    };
                    f32_to_bf16(v).to_le_bytes()
                })
                .collect()
        })
        .collect();
    let mut w = SafetensorsWriter::new();
    for ((name, shape, _), bytes) in specs.iter().zip(&data) {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        w.add_tensor(name, Dtype::BF16, &shape, bytes).unwrap();
    }
    w.write(dir.join("model.safetensors")).unwrap();
}

/// f32 logits at every position of `tokens`.
fn logits(config: ModelConfig, src: &dyn TensorSource, naming: Naming, tokens: &[u32]) -> Vec<f32> {
    let decoder = Decoder::<f32>::load(config, src, naming).unwrap();
    let mut cache = decoder.new_cache();
    decoder
        .forward(&mut cache, tokens, Logits::All)
        .unwrap()
        .into_vec()
}

fn rel_rms(reference: &[f32], got: &[f32]) -> f64 {
    assert_eq!(reference.len(), got.len());
    let err: f64 = reference
        .iter()
        .zip(got)
        .map(|(a, b)| f64::from(a - b).powi(2))
        .sum();
    let norm: f64 = reference.iter().map(|a| f64::from(*a).powi(2)).sum();
    (err / norm).sqrt()
}

/// How far a quantized model's logits may stray from the checkpoint's, relative RMS over
/// every logit of every position. Measured over three seeds: Q8_0 0.006–0.009, Q4_0
/// 0.067–0.10, Q4_K 0.055–0.089 (the tiny models' Q4_K is Q8_0: no row is a whole Q4_K
/// block). Llama read with Hugging Face's RoPE pairing instead of the one its rows were
/// reordered for: 0.31–0.37. The wide llama's mixes below 4 bits (over four seeds): Q3_K_M
/// 0.179–0.191, Q2_K 0.367–0.387 — as far as the wrong pairing, which is why their types
/// are checked tensor by tensor (crates/models/tests/hf_to_gguf.rs bounds every element).
fn logit_bound(target: &str) -> f64 {
    match target {
        "q8_0" => 0.02,
        "q3_k_m" => 0.25,
        "q2_k" => 0.48,
        _ => 0.16,
    }
}

/// Converts `dir` to each type and compares the GGUF model with the checkpoint.
fn check_model(dir: &Path, arch: &str, wide: bool, rng: &mut ChaCha8Rng) {
    let hf = HfCheckpoint::open(dir).unwrap();
    let hf_config = ModelConfig::from_hf_config(hf.config()).unwrap();
    let prompt: Vec<u32> = (0..12).map(|_| rng.gen_range(0..280)).collect();
    let want = logits(hf_config.clone(), &hf, Naming::HuggingFace, &prompt);
    for target in ["q8_0", "q4_0", "q4_k"] {
        let size = if wide { "wide" } else { "tiny" };
        let out = dir.with_extension(format!("{size}.{target}.gguf"));
        let stderr = quantize(target, dir, &out);
        assert!(
            stderr.contains("] token_embd.weight ") && stderr.contains("wrote "),
            "{stderr}"
        );
        let file = GgufFile::open(&out).unwrap();
        let config = ModelConfig::from_gguf(&file).unwrap();
        assert_eq!(
            (
                config.hidden,
                config.layers,
                config.vocab,
                config.tied_embeddings
            ),
            (
                hf_config.hidden,
                hf_config.layers,
                hf_config.vocab,
                hf_config.tied_embeddings
            )
        );
        // Matrices in the asked type where rows are whole blocks of it.
        let q_type = file.tensor("blk.0.attn_q.weight").unwrap().ggml_type;
        let want_type = match (target, wide) {
            ("q8_0", _) | ("q4_k", false) => GgmlType::Q8_0,
            ("q4_0", _) => GgmlType::Q4_0,
            _ => GgmlType::Q4_K,
        };
        assert_eq!(q_type, want_type, "{arch} {target}");
        if want_type != GgmlType::from_name(target).unwrap() {
            assert!(
                stderr.contains("note: blk.N.{attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up}.weight for N in 0–1: rows of 64 elements"),
                "{stderr}"
            );
        }
        // The GPU engine has a kernel for every weight.
        Catalog::choose(&config, &file, Naming::Gguf)
            .unwrap_or_else(|e| panic!("{arch} {target}: {e}"));

        let got = logits(config.clone(), &file, Naming::Gguf, &prompt);
        let rel = rel_rms(&want, &got);
        eprintln!("{arch} {size} {target}: logits relative RMS error {rel:.4}");
        assert!(rel < logit_bound(target), "{arch} {target}: {rel}");
        if arch == "llama" && wide {
            let mut wrong = config.clone();
            wrong.rope_style = RopeStyle::HalfSplit;
            let rel = rel_rms(&want, &logits(wrong, &file, Naming::Gguf, &prompt));
            assert!(
                rel > logit_bound(target),
                "{target}: the wrong RoPE pairing passes ({rel})"
            );
        }
    }
}

#[test]
fn quantized_models_give_the_checkpoints_logits() {
    let dir = scratch("logits");
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    for arch in ["llama", "qwen2", "qwen3"] {
        let model = synth(&dir, arch, rng.gen());
        check_model(&model, arch, false, &mut rng);
        widen(&model, &mut rng);
        check_model(&model, arch, true, &mut rng);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

const SAMPLE: &str = "The quick brown fox, 12345 times!\n\tCafé naïve — Grüße aus Köln.  \
日本語のテキストと中文文本。 مرحبا بالعالم  Привет, мир! 🦀🚀 x = f(a[3]) + 0.25;\n\n  end  ";

/// Merges that only some pre-tokenizers let apply: a space joining a number (GPT-2's),
/// digits in runs (not Qwen2's or SmolLM's single digits), runs past three digits (GPT-2's
/// only), punctuation joining a word (Llama 3's and Qwen2's). With them the sample encodes
/// differently under each pre-tokenizer, so a wrong `tokenizer.ggml.pre` would show.
const TELLING_MERGES: &[(&str, &str)] = &[("Ġ", "1"), ("2", "3"), ("3", "4"), ("(", "a")];

/// Puts [`TELLING_MERGES`] in place of the last merges of a `tokenizer.json` (whose
/// tokens no other merge uses), with their ids: the added tokens keep theirs, after the
/// BPE vocabulary.
fn add_telling_merges(t: &mut Value) {
    let merges = t["model"]["merges"].as_array_mut().unwrap();
    let dropped = merges.split_off(merges.len() - TELLING_MERGES.len());
    for (l, r) in TELLING_MERGES {
        merges.push(json!(format!("{l} {r}")));
    }
    let vocab = t["model"]["vocab"].as_object_mut().unwrap();
    for (old, (l, r)) in dropped.iter().zip(TELLING_MERGES) {
        let id = vocab
            .remove(&old.as_str().unwrap().replace(' ', ""))
            .unwrap();
        vocab.insert(format!("{l}{r}"), id);
    }
}

#[test]
fn the_gguf_tokenizer_encodes_as_tokenizer_json_does() {
    let dir = scratch("tokenizer");
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    // As synth writes them (GPT-2's byte-level pre-tokenizer), then in Llama 3's, Qwen2's
    // and SmolLM's forms.
    let llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let qwen2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let byte_level = |use_regex: bool| {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
               "use_regex": use_regex})
    };
    let split = |pattern: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": false},
            byte_level(false)
        ]})
    };
    let smollm = json!({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": true}, byte_level(true)
    ]});
    let forms = [
        ("llama", None, false, "gpt-2"),
        ("qwen2", None, false, "gpt-2"),
        ("qwen3", None, false, "gpt-2"),
        ("llama", Some(split(llama3)), true, "llama-bpe"),
        ("qwen2", Some(split(qwen2)), false, "qwen2"),
        ("qwen3", Some(smollm), false, "smollm"),
    ];
    let mut by_pre: Vec<(&str, Vec<u32>)> = Vec::new();
    for (i, (arch, pre_tokenizer, ignore_merges, pre)) in forms.into_iter().enumerate() {
        let model = synth(&dir.join(i.to_string()), arch, rng.gen());
        let path = model.join("tokenizer.json");
        let mut t = read_json(&path);
        add_telling_merges(&mut t);
        if let Some(p) = pre_tokenizer {
            t["pre_tokenizer"] = p;
            t["model"]["ignore_merges"] = json!(ignore_merges);
        }
        std::fs::write(&path, t.to_string()).unwrap();
        let out = dir.join(format!("{i}.gguf"));
        quantize("q8_0", &model, &out);
        let file = GgufFile::open(&out).unwrap();
        assert_eq!(file.get_str("tokenizer.ggml.pre").unwrap(), pre);

        let options = LoadOptions::default();
        let hf = quench_engine::load(&model, &options).unwrap();
        let gguf = quench_engine::load(&out, &options).unwrap();
        let (hf, gguf) = (hf.causal().unwrap(), gguf.causal().unwrap());
        let specials = if arch == "llama" {
            "<|start_header_id|>user<|end_header_id|>"
        } else {
            "<|im_start|>user<|im_end|>"
        };
        for sample in [
            SAMPLE.to_owned(),
            format!("{specials} {SAMPLE}"),
            String::new(),
        ] {
            for add_special in [true, false] {
                let want = hf.tokenizer().encode(&sample, add_special).unwrap();
                let got = gguf.tokenizer().encode(&sample, add_special).unwrap();
                assert_eq!(
                    got, want,
                    "{arch} ({pre}), specials {add_special}: {sample:?}"
                );
                assert_eq!(
                    gguf.tokenizer().decode(&got, false).unwrap(),
                    hf.tokenizer().decode(&want, false).unwrap()
                );
            }
        }
        let plain = hf.tokenizer().encode(SAMPLE, false).unwrap();
        match by_pre.iter().find(|(p, _)| *p == pre) {
            Some((_, same)) => assert_eq!(same, &plain, "{pre}"),
            None => by_pre.push((pre, plain)),
        }
        let chat = [Message::new("user", SAMPLE)];
        assert_eq!(
            gguf.prompt_tokens(Prompt::Chat(&chat)).unwrap(),
            hf.prompt_tokens(Prompt::Chat(&chat)).unwrap(),
            "{arch}: chat prompt"
        );
        assert_eq!(gguf.eos_ids(), hf.eos_ids(), "{arch}");
    }
    for (i, (a, x)) in by_pre.iter().enumerate() {
        for (b, y) in &by_pre[i + 1..] {
            assert_ne!(x, y, "the sample encodes alike under {a} and {b}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn quantized_models_generate_and_describe_themselves() {
    let dir = scratch("generate");
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let model = synth(&dir, "qwen3", rng.gen());
    let out = dir.join("q.gguf");
    quantize("q4_0", &model, &out);

    let info = quench(&["info", path_str(&out)]);
    let info_text = text(&info.stdout);
    assert!(info.status.success(), "{}", text(&info.stderr));
    assert!(
        info_text.contains("architecture: qwen3")
            && info_text.contains("Q4_0")
            && info_text.contains("F32"),
        "{info_text}"
    );

    let generated = quench(&[
        "generate",
        "-m",
        path_str(&out),
        "--max-tokens",
        "6",
        "--temperature",
        "0",
        "the cat",
    ]);
    assert!(generated.status.success(), "{}", text(&generated.stderr));
    assert!(text(&generated.stderr).contains("tokens/s"));

    // Greedy decoding through the engine: six tokens, each the argmax of its logits.
    let loaded = quench_engine::load(&out, &LoadOptions::default()).unwrap();
    let causal = loaded.causal().unwrap();
    let mut session = causal.new_session();
    let options = GenerateOptions {
        max_tokens: 6,
        ignore_eos: true,
        keep_logits: true,
        ..GenerateOptions::default()
    };
    let g = causal
        .generate(&mut session, Prompt::Text("the cat"), &options, &mut |_| {})
        .unwrap();
    assert_eq!(g.tokens.len(), 6);
    for (token, row) in g.tokens.iter().zip(g.logits.as_ref().unwrap()) {
        let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        assert_eq!(*token as usize, best);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn mistakes_fail_with_a_message() {
    let dir = scratch("errors");
    let model = synth(&dir, "llama", 7);
    let out = dir.join("m.gguf");
    let fails = |args: &[&str], needle: &str| {
        let o = quench(args);
        let stderr = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with("error: ") && stderr.contains(needle),
            "{needle:?}: {stderr}"
        );
    };
    let (m, o) = (path_str(&model), path_str(&out));
    fails(
        &["quantize", "--type", "q5_k", m, o],
        "unknown type \"q5_k\"; types: q8_0, q4_0, q4_k",
    );
    fails(
        &[
            "quantize",
            "--type",
            "q8_0",
            path_str(&dir.join("nothing")),
            o,
        ],
        "does not exist",
    );
    fails(
        &[
            "quantize",
            "--type",
            "q8_0",
            path_str(&model.join("config.json")),
            o,
        ],
        "not a directory",
    );
    fails(
        &[
            "quantize",
            "--type",
            "q8_0",
            m,
            path_str(&dir.join("no/such/dir/m.gguf")),
        ],
        "directory does not exist",
    );
    assert!(!out.exists());

    // OUTPUT is kept unless --force.
    std::fs::write(&out, b"keep me").unwrap();
    fails(
        &["quantize", "--type", "q8_0", m, o],
        "exists; pass --force",
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    let replaced = quench(&["quantize", "--type", "q8_0", "--force", m, o]);
    assert!(replaced.status.success(), "{}", text(&replaced.stderr));
    GgufFile::open(&out).unwrap();

    // An unsupported architecture is named, and the previous output stays.
    let mut config = read_json(&model.join("config.json"));
    config["model_type"] = json!("mistral3");
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    fails(
        &["quantize", "--type", "q8_0", "--force", m, o],
        "model_type mistral3",
    );
    GgufFile::open(&out).unwrap();
    assert!(!dir.join("m.gguf.partial").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The written file is flushed and complete when the command returns: its size is the last
/// tensor's end, aligned.
#[test]
fn the_file_ends_after_its_last_tensor() {
    let dir = scratch("layout");
    let model = synth(&dir, "qwen2", 11);
    let out = dir.join("q.gguf");
    quantize("q4_k", &model, &out);
    let file = GgufFile::open(&out).unwrap();
    let end = file
        .tensor_infos()
        .iter()
        .map(|t| t.offset + t.size)
        .max()
        .unwrap();
    let len = std::fs::metadata(&out).unwrap().len();
    assert_eq!(
        len,
        file.data_start() + end.next_multiple_of(file.alignment())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The GPU engine's decode graph, run by the kernel interpreter on a quantized llama (Q4_K
/// and Q8_0 matrices, rows interleaved for adjacent-pair RoPE): every logit of greedy
/// generation within the f64 check's bound (0.05 + 0.003·|reference|) of the CPU reference
/// on the same file, and within 2e-3 relative RMS overall.
#[test]
fn the_gpu_engine_runs_the_quantized_model() {
    let dir = scratch("gpu");
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let model = synth(&dir, "llama", rng.gen());
    widen(&model, &mut rng);
    let out = dir.join("q.gguf");
    quantize("q4_k", &model, &out);
    let options = LoadOptions {
        device: quench_engine::Device::Interp,
        context_limit: Some(32),
        ..LoadOptions::default()
    };
    let start = std::time::Instant::now();
    let gpu = quench_engine::load(&out, &options).unwrap();
    let gpu = gpu.causal().unwrap();
    let generate = GenerateOptions {
        max_tokens: 3,
        ignore_eos: true,
        keep_logits: true,
        ..GenerateOptions::default()
    };
    let mut session = gpu.new_session();
    let prompt = gpu.prompt_tokens(Prompt::Text("the cat sat")).unwrap();
    let g = gpu
        .generate(
            &mut session,
            Prompt::Text("the cat sat"),
            &generate,
            &mut |_| {},
        )
        .unwrap();
    eprintln!("interpreter: {:.1} s", start.elapsed().as_secs_f64());

    let file = GgufFile::open(&out).unwrap();
    let config = ModelConfig::from_gguf(&file).unwrap();
    let reference = Decoder::<f64>::load(config, &file, Naming::Gguf).unwrap();
    let mut forced = prompt.clone();
    forced.extend_from_slice(&g.tokens[..g.tokens.len() - 1]);
    let mut cache = reference.new_cache();
    let rows = reference.forward(&mut cache, &forced, Logits::All).unwrap();
    let device = g.logits.unwrap();
    let want: Vec<f32> = (0..device.len())
        .flat_map(|s| rows.row(prompt.len() - 1 + s).iter().map(|&r| r as f32))
        .collect();
    // Measured 1.7e-4 to 2.2e-4 (f16 KV cache, f32 activations).
    let rel = rel_rms(&want, &device.concat());
    assert!(rel < 2e-3, "relative RMS error {rel}");
    for (step, got) in device.iter().enumerate() {
        let want = rows.row(prompt.len() - 1 + step);
        for (token, (&d, &r)) in got.iter().zip(want).enumerate() {
            assert!(
                (f64::from(d) - r).abs() <= 0.05 + 0.003 * r.abs(),
                "step {step} token {token}: {d} vs {r}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each tensor's type as the `gguf` Python package reads it (`None` where Python or the
/// package is missing: then the test is reported as not run, which fails in CI).
fn types_by_gguf_package(path: &Path) -> Option<Vec<(String, String)>> {
    let script = "import sys, json, gguf\n\
                  r = gguf.GGUFReader(sys.argv[1])\n\
                  print(json.dumps([[t.name, t.tensor_type.name] for t in r.tensors]))";
    let out = Command::new("python3")
        .args(["-c", script, path_str(path)])
        .output()
        .ok()?;
    if !out.status.success() {
        quench_testkit::not_run(&format!(
            "the gguf Python package reads quench's files (pip install gguf): {}",
            text(&out.stderr)
        ));
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// llama.cpp's mixes as `quench quantize` writes them, on a two-layer llama whose rows
/// are whole super-blocks (but its FFN down matrix, 320 columns, which falls back to Q8_0):
/// Q4_K_M gives the LM head and layer 1's v (llama.cpp's `use_more_bits`: the last eighth of
/// the layers, here layer 1) Q6_K, the rest Q4_K; Q5_K_M the same with Q5_K; Q6_K gives
/// every matrix Q6_K; Q3_K_M gives v Q5_K (layers 0 and 1), the attention output Q4_K, the
/// rest Q3_K; Q2_K (2 query heads a key/value head) gives v and the attention output Q3_K,
/// the rest Q2_K; IQ4_XS (2 query heads a key/value head, 2 layers: no v or down gets
/// Q5_K) gives every matrix but the LM head IQ4_XS. The `gguf`
/// package reads every tensor's type as quench does, the file says which mix it is, the
/// logits stay close to the checkpoint's and the GPU engine has a kernel for each.
#[test]
fn llama_cpp_mixes_give_each_tensor_llama_cpps_type() {
    let dir = scratch("mixes");
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let model = synth(&dir, "llama", rng.gen());
    widen(&model, &mut rng);
    let hf = HfCheckpoint::open(&model).unwrap();
    let hf_config = ModelConfig::from_hf_config(hf.config()).unwrap();
    let prompt: Vec<u32> = (0..12).map(|_| rng.gen_range(0..280)).collect();
    let want = logits(hf_config.clone(), &hf, Naming::HuggingFace, &prompt);
    use GgmlType::*;
    for (target, file_type, expected) in [
        (
            "q4_k_m",
            15,
            [
                ("token_embd.weight", Q4_K),
                ("blk.0.attn_q.weight", Q4_K),
                ("blk.0.attn_v.weight", Q4_K),
                ("blk.1.attn_v.weight", Q6_K),
                ("blk.1.attn_output.weight", Q4_K),
                ("blk.1.ffn_up.weight", Q4_K),
                ("blk.1.ffn_down.weight", Q8_0),
                ("output.weight", Q6_K),
                ("blk.1.ffn_norm.weight", F32),
            ],
        ),
        (
            "q5_k_m",
            17,
            [
                ("token_embd.weight", Q5_K),
                ("blk.0.attn_q.weight", Q5_K),
                ("blk.0.attn_v.weight", Q5_K),
                ("blk.1.attn_v.weight", Q6_K),
                ("blk.1.attn_output.weight", Q5_K),
                ("blk.1.ffn_up.weight", Q5_K),
                ("blk.1.ffn_down.weight", Q8_0),
                ("output.weight", Q6_K),
                ("blk.1.ffn_norm.weight", F32),
            ],
        ),
        (
            "q6_k",
            18,
            [
                ("token_embd.weight", Q6_K),
                ("blk.0.attn_q.weight", Q6_K),
                ("blk.0.attn_v.weight", Q6_K),
                ("blk.1.attn_v.weight", Q6_K),
                ("blk.1.attn_output.weight", Q6_K),
                ("blk.1.ffn_up.weight", Q6_K),
                ("blk.1.ffn_down.weight", Q8_0),
                ("output.weight", Q6_K),
                ("blk.1.ffn_norm.weight", F32),
            ],
        ),
        (
            "q3_k_m",
            12,
            [
                ("token_embd.weight", Q3_K),
                ("blk.0.attn_q.weight", Q3_K),
                ("blk.0.attn_v.weight", Q5_K),
                ("blk.1.attn_v.weight", Q5_K),
                ("blk.1.attn_output.weight", Q4_K),
                ("blk.1.ffn_up.weight", Q3_K),
                ("blk.1.ffn_down.weight", Q8_0),
                ("output.weight", Q6_K),
                ("blk.1.ffn_norm.weight", F32),
            ],
        ),
        (
            "q2_k",
            10,
            [
                ("token_embd.weight", Q2_K),
                ("blk.0.attn_q.weight", Q2_K),
                ("blk.0.attn_v.weight", Q3_K),
                ("blk.1.attn_v.weight", Q3_K),
                ("blk.1.attn_output.weight", Q3_K),
                ("blk.1.ffn_up.weight", Q2_K),
                ("blk.1.ffn_down.weight", Q8_0),
                ("output.weight", Q6_K),
                ("blk.1.ffn_norm.weight", F32),
            ],
        ),
        (
            "iq4_xs",
            30,
            [
                ("token_embd.weight", IQ4_XS),
                ("blk.0.attn_q.weight", IQ4_XS),
                ("blk.0.attn_v.weight", IQ4_XS),
                ("blk.1.attn_v.weight", IQ4_XS),
                ("blk.1.attn_output.weight", IQ4_XS),
                ("blk.1.ffn_up.weight", IQ4_XS),
                ("blk.1.ffn_down.weight", Q8_0),
                ("output.weight", Q6_K),
                ("blk.1.ffn_norm.weight", F32),
            ],
        ),
    ] {
        let out = model.with_extension(format!("{target}.gguf"));
        let stderr = quantize(target, &model, &out);
        assert!(stderr.contains("wrote "), "{stderr}");
        let file = GgufFile::open(&out).unwrap();
        for (name, t) in expected {
            let got = file.tensor(name).unwrap().ggml_type;
            assert_eq!(got, t, "{target}: {name}");
        }
        let meta = file.metadata("general.file_type").and_then(|v| v.as_u64());
        assert_eq!(meta, Some(file_type), "{target}: general.file_type");
        if let Some(types) = types_by_gguf_package(&out) {
            assert_eq!(types.len(), file.tensors().count(), "{target}");
            for (name, t) in types {
                let ours = file.tensor(&name).unwrap().ggml_type;
                assert_eq!(
                    t,
                    ours.name(),
                    "{target}: {name} as the gguf package reads it"
                );
            }
        }
        let config = ModelConfig::from_gguf(&file).unwrap();
        let catalog = Catalog::choose(&config, &file, Naming::Gguf)
            .unwrap_or_else(|e| panic!("{target}: {e}"));
        // A Q2_K or Q3_K table has no GPU gather; the prompt path's Q3_K and Q6_K
        // products take rows of a multiple of 512 only (these are of 256; the LM head is
        // not among them); IQ4_XS has no GPU kernel: those tensors, and only those, go up
        // as f16, each counted under what it is.
        let mut widened = std::collections::BTreeMap::<String, usize>::new();
        for t in file.tensor_infos() {
            let cols = t.dims[0] as usize;
            let what = match t.ggml_type {
                Q2_K | Q3_K if t.name == "token_embd.weight" => t.ggml_type.name().to_owned(),
                IQ4_XS => t.ggml_type.name().to_owned(),
                Q3_K | Q6_K
                    if !cols.is_multiple_of(512)
                        && !t.name.starts_with("output")
                        && !t.name.starts_with("token_embd") =>
                {
                    format!("{} rows of {cols}", t.ggml_type.name())
                }
                _ => continue,
            };
            *widened.entry(what).or_default() += 1;
        }
        let mut got = std::collections::BTreeMap::<String, usize>::new();
        for w in &catalog.widened {
            *got.entry(w.what()).or_default() += 1;
        }
        assert_eq!(got, widened, "{target}");
        // `quench info` says so, from the headers.
        let info = quench(&["info", path_str(&out)]);
        let gpu = text(&info.stdout)
            .lines()
            .find(|l| l.starts_with("gpu:"))
            .map(str::to_owned)
            .unwrap_or_default();
        if widened.is_empty() {
            assert!(
                gpu.ends_with("every weight read as stored"),
                "{target}: {gpu:?}"
            );
        }
        for (what, n) in &widened {
            let said = format!("{what} ({n} tensor{})", if *n == 1 { "" } else { "s" });
            assert!(gpu.contains(&said), "{target}: {gpu:?}, want {said}");
        }
        let rel = rel_rms(&want, &logits(config, &file, Naming::Gguf, &prompt));
        eprintln!("llama wide {target}: logits relative RMS error {rel:.4}");
        assert!(rel < logit_bound(target), "{target}: {rel}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
