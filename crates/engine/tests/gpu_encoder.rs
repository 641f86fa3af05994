//! The BERT encoder on the device path, run by quench's kernel interpreter, judged by the
//! f64 CPU encoder: every sentence embedding within cosine 0.999, and a text's vector the
//! same whether it is embedded alone or padded in a batch with longer texts.
//!
//! Weights and texts are drawn fresh each run (`QUENCH_SEED` replays one). With
//! `QUENCH_MINILM_DIR` set, all-MiniLM-L6-v2 itself runs through the interpreter too.

use quench_cpu::Encoder;
use quench_engine::gpu::encoder::GpuEncoder;
use quench_engine::gpu::Backend;
use quench_engine::synth::TinyBert;
use quench_engine::{load, Device, LoadOptions, Precision};
use quench_models::arch::Naming;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::seed;

/// BERT at the smallest shape the device kernels take: 64 wide, 2 heads of 32.
const TINY: TinyBert = TinyBert {
    hidden: 64,
    layers: 2,
    heads: 2,
    ffn: 128,
    vocab: 50,
    max_positions: 32,
};

/// Mean over tokens, scaled to unit length (sentence-transformers' pooling + Normalize).
fn mean_normalized(states: &[f32], width: usize) -> Vec<f64> {
    let rows = states.len() / width;
    let mut v = vec![0f64; width];
    for row in states.chunks_exact(width) {
        v.iter_mut().zip(row).for_each(|(p, &x)| *p += x as f64);
    }
    v.iter_mut().for_each(|p| *p /= rows as f64);
    let norm = v.iter().map(|p| p * p).sum::<f64>().sqrt();
    v.into_iter().map(|p| p / norm).collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn tiny_bert_batch_matches_f64_and_padding_does_not_leak() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let config = TINY.config();
    let src = TINY.weights(&mut rng).expect("weights");
    let reference =
        Encoder::<f64>::load(config.clone(), &src, Naming::HuggingFace).expect("f64 encoder");
    let mut gpu = GpuEncoder::on(Backend::Interp, config.clone(), &src, Naming::HuggingFace)
        .expect("device encoder");

    // [CLS] text [SEP] with ids 4.., of lengths 13, 5, 2 (the framing alone) and 9.
    let texts: Vec<Vec<u32>> = [13usize, 5, 2, 9]
        .iter()
        .map(|&len| {
            let mut t = vec![2u32];
            t.extend((0..len - 2).map(|_| rng.gen_range(4..config.vocab as u32)));
            t.push(3);
            t
        })
        .collect();
    let batch = gpu.hidden_states(&texts).expect("batch");
    assert_eq!(batch.len(), texts.len());
    for (i, (t, states)) in texts.iter().zip(&batch).enumerate() {
        assert_eq!(
            states.len(),
            t.len() * config.hidden,
            "text {i}: states of its own tokens only"
        );
        assert!(
            states.iter().all(|v| v.is_finite()),
            "text {i}: non-finite states"
        );
        let want: Vec<f64> = reference.embed(t, None).expect("f64 embedding");
        let got = mean_normalized(states, config.hidden);
        let cos = cosine(&got, &want);
        eprintln!("text {i} ({} tokens): cosine to f64 {cos:.7}", t.len());
        assert!(
            cos >= 0.999,
            "text {i}: cosine {cos} to the f64 embedding is below 0.999"
        );

        // Alone, unpadded: the same states, bit for bit (the mask keeps the padding out,
        // and every row of a matrix product is computed the same way).
        let alone = gpu.hidden_states(std::slice::from_ref(t)).expect("alone");
        assert_eq!(
            alone[0], *states,
            "text {i}: its states depend on the texts batched with it"
        );
    }

    // A control: the tiny model's embeddings of different texts are far apart, so the
    // bound above could see a wrong text's vector.
    let a = mean_normalized(&batch[0], config.hidden);
    let b = reference.embed(&texts[3], None).expect("f64 embedding");
    assert!(
        cosine(&a, &b) < 0.99,
        "different texts embed almost alike; the check could not tell them apart"
    );
}

#[test]
fn refusals_name_the_problem() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let src = TINY.weights(&mut rng).expect("weights");
    let mut gpu = GpuEncoder::on(Backend::Interp, TINY.config(), &src, Naming::HuggingFace)
        .expect("device encoder");
    let e = gpu
        .hidden_states(&[vec![2, 50, 3]])
        .unwrap_err()
        .to_string();
    assert!(e.contains("token id 50") && e.contains("50 tokens"), "{e}");
    let e = gpu.hidden_states(&[vec![]]).unwrap_err().to_string();
    assert!(e.contains("no tokens"), "{e}");
    let e = gpu.hidden_states(&[vec![2; 33]]).unwrap_err().to_string();
    assert!(e.contains("33 tokens") && e.contains("32 positions"), "{e}");

    let narrow = TinyBert {
        hidden: 32,
        heads: 1,
        ..TINY
    };
    let src = narrow.weights(&mut rng).expect("weights");
    let e = GpuEncoder::on(Backend::Interp, narrow.config(), &src, Naming::HuggingFace)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("hidden size 32") && e.contains("multiples of 64"),
        "{e}"
    );
}

#[test]
fn minilm_through_the_interpreter_matches_f64() {
    let Some(dir) = quench_testkit::minilm_dir() else {
        return;
    };
    let texts = ["A man is eating food.", "The girl is carrying a baby."];
    let start = std::time::Instant::now();
    let device = load(
        &dir,
        &LoadOptions {
            device: Device::Interp,
            ..LoadOptions::default()
        },
    )
    .expect("device model");
    let device = device.embedding().expect("an embedding model");
    let got = device.embed(&texts).expect("device embeddings");
    eprintln!("interpreter: {:.1} s", start.elapsed().as_secs_f64());
    let options = LoadOptions {
        precision: Precision::F64,
        ..LoadOptions::default()
    };
    let cpu = load(&dir, &options).expect("f64 model");
    let want = cpu
        .embedding()
        .expect("an embedder")
        .embed(&texts)
        .expect("f64 embeddings");
    let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.tokens, w.tokens);
        let cos = cosine(&widen(&g.vector), &widen(&w.vector));
        eprintln!("text {i}: cosine to f64 {cos:.7}");
        assert!(cos >= 0.999, "text {i}: cosine {cos} below 0.999");
    }
}
