//! When commits notify the relay.
//!
//! `NOTIFY` is what lets the relay sleep until a commit, but PostgreSQL
//! commits notifying transactions one at a time (each holds the notify
//! queue's lock through its WAL flush), which costs concurrent writers most
//! of their throughput. So a commit notifies only while the relay may be
//! asleep; while it is busy (reading every millisecond, see the runtime's
//! relay loop) it finds the rows by itself. Two advisory locks of the
//! outbox say which, without a write:
//!
//! - **busy**: the leading relay holds it (exclusive, on a session of its
//!   own) while it is busy. A writer tries it (shared) and lets go at once:
//!   taken, the relay is not busy, so the writer notifies; refused, it
//!   does not.
//! - **flush**: every notifying writer holds it (shared) from before that
//!   test until its transaction ends, so a writer that skipped its
//!   notification holds it until its rows are committed or gone.
//!
//! Going idle, the relay first releases *busy* (from then on every commit
//! notifies), then tries *busy* and *flush* exclusively, and lets go at
//! once: both taken, no session holds *busy* (a former leader's may, until
//! PostgreSQL ends it) and no writer that could have seen it held is still
//! under way, so one more read finds every row committed without a
//! notification and it may wait. Refused, it reads again a moment later
//! and tries again, less often the longer it is refused. A new leader
//! starts this way too: its predecessor may have left writers that skipped
//! their notification. The relay only
//! ever tries these locks (it never waits for them while holding one), and
//! a writer waits for *flush* only during that one statement, so no one
//! waits on anyone for long and no cycle of waits can form.
//!
//! Whatever fails (the relay's session drops, the relay stalls and
//! PostgreSQL ends its idle session, PostgreSQL restarts), *busy* is
//! released with the session and every commit notifies again: the cost of
//! a failure is throughput, never a row left waiting for the poll.

use std::time::{Duration, Instant};

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use super::{PgOutbox, pg_error};
use crate::tracing;
use convoy_core::error::Error;

/// The relay's session for the *busy* and *flush* locks.
#[derive(Default)]
pub(super) struct PublisherSession {
    conn: Option<PgConnection>,
    /// Whether this session holds *busy*.
    busy: bool,
    /// When the session last ran a statement.
    used: Option<Instant>,
}

impl PgOutbox {
    /// See [`convoy_core::outbox::OutboxStore::publisher_busy`]: takes (or
    /// keeps) *busy*. False without notifications (`notify = false`), or
    /// when the lock or the session cannot be had.
    pub(super) async fn publisher_busy(&self) -> bool {
        if !self.inner.config.notify {
            return false;
        }
        let mut s = self.inner.publisher.lock().await;
        // PostgreSQL ends the session when it idles past the leader
        // timeout (a stalled relay must not keep writers from notifying):
        // a busy relay touches it well within.
        let keep_alive = self.leader_timeout() / 4;
        if s.busy && s.used.is_some_and(|at| at.elapsed() < keep_alive) {
            return true;
        }
        let busy_lock = self.inner.tables.busy_lock;
        let idle_timeout = self.leader_timeout().max(Duration::from_millis(1));
        let was_busy = s.busy;
        let result = self
            .within("keeping or taking the busy lock", async {
                let conn = self.publisher_conn(&mut s).await?;
                if was_busy {
                    sqlx::query("SELECT 1")
                        .execute(&mut *conn)
                        .await
                        .map_err(pg_error("outbox relay: keeping its session"))?;
                    Ok::<bool, Error>(true)
                } else {
                    // Held, the session ends if it idles past the leader
                    // timeout (a stalled relay); released, it may idle.
                    sqlx::query_scalar::<_, bool>(
                        "SELECT CASE WHEN pg_try_advisory_lock($1) \
                         THEN set_config('idle_session_timeout', $2, false) IS NOT NULL \
                         ELSE false END",
                    )
                    .bind(busy_lock)
                    .bind(idle_timeout.as_millis().to_string())
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(pg_error("outbox relay: taking the busy lock"))
                }
            })
            .await;
        match result {
            Ok(busy) => {
                s.busy = busy;
                s.used = Some(Instant::now());
                busy
            }
            Err(e) => {
                tracing::debug!(error = %e, "outbox relay: every commit notifies for now");
                // Closing the session releases the lock.
                *s = PublisherSession::default();
                false
            }
        }
    }

