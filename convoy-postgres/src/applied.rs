//! Exactly-once, fenced effects for handlers that write to PostgreSQL, and
//! committing a handler's raised events in its own transaction.

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgConnection;

use super::{PgOutbox, missing_table, pg_error};
use convoy_core::envelope::Origin;
use convoy_core::error::Error;
use convoy_core::handler::{Context, Position};

/// What [`AppliedEvents::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an event that was already applied must not be applied again"]
pub enum Applied {
    /// The event is new for this handler and partition: apply its effects
    /// in this transaction, then commit.
    New,
    /// The event's effects were committed before (this is a re-run after a
    /// crash or a takeover): change nothing, return `Ok`.
    AlreadyApplied,
}

impl Applied {
    /// Whether the event was applied before.
    pub fn is_already_applied(self) -> bool {
        self == Applied::AlreadyApplied
    }
}

/// Exactly-once effects in PostgreSQL for a `sequential_by` handler (or
/// process manager): the way to get "effects land in publish order" for
/// effects outside Redis.
///
/// Delivery is at least once: after a crash a handler may run an event
/// again, and an owner that stalled past its lease may finish its
/// in-flight handler after a new owner moved on. In the handler's own
/// transaction, [`claim`](AppliedEvents::claim) records the event as
/// applied for the handler and the partition stream, by the event's own
/// identity ([`Context::origin`]: the outbox that published it and its
/// record's seq there), together with the lease generation:
///
/// - an older generation than the newest recorded is refused
///   ([`Error::FencedWrite`]): return the error, the transaction rolls back
///   and the stale owner gives up the partition;
/// - an event at or below the largest seq applied from its outbox was
///   applied before ([`Applied::AlreadyApplied`]): change nothing. That
///   holds whichever stream entry carries it: a re-run, a duplicate entry,
///   or a stream recreated (after a reap) with entry ids from a clock that
///   stepped back;
/// - otherwise the record advances ([`Applied::New`]), and commits or rolls
///   back with the handler's writes.
///
/// A key's events from one outbox reach its stream in increasing seq (a
/// PostgreSQL outbox serialises a key's inserts), so "at or below" is
/// "applied". An entry without an origin (written by an older convoy or
/// another program) is recognised by its entry id instead, as the last
/// applied entry without an origin; so is a dead letter an operator
/// replayed to the handler that dead-lettered it (its origin lies behind
/// the events that handler went on with, but it never applied it). A
/// handler that applied the event before and receives the replay too (a
/// replay to every handler) finds its origin applied.
///
/// One statement, one round trip (two for a refused or repeated one
/// without an origin).
///
/// ```ignore
/// #[handle]
/// async fn debited(&self, e: Debited, ctx: &Context) -> Result<(), HandlerError> {
///     let mut tx = self.pool.begin().await?;
///     if self.applied.claim(&mut tx, ctx).await?.is_already_applied() {
///         return Ok(());
///     }
///     sqlx::query("UPDATE balances SET cents = cents - $1 WHERE account = $2")
///         .bind(e.cents).bind(&e.account_id).execute(&mut *tx).await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
///
/// The fence row is locked until the transaction ends, so a stalled owner
/// that passed `claim` holds up the partition's next write until
/// PostgreSQL ends its transaction: set
/// `idle_in_transaction_session_timeout` on the pool's connections (for
/// example `SET idle_in_transaction_session_timeout = '10s'` in an
/// `after_connect`).
#[derive(Debug, Clone)]
pub struct AppliedEvents {
    table: String,
    origins: String,
}

