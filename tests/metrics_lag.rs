//! `convoy_lag` and `convoy partitions` agree after every operator verb:
//! a halted partition's lag is its head and everything behind it (read
//! ahead into the pending list or not); a dead-letter or a skip finishes
//! the head, a replay adds an entry, and the gauge follows within a
//! heartbeat. (Its own binary: one metrics recorder per process.)

mod support;

use std::time::Duration;

use convoy_runtime::Priority;
use convoy_runtime::redis::admin::Admin;
use convoy_runtime::redis::keys;
use convoy_runtime::testing::{Recorder, RedisServer};
use metrics_util::debugging::{DebugValue, Snapshotter};
use support::*;

const WAIT: Duration = Duration::from_secs(30);

/// The latest `convoy_lag` of the Recording handler on `ledger`.
fn gauge(snapshotter: &Snapshotter) -> Option<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, _, _, _)| {
            key.key().name() == "convoy_lag"
                && key
                    .key()
                    .labels()
                    .any(|l| l.key() == "handler" && l.value().ends_with("::Recording"))
        })
        .and_then(|(_, _, _, v)| match v {
            DebugValue::Gauge(g) => Some(g.into_inner()),
            _ => None,
        })
}

/// Waits until the unit of `key` is halted (or running, `halted` false)
/// with `lag` entries left, then until the gauge shows the category's
/// total lag as `convoy partitions` reports it.
async fn agree(
    server: &RedisServer,
    admin: &Admin,
    snapshotter: &Snapshotter,
    group: &str,
    key: &str,
    halted: bool,
    lag: u64,
) {
    wait_until(
        WAIT,
        &format!("{key}: halted {halted}, lag {lag}"),
        || async {
            admin
                .inspect("ledger", key, group)
                .await
                .is_ok_and(|i| i.status.halted == halted && i.status.lag == Some(lag))
        },
    )
    .await;
    let report = admin.partitions("ledger").await.expect("partitions");
    let row = report
        .partitions
        .iter()
        .find(|p| p.key == key)
        .expect("the key's row");
    assert_eq!(row.lag, Some(lag), "{row:?}");
    if halted {
        assert_eq!(row.behind_halt, Some(lag - 1), "{row:?}");
        assert_eq!(report.totals.behind_halts, lag - 1, "{report:?}");
    }
    let total = report.totals.lag as f64;
    let start = std::time::Instant::now();
    let mut seen = Vec::new();
    loop {
        // A debugging snapshot resets gauges to 0: drain, let a heartbeat
        // (0.3 s) set the gauge again, then read it.
        gauge(snapshotter);
        tokio::time::sleep(Duration::from_millis(700)).await;
        let value = gauge(snapshotter);
        if value == Some(total) {
            return;
        }
        seen.push(value);
        if start.elapsed() > WAIT {
            let mut c = server.connection().await.expect("conn");
            // The counters are per shard: the category's are their sums.
            let mut pipe = redis::pipe();
            for s in names::shards() {
                pipe.cmd("GET")
                    .arg(keys::published(s, "ledger"))
                    .cmd("GET")
                    .arg(keys::acked(s, group, "ledger"));
            }
            let per_shard: Vec<Option<u64>> = pipe.query_async(&mut c).await.expect("counters");
            let sum = |parity: usize| -> u64 {
                per_shard
                    .iter()
                    .skip(parity)
                    .step_by(2)
                    .map(|v| v.unwrap_or(0))
                    .sum()
            };
            let counters = (sum(0), sum(1));
            panic!(
                "convoy_lag was {seen:?}, convoy partitions says {total} ({key} halted {halted}, lag {lag}); published, acknowledged: {counters:?}; rows: {:?}",
                report.partitions
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn convoy_lag_agrees_with_convoy_partitions_after_every_operator_verb() {
    let snapshotter = install_debugging_recorder();

    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "lag").expect("recorder");
    let engine = spawn_recording(&url, &rec, "e0");
    let group = recording_group(&url);
    let admin = Admin::connect(&url).await.expect("admin");
    let poison = |seq| Posted {
        poison: true,
        ..Posted::new("c1", seq)
    };
    // c1: two poison events, then two good ones; c0 runs freely.
    let events = vec![
        poison(0),
        poison(1),
        Posted::new("c1", 2),
        Posted::new("c1", 3),
        Posted::new("c0", 0),
    ];
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;

    // Halted on c1#0: the head and three behind it, all read ahead.
    agree(&server, &admin, &snapshotter, group, "c1", true, 4).await;
    // Dead-letter it: the next poison event halts the partition again.
    admin
        .dead_letter("ledger", "c1", group, false, "ops")
        .await
        .expect("dead-letter");
    agree(&server, &admin, &snapshotter, group, "c1", true, 3).await;
    // Skip that one: the rest run, nothing is left.
    admin
        .skip("ledger", "c1", group, false, "ops")
        .await
        .expect("skip");
    agree(&server, &admin, &snapshotter, group, "c1", false, 0).await;
    wait_until(WAIT, "c1#2 and c1#3 handled", || async {
        rec.seen("c1").await.is_ok_and(|s| s == ["c1#2", "c1#3"])
    })
    .await;
    // Replay the dead letter: one more entry, and it halts again.
    let letters = admin.dlq("ledger", Some("c1")).await.expect("dlq");
    admin
        .replay("ledger", "c1", &letters[0].dlq_id, "ops")
        .await
        .expect("replay");
    agree(&server, &admin, &snapshotter, group, "c1", true, 1).await;
    admin
        .skip("ledger", "c1", group, false, "ops")
        .await
        .expect("skip");
    agree(&server, &admin, &snapshotter, group, "c1", false, 0).await;
    engine.shutdown().await.expect("shutdown");
}
