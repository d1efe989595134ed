//! The testing kit's local Redis Cluster: formed from real processes on
//! free ports, every slot served, a replica promoted on demand, and the
//! cluster faults: every client connection killed, a slot migrated while
//! clients write to it, a master killed, and a master lost to a replica cut
//! off before its last writes.
#![cfg(feature = "testing")]

use std::time::{Duration, Instant};

use convoy_runtime::testing::RedisCluster;
use redis::Commands;

#[test]
fn a_local_cluster_serves_every_slot_and_fails_over_on_demand() {
    let cluster = RedisCluster::start(3, 1).expect("form a cluster");
    assert_eq!(cluster.nodes().len(), 6);
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    let info = cluster.cli(0, &["CLUSTER", "INFO"]).expect("cluster info");
    assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
    let masters = cluster.current_masters().expect("roles");
    assert_eq!(masters.len(), 3, "{masters:?}");
    // A key lands on its slot's master; -c follows the redirection.
    let reply = cluster.cli(0, &["-c", "SET", "{k}a", "1"]).expect("set");
    assert_eq!(reply.trim(), "OK");
    let replica = (0..6).find(|i| !masters.contains(i)).expect("a replica");
    cluster.failover(replica).expect("failover");
    let after = cluster.current_masters().expect("roles");
    assert!(after.contains(&replica), "{after:?}");
    assert_eq!(after.len(), 3);
    assert_eq!(
        cluster.cli(0, &["-c", "GET", "{k}a"]).expect("get").trim(),
        "1"
    );
}

/// A connection to node `i` whose commands fail after two seconds.
fn node_conn(cluster: &RedisCluster, i: usize) -> redis::Connection {
    let conn = redis::Client::open(cluster.node_urls()[i].as_str())
        .expect("client")
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect");
    conn.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    conn
}

fn dbsize(cluster: &RedisCluster, i: usize) -> u64 {
    let mut c = node_conn(cluster, i);
    redis::cmd("DBSIZE").query(&mut c).expect("DBSIZE")
}

#[test]
fn slots_roles_and_ids_are_found_from_the_nodes() {
    let cluster = RedisCluster::start(3, 1).expect("form a cluster");
    for key in ["foo", "{0}ledger:c1", "{15}x", "a{b}c"] {
        let slot = RedisCluster::key_slot(key.as_bytes());
        let reply = cluster
            .cli(0, &["CLUSTER", "KEYSLOT", key])
            .expect("keyslot");
        assert_eq!(reply.trim(), slot.to_string(), "{key}");
        // The master of the slot takes the key without a redirect.
        let m = cluster.master_of_key(key).expect("master of key");
        let reply = cluster.cli(m, &["SET", key, "v"]).expect("set");
        assert_eq!(reply.trim(), "OK", "{key} on node {m}");
    }
    let masters = cluster.current_masters().expect("masters");
    for &m in &masters {
        let replicas = cluster.replicas_of(m).expect("replicas");
        assert_eq!(replicas.len(), 1, "node {m}: {replicas:?}");
        assert!(!masters.contains(&replicas[0]));
        let myid = cluster.cli(m, &["CLUSTER", "MYID"]).expect("myid");
        assert_eq!(myid.trim(), cluster.node_id(m));
    }
    let port = cluster.nodes()[4].port();
    assert_eq!(cluster.node_on_port(port), Some(4));
}

#[test]
fn kill_clients_drops_every_client_connection_on_every_node() {
    let cluster = RedisCluster::start(3, 0).expect("form a cluster");
    let mut conns: Vec<redis::Connection> = (0..3).map(|i| node_conn(&cluster, i)).collect();
    for c in &mut conns {
        let pong: String = redis::cmd("PING").query(c).expect("ping");
        assert_eq!(pong, "PONG");
    }
    let killed = cluster.kill_clients().expect("kill clients");
    assert!(killed >= 3, "killed {killed}");
    for c in &mut conns {
        assert!(redis::cmd("PING").query::<String>(c).is_err());
    }
    // Nothing was left to kill (the kit's own connection is skipped).
    assert_eq!(cluster.kill_clients().expect("kill clients"), 0);
    // A frozen node is skipped, not waited for.
    let mut cluster = cluster;
    cluster.node_mut(1).freeze().expect("freeze");
    let started = Instant::now();
    cluster.kill_clients().expect("kill clients");
    assert!(started.elapsed() < Duration::from_secs(8));
    cluster.node_mut(1).thaw().expect("thaw");
}

