//! Operators' pauses against a real `redis-server` and real engines: a
//! paused key starts no new event (the one in flight finishes) while the
//! other keys go on; the pause holds through an engine restart and a
//! change of owner; a prefix pause holds a tenant's keys, one first seen
//! after the pause included; resuming goes on in order. What ran, and
//! when, is read from the recorder, outside the engines.

mod support;

use std::time::Duration;

use convoy_runtime::redis::admin::{Admin, AdminError, PauseTarget};
use convoy_runtime::testing::{Recorder, RedisServer};
use support::{Posted, Recording, domain, publish, test_config, wait_until};

const WAIT: Duration = Duration::from_secs(30);

fn posted(key: &str, seqs: std::ops::Range<u64>) -> Vec<Posted> {
    seqs.map(|n| Posted::new(key, n)).collect()
}

fn ids(key: &str, seqs: std::ops::Range<u64>) -> Vec<String> {
    seqs.map(|n| format!("{key}#{n}")).collect()
}

/// Waits until the engines read pauses (a key's pause holds no event of
/// another): long enough for a wake-up, far shorter than the assertions'
/// windows.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_key_finishes_its_event_in_flight_starts_no_other_and_resumes_in_order() {
    let server = RedisServer::start().expect("redis-server");
    let rec = Recorder::new(&server.url(), "pause").expect("recorder");
    let mut handler = Recording::new(rec.clone(), "e1", Duration::from_millis(5));
    handler.slow_keys.insert("slow".into());
    handler.slow_work = Duration::from_millis(1500);
    let d1 = domain(test_config(&server.url()), "e1", handler);
    let e1 = d1.engine().spawn();
    let admin = Admin::connect(&server.url()).await.expect("admin");

    publish(&d1, &posted("a", 0..3), convoy_runtime::Priority::Normal).await;
    publish(&d1, &posted("b", 0..3), convoy_runtime::Priority::Normal).await;
    publish(&d1, &posted("slow", 0..2), convoy_runtime::Priority::Normal).await;
    wait_until(WAIT, "a and b handled, slow#0 in flight", || async {
        rec.seen("a").await.is_ok_and(|s| s.len() == 3)
            && rec.seen("b").await.is_ok_and(|s| s.len() == 3)
            && rec.seen("slow").await.is_ok_and(|s| s.len() == 1)
    })
    .await;

    // Pause `a` (every handler) and `slow` while its first event runs.
    let o = admin
        .pause(
            "ledger",
            &PauseTarget::Key("a".into()),
            None,
            "fixing balances",
            "ops",
        )
        .await
        .expect("pause a");
    assert_eq!(o.pause.operator, "ops");
    admin
        .pause("ledger", &PauseTarget::Key("slow".into()), None, "", "ops")
        .await
        .expect("pause slow");
    let again = admin
        .pause(
            "ledger",
            &PauseTarget::Key("a".into()),
            None,
            "twice",
            "bob",
        )
        .await
        .expect_err("paused already");
    assert!(matches!(again, AdminError::AlreadyPaused { .. }), "{again}");
    settle().await;
    publish(&d1, &posted("a", 3..6), convoy_runtime::Priority::Normal).await;
    publish(&d1, &posted("b", 3..6), convoy_runtime::Priority::Normal).await;
    wait_until(WAIT, "b goes on", || async {
        rec.seen("b").await.is_ok_and(|s| s.len() == 6)
    })
    .await;
    // The event in flight finished; the next one of `slow` never started.
    wait_until(WAIT, "slow#0 finishes", || async {
        rec.windows_of("slow")
            .await
            .is_ok_and(|w| w.len() == 1 && w[0].end_us != u64::MAX)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rec.seen("a").await.expect("seen"), ids("a", 0..3));
    assert_eq!(rec.seen("slow").await.expect("seen"), ids("slow", 0..1));
    let report = admin.partitions("ledger").await.expect("partitions");
    let row = report
        .partitions
        .iter()
        .find(|p| p.key == "a")
        .expect("a's row");
    let held = row.key_pause.as_ref().expect("shown as paused");
    assert_eq!(held.reason, "fixing balances");
    assert!(
        report
            .partitions
            .iter()
            .any(|p| p.key == "b" && p.key_pause.is_none())
    );

    // A restart and a change of owner keep the pause.
    e1.shutdown().await.expect("shutdown e1");
    let d2 = domain(
        test_config(&server.url()),
        "e2",
        Recording::new(rec.clone(), "e2", Duration::from_millis(5)),
    );
    let e2 = d2.engine().spawn();
    publish(&d2, &posted("b", 6..8), convoy_runtime::Priority::Normal).await;
    wait_until(WAIT, "e2 handles b", || async {
        rec.seen("b").await.is_ok_and(|s| s.len() == 8)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        rec.seen("a").await.expect("seen"),
        ids("a", 0..3),
        "still paused after the restart, under its new owner"
    );

    // Resumed: the rest, in order.
    admin
        .resume("ledger", &PauseTarget::Key("a".into()), None, "ops")
        .await
        .expect("resume a");
    admin
        .resume("ledger", &PauseTarget::Key("slow".into()), None, "ops")
        .await
        .expect("resume slow");
    wait_until(WAIT, "a and slow resumed", || async {
        rec.seen("a").await.is_ok_and(|s| s.len() == 6)
            && rec.seen("slow").await.is_ok_and(|s| s.len() == 2)
    })
    .await;
    assert_eq!(rec.seen("a").await.expect("seen"), ids("a", 0..6));
    assert_eq!(rec.seen("slow").await.expect("seen"), ids("slow", 0..2));
    assert_eq!(
        rec.violations().await.expect("violations"),
        Vec::<String>::new()
    );
    let e = admin
        .resume("ledger", &PauseTarget::Key("a".into()), None, "ops")
        .await
        .expect_err("not paused");
    assert!(matches!(e, AdminError::NotPaused { .. }), "{e}");
    let ops: Vec<String> = admin
        .audit(20)
        .await
        .expect("audit")
        .iter()
        .map(|r| r.fields["op"].clone())
        .collect();
    assert_eq!(ops, ["pause", "pause", "resume", "resume"]);
    e2.shutdown().await.expect("shutdown e2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_prefix_pause_holds_a_tenants_keys_including_new_ones() {
    let server = RedisServer::start().expect("redis-server");
    let rec = Recorder::new(&server.url(), "prefix").expect("recorder");
    let d = domain(
        test_config(&server.url()),
        "e1",
        Recording::new(rec.clone(), "e1", Duration::from_millis(2)),
    );
    let engine = d.engine().spawn();
    let admin = Admin::connect(&server.url()).await.expect("admin");
    publish(&d, &posted("t1-a", 0..2), convoy_runtime::Priority::Normal).await;
    wait_until(WAIT, "t1-a handled", || async {
        rec.seen("t1-a").await.is_ok_and(|s| s.len() == 2)
    })
    .await;
    let group = admin.groups("ledger").await.expect("groups");
    let recording = group
        .iter()
        .find(|g| g.ends_with("Recording"))
        .expect("the recording handler")
        .clone();
    admin
        .pause(
            "ledger",
            &PauseTarget::Prefix("t1-".into()),
            Some("Recording"),
            "tenant 1 migration",
            "ops",
        )
        .await
        .expect("pause the prefix");
    assert_eq!(
        admin.pauses("ledger").await.expect("pauses")[0]
            .handler
            .as_deref(),
        Some(recording.as_str())
    );
    settle().await;
    // t1-new is first seen after the pause.
    publish(&d, &posted("t1-a", 2..4), convoy_runtime::Priority::Normal).await;
    publish(
        &d,
        &posted("t1-new", 0..2),
        convoy_runtime::Priority::Normal,
    )
    .await;
    publish(&d, &posted("t2-a", 0..3), convoy_runtime::Priority::Normal).await;
    wait_until(WAIT, "the other tenant goes on", || async {
        rec.seen("t2-a").await.is_ok_and(|s| s.len() == 3)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(rec.seen("t1-a").await.expect("seen"), ids("t1-a", 0..2));
    assert!(rec.seen("t1-new").await.expect("seen").is_empty());
    admin
        .resume(
            "ledger",
            &PauseTarget::Prefix("t1-".into()),
            Some("Recording"),
            "ops",
        )
        .await
        .expect("resume");
    wait_until(WAIT, "the tenant resumed", || async {
        rec.seen("t1-a").await.is_ok_and(|s| s.len() == 4)
            && rec.seen("t1-new").await.is_ok_and(|s| s.len() == 2)
    })
    .await;
    assert_eq!(rec.seen("t1-a").await.expect("seen"), ids("t1-a", 0..4));
    assert_eq!(rec.seen("t1-new").await.expect("seen"), ids("t1-new", 0..2));
    engine.shutdown().await.expect("shutdown");
}
