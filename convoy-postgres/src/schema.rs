//! The tables of a PostgreSQL outbox, their statements and their embedded
//! migrations.
//!
//! | table | what it holds |
//! | --- | --- |
//! | `{schema}.{table}` | one row per raised event: `id` (identity, publish order within a key), `category`, `partition_key` (bytea: a key may hold any UTF-8, NUL included), `envelope` (the event as JSON), `raised_ms`, `status` (0 pending, 1 published and kept for `retention_seconds`, 2 abandoned), `attempts`, `reason`, `published_at` |
//! | `{schema}.{table}_relay` | one row: the producer id the broker knows this outbox by (shared by every replica), the relay's fencing epoch, the schema version |
//! | `{schema}.{table}_applied` | the exactly-once helper's fence per (handler, partition stream): the newest lease generation, and the last applied entry of events without an origin |
//! | `{schema}.{table}_applied_origin` | the exactly-once helper's record per (handler, partition stream, producer): the largest outbox seq applied (an event's identity, see `Origin`) |
//!
//! Pending, published and abandoned rows each have a partial index, so the
//! relay's read, the retention sweep and the operator's listing never scan
//! the table.

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use convoy_core::error::Error;

use super::pg_error;

/// The embedded migrations, applied in order; the relay table's `version`
/// says how many have run. Never edit a released one: add another.
const MIGRATIONS: &[&str] = &[
    // 1: the outbox, its indexes, the applied-events table.
    "CREATE TABLE {t} (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        category text NOT NULL,
        partition_key bytea,
        envelope text NOT NULL,
        raised_ms bigint NOT NULL,
        status smallint NOT NULL DEFAULT 0,
        attempts integer NOT NULL DEFAULT 0,
        reason text,
        published_at timestamptz
    );
    CREATE INDEX {n}_pending ON {t} (id) WHERE status = 0;
    CREATE INDEX {n}_published ON {t} (published_at) WHERE status = 1;
    CREATE INDEX {n}_abandoned ON {t} (id) WHERE status = 2;
    CREATE TABLE {applied} (
        handler text NOT NULL,
        stream bytea NOT NULL,
        generation bigint NOT NULL,
        entry_ms bigint NOT NULL,
        entry_seq bigint NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (handler, stream)
    );",
    // 2: exactly-once by the event's identity (its producer and outbox
    // seq), not by where it sits in a stream.
    "CREATE TABLE {applied_origin} (
        handler text NOT NULL,
        stream bytea NOT NULL,
        producer text NOT NULL,
        seq bigint NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (handler, stream, producer)
    );",
];

/// The qualified names and the statements of one outbox.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    pub(crate) schema: String,
    pub(crate) table: String,
    /// `"schema"."table"`.
    pub(crate) qualified: String,
    /// The LISTEN/NOTIFY channel of commits.
    pub(crate) channel: String,
    /// The advisory lock of the relay's leadership.
    pub(crate) leader_lock: i64,
    /// The advisory lock the relay holds while busy (see [`crate::pace`]).
    pub(crate) busy_lock: i64,
    /// The advisory lock notifying writers hold (shared) while they may
    /// have skipped their notification (see [`crate::pace`]).
    pub(crate) flush_lock: i64,
    /// The advisory lock taken while migrating.
    migrate_lock: i64,
}

impl Tables {
    /// The tables of `schema.table` (both checked identifiers).
    pub(crate) fn new(schema: &str, table: &str) -> Tables {
        let qualified = format!("\"{schema}\".\"{table}\"");
        Tables {
            schema: schema.to_owned(),
            table: table.to_owned(),
            channel: format!("convoy_{schema}_{table}"),
            leader_lock: lock_id(&["convoy-relay", schema, table]),
            busy_lock: lock_id(&["convoy-relay-busy", schema, table]),
            flush_lock: lock_id(&["convoy-relay-flush", schema, table]),
            migrate_lock: lock_id(&["convoy-migrate", schema, table]),
            qualified,
        }
    }

    /// `{schema}.{table}{suffix}`, quoted.
    pub(crate) fn named(&self, suffix: &str) -> String {
        format!("\"{}\".\"{}{suffix}\"", self.schema, self.table)
    }