/// The slot of keys tagged `tag`, its master and another master to move
/// it to.
fn migration(cluster: &RedisCluster, tag: &[u8]) -> (u16, usize, usize) {
    let slot = RedisCluster::key_slot(tag);
    let from = cluster.master_of_slot(slot).expect("master of slot");
    let to = cluster
        .current_masters()
        .expect("masters")
        .into_iter()
        .find(|m| *m != from)
        .expect("another master");
    (slot, from, to)
}

#[test]
fn a_slot_migrates_key_by_key_while_clients_write_to_it() {
    let cluster = RedisCluster::start(3, 0).expect("form a cluster");
    let (slot, from, to) = migration(&cluster, b"{mig}");
    let client = redis::cluster::ClusterClient::new(cluster.node_urls()).expect("client");
    let mut c = client.get_connection().expect("cluster connection");
    for i in 0..40 {
        let _: () = c.set(format!("{{mig}}old:{i}"), i).expect("set");
    }
    let pause = Duration::from_millis(25);
    let started = Instant::now();
    let migration = std::thread::scope(|s| {
        let job = s.spawn(|| cluster.migrate_slot(slot, to, pause));
        // The application goes on: new keys and updates of old ones (the
        // client follows ASK, and retries TRYAGAIN).
        let mut i = 0;
        while !job.is_finished() {
            let _: () = c.set(format!("{{mig}}new:{i}"), i).expect("set new");
            let _: i64 = c.incr(format!("{{mig}}old:{}", i % 40), 1).expect("incr");
            i += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        job.join().expect("migration thread")
    })
    .expect("migrate");
    assert!(started.elapsed() >= pause * 40, "{:?}", started.elapsed());
    assert_eq!(
        (migration.slot, migration.from, migration.to),
        (slot, from, to)
    );
    assert!(migration.keys >= 40, "{migration:?}");
    assert_eq!(cluster.master_of_slot(slot).expect("master"), to);
    // Every key is on the new master, none left behind.
    let count = |i: usize| -> u64 {
        let mut n = node_conn(&cluster, i);
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut n)
            .expect("count")
    };
    assert_eq!(count(from), 0);
    assert_eq!(count(to), dbsize(&cluster, to));
    assert!(count(to) >= 40);
    // Every node agrees, and a fresh client reads every key.
    for m in 0..3 {
        let nodes = cluster.cli(m, &["CLUSTER", "NODES"]).expect("nodes");
        let owner = nodes
            .lines()
            .find(|l| l.starts_with(cluster.node_id(to)))
            .expect("target line");
        assert!(!owner.contains("->-") && !owner.contains("-<-"), "{owner}");
    }
    let mut fresh = client.get_connection().expect("fresh connection");
    for i in 0..40 {
        let v: i64 = fresh.get(format!("{{mig}}old:{i}")).expect("get");
        assert!(v >= i);
    }
    // Moving it to where it is does nothing.
    let again = cluster.migrate_slot(slot, to, pause).expect("no-op");
    assert_eq!(again.keys, 0);
}

#[test]
fn a_master_killed_is_replaced_by_its_replica_and_comes_back_as_a_replica() {
    let mut cluster = RedisCluster::start(3, 1).expect("form a cluster");
    let m = cluster.master_of_key("{km}").expect("master");
    let replica = cluster.replicas_of(m).expect("replicas")[0];
    let new = cluster.kill_master(m).expect("kill master");
    assert_eq!(new, replica);
    assert_eq!(cluster.master_of_key("{km}").expect("master"), new);
    cluster.restart_node(m).expect("restart");
    assert_eq!(cluster.replicas_of(new).expect("replicas"), vec![m]);
}

