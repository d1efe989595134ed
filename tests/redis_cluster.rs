//! convoy on a real Redis Cluster (3 masters, replicas where a test fails
//! one over), formed by the testing kit from `redis-server` processes on
//! free ports. What handlers saw is recorded in a separate single-node
//! Redis that no fault touches, and compared with what was published.
//!
//! The engine processes are this test binary re-executed with the
//! `child_engine` test selected and `CONVOY_CLUSTER_CHILD` set.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use convoy_runtime::redis::keys;
use convoy_runtime::testing::{ChildEngine, Recorder, RedisCluster, RedisServer, check_order};
use convoy_runtime::{Config, Priority};
use redis::AsyncCommands;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use support::*;

const WAIT: Duration = Duration::from_secs(90);

/// Runs an engine on the cluster until SIGTERM when started as a child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_engine() {
    let Ok(url) = std::env::var("CONVOY_CLUSTER_CHILD") else {
        return;
    };
    let record = std::env::var("CONVOY_RECORD").expect("CONVOY_RECORD");
    let (instance, handler) = child_recording(&record, Duration::from_millis(1000));
    domain(cluster_config(&url), &instance, handler)
        .engine()
        .run_until(convoy_runtime::shutdown_signal())
        .await
        .expect("engine");
}

/// The tests' fast timings, on the cluster.
fn cluster_config(url: &str) -> Config {
    test_config(url)
}

fn spawn_engine(url: &str, record: &str, ns: &str, instance: &str, work_ms: u64) -> ChildEngine {
    let mut cmd: Command = child_command(ns, instance, work_ms);
    cmd.env("CONVOY_CLUSTER_CHILD", url)
        .env("CONVOY_RECORD", record);
    ChildEngine::spawn(&mut cmd).expect("spawn engine")
}

async fn cluster_conn(cluster: &RedisCluster) -> ClusterConnection {
    ClusterClient::new(cluster.node_urls())
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection")
}

fn shard(key: &str) -> u32 {
    keys::shard_of(key, keys::DEFAULT_SHARDS)
}

async fn lease_token(c: &mut ClusterConnection, key: &str) -> Option<String> {
    let group = recording_group("redis+cluster://127.0.0.1:1/");
    c.get(keys::lease(shard(key), group, "ledger", key))
        .await
        .ok()?
}

/// Publishes `events` through a publisher of their own on the cluster.
async fn publish_on(url: &str, events: &[Posted]) {
    publish(
        &publisher(cluster_config(url), "p"),
        events,
        Priority::Normal,
    )
    .await;
}

/// Waits until every one of `expected` was handled, then checks each key's
/// order (nothing lost, at most `reruns` re-runs) and that no two events of
/// one key ran at once.
async fn handled_in_order(
    rec: &Recorder,
    expected: &BTreeMap<String, Vec<String>>,
    reruns: usize,
) -> convoy_runtime::testing::OrderReport {
    wait_until(WAIT, "every event handled", || all_seen(rec, expected)).await;
    let seen = rec.seen_all().await.expect("seen");
    let report = check_order(expected, &seen, reruns).expect("order, nothing lost");
    assert_eq!(
        rec.violations().await.expect("violations"),
        Vec::<String>::new(),
        "two events of one key ran at once"
    );
    report
}

/// Commits one event and publishes the outbox, which must fail: the error.
async fn publish_one_failing(p: &convoy_runtime::Domain) -> convoy_runtime::Error {
    let mut uow = p.unit_of_work();
    uow.raise(Posted::new("c1", 0)).expect("raise");
    uow.commit().await.expect("commit");
    convoy_runtime::outbox::OutboxProcessor::new(
        p.outbox().clone(),
        p.broker().clone(),
        p.config().server.priority_lanes.clone(),
        p.instance_id(),
        std::sync::Arc::new(tokio::sync::Notify::new()),
    )
    .drain()
    .await
    .expect_err("the publish must fail")
}

