//! Running in production (issue 13): configuration that cannot silently
//! fall back, the start-up log, environment overrides, handlers that are
//! declared but not run, stable handler names, error classes, command
//! replies, per-handler concurrency and the engine's health.
//!
//! The Redis cases start their own `redis-server` (`RedisServer`).

#[path = "support/names.rs"]
mod names;

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use convoy_runtime::testing::RedisServer;
use convoy_runtime::{
    Aggregate, Command, Config, Context, Domain, Error, Event, HandlerError, InlineBroker, Problem,
    command_handler, event_handler,
};
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------- domain

#[derive(Aggregate)]
#[aggregate(category = "acct")]
struct Account;

/// Partitioned by `account_id`.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Account)]
struct Posted {
    account_id: String,
    n: u64,
    /// `permanent` / `transient`: the handler fails this way.
    fail: Option<String>,
}

#[derive(Aggregate)]
#[aggregate(category = "note")]
struct Note;

/// Unpartitioned: an ordinary consumer group on `note`.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Note)]
struct Noted {
    text: String,
    fail: Option<String>,
}

#[derive(Command, Serialize, Deserialize, Debug)]
#[command(part_of = Account, reply = u64)]
struct Open {
    account_id: String,
}

#[derive(Command, Serialize, Deserialize, Debug)]
#[command(part_of = Account)]
struct Close {
    account_id: String,
}

/// What the handlers saw.
#[derive(Default)]
struct Seen {
    /// Attempts per event (`account#n`, or the note's text).
    attempts: Mutex<HashMap<String, u32>>,
    /// Events in flight now, and the most ever at once.
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    handled: AtomicUsize,
    /// The handler name its context carried.
    names: Mutex<Vec<String>>,
}

impl Seen {
    fn attempt(&self, id: &str) -> u32 {
        let mut a = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        let n = a.entry(id.to_owned()).or_default();
        *n += 1;
        *n
    }

    fn attempts(&self, id: &str) -> u32 {
        let a = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        a.get(id).copied().unwrap_or(0)
    }
}

fn fail(how: Option<&str>, what: &str) -> Result<(), HandlerError> {
    match how {
        Some("permanent") => Err(HandlerError::permanent(format!("{what} can never work"))),
        Some(_) => Err(HandlerError::msg(format!("{what} failed this time"))),
        None => Ok(()),
    }
}

/// Partitioned, with a stable name: its consumer group is
/// `ledger-projector` wherever the type lives.
struct Projector {
    seen: Arc<Seen>,
    work: Duration,
}

#[event_handler(part_of = Account, sequential_by = "account_id", name = "ledger-projector")]
impl Projector {
    #[handle]
    async fn posted(&self, e: Posted, ctx: &Context) -> Result<(), HandlerError> {
        self.seen.attempt(&format!("{}#{}", e.account_id, e.n));
        self.seen
            .names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ctx.handler().to_owned());
        let now = self.seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.work).await;
        self.seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        fail(e.fail.as_deref(), "posting")?;
        self.seen.handled.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Ordinary (unpartitioned) handler.
struct Notebook {
    seen: Arc<Seen>,
}

#[event_handler(part_of = Note)]
impl Notebook {
    #[handle]
    async fn noted(&self, e: Noted) -> Result<(), HandlerError> {
        self.seen.attempt(&e.text);
        fail(e.fail.as_deref(), "noting")?;
        self.seen.handled.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Declared, and passed to no domain of the tests below except where said.
struct Forgotten;

#[event_handler(part_of = Note, name = "forgotten-handler")]
impl Forgotten {
    #[handle]
    async fn noted(&self, _e: Noted) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// The handler's own error type, to downcast.
#[derive(Debug, PartialEq)]
struct Refused {
    account: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "account {} is frozen", self.account)
    }
}

impl std::error::Error for Refused {}

struct Desk;

#[command_handler(part_of = Account)]
impl Desk {
    #[handle]
    async fn open(&self, c: Open) -> Result<u64, Refused> {
        if c.account_id == "frozen" {
            return Err(Refused {
                account: c.account_id,
            });
        }
        Ok(c.account_id.len() as u64)
    }

