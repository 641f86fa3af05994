//! Hugging Face checkpoints converted to GGUF: tensor names, types and fallbacks, every
//! weight within its format's error bound of the checkpoint (in llama.cpp's row order), the
//! architecture's metadata, and refusals. The bound check is shown to catch wrong
//! quantizers.

mod common;
mod convert;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::temp_dir;
use convert::{write_checkpoint, Shape, Weights};
use quench_models::dequant::{dequantize, f16_to_f32, f32_to_f16, unpack_k_scales, IQ4_LEVELS};
use quench_models::hf_to_gguf::{convert, ConvertError, ConvertOptions, Progress, TargetType};
use quench_models::safetensors::Dtype;
use quench_models::{GgmlType, GgufFile};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn rng() -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(rand::random())
}

/// Converts `dir` to `dir/out.gguf`; returns the path and the notes.
fn run(dir: &Path, target: TargetType) -> Result<(PathBuf, Vec<String>), ConvertError> {
    let out = dir.join("out.gguf");
    let mut notes = Vec::new();
    let options = ConvertOptions { target, threads: 3 };
    convert(dir, &out, &options, &mut |p| {
        if let Progress::Note(n) = p {
            notes.push(n.to_owned());
        }
    })?;
    Ok((out, notes))
}

/// The GGUF name of a checkpoint tensor, as llama.cpp names it.
fn gguf_name(hf: &str) -> String {
    let top = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = top.iter().find(|(h, _)| *h == hf) {
        return (*g).to_owned();
    }
    let layer = [
        ("input_layernorm", "attn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
    ];
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (n, rest) = rest.split_once('.').unwrap();
    let (module, kind) = rest.rsplit_once('.').unwrap();
    let (_, g) = layer.iter().find(|(h, _)| *h == module).unwrap();
    format!("blk.{n}.{g}.{kind}")
}

/// Whether llama.cpp's Q4_K_M gives layer `l` of `n` more bits (its `use_more_bits`): the
/// first and last eighth of the layers, and every third layer between.
fn more_bits(l: usize, n: usize) -> bool {
    l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2
}

/// The type a tensor is meant for before fallbacks: vectors F32; with one type, embedding
/// and LM head Q8_0 and other matrices the target; in llama.cpp's mixes (Q4_K_M, Q5_K_M,
/// Q6_K, Q3_K_M, Q2_K, IQ4_XS) the LM head and a tied embedding Q6_K, an untied embedding the mix's
/// type, and:
/// - Q4_K_M, Q5_K_M: the v and down matrices of the layers [`more_bits`] names Q6_K;
/// - Q3_K_M: v Q5_K in layers 0 and 1 and Q4_K after, down Q5_K in the first sixteenth of
///   the layers and Q4_K after, the attention output Q4_K;
/// - Q2_K: v Q4_K with 4 or more query heads a key/value head and Q3_K otherwise, down
///   and the attention output Q3_K;
/// - IQ4_XS: v Q5_K with 4 or more query heads a key/value head, down Q5_K in the first
///   eighth of the layers.
fn intended_type(hf: &str, dims: &[usize], target: TargetType, shape: &Shape) -> GgmlType {
    use GgmlType::*;
    let mix = !matches!(
        target,
        TargetType::Q8_0 | TargetType::Q4_0 | TargetType::Q4_K
    );
    let layer = hf
        .strip_prefix("model.layers.")
        .and_then(|r| r.split_once('.'))
        .and_then(|(n, _)| n.parse::<usize>().ok());
    let (v, down, o) = (
        hf.contains("v_proj"),
        hf.contains("down_proj"),
        hf.contains("o_proj"),
    );
    let l = layer.unwrap_or(0);
    match hf {
        _ if dims.len() == 1 => F32,
        "model.embed_tokens.weight" | "lm_head.weight" if !mix => Q8_0,
        "lm_head.weight" => Q6_K,
        "model.embed_tokens.weight" if shape.tied => Q6_K,
        "model.embed_tokens.weight" => target.ggml_type(),
        _ => match target {
            TargetType::Q4_K_M | TargetType::Q5_K_M
                if (v || down) && more_bits(l, shape.layers) =>
            {
                Q6_K
            }
            TargetType::Q3_K_M if v => [Q4_K, Q5_K][usize::from(l < 2)],
            TargetType::Q3_K_M if down => [Q4_K, Q5_K][usize::from(l < shape.layers / 16)],
            TargetType::Q3_K_M if o => Q4_K,
            TargetType::Q2_K if v => [Q3_K, Q4_K][usize::from(shape.heads >= 4 * shape.kv_heads)],
            TargetType::Q2_K if down || o => Q3_K,
            TargetType::IQ4_XS if v && shape.heads >= 4 * shape.kv_heads => Q5_K,
            TargetType::IQ4_XS if down && l < shape.layers / 8 => Q5_K,
            _ => target.ggml_type(),
        },
    }
}

/// The tensors fallback notes name: `NAME: …`, `blk.N.{a, b}.weight for N in 0–3, 5: …`.
fn named_in_notes(notes: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for note in notes {
        let Some((names, _)) = note.split_once(": rows of ") else {
            continue;
        };
        let (pattern, layers) = match names.split_once(" for N in ") {
            Some((p, runs)) => {
                let mut layers = Vec::new();
                for run in runs.split(", ") {
                    let (a, b) = run.split_once('–').unwrap_or((run, run));
                    layers.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap());
                }
                (p, layers)
            }
            None => (names, Vec::new()),
        };
        let expanded: Vec<String> = match pattern.split_once('{') {
            Some((before, rest)) => {
                let (alternatives, after) = rest.split_once('}').unwrap();
                alternatives
                    .split(", ")
                    .map(|a| format!("{before}{a}{after}"))
                    .collect()
            }
            None => vec![pattern.to_owned()],
        };
        for name in expanded {
            if layers.is_empty() {
                out.insert(name);
            } else {
                for n in &layers {
                    out.insert(name.replacen("blk.N.", &format!("blk.{n}."), 1));
                }
            }
        }
    }
    out
}

