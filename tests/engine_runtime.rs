//! Where the engine's consumers run (`[server] engine_threads`): on a
//! runtime of their own by default, on the application's with 0; the
//! engine's runtime outlives the engine (what a handler connected keeps
//! working) and never the application's runtime.

mod support;

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use convoy_runtime::testing::RedisServer;
use convoy_runtime::{Aggregate, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};
use support::{publish_outbox, test_config, wait_until};

#[derive(Aggregate)]
#[aggregate(category = "threads")]
struct Threads;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Threads)]
struct Noted {
    key: String,
}

/// The threads events were handled on: name and id.
type Seen = Arc<Mutex<Vec<(Option<String>, std::thread::ThreadId)>>>;

/// Records the thread each event was handled on, and with `logs` writes a
/// line there too.
struct Where {
    seen: Seen,
    /// Only the log test's handler logs. A callsite first reached on a
    /// thread with no subscriber while a single scoped one exists is cached
    /// as never enabled (tracing's single-dispatcher fast path), so another
    /// test's handler reaching it first would silence the log test's lines.
    logs: bool,
}

#[event_handler(part_of = Threads, sequential_by = "key")]
impl Where {
    #[handle]
    async fn noted(&self, _e: Noted) -> Result<(), HandlerError> {
        if self.logs {
            tracing::info!(target: "engine_runtime_test", "handled here");
        }
        let thread = std::thread::current();
        self.seen
            .lock()
            .map_err(|_| HandlerError::msg("poisoned"))?
            .push((thread.name().map(str::to_owned), thread.id()));
        Ok(())
    }
}

fn domain(url: &str, engine_threads: Option<usize>, seen: &Seen) -> Domain {
    domain_of(url, engine_threads, seen, false)
}

/// [`domain`], with a handler that logs when `logs`.
fn domain_of(url: &str, engine_threads: Option<usize>, seen: &Seen, logs: bool) -> Domain {
    let mut config = test_config(url);
    if let Some(n) = engine_threads {
        config.server.engine_threads = n;
    }
    Domain::builder()
        .config(config)
        .handler(Where {
            seen: seen.clone(),
            logs,
        })
        .without_discovery()
        .init()
        .expect("init")
}

/// Raises `n` events over four keys and publishes them.
async fn raise(domain: &Domain, n: usize) {
    let mut uow = domain.unit_of_work();
    for i in 0..n {
        uow.raise(Noted {
            key: format!("k{}", i % 4),
        })
        .expect("raise");
    }
    uow.commit().await.expect("commit");
    publish_outbox(domain).await;
}

/// Handles `n` events with `engine_threads` (None: the default) and
/// returns the names of the threads they ran on.
async fn handled_on(engine_threads: Option<usize>, n: usize) -> Vec<Option<String>> {
    handled_logging_on(engine_threads, n, false).await
}

