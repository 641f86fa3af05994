//! Finding and running NVIDIA's PTX assembler, `ptxas`.
//!
//! quench does not need `ptxas` to run kernels (the driver compiles PTX itself); it is
//! used to check that emitted PTX assembles and to read the resources a kernel takes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use crate::PtxError;

/// What `ptxas -v` reports for the one entry function of a module, and the cubin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsmReport {
    pub kernel: String,
    pub registers: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    /// Static shared memory per block.
    pub shared_bytes: u32,
    pub stack_frame_bytes: u32,
    /// Warnings `ptxas` printed, without the file name.
    pub warnings: Vec<String>,
    /// The assembled ELF object.
    pub cubin: Vec<u8>,
}

/// Where `quench pull ptxas` puts it, as the command line's model cache says.
static PULLED: OnceLock<PathBuf> = OnceLock::new();

/// Tells [`find_ptxas`] where a pulled `ptxas` would be (the first call counts).
pub fn set_pulled_ptxas(path: PathBuf) {
    let _ = PULLED.set(path);
}

/// Locate `ptxas`: `$QUENCH_PTXAS` if set, else `ptxas` on `PATH`, else the one `quench
/// pull ptxas` installed ([`set_pulled_ptxas`]), else the binary shipped in an installed
/// `nvidia-cuda-nvcc` Python wheel (`nvidia/cu13/bin/ptxas`).
pub fn find_ptxas() -> Result<PathBuf, PtxError> {
    if let Some(p) = std::env::var_os("QUENCH_PTXAS").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(PtxError::PtxasNotFound {
                looked: format!("QUENCH_PTXAS={} (no such file)", p.display()),
            })
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(p) = std::env::split_paths(&path)
            .map(|d| d.join("ptxas"))
            .find(|p| p.is_file())
        {
            return Ok(p);
        }
    }
    if let Some(p) = PULLED.get().filter(|p| p.is_file()) {
        return Ok(p.clone());
    }
    match wheel_ptxas() {
        Some(p) => Ok(p.clone()),
        None => Err(PtxError::PtxasNotFound {
            looked: format!(
                "QUENCH_PTXAS, PATH, {}python3's nvidia.cu13 package (nvidia-cuda-nvcc wheel)",
                PULLED
                    .get()
                    .map(|p| format!("{}, ", p.display()))
                    .unwrap_or_default()
            ),
        }),
    }
}

/// `ptxas` inside the installed `nvidia-cuda-nvcc` wheel, asked of python3 once.
fn wheel_ptxas() -> Option<&'static PathBuf> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            // `nvidia.cu13` is a namespace package: it has a path but no file.
            let out = Command::new("python3")
                .args(["-c", "import nvidia.cu13 as m; print(list(m.__path__)[0])"])
                .output()
                .ok()?;
            let dir = String::from_utf8(out.stdout).ok()?;
            let p = Path::new(dir.trim()).join("bin").join("ptxas");
            (out.status.success() && p.is_file()).then_some(p)
        })
        .as_ref()
}

