//! Writing outbox rows in the caller's transaction.

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use super::schema::Tables;
use super::{missing_table, pg_error};
use convoy_core::envelope::Envelope;
use convoy_core::error::Error;

/// Inserts `envelopes` in the transaction open on `conn`.
///
/// First the transaction-scoped advisory lock of every partition key among
/// them, in sorted order (two transactions raising for the same keys take
/// them in the same order and so cannot deadlock on them): a second
/// transaction raising for a key waits here until the first ends, so its
/// rows get larger ids and, within a key, id order is commit order. Then
/// the rows, in raise order. With the locks (in the same statement), unless
/// `[outbox] notify = false`, a notification that PostgreSQL delivers to
/// the relay when (and only if) the transaction commits.
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
    // One round trip for the locks and the notification (which PostgreSQL
    // only queues now and delivers at commit, so where it stands in the
    // transaction does not matter).
    match (locks.is_empty(), notify) {
        (true, false) => {}
        (true, true) => {
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(&tables.channel)
                .execute(&mut *conn)
                .await
                .map_err(pg_error(ctx("notifying the relay")))?;
        }
        (false, _) => {
            // The ids are sorted here, and `unnest ... WITH ORDINALITY`
            // with an explicit ORDER BY makes PostgreSQL take the locks in
            // that order.
            sqlx::query(
                "SELECT count(pg_advisory_xact_lock(l)),
                        CASE WHEN $2 THEN (SELECT pg_notify($3, '')) END
                 FROM (
                    SELECT l FROM unnest($1::bigint[]) WITH ORDINALITY AS u(l, n) ORDER BY n
                 ) s",
            )
            .bind(&locks)
            .bind(notify)
            .bind(&tables.channel)
            .execute(&mut *conn)
            .await
            .map_err(pg_error(ctx(if notify {
                "locking the partition keys and notifying the relay"
            } else {
                "locking the partition keys"
            })))?;
        }
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
