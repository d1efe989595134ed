//! Outage, not poison: the handler's own database stopped for seconds with
//! a backlog in the streams halts no key. Its errors are transient (a
//! `sqlx` pool timeout or I/O error, converted with `?`), retried for as
//! long as the outage lasts and never counted toward `max_retries`; the
//! handler pauses on the instance and the engine is not ready meanwhile
//! (its readiness check pings the database); afterwards every event is
//! handled once, in order per key. A real poison event still halts its own
//! key only.

mod support;

use std::time::{Duration, Instant};

use convoy_runtime::testing::{PgServer, RedisServer};
use convoy_runtime::{Aggregate, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgPool, PgPoolOptions};
use support::{test_config, wait_until};

const KEYS: u64 = 8;
const PER_KEY: u64 = 15;
/// The key whose event `POISON_AT` is poison.
const POISONED: &str = "k7";
const POISON_AT: u64 = 3;

#[derive(Aggregate)]
#[aggregate(category = "meter")]
struct Meter;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Meter)]
struct Read {
    key: String,
    n: u64,
    poison: bool,
}

/// Writes each event's effect to PostgreSQL; fails (default class) on a
/// poison event.
struct Projector {
    pool: PgPool,
}

#[event_handler(part_of = Meter, sequential_by = "key")]
impl Projector {
    #[handle]
    async fn read(&self, e: Read) -> Result<(), HandlerError> {
        if e.poison {
            return Err(HandlerError::msg(format!("poison event {}#{}", e.key, e.n)));
        }
        sqlx::query("INSERT INTO effects (key, n) VALUES ($1, $2)")
            .bind(&e.key)
            .bind(e.n as i64)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// A Redis and a PostgreSQL of the test's own, a database with the
/// `effects` table, and a pool on it that fails fast while PostgreSQL is
/// down.
async fn servers() -> (RedisServer, PgServer, String, PgPool) {
    let redis = RedisServer::start().expect("start redis-server");
    let pg = PgServer::start().expect("start PostgreSQL");
    let db = pg.create_database("app").expect("database");
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(&db)
        .expect("pool");
    sqlx::query(
        "CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL, n bigint NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("table");
    (redis, pg, db, pool)
}

async fn effects(pool: &PgPool) -> Option<Vec<(String, i64)>> {
    sqlx::query_as("SELECT key, n FROM effects ORDER BY id")
        .fetch_all(pool)
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_with_a_backlog_halts_no_key_and_every_event_is_handled_once_in_order() {
    let (redis, mut pg, _db, pool) = servers().await;
    // Two retries, fast: a database outage counted as failures would halt
    // every key within a second.
    let mut config = test_config(&redis.url());
    config.server.retry.max_transient_backoff_ms = 400;
    let domain = Domain::builder()
        .config(config)
        .instance_id("e0")
        .handler(Projector { pool: pool.clone() })
        .without_discovery()
        .init()
        .expect("init");
    let ping = pool.clone();
    let engine = domain
        .engine()
        .readiness_check("postgres", move || {
            let pool = ping.clone();
            async move { sqlx::query("SELECT 1").execute(&pool).await.map(|_| ()) }
        })
        .spawn();
    wait_until(Duration::from_secs(15), "the engine is ready", || async {
        engine.health().await.is_ready()
    })
    .await;

    // The database goes down, then the backlog is published.
    pg.stop().expect("stop PostgreSQL");
    let mut uow = domain.unit_of_work();
    for n in 0..PER_KEY {
        for k in 0..KEYS {
            let key = format!("k{k}");
            let poison = key == POISONED && n == POISON_AT;
            uow.raise(Read { key, n, poison }).expect("raise");
        }
    }
    uow.commit().await.expect("commit");

    // Down for 10 s: the handler pauses, the engine is not ready, no key
    // halts but the poisoned one.
    let (mut saw_paused, mut saw_check_failing) = (false, false);
    let down = Instant::now();
    while down.elapsed() < Duration::from_secs(10) {
        let h = engine.health().await;
        saw_paused |= h.paused_handlers.iter().any(|p| p.ends_with("Projector"));
        saw_check_failing |= h.failed_checks.iter().any(|(name, _)| name == "postgres");
        assert!(
            !h.is_ready() || down.elapsed() < Duration::from_secs(2),
            "not ready while the database is down: {h:?}"
        );
        assert!(h.halted_units <= 1, "only the poisoned key may halt: {h:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(saw_paused, "the handler paused on the outage");
    assert!(
        saw_check_failing,
        "the readiness check saw the database down"
    );
    pg.restart().expect("restart PostgreSQL");

    let expected = (KEYS - 1) * PER_KEY + POISON_AT;
    wait_until(
        Duration::from_secs(60),
        "every event handled after the outage",
        || async {
            effects(&pool)
                .await
                .is_some_and(|e| e.len() as u64 >= expected)
        },
    )
    .await;
    wait_until(Duration::from_secs(15), "ready again", || async {
        let h = engine.health().await;
        h.is_ready() && h.paused_handlers.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = effects(&pool).await.expect("effects");
    for k in 0..KEYS {
        let key = format!("k{k}");
        let ns: Vec<i64> = rows
            .iter()
            .filter(|(r, _)| *r == key)
            .map(|(_, n)| *n)
            .collect();
        let want = if key == POISONED { POISON_AT } else { PER_KEY };
        assert_eq!(
            ns,
            (0..want as i64).collect::<Vec<_>>(),
            "{key}: each event once, in order"
        );
    }
    let h = engine.health().await;
    assert_eq!(
        h.halted_units, 1,
        "the poison event halted its own key only: {h:?}"
    );
    engine.shutdown().await.expect("shutdown");
}

/// A wallet projector written as the docs show it: `AppliedEvents::claim`
/// and `Context::commit_in` with `?`, in one transaction, a little work
/// inside it (so a terminated backend hits a transaction in flight).
struct Wallet {
    pool: PgPool,
    applied: convoy_runtime::postgres::AppliedEvents,
}

#[derive(Aggregate)]
#[aggregate(category = "wallet_audit")]
struct WalletAudit;

/// What the projector raises for each balance it writes (committed in its
/// transaction with `commit_in`).
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = WalletAudit)]
struct Projected {
    key: String,
    n: u64,
}

#[event_handler(part_of = Meter, sequential_by = "key")]
impl Wallet {
    #[handle]
    async fn read(&self, e: Read, ctx: &convoy_runtime::Context) -> Result<(), HandlerError> {
        let mut tx = self.pool.begin().await?;
        if self.applied.claim(&mut tx, ctx).await?.is_already_applied() {
            return Ok(());
        }
        sqlx::query("INSERT INTO effects (key, n) VALUES ($1, $2)")
            .bind(&e.key)
            .bind(e.n as i64)
            .execute(&mut *tx)
            .await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        ctx.raise(Projected {
            key: e.key.clone(),
            n: e.n,
        })?;
        ctx.commit_in(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Publishes `n` in `ns` for every key, through a memory outbox of its own
/// (the engine's PostgreSQL outbox may be down).
async fn publish_reads(redis: &RedisServer, ns: std::ops::Range<u64>) {
    let writer = Domain::builder()
        .config(test_config(&redis.url()))
        .instance_id("writer")
        .init()
        .expect("writer");
    let mut uow = writer.unit_of_work();
    for n in ns {
        for k in 0..KEYS {
            uow.raise(Read {
                key: format!("k{k}"),
                n,
                poison: false,
            })
            .expect("raise");
        }
    }
    uow.commit().await.expect("commit");
    support::publish_outbox(&writer).await;
}

/// Watches the engine for `span`: no key may halt.
async fn no_halt_during(engine: &convoy_runtime::EngineHandle, span: Duration, what: &str) {
    let start = Instant::now();
    while start.elapsed() < span {
        let h = engine.health().await;
        assert_eq!(h.halted_units, 0, "{what}: no key halts: {h:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exactly_once_helpers_errors_in_an_outage_halt_no_key() {
    let (redis, mut pg, db, pool) = servers().await;
    // The library's retry counts, fast: an outage counted as failures
    // would halt keys within a second.
    let mut config = test_config(&redis.url());
    config.outbox.postgres_url = Some(db.clone());
    config.server.retry.max_transient_backoff_ms = 400;
    let outbox = convoy_runtime::postgres::PgOutbox::from_config(&config.outbox).expect("outbox");
    outbox.migrate().await.expect("migrate");
    let domain = Domain::builder()
        .config(config)
        .instance_id("e0")
        .handler(Wallet {
            pool: pool.clone(),
            applied: outbox.applied_events(),
        })
        .without_discovery()
        .register_message(<Projected as convoy_runtime::Message>::DESCRIPTOR)
        .init()
        .expect("init");
    let engine = domain.engine().spawn();
    publish_reads(&redis, 0..40).await;
    wait_until(Duration::from_secs(15), "the first effects", || async {
        effects(&pool).await.is_some_and(|e| !e.is_empty())
    })
    .await;

    // Every backend terminated, over and over for 6 s (as a managed
    // failover or a fast shutdown does), from a connection of its own.
    let terminate = {
        let url = db.clone();
        tokio::spawn(async move {
            let start = Instant::now();
            let mut killed = 0u64;
            while start.elapsed() < Duration::from_secs(6) {
                if let Ok(mut c) = <sqlx::PgConnection as sqlx::Connection>::connect(&url).await {
                    let n: Result<Vec<bool>, _> = sqlx::query_scalar(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                         WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    )
                    .fetch_all(&mut c)
                    .await;
                    killed += n.map_or(0, |v| v.len() as u64);
                }
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            killed
        })
    };
    no_halt_during(&engine, Duration::from_secs(6), "backends terminated").await;
    let killed = terminate.await.expect("terminator");
    assert!(killed > 0, "backends were terminated");
    publish_reads(&redis, 40..60).await;

    // Then PostgreSQL stopped for 10 s.
    pg.stop().expect("stop PostgreSQL");
    no_halt_during(&engine, Duration::from_secs(10), "PostgreSQL stopped").await;
    pg.restart().expect("restart PostgreSQL");

    let expected = KEYS * 60;
    wait_until(
        Duration::from_secs(60),
        "every event applied after the outage",
        || async {
            effects(&pool)
                .await
                .is_some_and(|e| e.len() as u64 >= expected)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rows = effects(&pool).await.expect("effects");
    for k in 0..KEYS {
        let key = format!("k{k}");
        let ns: Vec<i64> = rows
            .iter()
            .filter(|(r, _)| *r == key)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(
            ns,
            (0..60).collect::<Vec<_>>(),
            "{key}: each event once, in order"
        );
    }
    assert_eq!(engine.health().await.halted_units, 0);
    engine.shutdown().await.expect("shutdown");
}

/// A handler that maps its database errors to a message, as many
/// services do: while `down`, every event of every key fails with an error
/// of the default class; a poison event fails so always.
struct Mapped {
    pool: PgPool,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[event_handler(part_of = Meter, sequential_by = "key")]
impl Mapped {
    #[handle]
    async fn read(&self, e: Read) -> Result<(), HandlerError> {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(HandlerError::msg(
                "database unavailable: connection refused (os error 111)",
            ));
        }
        if e.poison {
            return Err(HandlerError::msg(format!("poison event {}#{}", e.key, e.n)));
        }
        sqlx::query("INSERT INTO effects (key, n) VALUES ($1, $2)")
            .bind(&e.key)
            .bind(e.n as i64)
            .execute(&self.pool)
            .await
            .map_err(|err| HandlerError::msg(format!("database: {err}")))?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_wide_failure_of_the_default_class_pauses_and_halts_no_key() {
    use std::sync::atomic::Ordering;
    let (redis, _pg, _db, pool) = servers().await;
    // The library's retry settings (three retries, then a key halts).
    let mut config = test_config(&redis.url());
    config.server.retry = convoy_runtime::config::RetryConfig::default();
    let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let domain = Domain::builder()
        .config(config)
        .instance_id("e0")
        .handler(Mapped {
            pool: pool.clone(),
            down: down.clone(),
        })
        .without_discovery()
        .init()
        .expect("init");
    let engine = domain.engine().spawn();
    publish_reads(&redis, 0..PER_KEY).await;

    // Every key fails for 10 s: the handler pauses, the engine is not
    // ready, no key halts.
    let mut saw_paused = false;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let h = engine.health().await;
        assert_eq!(h.halted_units, 0, "no key halts: {h:?}");
        if h.paused_handlers.iter().any(|p| p.ends_with("Mapped")) {
            saw_paused = true;
            assert!(!h.is_ready(), "not ready while paused: {h:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(saw_paused, "the handler paused on the handler-wide failure");
    down.store(false, Ordering::SeqCst);
    let expected = KEYS * PER_KEY;
    wait_until(
        Duration::from_secs(60),
        "every event handled once the dependency is back",
        || async {
            effects(&pool)
                .await
                .is_some_and(|e| e.len() as u64 >= expected)
        },
    )
    .await;
    wait_until(Duration::from_secs(15), "resumed", || async {
        engine.health().await.paused_handlers.is_empty()
    })
    .await;
    let rows = effects(&pool).await.expect("effects");
    for k in 0..KEYS {
        let key = format!("k{k}");
        let ns: Vec<i64> = rows
            .iter()
            .filter(|(r, _)| *r == key)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(
            ns,
            (0..PER_KEY as i64).collect::<Vec<_>>(),
            "{key}: each event once, in order"
        );
    }

    // The same failure on one key among many is poison: that key halts,
    // alone, and the handler never pauses.
    let writer = Domain::builder()
        .config(test_config(&redis.url()))
        .instance_id("writer2")
        .init()
        .expect("writer");
    let mut uow = writer.unit_of_work();
    for n in PER_KEY..PER_KEY + 10 {
        for k in 0..KEYS {
            let key = format!("k{k}");
            let poison = key == POISONED && n == PER_KEY + 2;
            uow.raise(Read { key, n, poison }).expect("raise");
        }
    }
    uow.commit().await.expect("commit");
    support::publish_outbox(&writer).await;
    wait_until(
        Duration::from_secs(30),
        "the poisoned key halts",
        || async { engine.health().await.halted_units == 1 },
    )
    .await;
    wait_until(Duration::from_secs(30), "the other keys finish", || async {
        effects(&pool)
            .await
            .is_some_and(|e| e.len() as u64 >= expected + (KEYS - 1) * 10 + 2)
    })
    .await;
    let h = engine.health().await;
    assert_eq!(h.halted_units, 1, "the poisoned key alone: {h:?}");
    assert!(h.paused_handlers.is_empty(), "{h:?}");
    engine.shutdown().await.expect("shutdown");
}