/// A temporary directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("quench-ptxas-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Assemble `ptx` for `arch` (`sm_90`, `sm_90a`, ...) with `ptxas -v`. A module that
/// targets `sm_90a` (it uses `wgmma`) is assembled for `sm_90a` when `arch` is `sm_90`:
/// the same GPU, its architecture-specific instructions allowed.
///
/// On rejection the error carries `ptxas`'s message and the PTX line it names.
pub fn assemble(ptx: &str, arch: &str) -> Result<AsmReport, PtxError> {
    let specific = format!("{arch}a");
    let arch = if ptx
        .lines()
        .any(|l| l.trim() == format!(".target {specific}"))
    {
        specific.as_str()
    } else {
        arch
    };
    let valid_arch = arch
        .strip_prefix("sm_")
        .is_some_and(|r| !r.is_empty() && r.chars().all(|c| c.is_ascii_alphanumeric()));
    if !valid_arch {
        return Err(PtxError::PtxasRejected {
            arch: arch.into(),
            message: "the architecture must look like sm_90 or sm_90a".into(),
            line: None,
            text: None,
        });
    }
    let ptxas = find_ptxas()?;
    let io = |source| PtxError::PtxasIo {
        path: ptxas.clone(),
        source,
    };
    let dir = TempDir::new().map_err(io)?;
    let (input, cubin) = (dir.0.join("kernel.ptx"), dir.0.join("kernel.cubin"));
    std::fs::write(&input, ptx).map_err(io)?;
    let out = Command::new(&ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg("-o")
        .arg(&cubin)
        .arg(&input)
        .output()
        .map_err(io)?;
    // Name the input as the user knows it rather than by its temporary path.
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    let text = text.replace(&input.display().to_string(), "kernel.ptx");
    if !out.status.success() {
        return Err(rejection(ptx, arch, &text));
    }
    let mut report = parse_report(&text)?;
    report.cubin = std::fs::read(&cubin).map_err(io)?;
    Ok(report)
}

/// The error for a failed run: its error lines, and the first PTX line they name.
fn rejection(ptx: &str, arch: &str, output: &str) -> PtxError {
    let errors: Vec<&str> = output
        .lines()
        .filter(|l| l.contains("error") || l.contains("fatal"))
        .collect();
    let message = if errors.is_empty() {
        output.trim().to_string()
    } else {
        errors.join("\n")
    };
    let line = errors.iter().find_map(|l| {
        let rest = l.split(", line ").nth(1)?;
        rest.split(';').next()?.trim().parse::<usize>().ok()
    });
    let text = line
        .and_then(|n| ptx.lines().nth(n.checked_sub(1)?))
        .map(str::to_string);
    PtxError::PtxasRejected {
        arch: arch.into(),
        message,
        line,
        text,
    }
}

/// The number just before `unit` on `line`: `count("Used 17 registers", "registers")`.
fn count(line: &str, unit: &str) -> Option<u32> {
    let before = &line[..line.find(unit)?];
    before.split_whitespace().last()?.parse().ok()
}

fn parse_report(output: &str) -> Result<AsmReport, PtxError> {
    let entries: Vec<&str> = output
        .lines()
        .filter_map(|l| {
            l.split("Compiling entry function '")
                .nth(1)?
                .split('\'')
                .next()
        })
        .collect();
    let [kernel] = entries.as_slice() else {
        return Err(PtxError::PtxasReport(format!(
            "expected one entry function, found {}",
            entries.len()
        )));
    };
    let missing = |what: &str| PtxError::PtxasReport(format!("no {what} in:\n{output}"));
    let props = output
        .lines()
        .find(|l| l.contains("bytes stack frame"))
        .ok_or_else(|| missing("stack frame size"))?;
    let usage = output
        .lines()
        .find(|l| l.contains("Used") && l.contains("registers"))
        .ok_or_else(|| missing("register count"))?;
    Ok(AsmReport {
        kernel: kernel.to_string(),
        registers: count(usage, "registers").ok_or_else(|| missing("register count"))?,
        spill_store_bytes: count(props, "bytes spill stores")
            .ok_or_else(|| missing("spill stores"))?,
        spill_load_bytes: count(props, "bytes spill loads")
            .ok_or_else(|| missing("spill loads"))?,
        shared_bytes: count(usage, "bytes smem").unwrap_or(0),
        stack_frame_bytes: count(props, "bytes stack frame")
            .ok_or_else(|| missing("stack frame size"))?,
        warnings: output
            .lines()
            .filter(|l| l.contains("warning"))
            .map(|l| {
                l.split_once("kernel.ptx, ")
                    .map_or(l, |(_, rest)| rest)
                    .trim()
                    .to_string()
            })
            .collect(),
        cubin: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_resource_report() {
        let out = "ptxas info    : 0 bytes gmem\n\
                   ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n    \
                   24 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
                   ptxas info    : Used 17 registers, used 1 barriers, 1024 bytes smem\n";
        let r = parse_report(out).expect("a well-formed report");
        assert_eq!(
            (
                r.kernel.as_str(),
                r.registers,
                r.spill_store_bytes,
                r.spill_load_bytes,
                r.shared_bytes,
                r.stack_frame_bytes
            ),
            ("k", 17, 8, 4, 1024, 24)
        );
    }

    #[test]
    fn locates_the_offending_line() {
        let ptx = "a\nb\nbad line here\nd";
        let out = "ptxas kernel.ptx, line 3; error   : Unknown symbol 'x'\nptxas fatal   : aborted";
        match rejection(ptx, "sm_90", out) {
            PtxError::PtxasRejected {
                line,
                text,
                message,
                ..
            } => {
                assert_eq!(line, Some(3));
                assert_eq!(text.as_deref(), Some("bad line here"));
                assert!(message.contains("Unknown symbol 'x'"), "{message}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
