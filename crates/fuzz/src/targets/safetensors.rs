//! Safetensors: the header (length, JSON, offsets), then every tensor viewed and converted.

use quench_models::safetensors::{Dtype, SafetensorsFile, SafetensorsWriter};

use super::synth::checkpoints;
use crate::Target;

pub fn target() -> Target {
    Target {
        name: "safetensors",
        about: "safetensors header (SafetensorsFile::from_bytes), then every tensor viewed and converted to f32",
        seeds,
        dict: &[
            b"\"dtype\"",
            b"\"shape\"",
            b"\"data_offsets\"",
            b"\"__metadata__\"",
            b"\"F32\"",
            b"\"BF16\"",
            b"\"I64\"",
            b"[0,0]",
            b"[18446744073709551615,18446744073709551615]",
            b"[4294967296,4294967296,4294967296]",
        ],
        format: crate::Format::Binary,
        run,
    }
}

fn writer_file() -> Vec<u8> {
    let data: Vec<u8> = (0..=255u8).cycle().take(512).collect();
    let mut w = SafetensorsWriter::new();
    w.set_metadata("format", "pt");
    let tensors: [(&str, Dtype, &[u64], usize); 6] = [
        ("a.weight", Dtype::F32, &[2, 3], 24),
        ("b", Dtype::BF16, &[4], 8),
        ("c", Dtype::F16, &[2, 2], 8),
        ("ids", Dtype::I64, &[3], 24),
        ("scalar", Dtype::F32, &[], 4),
        ("empty", Dtype::F32, &[0, 5], 0),
    ];
    let mut offset = 0;
    for (name, dtype, shape, len) in tensors {
        w.add_tensor(name, dtype, shape, &data[offset..offset + len])
            .expect("valid tensor");
        offset += len;
    }
    w.to_bytes()
}

fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = vec![writer_file()];
    // Written by the Python `safetensors` package.
    seeds.push(include_bytes!("../../../models/tests/fixtures/small.safetensors").to_vec());
    for c in checkpoints() {
        seeds.extend(c.safetensors.iter().cloned());
    }
    seeds
}

fn run(bytes: &[u8]) -> Result<(), String> {
    let file = SafetensorsFile::from_bytes(bytes.to_vec()).map_err(|e| e.to_string())?;
    let _ = file.metadata();
    for info in file.tensor_infos() {
        if let Ok(view) = file.tensor(&info.name) {
            let _ = view.n_elements();
            let _ = view.to_f32();
        }
    }
    Ok(())
}
