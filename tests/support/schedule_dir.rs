//! Where a randomized fault schedule keeps its evidence (the children's
//! logs, the timeline, the violations): shared by `fault_schedules.rs` and
//! `pg_fault_schedules.rs`.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::fs::{self, File};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A new directory `{temp}/{prefix}-{pid}-seed{seed}-{nanos}`.
pub fn log_dir(prefix: &str, seed: u64) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-seed{seed}-{nanos}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).expect("log directory");
    dir
}

/// Writes `text` to `dir/name`, best effort (evidence of a failure must
/// not fail the report).
pub fn write_file(dir: &Path, name: &str, text: &str) {
    if let Ok(mut f) = File::create(dir.join(name)) {
        let _ = f.write_all(text.as_bytes());
    }
}
