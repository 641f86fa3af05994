//! Safetensors: a file written by the `safetensors` package, writer round trips, refusals,
//! sharded checkpoints and header fuzzing.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{fixture, temp_dir};
use quench_models::dequant::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use quench_models::safetensors::{Dtype, SafetensorsFile, SafetensorsWriter};
use quench_models::{HfCheckpoint, ModelError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;

#[test]
fn reads_the_file_the_safetensors_package_wrote() {
    let f = SafetensorsFile::open(fixture("small.safetensors")).unwrap();
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("small.safetensors.json")).unwrap())
            .unwrap();
    let metadata: BTreeMap<String, String> =
        serde_json::from_value(expected["metadata"].clone()).unwrap();
    assert_eq!(f.metadata(), &metadata);
    let tensors = expected["tensors"].as_object().unwrap();
    assert_eq!(f.tensor_infos().len(), tensors.len());
    for (name, want) in tensors {
        let info = f.info(name).unwrap();
        assert_eq!(info.dtype.name(), want["dtype"], "{name}");
        let shape: Vec<u64> = serde_json::from_value(want["shape"].clone()).unwrap();
        assert_eq!(info.shape, shape, "{name}");
        match want["f32_bits"].as_array() {
            Some(bits) => {
                let view = f.tensor(name).unwrap();
                let got: Vec<u64> = view
                    .to_f32()
                    .iter()
                    .map(|v| u64::from(v.to_bits()))
                    .collect();
                let bits: Vec<u64> = bits.iter().map(|b| b.as_u64().unwrap()).collect();
                assert_eq!(got, bits, "{name}");
                assert_eq!(view.n_elements() as usize, got.len());
            }
            None => {
                // Integer tensors are listed but refused by name when asked for.
                let err = f.tensor(name).unwrap_err();
                let msg = err.to_string();
                assert!(
                    msg.contains(name) && msg.contains("I64") && msg.contains("supported"),
                    "{msg}"
                );
            }
        }
    }
}

fn f16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|&v| f32_to_f16(v).to_le_bytes())
        .collect()
}

#[test]
fn writer_round_trips_every_supported_dtype() {
    let x = [1.0f32, -2.5, 3.25, 0.0, -0.0, 1e-3];
    let f32_bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16 = f16_bytes(&x);
    let bf16: Vec<u8> = x
        .iter()
        .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
        .collect();
    let ids: Vec<u8> = (0..3i64).flat_map(|v| v.to_le_bytes()).collect();
    let mut w = SafetensorsWriter::new();
    w.set_metadata("format", "pt");
    w.add_tensor("x.f32", Dtype::F32, &[2, 3], &f32_bytes)
        .unwrap();
    w.add_tensor("x.f16", Dtype::F16, &[6], &f16).unwrap();
    w.add_tensor("x.bf16", Dtype::BF16, &[3, 2], &bf16).unwrap();
    w.add_tensor("ids", Dtype::I64, &[3], &ids).unwrap();
    w.add_tensor("empty", Dtype::F32, &[0, 4], &[]).unwrap();
    let bytes = w.to_bytes();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    assert_eq!(header_len % 8, 0, "data must start 8-aligned");

    let f = SafetensorsFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.metadata()["format"], "pt");
    let get = |name: &str| f.tensor(name).unwrap().to_f32();
    assert!(get("x.f32")
        .iter()
        .zip(&x)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
    let bits = |v: Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let via = |to: fn(f32) -> u16, from: fn(u16) -> f32| x.map(|v| from(to(v)).to_bits());
    assert_eq!(bits(get("x.f16")), via(f32_to_f16, f16_to_f32));
    assert_eq!(bits(get("x.bf16")), via(f32_to_bf16, bf16_to_f32));
    assert_eq!(get("x.f16")[5], 0.0010004044); // 1e-3 rounded to f16
    assert_eq!(f.tensor("x.bf16").unwrap().shape, [3, 2]);
    assert!(get("empty").is_empty());
    assert!(f.tensor("ids").is_err());

    let path = temp_dir("st-writer").join("model.safetensors");
    w.write(&path).unwrap();
    assert!(std::fs::read(&path).unwrap() == bytes);
}

