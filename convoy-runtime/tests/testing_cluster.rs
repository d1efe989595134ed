//! The testing kit's local Redis Cluster: formed from real processes on
//! free ports, every slot served, and a replica promoted on demand.
#![cfg(feature = "testing")]

use convoy_runtime::testing::RedisCluster;

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
