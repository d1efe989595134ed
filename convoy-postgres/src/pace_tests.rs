//! When commits notify, against a real PostgreSQL: a commit skips its
//! notification only while the relay holds *busy*; going idle waits for a
//! commit that skipped one, and for a former leader's *busy*; a relay
//! session that dies leaves every commit notifying.

use std::time::Duration;

use sqlx::postgres::PgListener;

use super::super::PgOutbox;
use convoy_core::envelope::{Envelope, Priority};
use convoy_testkit::PgServer;

/// Within this a notification sent at commit has arrived.
const DELIVERED: Duration = Duration::from_secs(5);
/// Nothing arrived within this: no notification was sent.
const QUIET: Duration = Duration::from_millis(400);

async fn outbox(server: &PgServer) -> PgOutbox {
    let outbox = PgOutbox::connect_lazy(&server.url()).expect("outbox");
    outbox.migrate().await.expect("migrate");
    outbox
}

async fn listen(outbox: &PgOutbox) -> PgListener {
    let mut l = PgListener::connect_with(outbox.pool())
        .await
        .expect("listener");
    l.listen(&outbox.inner.tables.channel)
        .await
        .expect("LISTEN");
    l
}

fn envelope(key: &str) -> Envelope {
    Envelope {
        id: format!("m-{key}"),
        type_name: "T".into(),
        category: "c".into(),
        partition_key: Some(key.into()),
        time_ms: 0,
        priority: Priority::Normal,
        correlation_id: None,
        payload: "{}".into(),
        origin: None,
        replay: None,
    }
}

/// A transaction that writes one row of `key`, left open.
async fn write(outbox: &PgOutbox, key: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = outbox.pool().begin().await.expect("begin");
    outbox
        .insert_in(&mut tx, &[envelope(key)])
        .await
        .expect("insert");
    tx
}

