//! Crash and stall failover across real OS processes: the owner of a key is
//! killed with SIGKILL, or stopped with SIGSTOP past its lease and resumed;
//! another engine takes over at a new generation, and per-key order and
//! completeness hold.
//!
//! The engine processes are this test binary re-executed with the
//! `child_engine` test selected and `CONVOY_CHILD_ENGINE` set.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use convoy_runtime::Priority;
use convoy_runtime::testing::{ChildEngine, Recorder, RedisServer, Window, check_order};
use redis::AsyncCommands;
use support::*;

const WAIT: Duration = Duration::from_secs(60);
const MARKER_TTL: Duration = Duration::from_millis(1000);

/// Runs an engine until SIGTERM when started as a child engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_engine() {
    let Ok(url) = std::env::var("CONVOY_CHILD_ENGINE") else {
        return;
    };
    let (instance, handler) = child_recording(&url, MARKER_TTL);
    let mut config = test_config(&url);
    if let Ok(n) = std::env::var("CONVOY_MAX_UNACKED") {
        config.server.partitioning.max_unacked = n.parse().expect("max_unacked");
    }
    let engine = domain(config, &instance, handler).engine();
    engine
        .run_until(convoy_runtime::shutdown_signal())
        .await
        .expect("engine");
}

fn spawn_engine(url: &str, ns: &str, instance: &str, work_ms: u64) -> ChildEngine {
    spawn_engine_acking(url, ns, instance, work_ms, 1)
}

fn spawn_engine_acking(
    url: &str,
    ns: &str,
    instance: &str,
    work_ms: u64,
    max_unacked: usize,
) -> ChildEngine {
    let mut cmd: Command = child_command(ns, instance, work_ms);
    cmd.env("CONVOY_MAX_UNACKED", max_unacked.to_string())
        .env("CONVOY_CHILD_ENGINE", url);
    ChildEngine::spawn(&mut cmd).expect("spawn engine")
}

async fn owner_of(server: &RedisServer, key: &str) -> Option<String> {
    lease_token(server, key)
        .await
        .and_then(|t| t.rsplit_once(':').map(|(o, _)| o.to_owned()))
}

