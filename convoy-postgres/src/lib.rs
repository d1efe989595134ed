//! PostgreSQL beside your data (feature `postgres`): the transactional
//! outbox [`PgOutbox`], its relay, and exactly-once handler effects
//! ([`AppliedEvents`]).
//!
//! # Commit events with your state
//!
//! Raise events in a unit of work (or a handler's [`Context`](convoy_core::Context)) and write
//! them in your own `sqlx` transaction with
//! `UnitOfWork::commit_in` before
//! `tx.commit()`: the state change and its events commit or roll back
//! together. A `kill -9` right after the commit loses nothing: the rows
//! wait in the table until a relay publishes them.
//!
//! # Order: commit order per key
//!
//! Sequence values are handed out at insert time, not at commit time, so
//! neither "rows above the last seen id" (it skips a row whose transaction
//! committed late) nor "rows by id" alone (it can invert two transactions
//! of one key) is right. convoy serialises the outbox inserts of one
//! partition key instead: `commit_in` takes a transaction-scoped advisory
//! lock per key (in sorted order, so two transactions cannot deadlock on
//! them) before it inserts, so a second transaction raising for the same
//! key waits until the first commits or rolls back, and its rows get larger
//! ids. Within a key, id order is therefore commit order; the relay reads
//! *every* pending row by id (never "above the last seen"), so a row of
//! another key that commits late is published when it commits, and nothing
//! is skipped. Call `commit_in` near the end of the transaction: the key's
//! lock is held until it ends.
//!
//! # Several replicas: one relay at a time
//!
//! Every replica runs a relay, but only the one holding a session advisory
//! lock publishes (the leader); the others poll for the lock. One publisher
//! keeps per-key order trivially right, and one is enough: publishing is
//! one script per shard for a batch of up to 2,048 rows, bounded by Redis,
//! not by the relay. The leader's session sets `idle_session_timeout` to
//! `leader_timeout_ms` and pings well within it, so a leader that is killed
//! loses the lock at once (its socket closes) and one that is stalled
//! (`SIGSTOP`, swapped out) loses it after `leader_timeout_ms`, when
//! PostgreSQL ends its session. Each new leader takes a larger **epoch**
//! from the relay table, and the broker refuses a batch from an epoch below
//! the newest it has seen: a stalled leader that wakes up cannot publish a
//! row after its successor published later rows of the same key.
//!
//! # Exactly once on the stream
//!
//! A new leader first *takes over* in the broker: it raises its epoch in
//! every shard before it reads a single pending row. From then on every
//! batch of its predecessor is refused by the epoch, whatever the order of
//! stalls, crashes and outages: a row the predecessor read but had not
//! published yet is published by the successor only. After a crash
//! between publishing and marking the rows published, the next leader
//! sends them again; the broker drops them by the row's own id (it keeps
//! the ids of the rows it published that may still be sent again), so a
//! re-send never creates a second stream entry. The set and the epoch of
//! an elected relay are kept in Redis for good (one pair per shard).
//!
//! # Redis down
//!
//! Rows stay pending in PostgreSQL (nothing grows in process memory) and
//! publish, in order, when Redis is back.
//!
//! # Wake-ups
//!
//! An idle relay waits for `NOTIFY`; a busy one reads every millisecond,
//! and while it is busy commits skip their notification, which PostgreSQL
//! would make them commit one at a time for. Two advisory locks decide it,
//! and the relay waits again only once no commit that skipped its
//! notification is under way (see the `pace` module).

mod applied;
mod insert;
mod pace;
mod relay;
mod schema;

// logs under their targets of before the split (`convoy_runtime::postgres::...`)
mod tracing {
    convoy_core::tracing_shim!($ "convoy_postgres" => "convoy_runtime::postgres");
}

pub use applied::{Applied, AppliedEvents};

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use convoy_core::config::validate::is_sql_identifier;
use convoy_core::config::{OutboxConfig, redact_url};
use convoy_core::envelope::Envelope;
use convoy_core::error::Error;
use convoy_core::future::BoxFuture;
use convoy_core::outbox::{
    Election, OutboxRecord, OutboxStats, OutboxStatus, OutboxStore, TransactionalOutbox,
};

use schema::Tables;

/// A transactional outbox in a PostgreSQL table. Cheap to clone.
///
/// Rows are written in the caller's transaction
/// (`UnitOfWork::commit_in`), or in a
/// transaction of their own by `UnitOfWork::commit`.
/// See the [module documentation](self) for the ordering and relay rules.
#[derive(Clone)]
pub struct PgOutbox {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    options: PgConnectOptions,
    tables: Tables,
    config: OutboxConfig,
    /// `pg/{the relay table's producer uuid}`, read at the first relay or
    /// migration; the same for every replica.
    producer: std::sync::OnceLock<String>,
    /// The relay's session for its busy lock (see [`pace`]).
    publisher: tokio::sync::Mutex<pace::PublisherSession>,
}

