//! The streaming GGUF writer: the same bytes as the in-memory writer, and refusals of data
//! that does not match the declared tensors.

mod common;

use common::temp_dir;
use quench_models::gguf::{GgufFileWriter, GgufHeader, GgufWriter, MetadataValue};
use quench_models::{GgmlType, GgufFile, ModelError};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Tensor {
    name: &'static str,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    bytes: Vec<u8>,
}

fn tensors(rng: &mut ChaCha8Rng) -> Vec<Tensor> {
    let mut random = |n: usize| (0..n).map(|_| rng.gen()).collect::<Vec<u8>>();
    vec![
        Tensor {
            name: "a",
            dims: vec![64, 3],
            ggml_type: GgmlType::Q8_0,
            bytes: random(2 * 3 * 34),
        },
        Tensor {
            name: "b",
            dims: vec![5],
            ggml_type: GgmlType::F32,
            bytes: random(20),
        },
        Tensor {
            name: "c",
            dims: vec![256, 2],
            ggml_type: GgmlType::Q4_K,
            bytes: random(2 * 144),
        },
    ]
}

fn header(tensors: &[Tensor]) -> GgufHeader {
    let mut h = GgufHeader::new();
    h.add_metadata(
        "general.architecture",
        MetadataValue::String("llama".into()),
    )
    .unwrap();
    h.add_metadata("general.alignment", MetadataValue::U32(64))
        .unwrap();
    for t in tensors {
        let size = h.add_tensor(t.name, &t.dims, t.ggml_type).unwrap();
        assert_eq!(size, t.bytes.len() as u64);
    }
    h
}

#[test]
fn streamed_files_match_the_in_memory_writer() {
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let tensors = tensors(&mut rng);
    let mut w = GgufWriter::new();
    w.add_metadata(
        "general.architecture",
        MetadataValue::String("llama".into()),
    )
    .unwrap();
    w.add_metadata("general.alignment", MetadataValue::U32(64))
        .unwrap();
    for t in &tensors {
        w.add_tensor(t.name, &t.dims, t.ggml_type, &t.bytes)
            .unwrap();
    }
    let dir = temp_dir("stream");
    let path = dir.join("s.gguf");
    let mut s = GgufFileWriter::create(&path, header(&tensors)).unwrap();
    for t in &tensors {
        s.write_tensor(&t.bytes).unwrap();
    }
    s.finish().unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), w.to_bytes());
    let file = GgufFile::open(&path).unwrap();
    for t in &tensors {
        assert_eq!(file.tensor(t.name).unwrap().bytes, &t.bytes[..]);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn data_that_does_not_match_the_header_is_refused() {
    let mut rng = ChaCha8Rng::seed_from_u64(rand::random());
    let tensors = tensors(&mut rng);
    let dir = temp_dir("stream-bad");
    let path = dir.join("s.gguf");

    let mut s = GgufFileWriter::create(&path, header(&tensors)).unwrap();
    let err = s.write_tensor(&tensors[0].bytes[1..]).unwrap_err();
    assert!(
        matches!(err.kind(), ModelError::SizeMismatch { .. })
            && err.to_string().contains("tensor a"),
        "{err}"
    );
    s.write_tensor(&tensors[0].bytes).unwrap();
    let err = s.finish().unwrap_err();
    assert!(
        matches!(err.kind(), ModelError::MissingTensor { name } if name == "b"),
        "{err}"
    );

    let mut s = GgufFileWriter::create(&path, header(&tensors[..1])).unwrap();
    s.write_tensor(&tensors[0].bytes).unwrap();
    let err = s.write_tensor(&tensors[1].bytes).unwrap_err();
    assert!(err.to_string().contains("tensors written 2"), "{err}");

    let mut h = header(&tensors);
    let err = h.add_tensor("a", &[32], GgmlType::Q8_0).unwrap_err();
    assert!(matches!(err.kind(), ModelError::Duplicate { .. }), "{err}");
    let err = h.add_tensor("d", &[33], GgmlType::Q8_0).unwrap_err();
    assert!(matches!(err.kind(), ModelError::BadShape { .. }), "{err}");
    assert_eq!(h.tensor_count(), 3);
    std::fs::remove_dir_all(&dir).unwrap();
}
