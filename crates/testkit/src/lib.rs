//! Test support shared by quench's test suites (a dev-dependency only).
//!
//! Some tests need something the machine may lack: a real model named by an environment
//! variable (`QUENCH_SMOLLM2_GGUF`, `QUENCH_MINILM_DIR`, `QUENCH_SMOLLM2_WHEEL`) or
//! `ptxas`. Such a test calls [`not_run`] (or [`env`], [`env_path`], [`ok`]) and returns
//! instead of passing silently:
//!
//! - with `CI` set (non-empty), the missing prerequisite is a failure: the test panics;
//! - otherwise it prints `NOT RUN <test>: <reason>` on stderr and returns, so that a
//!   developer without the models can still run the suite.
//!
//! Either way the same line is appended to the file named by `QUENCH_NOT_RUN_LOG`, if set,
//! which is how `scripts/test.sh` counts the tests that did not run.
//!
//! Tests that need a GPU do not use this: they are `#[ignore]`d with a reason and run by
//! `scripts/device/gpu-tests.sh` on a GPU machine, where a missing GPU fails them.

use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;

/// Records that the calling test did not run its checks because of `reason` (what is
/// missing and how to provide it). Panics when `CI` is set; otherwise prints
/// `NOT RUN <test>: <reason>` on stderr and returns, and the caller returns too. The line
/// is appended to `$QUENCH_NOT_RUN_LOG` in both cases. `<test>` is the test's name, which
/// libtest gives the thread it runs the test on.
///
/// ```no_run
/// if std::env::var_os("QUENCH_SMOLLM2_GGUF").is_none() {
///     quench_testkit::not_run("set QUENCH_SMOLLM2_GGUF to the SmolLM2 GGUF file");
///     return;
/// }
/// ```
pub fn not_run(reason: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let line = format!("NOT RUN {test}: {reason}");
    if let Some(log) = std::env::var_os("QUENCH_NOT_RUN_LOG").filter(|p| !p.is_empty()) {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = appended {
            eprintln!("QUENCH_NOT_RUN_LOG={}: {e}", PathBuf::from(log).display());
        }
    }
    if in_ci() {
        panic!("{test}: {reason} (a prerequisite missing in CI is a failure)");
    }
    eprintln!("{line}");
}

/// Whether the environment variable `CI` is set and not empty.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty())
}

/// The value of the environment variable `var`, or `None` after [`not_run`] with the
/// reason "set `var` to `what`" when it is unset or empty.
///
/// ```no_run
/// let Some(path) = quench_testkit::env("QUENCH_SMOLLM2_GGUF", "the SmolLM2 GGUF file") else {
///     return;
/// };
/// ```
pub fn env(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            not_run(&format!("set {var} to {what}"));
            None
        }
    }
}

/// [`env`] as a path.
pub fn env_path(var: &str, what: &str) -> Option<PathBuf> {
    env(var, what).map(PathBuf::from)
}

/// `QUENCH_SMOLLM2_GGUF`, the SmolLM2-135M-Instruct Q4_1 GGUF file, through [`env_path`].
pub fn smollm2_gguf() -> Option<PathBuf> {
    env_path(
        "QUENCH_SMOLLM2_GGUF",
        "SmolLM2-135M-Instruct.Q4_1.gguf (`quench pull smollm2` installs it)",
    )
}

/// `QUENCH_MINILM_DIR`, the all-MiniLM-L6-v2 checkpoint directory, through [`env_path`].
pub fn minilm_dir() -> Option<PathBuf> {
    env_path(
        "QUENCH_MINILM_DIR",
        "the all-MiniLM-L6-v2 directory (`quench pull minilm` installs it)",
    )
}

/// The value of `result`, or `None` after [`not_run`] with its error as the reason: for a
/// lookup such as `quench_ptx::ptxas::find_ptxas()` whose error says what is missing.
pub fn ok<T, E: Display>(result: Result<T, E>) -> Option<T> {
    match result {
        Ok(v) => Some(v),
        Err(e) => {
            not_run(&e.to_string());
            None
        }
    }
}

/// The seed of a test's random inputs: `QUENCH_SEED` if set, else a fresh one. Printed on
/// stderr (`seed N (set QUENCH_SEED=N to replay)`) so that a failure can be replayed.
pub fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let s = std::env::var("QUENCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        // std's hasher keys are random per process and per call: a fresh seed, no crate.
        .unwrap_or_else(|| {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        });
    eprintln!("seed {s} (set QUENCH_SEED={s} to replay)");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test for everything that reads or sets the environment, so nothing races.
    #[test]
    fn a_missing_prerequisite_fails_in_ci_and_is_logged_elsewhere() {
        let saved: Vec<_> = ["CI", "QUENCH_NOT_RUN_LOG", "QUENCH_SEED"]
            .map(|v| (v, std::env::var_os(v)))
            .into();
        let log = std::env::temp_dir().join(format!("quench-testkit-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        std::env::set_var("QUENCH_NOT_RUN_LOG", &log);
        let unset = "QUENCH_TESTKIT_NEVER_SET";
        std::env::remove_var(unset);

        // Outside CI: None, and one line in the log naming this test and the reason.
        std::env::remove_var("CI");
        assert_eq!(env(unset, "anything"), None);
        std::env::set_var("CI", "");
        assert_eq!(ok(Err::<(), _>("no ptxas")), None, "an empty CI is not CI");
        let test = "tests::a_missing_prerequisite_fails_in_ci_and_is_logged_elsewhere";
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            format!("NOT RUN {test}: set {unset} to anything\nNOT RUN {test}: no ptxas\n")
        );

        // In CI: a panic that names the test and the reason, and still a line in the log.
        std::env::set_var("CI", "1");
        let panic = std::panic::catch_unwind(|| env(unset, "the model")).unwrap_err();
        let msg = panic.downcast_ref::<String>().expect("a formatted panic");
        assert_eq!(
            msg,
            &format!(
                "{test}: set {unset} to the model (a prerequisite missing in CI is a failure)"
            )
        );
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 3);

        // What is present is returned, CI or not.
        std::env::set_var(unset, "/a/path");
        assert_eq!(env_path(unset, "x"), Some(PathBuf::from("/a/path")));
        assert_eq!(ok(Ok::<_, String>(7)), Some(7));
        std::env::set_var("QUENCH_SEED", "42");
        assert_eq!(seed(), 42);
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 3);

        std::env::remove_var(unset);
        let _ = std::fs::remove_file(&log);
        for (var, value) in saved {
            match value {
                Some(v) => std::env::set_var(var, v),
                None => std::env::remove_var(var),
            }
        }
    }
}
