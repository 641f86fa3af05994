//! A Hugging Face checkpoint directory: `config.json` plus either `model.safetensors` or the
//! shards listed by `model.safetensors.index.json`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::safetensors::{SafetensorsFile, SafetensorsInfo, SafetensorsView};
use crate::{HfConfig, ModelError};

pub const CONFIG_FILE: &str = "config.json";
pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: BTreeMap<String, String>,
}

#[derive(Debug)]
pub struct HfCheckpoint {
    config: HfConfig,
    shards: Vec<(PathBuf, SafetensorsFile)>,
    /// Tensor name to shard index.
    location: HashMap<String, usize>,
}

impl HfCheckpoint {
    pub fn open(dir: impl AsRef<Path>) -> Result<HfCheckpoint, ModelError> {
        let dir = dir.as_ref();
        let config = HfConfig::from_file(dir.join(CONFIG_FILE))?;
        let index_path = dir.join(INDEX_FILE);
        let (shards, weight_map) = if index_path.exists() {
            let weight_map = read_index(&index_path)?;
            let mut files: Vec<&String> = weight_map.values().collect();
            files.sort();
            files.dedup();
            let shards = files
                .into_iter()
                .map(|f| {
                    let path = dir.join(f);
                    SafetensorsFile::open(&path).map(|s| (path, s))
                })
                .collect::<Result<Vec<_>, _>>()?;
            (shards, Some(weight_map))
        } else {
            let path = dir.join(SINGLE_FILE);
            let file = SafetensorsFile::open(&path)?;
            (vec![(path, file)], None)
        };

        let mut location = HashMap::new();
        for (i, (path, shard)) in shards.iter().enumerate() {
            for t in shard.tensor_infos() {
                if location.insert(t.name.clone(), i).is_some() {
                    return Err(ModelError::Duplicate {
                        kind: "tensor (in two shards)",
                        name: t.name.clone(),
                    }
                    .in_file(path));
                }
            }
        }
        if let Some(weight_map) = weight_map {
            for (name, file) in &weight_map {
                let listed = dir.join(file);
                if location.get(name).map(|&i| &shards[i].0) != Some(&listed) {
                    return Err(ModelError::MissingTensor { name: name.clone() }.in_file(listed));
                }
            }
        }
        Ok(HfCheckpoint {
            config,
            shards,
            location,
        })
    }

    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// Every tensor of every shard, whatever its dtype.
    pub fn tensor_infos(&self) -> impl Iterator<Item = &SafetensorsInfo> {
        self.shards.iter().flat_map(|(_, s)| s.tensor_infos())
    }

    pub fn info(&self, name: &str) -> Option<&SafetensorsInfo> {
        let &i = self.location.get(name)?;
        self.shards[i].1.info(name)
    }

    /// A tensor's bytes (F32, F16 or BF16; others are refused by name), from whichever shard
    /// holds it.
    pub fn tensor(&self, name: &str) -> Result<SafetensorsView<'_>, ModelError> {
        let &i = self
            .location
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_owned(),
            })?;
        let (path, shard) = &self.shards[i];
        shard.tensor(name).map_err(|e| e.in_file(path))
    }
}

/// Reads the shard index; shard names must be plain file names in the checkpoint directory.
fn read_index(path: &Path) -> Result<BTreeMap<String, String>, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        file: path.to_owned(),
        source,
    })?;
    let index: ShardIndex =
        serde_json::from_str(&text).map_err(|source| ModelError::Json { source }.in_file(path))?;
    for file in index.weight_map.values() {
        let plain = Path::new(file)
            .file_name()
            .is_some_and(|n| n == file.as_str());
        if !plain {
            return Err(ModelError::BadHeader {
                reason: format!("shard {file:?} is not a plain file name"),
            }
            .in_file(path));
        }
    }
    Ok(index.weight_map)
}
