//! Converting a Hugging Face checkpoint (llama, qwen2, qwen3; F32, F16 or BF16 safetensors,
//! single-file or sharded) into a GGUF file with quantized weights, as llama.cpp lays them
//! out: its metadata keys, tensor names, RoPE row order and tokenizer.
//!
//! What goes where:
//! - Matrices in the target type ([`TargetType`]); the token embedding and the LM head in
//!   Q8_0; vectors (norm weights, biases) in F32. A matrix whose rows are not whole blocks
//!   of its type falls back to Q8_0, then F16, with a [`Progress::Note`] naming it (one
//!   note for all the tensors alike).
//! - llama's q and k projections have each head's two halves interleaved, which turns
//!   Hugging Face's half-split RoPE into llama.cpp's adjacent-pair RoPE; qwen2 and qwen3
//!   keep Hugging Face's order, as llama.cpp runs them with half-split RoPE.
//! - Llama 3 RoPE scaling becomes the `rope_freqs.weight` tensor of per-frequency divisors.
//! - The byte-level BPE tokenizer becomes `tokenizer.ggml.*` keys, with the pre-tokenizer
//!   named as llama.cpp names it, and the chat template `tokenizer.chat_template`.
//!
//! The file is written tensor by tensor to `OUTPUT.partial` beside the output and renamed
//! when complete, so an interrupted conversion never leaves a truncated file at the output.

mod arch;
mod encode;
mod error;
mod fallbacks;
mod plan;
mod tokenizer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use arch::Arch;
pub use error::ConvertError;

use crate::gguf::{GgufFileWriter, GgufHeader, MetadataValue};
use crate::hf_checkpoint::{CONFIG_FILE, INDEX_FILE, SINGLE_FILE};
use crate::safetensors::SafetensorsInfo;
use crate::{GgmlType, HfCheckpoint, ModelError};

use encode::{encode_rows, SourceRows};
use plan::{PlannedTensor, Source};

/// The type most weights are quantized to: one type for every matrix (the token embedding
/// and LM head kept at Q8_0), or one of llama.cpp's mixes, which give some matrices more
/// bits by llama.cpp's own rules ([`plan`] has them).
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetType {
    Q8_0,
    Q4_0,
    Q4_K,
    /// llama.cpp's Q4_K_M: Q4_K, with Q6_K for the LM head and for the v projection and
    /// the FFN down matrix of half the layers.
    Q4_K_M,
    /// llama.cpp's Q5_K_M: as Q4_K_M with Q5_K in place of Q4_K.
    Q5_K_M,
    /// llama.cpp's Q6_K: Q6_K throughout.
    Q6_K,
    /// llama.cpp's Q3_K_M: Q3_K, with Q4_K and Q5_K for the v, down and attention output
    /// matrices and Q6_K for the LM head.
    Q3_K_M,
    /// llama.cpp's Q2_K: Q2_K, with Q3_K or Q4_K for the v, down and attention output
    /// matrices and Q6_K for the LM head.
    Q2_K,
    /// llama.cpp's IQ4_XS without importance data: IQ4_XS, with Q5_K for the v projection
    /// (where four or more query heads share a key/value head) and for the FFN down matrix
    /// of the first eighth of the layers, and Q6_K for the LM head.
    IQ4_XS,
}

impl TargetType {
    pub const ALL: [TargetType; 9] = [
        TargetType::Q8_0,
        TargetType::Q4_0,
        TargetType::Q4_K,
        TargetType::Q4_K_M,
        TargetType::Q5_K_M,
        TargetType::Q6_K,
        TargetType::Q3_K_M,
        TargetType::Q2_K,
        TargetType::IQ4_XS,
    ];

