//! `examples/ledger.rs` against a PostgreSQL and a Redis of the test's
//! own: on the inline broker, then on Redis with two engine instances, its
//! balances and statements agree (every event projected once, each
//! account's lines in commit order).

#[allow(dead_code)]
#[path = "../examples/ledger.rs"]
mod ledger;

use convoy_runtime::Config;
use convoy_runtime::testing::{PgServer, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_example_agrees_on_the_inline_broker_and_on_redis() {
    let pg = PgServer::start().expect("start PostgreSQL");
    let db = pg.create_database("ledger").expect("create database");
    let mut config = Config::default();
    config.outbox.postgres_url = Some(db);
    config.outbox.schema = "convoy_ledger_example".into();
    config.outbox.poll_interval_ms = 200;
    assert!(
        ledger::run(config.clone()).await.expect("inline run"),
        "balances and statements agree on the inline broker"
    );

    let redis = RedisServer::start().expect("start redis-server");
    config.broker.url = redis.url();
    config.server.partitioning.lease_ttl_ms = 2000;
    config.server.partitioning.heartbeat_interval_seconds = Some(0.3);
    assert!(
        ledger::run(config).await.expect("run on Redis"),
        "balances and statements agree on Redis"
    );
}
