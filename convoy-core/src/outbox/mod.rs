//! The outbox: raised events wait here, with their validated partition key,
//! until the processor publishes them in order.
//!
//! [`MemoryOutbox`] keeps records in process memory: what a process had not
//! published when it died is lost. With the `postgres` feature, `PgOutbox`
//! keeps them in a table written in the caller's own transaction, so the
//! state change and its events commit or roll back together, and a relay
//! elected among the replicas publishes them in commit order per key (see
//! the `postgres` module). Another store implements [`OutboxStore`] and is
//! passed to `Domain::builder().outbox(..)`.

mod memory;
#[doc(hidden)]
pub mod processor;
pub(crate) mod relay;

pub use memory::MemoryOutbox;
pub use processor::OutboxProcessor;
pub use relay::{Election, Term};

use std::sync::Arc;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::envelope::Envelope;
use crate::error::Error;
use crate::future::BoxFuture;
pub use crate::handler::TransactionalOutbox;

/// Where an outbox record stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutboxStatus {
    /// Waiting to be published.
    Pending,
    /// Written to the broker.
    Published,
    /// Never to be published; the reason says why.
    Abandoned {
        /// Why it was abandoned.
        reason: String,
    },
}

/// One raised event in the outbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// Position in the outbox; records publish in this order.
    pub seq: u64,
    /// The event; `envelope.partition_key` is the record's partition key.
    /// Shared, so a store that keeps its records in memory hands them to
    /// the processor without copying them.
    pub envelope: Arc<Envelope>,
    /// Where it stands.
    pub status: OutboxStatus,
    /// Failed publish attempts so far.
    pub attempts: u32,
}

impl OutboxRecord {
    /// The record's partition key.
    pub fn partition_key(&self) -> Option<&str> {
        self.envelope.partition_key.as_deref()
    }
}

/// What an outbox holds now, for operators and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Records waiting to be published.
    pub pending: u64,
    /// When the oldest pending record was raised (ms since the Unix epoch).
    pub oldest_pending_ms: Option<u64>,
    /// Records abandoned, waiting for an operator.
    pub abandoned: u64,
}

