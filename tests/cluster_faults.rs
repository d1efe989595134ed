//! convoy on a real Redis Cluster under the faults real deployments meet:
//! every client connection killed on every node (again and again), a slot
//! of convoy's migrated key by key for longer than the lease, and a master
//! lost to a replica that had been cut off from it (a replication loss).
//! The engine and the publisher run in this process; what the handlers saw
//! is recorded in a separate single-node Redis no fault touches, and
//! convoy's own log lines and metrics are captured to check what it
//! reported.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use convoy_runtime::redis::keys;
use convoy_runtime::testing::{CapturedLog, Recorder, RedisCluster, RedisServer, check_order};
use metrics_util::debugging::{DebugValue, Snapshotter};
use support::*;

const WAIT: Duration = Duration::from_secs(90);

/// convoy's log lines of this test binary (every test's: each looks for
/// lines naming its own shard, or reads from a mark), and its metrics.
fn observe() -> (&'static CapturedLog, &'static Snapshotter) {
    static LOGS: OnceLock<CapturedLog> = OnceLock::new();
    static METRICS: OnceLock<Snapshotter> = OnceLock::new();
    let logs = LOGS.get_or_init(|| {
        let captured = CapturedLog::default();
        let _ = tracing_subscriber::fmt()
            .with_env_filter("convoy_runtime=info")
            .with_ansi(false)
            .with_writer(captured.clone())
            .try_init();
        captured
    });
    (logs, METRICS.get_or_init(install_debugging_recorder))
}

fn shard(key: &str) -> u32 {
    keys::shard_of(key, keys::DEFAULT_SHARDS)
}

async fn handled_in_order(rec: &Recorder, expected: &BTreeMap<String, Vec<String>>, reruns: usize) {
    wait_until(WAIT, "every event handled", || all_seen(rec, expected)).await;
    let seen = rec.seen_all().await.expect("seen");
    check_order(expected, &seen, reruns).expect("order, nothing lost");
    assert_eq!(
        rec.violations().await.expect("violations"),
        Vec::<String>::new(),
        "two events of one key ran at once"
    );
}

/// Every client connection of every node is killed ten times, 300 ms
/// apart, while an engine handles and a publisher publishes: both recover
/// within seconds each time, and every event is handled, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_and_a_publisher_recover_from_repeated_connection_kills() {
    let _ = observe();
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "kills").expect("recorder");
    let engine = spawn_recording(&url, &rec, "kills-a");
    let p = publisher(test_config(&url), "kills-p");
    // Both connected and working before the first kill.
    let mut all: Vec<Posted> = (0..8).map(|k| Posted::new(&format!("k{k}"), 0)).collect();
    publish_until_out(&p, &all).await;
    handled_in_order(&rec, &published(&all), 0).await;
    let mut slowest = Duration::ZERO;
    let mut killed = 0;
    for round in 1..11u64 {
        killed += cluster.kill_clients().expect("CLIENT KILL on every node");
        let events: Vec<Posted> = (0..8)
            .map(|k| Posted::new(&format!("k{k}"), round))
            .collect();
        slowest = slowest.max(publish_until_out(&p, &events).await);
        all.extend(events);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        killed > 0,
        "the engine's and publisher's connections were killed"
    );
    assert!(
        slowest < Duration::from_secs(20),
        "the publisher took {slowest:?} to publish after a connection kill"
    );
    let started = Instant::now();
    handled_in_order(&rec, &published(&all), 2).await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the engine took {:?} to drain after the kills",
        started.elapsed()
    );
    // And both still work after the last kill.
    cluster.kill_clients().expect("CLIENT KILL");
    let last: Vec<Posted> = (0..8).map(|k| Posted::new(&format!("k{k}"), 11)).collect();
    publish_until_out(&p, &last).await;
    all.extend(last);
    handled_in_order(&rec, &published(&all), 2).await;
    engine.shutdown().await.expect("shutdown");
}

