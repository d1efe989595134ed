//! What the command line tests share: running the `convoy` binary and
//! waiting for a condition.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::path::Path;
use std::process::Stdio;

// Not every test binary waits.
#[allow(unused_imports)]
pub use convoy_runtime::testing::wait_until;
use serde_json::Value;

/// What one run of `convoy` printed and how it exited.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts it exited 0.
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "convoy failed: {self:?}");
        self
    }

    /// Its stdout as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// Runs `convoy ARGS` in `dir` as user `test-op`, stdin closed, without the
/// caller's `CONVOY_REDIS_URL` / `CONVOY_POSTGRES_URL`, with `env` set.
pub async fn run_convoy(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_convoy"));
    cmd.args(args)
        .current_dir(dir)
        .env("USER", "test-op")
        .env_remove("CONVOY_REDIS_URL")
        .env_remove("CONVOY_BROKER_URL")
        .env_remove("CONVOY__BROKER__URL")
        .env_remove("CONVOY_POSTGRES_URL")
        .env_remove("RUST_BACKTRACE")
        .envs(env.iter().copied())
        .stdin(Stdio::null());
    let out = cmd.output().await.expect("run convoy");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).expect("utf-8"),
        stderr: String::from_utf8(out.stderr).expect("utf-8"),
    }
}
