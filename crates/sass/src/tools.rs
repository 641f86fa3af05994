//! NVIDIA's binary tools that check quench's machine code: `nvdisasm` (and `cuobjdump`),
//! from the `nvidia-cuda-nvdisasm` / `nvidia-cuda-cuobjdump` wheels
//! (`scripts/find-nvdisasm.sh` installs them into `.tools/`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Result, SassError};

/// Locates `tool` (`nvdisasm` or `cuobjdump`): `$QUENCH_NVDISASM` / `$QUENCH_CUOBJDUMP`
/// if set, else `PATH`, else `.tools/<tool>/nvidia/cu13/bin/<tool>` in the current
/// directory or one above it (where scripts/find-nvdisasm.sh installs it).
pub fn find(tool: &str) -> Result<PathBuf> {
    let var = format!("QUENCH_{}", tool.to_uppercase());
    if let Some(p) = std::env::var_os(&var).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(SassError::Tool {
                tool: tool.into(),
                msg: format!("{var}={} is not a file", p.display()),
            })
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(p) = std::env::split_paths(&path)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
        {
            return Ok(p);
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let p = dir
                .join(".tools")
                .join(tool)
                .join("nvidia/cu13/bin")
                .join(tool);
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(SassError::Tool {
        tool: tool.into(),
        msg: format!(
            "not found (looked at {var}, PATH and .tools/); install it with scripts/find-nvdisasm.sh \
             (the nvidia-cuda-{tool} wheel) or point {var} at the binary"
        ),
    })
}

/// A file in a fresh temporary directory, removed with it.
pub struct TempFile {
    dir: PathBuf,
    pub path: PathBuf,
}

impl TempFile {
    pub fn new(name: &str, bytes: &[u8]) -> Result<TempFile> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("quench-sass-{}-{n}", std::process::id()));
        let io = |source| SassError::Io {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|source| SassError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(TempFile { dir, path })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Runs `tool` with `args`; its standard output and error.
pub fn run(tool: &Path, args: &[&str]) -> Result<(bool, String, String)> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|source| SassError::Io {
            path: tool.to_path_buf(),
            source,
        })?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// nvdisasm's text for a cubin (`-c`: code sections only) with `extra` options.
pub fn nvdisasm_cubin(cubin: &[u8], extra: &[&str]) -> Result<String> {
    let nvdisasm = find("nvdisasm")?;
    let f = TempFile::new("k.cubin", cubin)?;
    let path = f.path.to_string_lossy().into_owned();
    let mut args = extra.to_vec();
    args.push(&path);
    let (ok, out, err) = run(&nvdisasm, &args)?;
    if !ok {
        return Err(SassError::Tool {
            tool: "nvdisasm".into(),
            msg: err.trim().to_string(),
        });
    }
    Ok(out)
}

/// The instruction nvdisasm prints at each address of a listing (`/*0040*/ ... ;`), without
/// the trailing ` ;`. Lines that are not instructions are skipped.
pub fn listing_instructions(text: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let t = line.trim_start();
        let Some(rest) = t.strip_prefix("/*") else {
            continue;
        };
        let Some((addr, rest)) = rest.split_once("*/") else {
            continue;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            continue;
        };
        let rest = rest.trim();
        // Only instructions end with `;` (data directives in -hex listings do not).
        let Some(end) = rest
            .find(" ;")
            .or_else(|| rest.strip_suffix(';').map(str::len))
        else {
            continue;
        };
        out.push((addr, rest[..end].trim().to_string()));
    }
    out
}

/// Disassembles raw sm_90 instructions at `base`. An instruction nvdisasm rejects is
/// `None` (nvdisasm refuses the whole input when one is illegal, so it is run again with
/// each rejected instruction, which it names by address, replaced by a NOP).
pub fn nvdisasm_raw(code: &[u8], base: u64) -> Result<Vec<Option<String>>> {
    const NOP: [u8; 16] = [0x18, 0x79, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc0, 0x0f, 0];
    let nvdisasm = find("nvdisasm")?;
    let n = code.len() / 16;
    let mut code = code.to_vec();
    let mut illegal = vec![false; n];
    let base_s = format!("{base:#x}");
    for _attempt in 0..4 {
        let f = TempFile::new("k.bin", &code)?;
        let path = f.path.to_string_lossy().into_owned();
        let (ok, out, err) = run(&nvdisasm, &["-b", "SM90", "-base", &base_s, &path])?;
        if ok {
            let mut res = vec![None; n];
            for (addr, text) in listing_instructions(&out) {
                let Some(i) = addr.checked_sub(base).map(|a| (a / 16) as usize) else {
                    continue;
                };
                if i < n && !illegal[i] {
                    res[i] = Some(text);
                }
            }
            return Ok(res);
        }
        let mut found = false;
        for l in err.lines() {
            let Some(a) = l.split("at address ").nth(1) else {
                continue;
            };
            let a = a.trim().trim_start_matches("0x");
            let Ok(a) = u64::from_str_radix(a, 16) else {
                continue;
            };
            let Some(i) = a.checked_sub(base).map(|a| (a / 16) as usize) else {
                continue;
            };
            if i < n && !illegal[i] {
                illegal[i] = true;
                code[i * 16..i * 16 + 16].copy_from_slice(&NOP);
                found = true;
            }
        }
        if !found {
            return Err(SassError::Tool {
                tool: "nvdisasm".into(),
                msg: err.trim().to_string(),
            });
        }
    }
    Err(SassError::Tool {
        tool: "nvdisasm".into(),
        msg: "kept rejecting instructions".into(),
    })
}