/// A convoy shard's slot moves to another master key by key, 400 ms per
/// key (several seconds, longer than the 2 s lease), while the engine runs
/// its units there and events keep coming: commands are redirected (`ASK`,
/// `TRYAGAIN`) and sent again, the heartbeat keeps renewing, so no unit
/// lapses: every lease keeps its fence token, and every event is handled
/// in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migration_longer_than_the_lease_causes_no_lapse() {
    let (logs, _) = observe();
    let cluster = Arc::new(RedisCluster::start(3, 0).expect("cluster"));
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "migrate").expect("recorder");
    let engine = spawn_recording(&url, &rec, "migrate-a");
    let p = publisher(test_config(&url), "migrate-p");
    // Keys of one shard (the one m0 is in), and a few of others.
    let target = shard("m0");
    let mut keys_here: Vec<String> = (0..2000)
        .map(|i| format!("m{i}"))
        .filter(|k| shard(k) == target)
        .take(4)
        .collect();
    keys_here.push("other-1".to_owned());
    let first: Vec<Posted> = keys_here.iter().map(|k| Posted::new(k, 0)).collect();
    publish_until_out(&p, &first).await;
    handled_in_order(&rec, &published(&first), 0).await;
    let group = recording_group(&url);
    let lease_of = |k: &str| keys::lease(shard(k), group, "ledger", k);
    let before = leases(&cluster, &keys_here, &lease_of).await;
    assert!(before.values().all(Option::is_some), "every key leased");
    let slot = RedisCluster::key_slot(lease_of("m0").as_bytes());
    let from = cluster.master_of_slot(slot).expect("owner");
    let masters = cluster.current_masters().expect("masters");
    let to = *masters
        .iter()
        .find(|i| **i != from)
        .expect("another master");
    let mark = logs.text().len();
    let migrating = {
        let cluster = cluster.clone();
        std::thread::spawn(move || cluster.migrate_slot(slot, to, Duration::from_millis(400)))
    };
    let mut all = first.clone();
    let mut seq = 1;
    while !migrating.is_finished() {
        let events: Vec<Posted> = keys_here.iter().map(|k| Posted::new(k, seq)).collect();
        publish_until_out(&p, &events).await;
        all.extend(events);
        seq += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let moved = migrating
        .join()
        .expect("migration thread")
        .expect("slot migrated");
    assert!(moved.keys >= 5, "the slot held convoy's keys: {moved:?}");
    handled_in_order(&rec, &published(&all), 0).await;
    let text = logs.text();
    let during = &text[mark..];
    assert!(
        !during.contains("liveness lapsed"),
        "a unit lapsed during the slot migration:\n{during}"
    );
    assert_eq!(
        leases(&cluster, &keys_here, &lease_of).await,
        before,
        "a lease (fence token) changed during the migration"
    );
    engine.shutdown().await.expect("shutdown");
}

