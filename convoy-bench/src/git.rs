//! Running `git`: shared by the build script (which records the commit a
//! build is made from) and [`provenance`](crate::provenance).

use std::path::Path;
use std::process::Command;

/// Runs `git -C dir args`: its stdout, trimmed, when it succeeds; `None`
/// when git is missing or fails.
pub(crate) fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