/// How many keys each master holds.
fn keys_per_master(cluster: &RedisCluster) -> Vec<u64> {
    let masters = cluster.current_masters().expect("masters");
    masters
        .iter()
        .map(|i| {
            cluster
                .cli(*i, &["DBSIZE"])
                .expect("dbsize")
                .trim()
                .parse()
                .unwrap_or(0)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_engines_keep_per_key_order_without_overlap_and_spread_over_every_master() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "three").expect("recorder");
    let engines: Vec<ChildEngine> = ["a", "b", "c"]
        .iter()
        .map(|i| spawn_engine(&url, &record.url(), "three", i, 3))
        .collect();
    // All three are live before anything is published, so they share the
    // keys from the start (one would otherwise take them all and finish).
    let c = cluster_conn(&cluster).await;
    let instances = keys::instances(recording_group(&url));
    wait_until(WAIT, "three live engines", || {
        let mut c = c.clone();
        let instances = instances.clone();
        async move {
            let n: usize = c.zcard(&instances).await.unwrap_or(0);
            n == 3
        }
    })
    .await;
    let events = interleaved(24, 12);
    publish_on(&url, &events).await;
    let expected = published(&events);
    let report = handled_in_order(&rec, &expected, 0).await;
    assert_eq!(report.total_reruns, 0, "{report:?}");
    // Every master holds some of the category's keys: one category is not
    // pinned to one node.
    let per_master = keys_per_master(&cluster);
    assert!(per_master.iter().all(|n| *n > 0), "{per_master:?}");
    // More than one engine did the work.
    let mut instances = BTreeSet::new();
    for key in expected.keys() {
        for w in rec.windows_of(key).await.expect("windows") {
            instances.insert(w.instance);
        }
    }
    assert!(instances.len() >= 2, "{instances:?}");
    drop(engines);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_engine_s_keys_are_reclaimed_and_a_stalled_one_is_fenced_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "crash").expect("recorder");
    let events = interleaved(6, 40);
    publish_on(&url, &events).await;
    let mut a = spawn_engine(&url, &record.url(), "crash", "a", 20);
    let mut b = spawn_engine(&url, &record.url(), "crash", "b", 20);
    wait_until(WAIT, "a and b are mid-stream", || async {
        seen_count(&rec).await >= 40
    })
    .await;
    a.kill9().expect("kill -9");
    b.stop().expect("SIGSTOP");
    let stopped_at_us = redis_time_us(&record).await;
    // The keys b holds as it stops (read now: neither engine can take a key
    // any more, and no other engine runs yet).
    let mut c = cluster_conn(&cluster).await;
    let mut stalled = BTreeMap::new();
    for k in 0..6 {
        let key = format!("c{k}");
        if let Some(t) = lease_token(&mut c, &key).await
            && t.starts_with("b:")
        {
            stalled.insert(key, t.replace(':', "@"));
        }
    }
    let d = spawn_engine(&url, &record.url(), "crash", "d", 20);
    let expected = published(&events);
    // At-least-once: the event each key had in flight may run again.
    handled_in_order(&rec, &expected, 6).await;
    b.cont().expect("SIGCONT");
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The stalled owner started nothing of its keys after it was stopped
    // (at the generation it held then); the record of the event it had in
    // flight, if it came late, is left out of the order check.
    let b_seen = Recorder::new(&record.url(), "crash-b").expect("recorder");
    let labels: Vec<(&str, &str)> = stalled
        .iter()
        .map(|(k, l)| (k.as_str(), l.as_str()))
        .collect();
    let (seen, late) =
        seen_without_stalled_in_flight(&rec, &b_seen, &labels, "b", stopped_at_us).await;
    check_order(&expected, &seen, 6).expect("order, nothing lost");
    let overlaps = late.other_overlaps(rec.violations().await.expect("violations"));
    assert_eq!(
        overlaps,
        Vec::<String>::new(),
        "two events of one key ran at once"
    );
    // Every key changed hands: no lease is still a's, or b's stale one (b
    // may own keys again after it resumed, at newer generations).
    for k in 0..6 {
        let key = format!("c{k}");
        let token = lease_token(&mut c, &key).await.unwrap_or_default();
        assert!(!token.starts_with("a:"), "{key}: {token}");
        assert_ne!(stalled.get(&key), Some(&token.replace(':', "@")), "{key}");
    }
    drop((a, b, d));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failover_mid_run_loses_nothing_acknowledged_and_keeps_order() {
    let cluster = RedisCluster::start(3, 1).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "failover").expect("recorder");
    let engines: Vec<ChildEngine> = ["a", "b"]
        .iter()
        .map(|i| spawn_engine(&url, &record.url(), "failover", i, 2))
        .collect();
    let p = publisher(cluster_config(&url), "p");
    let events = interleaved(16, 30);
    let (first, rest) = events.split_at(events.len() / 2);
    publish(&p, first, Priority::Normal).await;
    wait_until(WAIT, "engines are mid-stream", || async {
        seen_count(&rec).await >= 60
    })
    .await;
    // Promote a replica of a master while engines read and ack.
    let masters = cluster.current_masters().expect("masters");
    let replica = (0..cluster.nodes().len())
        .find(|i| !masters.contains(i))
        .expect("a replica");
    cluster.failover(replica).expect("CLUSTER FAILOVER");
    // Publishing goes on across the failover (the client follows MOVED).
    publish(&p, rest, Priority::Normal).await;
    handled_in_order(&rec, &published(&events), 16).await;
    assert!(
        cluster
            .current_masters()
            .expect("masters")
            .contains(&replica)
    );
    drop(engines);
}