impl std::fmt::Debug for PgOutbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOutbox")
            .field("table", &self.inner.tables.qualified)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Wraps a sqlx error with what was being done.
pub(crate) fn pg_error(context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
    let context = context.into();
    move |source| Error::Postgres { context, source }
}

impl PgOutbox {
    /// An outbox at `url` with the default table (`public.convoy_outbox`).
    /// Connects lazily: nothing is sent until it is used.
    pub fn connect_lazy(url: &str) -> Result<PgOutbox, Error> {
        PgOutbox::from_config(&OutboxConfig {
            postgres_url: Some(url.to_owned()),
            ..OutboxConfig::default()
        })
    }

    /// An outbox as `[outbox]` describes it (`postgres_url` required).
    /// Connects lazily.
    pub fn from_config(config: &OutboxConfig) -> Result<PgOutbox, Error> {
        let url = config
            .postgres_url
            .as_deref()
            .ok_or_else(|| Error::Config {
                file: "[outbox]".into(),
                message: "postgres_url is not set".into(),
            })?;
        let options = PgConnectOptions::from_str(url).map_err(|e| Error::Config {
            file: "[outbox]".into(),
            message: format!("postgres_url {:?} is not a valid URL: {e}", redact_url(url)),
        })?;
        let pool = PgPoolOptions::new()
            .max_connections(config.max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options.clone());
        PgOutbox::build(pool, options, config)
    }

    /// An outbox using your pool (the relay opens two connections of its
    /// own with the pool's options: the leadership session and the
    /// listener). `config` names the table and the relay's timing;
    /// its `postgres_url` is ignored.
    pub fn with_pool(pool: PgPool, config: &OutboxConfig) -> Result<PgOutbox, Error> {
        let options = (*pool.connect_options()).clone();
        PgOutbox::build(pool, options, config)
    }

    fn build(
        pool: PgPool,
        options: PgConnectOptions,
        config: &OutboxConfig,
    ) -> Result<PgOutbox, Error> {
        for (key, name) in [("schema", &config.schema), ("table", &config.table)] {
            if !is_sql_identifier(name) {
                return Err(Error::Config {
                    file: "[outbox]".into(),
                    message: format!(
                        "{key} = {name:?} must be a lower-case SQL identifier (a-z, 0-9, _; at most 48 characters)"
                    ),
                });
            }
        }
        Ok(PgOutbox {
            inner: Arc::new(Inner {
                pool,
                options,
                tables: Tables::new(&config.schema, &config.table),
                config: config.clone(),
                producer: std::sync::OnceLock::new(),
                publisher: tokio::sync::Mutex::default(),
            }),
        })
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The outbox table, quoted and qualified (`"public"."convoy_outbox"`).
    pub fn qualified_table(&self) -> &str {
        &self.inner.tables.qualified
    }

    /// Creates or upgrades the outbox's tables (embedded, versioned
    /// migrations; idempotent; replicas may run it at once). The engine
    /// runs it at start unless `[outbox] migrate = false`.
    pub async fn migrate(&self) -> Result<(), Error> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(pg_error("connecting to migrate the outbox"))?;
        self.inner.tables.migrate(&mut conn).await?;
        self.load_producer().await?;
        Ok(())
    }

    /// Writes `envelopes` in the caller's transaction: the per-key advisory
    /// locks, the rows, and the commit notification that wakes the relay.
    pub(crate) async fn insert_in(
        &self,
        conn: &mut PgConnection,
        envelopes: &[Envelope],
    ) -> Result<(), Error> {
        insert::insert(
            conn,
            &self.inner.tables,
            envelopes,
            self.inner.config.notify,
        )
        .await
    }

    /// The producer name, read from the relay table once.
    async fn load_producer(&self) -> Result<&str, Error> {
        if let Some(p) = self.inner.producer.get() {
            return Ok(p);
        }
        let sql = format!(
            "SELECT producer::text FROM {}",
            self.inner.tables.named("_relay")
        );
        let id: String = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&self.inner.pool)
            .await
            .map_err(missing_table(&self.inner.tables.qualified, self.reading()))?;
        Ok(self.inner.producer.get_or_init(|| format!("pg/{id}")))
    }

    fn reading(&self) -> String {
        format!("reading the outbox {}", self.inner.tables.qualified)
    }

    fn sql(&self, template: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(template.replace("{t}", &self.inner.tables.qualified))
    }

    async fn fetch_records(
        &self,
        sql: AssertSqlSafe<String>,
        limit: i64,
        excluding: Option<&[u64]>,
    ) -> Result<Vec<OutboxRecord>, Error> {
        let mut query = sqlx::query(sql).bind(limit);
        if let Some(seqs) = excluding {
            query = query.bind(ids(seqs));
        }
        let rows = query
            .fetch_all(&self.inner.pool)
            .await
            .map_err(missing_table(&self.inner.tables.qualified, self.reading()))?;
        rows.iter().map(record).collect()
    }

    async fn execute(
        &self,
        sql: AssertSqlSafe<String>,
        what: &str,
        f: impl FnOnce(
            sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        ) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<u64, Error> {
        let r = f(sqlx::query(sql))
            .execute(&self.inner.pool)
            .await
            .map_err(pg_error(format!(
                "outbox {}: {what}",
                self.inner.tables.qualified
            )))?;
        Ok(r.rows_affected())
    }
}

