//! An operator's replay of a dead letter, against a real Redis, a real
//! PostgreSQL and a real engine, with two handlers on one category: a
//! ledger that applied every event and a statements handler that
//! dead-lettered one (`on_poison = "dead_letter"`), both exactly-once by
//! the event's origin (`AppliedEvents`). What each handler ran and what it
//! committed are read from the database, outside the engine.
//!
//! - A replay by default reaches only the handler that dead-lettered it:
//!   the ledger never runs it again.
//! - A replay named to every handler runs it in both; the ledger recognises
//!   the event by its origin and applies nothing twice, the statements
//!   handler (which never applied it) applies it once.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use convoy_runtime::postgres::AppliedEvents;
use convoy_runtime::redis::admin::Admin;
use convoy_runtime::{Aggregate, Context, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::pg::PgEnv;
use support::wait_until;

const WAIT: Duration = Duration::from_secs(30);

#[derive(Aggregate)]
#[aggregate(category = "acct")]
struct Acct;

/// A deposit; `seq` counts per account from 0.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Acct)]
struct Deposited {
    account: String,
    seq: i64,
}

/// Records the run (autocommit, kept whatever happens) and, exactly once
/// by the event's origin, the effect (in the claim's transaction).
async fn run_and_apply(
    pool: &PgPool,
    applied: &AppliedEvents,
    handler: &str,
    e: &Deposited,
    ctx: &Context,
) -> Result<(), HandlerError> {
    sqlx::query("INSERT INTO runs (handler, account, seq) VALUES ($1, $2, $3)")
        .bind(handler)
        .bind(&e.account)
        .bind(e.seq)
        .execute(pool)
        .await?;
    let mut tx = pool.begin().await?;
    if applied.claim(&mut tx, ctx).await?.is_already_applied() {
        return Ok(());
    }
    sqlx::query("INSERT INTO effects (handler, account, seq) VALUES ($1, $2, $3)")
        .bind(handler)
        .bind(&e.account)
        .bind(e.seq)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// The ledger: applies every deposit.
struct Balances {
    pool: PgPool,
    applied: AppliedEvents,
}

#[event_handler(part_of = Acct, sequential_by = "account")]
impl Balances {
    #[handle]
    async fn deposited(&self, e: Deposited, ctx: &Context) -> Result<(), HandlerError> {
        run_and_apply(&self.pool, &self.applied, "balances", &e, ctx).await
    }
}

/// The statements: a bug (while `broken`) fails deposit #2 of every
/// account for good, and the key's poisoned head goes to its dead letters.
struct Statements {
    pool: PgPool,
    applied: AppliedEvents,
    broken: Arc<AtomicBool>,
}

#[event_handler(part_of = Acct, sequential_by = "account", on_poison = "dead_letter")]
impl Statements {
    #[handle]
    async fn deposited(&self, e: Deposited, ctx: &Context) -> Result<(), HandlerError> {
        if e.seq == 2 && self.broken.load(Ordering::SeqCst) {
            return Err(HandlerError::permanent(
                "statement line for deposit #2: bug",
            ));
        }
        run_and_apply(&self.pool, &self.applied, "statements", &e, ctx).await
    }
}

/// `SELECT count(*)` of `table` for one handler's event.
async fn count(pool: &PgPool, table: &str, handler: &str, account: &str, seq: i64) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE handler = $1 AND account = $2 AND seq = $3"
    )))
    .bind(handler)
    .bind(account)
    .bind(seq)
    .fetch_one(pool)
    .await
    .expect("count")
}

async fn deposit(domain: &Domain, pool: &PgPool, account: &str, seqs: std::ops::Range<i64>) {
    for seq in seqs {
        let mut tx = pool.begin().await.expect("begin");
        let mut uow = domain.unit_of_work();
        uow.raise(Deposited {
            account: account.to_owned(),
            seq,
        })
        .expect("raise");
        uow.commit_in(&mut tx).await.expect("commit_in");
        tx.commit().await.expect("commit");
    }
}

