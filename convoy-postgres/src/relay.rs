//! The relay's election among the replicas: one leader publishes the
//! outbox, holding a session advisory lock, fenced by an epoch; it is woken
//! by `LISTEN/NOTIFY` on commit (see the module documentation of
//! [`postgres`](super)). The publishing loop itself is the runtime's
//! (`outbox::relay`), the same for every store.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnection, PgListener};
use sqlx::{AssertSqlSafe, Connection};
use tokio::sync::{Mutex, Notify};
use tokio_util::sync::CancellationToken;

use super::{PgOutbox, pg_error};
use crate::tracing;
use convoy_core::error::Error;
use convoy_core::future::BoxFuture;
use convoy_core::outbox::{Election, Term};

/// Rows deleted per retention sweep statement.
const SWEEP_BATCH: i64 = 10_000;

/// The election of a `PgOutbox`'s relay: a session advisory lock on the
/// outbox's relay table, an epoch raised in it at every term.
pub(super) struct PgElection {
    outbox: PgOutbox,
    /// A standby's session, kept between attempts.
    session: Mutex<Option<PgConnection>>,
}

impl PgElection {
    pub(super) fn new(outbox: PgOutbox) -> Self {
        PgElection {
            outbox,
            session: Mutex::new(None),
        }
    }
}

impl Election for PgElection {
    fn prepare(&self) -> BoxFuture<'_, Result<String, Error>> {
        Box::pin(async move {
            if self.outbox.inner.config.migrate {
                self.outbox.migrate().await?;
            }
            Ok(self.outbox.load_producer().await?.to_owned())
        })
    }

    fn campaign(&self, newest_seen: u64) -> BoxFuture<'_, Result<Option<Term>, Error>> {
        Box::pin(async move {
            let mut session = self.session.lock().await;
            let won = try_lead(&self.outbox, &mut session, newest_seen).await;
            if won.is_err() {
                *session = None;
            }
            let Some((conn, epoch)) = won? else {
                return Ok(None);
            };
            let every = self.outbox.leader_timeout() / 3;
            Ok(Some(Term::new(epoch, move |lost, resign| {
                keep_session(conn, every, lost, resign)
            })))
        })
    }

    fn standby(&self) -> Duration {
        self.outbox.leader_timeout() / 4
    }
}

/// A standby's attempt to take the leadership on its session (opened, with
/// the leader's idle timeout, when there is none).
async fn try_lead(
    outbox: &PgOutbox,
    session: &mut Option<PgConnection>,
    newest_seen: u64,
) -> Result<Option<(PgConnection, u64)>, Error> {
    let conn = match session {
        Some(c) => c,
        None => {
            let mut c = PgConnection::connect_with(&outbox.inner.options)
                .await
                .map_err(pg_error("outbox relay: connecting"))?;
            // A stalled leader stops pinging: PostgreSQL then ends its
            // session, which releases the lock for a standby.
            let sql = format!(
                "SET idle_session_timeout = {}",
                outbox.leader_timeout().as_millis()
            );
            sqlx::query(AssertSqlSafe(sql))
                .execute(&mut c)
                .await
                .map_err(pg_error("outbox relay: setting idle_session_timeout"))?;
            session.insert(c)
        }
    };
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(outbox.inner.tables.leader_lock)
        .fetch_one(&mut *conn)
        .await
        .map_err(pg_error("outbox relay: trying the leader lock"))?;
    if !got {
        return Ok(None);
    }
    let sql = format!(
        "UPDATE {} SET epoch = greatest(epoch, $1) + 1 RETURNING epoch",
        outbox.inner.tables.named("_relay")
    );
    let epoch: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(i64::try_from(newest_seen).unwrap_or(i64::MAX - 1))
        .fetch_one(&mut *conn)
        .await
        .map_err(pg_error("outbox relay: taking an epoch"))?;
    let Some(conn) = session.take() else {
        return Ok(None);
    };
    Ok(Some((conn, epoch.max(1) as u64)))
}

/// Holds a term: keeps the leader's session alive (well within its idle
/// timeout) until `stop`; cancels `lost` if the session fails. Closing it
/// releases the lock.
async fn keep_session(
    mut session: PgConnection,
    every: Duration,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(every) => {}
        }
        let ping = tokio::time::timeout(every, sqlx::query("SELECT 1").execute(&mut session)).await;
        if !matches!(ping, Ok(Ok(_))) {
            lost.cancel();
            return;
        }
    }
    let _ = session.close().await;
}

/// Wakes the relay (`wake`) on every commit notification of the outbox's
/// channel until `stop`; also when the listener's connection drops (rows
/// committed meanwhile are found by the next read). Without a listener
/// (it cannot be opened now) the relay polls.
pub(super) async fn watch_commits(outbox: PgOutbox, wake: Arc<Notify>, stop: CancellationToken) {
    let open = async {
        let mut l = PgListener::connect_with(outbox.pool()).await?;
        l.listen(&outbox.inner.tables.channel).await?;
        Ok::<_, sqlx::Error>(l)
    };
    let mut listener = match open.await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "outbox relay cannot LISTEN; polling only");
            return;
        }
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = listener.try_recv() => {
                if got.is_err() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                wake.notify_one();
            }
        }
    }
}

impl PgOutbox {
    pub(super) fn leader_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.config.leader_timeout_ms)
    }

    pub(super) fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.inner.config.poll_interval_ms)
    }

    /// Deletes published rows older than the retention, a bounded batch at
    /// a time, through the published rows' index.
    pub(super) async fn sweep(&self) -> Result<(), Error> {
        let retention = self.inner.config.retention_seconds;
        if retention == 0 {
            return Ok(());
        }
        let sql = self.sql(
            "DELETE FROM {t} WHERE id IN (
                SELECT id FROM {t} WHERE status = 1
                    AND published_at < now() - make_interval(secs => $1)
                ORDER BY published_at LIMIT $2)",
        );
        self.execute(sql, "retention sweep", |q| {
            q.bind(retention as f64).bind(SWEEP_BATCH)
        })
        .await?;
        Ok(())
    }
}