/// A master killed for longer than the lease (its replica takes over after
/// the cluster's node timeout): only the units of the shards it served are
/// given up. The others keep their lease (the same fence token) throughout
/// and go on handling: a heartbeat failing in one shard lapses nothing
/// elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failover_lapses_only_the_units_of_its_own_shards() {
    // With Redis's default `cluster-require-full-coverage yes`, every
    // node refuses every command on keys (CLUSTERDOWN) from the moment the
    // victim is counted as failed until its replica is promoted: under load
    // that can outlast the lease, and units on every master lapse. Only
    // with `no` do the other masters go on serving, which is what this test
    // is about (docs/redis-cluster.md tells operators so).
    let mut cluster = RedisCluster::builder(3, 1)
        .require_full_coverage(false)
        .start()
        .expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "one-master").expect("recorder");
    let engine = spawn_engine(&url, &record.url(), "one-master", "a", 1);
    let p = publisher(cluster_config(&url), "p");
    let first = interleaved(24, 2);
    publish(&p, &first, Priority::Normal).await;
    handled_in_order(&rec, &published(&first), 0).await;
    let mut c = cluster_conn(&cluster).await;
    let group = recording_group(&url);
    let keys: Vec<String> = (0..24).map(|k| format!("c{k}")).collect();
    let mut before = BTreeMap::new();
    for k in &keys {
        before.insert(k.clone(), lease_token(&mut c, k).await.expect("leased"));
    }
    // The master that serves c0's shard, and the keys it does not serve.
    let lease_of = |k: &str| keys::lease(shard(k), group, "ledger", k);
    let masters = cluster.current_masters().expect("masters");
    let serves = |m: usize, k: &str| {
        !cluster
            .cli(m, &["EXISTS", &lease_of(k)])
            .expect("cli")
            .contains("MOVED")
    };
    let victim = *masters
        .iter()
        .find(|m| serves(**m, "c0"))
        .expect("a master serves c0");
    let elsewhere: Vec<&String> = keys.iter().filter(|k| !serves(victim, k)).collect();
    assert!(!elsewhere.is_empty(), "some keys are on other masters");
    cluster.node_mut(victim).kill().expect("kill -9 the master");
    // Its replica takes over after the node timeout (2 s) and an
    // election: longer than the lease (2 s).
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.wait_ok(WAIT).expect("the cluster is ok again");
    let second: Vec<Posted> = keys.iter().map(|k| Posted::new(k, 2)).collect();
    // As the engine's relay does: published again until it goes out (the
    // publisher's connection finds the new master).
    publish_until_out(&p, &second).await;
    let mut all = first.clone();
    all.extend(second);
    handled_in_order(&rec, &published(&all), 2).await;
    let mut c = cluster_conn(&cluster).await;
    for k in elsewhere {
        let after = lease_token(&mut c, k).await;
        assert_eq!(
            after.as_ref(),
            before.get(k),
            "{k}'s unit is on a healthy master: its lease (fence token) must not change across another master's failover"
        );
    }
    drop(engine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_url_pointed_at_a_cluster_node_is_a_clear_error() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let node = cluster.node_urls()[0].clone();
    let p = publisher(cluster_config(&node), "p");
    let e = publish_one_failing(&p).await.to_string();
    assert!(e.contains("node of a Redis Cluster"), "{e}");
    assert!(e.contains("redis+cluster://"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generations_never_repeat_when_a_unit_s_state_is_lost_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "gens").expect("recorder");
    let p = publisher(cluster_config(&url), "p");
    publish(&p, &interleaved(1, 3), Priority::Normal).await;
    let engine = spawn_recording(&url, &rec, "a");
    let expected = published(&interleaved(1, 3));
    wait_until(WAIT, "handled", || all_seen(&rec, &expected)).await;
    let mut c = cluster_conn(&cluster).await;
    let first = lease_token(&mut c, "c0").await.expect("leased");
    engine.shutdown().await.expect("shutdown");
    // The unit's state (its durable generation) is lost, as after a
    // failover to a replica that had not received it.
    let group = recording_group(&url);
    let _: i64 = c
        .del(keys::unit(shard("c0"), group, "ledger", "c0"))
        .await
        .expect("del");
    let engine = spawn_recording(&url, &rec, "a");
    publish(&p, &[Posted::new("c0", 3)], Priority::Normal).await;
    let mut all = interleaved(1, 3);
    all.push(Posted::new("c0", 3));
    let all = published(&all);
    wait_until(WAIT, "handled again", || all_seen(&rec, &all)).await;
    let second = lease_token(&mut c, "c0").await.expect("leased again");
    let generation = |t: &str| -> u64 {
        t.rsplit(':')
            .next()
            .and_then(|g| g.parse().ok())
            .expect("generation")
    };
    assert!(
        generation(&second) > generation(&first),
        "{first} then {second}"
    );
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_replicas_an_event_leaves_the_outbox_only_once_a_replica_has_it() {
    let cluster = RedisCluster::start(3, 1).expect("cluster");
    let mut config = cluster_config(&cluster.url());
    config.broker.wait_replicas = 1;
    config.broker.wait_timeout_ms = 2000;
    let p = publisher(config, "p");
    publish(&p, &interleaved(8, 2), Priority::Normal).await;
    assert_eq!(p.outbox().stats().await.expect("stats").pending, 0);
    // No replica at all: the publish fails, and the events stay pending.
    let single = RedisServer::start().expect("redis");
    let mut config = test_config(&single.url());
    config.broker.wait_replicas = 1;
    config.broker.wait_timeout_ms = 50;
    let p = publisher(config, "q");
    let e = publish_one_failing(&p).await;
    assert!(
        matches!(
            e,
            convoy_runtime::Error::NotReplicated {
                wanted: 1,
                acked: 0
            }
        ),
        "{e}"
    );
    assert_eq!(p.outbox().stats().await.expect("stats").pending, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_partition_is_listed_skipped_dead_lettered_and_replayed_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "halt").expect("recorder");
    let mut events = interleaved(3, 6);
    for e in &mut events {
        if e.client_id == "c1" && (e.seq == 2 || e.seq == 4) {
            e.poison = true;
        }
    }
    let engine = spawn_recording(&url, &rec, "e0");
    publish_on(&url, &events).await;
    let admin = convoy_runtime::redis::admin::Admin::connect(&url)
        .await
        .expect("admin on the cluster");
    let group = recording_group(&url);
    let halted = || async {
        admin.partitions("ledger").await.is_ok_and(|r| {
            r.partitions
                .iter()
                .any(|p| p.key == "c1" && p.group == group && p.halted)
        })
    };
    wait_until(WAIT, "c1 halts on its poison event", halted).await;
    let report = admin.partitions("ledger").await.expect("partitions");
    let keys: BTreeSet<&str> = report.partitions.iter().map(|p| p.key.as_str()).collect();
    assert!(keys.contains("c1"), "{keys:?}");
    // Skip the first poison event: c1 goes on, to the second, and halts.
    let skipped = admin
        .skip("ledger", "c1", group, false, "test")
        .await
        .expect("skip");
    assert!(skipped.was_pending);
    wait_until(WAIT, "c1 halts again", || async {
        rec.seen("c1").await.is_ok_and(|s| s.len() == 3) && halted().await
    })
    .await;
    // Dead-letter the second, then replay it: it runs at c1's tail (and
    // halts again, as poison).
    admin
        .dead_letter("ledger", "c1", group, false, "test")
        .await
        .expect("dead-letter");
    let expected_c1: Vec<String> = [0, 1, 3, 5].iter().map(|s| format!("c1#{s}")).collect();
    wait_until(WAIT, "c1 finishes past the dead letter", || async {
        rec.seen("c1").await.is_ok_and(|s| s == expected_c1)
    })
    .await;
    let dlq = admin.dlq("ledger", Some("c1")).await.expect("dlq");
    assert_eq!(dlq.len(), 1, "{dlq:?}");
    admin
        .replay("ledger", "c1", &dlq[0].dlq_id, "test")
        .await
        .expect("replay");
    wait_until(WAIT, "the replayed event halts c1 again", halted).await;
    let audit = admin.audit(10).await.expect("audit");
    let ops: Vec<&str> = audit
        .iter()
        .filter_map(|a| a.fields.get("op").map(String::as_str))
        .collect();
    for op in ["skip", "dead_letter", "replay"] {
        assert!(ops.contains(&op), "{ops:?}");
    }
    // The other keys were never held up.
    for k in ["c0", "c2"] {
        assert_eq!(rec.seen(k).await.expect("seen").len(), 6, "{k}");
    }
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_and_reaping_work_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "lanes").expect("recorder");
    let mut config = cluster_config(&url);
    config.server.priority_lanes.enabled = true;
    config.server.partitioning.reap_idle_ms = 300;
    let p = publisher(config.clone(), "p");
    let low: Vec<Posted> = (0..5).map(|s| Posted::new("c0", s)).collect();
    let high: Vec<Posted> = (5..10).map(|s| Posted::new("c0", s)).collect();
    publish(&p, &low, Priority::Low).await;
    publish(&p, &high, Priority::Normal).await;
    let mut c = cluster_conn(&cluster).await;
    let backfill: usize = c
        .xlen(keys::backfill_stream(
            shard("c0"),
            "ledger",
            "c0",
            "backfill",
        ))
        .await
        .expect("xlen");
    assert_eq!(backfill, 5, "low-priority events went to the backfill lane");
    let engine = spawn_recording_with(config, &rec, "e0");
    wait_until(WAIT, "all handled", || async {
        seen_count(&rec).await >= 10
    })
    .await;
    let expected: Vec<String> = (5..10).chain(0..5).map(|s| format!("c0#{s}")).collect();
    assert_eq!(
        rec.seen("c0").await.expect("seen"),
        expected,
        "primary lane first, then backfill, each in order"
    );
    // Drained and idle: retired, index entry and streams together.
    wait_until(WAIT, "c0 retired", || {
        let mut c = c.clone();
        async move {
            let member: bool = c
                .sismember(keys::partition_index(shard("c0"), "ledger"), "c0")
                .await
                .unwrap_or(true);
            let exists: bool = c
                .exists(keys::partition_stream(shard("c0"), "ledger", "c0"))
                .await
                .unwrap_or(true);
            !member && !exists
        }
    })
    .await;
    // A publish after the reap re-creates the partition and is consumed.
    publish(&p, &[Posted::new("c0", 10)], Priority::Normal).await;
    wait_until(WAIT, "the new event handled", || async {
        rec.seen("c0").await.is_ok_and(|s| s.len() == 11)
    })
    .await;
    engine.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_a_cluster_url_reach_every_node_and_the_least_privilege_rule_suffices() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    // The least-privilege user of `convoy acl ledger`, on every node.
    let mut setuser = vec!["ACL", "SETUSER", "convoy", "reset", "on", ">s3cret"];
    let rules = convoy_runtime::redis::acl::rules(&["ledger"]);
    setuser.extend(rules.iter().map(String::as_str));
    // On servers with `CLIENT SETINFO` (Redis 7.2+: Redis 8, Valkey) the client
    // names itself on connect: `acl::COMMANDS` says to allow it there.
    if cluster.nodes()[0].kind() != convoy_runtime::testing::ServerKind::Redis {
        setuser.push("+client|setinfo");
    }
    for i in 0..cluster.nodes().len() {
        let reply = cluster.cli(i, &setuser).expect("ACL SETUSER");
        assert_eq!(reply.trim(), "OK", "node {i}: {reply}");
    }
    let hosts = cluster.url().replace("redis+cluster://", "");
    let url = format!("redis+cluster://convoy:s3cret@{hosts}");
    let rec = Recorder::new(&record.url(), "acl").expect("recorder");
    let engine = spawn_recording(&url, &rec, "e0");
    let events = interleaved(8, 3);
    publish_on(&url, &events).await;
    handled_in_order(&rec, &published(&events), 0).await;
    engine.shutdown().await.expect("shutdown");
    for i in 0..cluster.nodes().len() {
        let log = cluster.cli(i, &["ACL", "LOG"]).expect("ACL LOG");
        assert!(log.trim().is_empty(), "node {i} refused something: {log}");
    }
    // A wrong password is refused, and says so.
    let bad = format!("redis+cluster://convoy:wrong@{hosts}");
    let p = publisher(cluster_config(&bad), "p");
    let e = publish_one_failing(&p).await.to_string();
    assert!(!e.contains("wrong"), "the password is hidden: {e}");
    assert!(e.contains("***"), "{e}");
}