#[test]
fn writer_refuses_bad_tensors() {
    let mut w = SafetensorsWriter::new();
    w.add_tensor("a", Dtype::F32, &[1], &[0; 4]).unwrap();
    let err = w.add_tensor("a", Dtype::F32, &[1], &[0; 4]).unwrap_err();
    assert!(matches!(err.kind(), ModelError::Duplicate { .. }), "{err}");
    let err = w
        .add_tensor("__metadata__", Dtype::F32, &[1], &[0; 4])
        .unwrap_err();
    assert!(matches!(err.kind(), ModelError::Duplicate { .. }), "{err}");
    let err = w.add_tensor("b", Dtype::F16, &[3], &[0; 4]).unwrap_err();
    assert!(
        matches!(err.kind(), ModelError::SizeMismatch { .. })
            && err.to_string().contains("tensor b"),
        "{err}"
    );
}

/// A file with the given header text and `data_len` data bytes.
fn with_header(header: &str, data_len: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data_len));
    b
}

#[test]
fn malformed_files_are_refused_by_name() {
    let t = |dtype: &str, shape: &str, a: u64, b: u64| {
        format!(r#""{dtype}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{a},{b}]}}"#)
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![1, 2, 3], "header length at offset 0 needs 8 bytes"),
        (
            (200u64 << 20).to_le_bytes().to_vec(),
            "header length 209715200 is absurd",
        ),
        (
            with_header("{}", 0)[..9].to_vec(),
            "header at offset 8 needs 2 bytes but only 1 remain",
        ),
        (with_header("[1,2]", 0), "bad header"),
        (with_header("{} x", 0), "trailing characters"),
        (
            with_header("{\"a\":{\"dtype\":\"F32\"}}", 0),
            "bad header: a: missing field `shape`",
        ),
        (
            with_header(
                &format!("{{{}}}", t("F32", "[2]", 0, 8)).replace("}}", ",\"extra\":1}}"),
                8,
            ),
            "unknown field",
        ),
        (
            with_header(&format!("{{{}}}", t("F4", "[2]", 0, 1)), 1),
            "tensor F4: safetensors dtype \"F4\" is not supported",
        ),
        (
            with_header(&format!("{{{}}}", t("F32", "[3]", 0, 8)), 8),
            "tensor F32: F32 data of shape [3]: 8 bytes, but 12 expected",
        ),
        (
            with_header(&format!("{{{}}}", t("F32", "[4]", 0, 16)), 8),
            "tensor F32: data [0, 16) runs past the end",
        ),
        (
            with_header(&format!("{{{}}}", t("F32", "[2]", 8, 0)), 8),
            "runs past",
        ),
        (
            with_header(
                &format!(
                    "{{{}}}",
                    t("F32", "[4294967296,4294967296,4294967296]", 0, 8)
                ),
                8,
            ),
            "byte size overflows",
        ),
        (
            with_header(
                &format!("{{{},{}}}", t("F32", "[2]", 0, 8), t("F16", "[4]", 4, 12)),
                12,
            ),
            "tensor F16: data [4, 12) overlaps tensor F32",
        ),
        (
            with_header(
                &format!("{{{},{}}}", t("F32", "[2]", 0, 8), t("F32", "[2]", 0, 8)),
                8,
            ),
            "duplicate tensor \"F32\"",
        ),
    ];
    for (bytes, needle) in cases {
        let err = SafetensorsFile::from_bytes(bytes).unwrap_err();
        assert!(
            err.to_string().contains(needle),
            "expected {needle:?} in {err}"
        );
    }
    // Control: the same builder makes a valid file.
    assert!(
        SafetensorsFile::from_bytes(with_header(&format!("{{{}}}", t("F32", "[2]", 0, 8)), 8))
            .is_ok()
    );
}

