//! PostgreSQL outbox test support: a Redis and a PostgreSQL server of the
//! test's own, a configuration using both, and readers of what reached the
//! streams and in which order the outbox rows committed.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::BTreeMap;

use convoy_runtime::Config;
use convoy_runtime::postgres::PgOutbox;
use convoy_runtime::testing::{PgServer, RedisServer};
use sqlx::postgres::PgPool;

use super::{Posted, test_config};

/// A Redis and a PostgreSQL server started for one test, with a database.
pub struct PgEnv {
    pub redis: RedisServer,
    pub pg: PgServer,
    pub db_url: String,
}

impl PgEnv {
    pub fn start() -> PgEnv {
        let redis = RedisServer::start().expect("start redis-server");
        let pg = PgServer::start().expect("start PostgreSQL");
        let db_url = pg.create_database("app").expect("create database");
        PgEnv { redis, pg, db_url }
    }

    /// The Redis broker, the PostgreSQL outbox (published rows kept an
    /// hour, so tests can read their commit order), fast relay timings.
    pub fn config(&self) -> Config {
        config_for(&self.redis.url(), &self.db_url)
    }

    pub async fn pool(&self) -> PgPool {
        PgPool::connect(&self.db_url).await.expect("connect pool")
    }

    pub async fn outbox(&self) -> PgOutbox {
        let outbox = PgOutbox::from_config(&self.config().outbox).expect("outbox");
        outbox.migrate().await.expect("migrate");
        outbox
    }

    /// The `Posted` events on the partition stream of `key`, in stream
    /// order (the order they were published).
    pub async fn stream(&self, key: &str) -> Vec<Posted> {
        stream_of(&self.redis.url(), key).await
    }

    /// The rows of the outbox per key, in commit order (by their
    /// transactions' commit timestamps; the test server tracks them), as
    /// the events' seqs. Only right before the relay touched the rows
    /// (marking a row published gives it a new version).
    pub fn commit_order(&self) -> BTreeMap<String, Vec<u64>> {
        let out = self
            .pg
            .psql(
                "app",
                "SELECT envelope FROM convoy_outbox ORDER BY pg_xact_commit_timestamp(xmin), id",
            )
            .expect("read commit order");
        let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            let env: convoy_runtime::Envelope = serde_json::from_str(line).expect("envelope");
            let p: Posted = serde_json::from_str(&env.payload).expect("payload");
            m.entry(p.client_id).or_default().push(p.seq);
        }
        m
    }

    /// The test's own `commits (key, seq)` table per key in commit order
    /// (rows written in the writers' transactions, never updated).
    pub fn commit_log(&self) -> BTreeMap<String, Vec<u64>> {
        let out = self
            .pg
            .psql(
                "app",
                "SELECT key || ',' || seq FROM commits ORDER BY pg_xact_commit_timestamp(xmin)",
            )
            .expect("read the commit log");
        let mut m: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            let (k, s) = line.split_once(',').expect("key,seq");
            m.entry(k.to_owned())
                .or_default()
                .push(s.parse().expect("seq"));
        }
        m
    }

    /// How many rows are in each status: (pending, published, abandoned).
    pub fn statuses(&self) -> (u64, u64, u64) {
        let out = self
            .pg
            .psql(
                "app",
                "SELECT count(*) FILTER (WHERE status = 0) || ',' || count(*) FILTER (WHERE status = 1) || ',' || count(*) FILTER (WHERE status = 2) FROM convoy_outbox",
            )
            .expect("statuses");
        let v: Vec<u64> = out
            .trim()
            .split(',')
            .map(|n| n.parse().expect("count"))
            .collect();
        (v[0], v[1], v[2])
    }
}

/// [`PgEnv::config`] for a Redis at `redis_url` and a database at `db_url`
/// (for engines in child processes, which get the URLs in their
/// environment).
pub fn config_for(redis_url: &str, db_url: &str) -> Config {
    let mut c = test_config(redis_url);
    c.outbox.postgres_url = Some(db_url.to_owned());
    c.outbox.retention_seconds = 3600;
    c.outbox.leader_timeout_ms = 1000;
    c.outbox.poll_interval_ms = 200;
    c
}

/// The `Posted` events on the partition stream of `key` at `redis_url`.
pub async fn stream_of(redis_url: &str, key: &str) -> Vec<Posted> {
    let client = redis::Client::open(redis_url).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(super::names::stream("ledger", key))
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .expect("XRANGE");
    entries
        .ids
        .iter()
        .map(|e| {
            let payload: String = e.get("payload").expect("payload field");
            serde_json::from_str(&payload).expect("a Posted payload")
        })
        .collect()
}

/// The seqs of `events`.
pub fn seqs(events: &[Posted]) -> Vec<u64> {
    events.iter().map(|p| p.seq).collect()
}
