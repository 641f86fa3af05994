//! Records the git commit the binary was built from, for receipts.
use std::process::Command;

fn main() {
    // GIT_OPTIONAL_LOCKS=0: `git status` must not rewrite .git/index (a rerun trigger below).
    let commit = Command::new("git")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    let dirty = Command::new("git")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    println!("cargo:rustc-env=QUENCH_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=QUENCH_GIT_DIRTY={dirty}");
    // The checkout's own git directory (in a worktree, not `.git` itself): a commit or a
    // change of what is staged touches its HEAD or index.
    let git_dir = Command::new("git")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .args(["rev-parse", "--absolute-git-dir"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(dir) = git_dir {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/index");
    }
    // An edit to any crate's sources changes whether the tree is dirty (a directory is
    // scanned whole for changes).
    println!("cargo:rerun-if-changed=..");
    println!("cargo:rerun-if-changed=../../Cargo.lock");
}