/// Wraps a sqlx error with `context`, or with how to create the tables
/// when `table` does not exist.
pub(crate) fn missing_table(table: &str, context: String) -> impl FnOnce(sqlx::Error) -> Error {
    let table = table.to_owned();
    move |source| {
        let undefined = source
            .as_database_error()
            .and_then(|d| d.code())
            .is_some_and(|c| c == "42P01");
        let context = if undefined {
            format!(
                "the table {table} does not exist; run PgOutbox::migrate() (the engine does at start unless [outbox] migrate = false)"
            )
        } else {
            context
        };
        Error::Postgres { context, source }
    }
}

const COLUMNS: &str = "id, envelope, status, attempts, reason";

fn record(row: &PgRow) -> Result<OutboxRecord, Error> {
    let get = |e: sqlx::Error| Error::Postgres {
        context: "reading an outbox row".into(),
        source: e,
    };
    let id: i64 = row.try_get("id").map_err(get)?;
    let json: String = row.try_get("envelope").map_err(get)?;
    let status: i16 = row.try_get("status").map_err(get)?;
    let attempts: i32 = row.try_get("attempts").map_err(get)?;
    let reason: Option<String> = row.try_get("reason").map_err(get)?;
    let envelope: Envelope = serde_json::from_str(&json).map_err(|e| Error::Decode {
        id: format!("outbox row {id}"),
        type_name: "Envelope".into(),
        source: e,
    })?;
    Ok(OutboxRecord {
        seq: id as u64,
        envelope: Arc::new(envelope),
        status: match status {
            0 => OutboxStatus::Pending,
            1 => OutboxStatus::Published,
            _ => OutboxStatus::Abandoned {
                reason: reason.unwrap_or_default(),
            },
        },
        attempts: attempts.max(0) as u32,
    })
}

fn ids(seqs: &[u64]) -> Vec<i64> {
    seqs.iter().map(|s| *s as i64).collect()
}

impl TransactionalOutbox for PgOutbox {
    fn insert_in<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(PgOutbox::insert_in(self, tx, envelopes))
    }
}

impl OutboxStore for PgOutbox {
    fn transactional(self: Arc<Self>) -> Option<Arc<dyn TransactionalOutbox>> {
        Some(self)
    }

