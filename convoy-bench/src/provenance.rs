//! Where a result comes from: the commit it was built from, the date, the
//! command line. Recorded in every report so that a result file kept in
//! `convoy-bench/results/` says what it measured.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::git::git;

/// The commit id when git cannot tell it (no git, not a checkout).
pub const UNKNOWN: &str = "unknown";

/// The commit of the checkout holding `dir`: `git rev-parse HEAD`, with
/// `-dirty` when `git status --porcelain` lists anything; [`UNKNOWN`] when
/// git is missing or fails. Never an error: a result without its commit
/// is still a result.
pub fn commit_id(dir: &Path) -> String {
    let head = git(dir, &["rev-parse", "HEAD"]);
    let status = git(dir, &["status", "--porcelain"]);
    describe_commit(head.as_deref(), status.as_deref())
}

/// The commit this binary was built from (recorded by the build script),
/// falling back to the working directory's checkout when the build was not
/// in one.
pub fn current_commit() -> String {
    let built = built_commit(
        option_env!("CONVOY_BENCH_BUILT_HEAD"),
        option_env!("CONVOY_BENCH_BUILT_DIRTY"),
    );
    if built != UNKNOWN {
        return built;
    }
    std::env::current_dir().map_or_else(|_| UNKNOWN.to_owned(), |d| commit_id(&d))
}

/// The commit the build script recorded: `head` (the hash), `-dirty` when
/// `dirty` is `1` (the build's checkout had uncommitted changes);
/// [`UNKNOWN`] without a hash.
pub fn built_commit(head: Option<&str>, dirty: Option<&str>) -> String {
    let porcelain = dirty.map(|d| if d == "1" { "uncommitted changes" } else { "" });
    describe_commit(head, porcelain)
}

/// The commit id from `git rev-parse HEAD`'s output and `git status
/// --porcelain`'s: the hash, `-dirty` appended when the status lists
/// anything, [`UNKNOWN`] when there is no hash. A status that could not be
/// read leaves the hash as it is.
pub fn describe_commit(head: Option<&str>, porcelain: Option<&str>) -> String {
    let Some(hash) = head.map(str::trim).filter(|h| is_hash(h)) else {
        return UNKNOWN.to_owned();
    };
    match porcelain {
        Some(s) if !s.trim().is_empty() => format!("{hash}-dirty"),
        _ => hash.to_owned(),
    }
}

/// A full hex commit hash (SHA-1 or SHA-256).
fn is_hash(s: &str) -> bool {
    matches!(s.len(), 40 | 64) && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Now, in UTC (`2026-12-01T09:30:00Z`).
pub fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc_timestamp(secs)
}

/// `secs` since the Unix epoch as an ISO 8601 UTC timestamp.
pub fn utc_timestamp(secs: u64) -> String {
    let at = i64::try_from(secs)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok());
    match at {
        Some(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        None => format!("{secs} s after 1970-01-01T00:00:00Z"),
    }
}

/// This process's command line, the program as its file name
/// (`convoy-bench throughput --keys 64`), arguments quoted for a shell
/// where they need it.
pub fn command_line() -> String {
    command_line_of(std::env::args())
}

