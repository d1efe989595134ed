//! The relay: who publishes an outbox, and the one loop that does.
//!
//! An outbox with one publisher (the in-memory one: each process publishes
//! its own records) runs the loop as that publisher. An outbox shared by
//! several processes (a PostgreSQL table written by every replica) offers
//! an [`Election`] ([`OutboxStore::election`]): every process runs the
//! relay, one at a time leads, under a fencing epoch that grows with every
//! term, and the others stand by. The election is its own piece: the store
//! says how a term is won and held (an advisory lock on a session, say),
//! the loop is the same for every store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::OutboxProcessor;
use super::OutboxStore;
use crate::backoff::{Backoff, sleep_or_stop};
use crate::broker::Producer;
use crate::error::{Error, chain};
use crate::future::BoxFuture;
use crate::tracing;

/// How often a relay exports the outbox's statistics and runs the store's
/// housekeeping (reading the statistics is not free: a count of the
/// backlog).
pub(crate) const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(5);

/// How soon a busy publisher reads again after a read that found nothing.
const BUSY_POLL: Duration = Duration::from_millis(1);
/// Reads in a row that find nothing before a busy publisher goes idle.
const IDLE_AFTER: u32 = 3;
/// The longest a settling publisher waits between reads (it starts at
/// [`BUSY_POLL`] and doubles): a writer transaction left open for long
/// keeps it settling, and a commit that skipped its notification waits at
/// most this long.
const SETTLE_MAX: Duration = Duration::from_millis(32);
/// How often a busy publisher keeps the store's busy mark during a long
/// read (see [`OutboxStore::publisher_busy`]; a call that finds the mark
/// recently kept costs nothing, and the store's own limit may be as short
/// as 100 ms).
const KEEP_BUSY_EVERY: Duration = Duration::from_millis(20);

/// Where the publisher stands with the store's writers (see
/// [`OutboxStore::publisher_busy`]): busy, it reads again every
/// millisecond and commits may skip their notification; idle, it waits for
/// one (or the poll interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pace {
    /// Waiting for notifications: every commit notifies.
    Idle,
    /// Reading every millisecond; the last `empty` reads found nothing.
    Busy { empty: u32 },
    /// Going idle: commits notify again, but one that skipped its
    /// notification may still be under way (this publisher's, or its
    /// predecessor's: every term starts here). Asked `tries` times so far.
    Settling { tries: u32 },
    /// Every commit that skipped its notification is over: one more read
    /// finds all of them.
    LastLook,
}

impl Pace {
    /// Where a term starts: whoever published before may have left
    /// commits that skipped their notification.
    const START: Pace = Pace::Settling { tries: 0 };

    /// After a drain that published `published` records (its last read
    /// found nothing, or, busy, less than a batch): the next pace, and how
    /// long to wait before reading again.
    /// Idle is reached from busy only through settling and a last look, so
    /// a commit that skipped its notification is never left to the poll.
    async fn next(self, published: usize, store: &dyn OutboxStore) -> (Pace, Duration) {
        let settle = |tries: u32| async move {
            if store.publisher_idle().await {
                (Pace::LastLook, Duration::ZERO)
            } else {
                let wait = BUSY_POLL.saturating_mul(1 << tries.min(16)).min(SETTLE_MAX);
                (Pace::Settling { tries: tries + 1 }, wait)
            }
        };
        // Commits may have skipped their notification since the last
        // settling.
        let skipped = matches!(self, Pace::Busy { .. } | Pace::Settling { .. });
        let busy = |empty| async move {
            if store.publisher_busy().await {
                (Pace::Busy { empty }, BUSY_POLL)
            } else if skipped {
                settle(0).await
            } else {
                (Pace::Idle, store.poll_interval())
            }
        };
        match self {
            Pace::Busy { empty } => {
                let empty = if published > 0 { 0 } else { empty + 1 };
                if empty < IDLE_AFTER {
                    busy(empty).await
                } else {
                    settle(0).await
                }
            }
            // Records keep coming: busy again rather than wait for a
            // moment with no commit under way.
            Pace::Settling { .. } | Pace::Idle | Pace::LastLook if published > 0 => busy(0).await,
            Pace::Settling { tries } => settle(tries).await,
            Pace::Idle | Pace::LastLook => (Pace::Idle, store.poll_interval()),
        }
    }
}