/// Storage for outbox records. [`MemoryOutbox`] keeps them in memory;
/// `PgOutbox` (feature `postgres`) in a PostgreSQL table written in the
/// caller's transaction.
pub trait OutboxStore: Send + Sync + 'static {
    /// Appends records atomically: all or none.
    fn append(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), Error>>;

    /// Up to `limit` pending records, the oldest first: every pending
    /// record of a partition key comes after the ones of that key that
    /// committed before it, and nothing pending is below the first. Fewer
    /// than `limit` means nothing else was pending (a busy relay then
    /// reads again a millisecond later, not at once).
    fn pending(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>>;
    /// [`OutboxStore::pending`], leaving out the records `in_flight` (their
    /// seqs, sorted: a batch the processor is still publishing). The
    /// default reads that many more and drops them; a store that can skip
    /// them in its read overrides it.
    fn pending_excluding<'a>(
        &'a self,
        limit: usize,
        in_flight: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<OutboxRecord>, Error>> {
        Box::pin(async move {
            let mut records = self.pending(limit + in_flight.len()).await?;
            records.retain(|r| in_flight.binary_search(&r.seq).is_err());
            records.truncate(limit);
            Ok(records)
        })
    }

    /// Marks records published.
    fn mark_published<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<(), Error>>;

    /// Marks a record abandoned; it is never retried unless an operator
    /// asks ([`OutboxStore::retry`]).
    fn mark_abandoned(&self, seq: u64, reason: String) -> BoxFuture<'_, Result<(), Error>>;

    /// Counts a failed publish attempt of a record.
    fn record_failure(&self, seq: u64) -> BoxFuture<'_, Result<(), Error>>;

    /// Every record still kept (for inspection and tests).
    fn records(&self) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>>;

    /// Backlog, oldest pending record and abandoned count.
    fn stats(&self) -> BoxFuture<'_, Result<OutboxStats, Error>>;

    /// Up to `limit` abandoned records, the oldest first, with their reasons.
    fn abandoned(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>>;

    /// Makes an abandoned record pending again (an operator's retry);
    /// returns whether there was such a record. It then publishes after the
    /// records of its key that were published while it was abandoned, with
    /// its own (older) seq: a handler using `AppliedEvents`, which orders a
    /// key's events by seq, takes it as applied if later records of the key
    /// were applied meanwhile. Raise the event again instead where that
    /// matters (an abandoned record's key was invalid when it was
    /// published, so this needs a configuration change first).
    fn retry(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>>;

    /// Deletes an abandoned record (an operator's discard); returns whether
    /// there was such a record.
    fn discard(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>>;

    /// The record `seq` if the store still keeps it, whatever its status
    /// (what an operator looks at before a retry or discard). The default
    /// searches [`OutboxStore::records`]; a store with an index by
    /// sequence number overrides it.
    fn record(&self, seq: u64) -> BoxFuture<'_, Result<Option<OutboxRecord>, Error>> {
        Box::pin(async move { Ok(self.records().await?.into_iter().find(|r| r.seq == seq)) })
    }

    /// The producer name under which the broker recognises a re-sent
    /// record of this store, for an engine whose instance id is
    /// `instance_id`.
    ///
    /// The broker drops a record it already published by its sequence
    /// number within this name, so the name must change whenever the
    /// numbering could start again: a restarted process that reuses its
    /// instance id must never have records dropped as "already published".
    /// The default is the instance id plus an id new in every process,
    /// right for a store whose numbering does not outlive its process (as
    /// [`MemoryOutbox`]'s). A durable store shared by replicas returns one
    /// name for all of them (its sequence numbers never repeat), so a
    /// record re-sent by another replica after a crash is dropped too.
    fn producer(&self, instance_id: &str) -> String {
        format!("{instance_id}/{}", *PROCESS_IDENTITY)
    }

    /// This store as one that writes records in the caller's own
    /// transaction (`commit_in`), if it can; the default cannot.
    fn transactional(self: Arc<Self>) -> Option<Arc<dyn TransactionalOutbox>> {
        None
    }

    /// How the publisher of an outbox shared by several processes is
    /// chosen (see [`Election`]). Default: none; every process publishes the
    /// records it committed itself (the in-memory outbox).
    fn election(&self) -> Option<Arc<dyn Election>> {
        None
    }

    /// Periodic upkeep while this process publishes the outbox (a
    /// retention sweep of published rows, say), every few seconds. Default:
    /// none.
    fn housekeeping(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }

    /// A task that calls `wake.notify_one()` for every record committed by
    /// any process (a notification channel of the store), until `stop`
    /// fires; run while this process publishes. Default: none (commits in
    /// this process wake the publisher by themselves; others are found by
    /// polling).
    fn watch_commits(
        &self,
        wake: Arc<Notify>,
        stop: CancellationToken,
    ) -> Option<BoxFuture<'static, ()>> {
        let _ = (wake, stop);
        None
    }

    /// How often the publisher looks for records when nothing woke it.
    /// Default: every second.
    fn poll_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs(1)
    }

    /// The publisher is busy: it reads again within a few milliseconds for
    /// as long as it finds records, so commits may skip their notification
    /// from now on (a notification can cost a shared store throughput:
    /// PostgreSQL commits notifying transactions one at a time). Returns
    /// whether the store told its writers so; called again while busy, it
    /// keeps that true (or returns false once it cannot). Default: false,
    /// every commit notifies.
    fn publisher_busy(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { false })
    }

    /// The publisher found nothing for a while and is about to wait for a
    /// notification (or has just started publishing: its predecessor may
    /// have been busy): commits notify again from now on. Returns true
    /// once no commit may skip its notification any more and every commit
    /// that skipped one is over (committed or rolled back), so one more
    /// read finds all of them; false while one may still be under way (the
    /// publisher reads again soon and asks again). Default: true.
    fn publisher_idle(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }

    /// The publisher stopped publishing (shut down, or another replica
    /// leads now): what it held for [`publisher_busy`](Self::publisher_busy)
    /// can go (a connection of its own, say). Default: nothing.
    fn publisher_stopped(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The default [`OutboxStore::producer`] suffix: one per process, so the
/// sequence numbers of two processes never share a producer name.
static PROCESS_IDENTITY: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());

/// Where raised events go when committed: the domain's store, and the
/// wake-up of its processor. Shared by the unit of work, command dispatch
/// and the consumers (for the events their handlers raise).
#[derive(Clone)]
#[doc(hidden)]
pub struct OutboxHandle {
    store: Arc<dyn OutboxStore>,
    /// The store, if it writes in the caller's transaction.
    transactional: Option<Arc<dyn TransactionalOutbox>>,
    wake: Arc<Notify>,
}

impl std::fmt::Debug for OutboxHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxHandle").finish_non_exhaustive()
    }
}

impl OutboxHandle {
    /// A handle on `store`.
    #[doc(hidden)]
    pub fn new(store: Arc<dyn OutboxStore>) -> Self {
        OutboxHandle {
            transactional: store.clone().transactional(),
            store,
            wake: Arc::new(Notify::new()),
        }
    }

    /// The store.
    #[doc(hidden)]
    pub fn store(&self) -> &Arc<dyn OutboxStore> {
        &self.store
    }

    /// The store, if it writes in the caller's transaction.
    #[doc(hidden)]
    pub fn transactional(&self) -> Option<Arc<dyn TransactionalOutbox>> {
        self.transactional.clone()
    }

    /// What wakes the processor.
    #[doc(hidden)]
    pub fn wake(&self) -> &Arc<Notify> {
        &self.wake
    }

    /// Appends the envelopes, all or none, and wakes the processor.
    #[doc(hidden)]
    pub async fn append(&self, envelopes: Vec<Envelope>) -> Result<(), Error> {
        if envelopes.is_empty() {
            return Ok(());
        }
        self.store.append(envelopes).await?;
        self.wake.notify_one();
        Ok(())
    }
}
