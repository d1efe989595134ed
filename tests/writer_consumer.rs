//! A category's partition key wherever its events are raised: a writer
//! process that links no handler of the category routes its events by the
//! key its aggregate declares, a consumer process handles them per key in
//! order, and every process that would use the category with another key
//! (or none, for events that carry the key field) is refused, with nothing
//! sent to the wrong stream.
//!
//! The writer and the consumer are this test binary re-executed
//! (`child_process`, the role in `CONVOY_WC_CHILD`), sharing the test's own
//! `redis-server` (and PostgreSQL for the outbox case). Every domain here
//! is built without discovery: the binary links aggregates of one category
//! declared with different keys, one per case.

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use convoy_runtime::testing::{ChildEngine, PgServer, RedisServer, current_test_command};
use convoy_runtime::{
    Aggregate, Config, Context, Domain, Error, Event, HandlerError, Message, event_handler,
};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use support::{test_config, wait_until};

const WAIT: Duration = Duration::from_secs(30);
const KEYS: u64 = 3;
const PER_KEY: u64 = 12;

/// The stock category, its key declared where the category is.
#[derive(Aggregate)]
#[aggregate(category = "stock", partition_key = "sku")]
struct Stock;

/// A stock adjustment: the `n`-th of its SKU (from 0).
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Stock)]
struct StockAdjusted {
    sku: String,
    warehouse: String,
    n: u64,
}

/// The same category as another team's service declares it: keyed by the
/// warehouse (a mismatch).
#[derive(Aggregate)]
#[aggregate(category = "stock", partition_key = "warehouse")]
struct StockByWarehouse;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = StockByWarehouse)]
struct StockMoved {
    sku: String,
    warehouse: String,
    n: u64,
}

/// The same category with no key declared at all: a writer with this
/// knows no key.
#[derive(Aggregate)]
#[aggregate(category = "stock")]
struct UndeclaredStock;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = UndeclaredStock)]
struct StockCounted {
    sku: Option<String>,
    n: u64,
}

/// A stock adjustment as the unaware writer raises it: the consumer's
/// type on the wire, without a key.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = UndeclaredStock, name = "StockAdjusted")]
struct UnawareAdjusted {
    sku: String,
    warehouse: String,
    n: u64,
}

/// Another category of the same writer, never partitioned.
#[derive(Aggregate)]
#[aggregate(category = "audit")]
struct AuditTrail;

#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = AuditTrail)]
struct Noted {
    note: String,
}

/// The consumer's projector: records each event it handles in a Redis
/// list per SKU (`handled:{sku}`), in the order it handled them.
struct History {
    redis: redis::Client,
}

#[event_handler(part_of = Stock, sequential_by = "sku")]
impl History {
    #[handle]
    async fn adjusted(&self, e: StockAdjusted, _ctx: &Context) -> Result<(), HandlerError> {
        let mut c = self.redis.get_multiplexed_async_connection().await?;
        let _: () = c.rpush(format!("handled:{}", e.sku), e.n).await?;
        Ok(())
    }
}

/// A consumer of the category by the warehouse: refused where Redis
/// records `sku`.
struct ByWarehouse;

#[event_handler(part_of = StockByWarehouse, sequential_by = "warehouse")]
impl ByWarehouse {
    #[handle]
    async fn moved(&self, _e: StockMoved) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// A domain of exactly what it is given.
fn domain(config: Config, instance: &str) -> convoy_runtime::DomainBuilder {
    Domain::builder()
        .config(config)
        .instance_id(instance)
        .without_discovery()
}

fn adjustments() -> Vec<StockAdjusted> {
    let mut v = Vec::new();
    for n in 0..PER_KEY {
        for k in 0..KEYS {
            v.push(StockAdjusted {
                sku: format!("sku-{k}"),
                warehouse: "w1".into(),
                n,
            });
        }
    }
    v
}

/// Plays the role named by `CONVOY_WC_CHILD` (and does nothing in a
/// normal run): `writer` raises and publishes [`adjustments`] with no
/// handler linked into its domain, then runs its engine (the outbox
/// processor) until SIGTERM; `consumer` runs [`History`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process() {
    let Ok(role) = std::env::var("CONVOY_WC_CHILD") else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter("convoy_runtime=info")
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let redis = std::env::var("CONVOY_REDIS").expect("CONVOY_REDIS");
    match role.as_str() {
        "writer" => {
            let d = domain(test_config(&redis), "writer")
                .init()
                .expect("a writer needs no handler");
            let engine = d.engine().spawn();
            for e in adjustments() {
                let mut uow = d.unit_of_work();
                uow.raise(e).expect("raise");
                uow.commit().await.expect("commit");
            }
            println!("committed");
            convoy_runtime::shutdown_signal().await;
            engine.shutdown().await.expect("shutdown");
        }
        "consumer" => {
            let history = History {
                redis: redis::Client::open(redis.as_str()).expect("client"),
            };
            domain(test_config(&redis), "consumer")
                .handler(history)
                .init()
                .expect("consumer")
                .engine()
                .run_until(convoy_runtime::shutdown_signal())
                .await
                .expect("consumer engine");
        }
        // Processes that must be refused at start: each prints why.
        "mismatched-writer" | "mismatched-consumer" => {
            let builder = domain(test_config(&redis), &role);
            let d = if role == "mismatched-writer" {
                builder.register_message(StockMoved::DESCRIPTOR)
            } else {
                builder.handler(ByWarehouse)
            }
            .init()
            .expect("init");
            let run = d.engine().run_until(convoy_runtime::shutdown_signal());
            match tokio::time::timeout(WAIT, run).await {
                Ok(Err(e)) => println!("refused: {e}"),
                Ok(Ok(())) => println!("stopped"),
                Err(_) => println!("still running"),
            }
        }
        other => panic!("unknown role {other}"),
    }
}