    /// As [`TargetType::name`] gives it (any case).
    pub fn from_name(name: &str) -> Option<TargetType> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The name as written on command lines.
    pub fn name(self) -> &'static str {
        match self {
            TargetType::Q8_0 => "q8_0",
            TargetType::Q4_0 => "q4_0",
            TargetType::Q4_K => "q4_k",
            TargetType::Q4_K_M => "q4_k_m",
            TargetType::Q5_K_M => "q5_k_m",
            TargetType::Q6_K => "q6_k",
            TargetType::Q3_K_M => "q3_k_m",
            TargetType::Q2_K => "q2_k",
            TargetType::IQ4_XS => "iq4_xs",
        }
    }

    /// The type of the matrices the mix gives no more bits.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            TargetType::Q8_0 => GgmlType::Q8_0,
            TargetType::Q4_0 => GgmlType::Q4_0,
            TargetType::Q4_K | TargetType::Q4_K_M => GgmlType::Q4_K,
            TargetType::Q5_K_M => GgmlType::Q5_K,
            TargetType::Q6_K => GgmlType::Q6_K,
            TargetType::Q3_K_M => GgmlType::Q3_K,
            TargetType::Q2_K => GgmlType::Q2_K,
            TargetType::IQ4_XS => GgmlType::IQ4_XS,
        }
    }

    /// Whether this is one of llama.cpp's mixes (its rules for the LM head, the token
    /// embedding and the layers), rather than quench's one type with 8-bit ends.
    pub fn is_llama_cpp_mix(self) -> bool {
        !matches!(self, TargetType::Q8_0 | TargetType::Q4_0 | TargetType::Q4_K)
    }

    /// `general.file_type`: llama.cpp's `llama_ftype` (MOSTLY_Q8_0, MOSTLY_Q4_0,
    /// MOSTLY_Q4_K_S, MOSTLY_Q4_K_M, MOSTLY_Q5_K_M, MOSTLY_Q6_K, MOSTLY_Q3_K_M,
    /// MOSTLY_Q2_K, MOSTLY_IQ4_XS).
    fn file_type(self) -> u32 {
        match self {
            TargetType::Q8_0 => 7,
            TargetType::Q4_0 => 2,
            TargetType::Q4_K => 14,
            TargetType::Q4_K_M => 15,
            TargetType::Q5_K_M => 17,
            TargetType::Q6_K => 18,
            TargetType::Q3_K_M => 12,
            TargetType::Q2_K => 10,
            TargetType::IQ4_XS => 30,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvertOptions {
    pub target: TargetType,
    /// Threads quantizing rows; 0 for one per core.
    pub threads: usize,
}

/// What [`convert`] reports as it goes.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// Before any data is written: something the file stores differently than asked (a type
    /// fallback, a tokenizer detail GGUF cannot carry).
    Note(&'a str),
    /// A tensor has been written: the `index`-th (from 1) of `count`.
    Tensor {
        index: usize,
        count: usize,
        name: &'a str,
        ggml_type: GgmlType,
        /// GGUF dimensions, innermost first.
        dims: &'a [u64],
        /// Bytes read from the checkpoint.
        read: u64,
        /// Bytes written (before alignment padding).
        written: u64,
    },
}

/// What [`convert`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertSummary {
    pub arch: Arch,
    /// Tensors written, by ggml type name.
    pub tensor_types: BTreeMap<&'static str, usize>,
    /// Elements of all tensors.
    pub parameters: u64,
    pub bytes_read: u64,
    /// Size of the output file.
    pub file_bytes: u64,
}

/// Where the file is written until it is complete.
pub fn partial_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_owned();
    name.push(".partial");
    output.with_file_name(name)
}

