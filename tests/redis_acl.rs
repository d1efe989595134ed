//! A Redis ACL user limited to convoy's key patterns and commands
//! (`convoy_runtime::redis::acl::rules`) runs everything: publishing,
//! partitioned and ordinary consumers, retries, halts, reaping and the
//! operators' tools; Redis's `ACL LOG` stays empty.

mod support;

use std::time::Duration;

use convoy_runtime::Priority;
use convoy_runtime::redis::acl;
use convoy_runtime::redis::admin::Admin;
use convoy_runtime::testing::{Recorder, RedisServer};
use redis::Value;
use support::*;

const WAIT: Duration = Duration::from_secs(20);

/// The entries of Redis's ACL log (denied commands and keys).
async fn acl_log(c: &mut redis::aio::MultiplexedConnection) -> Vec<Value> {
    redis::cmd("ACL")
        .arg("LOG")
        .query_async(c)
        .await
        .expect("ACL LOG")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_limited_to_convoys_keys_runs_everything() {
    let server = RedisServer::start().expect("redis");
    let mut root = server.connection().await.expect("conn");
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("app").arg("on").arg(">s3cret");
    for rule in acl::rules(&["ledger"]) {
        setuser.arg(rule);
    }
    // On servers with `CLIENT SETINFO` (Redis 7.2+: Redis 8, Valkey) the client
    // names itself on connect: `acl::COMMANDS` says to allow it there.
    if server.kind() != convoy_runtime::testing::ServerKind::Redis {
        setuser.arg("+client|setinfo");
    }
    let _: () = setuser.query_async(&mut root).await.expect("ACL SETUSER");
    let url = format!("redis://app:s3cret@127.0.0.1:{}/", server.port());

    // The handlers record through the default user: the recorder's keys
    // are the test's, not convoy's.
    let rec = Recorder::new(&server.url(), "acl").expect("recorder");
    let mut config = test_config(&url);
    config.server.partitioning.reap_idle_ms = 300;
    let engine = spawn_recording_with(config.clone(), &rec, "e0");
    let mut events = interleaved(3, 3);
    events.push(Posted {
        poison: true,
        ..Posted::new("c9", 0)
    });
    let publisher = publisher(config, "p");
    publish(&publisher, &events, Priority::Normal).await;
    let mut uow = publisher.unit_of_work();
    uow.raise(Audited {
        note: "unkeyed".into(),
    })
    .expect("raise");
    uow.commit().await.expect("commit");
    publish_outbox(&publisher).await;
    // An elected relay's take-over (publish.lua keeps its keys for good).
    publisher
        .broker()
        .take_over(&convoy_runtime::broker::Producer {
            name: "pg/acl".into(),
            epoch: 1,
        })
        .await
        .expect("an elected relay takes over as the ACL user");

    let mut expected = published(&events[..9]);
    expected.insert("audit".into(), vec!["unkeyed".into()]);
    let start = std::time::Instant::now();
    while !all_seen(&rec, &expected).await {
        assert!(
            start.elapsed() < WAIT,
            "not every event was handled as the ACL user; Redis denied: {:?}",
            acl_log(&mut root).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let admin = Admin::connect(&url).await.expect("admin as the ACL user");
    let group = recording_group(&url);
    wait_until(WAIT, "c9 halted", || async {
        admin
            .inspect("ledger", "c9", group)
            .await
            .is_ok_and(|i| i.status.halted)
    })
    .await;
    let report = admin.partitions("ledger").await.expect("partitions");
    assert_eq!(report.totals.halted, 1, "{report:?}");
    admin
        .dead_letter("ledger", "c9", group, false, "ops")
        .await
        .expect("dead-letter as the ACL user");
    let letters = admin.dlq("ledger", Some("c9")).await.expect("dlq");
    assert_eq!(letters.len(), 1);
    admin.audit(10).await.expect("audit");
    // Drained partitions are reaped by their owner (reap.lua).
    wait_until(WAIT, "drained partitions reaped", || async {
        admin
            .partitions("ledger")
            .await
            .is_ok_and(|r| r.totals.partitions == 0)
    })
    .await;

    engine.shutdown().await.expect("shutdown");
    let log = acl_log(&mut root).await;
    assert!(log.is_empty(), "Redis denied the ACL user: {log:?}");
}

#[test]
fn the_operations_guide_shows_the_rule_the_code_gives() {
    let guide = include_str!("../docs/operations.md");
    let line = acl::setuser("convoy", "PASSWORD", &["order", "payment"]);
    assert!(
        guide.contains(&line),
        "docs/operations.md's ACL rule is out of date; it should read:\n{line}"
    );
}

#[test]
fn the_rule_names_the_categories_and_convoys_own_keys() {
    // A space after the last rule, so every rule is matched as a whole word.
    let line = acl::setuser("app", "PASSWORD", &["order", "payment"]) + " ";
    for part in [
        "ACL SETUSER app reset on >PASSWORD resetkeys ",
        " ~{*}order ~{*}order:* ~order:__wake__ ~{*}payment ~{*}payment:* ~payment:__wake__ ~{*}convoy:* ~convoy:* ",
        " resetchannels -@all ",
        " +evalsha ",
        " +xreadgroup ",
        " +sscan ",
        " +cluster|slots ",
        " +asking ",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
}