/// A master is cut off from its replica, takes a publish the replica never
/// gets, and is lost to that replica (`kill -9`, then `CLUSTER FAILOVER
/// TAKEOVER`): with `wait_replicas = 0` the events are gone, and convoy
/// says so, with an ERROR naming the shard and the range and
/// `convoy_replication_lost_total`. Twice: the first time the master is
/// lost at once after the publish, before any engine read the shard's
/// count, and the publisher reports it (naming the outbox seqs) at its
/// next publish there; the second time the engine's heartbeat read the
/// count first, and the engine reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replication_loss_is_reported_with_the_shard_and_the_range() {
    let (logs, metrics) = observe();
    let mut cluster = RedisCluster::start(3, 1).expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "loss").expect("recorder");
    let engine = spawn_recording(&url, &rec, "loss-a");
    let p = publisher(test_config(&url), "loss-p");
    let key = "lost-1";
    let s = shard(key);
    let stream = keys::partition_stream(s, "ledger", key);
    let first: Vec<Posted> = (0..3).map(|n| Posted::new(key, n)).collect();
    publish_until_out(&p, &first).await;
    handled_in_order(&rec, &published(&first), 0).await;

    // 1. Lost at once: the publisher's next publish there finds out.
    let master = cluster.master_of_key(&stream).expect("the shard's master");
    let replica = cluster
        .cut_replication(master)
        .expect("cut the replica off");
    let lost: Vec<Posted> = (3..8).map(|n| Posted::new(key, n)).collect();
    publish_until_out(&p, &lost).await;
    cluster
        .lose_master(master, replica)
        .expect("lose the master to its replica");
    publish_until_out(&p, &[Posted::new(key, 8)]).await;
    let by_publisher = reported(logs, s, "seen_by=\"publisher\"").await;
    assert!(
        by_publisher.contains("the last 5 events published there"),
        "{by_publisher}"
    );
    assert!(by_publisher.contains("outbox seqs"), "{by_publisher}");

    // 2. Read by the engine first: its heartbeat finds out.
    let (master, replica) = cut_off_again(&mut cluster, master, &stream);
    let lost_again: Vec<Posted> = (9..13).map(|n| Posted::new(key, n)).collect();
    publish_until_out(&p, &lost_again).await;
    // The engine's heartbeat reads the shard's counts (every 0.3 s).
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster
        .lose_master(master, replica)
        .expect("lose the master to its replica");
    let group = recording_group(&url);
    let by_engine = reported(logs, s, &format!("seen_by=\"{group}\"")).await;
    assert!(
        by_engine.contains("the last 4 events published there"),
        "{by_engine}"
    );

    let counted = |seen_by: &str| -> u64 {
        metrics
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, _, _, _)| {
                let has = |name: &str, value: &str| {
                    k.key()
                        .labels()
                        .any(|l| l.key() == name && l.value() == value)
                };
                k.key().name() == "convoy_replication_lost_total"
                    && has("shard", &s.to_string())
                    && has("what", "published")
                    && has("seen_by", seen_by)
            })
            .map(|(_, _, _, v)| match v {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum()
    };
    assert_eq!(counted("publisher"), 5, "the publisher counted its loss");

    // 3. Lost last, with nothing published after it: the publisher's
    //    outbox loop, idle, reads the shard's count again and finds out.
    //    (Its first publish here reports case 2's loss too.)
    let (master, replica) = cut_off_again(&mut cluster, master, &stream);
    let lost_last: Vec<Posted> = (14..17).map(|n| Posted::new(key, n)).collect();
    publish_until_out(&p, &lost_last).await;
    cluster
        .lose_master(master, replica)
        .expect("lose the master to its replica");
    let stop = convoy_runtime::CancellationToken::new();
    let idle = {
        let processor = relay(&p);
        let stop = stop.clone();
        tokio::spawn(async move { processor.run(stop).await })
    };
    let line = reported_as(
        logs,
        s,
        "seen_by=\"publisher\"",
        "the last 3 events published there",
    )
    .await;
    assert!(line.contains("outbox seqs"), "{line}");
    let lines: Vec<String> = logs
        .text()
        .lines()
        .filter(|l| l.contains("Redis lost") && l.contains(&format!("shard={s}")))
        .map(str::to_owned)
        .collect();
    // (A snapshot counts since the one before.)
    assert_eq!(
        counted("publisher"),
        4 + 3,
        "every loss counted once: {lines:#?}"
    );
    stop.cancel();
    idle.await.expect("the outbox loop");
    engine.shutdown().await.expect("shutdown");
}

/// Brings the lost `master` back (as a replica), then cuts the replica of
/// `stream`'s master now off from it: the master's next writes are lost
/// with it. Returns the master and the cut-off replica.
fn cut_off_again(cluster: &mut RedisCluster, master: usize, stream: &str) -> (usize, usize) {
    cluster
        .restart_node(master)
        .expect("the old master back, as a replica");
    let master = cluster.master_of_key(stream).expect("the shard's master");
    let replica = cluster
        .cut_replication(master)
        .expect("cut the replica off");
    (master, replica)
}

/// Waits for the ERROR that reports lost published events of `shard`, by
/// the observer `seen_by` (a log field); returns the line.
async fn reported(logs: &CapturedLog, shard: u32, seen_by: &str) -> String {
    reported_as(logs, shard, seen_by, "").await
}

