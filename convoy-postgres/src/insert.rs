//! Writing outbox rows in the caller's transaction.

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use super::missing_table;
use super::schema::Tables;
use convoy_core::envelope::Envelope;
use convoy_core::error::Error;

/// The subquery that takes the transaction-scoped lock of every key in
/// `$5` (sorted): `unnest ... WITH ORDINALITY` with an explicit ORDER BY
/// makes PostgreSQL take them in that order.
const KEY_LOCKS: &str = "(SELECT count(pg_advisory_xact_lock(l)) FROM (
        SELECT l FROM unnest($5::bigint[]) WITH ORDINALITY AS u(l, n) ORDER BY n
     ) s)";

/// Inserts `envelopes` in the transaction open on `conn`, in one statement
/// (one round trip).
///
/// First the transaction-scoped advisory lock of every partition key among
/// them, in sorted order (two transactions raising for the same keys take
/// them in the same order and so cannot deadlock on them): a second
/// transaction raising for a key waits here until the first ends, so its
/// rows get larger ids and, within a key, id order is commit order. Then
/// the rows, in raise order. Unless `[outbox] notify = false`, with the
/// locks, the shared *flush* lock, and a notification that PostgreSQL
/// delivers to the relay when (and only if) the transaction commits,
/// unless the relay is busy (see [`crate::pace`]).
///
/// The locks and the notification are an uncorrelated subquery in the
/// `INSERT`'s `WHERE`: PostgreSQL runs it once, as a one-time filter,
/// before the first row is read, so before any row takes its id.
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
    let filter = if notify {
        // The shared *flush* lock too, held until the transaction ends: the
        // relay going idle waits for this transaction if it skips its
        // notification (see `crate::pace`). The relay holds it exclusively
        // for one statement at most and never waits for a key lock, so it
        // goes with those, in any order. Then the notification (PostgreSQL
        // delivers it at commit) unless the relay is busy, reading every
        // millisecond anyway: the test lets go of the lock at once, so a
        // writer never keeps the relay from getting busy. `CASE` runs its
        // branches in order, the test only once the key locks and *flush*
        // are held; its value is a count, never NULL.
        format!(
            "(SELECT CASE WHEN {KEY_LOCKS} >= 0 AND (SELECT count(pg_advisory_xact_lock_shared($6))) >= 0
                THEN (SELECT count(pg_notify($7, '')) FROM (
                    SELECT CASE WHEN pg_try_advisory_lock_shared($8)
                        THEN pg_advisory_unlock_shared($8) ELSE false END AS idle
                ) relay WHERE relay.idle)
              END) >= 0"
        )
    } else if !locks.is_empty() {
        format!("{KEY_LOCKS} >= 0")
    } else {
        "true".to_owned()
    };
    let sql = format!(
        "INSERT INTO {} (category, partition_key, envelope, raised_ms)
         SELECT c, k, e, r FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[])
             WITH ORDINALITY AS u(c, k, e, r, n)
         WHERE {filter}
         ORDER BY n",
        tables.qualified
    );
    let mut query = sqlx::query(AssertSqlSafe(sql))
        .bind(&categories)
        .bind(&keys)
        .bind(&bodies)
        .bind(&raised);
    if notify || !locks.is_empty() {
        query = query.bind(&locks);
    }
    if notify {
        query = query
            .bind(tables.flush_lock)
            .bind(&tables.channel)
            .bind(tables.busy_lock);
    }
    let done = query
        .execute(&mut *conn)
        .await
        .map_err(missing_table(&tables.qualified, ctx("inserting the rows")))?;
    // The filter holds for every row; a statement that wrote fewer would
    // lose events with the caller's commit.
    if done.rows_affected() != envelopes.len() as u64 {
        return Err(Error::Postgres {
            context: ctx("inserting the rows"),
            source: sqlx::Error::Protocol(format!(
                "the INSERT wrote {} of {} rows; check that no rule or trigger on the table drops rows",
                done.rows_affected(),
                envelopes.len()
            )),
        });
    }
    Ok(())
}
