//! Profiling whole generations on the kernel interpreter: a tiny seeded model generates
//! (greedily on the device, and sampled on the host with a seed) once plain and once
//! profiled, and the profile must
//! hold one record per submitted dispatch, ordered and disjoint within and across the
//! replayed steps, the same tokens as the plain run, a work model that counts every
//! weight once per step plus a KV cache growing with the context, and a trace with the
//! expected lanes.
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else at random,
//! and is printed so that a failure can be replayed.

use std::sync::Mutex;

use quench_engine::generate::{Sampler, SamplingParams};
use quench_engine::gpu::profile::{self, Mode, Profile, ProfileOptions};
use quench_engine::gpu::{GpuDecoder, GpuOptions};
use quench_models::arch::{ModelConfig, Naming};
use quench_models::{GgmlType, GgufFile};
use quench_prof::{chrome_trace, summarize, Ceilings, LANES};
use quench_rt::InterpExecutor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::{gguf, seed, LayerFormats, Shape, Tiny};

/// Profiling is switched on for the whole process: one test at a time.
static PROFILING: Mutex<()> = Mutex::new(());

const HIDDEN: usize = 64;
const HEAD_DIM: usize = 32;
const VOCAB: usize = 64;

/// A tiny `arch` decoder with seeded random weights: one layer, Q8_0 and Q4_1 matrices.
fn tiny_model(arch: &'static str, rng: &mut ChaCha8Rng) -> GgufFile {
    let m = Tiny {
        arch,
        shape: Shape {
            hidden: HIDDEN,
            heads: 2,
            kv_heads: 1,
            head_dim: HEAD_DIM,
            ffn: 128,
            vocab: VOCAB,
            context: 256,
            eps: 1e-5,
        },
        layers: vec![LayerFormats {
            q: GgmlType::Q8_0,
            k: GgmlType::Q8_0,
            v: GgmlType::Q8_0,
            o: GgmlType::Q4_1,
            gate_up: GgmlType::Q4_1,
            down: GgmlType::Q8_0,
        }],
        embedding: GgmlType::Q8_0,
        output: None,
    };
    gguf(&m, rng)
}

/// The decoder on the interpreter, loaded anew (as each command does).
fn load(file: &GgufFile) -> GpuDecoder {
    load_with(file, true)
}

/// As [`load`], replaying captured steps or launching each dispatch.
fn load_with(file: &GgufFile, capture: bool) -> GpuDecoder {
    let config = ModelConfig::from_gguf(file).expect("config");
    // Decode steps only: prompts fed a token per step, each step profiled.
    let options = GpuOptions {
        context: Some(32),
        capture,
        prefill_chunk: 0,
        ..GpuOptions::default()
    };
    GpuDecoder::new(
        config,
        file,
        Naming::Gguf,
        Box::new(InterpExecutor::new()),
        None,
        &options,
    )
    .expect("loads")
}

/// `tokens` tokens after `prompt`: greedy on the device, or sampled on the host from the
/// logits read back (with `sampling`'s seed).
fn generate(
    file: &GgufFile,
    prompt: &[u32],
    tokens: usize,
    sampling: Option<&SamplingParams>,
) -> Vec<u32> {
    generate_on(&load(file), prompt, tokens, sampling)
}

fn generate_on(
    decoder: &GpuDecoder,
    prompt: &[u32],
    tokens: usize,
    sampling: Option<&SamplingParams>,
) -> Vec<u32> {
    let mut session = decoder.new_session();
    let mut out = vec![];
    match sampling {
        None => {
            let mut next = decoder.feed_greedy(&mut session, prompt).expect("step");
            out.push(next);
            for _ in 1..tokens {
                next = decoder.feed_greedy(&mut session, &[next]).expect("step");
                out.push(next);
            }
        }
        Some(params) => {
            let mut sampler = Sampler::new(params.clone()).expect("sampler");
            let mut logits = decoder.feed(&mut session, prompt).expect("step");
            let mut history = prompt.to_vec();
            for i in 0..tokens {
                let t = sampler.sample(&logits, &history).expect("sample");
                out.push(t);
                history.push(t);
                if i + 1 < tokens {
                    logits = decoder.feed(&mut session, &[t]).expect("step");
                }
            }
        }
    }
    out
}