/// Runs `role` as a process of its own until it exits; its stdout.
fn run_to_exit(role: &str, redis: &str) -> String {
    let out = current_test_command("child_process")
        .expect("test binary")
        .env("CONVOY_WC_CHILD", role)
        .env("CONVOY_REDIS", redis)
        .stderr(Stdio::null())
        .output()
        .expect("run child");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn spawn(role: &str, redis: &str) -> ChildEngine {
    let mut cmd = current_test_command("child_process").expect("test binary");
    cmd.env("CONVOY_WC_CHILD", role)
        .env("CONVOY_REDIS", redis)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    ChildEngine::spawn(&mut cmd).expect("spawn child")
}

/// What each SKU's list holds: the `n`s in the order they were handled.
async fn handled(server: &RedisServer) -> BTreeMap<String, Vec<u64>> {
    let mut c = server.connection().await.expect("connect");
    let mut out = BTreeMap::new();
    for k in 0..KEYS {
        let sku = format!("sku-{k}");
        let v: Vec<u64> = c
            .lrange(format!("handled:{sku}"), 0, -1)
            .await
            .expect("lrange");
        out.insert(sku, v);
    }
    out
}

/// A consumer engine of [`History`] in this process, once it recorded the
/// category's key.
async fn start_consumer(server: &RedisServer) -> convoy_runtime::EngineHandle {
    let history = History {
        redis: server.client().expect("client"),
    };
    let consumer = domain(test_config(&server.url()), "consumer")
        .handler(history)
        .init()
        .expect("consumer")
        .engine()
        .spawn();
    wait_until(WAIT, "the consumer records the key", || async {
        recorded_key(server).await.is_some()
    })
    .await;
    consumer
}

async fn recorded_key(server: &RedisServer) -> Option<String> {
    let mut c = server.connection().await.expect("connect");
    c.get(convoy_runtime::redis::keys::key_field("stock"))
        .await
        .expect("get")
}

async fn base_stream_len(server: &RedisServer) -> u64 {
    let mut c = server.connection().await.expect("connect");
    c.xlen(support::names::base_stream("stock"))
        .await
        .expect("xlen")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_links_no_handler_routes_by_the_declared_key_and_a_consumer_handles_per_key_in_order()
 {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let mut consumer = spawn("consumer", &url);
    let mut writer = spawn("writer", &url);
    let want: BTreeMap<String, Vec<u64>> = (0..KEYS)
        .map(|k| (format!("sku-{k}"), (0..PER_KEY).collect()))
        .collect();
    wait_until(WAIT, "every adjustment handled", || async {
        handled(&server).await.values().map(Vec::len).sum::<usize>()
            >= want.values().map(Vec::len).sum()
    })
    .await;
    // A moment for any duplicate to show up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(handled(&server).await, want, "each SKU once each, in order");
    assert_eq!(base_stream_len(&server).await, 0, "nothing went unkeyed");
    assert_eq!(recorded_key(&server).await.as_deref(), Some("sku"));
    writer
        .terminate(Duration::from_secs(10))
        .expect("writer stops");
    consumer
        .terminate(Duration::from_secs(10))
        .expect("consumer stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_declaring_another_key_is_refused_at_start_and_at_commit_with_nothing_published() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let consumer = start_consumer(&server).await;

    // A writer process that knows the category by its message types,
    // partitioned by `warehouse` there: refused at start.
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || run_to_exit("mismatched-writer", &url)
    })
    .await
    .expect("join");
    assert!(out.contains("refused: "), "{out}");
    assert!(
        out.contains("category `stock` is partitioned by `sku`") && out.contains("by `warehouse`"),
        "the error names the category and both fields: {out}"
    );
    assert!(
        out.contains("partition_key = \"sku\""),
        "and what to do: {out}"
    );
    // The same writer in this process cannot commit either.
    let writer = domain(test_config(&url), "writer")
        .register_message(StockMoved::DESCRIPTOR)
        .init()
        .expect("init");
    let mut uow = writer.unit_of_work();
    uow.raise(StockMoved {
        sku: "sku-0".into(),
        warehouse: "w1".into(),
        n: 0,
    })
    .expect("raise");
    let err = uow.commit().await.expect_err("the commit is refused too");
    assert!(matches!(err, Error::KeyFieldMismatch { .. }), "{err:?}");
    assert_eq!(
        writer.outbox().pending(10).await.expect("pending").len(),
        0,
        "nothing committed"
    );

    // A writer that knows no key for the category (its event type carries
    // the recorded field) cannot commit it unkeyed either.
    let unaware = domain(test_config(&url), "unaware").init().expect("init");
    let mut uow = unaware.unit_of_work();
    uow.raise(StockCounted {
        sku: Some("sku-0".into()),
        n: 0,
    })
    .expect("raise");
    let err = uow.commit().await.expect_err("refused, never sent unkeyed");
    assert!(
        err.to_string()
            .contains("without a key, for events that carry the field `sku`"),
        "{err}"
    );
    assert_eq!(base_stream_len(&server).await, 0);
    consumer.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_with_another_key_is_refused_at_start() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let writer = domain(test_config(&url), "writer").init().expect("init");
    let mut uow = writer.unit_of_work();
    uow.raise(adjustments()[0].clone()).expect("raise");
    uow.commit().await.expect("the first use records the key");
    assert_eq!(recorded_key(&server).await.as_deref(), Some("sku"));
    // A consumer process partitioning the category by `warehouse`.
    let out = tokio::task::spawn_blocking(move || run_to_exit("mismatched-consumer", &url))
        .await
        .expect("join");
    assert!(out.contains("refused: "), "{out}");
    assert!(
        out.contains("partitioned by `sku`") && out.contains("by `warehouse`"),
        "{out}"
    );
}

/// The PostgreSQL case: rows committed unkeyed before any consumer ever ran
/// (a writer that knows no key, in a first deployment), then a consumer
/// records the key: the relay routes each row by that field of its
/// payload, in its place, so the consumer handles every event per key in
/// commit order; nothing goes to the category's unkeyed stream, and a row
/// whose payload holds no key there is abandoned with the reason, for an
/// operator to fix and retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_committed_unkeyed_before_any_consumer_are_routed_by_their_payload() {
    let server = RedisServer::start().expect("start redis-server");
    let pg = PgServer::start().expect("start PostgreSQL");
    let db = pg.create_database("app").expect("database");
    let url = server.url();
    let config = support::pg::config_for(&url, &db);
    let outbox = convoy_runtime::postgres::PgOutbox::from_config(&config.outbox).expect("outbox");
    outbox.migrate().await.expect("migrate");
    let pool = sqlx::PgPool::connect(&db).await.expect("pool");

    // The unaware writer commits while nothing is recorded yet.
    let writer = domain(config.clone(), "writer").init().expect("init");
    for n in 0..3 {
        for k in 0..2 {
            let mut tx = pool.begin().await.expect("begin");
            let mut uow = writer.unit_of_work();
            uow.raise(UnawareAdjusted {
                sku: format!("sku-{k}"),
                warehouse: "w1".into(),
                n,
            })
            .expect("raise");
            uow.raise(Noted {
                note: format!("counted {n}"),
            })
            .expect("raise");
            uow.commit_in(&mut tx).await.expect("commit_in");
            tx.commit().await.expect("commit");
        }
    }
    let mut tx = pool.begin().await.expect("begin");
    let mut uow = writer.unit_of_work();
    uow.raise(StockCounted { sku: None, n: 99 }).expect("raise");
    uow.commit_in(&mut tx).await.expect("commit_in");
    tx.commit().await.expect("commit");
    // The consumer starts and records `sku`.
    let consumer = start_consumer(&server).await;
    // A relay (an engine of the unaware writer's domain) meets the rows.
    let relay = writer.engine().spawn();
    let want: BTreeMap<String, Vec<u64>> = [
        ("sku-0".to_owned(), vec![0, 1, 2]),
        ("sku-1".to_owned(), vec![0, 1, 2]),
        ("sku-2".to_owned(), vec![]),
    ]
    .into();
    wait_until(WAIT, "every routed row handled", || async {
        handled(&server).await == want
    })
    .await;
    assert_eq!(
        handled(&server).await,
        want,
        "each SKU's rows handled once, in commit order"
    );
    let pending = writer.outbox().pending(10).await.expect("pending");
    assert!(pending.is_empty(), "nothing stranded: {pending:?}");
    let abandoned = writer.outbox().abandoned(10).await.expect("abandoned");
    assert_eq!(abandoned.len(), 1, "{abandoned:?}");
    let reason = pg
        .psql("app", "SELECT reason FROM convoy_outbox WHERE status = 2")
        .expect("psql");
    assert!(
        reason.contains("partitioned by `sku`") && reason.contains("is not a key"),
        "{reason}"
    );
    assert_eq!(
        base_stream_len(&server).await,
        0,
        "nothing published unkeyed"
    );
    let mut c = server.connection().await.expect("connect");
    let audit: u64 = c
        .xlen(support::names::base_stream("audit"))
        .await
        .expect("xlen");
    assert_eq!(
        audit, 6,
        "the other category's rows are published all the same"
    );
    relay.shutdown().await.expect("shutdown");
    consumer.shutdown().await.expect("shutdown");
}
