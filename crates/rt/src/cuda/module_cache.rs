//! The on-disk cache of compiled kernels.
//!
//! An entry is `<key>.cubin` plus `<key>.json`, where the key is the SHA-256 of the PTX
//! text, the driver version, the device name and its compute capability: the same PTX
//! compiled by another driver or for another chip is another entry. The JSON sidecar
//! holds the kernel's ABI and the cubin's own SHA-256. An entry is used only if the
//! sidecar parses, its ABI equals the one derived from the kernel being loaded, and the
//! cubin's hash matches; otherwise it is deleted and the kernel is compiled again.
//!
//! Caching only saves time: a cache that cannot be written does not fail a load, but
//! it is counted in [`CacheStats`] and the last problem is kept for the caller to show.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::abi::KernelAbi;

const FORMAT: &str = "quench-cubin-1";

/// What the cache did since the executor was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Loads served from disk without JIT.
    pub hits: u64,
    /// Loads that had to JIT (no entry, or no cache directory).
    pub misses: u64,
    /// Entries found corrupt or stale and deleted.
    pub discarded: u64,
    /// Entries that could not be written.
    pub write_failures: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sidecar {
    format: String,
    abi: KernelAbi,
    cubin_sha256: String,
    cubin_bytes: u64,
}

pub(crate) struct ModuleCache {
    dir: Option<PathBuf>,
    stats: CacheStats,
    last_problem: Option<String>,
}

/// The cache directory: `$QUENCH_CACHE_DIR`, else `$XDG_CACHE_HOME/quench/cubin`, else
/// `$HOME/.cache/quench/cubin`; `None` if none of them is set.
pub(crate) fn resolve_dir(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(d) = set("QUENCH_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    if let Some(d) = set("XDG_CACHE_HOME").filter(|d| Path::new(d).is_absolute()) {
        return Some(Path::new(&d).join("quench").join("cubin"));
    }
    set("HOME").map(|h| Path::new(&h).join(".cache").join("quench").join("cubin"))
}