fn profiled<T>(mode: Mode, ceilings: Option<Ceilings>, run: impl FnOnce() -> T) -> (T, Profile) {
    let measure: Option<profile::MeasureCeilings> = ceilings.map(|c| {
        Box::new(move |exec: &mut dyn quench_rt::Executor| {
            assert_eq!(exec.backend(), "interp");
            Ok(c)
        }) as profile::MeasureCeilings
    });
    profile::start(ProfileOptions {
        mode,
        ceilings: measure,
    })
    .expect("profiling was off");
    let out = run();
    (out, profile::finish().expect("profiling was on"))
}

#[test]
fn profiled_generation_records_every_dispatch_of_every_replayed_step() {
    let _one = PROFILING.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = tiny_model("llama", &mut rng);
    let prompt: Vec<u32> = (0..3).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let sampled = SamplingParams {
        temperature: 0.8,
        top_k: 40,
        seed: rng.gen(),
        ..SamplingParams::greedy()
    };
    let ceilings = Ceilings {
        copy_bytes_per_s: Some(rng.gen_range(1e9..1e12)),
        flops: Some(2e12),
    };
    let summary = load(&file).summary().clone();

    for sampling in [None, Some(&sampled)] {
        let plain = generate(&file, &prompt, 4, sampling);
        let (tokens, p) = profiled(Mode::Dispatches, Some(ceilings), || {
            generate(&file, &prompt, 4, sampling)
        });
        assert_eq!(tokens, plain, "profiling changed the tokens ({sampling:?})");
        assert!(profile::mode().is_none(), "finish switches profiling off");

        assert_eq!(p.decoders.len(), 1);
        let d = &p.decoders[0];
        assert_eq!(
            (d.backend, d.dispatches_per_step),
            ("interp", summary.dispatches_per_token)
        );
        assert_eq!(d.ceilings, Some(Ok(ceilings)));

        // One record per submitted dispatch; steps numbered from 0, each complete.
        let per_step = summary.dispatches_per_token;
        let steps = p
            .dispatches
            .iter()
            .filter_map(|r| r.step)
            .max()
            .expect("steps") as usize
            + 1;
        assert_eq!(p.dispatches.len() as u64, p.submitted);
        assert_eq!(p.submitted, (per_step * steps) as u64);
        // The prompt's tokens and every generated token but the last are fed.
        assert_eq!(steps, prompt.len() + tokens.len() - 1);
        assert_eq!(
            p.step_ns.len(),
            tokens.len(),
            "one host step time per token read back"
        );

        let step = |s: usize| &p.dispatches[s * per_step..(s + 1) * per_step];
        for s in 0..steps {
            let rs = step(s);
            assert!(
                rs.iter().all(|r| r.step == Some(s as u32)),
                "step {s} records mixed"
            );
            for (r, first) in rs.iter().zip(step(0)) {
                assert_eq!((&r.kernel, &r.label), (&first.kernel, &first.label));
                assert!(
                    r.launches == 1 && (1..=LANES as u32).contains(&r.lanes_ended),
                    "{r:?}"
                );
                assert!(r.start_ns < r.end_ns, "{r:?}");
            }
            for w in rs.windows(2) {
                assert!(
                    w[0].end_ns <= w[1].start_ns,
                    "overlap within step {s}: {w:?}"
                );
            }
            if s > 0 {
                assert!(
                    step(s - 1)[per_step - 1].end_ns <= rs[0].start_ns,
                    "step {s} began before step {} ended",
                    s - 1
                );
            }
            // Every weight is read once per step, and the KV cache read grows with the context.
            let bytes: u64 = rs.iter().map(|r| r.bytes).sum();
            assert!(
                bytes > summary.weight_bytes_per_token,
                "step {s}: {bytes} bytes"
            );
            if s > 0 {
                assert!(
                    bytes > step(s - 1).iter().map(|r| r.bytes).sum(),
                    "step {s}: the KV read did not grow"
                );
            }
            assert!(rs.iter().any(|r| r.flops > 0));
        }
        let labels: Vec<&str> = step(0)
            .iter()
            .filter_map(|r| r.label.strip_prefix("layer 0: "))
            .collect();
        assert_eq!(labels, summary.layer_plan);

        // The trace: a GPU lane for the stream and a host lane with loading and steps.
        let text =
            serde_json::to_string(&chrome_trace(&p.dispatches, &p.host)).expect("serializes");
        let v: serde_json::Value = serde_json::from_str(&text).expect("parses");
        let events = v["traceEvents"].as_array().expect("events");
        let names = |pid: u64| -> Vec<String> {
            events
                .iter()
                .filter(|e| e["ph"] == "X" && e["pid"] == pid)
                .map(|e| e["name"].as_str().expect("name").to_string())
                .collect()
        };
        assert_eq!(names(1).len(), p.dispatches.len());
        let host = names(2);
        let read = format!("read profile records of steps 0-{}", steps - 1);
        for span in [
            "assemble and plan the decode step",
            "measure copy bandwidth and FMA throughput",
            "upload the weights",
            "compile the kernels",
            "capture the decode step",
            "step 0: submit",
            "step 0: wait and read back",
            // Fewer steps than the history holds: read once, when the decoder goes.
            read.as_str(),
            "sampling and host work between tokens",
        ] {
            assert!(
                host.iter().any(|h| h == span),
                "no host span `{span}` in {host:?}"
            );
        }
        let lanes: Vec<&str> = events
            .iter()
            .filter(|e| e["ph"] == "M")
            .map(|e| e["args"]["name"].as_str().expect("name"))
            .collect();
        assert_eq!(lanes, ["GPU", "host", "stream 0"]);

        let s = summarize(&p.dispatches);
        assert_eq!(s.steps, steps);
        assert!(s.busy_ns <= s.step_ns);
        assert_eq!(
            s.rows.iter().map(|r| r.calls).sum::<usize>(),
            p.dispatches.len()
        );
    }
}

