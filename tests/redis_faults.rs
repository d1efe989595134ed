//! Regression tests for the fault holes of the Redis consumer, each against
//! real `redis-server` processes, with what the handlers saw recorded in a
//! second Redis that the fault never touches:
//!
//! - Redis restarted without persistence: fence generations never repeat,
//!   and the engine reports that Redis lost its state;
//! - an engine stalled (`SIGSTOP`) across a Redis restart and resumed just
//!   after it: every lease a live instance holds has a worker behind it,
//!   so no key is left unhandled.
//!
//! The engine processes of the second test are this test binary
//! re-executed with `child_engine` selected and `CONVOY_CHILD_ENGINE` set.

mod support;

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use convoy_runtime::Priority;
use convoy_runtime::testing::{ChildEngine, Recorder, RedisServer, current_test_command};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis::AsyncCommands;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

/// The metrics recorder of this test binary (one per process).
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        snapshotter
    })
}

fn counter(name: &str) -> u64 {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, _, _, _)| k.key().name() == name)
        .map(|(_, _, _, v)| match v {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

fn group(url: &str) -> &'static str {
    publisher(test_config(url), "probe")
        .registry()
        .handlers()
        .iter()
        .find(|h| h.name.ends_with("::Recording"))
        .map(|h| h.name)
        .expect("Recording is registered")
}

async fn generation(server: &RedisServer, key: &str) -> u64 {
    let mut c = server.connection().await.expect("conn");
    let g: Option<String> = c
        .hget(
            format!("convoy:unit:{}:ledger:{key}", group(&server.url())),
            "gen",
        )
        .await
        .expect("hget");
    g.and_then(|g| g.parse().ok()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generations_never_repeat_after_a_restart_without_persistence() {
    let _ = snapshotter();
    let mut sut = RedisServer::start().expect("redis");
    let record = RedisServer::start().expect("redis for the record");
    let url = sut.url();
    let rec = Recorder::new(&record.url(), "gen").expect("recorder");
    let labels = Recorder::new(&record.url(), "gen-labels").expect("recorder");
    let mut handler = Recording::new(rec.clone(), "e0", Duration::ZERO);
    handler.per_instance = Some(labels.clone());
    let engine = domain(test_config(&url), "e0", handler).engine().spawn();
    publish(
        &publisher(test_config(&url), "p1"),
        &[Posted::new("c0", 0)],
        Priority::Normal,
    )
    .await;
    wait_until(WAIT, "c0#0 handled", || async {
        rec.seen("c0").await.is_ok_and(|s| s.len() == 1)
    })
    .await;
    let before = generation(&sut, "c0").await;
    assert!(before > 0);
    let lost_before = counter(convoy_runtime::metrics::STATE_LOST);

    // Everything convoy kept in Redis is gone.
    sut.restart().expect("restart without persistence");
    publish(
        &publisher(test_config(&url), "p2"),
        &[Posted::new("c0", 1)],
        Priority::Normal,
    )
    .await;
    wait_until(WAIT, "c0#1 handled", || async {
        rec.seen("c0").await.is_ok_and(|s| s.len() == 2)
    })
    .await;
    let after = generation(&sut, "c0").await;
    assert!(
        after > before,
        "generation {after} after the restart, {before} before: a fence token handed out twice"
    );
    // The handler saw the two events under two fence tokens, the later one
    // newer.
    let seen: Vec<u64> = labels
        .windows_of("c0")
        .await
        .expect("windows")
        .iter()
        .map(|w| {
            w.instance
                .rsplit('@')
                .next()
                .and_then(|g| g.parse().ok())
                .expect("a generation label")
        })
        .collect();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[1] > seen[0], "{seen:?}");
    wait_until(WAIT, "the engine reports the lost state", || async {
        counter(convoy_runtime::metrics::STATE_LOST) > lost_before
    })
    .await;
    engine.shutdown().await.expect("shutdown");
}

/// Runs an engine until SIGTERM when started as a child engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_engine() {
    let Ok(url) = std::env::var("CONVOY_CHILD_ENGINE") else {
        return;
    };
    let instance = std::env::var("CONVOY_INSTANCE").expect("CONVOY_INSTANCE");
    let record = std::env::var("CONVOY_RECORD").expect("CONVOY_RECORD");
    let rec = Recorder::new(&record, "stall").expect("recorder");
    let handler = Recording::new(rec, &instance, Duration::from_millis(5));
    let engine = domain(test_config(&url), &instance, handler).engine();
    engine
        .run_until(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("signal");
            term.recv().await;
        })
        .await
        .expect("engine");
}

fn spawn_engine(url: &str, record: &str, instance: &str) -> ChildEngine {
    let mut cmd: Command = current_test_command("child_engine").expect("command");
    cmd.env("CONVOY_CHILD_ENGINE", url)
        .env("CONVOY_INSTANCE", instance)
        .env("CONVOY_RECORD", record);
    ChildEngine::spawn(&mut cmd).expect("spawn engine")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_across_a_redis_restart_leaves_no_lease_without_a_worker() {
    let mut sut = RedisServer::builder()
        .append_only(true)
        .start()
        .expect("redis");
    let record = RedisServer::start().expect("redis for the record");
    let url = sut.url();
    let rec = Recorder::new(&record.url(), "stall").expect("recorder");
    let keys = 8;
    let first = interleaved(keys, 5);
    publish(&publisher(test_config(&url), "p"), &first, Priority::Normal).await;
    let mut a = spawn_engine(&url, &record.url(), "a");
    let b = spawn_engine(&url, &record.url(), "b");
    let expected = published(&first);
    wait_until(WAIT, "the first events handled", || {
        all_seen(&rec, &expected)
    })
    .await;
    // a is stopped; Redis restarts (its data kept) while a's lease lapses;
    // a resumes just after the restart.
    a.stop().expect("SIGSTOP");
    sut.stop().expect("stop redis");
    std::thread::sleep(Duration::from_millis(2500));
    sut.restart().expect("restart redis");
    a.cont().expect("SIGCONT");

    let mut later = Vec::new();
    for seq in 5..10 {
        for k in 0..keys {
            later.push(Posted::new(&format!("c{k}"), seq));
        }
    }
    publish(
        &publisher(test_config(&url), "p2"),
        &later,
        Priority::Normal,
    )
    .await;
    let mut all = first.clone();
    all.extend(later);
    let expected = published(&all);
    wait_until(WAIT, "every key handled to the end", || {
        all_seen(&rec, &expected)
    })
    .await;
    let seen = rec.seen_all().await.expect("seen");
    convoy_runtime::testing::check_order(&published(&all), &seen, 2 * keys)
        .expect("order, nothing lost");
    drop((a, b));
}
