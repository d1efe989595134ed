//! The relay: one leader among the replicas publishes the outbox, woken by
//! `LISTEN/NOTIFY` on commit, fenced by an epoch (see the module
//! documentation of [`postgres`](super)).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnection, PgListener};
use sqlx::{AssertSqlSafe, Connection};
use tokio_util::sync::CancellationToken;

use super::{PgOutbox, pg_error};
use crate::tracing;
use convoy_core::backoff::{Backoff, sleep_or_stop};
use convoy_core::broker::Producer;
use convoy_core::error::{Error, chain};
use convoy_core::outbox::OutboxProcessor;
use convoy_core::outbox::processor::STATS_EVERY;

/// Rows deleted per retention sweep statement.
const SWEEP_BATCH: i64 = 10_000;

/// Runs the relay of `outbox` until `shutdown` fires.
pub(super) async fn run(
    outbox: PgOutbox,
    processor: Arc<OutboxProcessor>,
    shutdown: CancellationToken,
) {
    let mut backoff = Backoff::reconnect();
    let name = loop {
        let ready = if outbox.inner.config.migrate {
            outbox.migrate().await
        } else {
            Ok(())
        };
        match ready.and(Ok(())) {
            Ok(()) => match outbox.load_producer().await {
                Ok(name) => break name.to_owned(),
                Err(e) => tracing::warn!(error = %chain(&e), "outbox relay cannot start"),
            },
            Err(e) => tracing::warn!(error = %chain(&e), "outbox relay cannot migrate its tables"),
        }
        if !backoff.wait_or_stop(&shutdown).await {
            return;
        }
    };
    let mut newest_seen = 0;
    let mut session: Option<PgConnection> = None;
    let standby = outbox.leader_timeout() / 4;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        match try_lead(&outbox, &mut session, newest_seen).await {
            Ok(Some(leader)) => {
                backoff.reset();
                newest_seen = leader.lead(&outbox, &processor, &name, &shutdown).await;
            }
            Ok(None) => {
                // `sleep_or_stop` is true when `shutdown` fired: a standby
                // keeps trying for the lock until then.
                if sleep_or_stop(standby, &shutdown).await {
                    return;
                }
            }
            Err(e) => {
                session = None;
                tracing::warn!(error = %chain(&e), "outbox relay cannot reach PostgreSQL; rows stay pending");
                if !backoff.wait_or_stop(&shutdown).await {
                    return;
                }
            }
        }
    }
}

/// A standby's attempt to take the leadership on its session (opened, with
/// the leader's idle timeout, when there is none).
async fn try_lead(
    outbox: &PgOutbox,
    session: &mut Option<PgConnection>,
    newest_seen: u64,
) -> Result<Option<Leader>, Error> {
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
    Ok(Some(Leader {
        session: conn,
        epoch: epoch.max(1) as u64,
    }))
}

/// The relay while it holds the leader lock.
struct Leader {
    /// The session holding the lock.
    session: PgConnection,
    epoch: u64,
}

impl Leader {
    /// Publishes until the leadership is lost, the broker reports a newer
    /// publisher, or `shutdown` fires; returns the newest epoch seen.
    async fn lead(
        self,
        outbox: &PgOutbox,
        processor: &OutboxProcessor,
        name: &str,
        shutdown: &CancellationToken,
    ) -> u64 {
        let producer = Producer {
            name: name.to_owned(),
            epoch: self.epoch,
        };
        tracing::info!(
            table = %outbox.qualified_table(),
            epoch = self.epoch,
            "outbox relay: this instance publishes"
        );
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let pinger = tokio::spawn(keep_session(
            self.session,
            outbox.leader_timeout() / 3,
            lost.clone(),
            stop.clone(),
        ));
        let mut listener = listen(outbox).await;
        let mut newest = self.epoch;
        let mut backoff = Backoff::reconnect();
        let mut housekeeping: Option<Instant> = None;
        loop {
            if housekeeping.is_none_or(|at| at.elapsed() >= STATS_EVERY) {
                housekeeping = Some(Instant::now());
                if let Err(e) = processor.export_stats().await {
                    tracing::debug!(error = %chain(&e), "outbox statistics unavailable");
                }
                if let Err(e) = outbox.sweep().await {
                    tracing::warn!(error = %chain(&e), "outbox retention sweep failed");
                }
            }
            let notified = processor.wake().notified();
            let wait = match processor.drain_as(&producer).await {
                Ok(published) => {
                    backoff.reset();
                    if published == 0 {
                        processor.recheck_published().await;
                    }
                    outbox.poll_interval()
                }
                Err(Error::PublisherReplaced { newer, .. }) => {
                    tracing::warn!(
                        epoch = self.epoch,
                        newer,
                        "outbox relay: another replica publishes now; standing by"
                    );
                    newest = newest.max(newer);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "outbox publish failed; rows stay pending");
                    backoff.next_delay()
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => {
                    if !lost.is_cancelled() {
                        processor.final_drain(&producer).await;
                    }
                    break;
                }
                _ = lost.cancelled() => {
                    tracing::warn!(
                        epoch = self.epoch,
                        "outbox relay: leadership lost (the session ended); standing by"
                    );
                    break;
                }
                _ = notified => {}
                _ = next_commit(&mut listener) => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        stop.cancel();
        let _ = pinger.await;
        newest
    }
}

/// Keeps the leader's session alive (well within its idle timeout) until
/// `stop`; cancels `lost` if the session fails. Closing it releases the
/// lock.
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

/// A listener on the outbox's commit channel; `None` (poll only) if it
/// cannot be opened now.
async fn listen(outbox: &PgOutbox) -> Option<PgListener> {
    let open = async {
        let mut l = PgListener::connect_with(outbox.pool()).await?;
        l.listen(&outbox.inner.tables.channel).await?;
        Ok::<_, sqlx::Error>(l)
    };
    match open.await {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!(error = %e, "outbox relay cannot LISTEN; polling only");
            None
        }
    }
}

/// Resolves at the next commit notification (or when the listener's
/// connection drops: rows committed meanwhile are found by the next read);
/// never, without a listener.
async fn next_commit(listener: &mut Option<PgListener>) {
    match listener {
        Some(l) => {
            if l.try_recv().await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        None => std::future::pending().await,
    }
}

impl PgOutbox {
    pub(super) fn leader_timeout(&self) -> Duration {
        Duration::from_millis(self.inner.config.leader_timeout_ms)
    }

    fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.inner.config.poll_interval_ms)
    }

    /// Deletes published rows older than the retention, a bounded batch at
    /// a time, through the published rows' index.
    async fn sweep(&self) -> Result<(), Error> {
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