#[test]
fn records_kept_on_the_device_come_back_the_same_in_batches() {
    // More steps than the history holds, not a multiple of it: full batches read as the
    // history fills, the partial last one when the decoder goes. The records must be
    // those of a run that reads them all at once (the interpreter's clock repeats
    // itself from run to run), and every step's dispatches must be there.
    let _one = PROFILING.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = tiny_model("llama", &mut rng);
    let kept: u32 = rng.gen_range(2..=4);
    let prompt: Vec<u32> = (0..2).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    // Steps: the prompt's tokens and every generated token but the last.
    let mut tokens = rng.gen_range(kept as usize..=2 * kept as usize);
    if (prompt.len() + tokens - 1).is_multiple_of(kept as usize) {
        tokens += 1;
    }
    let steps = (prompt.len() + tokens - 1) as u32;
    eprintln!("{steps} steps, {kept} kept on the device");
    let run = |history: u32| {
        profile::start_with_history(
            ProfileOptions {
                mode: Mode::Dispatches,
                ceilings: None,
            },
            history,
        )
        .expect("profiling was off");
        let out = generate(&file, &prompt, tokens, None);
        (out, profile::finish().expect("profiling was on"))
    };
    let (tokens_at_once, at_once) = run(profile::HISTORY_STEPS);
    let (tokens_batched, batched) = run(kept);
    assert!(steps < profile::HISTORY_STEPS);
    assert_eq!(tokens_batched, tokens_at_once);
    assert_eq!(batched.unread, 0);
    assert_eq!(batched.dispatches.len() as u64, batched.submitted);
    assert_eq!(batched.submitted, at_once.submitted);
    assert_eq!(
        batched.dispatches.last().and_then(|d| d.step),
        Some(steps - 1)
    );
    for (i, (b, a)) in batched
        .dispatches
        .iter()
        .zip(&at_once.dispatches)
        .enumerate()
    {
        assert_eq!(b, a, "record {i}");
    }
    let reads = |p: &Profile| -> Vec<String> {
        p.host
            .spans()
            .iter()
            .filter(|s| s.name.starts_with("read profile records"))
            .map(|s| s.name.clone())
            .collect()
    };
    let want: Vec<String> = (0..steps)
        .step_by(kept as usize)
        .map(|first| {
            let last = (first + kept - 1).min(steps - 1);
            format!("read profile records of steps {first}-{last}")
        })
        .collect();
    assert_eq!(reads(&batched), want);
    assert_eq!(
        reads(&at_once),
        [format!("read profile records of steps 0-{}", steps - 1)]
    );
    assert!(profile::start_with_history(
        ProfileOptions {
            mode: Mode::Dispatches,
            ceilings: None
        },
        0
    )
    .is_err());
}

