//! The PostgreSQL outbox against a real PostgreSQL and a real Redis, both
//! started by the test kit: events committed in the caller's transaction,
//! published in commit order per key, nothing left by a rollback, nothing
//! lost while Redis is down. (Crash, replica and exactly-once tests with
//! real processes are in `pg_failover.rs`.)

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use convoy_runtime::Domain;
use convoy_runtime::testing::Recorder;
use support::pg::{PgEnv, seqs};
use support::{Posted, Recording, all_seen, domain, publisher, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// Raises `events` in one transaction of `pool` and commits (or rolls back).
async fn commit_events(domain: &Domain, pool: &sqlx::PgPool, events: &[Posted], commit: bool) {
    let mut tx = pool.begin().await.expect("begin");
    let mut uow = domain.unit_of_work();
    for e in events {
        uow.raise(e.clone()).expect("raise");
    }
    uow.commit_in(&mut tx).await.expect("commit_in");
    if commit {
        tx.commit().await.expect("commit");
    } else {
        tx.rollback().await.expect("rollback");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_commit_with_the_transaction_publish_in_order_and_a_rollback_leaves_none() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    let recorder = Recorder::new(&env.redis.url(), "pg-basic").expect("recorder");
    let d = domain(
        env.config(),
        "e1",
        Recording::new(recorder.clone(), "e1", Duration::ZERO),
    );
    let engine = d.engine().spawn();
    // The engine migrates the tables at start; wait for them.
    wait_until(WAIT, "the outbox tables", || async {
        env.pg
            .psql("app", "SELECT count(*) FROM convoy_outbox")
            .is_ok()
    })
    .await;

    for seq in 0..5 {
        commit_events(&d, &pool, &[Posted::new("a", seq)], true).await;
    }
    commit_events(&d, &pool, &[Posted::new("a", 99)], false).await;
    commit_events(&d, &pool, &[Posted::new("a", 5), Posted::new("b", 0)], true).await;

    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    expected.insert("a".into(), (0..6).map(|s| format!("a#{s}")).collect());
    expected.insert("b".into(), vec!["b#0".into()]);
    wait_until(WAIT, "every committed event handled", || {
        all_seen(&recorder, &expected)
    })
    .await;
    engine.shutdown().await.expect("shutdown");

    // Handled entries are trimmed from the streams: the handler's record
    // of what it saw, in order, is the check.
    let seen = recorder.seen_all().await.expect("seen");
    assert_eq!(
        seen, expected,
        "handled once each, in commit order; the rolled-back event never"
    );
    assert_eq!(env.statuses(), (0, 7, 0), "every committed row published");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_key_transactions_publish_in_commit_order_even_when_the_first_to_insert_commits_last()
{
    let env = PgEnv::start();
    let pool = env.pool().await;
    env.outbox().await;
    let d = publisher(env.config(), "writer");

    // T1 inserts first and commits last; T2, for the same key, inserts and
    // commits while T1 is open. Without the per-key lock T2 would commit
    // first with the larger id, and publishing by id would invert them.
    let mut t1 = pool.begin().await.expect("begin t1");
    let mut uow = d.unit_of_work();
    uow.raise(Posted::new("k", 1)).expect("raise");
    uow.commit_in(&mut t1).await.expect("commit_in t1");
    let t2 = tokio::spawn({
        let d = d.clone();
        let pool = pool.clone();
        async move { commit_events(&d, &pool, &[Posted::new("k", 2)], true).await }
    });
    // Another key is not held up by k's lock.
    commit_events(&d, &pool, &[Posted::new("other", 0)], true).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    t1.commit().await.expect("commit t1");
    t2.await.expect("t2");

    let order = env.commit_order();
    let engine = d.engine().spawn();
    wait_until(WAIT, "both rows published", || async {
        env.stream("k").await.len() == 2
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    assert_eq!(
        seqs(&env.stream("k").await),
        order["k"],
        "stream order is commit order"
    );
    assert_eq!(seqs(&env.stream("other").await), vec![0]);
}

/// A transaction raising for a key held by another takes no row id before
/// it has the key's lock: ids are taken in lock order, so within a key id
/// order is commit order. (Were the ids taken first, a waiting
/// transaction's smaller id could commit after a larger one of the same
/// key, and the relay, publishing by id, would reorder them.) Checked on
/// the table's identity sequence, which moves outside transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_transaction_waiting_for_a_keys_lock_has_taken_no_row_id() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    env.outbox().await;
    let d = publisher(env.config(), "writer");
    // The last id the table's identity sequence gave (none yet: NULL).
    let last_id = || async {
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT pg_sequence_last_value(pg_get_serial_sequence('convoy_outbox', 'id')::regclass)",
        )
        .fetch_one(&pool)
        .await
        .expect("read the id sequence")
    };
    let mut t1 = pool.begin().await.expect("begin t1");
    let mut uow = d.unit_of_work();
    uow.raise(Posted::new("k", 1)).expect("raise");
    uow.commit_in(&mut t1).await.expect("commit_in t1");
    let taken = last_id().await;
    assert!(taken.is_some(), "t1 took an id");
    let t2 = tokio::spawn({
        let d = d.clone();
        let pool = pool.clone();
        async move { commit_events(&d, &pool, &[Posted::new("k", 2)], true).await }
    });
    wait_until(WAIT, "t2 waits for the key's lock", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        .fetch_one(&pool)
        .await
        .expect("pg_locks")
            > 0
    })
    .await;
    assert_eq!(
        last_id().await,
        taken,
        "the waiting transaction took a row id before the key's lock"
    );
    t1.commit().await.expect("commit t1");
    t2.await.expect("t2");
    assert_eq!(
        last_id().await,
        taken.map(|id| id + 1),
        "t2 took its id once it had the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_writers_over_few_keys_publish_each_key_in_commit_order() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    env.outbox().await;
    let d = publisher(env.config(), "writers");
    env.pg
        .psql("app", "CREATE TABLE commits (key text, seq bigint)")
        .expect("commit log table");
    let keys = ["k0", "k1", "k2", "k3"];
    let writers = 8;
    let per_writer = 40u64;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let d = d.clone();
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for i in 0..per_writer {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = keys[(rng % keys.len() as u64) as usize];
                let mut tx = pool.begin().await.expect("begin");
                let mut uow = d.unit_of_work();
                // seq: unique per event (writer, i).
                uow.raise(Posted::new(key, w as u64 * 1000 + i))
                    .expect("raise");
                uow.commit_in(&mut tx).await.expect("commit_in");
                // A row of the test's own in the same transaction: its
                // commit timestamp is the transaction's (the outbox row's
                // version changes when the relay marks it published).
                sqlx::query("INSERT INTO commits (key, seq) VALUES ($1, $2)")
                    .bind(key)
                    .bind((w as u64 * 1000 + i) as i64)
                    .execute(&mut *tx)
                    .await
                    .expect("commit log");
                // Hold some transactions open so that later ones of other
                // keys commit first.
                if rng.is_multiple_of(2) {
                    tokio::time::sleep(Duration::from_millis(rng % 15)).await;
                }
                if rng.is_multiple_of(11) {
                    tx.rollback().await.expect("rollback");
                } else {
                    tx.commit().await.expect("commit");
                }
            }
        }));
    }
    // The relay starts while the writers commit: it first catches up on a
    // backlog (where publishing by id alone would invert transactions of a
    // key), then follows commits as they happen, with rows of one key
    // committing out of id order around other keys' rows between reads.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let engine = d.engine().spawn();
    for t in tasks {
        t.await.expect("writer");
    }
    let order = env.commit_log();
    let total: usize = order.values().map(Vec::len).sum();
    wait_until(WAIT, "every committed row published", || async {
        let mut n = 0;
        for k in keys {
            n += env.stream(k).await.len();
        }
        n == total
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    for k in keys {
        let on_stream = seqs(&env.stream(k).await);
        let committed = order.get(k).cloned().unwrap_or_default();
        assert_eq!(
            on_stream, committed,
            "key {k}: stream order must equal commit order, nothing missing or doubled"
        );
    }
    assert_eq!(env.statuses().0, 0, "nothing left pending");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rows_stay_pending_while_redis_is_down_and_publish_in_order_after() {
    let mut env = PgEnv::start();
    let pool = env.pool().await;
    env.outbox().await;
    let d = publisher(env.config(), "writer");
    let engine = d.engine().spawn();
    commit_events(&d, &pool, &[Posted::new("r", 0)], true).await;
    wait_until(WAIT, "the first row published", || async {
        env.stream("r").await.len() == 1
    })
    .await;

    env.redis.stop().expect("stop redis");
    for seq in 1..20 {
        commit_events(&d, &pool, &[Posted::new("r", seq)], true).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(env.statuses().0, 19, "the rows wait in PostgreSQL");
    env.redis.restart().expect("restart redis");

    // The restarted Redis kept nothing (no persistence): what reaches it
    // now is exactly the rows committed while it was down, in order.
    wait_until(WAIT, "the pending rows published", || async {
        env.stream("r").await.len() == 19
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    assert_eq!(seqs(&env.stream("r").await), (1..20).collect::<Vec<_>>());
    assert_eq!(env.statuses().0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_that_was_never_migrated_is_an_error_that_says_how_to_create_it() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    let d = publisher(env.config(), "writer");
    let mut tx = pool.begin().await.expect("begin");
    let mut uow = d.unit_of_work();
    uow.raise(Posted::new("a", 0)).expect("raise");
    let err = uow.commit_in(&mut tx).await.expect_err("no table yet");
    assert!(
        err.to_string().contains("PgOutbox::migrate()"),
        "the error says what to do: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_in_without_a_postgres_outbox_says_what_to_configure() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    let mut config = env.config();
    config.outbox.postgres_url = None;
    let d = publisher(config, "writer");
    let mut tx = pool.begin().await.expect("begin");
    let mut uow = d.unit_of_work();
    uow.raise(Posted::new("a", 0)).expect("raise");
    let err = uow.commit_in(&mut tx).await.expect_err("memory outbox");
    assert!(err.to_string().contains("postgres_url"), "{err}");
}

/// A command that posts to a client's balance: the balance row and the
/// `Posted` event commit in the command handler's own transaction.
#[derive(convoy_runtime::Command, serde::Serialize, serde::Deserialize, Debug)]
#[command(part_of = support::Ledger)]
struct Post {
    client_id: String,
    seq: u64,
    /// The handler fails after writing: nothing may be kept.
    refuse: bool,
}

struct Desk {
    pool: sqlx::PgPool,
}

#[convoy_runtime::command_handler(part_of = support::Ledger)]
impl Desk {
    #[handle]
    async fn post(
        &self,
        c: Post,
        ctx: &convoy_runtime::Context,
    ) -> Result<(), convoy_runtime::HandlerError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO postings (client_id, seq) VALUES ($1, $2)")
            .bind(&c.client_id)
            .bind(c.seq as i64)
            .execute(&mut *tx)
            .await?;
        ctx.raise(Posted::new(&c.client_id, c.seq))?;
        assert_eq!(ctx.commit_in(&mut tx).await?, 1);
        if c.refuse {
            // The transaction rolls back when dropped: the posting and the
            // event with it.
            return Err(convoy_runtime::HandlerError::msg("refused"));
        }
        tx.commit().await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_command_handler_commits_its_events_in_its_own_transaction() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    env.outbox().await;
    env.pg
        .psql("app", "CREATE TABLE postings (client_id text, seq bigint)")
        .expect("table");
    let d = Domain::builder()
        .config(env.config())
        .instance_id("desk")
        .command_handler(Desk { pool: pool.clone() })
        .init()
        .expect("init");
    d.process(Post {
        client_id: "c".into(),
        seq: 0,
        refuse: false,
    })
    .await
    .expect("post");
    d.process(Post {
        client_id: "c".into(),
        seq: 1,
        refuse: true,
    })
    .await
    .expect_err("refused");
    assert_eq!(
        env.pg
            .psql("app", "SELECT string_agg(seq::text, ',') FROM postings")
            .expect("postings"),
        "0"
    );
    assert_eq!(
        env.commit_order()["c"],
        vec![0],
        "the event commits with the posting, and only then"
    );
}

/// A commit that writes keyed rows notifies the outbox's channel once (the
/// notification goes with the key locks, in one statement); a rolled back
/// transaction and a domain with `notify = false` never do.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_commit_notifies_the_relay_and_a_rollback_or_notify_false_never_does() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    env.outbox().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("listener");
    listener
        .listen("convoy_public_convoy_outbox")
        .await
        .expect("LISTEN");
    let quiet = Duration::from_millis(500);
    let d = publisher(env.config(), "loud");
    commit_events(&d, &pool, &[Posted::new("a", 0), Posted::new("b", 0)], true).await;
    tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification for the commit")
        .expect("the listener's connection");
    commit_events(&d, &pool, &[Posted::new("a", 1)], false).await;
    let mut config = env.config();
    config.outbox.notify = false;
    let silent = publisher(config, "silent");
    commit_events(&silent, &pool, &[Posted::new("a", 2)], true).await;
    assert!(
        tokio::time::timeout(quiet, listener.recv()).await.is_err(),
        "no notification for a rollback nor with notify = false"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_notify_the_relay_finds_committed_rows_by_polling() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    env.outbox().await;
    let mut config = env.config();
    config.outbox.notify = false;
    config.outbox.poll_interval_ms = 100;
    let d = publisher(config, "quiet");
    let engine = d.engine().spawn();
    for seq in 0..3 {
        commit_events(&d, &pool, &[Posted::new("q", seq)], true).await;
    }
    wait_until(WAIT, "rows published by the poll", || async {
        env.stream("q").await.len() == 3
    })
    .await;
    engine.shutdown().await.expect("shutdown");
    assert_eq!(seqs(&env.stream("q").await), vec![0, 1, 2]);
}

/// `AppliedEvents::claim` for an event delivered as the stream entry
/// `entry_id` of `stream`, carrying the stream fields `origin` (when
/// given), under `generation`; commits when the event is new.
async fn claim_as(
    pool: &sqlx::PgPool,
    applied: &convoy_runtime::postgres::AppliedEvents,
    stream: &str,
    entry_id: &str,
    origin: Option<&str>,
    generation: u64,
) -> Result<convoy_runtime::postgres::Applied, convoy_runtime::Error> {
    let mut fields = vec![
        ("id", format!("m-{entry_id}")),
        ("type", "Posted".to_owned()),
        ("category", "ledger".to_owned()),
        ("key", "a".to_owned()),
        ("time", "1".to_owned()),
        ("priority", "normal".to_owned()),
        ("payload", "{}".to_owned()),
    ];
    if let Some(o) = origin {
        fields.push(("origin", o.to_owned()));
    }
    let envelope = convoy_runtime::Envelope::from_fields(
        stream,
        entry_id,
        fields.iter().map(|(k, v)| (*k, v.as_bytes())),
    )
    .expect("envelope");
    let ctx = convoy_runtime::Context::new(
        "projector",
        &envelope,
        1,
        std::sync::Arc::new(convoy_runtime::key::KeyPolicy::default()),
    )
    .with_position(convoy_runtime::Position {
        stream: stream.to_owned(),
        entry_id: entry_id.to_owned(),
    })
    .with_fence(convoy_runtime::Fence {
        owner: "e".into(),
        generation,
    });
    let mut tx = pool.begin().await.expect("begin");
    let applied = applied.claim(&mut tx, &ctx).await?;
    if !applied.is_already_applied() {
        tx.commit().await.expect("commit");
    }
    Ok(applied)
}

/// An event is recognised by its own identity (its outbox and seq), not by
/// where it sits in a stream: a duplicate stream entry of an applied event
/// is a re-run, and an event in a stream recreated (after a reap) with
/// entry ids from a clock that stepped back is new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_is_keyed_by_the_event_not_its_stream_entry() {
    use convoy_runtime::postgres::Applied;
    let env = PgEnv::start();
    let outbox = env.outbox().await;
    let pool = env.pool().await;
    let applied = outbox.applied_events();
    let s = "{3}ledger:a";
    let claim = |entry: &'static str, origin: Option<&'static str>, generation: u64| {
        claim_as(&pool, &applied, s, entry, origin, generation)
    };
    assert_eq!(
        claim("5000-0", Some("pg/x#10"), 1).await.expect("claim"),
        Applied::New
    );
    assert_eq!(
        claim("5000-0", Some("pg/x#10"), 1).await.expect("claim"),
        Applied::AlreadyApplied,
        "a re-run of the same entry"
    );
    // The partition was reaped and its stream created again; Redis's clock
    // had stepped back, so the new event's entry id is below the last one
    // applied. It is a new event all the same.
    assert_eq!(
        claim("1-0", Some("pg/x#11"), 2).await.expect("claim"),
        Applied::New,
        "a new event in a recreated stream with smaller entry ids"
    );
    // The same outbox row reached the stream a second time, after later
    // events: a second entry of an applied event is not applied again.
    assert_eq!(
        claim("6000-0", Some("pg/x#10"), 2).await.expect("claim"),
        Applied::AlreadyApplied,
        "a duplicate stream entry of an applied event"
    );
    assert_eq!(
        claim("6000-1", Some("pg/x#12"), 2).await.expect("claim"),
        Applied::New
    );
    // A failover lost #12's stream entry... and the acknowledgement of
    // #10's second entry: the new owner, under a newer generation, runs
    // an older event again after later ones were applied. The generation
    // alone would accept it; the event's origin refuses it.
    assert_eq!(
        claim("4000-0", Some("pg/x#11"), 3).await.expect("claim"),
        Applied::AlreadyApplied,
        "a deep re-run under a newer generation, after later events"
    );
    // Another outbox's events are counted apart.
    assert_eq!(
        claim("6000-2", Some("pg/y#1"), 3).await.expect("claim"),
        Applied::New
    );
    // An entry without an origin (a replayed dead letter) goes by its
    // entry id.
    assert_eq!(claim("7000-0", None, 3).await.expect("claim"), Applied::New);
    assert_eq!(
        claim("7000-0", None, 3).await.expect("claim"),
        Applied::AlreadyApplied
    );
    // A stale owner is refused, with or without an origin.
    for origin in [Some("pg/x#13"), None] {
        match claim("8000-0", origin, 1).await {
            Err(convoy_runtime::Error::FencedWrite {
                generation: 1,
                newer: 3,
                ..
            }) => {}
            other => panic!("a stale owner's claim is refused: {other:?}"),
        }
    }
    assert_eq!(
        claim("8000-0", Some("pg/x#13"), 3).await.expect("claim"),
        Applied::New,
        "the stale owner's refused claim changed nothing"
    );
}

/// A pipelining relay reads the next batch while earlier ones are in
/// flight: the read leaves their rows out and still returns up to its
/// limit of the others, oldest first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_batch_is_read_without_the_rows_in_flight() {
    use convoy_runtime::outbox::OutboxStore;
    let env = PgEnv::start();
    let pool = env.pool().await;
    let outbox = env.outbox().await;
    let recorder = Recorder::new(&env.redis.url(), "pg-excluding").expect("recorder");
    let d = domain(
        env.config(),
        "w",
        Recording::new(recorder, "w", Duration::ZERO),
    );
    for seq in 0..6 {
        commit_events(&d, &pool, &[Posted::new("a", seq)], true).await;
    }
    let all: Vec<u64> = outbox
        .pending(10)
        .await
        .expect("pending")
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(all.len(), 6);
    let in_flight = [all[0], all[2], all[3]];
    let next: Vec<u64> = outbox
        .pending_excluding(2, &in_flight)
        .await
        .expect("pending, excluding the rows in flight")
        .iter()
        .map(|r| r.seq)
        .collect();
    assert_eq!(next, vec![all[1], all[4]]);
}