    fn append(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let ctx = |what: &str| format!("outbox {}: {what}", self.inner.tables.qualified);
            let mut tx = self
                .inner
                .pool
                .begin()
                .await
                .map_err(pg_error(ctx("begin")))?;
            self.insert_in(&mut tx, &envelopes).await?;
            tx.commit().await.map_err(pg_error(ctx("commit")))?;
            Ok(())
        })
    }

    fn pending(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        Box::pin(async move {
            let sql = self.sql(&format!(
                "SELECT {COLUMNS} FROM {{t}} WHERE status = 0 ORDER BY id LIMIT $1"
            ));
            self.fetch_records(sql, limit as i64, None).await
        })
    }

    fn pending_excluding<'a>(
        &'a self,
        limit: usize,
        in_flight: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<OutboxRecord>, Error>> {
        Box::pin(async move {
            let sql = self.sql(&format!(
                "SELECT {COLUMNS} FROM {{t}} WHERE status = 0 AND NOT (id = ANY($2)) ORDER BY id LIMIT $1"
            ));
            self.fetch_records(sql, limit as i64, Some(in_flight)).await
        })
    }

    fn mark_published<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<(), Error>> {
        Box::pin(async move {
            if seqs.is_empty() {
                return Ok(());
            }
            let sql = if self.inner.config.retention_seconds == 0 {
                self.sql("DELETE FROM {t} WHERE id = ANY($1) AND status = 0")
            } else {
                self.sql(
                    "UPDATE {t} SET status = 1, published_at = now() WHERE id = ANY($1) AND status = 0",
                )
            };
            self.execute(sql, "mark published", |q| q.bind(ids(seqs)))
                .await?;
            Ok(())
        })
    }

    fn mark_abandoned(&self, seq: u64, reason: String) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let sql =
                self.sql("UPDATE {t} SET status = 2, reason = $2 WHERE id = $1 AND status = 0");
            self.execute(sql, "mark abandoned", |q| q.bind(seq as i64).bind(reason))
                .await?;
            Ok(())
        })
    }

    fn record_failure(&self, seq: u64) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let sql = self.sql("UPDATE {t} SET attempts = attempts + 1 WHERE id = $1");
            self.execute(sql, "record failure", |q| q.bind(seq as i64))
                .await?;
            Ok(())
        })
    }

    fn records(&self) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        Box::pin(async move {
            let sql = self.sql(&format!("SELECT {COLUMNS} FROM {{t}} ORDER BY id LIMIT $1"));
            self.fetch_records(sql, i64::MAX, None).await
        })
    }

    fn stats(&self) -> BoxFuture<'_, Result<OutboxStats, Error>> {
        Box::pin(async move {
            // Three index scans of the partial indexes, never the table.
            let sql = self.sql(
                "SELECT (SELECT count(*) FROM {t} WHERE status = 0),
                        (SELECT raised_ms FROM {t} WHERE status = 0 ORDER BY id LIMIT 1),
                        (SELECT count(*) FROM {t} WHERE status = 2)",
            );
            let row = sqlx::query(sql)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(missing_table(&self.inner.tables.qualified, self.reading()))?;
            let get = |e: sqlx::Error| Error::Postgres {
                context: "reading outbox statistics".into(),
                source: e,
            };
            let pending: i64 = row.try_get(0).map_err(get)?;
            let oldest: Option<i64> = row.try_get(1).map_err(get)?;
            let abandoned: i64 = row.try_get(2).map_err(get)?;
            Ok(OutboxStats {
                pending: pending.max(0) as u64,
                oldest_pending_ms: oldest.map(|ms| ms.max(0) as u64),
                abandoned: abandoned.max(0) as u64,
            })
        })
    }

    fn abandoned(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        Box::pin(async move {
            let sql = self.sql(&format!(
                "SELECT {COLUMNS} FROM {{t}} WHERE status = 2 ORDER BY id LIMIT $1"
            ));
            self.fetch_records(sql, limit as i64, None).await
        })
    }

    fn retry(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(async move {
            let sql = self.sql(
                "UPDATE {t} SET status = 0, attempts = 0, reason = NULL WHERE id = $1 AND status = 2",
            );
            let n = self.execute(sql, "retry", |q| q.bind(seq as i64)).await?;
            if n > 0 {
                let notify = format!("NOTIFY \"{}\"", self.inner.tables.channel);
                self.execute(AssertSqlSafe(notify), "notify", |q| q).await?;
            }
            Ok(n > 0)
        })
    }

    fn discard(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(async move {
            let sql = self.sql("DELETE FROM {t} WHERE id = $1 AND status = 2");
            let n = self.execute(sql, "discard", |q| q.bind(seq as i64)).await?;
            Ok(n > 0)
        })
    }

    fn record(&self, seq: u64) -> BoxFuture<'_, Result<Option<OutboxRecord>, Error>> {
        Box::pin(async move {
            let sql = self.sql(&format!("SELECT {COLUMNS} FROM {{t}} WHERE id = $1"));
            let row = sqlx::query(sql)
                .bind(seq as i64)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(missing_table(&self.inner.tables.qualified, self.reading()))?;
            row.as_ref().map(record).transpose()
        })
    }

    fn producer(&self, instance_id: &str) -> String {
        // The relay publishes under the relay table's shared producer id
        // (`pg/{uuid}`, read when it starts); this name serves only a
        // direct `OutboxProcessor::drain` (tests, the inline broker's
        // `run_until_idle`), which is then the only publisher.
        format!("{instance_id}/pg-direct")
    }

    fn election(&self) -> Option<Arc<dyn Election>> {
        Some(Arc::new(relay::PgElection::new(self.clone())))
    }

    fn housekeeping(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(self.sweep())
    }

    fn watch_commits(
        &self,
        wake: Arc<Notify>,
        stop: CancellationToken,
    ) -> Option<BoxFuture<'static, ()>> {
        Some(Box::pin(relay::watch_commits(self.clone(), wake, stop)))
    }

    fn poll_interval(&self) -> Duration {
        PgOutbox::poll_interval(self)
    }

    fn publisher_busy(&self) -> BoxFuture<'_, bool> {
        Box::pin(PgOutbox::publisher_busy(self))
    }

    fn publisher_idle(&self) -> BoxFuture<'_, bool> {
        Box::pin(PgOutbox::publisher_idle(self))
    }

    fn publisher_stopped(&self) -> BoxFuture<'_, ()> {
        Box::pin(PgOutbox::publisher_stopped(self))
    }
}