#[test]
fn records_of_a_decoder_still_loaded_at_the_finish_are_counted_unread() {
    let _one = PROFILING.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = tiny_model("qwen3", &mut rng);
    let kept: u32 = rng.gen_range(2..=3);
    profile::start_with_history(
        ProfileOptions {
            mode: Mode::Dispatches,
            ceilings: None,
        },
        kept,
    )
    .expect("profiling was off");
    let decoder = load(&file);
    let mut session = decoder.new_session();
    // One full history read back, and one step more left on the device.
    let steps = kept + 1;
    let mut token = rng.gen_range(0..VOCAB as u32);
    for _ in 0..steps {
        token = decoder.feed_greedy(&mut session, &[token]).expect("step");
    }
    let p = profile::finish().expect("profiling was on");
    let per_step = decoder.summary().dispatches_per_token as u64;
    assert_eq!(p.submitted, per_step * steps as u64);
    assert_eq!(
        (p.dispatches.len() as u64, p.unread),
        (per_step * kept as u64, per_step)
    );
    // Dropped afterwards, the decoder reads its last step for a profile that is gone.
    drop(decoder);
    assert!(profile::finish().is_none());
}

#[test]
fn step_times_alone_leave_the_kernels_plain_and_time_the_same_steps() {
    // The flow of `quench prof --overhead`: plain and profiled runs in turns, each
    // timing the steps that read a token back.
    let _one = PROFILING.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = tiny_model("qwen3", &mut rng);
    let prompt: Vec<u32> = (0..2).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let mut runs = vec![];
    for mode in [
        Mode::StepTimes,
        Mode::Dispatches,
        Mode::StepTimes,
        Mode::Dispatches,
    ] {
        let (tokens, p) = profiled(mode, None, || generate(&file, &prompt, 3, None));
        runs.push((mode, tokens, p));
    }
    for (mode, tokens, p) in &runs {
        assert_eq!(tokens, &runs[0].1, "{mode:?} changed the tokens");
        // The profile saw the tokens the steps read back: what `prof --overhead` compares.
        assert_eq!(&p.tokens, tokens, "{mode:?}: the profile's tokens");
        assert_eq!(p.step_ns.len(), 3);
        assert!(p.step_ns.iter().all(|&t| t > 0));
        match mode {
            Mode::StepTimes => {
                assert!(p.dispatches.is_empty() && p.decoders.is_empty() && p.submitted == 0);
                assert!(p.host.spans().is_empty());
            }
            Mode::Dispatches => {
                assert_eq!(p.dispatches.len() as u64, p.submitted);
                assert!(p.submitted > 0);
                assert_eq!(p.decoders[0].ceilings, None, "no measurement was asked for");
            }
        }
    }
    // Turning profiling on twice is refused.
    profile::start(ProfileOptions {
        mode: Mode::StepTimes,
        ceilings: None,
    })
    .expect("off");
    assert!(profile::start(ProfileOptions {
        mode: Mode::StepTimes,
        ceilings: None
    })
    .is_err());
    assert!(profile::finish().is_some());
}