/// [`command_line`] of the given arguments (the program first).
pub fn command_line_of(args: impl IntoIterator<Item = String>) -> String {
    let mut args = args.into_iter();
    let program = args
        .next()
        .map(|p| {
            Path::new(&p)
                .file_name()
                .map_or(p.clone(), |n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "convoy-bench".to_owned());
    std::iter::once(program)
        .chain(args.map(|a| shell_quote(&a)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `arg` as a shell word: as it is when it holds only safe characters,
/// else in single quotes.
fn shell_quote(arg: &str) -> String {
    let safe = |c: char| c.is_ascii_alphanumeric() || "-_./=,:@%+".contains(c);
    if !arg.is_empty() && arg.chars().all(safe) {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH: &str = "53c0a07d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b";

    #[test]
    fn the_commit_id_is_the_hash_dirty_when_the_status_lists_files() {
        let head = format!("{HASH}\n");
        assert_eq!(describe_commit(Some(&head), Some("")), HASH);
        assert_eq!(describe_commit(Some(&head), Some("\n")), HASH);
        assert_eq!(
            describe_commit(Some(&head), Some(" M convoy-bench/src/main.rs\n")),
            format!("{HASH}-dirty")
        );
        assert_eq!(
            describe_commit(Some(&head), Some("?? new.txt\n")),
            format!("{HASH}-dirty")
        );
        // The status could not be read: the hash alone.
        assert_eq!(describe_commit(Some(&head), None), HASH);
    }

    #[test]
    fn the_built_commit_is_the_recorded_hash_dirty_when_the_build_was() {
        assert_eq!(built_commit(Some(HASH), Some("0")), HASH);
        assert_eq!(built_commit(Some(HASH), Some("1")), format!("{HASH}-dirty"));
        assert_eq!(built_commit(Some(HASH), Some("")), HASH);
        assert_eq!(built_commit(Some(""), Some("1")), UNKNOWN);
        assert_eq!(built_commit(None, None), UNKNOWN);
    }

    /// This binary's build recorded the commit of this checkout.
    #[test]
    fn this_build_recorded_its_checkout_commit() {
        let recorded = built_commit(
            option_env!("CONVOY_BENCH_BUILT_HEAD"),
            option_env!("CONVOY_BENCH_BUILT_DIRTY"),
        );
        let checkout = git(
            Path::new(env!("CARGO_MANIFEST_DIR")),
            &["rev-parse", "HEAD"],
        );
        match checkout {
            Some(head) => assert_eq!(recorded.trim_end_matches("-dirty"), head.trim()),
            None => assert_eq!(recorded, UNKNOWN),
        }
    }

    #[test]
    fn without_a_hash_the_commit_is_unknown() {
        assert_eq!(describe_commit(None, None), UNKNOWN);
        assert_eq!(describe_commit(None, Some(" M x")), UNKNOWN);
        assert_eq!(describe_commit(Some(""), Some("")), UNKNOWN);
        assert_eq!(describe_commit(Some("HEAD\n"), Some("")), UNKNOWN);
        assert_eq!(
            describe_commit(Some("fatal: not a git repository"), None),
            UNKNOWN
        );
    }

    /// A fresh empty directory under the system's temporary directory.
    fn scratch_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "convoy-bench-{name}-{}-{}",
            std::process::id(),
            now_utc().replace(':', "")
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        dir
    }

    #[test]
    fn the_commit_of_a_git_checkout_and_of_a_plain_directory() {
        let dir = scratch_dir("commit");
        // Not a checkout (the temporary directory is not in one): unknown.
        assert_eq!(commit_id(&dir), UNKNOWN);
        let run = |args: &[&str]| git(&dir, args).is_some();
        if !run(&["init", "-q"]) {
            // No git here: the unknown case above is all there is to check.
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        std::fs::write(dir.join("a.txt"), "a\n").expect("write a.txt");
        assert!(run(&["add", "a.txt"]));
        assert!(run(&[
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
            "-c",
            "commit.gpgsign=false",
            "commit",
            "-q",
            "-m",
            "one"
        ]));
        let clean = commit_id(&dir);
        assert!(is_hash(&clean), "{clean}");
        std::fs::write(dir.join("a.txt"), "b\n").expect("change a.txt");
        assert_eq!(commit_id(&dir), format!("{clean}-dirty"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn timestamps_are_utc_dates() {
        assert_eq!(utc_timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_timestamp(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_timestamp(1_798_761_599), "2026-12-31T23:59:59Z");
        assert_eq!(utc_timestamp(1_709_210_096), "2024-02-29T12:34:56Z");
    }

    #[test]
    fn the_command_line_names_the_program_and_quotes_what_needs_it() {
        let args = [
            "/var/tmp/target/release/convoy-bench",
            "throughput",
            "--keys",
            "64,1024",
            "--out",
            "results/a b.json",
            "it's",
        ]
        .map(String::from);
        assert_eq!(
            command_line_of(args),
            r"convoy-bench throughput --keys 64,1024 --out 'results/a b.json' 'it'\''s'"
        );
    }
}