    /// The advisory lock serialising the outbox inserts of one partition
    /// key.
    pub(crate) fn key_lock(&self, category: &str, key: &str) -> i64 {
        lock_id(&["convoy-key", &self.schema, &self.table, category, key])
    }

    /// Creates or upgrades the tables: idempotent, and safe to run from
    /// several replicas at once (they take turns under an advisory lock).
    pub(crate) async fn migrate(&self, conn: &mut PgConnection) -> Result<(), Error> {
        let ctx = |what: &str| format!("migrating the outbox {}: {what}", self.qualified);
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(pg_error(ctx("begin")))?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(self.migrate_lock)
            .execute(&mut *tx)
            .await
            .map_err(pg_error(ctx("lock")))?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(&self.schema)
                .fetch_one(&mut *tx)
                .await
                .map_err(pg_error(ctx("schema lookup")))?;
        if !exists {
            let sql = format!("CREATE SCHEMA \"{}\"", self.schema);
            sqlx::query(AssertSqlSafe(sql))
                .execute(&mut *tx)
                .await
                .map_err(pg_error(ctx("create schema")))?;
        }
        let relay = self.named("_relay");
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS {relay} (
                singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
                producer uuid NOT NULL DEFAULT gen_random_uuid(),
                epoch bigint NOT NULL DEFAULT 0,
                version integer NOT NULL DEFAULT 0
            )"
        );
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .map_err(pg_error(ctx("relay table")))?;
        let sql = format!("INSERT INTO {relay} DEFAULT VALUES ON CONFLICT DO NOTHING");
        sqlx::query(AssertSqlSafe(sql))
            .execute(&mut *tx)
            .await
            .map_err(pg_error(ctx("relay row")))?;
        let sql = format!("SELECT version FROM {relay}");
        let version: i32 = sqlx::query_scalar(AssertSqlSafe(sql))
            .fetch_one(&mut *tx)
            .await
            .map_err(pg_error(ctx("version")))?;
        let version = usize::try_from(version).unwrap_or(0);
        if version > MIGRATIONS.len() {
            return Err(Error::Config {
                file: "[outbox]".into(),
                message: format!(
                    "the outbox {} is at schema version {version}, newer than this convoy ({}); upgrade convoy",
                    self.qualified,
                    MIGRATIONS.len()
                ),
            });
        }
        let n = format!("{}_{}", self.schema, self.table);
        for (i, step) in MIGRATIONS.iter().enumerate().skip(version) {
            let sql = step
                .replace("{t}", &self.qualified)
                .replace("{applied_origin}", &self.named("_applied_origin"))
                .replace("{applied}", &self.named("_applied"))
                .replace("{n}", &n);
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&mut *tx)
                .await
                .map_err(pg_error(ctx(&format!("step {}", i + 1))))?;
            let sql = format!("UPDATE {relay} SET version = $1");
            sqlx::query(AssertSqlSafe(sql))
                .bind(i as i32 + 1)
                .execute(&mut *tx)
                .await
                .map_err(pg_error(ctx("version update")))?;
        }
        tx.commit().await.map_err(pg_error(ctx("commit")))?;
        Ok(())
    }
}

/// A stable 64-bit advisory lock id for `parts` (FNV-1a; parts separated
/// by a byte no identifier holds). Collisions only make two keys wait for
/// each other.
fn lock_id(parts: &[&str]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            h ^= 0xff;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        for b in part.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_ids_are_stable_and_separate_parts() {
        // Pinned: replicas built by different compilers must agree.
        assert_eq!(lock_id(&["a"]), 0xaf63dc4c8601ec8c_u64 as i64);
        assert_ne!(lock_id(&["ab", "c"]), lock_id(&["a", "bc"]));
        let t = Tables::new("public", "convoy_outbox");
        assert_ne!(t.key_lock("order", "k1"), t.key_lock("order", "k2"));
        assert_ne!(t.key_lock("order", "k1"), t.key_lock("invoice", "k1"));
    }
}