/// [`handled_on`], with a handler that logs a line per event when `logs`.
async fn handled_logging_on(
    engine_threads: Option<usize>,
    n: usize,
    logs: bool,
) -> Vec<Option<String>> {
    let server = RedisServer::start().expect("start redis-server");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let d = domain_of(&server.url(), engine_threads, &seen, logs);
    raise(&d, n).await;
    let engine = d.engine().spawn();
    wait_until(Duration::from_secs(30), "every event handled", || async {
        seen.lock().map(|s| s.len() >= n).unwrap_or(false)
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    let seen = seen.lock().expect("lock");
    seen.iter().map(|(name, _)| name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_run_on_the_engine_s_own_runtime_by_default() {
    let names = handled_on(None, 20).await;
    assert_eq!(names.len(), 20);
    assert!(
        names.iter().all(|n| n.as_deref() == Some("convoy-engine")),
        "every event is handled on the engine's runtime: {names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_threads_0_runs_handlers_on_the_application_s_runtime() {
    let names = handled_on(Some(0), 20).await;
    assert_eq!(names.len(), 20);
    assert!(
        names.iter().all(|n| n.as_deref() != Some("convoy-engine")),
        "no event is handled on a runtime of the engine's: {names:?}"
    );
}

/// The engine's runtime ends with the application's: an engine that was
/// never shut down stops, rather than running on by itself.
#[test]
fn the_engine_s_runtime_ends_with_the_application_s() {
    let server = RedisServer::start().expect("start redis-server");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let handler_refs = app.block_on(async {
        let d = domain(&server.url(), None, &seen);
        raise(&d, 8).await;
        let engine = d.engine().spawn();
        wait_until(Duration::from_secs(30), "every event handled", || async {
            seen.lock().map(|s| s.len() >= 8).unwrap_or(false)
        })
        .await;
        // The handle is dropped without a shutdown; the domain too.
        drop(engine);
        drop(d);
        Arc::strong_count(&seen)
    });
    assert!(handler_refs > 1, "the running engine holds its handler");
    drop(app);
    // The engine's runtime dropped its tasks, the handler with them.
    let start = Instant::now();
    while Arc::strong_count(&seen) > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the engine still runs after the application's runtime shut down"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Connects to Redis on its first event (the connection's reader task then
/// runs on the engine's runtime) and keeps the connection.
struct Connects {
    url: String,
    conn: Arc<OnceLock<redis::aio::MultiplexedConnection>>,
}

#[event_handler(part_of = Threads, sequential_by = "key")]
impl Connects {
    #[handle]
    async fn noted(&self, _e: Noted) -> Result<(), HandlerError> {
        if self.conn.get().is_none() {
            let client = redis::Client::open(self.url.as_str()).map_err(HandlerError::transient)?;
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(HandlerError::transient)?;
            let _ = self.conn.set(conn);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_a_handler_connected_works_after_the_engine_stopped() {
    let server = RedisServer::start().expect("start redis-server");
    let conn = Arc::new(OnceLock::new());
    let d = Domain::builder()
        .config(test_config(&server.url()))
        .handler(Connects {
            url: server.url(),
            conn: conn.clone(),
        })
        .without_discovery()
        .init()
        .expect("init");
    raise(&d, 4).await;
    let engine = d.engine().spawn();
    wait_until(Duration::from_secs(30), "the handler connected", || async {
        conn.get().is_some()
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    let mut c = conn.get().expect("connected").clone();
    let pong: String = redis::cmd("PING")
        .query_async(&mut c)
        .await
        .expect("the handler's connection still works after the engine stopped");
    assert_eq!(pong, "PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_s_next_engine_runs_on_the_same_runtime() {
    let server = RedisServer::start().expect("start redis-server");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let d = domain(&server.url(), None, &seen);
    for round in 1..=3 {
        raise(&d, 4).await;
        let engine = d.engine().spawn();
        wait_until(
            Duration::from_secs(30),
            "the round's events handled",
            || async { seen.lock().map(|s| s.len() >= 4 * round).unwrap_or(false) },
        )
        .await;
        engine.shutdown().await.expect("shutdown");
    }
    let threads: std::collections::BTreeSet<String> = seen
        .lock()
        .expect("lock")
        .iter()
        .map(|(_, id)| format!("{id:?}"))
        .collect();
    assert_eq!(
        threads.len(),
        1,
        "three engines of one domain, one after the other, ran on one runtime of one thread: {threads:?}"
    );
}

/// A subscriber set for the test's thread alone (`set_default`) receives
/// the lines handlers write on the engine's threads.
#[tokio::test(flavor = "current_thread")]
async fn the_engine_s_threads_log_to_the_scoped_subscriber_they_were_started_under() {
    let log = convoy_runtime::testing::CapturedLog::default();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("engine_runtime_test=info")
        .with_writer(log.clone())
        .with_ansi(false)
        .with_thread_names(true)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let names = handled_logging_on(None, 4, true).await;
    assert!(names.iter().all(|n| n.as_deref() == Some("convoy-engine")));
    let lines = log.lines();
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("convoy-engine") && l.contains("handled here"))
            .count(),
        4,
        "every handler's line, written on the engine's threads: {lines:#?}"
    );
}