/// Deposits #0..#3 of `account` (the statements handler dead-letters #2),
/// waits for both handlers to finish them and returns the dead letter's id.
async fn dead_lettered(
    domain: &Domain,
    pool: &PgPool,
    admin: &Admin,
    account: &str,
    broken: &AtomicBool,
) -> String {
    broken.store(true, Ordering::SeqCst);
    deposit(domain, pool, account, 0..4).await;
    wait_until(WAIT, "both handlers past the poisoned deposit", || async {
        count(pool, "effects", "balances", account, 3).await == 1
            && count(pool, "effects", "statements", account, 3).await == 1
    })
    .await;
    broken.store(false, Ordering::SeqCst);
    let letters = admin.dlq("acct", Some(account)).await.expect("dlq");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(count(pool, "effects", "statements", account, 2).await, 0);
    letters[0].dlq_id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replayed_dead_letter_reaches_its_handler_and_no_handler_applies_it_twice() {
    let env = PgEnv::start();
    let pool = env.pool().await;
    let outbox = env.outbox().await;
    sqlx::raw_sql(
        "CREATE TABLE runs (handler text, account text, seq bigint);
         CREATE TABLE effects (handler text, account text, seq bigint);",
    )
    .execute(&pool)
    .await
    .expect("tables");
    let broken = Arc::new(AtomicBool::new(true));
    let domain = Domain::builder()
        .config(env.config())
        .instance_id("e1")
        .handler(Balances {
            pool: pool.clone(),
            applied: outbox.applied_events(),
        })
        .handler(Statements {
            pool: pool.clone(),
            applied: outbox.applied_events(),
            broken: broken.clone(),
        })
        .init()
        .expect("domain");
    let engine = domain.engine().spawn();
    let admin = Admin::connect(&env.redis.url()).await.expect("admin");

    // By default: to the handler that dead-lettered it, and no other.
    let dlq_id = dead_lettered(&domain, &pool, &admin, "a", &broken).await;
    let out = admin
        .replay("acct", "a", &dlq_id, "ops")
        .await
        .expect("replay");
    let groups = admin.groups("acct").await.expect("groups");
    let statements = groups
        .iter()
        .find(|g| g.ends_with("Statements"))
        .expect("the statements group")
        .clone();
    assert_eq!(out.handlers, std::slice::from_ref(&statements));
    // A later deposit: once the ledger has run it, it has passed the
    // replayed entry (a key's events run in stream order).
    deposit(&domain, &pool, "a", 4..5).await;
    wait_until(WAIT, "the replay and the next deposit handled", || async {
        count(&pool, "effects", "statements", "a", 2).await == 1
            && count(&pool, "runs", "balances", "a", 4).await == 1
            && count(&pool, "runs", "statements", "a", 4).await == 1
    })
    .await;
    assert_eq!(
        count(&pool, "runs", "balances", "a", 2).await,
        1,
        "the ledger never ran the statements handler's replay"
    );
    assert_eq!(count(&pool, "effects", "balances", "a", 2).await, 1);
    let audit = admin.audit(10).await.expect("audit");
    let replay = audit
        .iter()
        .find(|r| r.fields["op"] == "replay")
        .expect("the replay's audit record");
    assert_eq!(replay.fields["to"], statements, "{replay:?}");

    // Named to every handler: both run it, each applies it once.
    let dlq_id = dead_lettered(&domain, &pool, &admin, "b", &broken).await;
    let out = admin
        .replay_to("acct", "b", &dlq_id, &groups, "ops")
        .await
        .expect("replay to every handler");
    assert_eq!(out.handlers, groups);
    deposit(&domain, &pool, "b", 4..5).await;
    wait_until(WAIT, "the replay and the next deposit handled", || async {
        count(&pool, "runs", "balances", "b", 4).await == 1
            && count(&pool, "runs", "statements", "b", 4).await == 1
    })
    .await;
    assert_eq!(
        count(&pool, "runs", "balances", "b", 2).await,
        2,
        "the ledger ran the replay named to it"
    );
    assert_eq!(
        count(&pool, "effects", "balances", "b", 2).await,
        1,
        "the ledger recognised the replayed event by its origin: applied once"
    );
    assert_eq!(
        count(&pool, "effects", "statements", "b", 2).await,
        1,
        "the handler that dead-lettered it applied it, once"
    );
    engine.shutdown().await.expect("shutdown");
}