#[test]
fn a_write_made_after_the_cut_is_missing_on_the_promoted_replica() {
    let mut cluster = RedisCluster::builder(3, 1)
        .fsync_always(true)
        .start()
        .expect("form a cluster");
    let m = cluster.master_of_key("{cut}").expect("master");
    assert_eq!(
        cluster
            .cli(m, &["SET", "{cut}before", "1"])
            .expect("set")
            .trim(),
        "OK"
    );
    let replica = cluster.cut_replication(m).expect("cut");
    assert_eq!(
        cluster
            .cli(m, &["SET", "{cut}after", "2"])
            .expect("set")
            .trim(),
        "OK"
    );
    // The master has both (and fsynced them); the replica gets neither
    // the write nor, after the kill, anything from the master's socket.
    assert_eq!(dbsize(&cluster, m), 2);
    cluster.lose_master(m, replica).expect("lose the master");
    assert_eq!(cluster.master_of_key("{cut}").expect("master"), replica);
    assert_eq!(
        cluster
            .cli(replica, &["GET", "{cut}before"])
            .expect("get")
            .trim(),
        "1"
    );
    assert_eq!(
        cluster
            .cli(replica, &["EXISTS", "{cut}after"])
            .expect("exists")
            .trim(),
        "0"
    );
    assert_eq!(dbsize(&cluster, replica), 1);
    // The old master comes back with the write in its append-only file,
    // and drops it: it is now the new master's replica.
    cluster.restart_node(m).expect("restart");
    assert_eq!(cluster.replicas_of(replica).expect("replicas"), vec![m]);
    assert_eq!(dbsize(&cluster, m), 1);
    assert_eq!(cluster.master_of_key("{cut}").expect("master"), replica);
}

/// A cut-off replica answers its clients at once (it is not frozen), keeps
/// getting nothing while its reconnections are refused, and re-syncs once
/// healed.
#[test]
fn a_cut_off_replica_answers_gets_nothing_new_and_resyncs_when_healed() {
    let mut cluster = RedisCluster::start(3, 1).expect("form a cluster");
    let m = cluster.master_of_key("{heal}").expect("master");
    let replica = cluster.cut_replication(m).expect("cut");
    assert_eq!(
        cluster
            .cli(m, &["SET", "{heal}k", "1"])
            .expect("set")
            .trim(),
        "OK"
    );
    // The replica tries to reconnect about once a second.
    std::thread::sleep(Duration::from_millis(2500));
    let started = Instant::now();
    assert_eq!(
        cluster.cli(replica, &["PING"]).expect("ping").trim(),
        "PONG"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(dbsize(&cluster, replica), 0, "nothing reached the replica");
    cluster.heal_replication(replica).expect("heal");
    let started = Instant::now();
    while dbsize(&cluster, replica) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the healed replica never re-synced"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_slot_migration_goes_on_through_repeated_connection_kills() {
    let cluster = RedisCluster::start(3, 0).expect("form a cluster");
    let (slot, from, to) = migration(&cluster, b"{killed}");
    for i in 0..30 {
        let reply = cluster
            .cli(from, &["SET", &format!("{{killed}}{i}"), "v"])
            .expect("set");
        assert_eq!(reply.trim(), "OK");
    }
    let mut kills = 0;
    let migration = std::thread::scope(|s| {
        let job = s.spawn(|| cluster.migrate_slot(slot, to, Duration::from_millis(20)));
        // Kills every 2 ms land in the handshakes of the connections that
        // replace killed ones and in the kit's own `redis-cli` probes too.
        while !job.is_finished() {
            kills += cluster.kill_clients().expect("kill clients");
            std::thread::sleep(Duration::from_millis(2));
        }
        job.join().expect("migration thread")
    })
    .expect("the migration survives its connections being killed");
    assert!(kills > 0, "no connection was killed");
    assert_eq!(migration.keys, 30);
    assert_eq!(cluster.master_of_slot(slot).expect("master"), to);
    assert_eq!(dbsize(&cluster, to), 30);
    assert_eq!(dbsize(&cluster, from), 0);
}
