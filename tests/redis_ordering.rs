//! `sequential_by` on the Redis broker, against a real `redis-server`
//! started by the testing kit: per-key order, no overlap, cross-key
//! parallelism, poison halts, lanes, reaping, invalid keys, Redis restarts,
//! sharing between instances.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use convoy_runtime::testing::{Recorder, RedisServer, check_order};
use convoy_runtime::{EngineHandle, Envelope, Priority};
use redis::AsyncCommands;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server")
}

fn recorder(url: &str, ns: &str) -> Recorder {
    Recorder::new(url, ns).expect("recorder")
}

fn start(url: &str, rec: &Recorder, instance: &str, work: Duration) -> EngineHandle {
    start_with(test_config(url), rec, instance, work)
}

fn start_with(
    config: convoy_runtime::Config,
    rec: &Recorder,
    instance: &str,
    work: Duration,
) -> EngineHandle {
    domain(
        config,
        instance,
        Recording::new(rec.clone(), instance, work),
    )
    .engine()
    .spawn()
}

fn group() -> &'static str {
    let d = publisher(test_config("redis://127.0.0.1:1/"), "probe");
    d.registry()
        .handlers()
        .iter()
        .find(|h| h.name.ends_with("::Recording"))
        .map(|h| h.name)
        .expect("Recording is registered")
}

async fn owners(server: &RedisServer, keys: usize) -> BTreeMap<String, usize> {
    let mut c = server.connection().await.expect("conn");
    let mut count = BTreeMap::new();
    for k in 0..keys {
        let v: Option<String> = c
            .get(names::lease(group(), "ledger", &format!("c{k}")))
            .await
            .expect("get");
        if let Some(token) = v {
            let owner = token
                .rsplit_once(':')
                .map(|(o, _)| o.to_owned())
                .unwrap_or(token);
            *count.entry(owner).or_default() += 1;
        }
    }
    count
}

/// Waits until the unit's state hash says it is halted.
async fn wait_halted(c: &redis::aio::MultiplexedConnection, unit: &str, what: &str) {
    wait_until(WAIT, what, || {
        let mut c = c.clone();
        let unit = unit.to_owned();
        async move {
            c.hget::<_, _, Option<String>>(&unit, "halted")
                .await
                .ok()
                .flatten()
                .as_deref()
                == Some("1")
        }
    })
    .await;
}

