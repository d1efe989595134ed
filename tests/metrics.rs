//! Metrics move as a Redis engine handles, fails, halts and owns.

mod support;

use std::time::Duration;

use convoy_runtime::Priority;
use convoy_runtime::testing::{Recorder, RedisServer};
use metrics_util::debugging::DebugValue;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_the_engine() {
    let snapshotter = install_debugging_recorder();

    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let rec = Recorder::new(&url, "metrics").expect("recorder");
    let engine = spawn_recording(&url, &rec, "e0");
    let mut events = interleaved(3, 4);
    events.push(Posted {
        poison: true,
        ..Posted::new("c2", 4)
    });
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;
    let expected = published(&events[..12]);
    wait_until(Duration::from_secs(30), "events handled", || {
        all_seen(&rec, &expected)
    })
    .await;
    let mut c = server.connection().await.expect("conn");
    let unit = names::unit(recording_group(&url), "ledger", "c2");
    wait_until(Duration::from_secs(30), "c2 halted", || {
        let mut c = c.clone();
        let unit = unit.clone();
        async move {
            redis::cmd("HGET")
                .arg(&unit)
                .arg("halted")
                .query_async::<Option<String>>(&mut c)
                .await
                .ok()
                .flatten()
                .as_deref()
                == Some("1")
        }
    })
    .await;
    let _: () = redis::cmd("PING").query_async(&mut c).await.expect("ping");
    // Let a heartbeat refresh the gauges, then take the one snapshot (a
    // debugging snapshot drains the values).
    tokio::time::sleep(Duration::from_millis(800)).await;
    let snapshot: Vec<_> = snapshotter.snapshot().into_vec();
    let value = |name: &str, label: (&str, &str)| -> Option<f64> {
        snapshot
            .iter()
            .find(|(key, _, _, _)| {
                key.key().name() == name
                    && key
                        .key()
                        .labels()
                        .any(|l| l.key() == label.0 && l.value().ends_with(label.1))
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(c) => *c as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(h) => h.len() as f64,
            })
    };
    let h = ("handler", "::Recording");
    let cat = ("category", "ledger");
    assert_eq!(value("convoy_events_handled_total", h), Some(12.0));
    assert_eq!(
        value("convoy_events_failed_total", h),
        Some(3.0),
        "1 attempt + 2 retries"
    );
    assert_eq!(
        value("convoy_handle_seconds", h),
        Some(15.0),
        "one sample per attempt"
    );
    assert_eq!(value("convoy_partitions_halted_total", h), Some(1.0));
    assert_eq!(value("convoy_lease_acquired_total", h), Some(3.0));
    assert_eq!(value("convoy_partitions_owned", h), Some(3.0));
    assert_eq!(
        value("convoy_lag", h),
        Some(1.0),
        "the poison event is not acknowledged"
    );
    assert_eq!(value("convoy_partitions", cat), Some(3.0));
    assert_eq!(value("convoy_partition_warning", cat), Some(0.0));
    engine.shutdown().await.expect("shutdown");
}
