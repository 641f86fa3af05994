//! Finding and opening a checkpoint: a GGUF file or a Hugging Face directory.

use std::io::Read;
use std::path::{Path, PathBuf};

use quench_models::arch::{ModelConfig, Naming, TensorSource};
use quench_models::{GgufFile, HfCheckpoint};

use crate::error::{EngineError, Result};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// An open checkpoint, its weights mapped but not read. (One lives for the length of a load,
/// so the variants' sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Checkpoint {
    Gguf {
        path: PathBuf,
        file: GgufFile,
    },
    HuggingFace {
        dir: PathBuf,
        checkpoint: HfCheckpoint,
    },
}

/// Opens `path`: a GGUF file, a Hugging Face checkpoint directory, or the `config.json` or
/// `model.safetensors` inside one.
pub(crate) fn open(path: &Path) -> Result<Checkpoint> {
    let meta = std::fs::metadata(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => EngineError::NotFound {
            path: path.to_owned(),
        },
        _ => EngineError::Io {
            path: path.to_owned(),
            source,
        },
    })?;
    if meta.is_dir() {
        return open_hf(path);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name == "config.json" || name.ends_with(".safetensors") {
        if let Some(dir) = path.parent() {
            return open_hf(if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            });
        }
    }
    let mut magic = [0u8; 4];
    let read = std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic));
    if read.is_err() || &magic != GGUF_MAGIC {
        return Err(EngineError::NotAModel {
            path: path.to_owned(),
            reason: "the file does not start with the GGUF magic".into(),
        });
    }
    Ok(Checkpoint::Gguf {
        path: path.to_owned(),
        file: GgufFile::open(path)?,
    })
}

fn open_hf(dir: &Path) -> Result<Checkpoint> {
    if !dir.join("config.json").is_file() {
        return Err(EngineError::NotAModel {
            path: dir.to_owned(),
            reason: "the directory has no config.json".into(),
        });
    }
    Ok(Checkpoint::HuggingFace {
        dir: dir.to_owned(),
        checkpoint: HfCheckpoint::open(dir)?,
    })
}

impl Checkpoint {
    pub(crate) fn path(&self) -> &Path {
        match self {
            Checkpoint::Gguf { path, .. } => path,
            Checkpoint::HuggingFace { dir, .. } => dir,
        }
    }

    pub(crate) fn config(&self) -> Result<ModelConfig> {
        Ok(match self {
            Checkpoint::Gguf { file, .. } => ModelConfig::from_gguf(file)?,
            Checkpoint::HuggingFace { checkpoint, .. } => {
                ModelConfig::from_hf_config(checkpoint.config())?
            }
        })
    }

    pub(crate) fn naming(&self) -> Naming {
        match self {
            Checkpoint::Gguf { .. } => Naming::Gguf,
            Checkpoint::HuggingFace { .. } => Naming::HuggingFace,
        }
    }

    pub(crate) fn tensors(&self) -> &dyn TensorSource {
        match self {
            Checkpoint::Gguf { file, .. } => file,
            Checkpoint::HuggingFace { checkpoint, .. } => checkpoint,
        }
    }
}
