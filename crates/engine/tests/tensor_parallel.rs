//! Tensor parallelism on the kernel interpreter: tiny seeded llama, qwen2 and qwen3
//! models split over 2 and 4 in-process ranks, each on its own interpreter, the ranks'
//! rows combined between the segments of their steps. Every logit of every step is
//! judged against the f64 CPU reference; results repeat bit for bit; one rank gives the
//! whole decoder's bits; degrees the model does not divide by are refused by name.
//!
//! Weights are fresh each run (`QUENCH_SEED` replays one).

use quench_cpu::Decoder;
use quench_engine::gpu::check::{check_generation, LogitBound, Reference};
use quench_engine::gpu::{GpuDecoder, GpuError, GpuOptions, TensorParallel};
use quench_models::arch::{ModelConfig, Naming};
use quench_models::{GgmlType, GgufFile};
use quench_rt::{Executor, InterpExecutor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;

use common::{bits, gguf, seed, LayerFormats, Shape, Tiny};

/// 2 layers, width 128, 4 heads of 32 over `kv_heads`, ffn 256, 256 tokens.
fn shape(kv_heads: usize) -> Shape {
    Shape {
        hidden: 128,
        heads: 4,
        kv_heads,
        head_dim: 32,
        ffn: 256,
        vocab: 256,
        context: 512,
        eps: 1e-5,
    }
}

/// Quantized, in block types whose blocks a share of 64 or 32 columns holds whole.
const QUANTIZED: LayerFormats = LayerFormats {
    q: GgmlType::Q8_0,
    k: GgmlType::Q8_0,
    v: GgmlType::Q8_0,
    o: GgmlType::Q4_0,
    gate_up: GgmlType::Q4_1,
    down: GgmlType::Q8_0,
};

/// Floats, q, k and v in different formats (three projections).
const FLOATS: LayerFormats = LayerFormats {
    q: GgmlType::BF16,
    k: GgmlType::F16,
    v: GgmlType::Q4_1,
    o: GgmlType::F16,
    gate_up: GgmlType::BF16,
    down: GgmlType::BF16,
};

fn options() -> GpuOptions {
    GpuOptions {
        context: Some(48),
        prefill_chunk: 0,
        ..GpuOptions::default()
    }
}

fn interpreters(n: usize) -> Vec<(Box<dyn Executor + Send>, Option<u64>)> {
    (0..n)
        .map(|_| {
            (
                Box::new(InterpExecutor::new()) as Box<dyn Executor + Send>,
                None,
            )
        })
        .collect()
}

fn split(file: &GgufFile, ranks: usize) -> Result<TensorParallel, GpuError> {
    split_with(file, ranks, &options())
}

fn split_with(
    file: &GgufFile,
    ranks: usize,
    options: &GpuOptions,
) -> Result<TensorParallel, GpuError> {
    let config = ModelConfig::from_gguf(file).expect("a config");
    TensorParallel::new(config, file, Naming::Gguf, interpreters(ranks), options)
}

/// The prompt path in chunks of 4 tokens.
fn chunked() -> GpuOptions {
    GpuOptions {
        prefill_chunk: 4,
        ..options()
    }
}

fn reference(file: &GgufFile) -> Reference {
    let config = ModelConfig::from_gguf(file).expect("a config");
    Reference::from_decoder(Decoder::load(config, file, Naming::Gguf).expect("a reference"))
}

/// Generates 4 tokens after a 5-token prompt on `ranks` ranks; every logit within
/// `quench check`'s bound of the f64 reference. Returns the logits of the last step.
fn judged(what: &str, m: &Tiny, ranks: usize, seed: u64) -> Vec<f32> {
    judged_with(what, m, ranks, seed, &options(), 5)
}

fn judged_with(
    what: &str,
    m: &Tiny,
    ranks: usize,
    seed: u64,
    options: &GpuOptions,
    prompt: usize,
) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let file = gguf(m, &mut rng);
    let tp = split_with(&file, ranks, options).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(tp.degree(), ranks);
    assert_eq!(tp.summary().prefill_chunk, options.prefill_chunk, "{what}");
    let prompt: Vec<u32> = (0..prompt).map(|_| rng.gen_range(0..256)).collect();
    let reference = reference(&file);
    let c = check_generation(&tp, &reference, LogitBound::FP64_CHECK, &prompt, 4)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    for s in &c.steps {
        eprintln!(
            "{what}: position {}: max |error| {:.2e}, worst {:+.2e} past the bound",
            s.position, s.max_abs_error, s.worst.excess
        );
        assert_eq!(s.outside, 0, "{what}: {s:?}");
    }
    let mut session = tp.new_session();
    tp.feed(&mut session, &prompt).expect("a feed");
    for &t in &c.tokens[..2] {
        tp.feed(&mut session, &[t]).expect("a step");
    }
    tp.feed(&mut session, &c.tokens[2..3]).expect("a step")
}