    /// See [`convoy_core::outbox::OutboxStore::publisher_idle`]: releases
    /// *busy*, then tries *busy* and *flush* (neither may be held
    /// elsewhere).
    pub(super) async fn publisher_idle(&self) -> bool {
        if !self.inner.config.notify {
            return true;
        }
        let mut s = self.inner.publisher.lock().await;
        let tables = &self.inner.tables;
        let was_busy = s.busy;
        let result = self
            .within("releasing the busy lock and trying the flush lock", async {
                let conn = self.publisher_conn(&mut s).await?;
                if was_busy {
                    sqlx::query(
                        "SELECT pg_advisory_unlock($1), set_config('idle_session_timeout', '0', false)",
                    )
                    .bind(tables.busy_lock)
                    .execute(&mut *conn)
                    .await
                    .map_err(pg_error("outbox relay: releasing the busy lock"))?;
                }
                // Busy must be free too: held by another session (a former
                // leader's, until PostgreSQL ends it), writers still skip
                // their notification. CASE tries them in order.
                sqlx::query_scalar::<_, bool>(
                    "SELECT CASE WHEN NOT pg_try_advisory_lock($1) THEN false \
                     WHEN NOT pg_advisory_unlock($1) THEN false \
                     WHEN pg_try_advisory_lock($2) THEN pg_advisory_unlock($2) \
                     ELSE false END",
                )
                .bind(tables.busy_lock)
                .bind(tables.flush_lock)
                .fetch_one(&mut *conn)
                .await
                .map_err(pg_error("outbox relay: trying the busy and flush locks"))
            })
            .await;
        s.busy = false;
        match result {
            Ok(settled) => {
                s.used = Some(Instant::now());
                settled
            }
            Err(e) => {
                tracing::debug!(error = %e, "outbox relay: cannot tell yet whether every commit notifies");
                *s = PublisherSession::default();
                false
            }
        }
    }

    /// See [`convoy_core::outbox::OutboxStore::publisher_stopped`]: closes
    /// the relay's session (a replica that no longer leads keeps no
    /// connection for it; closing releases *busy* if it was held).
    pub(super) async fn publisher_stopped(&self) {
        let mut s = self.inner.publisher.lock().await;
        if let Some(conn) = std::mem::take(&mut *s).conn {
            let closed = tokio::time::timeout(self.leader_timeout(), conn.close()).await;
            if !matches!(closed, Ok(Ok(()))) {
                tracing::debug!(
                    "outbox relay: its busy session did not close cleanly; PostgreSQL ends it"
                );
            }
        }
    }

    /// Runs one step on the relay's session within the leader timeout: a
    /// PostgreSQL that stops answering must not hold up the relay (the
    /// caller then closes the session, which releases its locks).
    async fn within<T>(
        &self,
        what: &'static str,
        step: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let limit = self.leader_timeout().max(Duration::from_millis(100));
        tokio::time::timeout(limit, step).await.unwrap_or_else(|_| {
            Err(Error::TaskFailed {
                task: "outbox relay",
                reason: format!(
                    "{what} took longer than the leader timeout ({} ms); closing its session",
                    limit.as_millis()
                ),
            })
        })
    }

    /// The relay's session, opened when there is none.
    async fn publisher_conn<'a>(
        &self,
        s: &'a mut PublisherSession,
    ) -> Result<&'a mut PgConnection, Error> {
        if s.conn.is_none() {
            let c = PgConnection::connect_with(&self.inner.options)
                .await
                .map_err(pg_error("outbox relay: connecting its busy session"))?;
            s.busy = false;
            s.conn = Some(c);
        }
        s.conn.as_mut().ok_or_else(|| Error::TaskFailed {
            task: "outbox relay",
            reason: "its busy session was not kept".to_owned(),
        })
    }
}

#[cfg(test)]
#[path = "pace_tests.rs"]
mod tests;