#[test]
fn mutated_headers_never_panic() {
    let base = std::fs::read(fixture("small.safetensors")).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(77);
    let mut parsed = 0;
    for _ in 0..20_000 {
        let mut b = base.clone();
        for _ in 0..rng.gen_range(1..=3) {
            let at = rng.gen_range(0..b.len());
            match rng.gen_range(0..3) {
                0 => b[at] = rng.gen(),
                1 => b[at] = b"0123456789{}[],:\"F"[rng.gen_range(0..18)],
                _ => b.truncate(at.max(1)),
            }
        }
        if let Ok(f) = SafetensorsFile::from_bytes(b) {
            parsed += 1;
            for info in f.tensor_infos() {
                if let Ok(view) = f.tensor(&info.name) {
                    assert_eq!(view.to_f32().len() as u64, view.n_elements());
                }
            }
        }
    }
    assert!(parsed > 0 && parsed < 20_000, "{parsed}");
}

const CONFIG: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":8,"intermediate_size":16,
  "num_hidden_layers":1,"num_attention_heads":2,"vocab_size":4}"#;

fn write_shard(dir: &Path, file: &str, names: &[&str]) {
    let data = [0u8; 16];
    let mut w = SafetensorsWriter::new();
    for name in names {
        w.add_tensor(name, Dtype::F32, &[4], &data).unwrap();
    }
    w.write(dir.join(file)).unwrap();
}

fn write_index(dir: &Path, map: &[(&str, &str)]) {
    let weight_map: serde_json::Map<String, Value> = map
        .iter()
        .map(|(n, f)| (n.to_string(), Value::String(f.to_string())))
        .collect();
    let index = serde_json::json!({ "metadata": { "total_size": 64 }, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn sharded_checkpoints_resolve_every_tensor() {
    let dir = temp_dir("sharded");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    write_shard(&dir, "model-00001-of-00002.safetensors", &["a", "b"]);
    write_shard(&dir, "model-00002-of-00002.safetensors", &["c"]);
    write_index(
        &dir,
        &[
            ("a", "model-00001-of-00002.safetensors"),
            ("b", "model-00001-of-00002.safetensors"),
            ("c", "model-00002-of-00002.safetensors"),
        ],
    );
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    assert_eq!(ckpt.config().architecture(), Some("LlamaForCausalLM"));
    assert_eq!(ckpt.tensor_infos().count(), 3);
    for name in ["a", "b", "c"] {
        assert_eq!(ckpt.tensor(name).unwrap().to_f32(), [0.0; 4]);
    }
    let err = ckpt.tensor("d").unwrap_err();
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err}");
}

#[test]
fn inconsistent_shards_are_refused() {
    let dir = temp_dir("sharded-bad");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    write_shard(&dir, "s1.safetensors", &["a", "b"]);
    write_shard(&dir, "s2.safetensors", &["b"]);

    write_index(&dir, &[("a", "s1.safetensors"), ("b", "s2.safetensors")]);
    let err = HfCheckpoint::open(&dir).unwrap_err();
    assert!(
        err.to_string()
            .contains("duplicate tensor (in two shards) \"b\""),
        "{err}"
    );

    write_index(&dir, &[("a", "s1.safetensors"), ("z", "s1.safetensors")]);
    let err = HfCheckpoint::open(&dir).unwrap_err();
    assert!(
        err.to_string()
            .contains("s1.safetensors: tensor z not found"),
        "{err}"
    );

    write_index(&dir, &[("a", "../s1.safetensors")]);
    let err = HfCheckpoint::open(&dir).unwrap_err();
    assert!(err.to_string().contains("not a plain file name"), "{err}");

    write_index(&dir, &[("a", "missing.safetensors")]);
    let err = HfCheckpoint::open(&dir).unwrap_err();
    assert!(
        matches!(err, ModelError::Io { .. }) && err.to_string().contains("missing.safetensors"),
        "{err}"
    );
}

#[test]
fn single_file_checkpoints_need_config_and_weights() {
    let dir = temp_dir("single");
    let err = HfCheckpoint::open(&dir).unwrap_err();
    assert!(err.to_string().contains("config.json"), "{err}");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let err = HfCheckpoint::open(&dir).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    write_shard(&dir, "model.safetensors", &["w"]);
    let ckpt = HfCheckpoint::open(&dir).unwrap();
    assert_eq!(ckpt.info("w").unwrap().shape, [4]);
}
