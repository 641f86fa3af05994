//! Mutation fuzzing of the GGUF reader: seeded random damage to valid files, many thousands of
//! times. Parsing must return `Ok` or `Err`, never panic, and a file that parses must be safe
//! to use in full (every metadata getter, every tensor view, dequantization).

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use common::fixture;
use quench_models::gguf::{GgufWriter, MetadataArray as A, MetadataValue as V};
use quench_models::{GgmlType, GgufFile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const ITERATIONS_PER_BASE: usize = 50_000;

/// A small file with strings, arrays, nested arrays and quantized tensors.
fn writer_base() -> Vec<u8> {
    let data: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", V::String("llama".into()))
        .unwrap();
    w.add_metadata("llama.block_count", V::U32(2)).unwrap();
    w.add_metadata("llama.rope.freq_base", V::F32(10000.0))
        .unwrap();
    w.add_metadata(
        "tokenizer.ggml.tokens",
        V::Array(A::String(vec!["a".into(), "bc".into(), "<s>".into()])),
    )
    .unwrap();
    w.add_metadata(
        "tokenizer.ggml.scores",
        V::Array(A::F32(vec![0.0, -1.0, -2.0])),
    )
    .unwrap();
    w.add_metadata(
        "nested",
        V::Array(A::Array(vec![A::U8(vec![1, 2]), A::Bool(vec![true])])),
    )
    .unwrap();
    w.add_metadata("big", V::U64(u64::MAX)).unwrap();
    w.add_tensor("f32", &[8, 2], GgmlType::F32, &data[..64])
        .unwrap();
    w.add_tensor("q4_0", &[64], GgmlType::Q4_0, &data[..36])
        .unwrap();
    w.add_tensor("q6_k", &[256], GgmlType::Q6_K, &data[..210])
        .unwrap();
    w.add_tensor("bf16", &[4], GgmlType::BF16, &data[..8])
        .unwrap();
    w.to_bytes()
}

/// Values that tend to hit edge cases when written over a length, count or offset.
const INTERESTING: [u64; 12] = [
    0,
    1,
    2,
    3,
    4,
    31,
    32,
    0x7fff_ffff,
    0xffff_ffff,
    1 << 32,
    1 << 63,
    u64::MAX,
];

fn mutate(rng: &mut ChaCha8Rng, base: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..rng.gen_range(1..=4) {
        if b.is_empty() {
            break;
        }
        let at = rng.gen_range(0..b.len());
        match rng.gen_range(0..7) {
            0 => b[at] ^= 1 << rng.gen_range(0..8),
            1 => b[at] = rng.gen(),
            2 => {
                let v = INTERESTING[rng.gen_range(0..INTERESTING.len())].to_le_bytes();
                let n = (b.len() - at).min(8);
                b[at..at + n].copy_from_slice(&v[..n]);
            }
            3 => {
                let v = (INTERESTING[rng.gen_range(0..INTERESTING.len())] as u32).to_le_bytes();
                let n = (b.len() - at).min(4);
                b[at..at + n].copy_from_slice(&v[..n]);
            }
            4 => b.truncate(at),
            5 => {
                // Duplicate a chunk in place (shifts everything after it).
                let end = (at + rng.gen_range(1..32)).min(b.len());
                let chunk = b[at..end].to_vec();
                b.splice(at..at, chunk);
            }
            _ => {
                let end = (at + rng.gen_range(1..16)).min(b.len());
                b.drain(at..end);
            }
        }
    }
    b
}

/// Uses everything a parsed file offers.
fn exercise(bytes: Vec<u8>) -> bool {
    let Ok(f) = GgufFile::from_bytes(bytes) else {
        return false;
    };
    let keys: Vec<String> = f.metadata_entries().map(|(k, _)| k.to_owned()).collect();
    for key in &keys {
        let _ = f.get_u32(key);
        let _ = f.get_u64(key);
        let _ = f.get_i64(key);
        let _ = f.get_f32(key);
        let _ = f.get_bool(key);
        let _ = f.get_str(key);
        let _ = f.get_str_array(key);
        let _ = f.get_f32_array(key);
        let _ = f.get_i32_array(key);
        let _ = f.metadata(key).map(|v| v.type_description());
    }
    for t in f.tensors() {
        assert_eq!(
            t.bytes.len() as u64,
            t.ggml_type.bytes_for(t.n_elements()).unwrap()
        );
        let _ = t.to_f32();
        let _ = f.tensor(t.name).unwrap();
    }
    true
}

fn fuzz(name: &str, base: Vec<u8>, seed: u64) {
    assert!(
        exercise(base.clone()),
        "{name}: the unmutated base must parse"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut parsed = 0;
    for i in 0..ITERATIONS_PER_BASE {
        let bytes = mutate(&mut rng, &base);
        let outcome = catch_unwind(AssertUnwindSafe(|| exercise(bytes.clone())));
        match outcome {
            Ok(ok) => parsed += usize::from(ok),
            Err(_) => panic!(
                "{name}: iteration {i} (seed {seed}) panicked on {} bytes: {bytes:02x?}",
                bytes.len()
            ),
        }
    }
    // Some mutations (in tensor data, or padding) leave the file valid; most must not parse.
    eprintln!("{name}: {parsed} of {ITERATIONS_PER_BASE} mutants parsed");
    assert!(
        parsed > 0 && parsed < ITERATIONS_PER_BASE,
        "{name}: mutations are not reaching the parser"
    );
}

#[test]
fn mutated_writer_files_never_panic() {
    fuzz("writer base", writer_base(), 0x5eed_0001);
}

#[test]
fn mutated_package_files_never_panic() {
    let base = std::fs::read(fixture("all_types.gguf")).unwrap();
    fuzz("package base", base, 0x5eed_0002);
}