/// The policy, stated independently: [`intended_type`], then rows that are not whole
/// blocks Q8_0, then F16.
fn expected_type(hf: &str, dims: &[usize], target: TargetType, shape: &Shape) -> GgmlType {
    let wanted = intended_type(hf, dims, target, shape);
    if wanted == GgmlType::F32 {
        return wanted;
    }
    let cols = dims[1] as u64;
    [wanted, GgmlType::Q8_0, GgmlType::F16]
        .into_iter()
        .find(|t| cols.is_multiple_of(t.block_size()))
        .unwrap()
}

/// The checkpoint values in llama.cpp's order: llama's q and k rows (or bias entries) with
/// each head's halves interleaved.
fn in_gguf_order(shape: &Shape, hf: &str, dims: &[usize], values: &[f32]) -> Vec<f32> {
    let heads = if hf.contains("q_proj") {
        shape.heads
    } else if hf.contains("k_proj") {
        shape.kv_heads
    } else {
        return values.to_vec();
    };
    if shape.arch != "llama" {
        return values.to_vec();
    }
    let cols = if dims.len() == 2 { dims[1] } else { 1 };
    let d = shape.head_dim;
    assert_eq!(heads * d, dims[0]);
    let mut out = Vec::with_capacity(values.len());
    for h in 0..heads {
        for i in 0..d / 2 {
            for half in [0, d / 2] {
                let r = h * d + half + i;
                out.extend_from_slice(&values[r * cols..(r + 1) * cols]);
            }
        }
    }
    out
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn rel_rms(x: &[f32], y: &[f32]) -> f64 {
    let err: f64 = x.iter().zip(y).map(|(a, b)| f64::from(a - b).powi(2)).sum();
    let norm: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
    (err / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// Relative RMS error each type stays under on these weights (measured: Q8_0 0.0049–0.0050,
/// Q4_0 0.079–0.081, Q4_K 0.069–0.071; a wrong layout gives about 1.4).
fn rms_bound(t: GgmlType) -> f64 {
    match t {
        GgmlType::Q8_0 => 0.0065,
        GgmlType::Q4_0 => 0.095,
        GgmlType::Q4_K => 0.085,
        GgmlType::Q5_K => 0.045,
        GgmlType::Q6_K => 0.025,
        GgmlType::Q3_K => 0.17,
        GgmlType::Q2_K => 0.32,
        GgmlType::IQ4_XS => 0.09,
        _ => 1e-3,
    }
}

/// Checks the stored `bytes` of `ggml_type` against the original values `x`, element by
/// element against the bound the format's rounding allows given its stored scales, and
/// overall against [`rms_bound`].
fn check_bound(ggml_type: GgmlType, x: &[f32], bytes: &[u8]) -> Result<(), String> {
    let y = dequantize(ggml_type, bytes, x.len()).map_err(|e| e.to_string())?;
    let fail = |at: usize, limit: f32| {
        Err(format!(
            "{ggml_type} element {at}: {} stored as {}, more than {limit} off",
            x[at], y[at]
        ))
    };
    match ggml_type {
        GgmlType::F32 => {
            if let Some(i) = (0..x.len()).find(|&i| x[i].to_bits() != y[i].to_bits()) {
                return fail(i, 0.0);
            }
        }
        // Rounding to the nearest f16: half an ulp (2⁻¹¹ relative), or half the subnormal
        // step 2⁻²⁴.
        GgmlType::F16 => {
            for i in 0..x.len() {
                let limit = (x[i].abs() / 2048.0).max(1.0 / 33_554_432.0);
                if (x[i] - y[i]).abs() > limit {
                    return fail(i, limit);
                }
            }
        }
        // q = round(x/d) against the f32 scale d; the stored f16 scale is within 2⁻¹¹ of it
        // and |q| ≤ 127: at most d/2 + 127·2⁻¹¹·d.
        GgmlType::Q8_0 => {
            for (b, raw) in bytes.chunks(34).enumerate() {
                let limit = 0.5625 * f16_at(raw, 0).abs() * 1.001;
                for at in 32 * b..32 * (b + 1) {
                    if (x[at] - y[at]).abs() > limit {
                        return fail(at, limit);
                    }
                }
            }
        }
        // q = trunc(x/d + 8.5) clamped to 15: half a step, except that the element at 8·d
        // (opposite the block's largest) is clamped to 7·d, a whole step; |q − 8| ≤ 8.
        GgmlType::Q4_0 => {
            for (b, raw) in bytes.chunks(18).enumerate() {
                let d = f16_at(raw, 0);
                for i in 0..32 {
                    let at = b * 32 + i;
                    let clamped = d != 0.0 && x[at] / d > 7.49;
                    let limit = d.abs() * if clamped { 1.01 } else { 0.5 + 8.0 / 2048.0 } * 1.001;
                    if (x[at] - y[at]).abs() > limit {
                        return fail(at, limit);
                    }
                }
            }
        }
        // Each element on the grid point of its sub-block's stored map nearest to it.
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (size, levels) = match ggml_type {
                GgmlType::Q4_K => (144, 16u8),
                _ => (176, 32),
            };
            for (b, raw) in bytes.chunks(size).enumerate() {
                let (d, dmin) = (f16_at(raw, 0), f16_at(raw, 2));
                let (scales, mins) = unpack_k_scales(raw[4..16].try_into().unwrap());
                for i in 0..256 {
                    let at = b * 256 + i;
                    let (s, m) = (
                        d * f32::from(scales[i / 32]),
                        dmin * f32::from(mins[i / 32]),
                    );
                    let nearest = (0..levels)
                        .map(|q| (s * f32::from(q) - m - x[at]).abs())
                        .fold(f32::INFINITY, f32::min);
                    if (x[at] - y[at]).abs() > nearest * 1.000_01 + 1e-9 {
                        return fail(at, nearest);
                    }
                }
            }
        }
        // Each element on the grid point of its group's stored scale (and Q2_K's minimum)
        // nearest to it.
        GgmlType::Q3_K | GgmlType::Q2_K => {
            let size = ggml_type.type_size() as usize;
            for (b, raw) in bytes.chunks(size).enumerate() {
                for i in 0..256 {
                    let at = b * 256 + i;
                    let g = i / 16;
                    let points: Vec<f32> = if ggml_type == GgmlType::Q3_K {
                        let low = (raw[96 + g % 8] >> (4 * (g / 8))) & 0x0f;
                        let high = (raw[104 + g % 4] >> (2 * (g / 4))) & 3;
                        let s = f16_at(raw, 108) * f32::from((low | (high << 4)) as i8 - 32);
                        (-4..4).map(|q| s * q as f32).collect()
                    } else {
                        let s = f16_at(raw, 80) * f32::from(raw[g] & 0x0f);
                        let m = f16_at(raw, 82) * f32::from(raw[g] >> 4);
                        (0..4).map(|q| s * q as f32 - m).collect()
                    };
                    let nearest = points
                        .iter()
                        .map(|p| (p - x[at]).abs())
                        .fold(f32::INFINITY, f32::min);
                    if (x[at] - y[at]).abs() > nearest * 1.000_01 + 1e-9 {
                        return fail(at, nearest);
                    }
                }
            }
        }
        // Each element on the level of its sub-block's stored scale nearest to it.
        GgmlType::IQ4_XS => {
            for (b, raw) in bytes.chunks(136).enumerate() {
                let high = u16::from_le_bytes([raw[2], raw[3]]);
                for i in 0..256 {
                    let (at, s) = (b * 256 + i, i / 32);
                    let low = (raw[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
                    let scale = (low | (((high >> (2 * s)) & 3) as u8) << 4) as i32 - 32;
                    let step = f16_at(raw, 0) * scale as f32;
                    let nearest = IQ4_LEVELS
                        .iter()
                        .map(|&l| (step * f32::from(l) - x[at]).abs())
                        .fold(f32::INFINITY, f32::min);
                    if (x[at] - y[at]).abs() > nearest * 1.000_01 + 1e-9 {
                        return fail(at, nearest);
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (b, raw) in bytes.chunks(210).enumerate() {
                let d = f16_at(raw, 208);
                for i in 0..256 {
                    let at = b * 256 + i;
                    let s = d * f32::from(raw[192 + i / 16] as i8);
                    let nearest = (-32..32)
                        .map(|q| (s * q as f32 - x[at]).abs())
                        .fold(f32::INFINITY, f32::min);
                    if (x[at] - y[at]).abs() > nearest * 1.000_01 + 1e-9 {
                        return fail(at, nearest);
                    }
                }
            }
        }
        other => return Err(format!("no bound for {other}")),
    }
    let rel = rel_rms(x, &y);
    if rel > rms_bound(ggml_type) {
        return Err(format!("{ggml_type}: relative RMS error {rel:.4}"));
    }
    Ok(())
}

/// Converts a checkpoint of `shape` to each type and checks every tensor of the output.
fn check_conversion(shape: &Shape, dtype: Dtype) {
    let mut rng = rng();
    for target in TargetType::ALL {
        let dir = temp_dir(&format!("convert-{}-{}", shape.arch, target.name()));
        let weights = write_checkpoint(&dir, shape, dtype, 1, &mut rng);
        let (out, notes) = run(&dir, target).unwrap();
        let file = GgufFile::open(&out).unwrap();
        let mut names: Vec<String> = weights.keys().map(|n| gguf_name(n)).collect();
        let mut got: Vec<String> = file.tensor_infos().iter().map(|t| t.name.clone()).collect();
        names.sort();
        got.sort();
        assert_eq!(got, names, "{} {}", shape.arch, target.name());
        let mut fell_back = BTreeSet::new();
        for (hf, (dims, values)) in &weights {
            let name = gguf_name(hf);
            let view = file.tensor(&name).unwrap();
            let want_dims: Vec<u64> = dims.iter().rev().map(|&d| d as u64).collect();
            assert_eq!(view.dims, &want_dims[..], "{name}");
            let want = expected_type(hf, dims, target, shape);
            assert_eq!(
                view.ggml_type,
                want,
                "{name} ({} {})",
                shape.arch,
                target.name()
            );
            if want != intended_type(hf, dims, target, shape) {
                fell_back.insert(name.clone());
            }
            let x = in_gguf_order(shape, hf, dims, values);
            check_bound(view.ggml_type, &x, view.bytes)
                .unwrap_or_else(|e| panic!("{name} ({} {}): {e}", shape.arch, target.name()));
        }
        assert_eq!(named_in_notes(&notes), fell_back, "{notes:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn every_tensor_is_named_typed_and_within_its_bound() {
    for arch in ["llama", "qwen2", "qwen3"] {
        check_conversion(&Shape::wide(arch), Dtype::BF16);
    }
}

#[test]
fn narrow_rows_fall_back_to_q8_0_then_f16() {
    check_conversion(&Shape::narrow("llama"), Dtype::F32);
    let dir = temp_dir("narrow-notes");
    write_checkpoint(&dir, &Shape::narrow("qwen3"), Dtype::F16, 1, &mut rng());
    let (out, notes) = run(&dir, TargetType::Q4_K).unwrap();
    let file = GgufFile::open(&out).unwrap();
    assert_eq!(
        file.tensor("blk.0.attn_q.weight").unwrap().ggml_type,
        GgmlType::Q8_0
    );
    assert_eq!(
        file.tensor("blk.0.ffn_down.weight").unwrap().ggml_type,
        GgmlType::F16
    );
    // One note per kind, each naming its tensors.
    assert_eq!(
        notes,
        [
            "blk.0.{attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up}.weight: rows of 64 \
             elements are not whole Q4_K blocks of 256; stored as Q8_0",
            "blk.0.ffn_down.weight: rows of 80 elements are not whole Q4_K blocks of 256; \
             stored as F16",
        ]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// ggml's Q8_0 with truncation instead of rounding.
fn truncating_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks(32) {
        let d = block.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
        out.extend(f32_to_f16(d).to_le_bytes());
        out.extend(block.iter().map(|v| {
            if d == 0.0 {
                0
            } else {
                (v / d).trunc() as i8 as u8
            }
        }));
    }
    out
}

/// ggml's Q4_0 without the half that makes its truncation round.
fn truncating_q4_0(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for block in x.chunks(32) {
        let max = block
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        out.extend(f32_to_f16(d).to_le_bytes());
        let q = |v: f32| {
            if d == 0.0 {
                0
            } else {
                ((v / d + 8.0).trunc() as u8).min(15)
            }
        };
        out.extend((0..16).map(|j| q(block[j]) | (q(block[j + 16]) << 4)));
    }
    out
}

#[test]
fn the_bound_check_catches_wrong_quantizers() {
    let mut rng = rng();
    let shape = Shape::wide("llama");
    let dir = temp_dir("controls");
    let weights: Weights = write_checkpoint(&dir, &shape, Dtype::F32, 1, &mut rng);
    let (hf_q, (dims, values)) = weights
        .iter()
        .find(|(n, _)| n.ends_with("layers.0.self_attn.q_proj.weight"))
        .unwrap();
    let x = in_gguf_order(&shape, hf_q, dims, values);
    let quant = |t| quench_models::quant::quantize(t, &x).unwrap();

    for t in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K] {
        check_bound(t, &x, &quant(t)).unwrap();
    }
    assert!(check_bound(GgmlType::Q8_0, &x, &truncating_q8_0(&x)).is_err());
    assert!(check_bound(GgmlType::Q4_0, &x, &truncating_q4_0(&x)).is_err());
    // Q4_K with the two sub-blocks that share each byte swapped.
    let mut swapped = quant(GgmlType::Q4_K);
    for block in swapped.chunks_mut(144) {
        block[16..].iter_mut().for_each(|b| *b = b.rotate_left(4));
    }
    assert!(check_bound(GgmlType::Q4_K, &x, &swapped).is_err());
    // Right quantizer, rows in Hugging Face's order where llama.cpp's is expected.
    let unpermuted = quench_models::quant::quantize(GgmlType::Q8_0, values).unwrap();
    assert!(check_bound(GgmlType::Q8_0, &x, &unpermuted).is_err());
    // And the converter's own output passes where the rows are interleaved.
    let (out, _) = run(&dir, TargetType::Q8_0).unwrap();
    let file = GgufFile::open(&out).unwrap();
    let view = file.tensor("blk.0.attn_q.weight").unwrap();
    check_bound(GgmlType::Q8_0, &x, view.bytes).unwrap();
    assert!(check_bound(GgmlType::Q8_0, values, view.bytes).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn u32_key(file: &GgufFile, key: &str) -> u32 {
    file.get_u32(key).unwrap_or_else(|e| panic!("{key}: {e}"))
}

#[test]
fn metadata_describes_the_model() {
    let mut rng = rng();
    for (arch, target, file_type) in [
        ("llama", TargetType::Q4_0, 2),
        ("qwen2", TargetType::Q8_0, 7),
        ("qwen3", TargetType::Q4_K, 14),
    ] {
        let shape = Shape::narrow(arch);
        let dir = temp_dir(&format!("meta-{arch}"));
        write_checkpoint(&dir, &shape, Dtype::BF16, 1, &mut rng);
        let (out, _) = run(&dir, target).unwrap();
        let file = GgufFile::open(&out).unwrap();
        assert_eq!(file.version(), 3);
        assert_eq!(file.get_str("general.architecture").unwrap(), arch);
        assert_eq!(u32_key(&file, "general.file_type"), file_type);
        assert_eq!(u32_key(&file, "general.quantization_version"), 2);
        let key = |k: &str| format!("{arch}.{k}");
        for (k, v) in [
            ("context_length", 512),
            ("embedding_length", shape.hidden),
            ("block_count", shape.layers),
            ("feed_forward_length", shape.ffn),
            ("attention.head_count", shape.heads),
            ("attention.head_count_kv", shape.kv_heads),
            ("attention.key_length", shape.head_dim),
            ("attention.value_length", shape.head_dim),
            ("rope.dimension_count", shape.head_dim),
            ("vocab_size", shape.vocab),
        ] {
            assert_eq!(u32_key(&file, &key(k)) as usize, v, "{}", key(k));
        }
        assert_eq!(file.get_f32(&key("rope.freq_base")).unwrap(), 10000.0);
        assert_eq!(
            file.get_f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap(),
            1e-5
        );
        assert!(
            file.tensor("rope_freqs.weight").is_err(),
            "no scaling, no factors"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn llama3_rope_scaling_becomes_per_frequency_divisors() {
    let shape = Shape::narrow("llama");
    let dir = temp_dir("rope-freqs");
    write_checkpoint(&dir, &shape, Dtype::BF16, 1, &mut rng());
    let mut config = convert::read_json(&dir.join("config.json"));
    config["rope_theta"] = 500000.0.into();
    config["rope_scaling"] = serde_json::json!({
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64
    });
    convert::write_json(&dir.join("config.json"), &config);
    let (out, _) = run(&dir, TargetType::Q8_0).unwrap();
    let file = GgufFile::open(&out).unwrap();
    let view = file.tensor("rope_freqs.weight").unwrap();
    assert_eq!((view.ggml_type, view.dims), (GgmlType::F32, &[8u64][..]));
    let factors = view.to_f32().unwrap();
    // Wavelengths 2π·500000^(2i/16): below 64/4 = 16 kept (factor 1), above 64 divided by 8,
    // between blended: 1 / ((1 − s)/8 + s) with s = (64/λ − 1)/3.
    for (i, &f) in factors.iter().enumerate() {
        let wavelength = 2.0 * std::f64::consts::PI * 500000f64.powf(2.0 * i as f64 / 16.0);
        let want = if wavelength < 16.0 {
            1.0
        } else if wavelength > 64.0 {
            8.0
        } else {
            let s = (64.0 / wavelength - 1.0) / 3.0;
            1.0 / ((1.0 - s) / 8.0 + s)
        };
        assert!(
            (f64::from(f) - want).abs() < 1e-6 * want,
            "pair {i}: {f} vs {want}"
        );
    }
    assert!(factors[0] == 1.0 && factors[7] == 8.0, "{factors:?}");
    // Other scaling types are refused by name.
    config["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    convert::write_json(&dir.join("config.json"), &config);
    let err = run(&dir, TargetType::Q8_0).unwrap_err().to_string();
    assert!(err.contains("yarn"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shards_and_dtypes_convert_alike() {
    // The same values written as one f32 file and as three f32 shards give the same file.
    let shape = Shape::narrow("qwen2");
    let seed: u64 = rand::random();
    let (one, three) = (temp_dir("one-file"), temp_dir("three-shards"));
    let w1 = write_checkpoint(
        &one,
        &shape,
        Dtype::F32,
        1,
        &mut ChaCha8Rng::seed_from_u64(seed),
    );
    let w3 = write_checkpoint(
        &three,
        &shape,
        Dtype::F32,
        3,
        &mut ChaCha8Rng::seed_from_u64(seed),
    );
    assert_eq!(w1, w3);
    assert!(three.join("model.safetensors.index.json").exists());
    let (a, _) = run(&one, TargetType::Q4_0).unwrap();
    let (b, _) = run(&three, TargetType::Q4_0).unwrap();
    let (a, b) = (GgufFile::open(a).unwrap(), GgufFile::open(b).unwrap());
    for t in a.tensors() {
        assert_eq!(t.bytes, b.tensor(t.name).unwrap().bytes, "{}", t.name);
    }
    // F16 storage converts too, each weight judged against its f16 value.
    check_conversion(&shape, Dtype::F16);
    for dir in [one, three] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

fn assert_refused(dir: &Path, needle: &str) {
    let err = run(dir, TargetType::Q8_0).unwrap_err().to_string();
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(!dir.join("out.gguf").exists() && !dir.join("out.gguf.partial").exists());
}

#[test]
fn refusals_name_the_problem() {
    let mut rng = rng();
    let base = temp_dir("refusals");
    assert_refused(&base.join("missing"), "does not exist");
    let dir = base.join("m");
    write_checkpoint(&dir, &Shape::narrow("llama"), Dtype::BF16, 1, &mut rng);

    // Not a directory; no config.json; no weights.
    let err = run(&dir.join("config.json"), TargetType::Q8_0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a directory"), "{err}");
    let empty = base.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert_refused(&empty, "no config.json");
    std::fs::copy(dir.join("config.json"), empty.join("config.json")).unwrap();
    assert_refused(&empty, "neither model.safetensors");

    // An architecture and an activation the converter does not write.
    let config = convert::read_json(&dir.join("config.json"));
    let mut other = config.clone();
    other["model_type"] = "gemma".into();
    convert::write_json(&dir.join("config.json"), &other);
    assert_refused(&dir, "model_type gemma");
    other = config.clone();
    other["hidden_act"] = "gelu".into();
    convert::write_json(&dir.join("config.json"), &other);
    assert_refused(&dir, "hidden_act \"gelu\"");
    convert::write_json(&dir.join("config.json"), &config);

    // No tokenizer.json.
    std::fs::rename(dir.join("tokenizer.json"), base.join("tokenizer.json")).unwrap();
    assert_refused(&dir, "no tokenizer.json");
    std::fs::rename(base.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();

    // More layers in the config than in the checkpoint.
    let mut deeper = config.clone();
    deeper["num_hidden_layers"] = 2.into();
    convert::write_json(&dir.join("config.json"), &deeper);
    assert_refused(&dir, "model.layers.1.input_layernorm.weight: missing");
    convert::write_json(&dir.join("config.json"), &config);
    run(&dir, TargetType::Q8_0).unwrap();
    std::fs::remove_dir_all(&base).unwrap();
}

/// Rewrites `dir/model.safetensors` with `edit` applied to its tensors.
fn rewrite_weights(dir: &Path, edit: impl Fn(&str, &mut Vec<f32>)) {
    let file =
        quench_models::safetensors::SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    let mut tensors = Vec::new();
    for info in file.tensor_infos() {
        let view = file.tensor(&info.name).unwrap();
        let mut values = view.to_f32();
        edit(&info.name, &mut values);
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((info.name.clone(), info.shape.clone(), bytes));
    }
    let mut w = quench_models::safetensors::SafetensorsWriter::new();
    for (name, shape, bytes) in &tensors {
        w.add_tensor(name, Dtype::F32, shape, bytes).unwrap();
    }
    drop(file);
    w.write(dir.join("model.safetensors")).unwrap();
}

#[test]
fn a_bad_weight_is_named_and_leaves_the_previous_output_alone() {
    let dir = temp_dir("bad-weight");
    let shape = Shape::narrow("qwen3");
    write_checkpoint(&dir, &shape, Dtype::F32, 1, &mut rng());
    let (out, _) = run(&dir, TargetType::Q4_0).unwrap();
    let before = std::fs::read(&out).unwrap();
    let row = rng().gen_range(0..shape.ffn);
    rewrite_weights(&dir, |name, values| {
        if name == "model.layers.0.mlp.up_proj.weight" {
            values[row * shape.hidden + 3] = f32::NAN;
        }
    });
    let err = run(&dir, TargetType::Q4_0).unwrap_err().to_string();
    assert!(
        err.contains("model.layers.0.mlp.up_proj.weight")
            && err.contains(&format!("row {row}:"))
            && err.contains("NaN"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&out).unwrap(),
        before,
        "the old output is untouched"
    );
    assert!(!dir.join("out.gguf.partial").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unsupported_dtypes_and_unknown_tensors_are_refused_by_name() {
    let dir = temp_dir("dtypes");
    write_checkpoint(&dir, &Shape::narrow("llama"), Dtype::BF16, 1, &mut rng());
    let file =
        quench_models::safetensors::SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    let mut kept: Vec<(String, Dtype, Vec<u64>, Vec<u8>)> = file
        .tensor_infos()
        .iter()
        .map(|i| {
            let v = file.tensor(&i.name).unwrap();
            (i.name.clone(), v.dtype, i.shape.clone(), v.bytes.to_vec())
        })
        .collect();
    drop(file);
    let write = |extra: (String, Dtype, Vec<u64>, Vec<u8>), kept: &mut Vec<_>| {
        kept.push(extra);
        let mut w = quench_models::safetensors::SafetensorsWriter::new();
        for (name, dtype, shape, bytes) in kept.iter() {
            w.add_tensor(name, *dtype, shape, bytes).unwrap();
        }
        w.write(dir.join("model.safetensors")).unwrap();
        kept.pop();
    };
    write(
        (
            "model.layers.0.mlp.up_proj.scale".into(),
            Dtype::I32,
            vec![2],
            vec![0; 8],
        ),
        &mut kept,
    );
    assert_refused(&dir, "stored as I32");
    write(
        (
            "model.layers.0.mlp.extra.weight".into(),
            Dtype::BF16,
            vec![2],
            vec![0; 4],
        ),
        &mut kept,
    );
    assert_refused(&dir, "model.layers.0.mlp.extra.weight: not a weight");
    std::fs::remove_dir_all(&dir).unwrap();
}