async fn lease_token(server: &RedisServer, key: &str) -> Option<String> {
    let mut c = server.connection().await.expect("conn");
    let mut it: redis::AsyncIter<'_, String> = c
        .scan_match(names::lease_pattern("ledger", key))
        .await
        .expect("scan");
    let lease = it.next_item().await?.ok()?;
    drop(it);
    c.get(lease).await.ok()?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_failover_resumes_in_order_with_nothing_lost() {
    crash_failover(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_failover_with_batched_acks_reruns_at_most_the_unacked() {
    crash_failover(5).await;
}

async fn crash_failover(max_unacked: usize) {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let ns = format!("crash{max_unacked}");
    let rec = Recorder::new(&url, ns.clone()).expect("recorder");
    let events = interleaved(4, 40);
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;
    let mut a = spawn_engine_acking(&url, &ns, "a", 25, max_unacked);
    wait_until(WAIT, "a is mid-stream", || async {
        seen_count(&rec).await >= 20
    })
    .await;
    assert_eq!(owner_of(&server, "c0").await.as_deref(), Some("a"));
    let b = spawn_engine_acking(&url, &ns, "b", 25, max_unacked);
    a.kill9().expect("kill -9");
    let before = seen_count(&rec).await;
    assert!(before < events.len(), "a was killed mid-stream");
    let expected = published(&events);
    wait_until(WAIT, "b handles everything", || all_seen(&rec, &expected)).await;
    let seen = rec.seen_all().await.expect("seen");
    // At-least-once: the event each key had in flight may run again, once
    // (with batched acks: the handled but unacknowledged ones too).
    let bound = 4 * max_unacked;
    let report = check_order(&published(&events), &seen, bound).expect("order, no loss");
    assert!(report.total_reruns <= bound, "{report:?}");
    assert_eq!(
        rec.violations().await.expect("violations"),
        Vec::<String>::new()
    );
    assert_eq!(owner_of(&server, "c0").await.as_deref(), Some("b"));
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_owner_is_fenced_out() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "stall").expect("recorder");
    let events = interleaved(3, 40);
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;
    let mut a = spawn_engine(&url, "stall", "a", 40);
    wait_until(WAIT, "a is mid-stream", || async {
        seen_count(&rec).await >= 12
    })
    .await;
    let mut stale = Vec::new();
    for key in ["c0", "c1", "c2"] {
        let token = lease_token(&server, key).await.expect("a owns the key");
        assert!(token.starts_with("a:"), "{token}");
        stale.push((key, token.replace(':', "@")));
    }
    a.stop().expect("SIGSTOP");
    let stopped_at = redis_time_us(&server).await;
    let b = spawn_engine(&url, "stall", "b", 40);
    // Past a's lease (2 s): b takes over every key and makes progress.
    wait_until(WAIT, "b took over every key", || async {
        for key in ["c0", "c1", "c2"] {
            if owner_of(&server, key).await.as_deref() != Some("b") {
                return false;
            }
        }
        true
    })
    .await;
    let progressed = seen_count(&rec).await;
    wait_until(WAIT, "b makes progress", || async {
        seen_count(&rec).await > progressed + 6
    })
    .await;
    a.cont().expect("SIGCONT");
    let a_seen = Recorder::new(&url, "stall-a").expect("recorder");
    let expected = published(&events);
    wait_until(WAIT, "everything handled", || all_seen(&rec, &expected)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // a handled each key at the generation it held when stopped; it
    // started nothing after the stop (a may later own a key again, at a new
    // generation, as a fair share), and the record of the event it had in
    // flight, if it came late, is left out of the order check.
    for (key, label) in &stale {
        let windows = a_seen.windows_of(key).await.expect("windows");
        assert!(
            windows.iter().any(|w| &w.instance == label),
            "a handled {key} as {label}"
        );
    }
    let stalled: Vec<(&str, &str)> = stale.iter().map(|(k, l)| (*k, l.as_str())).collect();
    let (seen, late) =
        seen_without_stalled_in_flight(&rec, &a_seen, &stalled, "a", stopped_at).await;
    check_order(&published(&events), &seen, 3).expect("order and no loss");
    // Overlaps, but for that late record of a stale in-flight event.
    let overlaps = late.other_overlaps(rec.violations().await.expect("violations"));
    assert_eq!(overlaps, Vec::<String>::new());
    let mut c = server.connection().await.expect("conn");
    let gens: BTreeMap<String, String> = c
        .hgetall(names::unit(recording_group(&url), "ledger", "c0"))
        .await
        .expect("unit");
    assert!(
        gens["gen"].parse::<u64>().expect("gen") >= 2,
        "ownership changed hands"
    );
    drop(a);
    drop(b);
}

/// The late record a stalled owner may leave: only its own entry of the
/// event after the stop, behind its successor's run of it. Another
/// instance's repeat of the event, an entry before the stop, or a first
/// entry are never taken out of the order check.
#[test]
fn only_a_stalled_owner_s_late_in_flight_record_is_set_aside() {
    let w = |event: &str, instance: &str, start_us: u64| Window {
        start_us,
        end_us: start_us + 1,
        event: event.to_owned(),
        instance: instance.to_owned(),
    };
    let stop = 100;
    // b dispatched c#1 before the stop and recorded it after d went on.
    let late = [
        w("c#0", "b", 10),
        w("c#1", "d", 200),
        w("c#2", "d", 210),
        w("c#1", "b", 300),
    ];
    assert_eq!(late_record(&late, "c#1", "b", stop), Some(3));
    // d running c#1 again after c#2 is a broken replay, not b's record.
    let rerun = [w("c#1", "b", 10), w("c#2", "d", 200), w("c#1", "d", 300)];
    assert_eq!(late_record(&rerun, "c#1", "b", stop), None);
    // b's entry before the stop is on time.
    let on_time = [w("c#1", "d", 50), w("c#2", "d", 60), w("c#1", "b", 90)];
    assert_eq!(late_record(&on_time, "c#1", "b", stop), None);
    // b's only entry of c#1, with nobody's before it, is its first run.
    let first = [w("c#0", "d", 200), w("c#1", "b", 300)];
    assert_eq!(late_record(&first, "c#1", "b", stop), None);
    // Two late entries by b: not the one allowed record.
    let twice = [w("c#1", "d", 200), w("c#1", "b", 300), w("c#1", "b", 310)];
    assert_eq!(late_record(&twice, "c#1", "b", stop), None);
}