async fn ordering_with_engines(n: usize, max_unacked: usize) {
    let server = server();
    let url = server.url();
    let rec = recorder(&url, "order");
    let mut config = test_config(&url);
    config.server.partitioning.max_unacked = max_unacked;
    let engines: Vec<EngineHandle> = (0..n)
        .map(|i| {
            start_with(
                config.clone(),
                &rec,
                &format!("e{i}"),
                Duration::from_millis(3),
            )
        })
        .collect();
    let events = interleaved(12, 25);
    let publisher = publisher(test_config(&url), "publisher");
    publish(&publisher, &events, Priority::Normal).await;
    wait_until(WAIT, "every event handled", || async {
        seen_count(&rec).await >= events.len()
    })
    .await;
    let seen = rec.seen_all().await.expect("seen");
    let report = check_order(&published(&events), &seen, 0).expect("per-key order");
    assert_eq!(report.total_reruns, 0);
    assert_eq!(
        rec.violations().await.expect("violations"),
        Vec::<String>::new()
    );
    // Different keys ran at the same time.
    let mut overlapping = false;
    for a in 0..4 {
        for b in (a + 1)..4 {
            overlapping |= rec
                .overlapping_keys(&format!("c{a}"), &format!("c{b}"))
                .await
                .expect("windows");
        }
    }
    assert!(
        overlapping,
        "processing windows of different keys never overlapped"
    );
    // The work is shared between the instances.
    wait_until(WAIT, "every instance owns partitions", || async {
        owners(&server, 12).await.len() == n
    })
    .await;
    for e in engines {
        e.shutdown().await.expect("shutdown");
    }
    // Graceful shutdown released every lease.
    assert!(self::owners(&server, 12).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_no_overlap_and_parallelism_with_two_engines() {
    ordering_with_engines(2, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_with_batched_acks() {
    ordering_with_engines(2, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_no_overlap_and_parallelism_with_three_engines() {
    ordering_with_engines(3, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_halts_only_its_partition() {
    let server = server();
    let url = server.url();
    let rec = recorder(&url, "poison");
    let mut events = interleaved(4, 10);
    for e in &mut events {
        if e.client_id == "c1" && e.seq == 3 {
            e.poison = true;
        }
    }
    let engine = start(&url, &rec, "e0", Duration::from_millis(1));
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;
    wait_until(WAIT, "other keys finish", || async {
        let seen = rec.seen_all().await.expect("seen");
        ["c0", "c2", "c3"]
            .iter()
            .all(|k| seen.get(*k).map(Vec::len) == Some(10))
    })
    .await;
    let mut c = server.connection().await.expect("conn");
    let unit = names::unit(group(), "ledger", "c1");
    wait_halted(&c, &unit, "c1 halted").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = rec.seen("c1").await.expect("seen");
    assert_eq!(
        seen,
        vec!["c1#0", "c1#1", "c1#2"],
        "nothing after the poison event ran"
    );
    let state: BTreeMap<String, String> = c.hgetall(&unit).await.expect("state");
    assert!(
        state["halt_error"].contains("poison event c1#3"),
        "{state:?}"
    );
    assert_eq!(state["halt_reason"], "max_retries exceeded");
    assert_eq!(
        state["attempts"], "3",
        "1 attempt + max_retries = 2 retries"
    );
    // Nothing was dead-lettered; the head stays pending in the partition.
    for dlq in [
        names::category_dlq("ledger"),
        names::partition_dlq("ledger", "c1"),
    ] {
        let exists: bool = c.exists(&dlq).await.expect("exists");
        assert!(!exists, "{dlq} must not exist");
    }
    let len: usize = c.xlen(names::stream("ledger", "c1")).await.expect("xlen");
    assert_eq!(
        len, 7,
        "the head and everything behind it stay in the partition"
    );
    // A new owner after a failover stays halted rather than retrying.
    engine.shutdown().await.expect("shutdown");
    let engine = start(&url, &rec, "e1", Duration::from_millis(1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rec.seen("c1").await.expect("seen").len(), 3);
    let attempts: String = c.hget(&unit, "attempts").await.expect("attempts");
    assert_eq!(attempts, "3", "the new owner did not retry from zero");
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_lane_is_drained_before_backfill() {
    let server = server();
    let url = server.url();
    let rec = recorder(&url, "lanes");
    let mut config = test_config(&url);
    config.server.priority_lanes.enabled = true;
    let p = publisher(config.clone(), "p");
    let low: Vec<Posted> = (0..5).map(|s| Posted::new("c0", s)).collect();
    let high: Vec<Posted> = (5..10).map(|s| Posted::new("c0", s)).collect();
    publish(&p, &low, Priority::Low).await;
    publish(&p, &high, Priority::Normal).await;
    let mut c = server.connection().await.expect("conn");
    let backfill: usize = c
        .xlen(names::backfill("ledger", "c0", "backfill"))
        .await
        .expect("xlen");
    assert_eq!(backfill, 5, "low-priority events went to the backfill lane");
    let engine = spawn_recording_with(config, &rec, "e0");
    wait_until(WAIT, "all handled", || async {
        seen_count(&rec).await >= 10
    })
    .await;
    let seen = rec.seen("c0").await.expect("seen");
    let expected: Vec<String> = (5..10).chain(0..5).map(|s| format!("c0#{s}")).collect();
    assert_eq!(
        seen, expected,
        "primary lane first, then backfill, each in order"
    );
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_partition_is_reaped_and_a_racing_publish_is_consumed() {
    let server = server();
    let url = server.url();
    let rec = recorder(&url, "reap");
    let mut config = test_config(&url);
    config.server.partitioning.reap_idle_ms = 300;
    let engine = spawn_recording_with(config.clone(), &rec, "e0");
    let p = publisher(config, "p");
    publish(
        &p,
        &[Posted::new("c0", 0), Posted::new("c0", 1)],
        Priority::Normal,
    )
    .await;
    let c = server.connection().await.expect("conn");
    wait_until(WAIT, "c0 retired", || {
        let mut c = c.clone();
        async move {
            let member: bool = c
                .sismember(names::partition_index("ledger", "c0"), "c0")
                .await
                .unwrap_or(true);
            let exists: bool = c
                .exists(names::stream("ledger", "c0"))
                .await
                .unwrap_or(true);
            !member && !exists
        }
    })
    .await;
    assert_eq!(rec.seen("c0").await.expect("seen"), vec!["c0#0", "c0#1"]);
    let mut c2 = c.clone();
    let generation: u64 = c2
        .hget(names::unit(group(), "ledger", "c0"), "gen")
        .await
        .expect("generation kept");
    assert!(generation >= 1);
    // Publishes racing the reap: each lands just before, during or after a
    // retirement; every one is rediscovered and handled, in order.
    let mut all = vec![Posted::new("c0", 0), Posted::new("c0", 1)];
    for seq in 2..14u64 {
        let e = Posted::new("c0", seq);
        publish(&p, std::slice::from_ref(&e), Priority::Normal).await;
        all.push(e);
        tokio::time::sleep(Duration::from_millis(250 + (seq % 4) * 40)).await;
    }
    wait_until(WAIT, "racing publishes handled", || async {
        rec.seen("c0").await.map(|s| s.len()).unwrap_or(0) >= all.len()
    })
    .await;
    let seen = rec.seen_all().await.expect("seen");
    check_order(&published(&all), &seen, 0).expect("order across retirements");
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_key_at_publish_is_abandoned_and_later_rows_publish() {
    let server = server();
    let url = server.url();
    let p = publisher(test_config(&url), "p");
    // A row that somehow reached the outbox with an invalid key.
    let mut bad = Envelope::wrap(
        &Posted::new("a:b", 0),
        Some("a:b".into()),
        Priority::Normal,
        None,
    )
    .expect("wrap");
    bad.partition_key = Some("a:b".into());
    p.outbox().append(vec![bad]).await.expect("append");
    let mut uow = p.unit_of_work();
    uow.raise(Posted::new("c0", 0)).expect("raise");
    uow.raise(Posted::new("c0", 1)).expect("raise");
    uow.commit().await.expect("commit");
    publish_outbox(&p).await;
    let records = p.outbox().records().await.expect("records");
    assert_eq!(records.len(), 3);
    match &records[0].status {
        convoy_runtime::outbox::OutboxStatus::Abandoned { reason } => {
            assert!(reason.contains("\"a:b\""), "{reason}");
        }
        other => panic!("expected abandoned, got {other:?}"),
    }
    assert_eq!(records[0].attempts, 0, "never retried");
    for r in &records[1..] {
        assert_eq!(r.status, convoy_runtime::outbox::OutboxStatus::Published);
        assert_eq!(r.partition_key(), Some("c0"));
    }
    let mut c = server.connection().await.expect("conn");
    let len: usize = c.xlen(names::stream("ledger", "c0")).await.expect("xlen");
    assert_eq!(len, 2);
    // The union of every shard's index: c0 and nothing else.
    let members = names::all_partitions(&mut c, "ledger")
        .await
        .expect("index");
    assert_eq!(members, vec!["c0"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_run_loses_nothing() {
    let mut server = RedisServer::builder()
        .append_only(true)
        .start()
        .expect("start redis-server");
    let url = server.url();
    let rec = recorder(&url, "restart");
    let d = domain(
        test_config(&url),
        "e0",
        Recording::new(rec.clone(), "e0", Duration::from_millis(2)),
    );
    let engine = d.engine().spawn();
    let first = interleaved(4, 10);
    let mut uow = d.unit_of_work();
    for e in &first {
        uow.raise(e.clone()).expect("raise");
    }
    uow.commit().await.expect("commit");
    wait_until(WAIT, "first batch handled", || async {
        seen_count(&rec).await >= 40
    })
    .await;
    server.stop().expect("stop redis");
    // Raised while Redis is down: they wait in the outbox.
    let second: Vec<Posted> = (10..20)
        .flat_map(|s| (0..4).map(move |k| Posted::new(&format!("c{k}"), s)))
        .collect();
    let mut uow = d.unit_of_work();
    for e in &second {
        uow.raise(e.clone()).expect("raise");
    }
    uow.commit().await.expect("commit while redis is down");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let pending = d.outbox().pending(1000).await.expect("pending").len();
    assert_eq!(
        pending,
        second.len(),
        "nothing could be published while Redis was down"
    );
    server.restart().expect("restart redis");
    wait_until(WAIT, "everything handled after the restart", || async {
        seen_count(&rec).await >= 80
    })
    .await;
    let all: Vec<Posted> = first.into_iter().chain(second).collect();
    let seen = rec.seen_all().await.expect("seen");
    let report = check_order(&published(&all), &seen, 4).expect("order and no loss");
    assert!(report.total_reruns <= 4);
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_instance_gets_a_share() {
    let server = server();
    let url = server.url();
    let rec = recorder(&url, "share");
    let a = start(&url, &rec, "a", Duration::ZERO);
    let events = interleaved(20, 1);
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;
    wait_until(WAIT, "a owns every partition", || async {
        owners(&server, 20).await.get("a") == Some(&20)
    })
    .await;
    let b = start(&url, &rec, "b", Duration::ZERO);
    wait_until(WAIT, "b owns about half", || async {
        let o = owners(&server, 20).await;
        o.get("a") == Some(&10) && o.get("b") == Some(&10)
    })
    .await;
    a.shutdown().await.expect("shutdown a");
    b.shutdown().await.expect("shutdown b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_unknown_entries_fail_without_crashing() {
    let server = server();
    let url = server.url();
    let rec = recorder(&url, "bad");
    let engine = start(&url, &rec, "e0", Duration::ZERO);
    let mut c = server.connection().await.expect("conn");
    // A partition entry of an unknown type and a base-stream entry that is
    // not an envelope at all.
    let _: String = c
        .xadd(
            names::stream("ledger", "c9"),
            "*",
            &[
                ("id", "x1"),
                ("type", "Nope"),
                ("category", "ledger"),
                ("time", "1"),
                ("payload", "{}"),
                ("key", "c9"),
            ],
        )
        .await
        .expect("xadd");
    let _: i64 = c
        .sadd(names::partition_index("ledger", "c9"), "c9")
        .await
        .expect("sadd");
    let _: String = c
        .xadd(names::base_stream("ledger"), "*", &[("garbage", "1")])
        .await
        .expect("xadd");
    // Good events still flow, on both paths.
    let p = publisher(test_config(&url), "p");
    publish(&p, &interleaved(2, 3), Priority::Normal).await;
    let mut uow = p.unit_of_work();
    uow.raise(Audited { note: "n1".into() }).expect("raise");
    uow.commit().await.expect("commit");
    publish_outbox(&p).await;
    wait_until(WAIT, "good events handled", || async {
        seen_count(&rec).await >= 7
    })
    .await;
    let unit = names::unit(group(), "ledger", "c9");
    wait_halted(&c, &unit, "the unknown type halts its partition").await;
    let err: String = c.hget(&unit, "halt_error").await.expect("error");
    assert!(err.contains("unknown message type `Nope`"), "{err}");
    wait_until(WAIT, "the malformed base entry is dead-lettered", || {
        let mut c = c.clone();
        async move {
            c.xlen::<_, usize>(names::category_dlq("ledger"))
                .await
                .unwrap_or(0)
                == 1
        }
    })
    .await;
    engine.shutdown().await.expect("shutdown");
}