/// Converts the checkpoint in directory `input` to a GGUF file at `output` (replacing it if
/// it exists), calling `progress` with notes first and then after each tensor.
pub fn convert(
    input: &Path,
    output: &Path,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<ConvertSummary, ConvertError> {
    let checkpoint = open_checkpoint(input)?;
    let config = checkpoint.config();
    let arch = Arch::of(config)?;
    let tokenizer = tokenizer::convert(input, config)?;
    let mut notes = tokenizer.notes;
    let infos: Vec<&SafetensorsInfo> = checkpoint.tensor_infos().collect();
    let planned = plan::plan(
        arch,
        config,
        &infos,
        arch::rope_factors(config)?,
        options.target,
    )?;
    notes.extend(fallbacks::notes(&planned));

    let mut header = GgufHeader::new();
    let name = input
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "model".into());
    let general = [
        (
            "general.architecture",
            MetadataValue::String(arch.gguf_name().into()),
        ),
        ("general.name", MetadataValue::String(name)),
        (
            "general.file_type",
            MetadataValue::U32(options.target.file_type()),
        ),
        ("general.quantization_version", MetadataValue::U32(2)),
    ];
    for (key, value) in general {
        header.add_metadata(key, value)?;
    }
    for (key, value) in arch::metadata(arch, config)?
        .into_iter()
        .chain(tokenizer.entries)
    {
        header.add_metadata(&key, value)?;
    }
    for t in &planned {
        header.add_tensor(&t.gguf_name, &t.dims(), t.ggml_type)?;
    }
    for note in &notes {
        progress(Progress::Note(note));
    }

    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            return Err(ConvertError::Io {
                path: dir.to_owned(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the output's directory does not exist",
                ),
            });
        }
    }
    let partial = partial_path(output);
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let written =
        write(&partial, header, &planned, &checkpoint, threads, progress).and_then(|summary| {
            std::fs::rename(&partial, output).map_err(|source| ConvertError::Io {
                path: output.to_owned(),
                source,
            })?;
            Ok(summary)
        });
    if written.is_err() {
        // Best effort: the error being reported matters more than a leftover partial file.
        let _ = std::fs::remove_file(&partial);
    }
    let (parameters, bytes_read) = written?;
    let file_bytes = std::fs::metadata(output)
        .map_err(|source| ConvertError::Io {
            path: output.to_owned(),
            source,
        })?
        .len();
    let mut tensor_types = BTreeMap::new();
    for t in &planned {
        *tensor_types.entry(t.ggml_type.name()).or_insert(0) += 1;
    }
    Ok(ConvertSummary {
        arch,
        tensor_types,
        parameters,
        bytes_read,
        file_bytes,
    })
}

fn open_checkpoint(input: &Path) -> Result<HfCheckpoint, ConvertError> {
    let not = |reason: &str| ConvertError::NotACheckpoint {
        path: input.to_owned(),
        reason: reason.to_owned(),
    };
    if !input.is_dir() {
        return Err(not(if input.exists() {
            "it is not a directory (give the directory holding config.json and the safetensors)"
        } else {
            "it does not exist"
        }));
    }
    if !input.join(CONFIG_FILE).is_file() {
        return Err(not("it has no config.json"));
    }
    if !input.join(SINGLE_FILE).is_file() && !input.join(INDEX_FILE).is_file() {
        return Err(not(
            "it has neither model.safetensors nor model.safetensors.index.json",
        ));
    }
    Ok(HfCheckpoint::open(input)?)
}

/// Writes the file; returns the elements written and the bytes read.
fn write(
    path: &Path,
    header: GgufHeader,
    planned: &[PlannedTensor],
    checkpoint: &HfCheckpoint,
    threads: usize,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(u64, u64), ConvertError> {
    let mut out = GgufFileWriter::create(path, header)?;
    let (mut parameters, mut bytes_read) = (0u64, 0u64);
    for (i, t) in planned.iter().enumerate() {
        let (bytes, read) = match &t.source {
            Source::Computed(values) => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                (bytes, 0)
            }
            Source::Checkpoint(hf_name) => {
                let view = checkpoint.tensor(hf_name)?;
                let rows = SourceRows {
                    dtype: view.dtype,
                    bytes: view.bytes,
                    rows: t.rows,
                    cols: t.cols,
                };
                let bytes = encode_rows(&rows, t.row_order, t.ggml_type, threads)
                    .map_err(|e: ModelError| e.in_tensor(hf_name))?;
                (bytes, view.bytes.len() as u64)
            }
        };
        out.write_tensor(&bytes)?;
        parameters += (t.rows * t.cols) as u64;
        bytes_read += read;
        progress(Progress::Tensor {
            index: i + 1,
            count: planned.len(),
            name: &t.gguf_name,
            ggml_type: t.ggml_type,
            dims: &t.dims(),
            read,
            written: bytes.len() as u64,
        });
    }
    out.finish()?;
    Ok((parameters, bytes_read))
}