async fn notified(l: &mut PgListener, within: Duration) -> bool {
    tokio::time::timeout(within, l.recv()).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_skips_its_notification_only_while_the_relay_is_busy() {
    let server = PgServer::start().expect("postgres");
    let outbox = outbox(&server).await;
    let mut l = listen(&outbox).await;
    write(&outbox, "a").await.commit().await.expect("commit");
    assert!(
        notified(&mut l, DELIVERED).await,
        "the relay is idle: notified"
    );
    assert!(outbox.publisher_busy().await, "nobody else holds busy");
    write(&outbox, "b").await.commit().await.expect("commit");
    assert!(
        !notified(&mut l, QUIET).await,
        "the relay is busy: no notification"
    );
    assert!(outbox.publisher_idle().await, "no commit under way");
    write(&outbox, "c").await.commit().await.expect("commit");
    assert!(notified(&mut l, DELIVERED).await, "idle again: notified");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn going_idle_waits_for_a_commit_that_skipped_its_notification() {
    let server = PgServer::start().expect("postgres");
    let outbox = outbox(&server).await;
    assert!(outbox.publisher_busy().await);
    let skipped = write(&outbox, "a").await;
    assert!(
        !outbox.publisher_idle().await,
        "a transaction that skipped its notification is under way"
    );
    // Still refused while it is open, however often the relay asks.
    assert!(!outbox.publisher_idle().await);
    skipped.commit().await.expect("commit");
    assert!(
        outbox.publisher_idle().await,
        "it is over: one more read finds it"
    );
    // A writer that started after the relay went idle notifies (any open
    // writer keeps the relay from settling: it cannot tell which kind).
    let mut l = listen(&outbox).await;
    let tx = write(&outbox, "b").await;
    assert!(!outbox.publisher_idle().await);
    tx.commit().await.expect("commit");
    assert!(notified(&mut l, DELIVERED).await);
    assert!(outbox.publisher_idle().await);
}

/// A new leader cannot settle while its predecessor's session still holds
/// *busy* (a leader that stalled: PostgreSQL ends that session only after
/// the leader timeout): writers go on skipping their notification
/// meanwhile, so the new leader keeps reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_does_not_settle_while_a_former_leader_holds_busy() {
    let server = PgServer::start().expect("postgres");
    let former = outbox(&server).await;
    let leader = outbox(&server).await;
    let mut l = listen(&leader).await;
    assert!(former.publisher_busy().await);
    write(&leader, "a").await.commit().await.expect("commit");
    assert!(
        !notified(&mut l, QUIET).await,
        "the former leader holds busy: commits skip their notification"
    );
    assert!(
        !leader.publisher_idle().await,
        "busy is held elsewhere: the new leader may not wait for notifications"
    );
    assert!(former.publisher_idle().await, "the former leader lets go");
    assert!(
        leader.publisher_idle().await,
        "busy is free and no writer is under way"
    );
    write(&leader, "b").await.commit().await.expect("commit");
    assert!(notified(&mut l, DELIVERED).await);
}

/// A relay that stops publishing closes its busy session: a replica that
/// no longer leads keeps no connection for it (closing releases *busy*
/// too, so the next leader can take it at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_stops_publishing_closes_its_busy_session() {
    let server = PgServer::start().expect("postgres");
    let former = outbox(&server).await;
    let next = outbox(&server).await;
    assert!(former.publisher_busy().await);
    assert!(!next.publisher_busy().await, "busy is the former's");
    former.publisher_stopped().await;
    let deadline = std::time::Instant::now() + DELIVERED;
    while !next.publisher_busy().await {
        assert!(
            std::time::Instant::now() < deadline,
            "the former relay's session still holds busy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        former.inner.publisher.lock().await.conn.is_none(),
        "no session kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_relay_whose_session_ends_leaves_every_commit_notifying() {
    let server = PgServer::start().expect("postgres");
    // A short leader timeout: the relay checks a busy session it holds
    // every quarter of it (500 ms).
    let outbox = PgOutbox::from_config(&convoy_core::config::OutboxConfig {
        postgres_url: Some(server.url()),
        leader_timeout_ms: 2_000,
        ..Default::default()
    })
    .expect("outbox");
    outbox.migrate().await.expect("migrate");
    let mut l = listen(&outbox).await;
    assert!(outbox.publisher_busy().await);
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_locks
         WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted",
    )
    .fetch_one(outbox.pool())
    .await
    .expect("terminate the relay's session");
    assert_eq!(ended, 1);
    // The backend exits (and lets go of its locks) a moment after the
    // signal.
    for _ in 0..100 {
        let held: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks
             WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted",
        )
        .fetch_one(outbox.pool())
        .await
        .expect("pg_locks");
        if held == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    write(&outbox, "a").await.commit().await.expect("commit");
    assert!(
        notified(&mut l, DELIVERED).await,
        "busy went with the session"
    );
    // The relay finds out at its next check, and takes busy again on a
    // new session.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut busy = outbox.publisher_busy().await;
    if !busy {
        busy = outbox.publisher_busy().await;
    }
    assert!(busy, "busy again on a new session");
}

/// A relay that stops using its session while busy (stalled) loses it
/// after the leader timeout, and with it busy: commits notify again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_busy_relay_loses_busy_after_the_leader_timeout() {
    let server = PgServer::start().expect("postgres");
    let outbox = PgOutbox::from_config(&convoy_core::config::OutboxConfig {
        postgres_url: Some(server.url()),
        leader_timeout_ms: 300,
        ..Default::default()
    })
    .expect("outbox");
    outbox.migrate().await.expect("migrate");
    let mut l = listen(&outbox).await;
    assert!(outbox.publisher_busy().await);
    write(&outbox, "a").await.commit().await.expect("commit");
    assert!(!notified(&mut l, QUIET).await, "busy: no notification");
    tokio::time::sleep(Duration::from_millis(900)).await;
    write(&outbox, "b").await.commit().await.expect("commit");
    assert!(
        notified(&mut l, DELIVERED).await,
        "the idle session ended, and busy with it"
    );
}

/// A writer tests *busy* only once it holds *flush*: a write that waits
/// for *flush* while the relay goes idle finds *busy* free and notifies.
/// (Had it tested first, it would have seen the relay busy and skipped
/// its notification, and the relay, settled once *flush* was free, would
/// wait for one that never comes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_tests_busy_only_once_it_holds_flush() {
    let server = PgServer::start().expect("postgres");
    let outbox = outbox(&server).await;
    let mut l = listen(&outbox).await;
    // Another session holds *flush* exclusively (as the relay does for a
    // moment going idle).
    let mut other = outbox.pool().acquire().await.expect("a session");
    let flush = outbox.inner.tables.flush_lock;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(flush)
        .execute(&mut *other)
        .await
        .expect("hold flush");
    assert!(outbox.publisher_busy().await);
    let writer = tokio::spawn({
        let outbox = outbox.clone();
        async move { write(&outbox, "a").await.commit().await }
    });
    // The writer's statement waits for *flush*.
    let mut waiting = 0;
    for _ in 0..250 {
        waiting = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        .fetch_one(outbox.pool())
        .await
        .expect("pg_locks");
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(waiting, 1, "the writer waits for flush");
    assert!(
        !outbox.publisher_idle().await,
        "flush is held: the relay lets go of busy but does not settle"
    );
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(flush)
        .execute(&mut *other)
        .await
        .expect("release flush");
    writer.await.expect("writer").expect("commit");
    assert!(
        notified(&mut l, DELIVERED).await,
        "busy was free when the writer held flush: notified"
    );
}
