//! The GGUF reader and writer: a file written by the `gguf` Python package, version handling,
//! writer round trips, and every refusal.

mod common;

use common::{fixture, temp_dir, RawGguf};
use quench_models::arch::ModelConfig;
use quench_models::gguf::{GgufWriter, MetadataArray as A, MetadataValue as V};
use quench_models::{GgmlType, GgufFile, ModelError};
use serde_json::Value;

fn all_types() -> GgufFile {
    GgufFile::open(fixture("all_types.gguf")).unwrap()
}

#[test]
fn reads_every_metadata_type_written_by_the_gguf_package() {
    let f = all_types();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_start() % 64, 0);
    let expect = [
        ("general.architecture", V::String("testarch".into())),
        ("general.alignment", V::U32(64)),
        ("t.u8", V::U8(200)),
        ("t.i8", V::I8(-100)),
        ("t.u16", V::U16(60000)),
        ("t.i16", V::I16(-30000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.f32", V::F32(0.15625)),
        ("t.u64", V::U64((1 << 63) + 5)),
        ("t.i64", V::I64(-(1 << 62))),
        ("t.f64", V::F64(-1e300)),
        ("t.bool_true", V::Bool(true)),
        ("t.bool_false", V::Bool(false)),
        ("t.string", V::String("héllo ✓".into())),
        (
            "t.arr_str",
            V::Array(A::String(vec!["a".into(), "".into(), "ünï".into()])),
        ),
        ("t.arr_i32", V::Array(A::I32(vec![1, -2, 3]))),
        ("t.arr_f32", V::Array(A::F32(vec![0.5, -1.25]))),
        ("t.arr_bool", V::Array(A::Bool(vec![true, false, true]))),
        ("t.arr_u16", V::Array(A::U16(vec![1, 65535]))),
        ("t.arr_f64", V::Array(A::F64(vec![1.5, -2.5]))),
        (
            "t.arr_nested",
            V::Array(A::Array(vec![
                A::I32(vec![1, 2]),
                A::I32(vec![3]),
                A::I32(vec![4, 5, 6]),
            ])),
        ),
        (
            "t.arr_nested_str",
            V::Array(A::Array(vec![
                A::String(vec!["x".into(), "y".into()]),
                A::String(vec!["z".into()]),
            ])),
        ),
    ];
    let entries: Vec<_> = f.metadata_entries().collect();
    assert_eq!(entries.len(), expect.len());
    for ((key, value), (want_key, want)) in entries.iter().zip(&expect) {
        assert_eq!(key, want_key);
        assert_eq!(*value, want, "{key}");
        assert_eq!(f.metadata(key), Some(want));
    }
}

#[test]
fn typed_getters_convert_losslessly_or_refuse() {
    let f = all_types();
    assert_eq!(f.get_u32("t.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_u32("t.u8").unwrap(), 200);
    assert_eq!(f.get_u64("t.u64").unwrap(), (1 << 63) + 5);
    assert_eq!(f.get_i64("t.i8").unwrap(), -100);
    assert_eq!(f.get_f32("t.f32").unwrap(), 0.15625);
    assert!(f.get_bool("t.bool_true").unwrap());
    assert_eq!(f.get_str("t.string").unwrap(), "héllo ✓");
    assert_eq!(f.get_str_array("t.arr_str").unwrap(), ["a", "", "ünï"]);
    assert_eq!(f.get_i32_array("t.arr_i32").unwrap(), [1, -2, 3]);
    assert_eq!(f.get_f32_array("t.arr_f32").unwrap(), [0.5, -1.25]);
    assert_eq!(f.get_array("t.arr_nested").unwrap().len(), 3);

    for (key, err) in [
        ("t.i8", f.get_u32("t.i8").unwrap_err()),
        ("t.u64", f.get_u32("t.u64").unwrap_err()),
        ("t.f64", f.get_f32("t.f64").unwrap_err()),
        ("t.u32", f.get_str("t.u32").unwrap_err()),
        ("t.arr_i32", f.get_f32_array("t.arr_i32").unwrap_err()),
    ] {
        assert!(
            matches!(&err, ModelError::MetadataType { key: k, .. } if k == key),
            "{err}"
        );
    }
    let err = f.get_u32("no.such.key").unwrap_err();
    assert!(
        matches!(err, ModelError::MissingMetadata { .. })
            && err.to_string().contains("no.such.key")
    );
}

#[test]
fn tensors_match_what_the_gguf_package_reads() {
    let f = all_types();
    let text = std::fs::read_to_string(fixture("all_types.gguf.json")).unwrap();
    let expected: serde_json::Map<String, Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(f.tensors().count(), expected.len());
    for (info, view) in f.tensor_infos().iter().zip(f.tensors()) {
        let want = &expected[&info.name];
        let dims: Vec<u64> = serde_json::from_value(want["dims"].clone()).unwrap();
        assert_eq!(view.dims, dims, "{}", info.name);
        assert_eq!(view.ggml_type.name(), want["type"], "{}", info.name);
        assert_eq!(
            f.data_start() + info.offset,
            want["file_offset"],
            "{}",
            info.name
        );
        assert_eq!(view.bytes.len() as u64, info.size);
        let bits: Vec<u32> = serde_json::from_value(want["f32_bits"].clone()).unwrap();
        let got: Vec<u32> = view.to_f32().unwrap().iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, bits, "{}", info.name);
    }
    assert_eq!(f.tensor("q8_tensor").unwrap().ggml_type, GgmlType::Q8_0);
    let err = f.tensor("nope").unwrap_err();
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
}

#[test]
fn version_2_has_the_same_layout() {
    let mut bytes = std::fs::read(fixture("all_types.gguf")).unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let v2 = GgufFile::from_bytes(bytes).unwrap();
    let v3 = all_types();
    assert_eq!(v2.version(), 2);
    assert!(v2.metadata_entries().eq(v3.metadata_entries()));
    assert!(v2.tensor_infos() == v3.tensor_infos());
}

#[test]
fn other_versions_and_magics_are_refused() {
    let bytes = std::fs::read(fixture("all_types.gguf")).unwrap();
    for (version, needle) in [
        (1u32, "version 1"),
        (4, "version 4"),
        (3u32.swap_bytes(), "big-endian"),
    ] {
        let mut b = bytes.clone();
        b[4..8].copy_from_slice(&version.to_le_bytes());
        let err = GgufFile::from_bytes(b).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
    let mut b = bytes.clone();
    b[0] = b'X';
    let err = GgufFile::from_bytes(b).unwrap_err();
    assert!(matches!(err, ModelError::BadMagic { .. }), "{err}");
    let err = GgufFile::from_bytes(Vec::new()).unwrap_err();
    assert!(matches!(err, ModelError::Truncated { .. }), "{err}");
}

#[test]
fn writer_reproduces_the_package_file_byte_for_byte() {
    // Re-writing everything read from the package's file gives the package's bytes.
    let original = std::fs::read(fixture("all_types.gguf")).unwrap();
    let f = all_types();
    let mut w = GgufWriter::new();
    for (key, value) in f.metadata_entries() {
        w.add_metadata(key, value.clone()).unwrap();
    }
    for t in f.tensors() {
        w.add_tensor(t.name, t.dims, t.ggml_type, t.bytes).unwrap();
    }
    assert!(
        w.to_bytes() == original,
        "writer output differs from the gguf package's"
    );

    let path = temp_dir("gguf-writer").join("copy.gguf");
    w.write(&path).unwrap();
    assert!(std::fs::read(&path).unwrap() == original);
}

#[test]
fn writer_refuses_bad_tensors_and_metadata() {
    let data = [0u8; 36];
    let mut w = GgufWriter::new();
    w.add_tensor("a", &[32], GgmlType::Q8_0, &data[..34])
        .unwrap();
    let err = w
        .add_tensor("a", &[32], GgmlType::Q8_0, &data[..34])
        .unwrap_err();
    assert!(matches!(err.kind(), ModelError::Duplicate { .. }), "{err}");
    let err = w.add_tensor("b", &[32], GgmlType::Q8_0, &data).unwrap_err();
    assert!(
        matches!(err.kind(), ModelError::SizeMismatch { .. })
            && err.to_string().contains("tensor b"),
        "{err}"
    );
    let err = w
        .add_tensor("c", &[16], GgmlType::Q8_0, &data[..17])
        .unwrap_err();
    assert!(matches!(err.kind(), ModelError::BadShape { .. }), "{err}");
    let err = w.add_metadata("general.alignment", V::U32(48)).unwrap_err();
    assert!(matches!(err, ModelError::BadMetadata { .. }), "{err}");
    w.add_metadata("k", V::Bool(true)).unwrap();
    assert!(w.add_metadata("k", V::Bool(false)).is_err());
}

// ---- refusals of malformed files -------------------------------------------------------------

fn parse_err(bytes: Vec<u8>) -> ModelError {
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("malformed file accepted"),
        Err(e) => e,
    }
}

#[test]
fn every_truncation_is_refused() {
    let bytes = std::fs::read(fixture("all_types.gguf")).unwrap();
    let f = all_types();
    let data_end = f.data_start()
        + f.tensor_infos()
            .iter()
            .map(|t| t.offset + t.size)
            .max()
            .unwrap();
    for len in 0..data_end as usize {
        let err = parse_err(bytes[..len].to_vec());
        assert!(
            matches!(
                err.kind(),
                ModelError::Truncated { .. }
                    | ModelError::AbsurdCount { .. }
                    | ModelError::OutOfBounds { .. }
            ),
            "length {len}: {err}"
        );
    }
    // Only trailing padding may go.
    for len in data_end as usize..=bytes.len() {
        assert!(
            GgufFile::from_bytes(bytes[..len].to_vec()).is_ok(),
            "length {len}"
        );
    }
}

#[test]
fn absurd_counts_are_refused_before_allocating() {
    let err = parse_err(RawGguf::header(3, u64::MAX, 0).build());
    assert!(
        matches!(err, ModelError::AbsurdCount { .. }) && err.to_string().contains("tensor count"),
        "{err}"
    );
    let err = parse_err(RawGguf::header(3, 0, 1 << 40).build());
    assert!(err.to_string().contains("metadata count"), "{err}");
    // An array claiming 2^60 u64 elements.
    let err = parse_err(
        RawGguf::header(3, 0, 1)
            .str("k")
            .u32(9)
            .u32(10)
            .u64(1 << 60)
            .build(),
    );
    assert!(
        matches!(err, ModelError::AbsurdCount { .. }) && err.to_string().contains("metadata k"),
        "{err}"
    );
    // A string longer than the file.
    let err = parse_err(
        RawGguf::header(3, 0, 1)
            .str("k")
            .u32(8)
            .u64(u64::MAX)
            .build(),
    );
    assert!(matches!(err, ModelError::Truncated { .. }), "{err}");
    let err = parse_err(RawGguf::header(3, 1, 0).tensor("t", &[1; 5], 0, 0).build());
    assert!(
        err.to_string().contains("tensor t") && err.to_string().contains("dimension count 5"),
        "{err}"
    );
}

#[test]
fn bad_metadata_is_refused_by_key() {
    let cases: Vec<(RawGguf, &str)> = vec![
        (
            {
                let mut r = RawGguf::header(3, 0, 2);
                r.kv_u32("dup", 1).kv_u32("dup", 2);
                r
            },
            "duplicate metadata key \"dup\"",
        ),
        (
            {
                let mut r = RawGguf::header(3, 0, 1);
                r.str("k").u32(13);
                r
            },
            "metadata k: unknown value type id 13",
        ),
        (
            {
                let mut r = RawGguf::header(3, 0, 1);
                r.str("k").u32(9).u32(77).u64(0);
                r
            },
            "metadata k: unknown value type id 77",
        ),
        (
            {
                let mut r = RawGguf::header(3, 0, 1);
                r.str("k").u32(7).u8(2);
                r
            },
            "bool byte is 2",
        ),
        (
            {
                let mut r = RawGguf::header(3, 0, 1);
                r.str("deep");
                r.u32(9);
                for _ in 0..20 {
                    r.u32(9).u64(1);
                }
                r
            },
            "nested deeper",
        ),
        (
            {
                let mut r = RawGguf::header(3, 0, 1);
                r.kv_u32("general.alignment", 48);
                r
            },
            "general.alignment",
        ),
        (
            {
                let mut r = RawGguf::header(3, 0, 1);
                r.kv_u32("general.alignment", 0);
                r
            },
            "power of two",
        ),
        (
            {
                let mut r = RawGguf::header(3, 0, 1);
                r.u64(2).u8(0xff).u8(0xfe).u32(4).u32(0);
                r
            },
            "not valid UTF-8",
        ),
    ];
    for (raw, needle) in cases {
        let err = parse_err(raw.build());
        assert!(
            err.to_string().contains(needle),
            "expected {needle:?} in {err}"
        );
    }
}

#[test]
fn bad_tensor_infos_are_refused_by_name() {
    let q4_0 = GgmlType::Q4_0.id();
    let f32_ = GgmlType::F32.id();
    let cases: Vec<(RawGguf, &str)> = vec![
        (
            {
                let mut r = RawGguf::header(3, 1, 0);
                r.tensor("w", &[4], 99, 0).data(32, 16);
                r
            },
            "tensor w: unknown ggml type id 99",
        ),
        (
            {
                let mut r = RawGguf::header(3, 1, 0);
                r.tensor("w", &[1 << 32, 1 << 32, 1 << 32], f32_, 0);
                r
            },
            "element count overflows",
        ),
        (
            {
                let mut r = RawGguf::header(3, 1, 0);
                r.tensor("w", &[33], q4_0, 0).data(32, 64);
                r
            },
            "not a whole number of Q4_0 blocks",
        ),
        (
            {
                let mut r = RawGguf::header(3, 1, 0);
                r.tensor("w", &[4], f32_, 8).data(32, 64);
                r
            },
            "tensor w: data offset 8 is not a multiple of the alignment 32",
        ),
        (
            {
                let mut r = RawGguf::header(3, 1, 0);
                r.tensor("w", &[32], f32_, 0).data(32, 64);
                r
            },
            "tensor w: data [0, 128) runs past the end",
        ),
        (
            {
                let mut r = RawGguf::header(3, 2, 0);
                r.tensor("a", &[16], f32_, 0)
                    .tensor("b", &[4], f32_, 32)
                    .data(32, 96);
                r
            },
            "tensor b: data [32, 48) overlaps tensor a",
        ),
        (
            {
                let mut r = RawGguf::header(3, 2, 0);
                r.tensor("a", &[4], f32_, 0)
                    .tensor("a", &[4], f32_, 32)
                    .data(32, 64);
                r
            },
            "duplicate tensor \"a\"",
        ),
    ];
    for (raw, needle) in cases {
        let err = parse_err(raw.build());
        assert!(
            err.to_string().contains(needle),
            "expected {needle:?} in {err}"
        );
    }
}

#[test]
fn a_minimal_hand_built_file_parses() {
    // Control for the refusals above: the same builder makes a valid file.
    let mut r = RawGguf::header(3, 2, 1);
    r.kv_u32("general.alignment", 16)
        .tensor("a", &[4], GgmlType::F32.id(), 0)
        .tensor("b", &[32], GgmlType::Q4_0.id(), 16)
        .data(16, 34);
    let f = GgufFile::from_bytes(r.build()).unwrap();
    assert_eq!(f.alignment(), 16);
    assert_eq!(
        f.tensor("a").unwrap().bytes,
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    );
    assert_eq!(f.tensor("b").unwrap().bytes.len(), 18);
}

#[test]
fn open_errors_name_the_file() {
    let err = GgufFile::open("/nonexistent/model.gguf").err().unwrap();
    assert!(
        matches!(err, ModelError::Io { .. }) && err.to_string().contains("/nonexistent/model.gguf"),
        "{err}"
    );
    let path = temp_dir("gguf-bad").join("bad.gguf");
    std::fs::write(&path, b"GGUF\x01\0\0\0").unwrap();
    let err = GgufFile::open(&path).err().unwrap();
    assert!(matches!(err, ModelError::InFile { .. }), "{err}");
    assert!(matches!(
        err.kind(),
        ModelError::UnsupportedVersion { version: 1, .. }
    ));
    assert!(
        err.to_string().starts_with(&path.display().to_string()),
        "{err}"
    );
    let empty = temp_dir("gguf-empty").join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty).err().unwrap().kind(),
        ModelError::Truncated { .. }
    ));
}

