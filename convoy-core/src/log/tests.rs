//! `quiet_redis` on a fake clock and a captured writer.

use std::sync::atomic::AtomicU64;

use tracing_subscriber::prelude::*;

use super::*;
use convoy_testkit::CapturedLog;

/// A clock the test moves: milliseconds after a fixed instant.
static NOW_MS: AtomicU64 = AtomicU64::new(0);
static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

fn test_clock() -> Instant {
    *EPOCH.get_or_init(Instant::now) + Duration::from_millis(NOW_MS.load(Ordering::SeqCst))
}

fn subscriber(out: &CapturedLog) -> impl Subscriber + Send + Sync + use<> {
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(out.clone())
        .with_ansi(false);
    tracing_subscriber::registry().with(
        quiet_redis(fmt)
            .clock(test_clock)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO),
    )
}

fn noise(i: usize) {
    tracing::warn!(target: "redis::cluster_handling::async_connection", "Failed to connect to node: {i}");
    tracing::warn!(target: "redis::cluster_handling::async_connection", "async cluster client recovery: beginning reconnect to initial nodes");
}

// One test, so the shared clock is moved by one test only.
#[test]
fn the_redis_client_s_repeated_lines_are_bounded_and_counted_and_convoy_s_are_all_kept() {
    let out = CapturedLog::default();
    tracing::subscriber::with_default(subscriber(&out), || {
        for i in 0..1000 {
            noise(i);
            tracing::warn!(target: "convoy_runtime::engine", i, "convoy's own warning");
            // A target that merely starts with the same letters.
            tracing::warn!(target: "redisson", i, "not the redis client");
            NOW_MS.fetch_add(1, Ordering::SeqCst);
        }
    });
    let lines = out.lines();
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    // 1000 ms of noise, one 10 s window: one line of each source.
    assert_eq!(count("Failed to connect to node"), 1, "{lines:#?}");
    assert_eq!(count("beginning reconnect"), 1);
    assert_eq!(count("convoy's own warning"), 1000);
    assert_eq!(count("not the redis client"), 1000);
    for i in 0..1000 {
        let line = format!("convoy's own warning i={i}");
        assert_eq!(
            lines.iter().filter(|l| l.ends_with(&line)).count(),
            1,
            "{i}"
        );
    }
    // No count yet: the window is not over.
    assert_eq!(count("lines left out"), 0);

    // The window ends; the next line logged (of any target) brings the
    // counts, then more noise writes one line per source again.
    NOW_MS.fetch_add(10_000, Ordering::SeqCst);
    let out = CapturedLog::default();
    tracing::subscriber::with_default(subscriber(&out), || {
        tracing::warn!(target: "redis::cluster_handling::async_connection", "Failed to connect to node: x");
    });
    // A new subscriber has a state of its own: nothing left out yet.
    assert_eq!(out.lines().len(), 1);

    let out = CapturedLog::default();
    let layer = subscriber(&out);
    tracing::subscriber::with_default(layer, || {
        for i in 0..500 {
            noise(i);
        }
        NOW_MS.fetch_add(10_000, Ordering::SeqCst);
        tracing::warn!(target: "convoy_runtime::engine", "after the window");
        for i in 0..500 {
            noise(i);
        }
    });
    let lines = out.lines();
    let count = |needle: &str| {
        lines
            .iter()
            .filter(|l| l.contains(needle) && !l.contains("lines left out"))
            .count()
    };
    assert_eq!(count("Failed to connect to node"), 2, "{lines:#?}");
    assert_eq!(count("beginning reconnect"), 2);
    let notes: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("lines left out"))
        .collect();
    assert_eq!(notes.len(), 2, "{lines:#?}");
    assert!(
        notes
            .iter()
            .all(|l| l.contains("WARN") && l.contains(NOTE_TARGET))
    );
    assert!(
        notes.iter().all(|l| l.contains("suppressed=499")),
        "{notes:#?}"
    );
    assert!(
        notes
            .iter()
            .any(|l| l.contains("last=\"Failed to connect to node: 499\"")),
        "{notes:#?}"
    );
    // The counts come before the line that brought them.
    let first_note = lines.iter().position(|l| l.contains("lines left out"));
    let after = lines.iter().position(|l| l.contains("after the window"));
    assert!(first_note < after, "{lines:#?}");
}

#[test]
fn records_of_the_log_crate_are_recognised_by_their_own_target() {
    assert!(is_redis("redis"));
    assert!(is_redis("redis::aio"));
    assert!(!is_redis("redisson"));
    assert!(!is_redis("convoy_runtime::redis::connection"));
    // The Redis client logs through the `log` crate; tracing-log turns
    // its records into events of target `log` with `log.*` fields.
    let _ = tracing_log::LogTracer::init();
    let out = CapturedLog::default();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(out.clone())
        .with_ansi(false);
    let subscriber = tracing_subscriber::registry()
        .with(quiet_redis(fmt).with_filter(tracing_subscriber::filter::LevelFilter::WARN));
    tracing::subscriber::with_default(subscriber, || {
        for i in 0..1000 {
            ::log::warn!(target: "redis::cluster_handling::async_connection", "Failed to connect to node: {i}");
            ::log::warn!(target: "convoy_cli", "a log-crate line of another target {i}");
            tracing::warn!(target: "convoy_runtime::engine", i, "convoy's own warning");
        }
    });
    let lines = out.lines();
    let count = |needle: &str| lines.iter().filter(|l| l.contains(needle)).count();
    assert_eq!(count("Failed to connect to node"), 1, "{lines:#?}");
    assert_eq!(count("a log-crate line of another target"), 1000);
    assert_eq!(count("convoy's own warning"), 1000);
}
