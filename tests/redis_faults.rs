//! Regression tests for the fault holes of the Redis consumer, each against
//! real `redis-server` processes, with what the handlers saw recorded in a
//! second Redis that the fault never touches:
//!
//! - the reply of a fenced read delayed past the response timeout, or
//!   dropped with the connection after Redis ran the read (through the
//!   testing kit's `FaultProxy`): the entries it delivered are re-read and
//!   handled in order, never skipped and trimmed away;
//! - the same for a read sent ahead, while the batch in hand is handled;
//! - entries a replaced owner read natively after it lost the lease: moved
//!   back to the owner and handled first, in order;
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

use convoy_runtime::redis::keys;
use convoy_runtime::testing::{
    ChildEngine, FaultProxy, Match, Recorder, RedisServer, current_test_command, script_sha,
};
use convoy_runtime::{Domain, Priority};
use metrics_util::debugging::{DebugValue, Snapshotter};
use redis::AsyncCommands;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

/// The metrics recorder of this test binary (one per process).
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(install_debugging_recorder)
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

async fn generation(server: &RedisServer, key: &str) -> u64 {
    let mut c = server.connection().await.expect("conn");
    let g: Option<String> = c
        .hget(
            names::unit(recording_group(&server.url()), "ledger", key),
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
        .run_until(convoy_runtime::shutdown_signal())
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

/// A Redis under test behind a fault proxy, a second Redis for the
/// record (`name`'s recorder), and a publisher that talks to the first
/// directly. The servers stop when the first value is dropped.
fn behind_a_proxy(name: &str) -> ((RedisServer, RedisServer), FaultProxy, Recorder, Domain) {
    let sut = RedisServer::start().expect("redis");
    let record = RedisServer::start().expect("redis for the record");
    let proxy = FaultProxy::start(([127, 0, 0, 1], sut.port()).into()).expect("proxy");
    let rec = Recorder::new(&record.url(), name).expect("recorder");
    let p = publisher(test_config(&sut.url()), "p");
    ((sut, record), proxy, rec, p)
}

/// An engine `e0` that records what it handles in `rec`, talking to Redis
/// through `proxy` with a short response timeout, acknowledging every
/// `max_unacked` handled events.
fn engine_through(
    proxy: &FaultProxy,
    rec: &Recorder,
    max_unacked: usize,
) -> convoy_runtime::EngineHandle {
    let broker = convoy_runtime::redis::RedisBroker::from_url(&proxy.url())
        .expect("broker")
        .response_timeout(Duration::from_millis(500));
    let mut config = test_config(&proxy.url());
    config.server.partitioning.max_unacked = max_unacked;
    Domain::builder()
        .config(config)
        .instance_id("e0")
        .broker(broker)
        .handler(Recording::new(rec.clone(), "e0", Duration::ZERO))
        .init()
        .expect("domain")
        .engine()
        .spawn()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_reply_is_lost_is_read_again_not_skipped() {
    let (_servers, proxy, rec, p) = behind_a_proxy("lost-read");
    let engine = engine_through(&proxy, &rec, 1);
    // A read of new entries is a plain XREADGROUP with the check of
    // verify.lua behind it in one pipeline: the check's reply ends it.
    let read = script_sha("verify").expect("the read's check");
    let seen = |n: usize| {
        let rec = rec.clone();
        async move { rec.seen("c0").await.is_ok_and(|s| s.len() >= n) }
    };
    publish(&p, &[Posted::new("c0", 0)], Priority::Normal).await;
    wait_until(WAIT, "c0#0 handled", || seen(1)).await;

    // 1. The reply of the read that delivers c0#1 arrives after the
    //    engine gave up on it (timed out); c0#2 is published after Redis
    //    ran that read.
    proxy.delay_reply(Match::Script(read.clone()), Duration::from_millis(1500), 1);
    publish(&p, &[Posted::new("c0", 1)], Priority::Normal).await;
    wait_until(WAIT, "the read of c0#1 ran", || async {
        proxy.fired() == 1
    })
    .await;
    publish(&p, &[Posted::new("c0", 2)], Priority::Normal).await;
    wait_until(WAIT, "c0#2 handled", || async {
        rec.seen("c0")
            .await
            .is_ok_and(|s| s.contains(&"c0#2".to_owned()))
    })
    .await;

    // 2. The reply of the read that delivers c0#3 is dropped with the
    //    connection (Redis ran it); then c0#4.
    proxy.drop_reply(Match::Script(read), 1);
    publish(&p, &[Posted::new("c0", 3)], Priority::Normal).await;
    wait_until(WAIT, "the read of c0#3 ran", || async {
        proxy.fired() == 2
    })
    .await;
    publish(&p, &[Posted::new("c0", 4)], Priority::Normal).await;
    wait_until(WAIT, "c0#4 handled", || async {
        rec.seen("c0")
            .await
            .is_ok_and(|s| s.contains(&"c0#4".to_owned()))
    })
    .await;

    let all: Vec<Posted> = (0..5).map(|seq| Posted::new("c0", seq)).collect();
    let seen = rec.seen_all().await.expect("seen");
    convoy_runtime::testing::check_order(&published(&all), &seen, 0)
        .expect("every event handled once, in order");
    engine.shutdown().await.expect("shutdown");
}

/// A unit with one busy key reads its next batch ahead while it handles
/// the one in hand. A read sent ahead whose reply is dropped with the
/// connection (Redis ran it), and one whose reply comes after the engine
/// gave up on it: what they delivered is read again and handled in order,
/// never skipped, never twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_sent_ahead_whose_replies_are_lost_are_read_again_not_skipped() {
    let (_servers, proxy, rec, p) = behind_a_proxy("lost-ahead");
    // A backlog of one key, acknowledged a batch at a time: every read of
    // new entries but the last is a full batch, which sends the next read
    // ahead before its first event.
    let all: Vec<Posted> = (0..600).map(|seq| Posted::new("c0", seq)).collect();
    publish(&p, &all, Priority::Normal).await;
    let engine = engine_through(&proxy, &rec, 100);
    let read = script_sha("verify").expect("the read's check");
    let seen = |n: usize| {
        let rec = rec.clone();
        async move { rec.seen("c0").await.is_ok_and(|s| s.len() >= n) }
    };
    // Handling the first batch: the read after it was sent ahead already,
    // the next check is that of the read the second batch sends ahead.
    wait_until(WAIT, "the first batch handled", || seen(1)).await;
    proxy.drop_reply(Match::Script(read.clone()), 1);
    wait_until(WAIT, "a read's reply dropped", || async {
        proxy.fired() == 1
    })
    .await;
    wait_until(WAIT, "half the backlog handled", || seen(300)).await;
    proxy.delay_reply(Match::Script(read), Duration::from_millis(1500), 1);
    wait_until(WAIT, "a read's reply delayed", || async {
        proxy.fired() == 2
    })
    .await;
    wait_until(WAIT, "the backlog handled", || seen(all.len())).await;
    let seen = rec.seen_all().await.expect("seen");
    // The dropped connection may take an acknowledgement with it: a batch
    // handled again at most.
    convoy_runtime::testing::check_order(&published(&all), &seen, 100)
        .expect("every event handled, in order, a batch again at most");
    engine.shutdown().await.expect("shutdown");
}

/// A replaced owner that reads natively after it lost the lease (it
/// stalled past the lease, and reads on waking) moves entries to its own
/// consumer; its read's check refuses it, so it handles none of them. The
/// owner's next read moves them back, and they are handled first, in
/// order. Here the replaced owner's read is a plain `XREADGROUP` under
/// another consumer name, sent while the owner's connection is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_a_replaced_owner_read_are_moved_back_and_handled_in_order() {
    let sut = RedisServer::start().expect("redis");
    let record = RedisServer::start().expect("redis for the record");
    let proxy = FaultProxy::start(([127, 0, 0, 1], sut.port()).into()).expect("proxy");
    let rec = Recorder::new(&record.url(), "stale-read").expect("recorder");
    let engine = domain(
        test_config(&proxy.url()),
        "e0",
        Recording::new(rec.clone(), "e0", Duration::ZERO),
    )
    .engine()
    .spawn();
    let p = publisher(test_config(&sut.url()), "p");
    publish(&p, &[Posted::new("c0", 0)], Priority::Normal).await;
    wait_until(WAIT, "c0#0 handled", || async {
        rec.seen("c0").await.is_ok_and(|s| s.len() == 1)
    })
    .await;

    proxy.pause();
    let all: Vec<Posted> = (0..4).map(|seq| Posted::new("c0", seq)).collect();
    publish(&p, &all[1..], Priority::Normal).await;
    let group = recording_group(&sut.url());
    let stream = names::stream("ledger", "c0");
    let mut c = sut.connection().await.expect("conn");
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg("e9:1")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut c)
        .await
        .expect("the replaced owner's read");
    let taken: Vec<redis::Value> = redis::cmd("XPENDING")
        .arg(&stream)
        .arg(group)
        .arg("-")
        .arg("+")
        .arg(10)
        .arg("e9:1")
        .query_async(&mut c)
        .await
        .expect("XPENDING");
    assert_eq!(taken.len(), 2, "the replaced owner read c0#1 and c0#2");
    proxy.resume();

    wait_until(WAIT, "c0#1 .. c0#3 handled", || async {
        rec.seen("c0").await.is_ok_and(|s| s.len() >= 4)
    })
    .await;
    let seen = rec.seen_all().await.expect("seen");
    convoy_runtime::testing::check_order(&published(&all), &seen, 0)
        .expect("every event handled once, in order");
    let consumers: Vec<redis::Value> = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(&stream)
        .arg(group)
        .query_async(&mut c)
        .await
        .expect("XINFO CONSUMERS");
    assert_eq!(
        consumers.len(),
        1,
        "the replaced owner's consumer is deleted"
    );
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_entry_gone_from_the_stream_is_reported_not_skipped_quietly() {
    let _ = snapshotter();
    let sut = RedisServer::start().expect("redis");
    let url = sut.url();
    let rec = Recorder::new(&url, "gone").expect("recorder");
    let events: Vec<Posted> = (0..3).map(|seq| Posted::new("g0", seq)).collect();
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;
    // An earlier owner read all three (they are pending for it), then the
    // middle entry was deleted by hand.
    let group = recording_group(&url);
    let mut c = sut.connection().await.expect("conn");
    let stream = names::stream("ledger", "g0");
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg(group)
        .arg("0")
        .query_async(&mut c)
        .await
        .expect("group");
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg("old:1")
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut c)
        .await
        .expect("read as the old owner");
    let ids: Vec<(String, redis::Value)> = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .expect("xrange");
    let _: i64 = c.xdel(&stream, &[&ids[1].0]).await.expect("xdel");
    let missing_before = counter(convoy_runtime::metrics::MISSING_ENTRIES);

    let engine = spawn_recording(&url, &rec, "e0");
    wait_until(WAIT, "g0#2 handled", || async {
        rec.seen("g0").await.is_ok_and(|s| s.len() == 2)
    })
    .await;
    assert_eq!(
        rec.seen("g0").await.expect("seen"),
        vec!["g0#0".to_owned(), "g0#2".to_owned()]
    );
    assert_eq!(
        counter(convoy_runtime::metrics::MISSING_ENTRIES),
        missing_before + 1,
        "the deleted entry is counted"
    );
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_restarted_under_the_same_instance_id_loses_nothing() {
    let sut = RedisServer::start().expect("redis");
    let url = sut.url();
    let first: Vec<Posted> = (0..3).map(|seq| Posted::new("r0", seq)).collect();
    let later: Vec<Posted> = (3..6).map(|seq| Posted::new("r0", seq)).collect();
    publish(&publisher(test_config(&url), "p"), &first, Priority::Normal).await;
    // The process restarts: a new memory outbox numbers its records from 1
    // again, under the same instance id.
    publish(&publisher(test_config(&url), "p"), &later, Priority::Normal).await;
    let mut c = sut.connection().await.expect("conn");
    let len: u64 = c.xlen(names::stream("ledger", "r0")).await.expect("xlen");
    assert_eq!(len, 6, "records of the restarted publisher were dropped");
}

/// A backlog published in pipelined batches (each batch handed to the
/// broker while the one before is in flight) through a connection that
/// loses publish replies: first a reply dropped with the connection (Redis
/// ran that batch, and maybe the one sent behind it), then one that comes
/// after the client gave up. Each failed drain is followed by another, and
/// every key's stream, read from Redis, holds each event once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_publishes_whose_replies_are_lost_write_each_event_once_in_order() {
    let sut = RedisServer::start().expect("redis");
    let proxy = FaultProxy::start(([127, 0, 0, 1], sut.port()).into()).expect("proxy");
    let config = test_config(&proxy.url());
    let shards = config.broker.shards;
    let broker = convoy_runtime::redis::RedisBroker::from_url(&proxy.url())
        .expect("broker")
        .response_timeout(Duration::from_millis(500));
    let p = Domain::builder()
        .config(config)
        .instance_id("p")
        .broker(broker)
        .init()
        .expect("publisher");
    let publish = script_sha("publish").expect("the publish script");
    // 3 batches of 2,048 and a short one per round, over 16 keys.
    const KEYS: usize = 16;
    const PER_KEY: u64 = 400;
    let rounds: Vec<Vec<Posted>> = (0..2)
        .map(|round| {
            interleaved(KEYS, PER_KEY)
                .into_iter()
                .map(|e| Posted::new(&e.client_id, round * PER_KEY + e.seq))
                .collect()
        })
        .collect();
    // 1. The first batch's reply is dropped with the connection.
    commit(&p, &rounds[0]).await;
    proxy.drop_reply(Match::Script(publish.clone()), 1);
    assert!(drain_until_empty(&p, "dropped reply").await >= 1);
    assert_eq!(proxy.fired(), 1);
    // 2. A reply delayed past the response timeout.
    commit(&p, &rounds[1]).await;
    proxy.delay_reply(Match::Script(publish), Duration::from_millis(1500), 1);
    assert!(drain_until_empty(&p, "late reply").await >= 1);
    assert_eq!(proxy.fired(), 2);

    let mut c = sut.connection().await.expect("connection");
    for k in 0..KEYS {
        let key = format!("c{k}");
        let stream = keys::partition_stream(keys::shard_of(&key, shards), "ledger", &key);
        let entries: redis::streams::StreamRangeReply =
            c.xrange_all(&stream).await.expect("xrange");
        let seqs: Vec<u64> = entries
            .ids
            .iter()
            .map(|e| {
                let payload: String = e.get("payload").expect("a payload");
                let v: serde_json::Value = serde_json::from_str(&payload).expect("json");
                v["seq"].as_u64().expect("a seq")
            })
            .collect();
        let want: Vec<u64> = (0..2 * PER_KEY).collect();
        assert_eq!(seqs, want, "{key}: every event once, in order");
    }
}

/// Drains `p`'s outbox again after every failure until nothing is
/// pending; returns how many drains failed.
async fn drain_until_empty(p: &Domain, fault: &str) -> usize {
    let mut failures = 0;
    loop {
        match relay(p).drain().await {
            Ok(_) if p.outbox().stats().await.expect("stats").pending == 0 => return failures,
            Ok(_) => {}
            Err(e) => {
                failures += 1;
                assert!(failures < 20, "{fault}: still failing: {e}");
            }
        }
    }
}