/// [`reported`], the line also holding `saying`.
async fn reported_as(logs: &CapturedLog, shard: u32, seen_by: &str, saying: &str) -> String {
    let find = || {
        logs.text().lines().find_map(|l| {
            (l.contains("Redis lost published events")
                && l.contains(&format!("shard={shard}"))
                && l.contains(seen_by)
                && l.contains(saying))
            .then(|| l.to_owned())
        })
    };
    wait_until(WAIT, "the loss is reported", || {
        let found = find().is_some();
        async move { found }
    })
    .await;
    let line = find().unwrap_or_default();
    assert!(line.contains("ERROR"), "{line}");
    line
}

/// Each key's lease (its fence token), read on a connection of the test's.
async fn leases(
    cluster: &RedisCluster,
    keys: &[String],
    lease_of: &impl Fn(&str) -> String,
) -> BTreeMap<String, Option<String>> {
    let mut c = redis::cluster::ClusterClient::new(cluster.node_urls())
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    let mut out = BTreeMap::new();
    for k in keys {
        let token: Option<String> = redis::cmd("GET")
            .arg(lease_of(k))
            .query_async(&mut c)
            .await
            .expect("GET lease");
        out.insert(k.clone(), token);
    }
    out
}

/// A master of a cluster without replicas is down (and stays down): a
/// publish fails in the shards it served only. The other shards' events
/// leave the outbox at once and are handled while it is down; the rest go
/// out, in order, once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_that_fails_in_one_shard_holds_up_no_other() {
    let _ = observe();
    // The other masters go on serving their slots while one is down.
    let mut cluster = RedisCluster::builder(3, 0)
        .require_full_coverage(false)
        .start()
        .expect("cluster");
    let record = RedisServer::start().expect("record redis");
    let url = cluster.url();
    let rec = Recorder::new(&record.url(), "one-shard").expect("recorder");
    let engine = spawn_recording(&url, &rec, "one-shard-a");
    let p = publisher(test_config(&url), "one-shard-p");
    let keys: Vec<String> = (0..24).map(|k| format!("s{k}")).collect();
    let first: Vec<Posted> = keys.iter().map(|k| Posted::new(k, 0)).collect();
    publish_until_out(&p, &first).await;
    handled_in_order(&rec, &published(&first), 0).await;
    let stream = |k: &str| keys::partition_stream(shard(k), "ledger", k);
    let victim = cluster.master_of_key(&stream("s0")).expect("s0's master");
    let down: Vec<&String> = keys
        .iter()
        .filter(|k| cluster.master_of_key(&stream(k)).expect("master") == victim)
        .collect();
    assert!(down.len() < keys.len(), "some keys are on other masters");
    cluster.node_mut(victim).kill().expect("kill -9 the master");
    let second: Vec<Posted> = keys.iter().map(|k| Posted::new(k, 1)).collect();
    commit(&p, &second).await;
    relay(&p)
        .drain()
        .await
        .expect_err("the victim's shards are down");
    assert_eq!(
        p.outbox().stats().await.expect("stats").pending,
        down.len() as u64,
        "only the events of the down master's shards stay in the outbox"
    );
    let up: Vec<Posted> = second
        .iter()
        .filter(|e| !down.contains(&&e.client_id))
        .cloned()
        .collect();
    let mut expected = published(&first);
    for (k, ids) in published(&up) {
        expected.entry(k).or_default().extend(ids);
    }
    // Handled while the master is still down.
    handled_in_order(&rec, &expected, 0).await;
    assert!(!cluster.node_mut(victim).is_running());
    cluster
        .node_mut(victim)
        .restart()
        .expect("restart the master");
    cluster.wait_ok(WAIT).expect("the cluster is ok again");
    publish_until_out(&p, &[]).await;
    let mut all = first.clone();
    all.extend(second);
    handled_in_order(&rec, &published(&all), 0).await;
    engine.shutdown().await.expect("shutdown");
}