fn llama(kv_heads: usize) -> Tiny {
    Tiny {
        arch: "llama",
        shape: shape(kv_heads),
        layers: vec![QUANTIZED, FLOATS],
        embedding: GgmlType::Q8_0,
        output: None,
    }
}

#[test]
fn two_ranks_of_llama_match_the_f64_reference_and_repeat_bit_for_bit() {
    let s = seed();
    let once = judged("llama over 2 ranks (tied Q8_0 head)", &llama(2), 2, s);
    let again = judged("llama over 2 ranks, again", &llama(2), 2, s);
    assert_eq!(bits(&once), bits(&again), "a rerun gives the same bits");
}

#[test]
fn four_ranks_each_with_one_kv_head() {
    // The Q4_0 kernels read rows of 64 columns or more: a share of 32 is refused.
    let m = Tiny {
        layers: vec![FLOATS; 2],
        ..llama(4)
    };
    judged("llama over 4 ranks", &m, 4, seed());
}

#[test]
fn qwen2_biases_and_an_untied_head_are_split_too() {
    let m = Tiny {
        arch: "qwen2",
        shape: shape(2),
        layers: vec![QUANTIZED, FLOATS],
        embedding: GgmlType::F16,
        output: Some(GgmlType::Q4_0),
    };
    judged(
        "qwen2 over 2 ranks (q/k/v biases, untied Q4_0 head)",
        &m,
        2,
        seed(),
    );
}

#[test]
fn qwen3_per_head_norms_are_whole_on_every_rank() {
    let m = Tiny {
        arch: "qwen3",
        shape: shape(2),
        layers: vec![FLOATS, QUANTIZED],
        embedding: GgmlType::BF16,
        output: Some(GgmlType::BF16),
    };
    judged("qwen3 over 2 ranks (q/k norms)", &m, 2, seed());
}

/// One rank and the whole decoder, both on `options`, fed `feeds` one after another:
/// the same bits after each.
fn one_rank_against_the_whole(m: &Tiny, options: &GpuOptions, feeds: &[usize]) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = gguf(m, &mut rng);
    let tp = split_with(&file, 1, options).expect("one rank");
    let whole = GpuDecoder::new(
        ModelConfig::from_gguf(&file).expect("a config"),
        &file,
        Naming::Gguf,
        Box::new(InterpExecutor::new()),
        None,
        options,
    )
    .expect("a decoder");
    let (mut a, mut b) = (tp.new_session(), whole.new_session());
    for (i, &n) in feeds.iter().enumerate() {
        let tokens: Vec<u32> = (0..n).map(|_| rng.gen_range(0..256)).collect();
        let split = tp.feed(&mut a, &tokens).expect("a feed");
        let one = whole.feed(&mut b, &tokens).expect("a feed");
        assert_eq!(bits(&split), bits(&one), "feed {i}");
    }
}

#[test]
fn one_rank_gives_the_whole_decoders_bits() {
    one_rank_against_the_whole(&llama(2), &options(), &[1; 6]);
}

#[test]
fn degrees_the_model_does_not_divide_by_are_refused_by_name() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = gguf(&llama(2), &mut rng);
    let e = split(&file, 3).expect_err("3 ranks").to_string();
    assert!(e.contains("attention heads (4) do not divide by 3"), "{e}");
    let e = split(&file, 4)
        .expect_err("4 ranks of 2 kv heads")
        .to_string();
    assert!(e.contains("kv heads (2) do not divide by 4"), "{e}");

    // Q4_K's blocks of 256 columns cannot be cut in two shares of 128.
    let m = Tiny {
        layers: vec![
            LayerFormats {
                down: GgmlType::Q4_K,
                ..QUANTIZED
            },
            FLOATS,
        ],
        ..llama(2)
    };
    let file = gguf(&m, &mut rng);
    let e = split(&file, 2).expect_err("a cut block").to_string();
    assert!(
        e.contains("blk.0.ffn_down.weight (Q4_K)") && e.contains("blocks of 256"),
        "{e}"
    );
}

