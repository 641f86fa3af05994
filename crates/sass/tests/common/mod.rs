//! The library's kernels assembled by ptxas: the corpora the cubin and SASS tests read.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub struct Assembled {
    pub name: String,
    pub cubin: Vec<u8>,
}

/// Every library kernel with its default parameters, through quench's PTX and ptxas; `None`
/// (after `not_run`) when ptxas is missing.
pub fn library() -> Option<&'static [Assembled]> {
    static CORPUS: OnceLock<Option<Vec<Assembled>>> = OnceLock::new();
    CORPUS
        .get_or_init(|| {
            quench_ptx::ptxas::find_ptxas().ok()?;
            let mut out = Vec::new();
            for spec in quench_kernels::library() {
                let params = spec.parse_params("").expect("defaults parse");
                let f = spec.build(&params).expect("library kernel builds");
                let ptx = quench_ptx::emit(&f).expect("library kernel emits PTX");
                let r = quench_ptx::ptxas::assemble(&ptx, "sm_90")
                    .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
                out.push(Assembled {
                    name: spec.name.to_string(),
                    cubin: r.cubin,
                });
            }
            Some(out)
        })
        .as_deref()
        .or_else(|| {
            // Every test that needed the corpus reports that it did not run.
            quench_testkit::ok(quench_ptx::ptxas::find_ptxas());
            None
        })
}

/// nvlink, beside ptxas in the nvidia-cuda-nvcc wheel.
fn nvlink() -> Result<PathBuf, String> {
    let ptxas = quench_ptx::ptxas::find_ptxas().map_err(|e| e.to_string())?;
    let p = ptxas.with_file_name("nvlink");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "nvlink is not beside ptxas at {} (the nvidia-cuda-nvcc wheel has both; scripts/find-ptxas.sh installs it)",
            ptxas.display()
        ))
    }
}

fn run(tool: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", tool.display()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} {args:?}: {}",
            tool.display(),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Every library kernel as the driver's JIT builds it (cuLink: compiled alone, then
/// linked): `ptxas -c`, then nvlink. Unlike ptxas's whole-program cubins, these put the
/// slow paths of division and square root in code sections of their own, which the
/// kernel calls through relocations. `None` (after `not_run`) without ptxas and nvlink.
pub fn linked() -> Option<&'static [Assembled]> {
    static CORPUS: OnceLock<Option<Vec<Assembled>>> = OnceLock::new();
    CORPUS
        .get_or_init(|| {
            let ptxas = quench_ptx::ptxas::find_ptxas().ok()?;
            let nvlink = nvlink().ok()?;
            let mut out = Vec::new();
            for spec in quench_kernels::library() {
                let params = spec.parse_params("").expect("defaults parse");
                let f = spec.build(&params).expect("library kernel builds");
                let ptx = quench_ptx::emit(&f).expect("library kernel emits PTX");
                let dir = quench_sass::tools::TempFile::new("k.ptx", ptx.as_bytes()).unwrap();
                let s = |p: &Path| p.to_string_lossy().into_owned();
                let (obj, cubin) = (
                    dir.path.with_extension("o"),
                    dir.path.with_extension("cubin"),
                );
                run(
                    &ptxas,
                    &["-arch=sm_90", "-c", "-o", &s(&obj), &s(&dir.path)],
                )
                .and_then(|()| run(&nvlink, &["-arch=sm_90", "-o", &s(&cubin), &s(&obj)]))
                .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
                out.push(Assembled {
                    name: spec.name.to_string(),
                    cubin: std::fs::read(&cubin).unwrap(),
                });
            }
            Some(out)
        })
        .as_deref()
        .or_else(|| {
            quench_testkit::ok(nvlink());
            None
        })
}

/// `cuobjdump -elf` on `cubin`: `Err` with its complaint when it refuses the file (as it
/// refused quench's cubins the driver refused), `None` (after `not_run`) without cuobjdump.
pub fn cuobjdump_elf(cubin: &[u8]) -> Option<Result<String, String>> {
    let cuobjdump = quench_testkit::ok(quench_sass::tools::find("cuobjdump"))?;
    let f = quench_sass::tools::TempFile::new("k.cubin", cubin).unwrap();
    let path = f.path.to_string_lossy().into_owned();
    let (ok, out, err) = quench_sass::tools::run(&cuobjdump, &["-elf", &path]).unwrap();
    Some(if ok && !err.contains("Invalid ELF") {
        Ok(out)
    } else {
        Err(err)
    })
}