/// The cache key of a PTX module compiled by `driver_version` for a device.
pub(crate) fn key(ptx: &str, driver_version: i32, device_name: &str, cc: (u32, u32)) -> String {
    let mut h = Sha256::new();
    // Length-prefix every field so that no two inputs concatenate to the same bytes.
    for field in [
        ptx.as_bytes(),
        &driver_version.to_le_bytes(),
        device_name.as_bytes(),
    ] {
        h.update((field.len() as u64).to_le_bytes());
        h.update(field);
    }
    h.update(cc.0.to_le_bytes());
    h.update(cc.1.to_le_bytes());
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ModuleCache {
    pub fn new(dir: Option<PathBuf>) -> ModuleCache {
        let last_problem = dir.is_none().then(|| {
            "compiled kernels are not kept: no cache directory (QUENCH_CACHE_DIR, XDG_CACHE_HOME or HOME)".to_string()
        });
        ModuleCache {
            dir,
            stats: CacheStats::default(),
            last_problem,
        }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    pub fn last_problem(&self) -> Option<&str> {
        self.last_problem.as_deref()
    }

    fn paths(&self, key: &str) -> Option<(PathBuf, PathBuf)> {
        let d = self.dir.as_ref()?;
        Some((
            d.join(format!("{key}.cubin")),
            d.join(format!("{key}.json")),
        ))
    }

    /// The cached cubin for `key`, if a valid entry for a kernel with this ABI exists.
    /// Counts a miss otherwise (the caller will compile); a bad entry is deleted.
    pub fn lookup(&mut self, key: &str, abi: &KernelAbi) -> Option<Vec<u8>> {
        let Some((cubin_path, meta_path)) = self.paths(key) else {
            self.stats.misses += 1;
            return None;
        };
        let Ok(meta) = fs::read(&meta_path) else {
            self.stats.misses += 1;
            return None;
        };
        let valid = serde_json::from_slice::<Sidecar>(&meta)
            .ok()
            .and_then(|side| {
                let cubin = fs::read(&cubin_path).ok()?;
                let ok = side.format == FORMAT
                    && side.abi == *abi
                    && side.cubin_bytes == cubin.len() as u64
                    && side.cubin_sha256 == hex(&Sha256::digest(&cubin));
                ok.then_some(cubin)
            });
        match valid {
            Some(cubin) => {
                self.stats.hits += 1;
                Some(cubin)
            }
            None => {
                self.discard(key);
                self.stats.misses += 1;
                None
            }
        }
    }

    /// The driver refused a cubin that `lookup` returned: count the load as a miss
    /// and delete the entry.
    pub fn reject(&mut self, key: &str) {
        self.stats.hits = self.stats.hits.saturating_sub(1);
        self.stats.misses += 1;
        self.discard(key);
    }

    /// Delete an entry (corrupt or stale).
    pub fn discard(&mut self, key: &str) {
        if let Some((cubin, meta)) = self.paths(key) {
            // Either file may already be missing; what matters is that neither is used.
            let _ = fs::remove_file(meta);
            let _ = fs::remove_file(cubin);
            self.stats.discarded += 1;
        }
    }

    /// Store a freshly compiled cubin. Failures are counted, not returned.
    pub fn store(&mut self, key: &str, cubin: &[u8], abi: &KernelAbi) {
        let Some((cubin_path, meta_path)) = self.paths(key) else {
            return;
        };
        let side = Sidecar {
            format: FORMAT.to_string(),
            abi: abi.clone(),
            cubin_sha256: hex(&Sha256::digest(cubin)),
            cubin_bytes: cubin.len() as u64,
        };
        let written = serde_json::to_vec_pretty(&side)
            .map_err(|e| e.to_string())
            .and_then(|meta| {
                // The cubin goes first: a reader that finds the sidecar finds a complete
                // cubin, and the hash in the sidecar catches a cubin from another writer.
                write_atomically(&cubin_path, cubin)?;
                write_atomically(&meta_path, &meta)
            });
        if let Err(e) = written {
            self.stats.write_failures += 1;
            self.last_problem = Some(format!(
                "could not write the kernel cache entry {}: {e}",
                meta_path.display()
            ));
        }
    }
}

/// Write to a temporary file beside `path`, then rename it into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", path.display()))?;
    fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let result = fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|_| f.sync_all()))
        .and_then(|_| fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(format!("writing {}: {e}", path.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::{AbiParam, ParamKind};

    fn scratch_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("quench-rt-cache-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn abi() -> KernelAbi {
        KernelAbi {
            name: "k".into(),
            params: vec![AbiParam {
                name: "x".into(),
                kind: ParamKind::Ptr {
                    space: "global".into(),
                    elem: "f32".into(),
                },
                size: 8,
                align: 8,
            }],
            static_shared_bytes: 0,
            max_threads: 128,
            features: vec![],
        }
    }

    #[test]
    fn key_depends_on_every_input() {
        let k = key("ptx", 13000, "H200", (9, 0));
        assert_eq!(k.len(), 64);
        assert_eq!(k, key("ptx", 13000, "H200", (9, 0)));
        for other in [
            key("ptx ", 13000, "H200", (9, 0)),
            key("ptx", 13010, "H200", (9, 0)),
            key("ptx", 13000, "H100", (9, 0)),
            key("ptx", 13000, "H200", (9, 1)),
            key("ptx", 13000, "H200", (8, 0)),
        ] {
            assert_ne!(k, other);
        }
    }

    #[test]
    fn dir_follows_the_documented_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            }
        };
        let all = env(&[
            ("QUENCH_CACHE_DIR", "/q"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ]);
        assert_eq!(resolve_dir(all), Some(PathBuf::from("/q")));
        let xdg = env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(resolve_dir(xdg), Some(PathBuf::from("/x/quench/cubin")));
        let relative_xdg = env(&[("XDG_CACHE_HOME", "x"), ("HOME", "/h")]);
        assert_eq!(
            resolve_dir(relative_xdg),
            Some(PathBuf::from("/h/.cache/quench/cubin"))
        );
        let empty = env(&[("QUENCH_CACHE_DIR", ""), ("HOME", "/h")]);
        assert_eq!(
            resolve_dir(empty),
            Some(PathBuf::from("/h/.cache/quench/cubin"))
        );
        assert_eq!(resolve_dir(env(&[])), None);
    }

    #[test]
    fn stored_entry_is_found_again() {
        let dir = scratch_dir("roundtrip");
        let mut c = ModuleCache::new(Some(dir.clone()));
        let k = key("ptx", 13000, "dev", (9, 0));
        assert_eq!(c.lookup(&k, &abi()), None);
        c.store(&k, b"\x7fELF cubin bytes", &abi());
        assert_eq!(
            c.lookup(&k, &abi()).as_deref(),
            Some(&b"\x7fELF cubin bytes"[..])
        );
        assert_eq!(
            c.stats(),
            CacheStats {
                hits: 1,
                misses: 1,
                discarded: 0,
                write_failures: 0
            }
        );
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn corrupt_or_stale_entries_are_discarded() {
        let dir = scratch_dir("corrupt");
        let mut c = ModuleCache::new(Some(dir.clone()));
        let k = key("ptx", 13000, "dev", (9, 0));
        let (cubin_path, meta_path) = c.paths(&k).unwrap();

        // A flipped byte in the cubin.
        c.store(&k, b"cubin", &abi());
        fs::write(&cubin_path, b"cubiN").unwrap();
        assert_eq!(c.lookup(&k, &abi()), None);
        assert!(
            !cubin_path.exists() && !meta_path.exists(),
            "the bad entry is deleted"
        );

        // A sidecar with a field this version does not know.
        c.store(&k, b"cubin", &abi());
        let mut meta: serde_json::Value =
            serde_json::from_slice(&fs::read(&meta_path).unwrap()).unwrap();
        meta["extra"] = serde_json::json!(1);
        fs::write(&meta_path, serde_json::to_vec(&meta).unwrap()).unwrap();
        assert_eq!(c.lookup(&k, &abi()), None);

        // An ABI that is not the kernel's.
        c.store(&k, b"cubin", &abi());
        let mut other = abi();
        other.max_threads = 256;
        assert_eq!(c.lookup(&k, &other), None);

        // A truncated sidecar.
        c.store(&k, b"cubin", &abi());
        fs::write(&meta_path, b"{\"format\":").unwrap();
        assert_eq!(c.lookup(&k, &abi()), None);

        assert_eq!(c.stats().discarded, 4);
        assert_eq!(c.stats().hits, 0);
        let _ = fs::remove_dir_all(dir);
    }

    #[test]
    fn unwritable_cache_is_counted_not_fatal() {
        let dir = scratch_dir("unwritable");
        fs::write(&dir, b"a file where the directory should be").unwrap();
        let mut c = ModuleCache::new(Some(dir.join("sub")));
        c.store("k", b"cubin", &abi());
        assert_eq!(c.stats().write_failures, 1);
        assert!(c.last_problem().is_some());
        let _ = fs::remove_file(dir);
    }
}
