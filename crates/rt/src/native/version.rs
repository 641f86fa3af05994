//! Which NVIDIA kernel module is loaded, from `/proc/driver/nvidia/version`, and whether
//! the native backend can talk to it.
//!
//! The module writes one line about itself there, for example
//!
//! ```text
//! NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (user@host)  <date>
//! NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  <date>
//! ```
//!
//! The first is the open module (kernel-open in open-gpu-kernel-modules), the second
//! the proprietary one.

use std::io;
use std::path::Path;

use super::error::NativeError;

/// Where the loaded module describes itself.
pub const PROC_VERSION: &str = "/proc/driver/nvidia/version";

/// The driver branches (the version's first number) whose resource-manager structures
/// match the layouts in this module's siblings. They were compared, struct by struct,
/// across every 580 and 590 release of open-gpu-kernel-modules; the 575 branch and
/// older have a shorter FB info list, and the 595 branch a shorter name string.
pub const KNOWN_BRANCHES: &[u32] = &[580, 590];

/// The kernel module that is loaded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedModule {
    /// The driver version, e.g. "580.159.04": what the version handshake announces.
    pub version: String,
    /// NVIDIA's open kernel module, rather than the proprietary one.
    pub open: bool,
}

/// The module described by `text`, the contents of [`PROC_VERSION`].
pub fn parse(text: &str, path: &str) -> Result<LoadedModule, NativeError> {
    let unrecognized = || NativeError::VersionUnrecognized {
        path: path.to_string(),
        excerpt: text
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(120)
            .collect(),
    };
    let line = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("NVRM version:"))
        .ok_or_else(unrecognized)?;
    let (before, after) = line.split_once("Kernel Module").ok_or_else(unrecognized)?;
    let version = after
        .split_whitespace()
        .find(|w| is_version(w))
        .ok_or_else(unrecognized)?;
    Ok(LoadedModule {
        version: version.to_string(),
        open: before.split_whitespace().last() == Some("Open"),
    })
}

/// "580.159.04", "580.142": numbers joined by dots, at least two, short.
fn is_version(word: &str) -> bool {
    let mut parts = word.split('.');
    word.len() <= 32
        && parts.clone().count() >= 2
        && parts.all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

impl LoadedModule {
    /// The module, if the native backend can use it: the open module, of a branch
    /// whose structures quench knows.
    pub fn usable(self) -> Result<Self, NativeError> {
        if !self.open {
            return Err(NativeError::ProprietaryModule {
                version: self.version,
            });
        }
        let branch = self.version.split('.').next().and_then(|b| b.parse().ok());
        if !branch.is_some_and(|b| KNOWN_BRANCHES.contains(&b)) {
            let known: Vec<String> = KNOWN_BRANCHES.iter().map(u32::to_string).collect();
            return Err(NativeError::UnsupportedDriver {
                version: self.version,
                known: known.join(" and "),
            });
        }
        Ok(self)
    }
}

/// Reads and checks the module described at `path`.
pub fn loaded_module(path: &Path) -> Result<LoadedModule, NativeError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => NativeError::ModuleNotLoaded {
            path: shown.clone(),
        },
        _ => NativeError::VersionUnreadable {
            path: shown.clone(),
            message: e.to_string(),
        },
    })?;
    parse(&text, &shown)?.usable()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPEN: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  \
        Release Build  (dvs-builder@U22-I3-B17-02-5)  Thu Nov 13 05:06:01 UTC 2025\n\
        GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n";
    const OPEN_ARM: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  \
        590.48.01  Release Build  (dvs-builder@U16-I1-N07-12-3)  Mon Dec  1 10:00:00 UTC 2025\n";
    const PROPRIETARY: &str = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  \
        Tue Sep 23 09:24:52 UTC 2025\n\
        GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n";

    fn parsed(text: &str) -> Result<LoadedModule, NativeError> {
        parse(text, PROC_VERSION)
    }

    #[test]
    fn the_open_module_is_recognised_with_its_version() {
        let m = parsed(OPEN).unwrap();
        assert_eq!(
            m,
            LoadedModule {
                version: "580.159.04".into(),
                open: true
            }
        );
        assert_eq!(m.clone().usable(), Ok(m));
        let arm = parsed(OPEN_ARM).unwrap();
        assert_eq!((arm.version.as_str(), arm.open), ("590.48.01", true));
    }

    #[test]
    fn the_proprietary_module_is_refused_by_name() {
        let m = parsed(PROPRIETARY).unwrap();
        assert_eq!((m.version.as_str(), m.open), ("580.95.05", false));
        let err = m.usable().unwrap_err();
        assert_eq!(
            err,
            NativeError::ProprietaryModule {
                version: "580.95.05".into()
            }
        );
        let text = err.to_string();
        assert!(text.contains("needs NVIDIA's open kernel module"), "{text}");
        assert!(text.contains("580.95.05"), "{text}");
    }

    #[test]
    fn two_part_versions_parse() {
        let text = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.142  \
            Release Build  (user@host)  Fri Jan 16 00:00:00 UTC 2026\n";
        let m = parsed(text).unwrap();
        assert_eq!(m.version, "580.142");
    }

    #[test]
    fn other_branches_are_refused_naming_both() {
        for version in ["575.64.05", "595.45.04", "1000.1"] {
            let err = LoadedModule {
                version: version.into(),
                open: true,
            }
            .usable()
            .unwrap_err();
            let text = err.to_string();
            assert!(text.contains(version), "{text}");
            assert!(text.contains("580 and 590"), "{text}");
        }
    }

    #[test]
    fn garbage_is_an_error_that_quotes_it() {
        for text in [
            "",
            "hello\n",
            "NVRM version: something else entirely\n",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  Release Build\n",
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64 580. 1.2.\n",
            "GCC version: 12.3\n",
        ] {
            let err = parsed(text).unwrap_err();
            let NativeError::VersionUnrecognized { path, excerpt } = &err else {
                panic!("{text:?} gave {err:?}")
            };
            assert_eq!(path, PROC_VERSION);
            assert_eq!(excerpt, text.lines().next().unwrap_or(""));
        }
    }

    #[test]
    fn a_missing_version_file_means_no_module() {
        let path = Path::new("/nonexistent/quench/driver/nvidia/version");
        let err = loaded_module(path).unwrap_err();
        assert_eq!(
            err,
            NativeError::ModuleNotLoaded {
                path: path.display().to_string()
            }
        );
        assert!(err.to_string().contains("not loaded"));
    }
}