/// Runs `drain`; while the publisher is busy, keeps the store's busy mark
/// alive meanwhile (a long read must not let it lapse: commits would
/// notify again, and PostgreSQL would end the relay's idle session). Once
/// the mark is lost it is not taken again before the read ends: a relay
/// that stalled may have been replaced meanwhile, and its successor may
/// already wait for notifications.
async fn keeping_busy<T>(
    pace: Pace,
    store: &dyn OutboxStore,
    drain: impl std::future::Future<Output = T>,
) -> T {
    if !matches!(pace, Pace::Busy { .. }) {
        return drain.await;
    }
    tokio::pin!(drain);
    loop {
        tokio::select! {
            out = &mut drain => return out,
            _ = tokio::time::sleep(KEEP_BUSY_EVERY) => {
                if !store.publisher_busy().await {
                    return drain.await;
                }
            }
        }
    }
}

/// How one publisher among several processes is chosen for an outbox they
/// share.
///
/// The engine runs the outbox's relay. An outbox with one publisher (the
/// in-memory one: each process publishes its own records) has no election,
/// and the relay publishes as that publisher, with epoch 0. An outbox
/// shared by several processes (`PgOutbox`: a table every replica writes)
/// returns an election from [`OutboxStore::election`]: every process runs
/// the relay, one at a time wins a [`Term`] and publishes under its
/// fencing epoch (the broker then refuses every older epoch's batches), and
/// the others stand by. The store says how a term is won and held (an
/// advisory lock on a session kept alive, for `PgOutbox`); the publishing
/// loop is the runtime's, the same for every store.
pub trait Election: Send + Sync {
    /// Readies the shared outbox (its tables, say) and returns the producer
    /// name every leader publishes under (so the broker drops a record a
    /// predecessor already published).
    fn prepare(&self) -> BoxFuture<'_, Result<String, Error>>;

    /// One attempt to lead, with an epoch above `newest_seen` (the newest
    /// epoch this process has seen, from a broker refusing a replaced
    /// publisher); `None` while another process leads.
    fn campaign(&self, newest_seen: u64) -> BoxFuture<'_, Result<Option<Term>, Error>>;

    /// How long a standby waits before its next attempt.
    fn standby(&self) -> Duration;
}

/// A leadership held: its fencing epoch, and a task that holds it (a
/// session kept alive, say) until the term is resigned, or ends by itself
/// when the leadership is lost.
#[derive(Debug)]
pub struct Term {
    epoch: u64,
    lost: CancellationToken,
    resign: CancellationToken,
    holder: tokio::task::JoinHandle<()>,
}

impl Term {
    /// A term of `epoch`, held by `hold(lost, resign)`: a future that keeps
    /// the leadership until `resign` fires (then gives it up before it
    /// returns) and cancels `lost` if it loses the leadership first.
    pub fn new<F>(epoch: u64, hold: impl FnOnce(CancellationToken, CancellationToken) -> F) -> Term
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let lost = CancellationToken::new();
        let resign = CancellationToken::new();
        let holder = tokio::spawn(hold(lost.clone(), resign.clone()));
        Term {
            epoch: epoch.max(1),
            lost,
            resign,
            holder,
        }
    }

    /// The term's fencing epoch (1 or more).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Gives the leadership up, and waits until it is.
    async fn resign(self) {
        self.resign.cancel();
        let _ = self.holder.await;
    }
}

/// Runs the relay of `store` until `shutdown` fires: as its single
/// publisher, or, for a store with an [`Election`], as a candidate that
/// publishes while it leads.
pub(crate) async fn run(processor: Arc<OutboxProcessor>, shutdown: CancellationToken) {
    let Some(election) = processor.store().election() else {
        publish(&processor, &processor.single(), None, &shutdown).await;
        return;
    };
    let mut backoff = Backoff::reconnect();
    let name = loop {
        match election.prepare().await {
            Ok(name) => break name,
            Err(e) => tracing::warn!(error = %chain(&e), "outbox relay cannot start"),
        }
        if !backoff.wait_or_stop(&shutdown).await {
            return;
        }
    };
    let mut newest_seen = 0;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        match election.campaign(newest_seen).await {
            Ok(Some(term)) => {
                backoff.reset();
                let producer = Producer {
                    name: name.clone(),
                    epoch: term.epoch(),
                };
                tracing::info!(
                    producer = %producer.name,
                    epoch = producer.epoch,
                    "outbox relay: this instance publishes"
                );
                let newer = publish(&processor, &producer, Some(&term.lost), &shutdown);
                newest_seen = newest_seen.max(newer.await);
                term.resign().await;
            }
            Ok(None) => {
                // `sleep_or_stop` is true when `shutdown` fired: a standby
                // keeps trying until then.
                if sleep_or_stop(election.standby(), &shutdown).await {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(error = %chain(&e), "outbox relay cannot reach its election; records stay pending");
                if !backoff.wait_or_stop(&shutdown).await {
                    return;
                }
            }
        }
    }
}

