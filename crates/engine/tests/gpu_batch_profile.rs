//! Profiling steps of one and of several rows on the kernel interpreter: the graph of a
//! one-row step (norms inside the products) and that of a step of several rows (norms
//! apart) each record exactly the dispatches they run — as many as the decoder's summary
//! counts for that kind of step, in the order of its plan, each launched once — and the
//! profile counts the dispatches submitted by both.
//!
//! Weights are fresh each run: the seed comes from `QUENCH_SEED` if set, else at random,
//! and is printed so that a failure can be replayed.

use std::path::PathBuf;

use quench_engine::gpu::profile::{self, Mode, ProfileOptions};
use quench_engine::gpu::{load_decoder, Backend, GpuOptions, GpuSession};
use quench_engine::synth::{synthesize, SynthArch, SynthDtype, SynthOptions, SynthShape};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::seed;

#[test]
fn steps_of_one_and_of_several_rows_record_the_dispatches_they_run() {
    let s = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(s);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gpu-batch-profile-{s:x}"));
    let synth = SynthOptions {
        arch: SynthArch::Llama,
        shape: SynthShape::Tiny,
        seed: s,
        dtype: SynthDtype::Bf16,
        max_shard_bytes: SynthOptions::DEFAULT_SHARD_BYTES,
    };
    synthesize(&dir, &synth, &mut |_| {}).expect("synthesizes");
    let options = GpuOptions {
        context: Some(32),
        sessions: 3,
        max_batch: 3,
        ..GpuOptions::default()
    };

    profile::start(ProfileOptions {
        mode: Mode::Dispatches,
        ceilings: None,
    })
    .expect("profiling was off");
    let decoder = load_decoder(&dir, Backend::Interp, &options);
    // Steps of 1, 3, 2 and 1 rows.
    let sizes = [1, 3, 2, 1];
    let ran = decoder.map(|decoder| {
        let vocab = decoder.config().vocab as u32;
        let mut sessions: Vec<GpuSession> = (0..3).map(|_| decoder.new_session()).collect();
        for &n in &sizes {
            let mut rows: Vec<(&mut GpuSession, u32)> = sessions
                .iter_mut()
                .take(n)
                .map(|s| (s, rng.gen_range(0..vocab)))
                .collect();
            decoder.step_batch(&mut rows).expect("the step runs");
        }
        decoder.summary().clone()
    });
    let p = profile::finish().expect("profiling was on");
    let summary = ran.expect("loads");

    let one = summary.dispatches_per_token;
    let several = summary
        .batch_dispatches_per_step
        .expect("steps of several rows");
    assert!(several > one);
    assert_eq!(p.decoders.len(), 1);
    assert_eq!(p.decoders[0].dispatches_per_step, one);
    let per_step: Vec<usize> = sizes
        .iter()
        .map(|&n| if n == 1 { one } else { several })
        .collect();
    assert_eq!(p.submitted, per_step.iter().sum::<usize>() as u64);
    assert_eq!(p.dispatches.len() as u64, p.submitted);

    let mut records = p.dispatches.as_slice();
    for (step, (&n, &count)) in sizes.iter().zip(&per_step).enumerate() {
        let (these, rest) = records.split_at(count);
        records = rest;
        assert!(
            these
                .iter()
                .all(|r| r.step == Some(step as u32) && r.launches == 1),
            "step {step}: {these:?}"
        );
        let plan: Vec<&str> = these
            .iter()
            .filter_map(|r| r.label.strip_prefix("layer 0: "))
            .collect();
        let want = if n == 1 {
            &summary.layer_plan
        } else {
            &summary.batch_layer_plan
        };
        assert_eq!(plan, *want, "step {step} of {n} rows");
        // The norms apart from the products exactly in the steps of several rows.
        let norms = these
            .iter()
            .filter(|r| r.kernel == "rmsnorm_rows_f32")
            .count();
        let fused = these
            .iter()
            .filter(|r| r.kernel.contains("gemv") && r.kernel.contains("_rmsnorm_"))
            .count();
        let layers = summary.layer_dispatches.len();
        let want = if n == 1 {
            (0, 2 * layers + 1)
        } else {
            (2 * layers + 1, 0)
        };
        assert_eq!((norms, fused), want, "step {step} of {n} rows");
    }
}
