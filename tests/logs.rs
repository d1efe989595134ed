//! What the logs carry: a handler's own lines at `RUST_LOG=info` are inside
//! the `handle` span (handler, key, attempt, event id) unless the span's
//! level is configured below the filter; keys and errors are user data and
//! are escaped, so a key with a newline or a terminal escape cannot split
//! or forge a log line.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use convoy_runtime::config::SpanLevel;
use convoy_runtime::testing::{CapturedLog, RedisServer};
use convoy_runtime::{Aggregate, Config, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "notes")]
struct Notes;

#[derive(Event, Serialize, Deserialize, Clone)]
#[event(part_of = Notes)]
struct Noted {
    key: String,
    text: String,
    fail: bool,
}

struct Logger;

#[event_handler(part_of = Notes, sequential_by = "key")]
impl Logger {
    #[handle]
    async fn noted(&self, e: Noted) -> Result<(), HandlerError> {
        tracing::info!(text = %e.text, "the handler's own line");
        if e.fail {
            return Err(HandlerError::msg(format!("cannot note for {}", e.key)));
        }
        Ok(())
    }
}

/// The binary's one subscriber: `RUST_LOG=info`, plain text.
fn logs() -> &'static CapturedLog {
    static LOGS: OnceLock<CapturedLog> = OnceLock::new();
    LOGS.get_or_init(|| {
        let captured = CapturedLog::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        captured
    })
}

fn config(url: &str, level: SpanLevel) -> Config {
    let mut c = Config::default();
    c.broker.url = url.to_owned();
    c.server.partitioning.lease_ttl_ms = 2000;
    c.server.partitioning.heartbeat_interval_seconds = Some(0.3);
    c.server.retry.max_retries = 1;
    c.server.retry.initial_backoff_ms = 10;
    c.server.retry.max_backoff_ms = 10;
    c.server.observability.handle_span_level = level;
    c
}

/// Runs `events` through an engine with the span at `level`, waits until
/// `done` holds for the logs, and returns the lines logged meanwhile.
async fn run(level: SpanLevel, events: &[Noted], done: impl Fn(&str) -> bool) -> String {
    let logs = logs();
    let server = RedisServer::start().expect("redis");
    let domain = Domain::builder()
        .config(config(&server.url(), level))
        .instance_id("e0")
        .handler(Logger)
        .init()
        .expect("init");
    let from = logs.text().len();
    let engine = domain.engine().spawn();
    let mut uow = domain.unit_of_work();
    for e in events {
        uow.raise(e.clone()).expect("raise");
    }
    uow.commit().await.expect("commit");
    let start = Instant::now();
    loop {
        let text = logs.text()[from..].to_owned();
        if done(&text) {
            engine.shutdown().await.expect("shutdown");
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out; logged:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn noted(key: &str, text: &str, fail: bool) -> Noted {
    Noted {
        key: key.to_owned(),
        text: text.to_owned(),
        fail,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_info_a_handlers_lines_carry_the_handle_span() {
    let text = run(SpanLevel::Info, &[noted("c1", "first", false)], |t| {
        t.contains("text=first")
    })
    .await;
    let line = text
        .lines()
        .find(|l| l.contains("text=first"))
        .unwrap_or_else(|| panic!("{text}"));
    for field in [
        "handle{handler=\"logs::Logger\"",
        "category=\"notes\"",
        "key=\"c1\"",
        "attempt=1",
        " id=",
        "type=Noted",
    ] {
        assert!(line.contains(field), "{field} not in {line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_span_level_below_the_filter_leaves_the_lines_bare() {
    let text = run(SpanLevel::Debug, &[noted("c1", "second", false)], |t| {
        t.contains("text=second")
    })
    .await;
    let line = text
        .lines()
        .find(|l| l.contains("text=second"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(!line.contains("handle{"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_errors_are_escaped_in_log_lines() {
    let evil = "ev\nFAKE LINE\u{1b}[2J\u{202e}il";
    let text = run(SpanLevel::Info, &[noted(evil, "third", true)], |t| {
        t.contains("partition halted")
    })
    .await;
    assert!(
        !text.contains("\nFAKE LINE"),
        "a key split a log line:\n{text}"
    );
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{202e}'),
        "{text:?}"
    );
    let line = text
        .lines()
        .find(|l| l.contains("partition halted"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(r#"key="ev\nFAKE LINE\u{1b}[2J\u{202e}il""#),
        "{line}"
    );
    assert!(
        line.contains(r"cannot note for ev\nFAKE LINE\u{1b}[2J\u{202e}il"),
        "{line}"
    );
}
