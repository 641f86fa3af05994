//! Helpers shared by the integration tests: fixture loading, raw GGUF byte building, temp dirs.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use quench_models::GgmlType;

pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// A `.qfx` fixture (format in scripts/fixtures/gguf/make_fixtures.py): ggml bytes and f32s.
pub struct Qfx {
    pub ggml_type: GgmlType,
    pub bytes: Vec<u8>,
    pub values: Vec<f32>,
}

pub fn read_qfx(rel: &str) -> Qfx {
    let path = fixture(rel);
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&raw[..4], b"QFX1", "{}", path.display());
    let word =
        |i: usize| u32::from_le_bytes(raw[4 + 4 * i..8 + 4 * i].try_into().unwrap()) as usize;
    let (id, n, m) = (word(0), word(1), word(2));
    let bytes = raw[16..16 + m].to_vec();
    let values: Vec<f32> = raw[16 + m..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(values.len(), n, "{}", path.display());
    Qfx {
        ggml_type: GgmlType::from_id(id as u32).unwrap(),
        bytes,
        values,
    }
}

/// Asserts bit-for-bit equality and reports the first differing element.
pub fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        let mismatches = (0..got.len())
            .filter(|&i| got[i].to_bits() != want[i].to_bits())
            .count();
        panic!(
            "{what}: {mismatches} of {} elements differ; first at {i}: got {} ({:#010x}), want {} ({:#010x})",
            got.len(),
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// A fresh, empty directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "quench-models-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Builds GGUF bytes field by field, so tests can write files the writer would refuse.
#[derive(Default)]
pub struct RawGguf {
    pub bytes: Vec<u8>,
}

impl RawGguf {
    /// Magic, version and the two counts.
    pub fn header(version: u32, tensors: u64, kvs: u64) -> RawGguf {
        let mut r = RawGguf::default();
        r.bytes.extend(b"GGUF");
        r.u32(version).u64(tensors).u64(kvs);
        r
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.bytes.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes.extend(v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes.extend(v.to_le_bytes());
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.bytes.extend(s.as_bytes());
        self
    }
    /// A metadata entry with a u32 value.
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    /// A tensor info.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ggml_type).u64(offset)
    }
    /// Pads to `alignment` and appends `n` data bytes.
    pub fn data(&mut self, alignment: usize, n: usize) -> &mut Self {
        let padded = self.bytes.len().next_multiple_of(alignment);
        self.bytes.resize(padded, 0);
        self.bytes.extend((0..n).map(|i| i as u8));
        self
    }
    pub fn build(&self) -> Vec<u8> {
        self.bytes.clone()
    }
}
