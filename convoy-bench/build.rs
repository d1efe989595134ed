//! Records the commit the benchmark is built from, so a result file names
//! the code it measured even when the binary runs after the checkout moved
//! on (see `provenance::current_commit`): `CONVOY_BENCH_BUILT_HEAD` (the
//! hash, empty outside a git checkout) and `CONVOY_BENCH_BUILT_DIRTY`
//! (`1` with uncommitted changes, `0` without, empty when unknown).

use std::path::{Path, PathBuf};

#[path = "src/git.rs"]
mod git;

use git::git;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.parent().unwrap_or(&manifest).to_path_buf();
    // Run again when HEAD moves, the index changes or any source of the
    // workspace changes (its crates, the root package's sources and
    // manifests), never for build output. The paths are relative to this
    // package where they can be, so a build of another checkout sharing
    // the target directory watches its own files.
    let in_root = |p: &str| {
        if Path::new(p).is_absolute() {
            PathBuf::from(p)
        } else {
            Path::new("..").join(p)
        }
    };
    let mut watched: Vec<PathBuf> = ["HEAD", "index", "packed-refs"]
        .iter()
        .filter_map(|p| git(&root, &["rev-parse", "--git-path", p]))
        .map(|p| in_root(&p))
        // A missing file would make every build run this again.
        .filter(|p| manifest.join(p).exists())
        .collect();
    if let Some(branch) = git(&root, &["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(&root, &["rev-parse", "--git-path", &branch])
    {
        watched.push(in_root(&p));
    }
    if let Ok(entries) = std::fs::read_dir(&root) {
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            let source = if path.is_dir() {
                path.join("Cargo.toml").exists()
                    || ["src", "tests", "examples"].contains(&name.as_str())
            } else {
                name == "Cargo.toml" || name == "Cargo.lock"
            };
            if source {
                watched.push(in_root(&name));
            }
        }
    }
    for w in watched {
        println!("cargo:rerun-if-changed={}", w.display());
    }
    let head = git(&root, &["rev-parse", "HEAD"]).unwrap_or_default();
    let dirty = match git(&root, &["status", "--porcelain"]) {
        Some(s) if !s.is_empty() => "1",
        Some(_) => "0",
        None => "",
    };
    println!("cargo:rustc-env=CONVOY_BENCH_BUILT_HEAD={head}");
    println!("cargo:rustc-env=CONVOY_BENCH_BUILT_DIRTY={dirty}");
}