    /// Existing `Result<(), E>` command handlers compile as they are.
    #[handle]
    async fn close(&self, _c: Close) -> Result<(), HandlerError> {
        Ok(())
    }
}

// --------------------------------------------------------------- helpers

fn fast(url: &str) -> Config {
    let mut c = Config::default();
    c.broker.url = url.to_owned();
    c.server.partitioning.lease_ttl_ms = 2000;
    c.server.partitioning.heartbeat_interval_seconds = Some(0.3);
    c.server.retry.max_retries = 3;
    c.server.retry.initial_backoff_ms = 10;
    c.server.retry.max_backoff_ms = 20;
    c
}

/// A domain running only the `ledger-projector` handler, doing no work.
fn projector_domain(config: Config, seen: Arc<Seen>) -> Domain {
    Domain::builder()
        .config(config)
        .handler(Projector {
            seen,
            work: Duration::ZERO,
        })
        .without_discovery()
        .init()
        .expect("init")
}

fn redis() -> RedisServer {
    RedisServer::start().expect("redis-server (apt-get install redis-server)")
}

async fn raise_all<E: Event + Clone>(domain: &Domain, events: &[E]) {
    let mut uow = domain.unit_of_work();
    for e in events {
        uow.raise(e.clone()).expect("raise");
    }
    uow.commit().await.expect("commit");
}

async fn wait_until(timeout: Duration, what: &str, mut f: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !f().await {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn posted(account: &str, n: u64, fail: Option<&str>) -> Posted {
    Posted {
        account_id: account.to_owned(),
        n,
        fail: fail.map(str::to_owned),
    }
}

/// Log lines written while `f` runs (tracing, INFO and up, no colours).
fn logs_of<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text =
        String::from_utf8_lossy(&buf.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    (out, text)
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("convoy-prod-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// [`temp_dir`] `name` and its `domain.toml`, of `text`.
fn config_file(name: &str, text: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = temp_dir(name);
    let file = dir.join("domain.toml");
    std::fs::write(&file, text).expect("write");
    (dir, file)
}

/// This test binary again, running only `env_child` over `file`, with
/// `env` set.
fn run_env_child(file: &std::path::Path, env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "env_child", "--nocapture", "--test-threads=1"])
        .env("CONVOY_TEST_ENV_FILE", file)
        .envs(env.iter().copied())
        .output()
        .expect("run the child")
}

// ------------------------------------------------ configuration, start-up

#[test]
fn config_file_with_a_missing_path_is_an_error_naming_it() {
    let err = Domain::builder()
        .config_file("/nonexistent/convoy/domain.toml")
        .init()
        .expect_err("a missing file is not the defaults");
    match &err {
        Error::Config { file, message } => {
            assert_eq!(file, "/nonexistent/convoy/domain.toml");
            assert!(message.contains("does not exist"), "{message}");
            assert!(message.contains("Config::default()"), "{message}");
        }
        other => panic!("expected Error::Config, got {other:?}"),
    }
    // Running on the defaults stays possible, and says so.
    let d = Domain::builder()
        .config(Config::default())
        .without_discovery()
        .init()
        .expect("explicit defaults");
    assert_eq!(d.broker().name(), "inline");
}

#[test]
fn out_of_range_values_in_the_file_are_rejected_at_load_naming_key_and_file() {
    let dir = temp_dir("range");
    let file = dir.join("domain.toml");
    for (text, key) in [
        (
            "[server.partitioning]\npoll_interval_seconds = 1e300\n",
            "poll_interval_seconds",
        ),
        (
            "[server.partitioning]\nheartbeat_interval_seconds = 0.000001\n",
            "heartbeat_interval_seconds",
        ),
        (
            "[server.partitioning]\nlease_ttl_ms = 9223372036854775000\n",
            "lease_ttl_ms",
        ),
    ] {
        std::fs::write(&file, text).expect("write");
        let err = Domain::builder()
            .config_file(&file)
            .init()
            .expect_err(text)
            .to_string();
        assert!(err.contains(key), "{err}");
        assert!(err.contains("out of range"), "{err}");
        assert!(err.contains(&file.display().to_string()), "{err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tls_ca_file_errors_name_the_config_file_and_the_ca_file() {
    let (dir, file) = config_file(
        "tls",
        "[broker]\nurl = \"rediss://127.0.0.1:1/\"\ntls_ca_file = \"/nonexistent/ca.pem\"\n",
    );
    let err = Domain::builder()
        .config_file(&file)
        .without_discovery()
        .init()
        .expect_err("the CA file is missing");
    match &err {
        Error::Config {
            file: shown,
            message,
        } => {
            assert!(shown.starts_with(&file.display().to_string()), "{shown}");
            assert_ne!(shown, "<code>");
            assert!(message.contains("/nonexistent/ca.pem"), "{message}");
            assert!(message.contains("tls_ca_file"), "{message}");
        }
        other => panic!("expected Error::Config, got {other:?}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The child half of `environment_overrides_the_file_with_documented_precedence`:
/// runs only in the child process, which has the variables set.
#[test]
fn env_child() {
    let Ok(file) = std::env::var("CONVOY_TEST_ENV_FILE") else {
        return;
    };
    let d = Domain::builder()
        .config_file(&file)
        .without_discovery()
        .init()
        .expect("init");
    assert_eq!(
        d.broker().name(),
        "redis",
        "CONVOY_BROKER_URL over [broker] url"
    );
    assert_eq!(d.instance_id(), "replica-7", "CONVOY_INSTANCE_ID");
    let p = &d.config().server.partitioning;
    assert_eq!(p.lease_ttl_ms, 6000, "CONVOY__... over the file");
    assert_eq!(p.reap_idle_ms, 5000, "the file over the defaults");
    assert_eq!(p.max_unacked, 1, "the defaults");
    // Code is explicit: `.instance_id(..)` wins.
    let d = Domain::builder()
        .config_file(&file)
        .instance_id("from-code")
        .without_discovery()
        .init()
        .expect("init");
    assert_eq!(d.instance_id(), "from-code");
    // No configuration at all: the defaults with the environment.
    let d = Domain::builder().without_discovery().init().expect("init");
    assert_eq!(d.broker().name(), "redis");
    // A configuration given in code is used as given.
    let d = Domain::builder()
        .config(Config::default())
        .without_discovery()
        .init()
        .expect("init");
    assert_eq!(d.broker().name(), "inline");
    println!("env child: every override checked");
}

#[test]
fn environment_overrides_the_file_with_documented_precedence() {
    let (dir, file) = config_file(
        "env",
        "[broker]\nurl = \"inline\"\n[server.partitioning]\nlease_ttl_ms = 3000\nreap_idle_ms = 5000\n",
    );
    let out = run_env_child(
        &file,
        &[
            ("CONVOY_BROKER_URL", "redis://:pw@127.0.0.1:1/"),
            ("CONVOY_INSTANCE_ID", "replica-7"),
            ("CONVOY__SERVER__PARTITIONING__LEASE_TTL_MS", "6000"),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("every override checked"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A bad override fails naming the variable.
    let out = run_env_child(
        &file,
        &[(
            "CONVOY__SERVER__PARTITIONING__POLL_INTERVAL_SECONDS",
            "1e300",
        )],
    );
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("CONVOY__SERVER__PARTITIONING__POLL_INTERVAL_SECONDS"),
        "{all}"
    );
    assert!(
        all.contains("poll_interval_seconds = 1e300 is out of range"),
        "{all}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test]
async fn the_engine_logs_its_broker_instance_and_handlers_at_start() {
    let seen = Arc::new(Seen::default());
    let domain = Domain::builder()
        .config(fast("redis://operator:s3cret@127.0.0.1:1/0"))
        .instance_id("replica-3")
        .handler(Projector {
            seen: seen.clone(),
            work: Duration::ZERO,
        })
        .handler(Notebook { seen })
        .without_discovery()
        .init()
        .expect("init");
    let (handle, logs) = logs_of(|| domain.engine().spawn());
    handle.token().cancel();
    let line = logs
        .lines()
        .find(|l| l.contains("engine starting"))
        .unwrap_or_else(|| panic!("no start line in:\n{logs}"));
    assert!(line.contains(" INFO "), "{line}");
    assert!(
        line.contains("redis://operator:***@127.0.0.1:1/0"),
        "{line}"
    );
    assert!(!line.contains("s3cret"), "{line}");
    assert!(line.contains("replica-3"), "{line}");
    assert!(line.contains("ledger-projector"), "{line}");
    assert!(line.contains("Notebook"), "{line}");
    let _ = tokio::time::timeout(Duration::from_secs(10), handle.shutdown()).await;
}

// -------------------------------------------------------------- handlers

#[test]
fn a_declared_handler_that_is_not_run_is_a_warning_or_an_error() {
    let seen = Arc::new(Seen::default());
    let (domain, logs) = logs_of(|| {
        Domain::builder()
            .config(Config::default())
            .handler(Notebook { seen: seen.clone() })
            .init()
    });
    domain.expect("a warning only");
    let warning = logs
        .lines()
        .find(|l| l.contains("forgotten-handler"))
        .unwrap_or_else(|| panic!("no warning in:\n{logs}"));
    assert!(warning.contains(" WARN "), "{warning}");
    assert!(warning.contains("does not run it"), "{warning}");
    assert!(
        warning.contains("Domain::builder().handler(..)"),
        "{warning}"
    );
    assert!(
        !logs
            .lines()
            .any(|l| l.contains("Notebook") && l.contains("does not run")),
        "{logs}"
    );

    let err = Domain::builder()
        .config(Config::default())
        .handler(Notebook { seen: seen.clone() })
        .require_all_handlers()
        .init()
        .expect_err("required");
    assert!(
        err.problems().iter().any(|p| matches!(
            p,
            Problem::HandlerNotRun { handler, .. } if handler == "forgotten-handler"
        )),
        "{err}"
    );
    Domain::builder()
        .config(Config::default())
        .handler(Notebook { seen: seen.clone() })
        .handler(Forgotten)
        .handler(Projector {
            seen,
            work: Duration::ZERO,
        })
        .require_all_handlers()
        .init()
        .expect("every handler of the binary runs");
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One `domain.toml` serves every binary of a service: settings of a
/// handler this process does not run (a writer's) are a warning naming it
/// and what this process runs, not an error.
#[test]
fn handler_settings_of_a_handler_run_elsewhere_are_a_warning() {
    let seen = Arc::new(Seen::default());
    let config =
        Config::from_toml("[handlers.\"ledger-projecter\"]\nconcurrency = 4\n").expect("toml");
    let buffer = Buffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        Domain::builder()
            .config(config)
            .handler(Projector {
                seen,
                work: Duration::ZERO,
            })
            .without_discovery()
            .init()
            .expect("settings for a handler run elsewhere are no error")
    });
    let logged = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf-8");
    let line = logged
        .lines()
        .find(|l| l.contains("ledger-projecter"))
        .unwrap_or_else(|| panic!("a warning names the entry: {logged}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("runs: ledger-projector"), "{line}");
}

#[tokio::test]
async fn an_explicit_handler_name_is_the_consumer_group_and_the_context_name() {
    let server = redis();
    let seen = Arc::new(Seen::default());
    let domain = projector_domain(fast(&server.url()), seen.clone());
    assert_eq!(domain.registry().handlers()[0].name, "ledger-projector");
    let engine = domain.engine().spawn();
    raise_all(&domain, &[posted("a1", 0, None)]).await;
    wait_until(Duration::from_secs(15), "the event handled", async || {
        seen.handled.load(Ordering::SeqCst) == 1
    })
    .await;
    let mut conn = server.connection().await.expect("connect");
    let groups: Vec<String> = redis::cmd("SMEMBERS")
        .arg(names::groups("acct", "a1"))
        .query_async(&mut conn)
        .await
        .expect("groups");
    assert_eq!(groups, ["ledger-projector"]);
    let lease: Option<String> = redis::cmd("GET")
        .arg(names::lease("ledger-projector", "acct", "a1"))
        .query_async(&mut conn)
        .await
        .expect("lease");
    assert!(lease.is_some(), "the lease is named after the handler");
    assert_eq!(
        *seen.names.lock().unwrap_or_else(|e| e.into_inner()),
        ["ledger-projector"]
    );
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_shard_count_other_than_the_recorded_one_stops_the_engine_and_the_publisher() {
    let server = redis();
    let make = |shards: Option<u32>| {
        let mut config = fast(&server.url());
        if let Some(n) = shards {
            config.broker.category_shards.insert("acct".into(), n);
        }
        projector_domain(config, Arc::new(Seen::default()))
    };
    // The first engine records 16 (the default) for `acct`.
    let first = make(None);
    let engine = first.engine().spawn();
    raise_all(&first, &[posted("a1", 0, None)]).await;
    engine.shutdown().await.expect("shutdown");
    let mut conn = server.connection().await.expect("connect");
    let recorded: u32 = redis::cmd("GET")
        .arg(convoy_runtime::redis::keys::shards("acct"))
        .query_async(&mut conn)
        .await
        .expect("recorded");
    assert_eq!(recorded, 16);
    // An engine configured with 8 refuses to start, naming both counts.
    let other = make(Some(8));
    let e = tokio::time::timeout(
        Duration::from_secs(10),
        other.engine().run_until(std::future::pending::<()>()),
    )
    .await
    .expect("the engine stops at once")
    .expect_err("a shard count other than the recorded one")
    .to_string();
    assert!(e.contains("has 16 shards in Redis"), "{e}");
    assert!(e.contains("configured with 8"), "{e}");
    // So does its publisher: nothing goes to another shard's stream.
    let mut uow = other.unit_of_work();
    uow.raise(posted("a1", 1, None)).expect("raise");
    uow.commit().await.expect("commit");
    let e = convoy_runtime::outbox::OutboxProcessor::new(
        other.outbox().clone(),
        other.broker().clone(),
        other.config().server.priority_lanes.clone(),
        other.instance_id(),
        Arc::new(tokio::sync::Notify::new()),
    )
    .drain()
    .await
    .expect_err("publishing with another count")
    .to_string();
    assert!(e.contains("configured with 8"), "{e}");
}

#[tokio::test]
async fn a_permanent_error_halts_a_partition_at_once_and_health_reports_it() {
    let mut server = redis();
    let seen = Arc::new(Seen::default());
    let domain = projector_domain(fast(&server.url()), seen.clone());
    let engine = domain.engine().spawn();
    raise_all(
        &domain,
        &[
            posted("p1", 0, Some("permanent")),
            posted("p1", 1, None),
            posted("t1", 0, Some("transient")),
            posted("ok", 0, None),
        ],
    )
    .await;
    wait_until(
        Duration::from_secs(15),
        "p1 halted and t1 retried",
        async || {
            let h = engine.health().await;
            h.halted_units == 2 && h.owned_units == 3
        },
    )
    .await;
    assert_eq!(seen.attempts("p1#0"), 1, "a permanent error is not retried");
    assert_eq!(
        seen.attempts("p1#1"),
        0,
        "nothing behind the halted head runs"
    );
    assert_eq!(
        seen.attempts("t1#0"),
        4,
        "a transient error: 1 attempt + max_retries = 3"
    );
    let mut conn = server.connection().await.expect("connect");
    let reason: Option<String> = redis::cmd("HGET")
        .arg(names::unit("ledger-projector", "acct", "p1"))
        .arg("halt_reason")
        .query_async(&mut conn)
        .await
        .expect("unit state");
    assert_eq!(reason.as_deref(), Some("permanent error"));
    let health = engine.health().await;
    assert!(
        health.connected && health.running && health.is_ready(),
        "{health:?}"
    );
    assert!(health.any_halted(), "{health:?}");
    // Redis gone: not connected, so not ready.
    server.stop().expect("stop redis");
    let health = engine.health().await;
    assert!(!health.connected && !health.is_ready(), "{health:?}");
    engine.token().cancel();
    assert!(!engine.health().await.running);
    let _ = tokio::time::timeout(Duration::from_secs(10), engine.shutdown()).await;
}

#[tokio::test]
async fn a_permanent_error_dead_letters_an_ordinary_handler_event_at_once() {
    let server = redis();
    let seen = Arc::new(Seen::default());
    let domain = Domain::builder()
        .config(fast(&server.url()))
        .handler(Notebook { seen: seen.clone() })
        .without_discovery()
        .init()
        .expect("init");
    let engine = domain.engine().spawn();
    let noted = |text: &str, fail: Option<&str>| Noted {
        text: text.to_owned(),
        fail: fail.map(str::to_owned),
    };
    raise_all(
        &domain,
        &[noted("bad", Some("permanent")), noted("good", None)],
    )
    .await;
    wait_until(
        Duration::from_secs(15),
        "the good note handled",
        async || seen.handled.load(Ordering::SeqCst) == 1,
    )
    .await;
    let mut conn = server.connection().await.expect("connect");
    let dead: u64 = redis::cmd("XLEN")
        .arg(names::category_dlq("note"))
        .query_async(&mut conn)
        .await
        .expect("dlq");
    assert_eq!(dead, 1);
    assert_eq!(seen.attempts("bad"), 1, "dead-lettered without a retry");
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn on_the_inline_broker_a_permanent_error_dead_letters_at_once_and_others_retry() {
    let seen = Arc::new(Seen::default());
    let mut config = Config::default();
    config.server.retry.max_retries = 2;
    config.server.retry.initial_backoff_ms = 1;
    config.server.retry.max_backoff_ms = 1;
    // The broker is shared with the domain, so its dead letters can be
    // read here.
    let inline = Arc::new(InlineBroker::new());
    let domain = Domain::builder()
        .config(config)
        .broker_arc(inline.clone())
        .handler(Notebook { seen: seen.clone() })
        .without_discovery()
        .init()
        .expect("init");
    let noted = |text: &str, fail: &str| Noted {
        text: text.to_owned(),
        fail: Some(fail.to_owned()),
    };
    raise_all(&domain, &[noted("p", "permanent"), noted("t", "transient")]).await;
    domain.engine().run_until_idle().await.expect("run");
    assert_eq!(seen.attempts("p"), 1);
    assert_eq!(seen.attempts("t"), 3, "1 attempt + max_retries = 2");
    assert_eq!(inline.dead_letters().len(), 2);
}

#[tokio::test]
async fn a_command_handler_returns_its_reply_and_its_error_as_the_source() {
    let domain = Domain::builder()
        .config(Config::default())
        .command_handler(Desk)
        .without_discovery()
        .init()
        .expect("init");
    let reply: u64 = domain
        .process(Open {
            account_id: "acct-1".into(),
        })
        .await
        .expect("opened");
    assert_eq!(reply, 6);
    let () = domain
        .process(Close {
            account_id: "acct-1".into(),
        })
        .await
        .expect("closed");
    let err = domain
        .process(Open {
            account_id: "frozen".into(),
        })
        .await
        .expect_err("refused");
    assert!(matches!(err, Error::CommandFailed { .. }), "{err:?}");
    let source = std::error::Error::source(&err).expect("the handler's error is the source");
    assert_eq!(
        source.downcast_ref::<Refused>(),
        Some(&Refused {
            account: "frozen".into()
        })
    );
    assert!(err.to_string().contains("Desk"), "{err}");
    assert!(
        err.to_string().ends_with(&format!(": {source}")),
        "the message says why, so `{{e}}` in a log shows it: {err}"
    );
}

#[tokio::test]
async fn concurrency_per_handler_is_configurable() {
    let server = redis();
    let seen = Arc::new(Seen::default());
    let mut config = fast(&server.url());
    config.handlers.insert(
        "ledger-projector".into(),
        convoy_runtime::config::HandlerConfig {
            concurrency: Some(2),
            ..Default::default()
        },
    );
    let domain = Domain::builder()
        .config(config)
        .handler(Projector {
            seen: seen.clone(),
            work: Duration::from_millis(150),
        })
        .without_discovery()
        .init()
        .expect("init");
    let engine = domain.engine().spawn();
    let events: Vec<Posted> = (0..8).map(|k| posted(&format!("k{k}"), 0, None)).collect();
    raise_all(&domain, &events).await;
    wait_until(Duration::from_secs(20), "every key handled", async || {
        seen.handled.load(Ordering::SeqCst) == 8
    })
    .await;
    assert_eq!(
        seen.max_in_flight.load(Ordering::SeqCst),
        2,
        "8 keys, at most 2 events in flight at once"
    );
    engine.shutdown().await.expect("shutdown");
}