impl PgOutbox {
    /// The exactly-once helper on this outbox's `{table}_applied` and
    /// `{table}_applied_origin` tables (created by [`PgOutbox::migrate`]).
    pub fn applied_events(&self) -> AppliedEvents {
        AppliedEvents {
            table: self.inner.tables.named("_applied"),
            origins: self.inner.tables.named("_applied_origin"),
        }
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl AppliedEvents {
    /// In the transaction open on `tx`: refuses a stale owner, recognises a
    /// re-run, and records this event as applied (see the type's
    /// documentation).
    pub async fn claim(&self, tx: &mut PgConnection, ctx: &Context) -> Result<Applied, Error> {
        let position = ctx.position().ok_or(Error::Unsupported {
            operation: "AppliedEvents::claim",
            broker: "this handler's".into(),
            hint: "exactly-once effects need events of a key delivered one at a time: declare the handler with sequential_by (on Redis) or use the inline broker",
        })?;
        let generation = to_i64(ctx.fence().map_or(0, |f| f.generation));
        // A dead letter replayed to the handler that dead-lettered it keeps
        // its origin, which lies behind the events the handler went on
        // with: for that handler it is new, recognised by its entry id.
        let own_dead_letter = ctx
            .replay()
            .is_some_and(|r| r.dead_lettered_by(ctx.handler()));
        match ctx.origin().filter(|_| !own_dead_letter) {
            Some(origin) => {
                self.claim_origin(tx, ctx, generation, position, origin)
                    .await
            }
            None => self.claim_entry(tx, ctx, generation, position).await,
        }
    }

    fn context(&self, ctx: &Context, what: &str) -> String {
        format!(
            "exactly-once row of `{}` in {}: {what}",
            ctx.handler(),
            self.table
        )
    }

    /// By the event's identity, in one statement: the fence advances
    /// unless the generation is older, then the producer's seq advances
    /// unless this one was applied.
    async fn claim_origin(
        &self,
        tx: &mut PgConnection,
        ctx: &Context,
        generation: i64,
        position: &Position,
        origin: &Origin,
    ) -> Result<Applied, Error> {
        let sql = format!(
            "WITH fence AS (
                INSERT INTO {t} AS a (handler, stream, generation, entry_ms, entry_seq)
                VALUES ($1, $2, $3, -1, -1)
                ON CONFLICT (handler, stream) DO UPDATE
                    SET generation = EXCLUDED.generation, applied_at = now()
                    WHERE a.generation <= EXCLUDED.generation
                RETURNING 1
             ), mark AS (
                INSERT INTO {o} AS o (handler, stream, producer, seq)
                SELECT $1, $2, $4, $5 FROM fence
                ON CONFLICT (handler, stream, producer) DO UPDATE
                    SET seq = EXCLUDED.seq, applied_at = now()
                    WHERE o.seq < EXCLUDED.seq
                RETURNING 1
             )
             SELECT (SELECT count(*) FROM fence), (SELECT count(*) FROM mark)",
            t = self.table,
            o = self.origins
        );
        let (fenced_in, marked): (i64, i64) = sqlx::query_as(AssertSqlSafe(sql))
            .bind(ctx.handler())
            .bind(position.stream.as_bytes())
            .bind(generation)
            .bind(&origin.producer)
            .bind(to_i64(origin.seq))
            .fetch_one(&mut *tx)
            .await
            .map_err(missing_table(&self.origins, self.context(ctx, "claim")))?;
        if fenced_in == 0 {
            return Err(self.refused(tx, ctx, generation, &position.stream).await);
        }
        Ok(if marked == 0 {
            Applied::AlreadyApplied
        } else {
            Applied::New
        })
    }

    /// The stale owner's error, with the newer generation recorded.
    async fn refused(
        &self,
        tx: &mut PgConnection,
        ctx: &Context,
        generation: i64,
        stream: &str,
    ) -> Error {
        let sql = format!(
            "SELECT generation FROM {} WHERE handler = $1 AND stream = $2",
            self.table
        );
        let newer: i64 = match sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(ctx.handler())
            .bind(stream.as_bytes())
            .fetch_one(&mut *tx)
            .await
        {
            Ok(n) => n,
            Err(e) => return pg_error(self.context(ctx, "read the fence"))(e),
        };
        Error::FencedWrite {
            handler: ctx.handler().to_owned(),
            stream: stream.to_owned(),
            generation: generation.max(0) as u64,
            newer: newer.max(0) as u64,
        }
    }

    /// By the entry id, for an entry without an origin.
    async fn claim_entry(
        &self,
        tx: &mut PgConnection,
        ctx: &Context,
        generation: i64,
        position: &Position,
    ) -> Result<Applied, Error> {
        let (ms, seq) = position.entry().ok_or_else(|| Error::MalformedEntry {
            entry_id: position.entry_id.clone(),
            stream: position.stream.clone(),
            reason: "the entry id is not `{ms}-{seq}`".into(),
        })?;
        let stream = position.stream.as_bytes();
        let insert = format!(
            "INSERT INTO {} (handler, stream, generation, entry_ms, entry_seq)
             VALUES ($1, $2, $3, -1, -1) ON CONFLICT DO NOTHING",
            self.table
        );
        sqlx::query(AssertSqlSafe(insert))
            .bind(ctx.handler())
            .bind(stream)
            .bind(generation)
            .execute(&mut *tx)
            .await
            .map_err(missing_table(&self.table, self.context(ctx, "insert")))?;
        let select = format!(
            "SELECT generation, entry_ms, entry_seq FROM {}
             WHERE handler = $1 AND stream = $2 FOR UPDATE",
            self.table
        );
        let (stored, stored_ms, stored_seq): (i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(select))
                .bind(ctx.handler())
                .bind(stream)
                .fetch_one(&mut *tx)
                .await
                .map_err(pg_error(self.context(ctx, "lock")))?;
        if stored > generation {
            return Err(Error::FencedWrite {
                handler: ctx.handler().to_owned(),
                stream: position.stream.clone(),
                generation: generation.max(0) as u64,
                newer: stored.max(0) as u64,
            });
        }
        if (to_i64(ms), to_i64(seq)) <= (stored_ms, stored_seq) {
            return Ok(Applied::AlreadyApplied);
        }
        let update = format!(
            "UPDATE {} SET generation = $3, entry_ms = $4, entry_seq = $5, applied_at = now()
             WHERE handler = $1 AND stream = $2",
            self.table
        );
        sqlx::query(AssertSqlSafe(update))
            .bind(ctx.handler())
            .bind(stream)
            .bind(generation)
            .bind(to_i64(ms))
            .bind(to_i64(seq))
            .execute(&mut *tx)
            .await
            .map_err(pg_error(self.context(ctx, "advance")))?;
        Ok(Applied::New)
    }
}