/// Publishes as `producer` until `shutdown` fires (then what is pending,
/// once more, unless the leadership was lost), the term is `lost`, or the
/// broker reports a newer publisher; returns the newest epoch seen.
///
/// Woken by commits in this process and, while it runs, by the store's
/// commit notifications ([`OutboxStore::watch_commits`]); otherwise every
/// [`OutboxStore::poll_interval`], or sooner, with back-off, after a failed
/// publish. While records keep coming it reads every millisecond, and a
/// store that can tell its writers so lets commits skip their notification
/// meanwhile ([`OutboxStore::publisher_busy`], [`Pace`]).
pub(crate) async fn publish(
    processor: &OutboxProcessor,
    producer: &Producer,
    lost: Option<&CancellationToken>,
    shutdown: &CancellationToken,
) -> u64 {
    let store = processor.store();
    let never = CancellationToken::new();
    let lost = lost.unwrap_or(&never);
    let watch_stop = CancellationToken::new();
    let watcher = store
        .watch_commits(processor.wake().clone(), watch_stop.clone())
        .map(tokio::spawn);
    let mut newest = producer.epoch;
    let mut backoff = Backoff::reconnect();
    let mut housekeeping: Option<Instant> = None;
    let mut pace = Pace::START;
    loop {
        if housekeeping.is_none_or(|at| at.elapsed() >= HOUSEKEEPING_EVERY) {
            housekeeping = Some(Instant::now());
            if let Err(e) = processor.export_stats().await {
                tracing::debug!(error = %chain(&e), "outbox statistics unavailable");
            }
            if let Err(e) = store.housekeeping().await {
                tracing::warn!(error = %chain(&e), "outbox housekeeping failed");
            }
        }
        let notified = processor.wake().notified();
        // Busy, it reads again within a millisecond: a read that took
        // everything ends the drain, and the next takes what commits
        // meanwhile as one batch. Otherwise nothing may wake it soon (a
        // store whose commits do not notify), so it drains until a read
        // finds nothing.
        let busy = matches!(pace, Pace::Busy { .. });
        let drain = processor.drain_with(producer, busy);
        let drained = keeping_busy(pace, store.as_ref(), drain).await;
        let wait = match drained {
            Ok(published) => {
                backoff.reset();
                let (next, wait) = pace.next(published, store.as_ref()).await;
                pace = next;
                // Going to wait: a last look at what the broker counts
                // (not on every read of a busy publisher).
                if published == 0 && pace == Pace::Idle {
                    processor.recheck_published().await;
                }
                wait
            }
            Err(Error::PublisherReplaced { newer, .. }) => {
                tracing::warn!(
                    epoch = producer.epoch,
                    newer,
                    "outbox relay: another replica publishes now; standing by"
                );
                newest = newest.max(newer);
                break;
            }
            Err(e) => {
                tracing::warn!(error = %chain(&e), "outbox publish failed; records stay pending");
                // Backing off: commits notify again, so one wakes it.
                if matches!(pace, Pace::Busy { .. }) {
                    store.publisher_idle().await;
                    pace = Pace::START;
                }
                backoff.next_delay()
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => {
                if !lost.is_cancelled() {
                    processor.final_drain(producer).await;
                }
                break;
            }
            _ = lost.cancelled() => {
                tracing::warn!(
                    epoch = producer.epoch,
                    "outbox relay: leadership lost; standing by"
                );
                break;
            }
            _ = notified => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
    if pace != Pace::Idle {
        // Commits notify again (whoever publishes next waits for them).
        store.publisher_idle().await;
    }
    store.publisher_stopped().await;
    watch_stop.cancel();
    if let Some(w) = watcher {
        let _ = w.await;
    }
    newest
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