#[test]
fn a_token_outside_the_vocabulary_and_a_foreign_session_are_refused() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = gguf(&llama(2), &mut rng);
    let tp = split(&file, 2).expect("two ranks");
    let mut s = tp.new_session();
    let e = tp
        .feed(&mut s, &[3, 256])
        .expect_err("token 256")
        .to_string();
    assert!(e.contains("256"), "{e}");
    assert_eq!(s.len(), 0, "nothing was fed");
    let other = split(&file, 2).expect("two ranks");
    let mut theirs = other.new_session();
    tp.feed(&mut s, &[3]).expect("a step");
    assert!(matches!(
        tp.feed(&mut theirs, &[4]),
        Err(GpuError::ForeignSession)
    ));
}

#[test]
fn rows_stepped_together_have_the_bits_they_have_alone() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = gguf(&llama(2), &mut rng);
    let config = ModelConfig::from_gguf(&file).expect("a config");
    let batched = GpuOptions {
        max_batch: 3,
        sessions: 3,
        ..options()
    };
    let tp = TensorParallel::new(config, &file, Naming::Gguf, interpreters(2), &batched)
        .expect("two ranks");
    assert_eq!(tp.max_batch(), 3);
    let prompts: Vec<Vec<u32>> = [3, 5, 1]
        .iter()
        .map(|&n| (0..n).map(|_| rng.gen_range(0..256)).collect())
        .collect();
    let mut sessions: Vec<_> = prompts.iter().map(|_| tp.new_session()).collect();
    let mut rows: Vec<_> = sessions
        .iter_mut()
        .zip(&prompts)
        .map(|(s, p)| (s, p.as_slice()))
        .collect();
    let together = tp.feed_batch(&mut rows).expect("a batch");
    for (i, (p, row)) in prompts.iter().zip(together).enumerate() {
        let row = row.expect("a row");
        let mut alone = tp.new_session();
        let by_itself = tp.feed(&mut alone, p).expect("alone");
        assert_eq!(bits(&row), bits(&by_itself), "row {i}");
    }
    let (steps, combining) = tp.combining();
    assert_eq!(
        steps,
        5 + 3 + 5 + 1,
        "the batch's 5 steps, then each prompt's own"
    );
    assert!(combining.as_nanos() > 0);
}

#[test]
fn prompt_chunks_are_split_too() {
    // The prompt path's GEMMs take products 64 rows wide or more: 2 kv heads of 32 a rank.
    let m = Tiny {
        layers: vec![common::BF16, FLOATS],
        ..llama(4)
    };
    let s = seed();
    let once = judged_with("llama over 2 ranks, chunks of 4", &m, 2, s, &chunked(), 10);
    let again = judged_with("the same, again", &m, 2, s, &chunked(), 10);
    assert_eq!(bits(&once), bits(&again), "a rerun gives the same bits");
}

#[test]
fn one_rank_gives_the_whole_decoders_bits_over_prompt_chunks() {
    let m = Tiny {
        layers: vec![common::BF16, FLOATS],
        ..llama(2)
    };
    one_rank_against_the_whole(&m, &chunked(), &[10, 1, 1, 6]);
}

#[test]
fn a_rank_that_does_not_fit_is_named() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = gguf(&llama(2), &mut rng);
    let small = GpuOptions {
        memory_limit: Some(64 << 10),
        ..options()
    };
    let e = split_with(&file, 2, &small)
        .expect_err("64 KiB a rank")
        .to_string();
    assert!(
        e.starts_with("tensor-parallel rank 0 of 2: the model does not fit"),
        "{e}"
    );
}

#[test]
fn captured_segments_give_the_bits_of_launched_ones() {
    let mut rng = ChaCha8Rng::seed_from_u64(seed());
    let file = gguf(&llama(2), &mut rng);
    let tokens: Vec<u32> = (0..5).map(|_| rng.gen_range(0..256)).collect();
    let launched = GpuOptions {
        capture: false,
        ..options()
    };
    let (a, b) = (
        split_with(&file, 2, &options()).expect("captured"),
        split_with(&file, 2, &launched).expect("launched"),
    );
    let (mut sa, mut sb) = (a.new_session(), b.new_session());
    for t in &tokens {
        let (x, y) = (
            a.feed(&mut sa, &[*t]).expect("a step"),
            b.feed(&mut sb, &[*t]).expect("a step"),
        );
        assert_eq!(bits(&x), bits(&y));
    }
}