/// A model config whose numbers multiply past `usize` is refused by name before any
/// backend forms the product (an attention width, a weight's element count, a KV cache).
#[test]
fn model_sizes_that_overflow_are_refused_by_field() {
    let file = |entries: &[(&str, V)]| {
        let mut w = GgufWriter::new();
        let base = [
            ("general.architecture", V::String("llama".into())),
            ("llama.embedding_length", V::U64(64)),
            ("llama.attention.head_count", V::U64(4)),
            ("llama.block_count", V::U64(2)),
            ("llama.feed_forward_length", V::U64(128)),
            ("llama.context_length", V::U64(256)),
            ("llama.vocab_size", V::U64(320)),
            ("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5)),
        ];
        for (key, value) in base.clone() {
            let given = entries.iter().find(|(k, _)| *k == key);
            let value = given.map_or(value, |(_, v)| v.clone());
            w.add_metadata(key, value).unwrap();
        }
        for (key, value) in entries {
            if !base.iter().any(|(k, _)| k == key) {
                w.add_metadata(key, value.clone()).unwrap();
            }
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    };
    let big = 1u64 << 32;
    assert!(ModelConfig::from_gguf(&file(&[])).is_ok());
    let cases: [(&[(&str, V)], &str); 4] = [
        (
            &[
                ("llama.attention.head_count", V::U64(big)),
                ("llama.attention.key_length", V::U64(big)),
            ],
            "heads 4294967296 × head_dim 4294967296 overflows",
        ),
        (
            &[
                ("llama.embedding_length", V::U64(u64::MAX - 1)),
                ("llama.attention.key_length", V::U64(16)),
            ],
            "vocab 320 × hidden 18446744073709551614 overflows",
        ),
        (
            &[
                ("llama.feed_forward_length", V::U64(big)),
                ("llama.embedding_length", V::U64(big)),
                ("llama.attention.key_length", V::U64(16)),
                ("llama.vocab_size", V::U64(1)),
            ],
            "ffn 4294967296 × hidden 4294967296 overflows",
        ),
        (
            &[("llama.context_length", V::U64(u64::MAX))],
            "max_positions 18446744073709551615 overflows",
        ),
    ];
    for (entries, expected) in cases {
        let err = ModelConfig::from_gguf(&file(entries))
            .expect_err(expected)
            .to_string();
        assert!(err.contains(expected), "{expected}: {err}");
    }
}
