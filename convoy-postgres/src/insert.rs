//! Writing outbox rows in the caller's transaction.

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use super::schema::Tables;
use super::{missing_table, pg_error};
use convoy_core::envelope::Envelope;
use convoy_core::error::Error;

/// The subquery that takes the transaction-scoped lock of every key in
/// `$1` (sorted): `unnest ... WITH ORDINALITY` with an explicit ORDER BY
/// makes PostgreSQL take them in that order.
macro_rules! key_locks {
    () => {
        "(SELECT count(pg_advisory_xact_lock(l)) FROM (
            SELECT l FROM unnest($1::bigint[]) WITH ORDINALITY AS u(l, n) ORDER BY n
         ) s)"
    };
}

/// Inserts `envelopes` in the transaction open on `conn`.
///
/// First the transaction-scoped advisory lock of every partition key among
/// them, in sorted order (two transactions raising for the same keys take
/// them in the same order and so cannot deadlock on them): a second
/// transaction raising for a key waits here until the first ends, so its
/// rows get larger ids and, within a key, id order is commit order. Then
/// the rows, in raise order. Unless `[outbox] notify = false`, with the
/// locks, in the same statement, the shared *flush* lock, and a
/// notification that PostgreSQL delivers to the relay when (and only if)
/// the transaction commits, unless the relay is busy (see
/// [`crate::pace`]).
pub(super) async fn insert(
    conn: &mut PgConnection,
    tables: &Tables,
    envelopes: &[Envelope],
    notify: bool,
) -> Result<(), Error> {
    if envelopes.is_empty() {
        return Ok(());
    }
    let ctx = |what: &str| format!("writing to the outbox {}: {what}", tables.qualified);
    let mut locks: Vec<i64> = envelopes
        .iter()
        .filter_map(|e| {
            e.partition_key
                .as_deref()
                .map(|k| tables.key_lock(&e.category, k))
        })
        .collect();
    locks.sort_unstable();
    locks.dedup();
    if notify {
        // The shared *flush* lock too, held until the transaction ends: the
        // relay going idle waits for this transaction if it skips its
        // notification (see `crate::pace`). The relay holds it exclusively
        // for one statement at most and never waits for a key lock, so it
        // goes with those, in any order. Then, in the same statement (one
        // round trip), the notification (PostgreSQL delivers it at commit)
        // unless the relay is busy, reading every millisecond anyway: the
        // test lets go of the lock at once, so a writer never keeps the
        // relay from getting busy. `CASE` runs its branches in order, the
        // test only once the key locks and *flush* are held.
        sqlx::query(concat!(
            "SELECT CASE WHEN ",
            key_locks!(),
            " >= 0 AND (SELECT count(pg_advisory_xact_lock_shared($2))) >= 0
             THEN (SELECT count(pg_notify($3, '')) FROM (
                    SELECT CASE WHEN pg_try_advisory_lock_shared($4)
                        THEN pg_advisory_unlock_shared($4) ELSE false END AS idle
                 ) relay WHERE relay.idle)
             END"
        ))
        .bind(&locks)
        .bind(tables.flush_lock)
        .bind(&tables.channel)
        .bind(tables.busy_lock)
        .execute(&mut *conn)
        .await
        .map_err(pg_error(ctx(
            "locking the partition keys and notifying the relay",
        )))?;
    } else if !locks.is_empty() {
        sqlx::query(concat!("SELECT ", key_locks!()))
            .bind(&locks)
            .execute(&mut *conn)
            .await
            .map_err(pg_error(ctx("locking the partition keys")))?;
    }
    let mut categories = Vec::with_capacity(envelopes.len());
    let mut keys: Vec<Option<Vec<u8>>> = Vec::with_capacity(envelopes.len());
    let mut bodies = Vec::with_capacity(envelopes.len());
    let mut raised = Vec::with_capacity(envelopes.len());
    for e in envelopes {
        categories.push(e.category.clone());
        keys.push(e.partition_key.as_ref().map(|k| k.as_bytes().to_vec()));
        bodies.push(serde_json::to_string(e).map_err(|source| Error::Encode {
            type_name: "Envelope".into(),
            source,
        })?);
        raised.push(i64::try_from(e.time_ms).unwrap_or(i64::MAX));
    }
    let sql = format!(
        "INSERT INTO {} (category, partition_key, envelope, raised_ms)
         SELECT c, k, e, r FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[])
             WITH ORDINALITY AS u(c, k, e, r, n) ORDER BY n",
        tables.qualified
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(&categories)
        .bind(&keys)
        .bind(&bodies)
        .bind(&raised)
        .execute(&mut *conn)
        .await
        .map_err(missing_table(&tables.qualified, ctx("inserting the rows")))?;
    Ok(())
}