#[test]
fn one_step_in_n_is_instrumented_and_only_its_records_kept() {
    let _one = PROFILING.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = tiny_model("llama", &mut rng);
    let prompt: Vec<u32> = (0..2).map(|_| rng.gen_range(0..VOCAB as u32)).collect();
    let tokens = 6;
    // The prompt's tokens and every generated token but the last.
    let steps = (prompt.len() + tokens - 1) as u32;
    let every = 3;
    let per_step = load(&file).summary().dispatches_per_token as u64;
    let plain = generate(&file, &prompt, tokens, None);
    for capture in [true, false] {
        let run = |every: u32| {
            profile::start_sampled(
                ProfileOptions {
                    mode: Mode::Dispatches,
                    ceilings: None,
                },
                every,
                profile::HISTORY_STEPS,
            )
            .expect("profiling was off");
            let out = generate_on(&load_with(&file, capture), &prompt, tokens, None);
            (out, profile::finish().expect("profiling was on"))
        };
        let (all_tokens, all) = run(1);
        let (sampled_tokens, p) = run(every);
        assert_eq!(all_tokens, plain, "capture {capture}: every step");
        assert_eq!(
            sampled_tokens, plain,
            "capture {capture}: one step in {every}"
        );
        assert_eq!((all.every, p.every), (1, every));

        // Records of steps 0, 3 and 6 only, each complete, and counted exactly.
        let sampled: Vec<u32> = (0..steps).step_by(every as usize).collect();
        assert_eq!(sampled, [0, 3, 6]);
        let mut seen: Vec<u32> = p.dispatches.iter().filter_map(|d| d.step).collect();
        assert_eq!(seen.len(), p.dispatches.len(), "every record has its step");
        seen.dedup();
        assert_eq!(seen, sampled, "capture {capture}");
        assert_eq!(p.submitted, per_step * sampled.len() as u64);
        assert_eq!(p.dispatches.len() as u64, p.submitted);
        assert_eq!(
            p.dispatches.iter().map(|d| d.launches).sum::<u64>(),
            p.submitted
        );
        assert_eq!(p.unread, 0);
        assert_eq!(all.submitted, per_step * steps as u64);
        // Those steps' records name and model the same dispatches as when every step is
        // instrumented.
        let model = |d: &quench_prof::Dispatch| {
            (d.step, d.kernel.clone(), d.label.clone(), d.bytes, d.flops)
        };
        let want: Vec<_> = all
            .dispatches
            .iter()
            .filter(|d| d.step.is_some_and(|s| s % every == 0))
            .map(model)
            .collect();
        assert_eq!(p.dispatches.iter().map(model).collect::<Vec<_>>(), want);
        // Every step that read a token back is timed, instrumented or not.
        assert_eq!((p.step_ns.len(), all.step_ns.len()), (tokens, tokens));

        // Host spans of the instrumented steps only; the instrumented kernels compiled
        // beside the plain ones.
        let host: Vec<&str> = p.host.spans().iter().map(|s| s.name.as_str()).collect();
        for s in 0..steps {
            let submit = format!("step {s}: submit");
            assert_eq!(
                host.contains(&submit.as_str()),
                s.is_multiple_of(every),
                "`{submit}` in {host:?}"
            );
        }
        assert!(
            host.contains(&"read profile records of steps 0-6"),
            "{host:?}"
        );
        assert!(host.contains(&"compile the instrumented kernels"));
        assert!(!all
            .host
            .spans()
            .iter()
            .any(|s| s.name == "compile the instrumented kernels"));
    }
    // Instrumenting one step in 0 is refused, and profiling stays off.
    let e = profile::start_sampled(
        ProfileOptions {
            mode: Mode::Dispatches,
            ceilings: None,
        },
        0,
        profile::HISTORY_STEPS,
    )
    .expect_err("one step in 0");
    assert!(e.to_string().contains("at least 1"), "{e}");
    assert!(profile::mode().is_none());
}
