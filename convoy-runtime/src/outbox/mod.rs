//! The outbox: raised events wait here, with their validated partition key,
//! until the processor publishes them in order.

mod memory;
mod processor;

pub use memory::MemoryOutbox;
pub use processor::OutboxProcessor;

use crate::envelope::Envelope;
use crate::error::Error;
use crate::handler::BoxFuture;

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
    pub envelope: Envelope,
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

/// Storage for outbox records. [`MemoryOutbox`] keeps them in memory; a
/// durable store (a database table written in the caller's transaction)
/// implements the same trait.
pub trait OutboxStore: Send + Sync + 'static {
    /// Appends records atomically: all or none.
    fn append(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), Error>>;

    /// Up to `limit` pending records, in sequence order.
    fn pending(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>>;

    /// Marks records published.
    fn mark_published<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<(), Error>>;

    /// Marks a record abandoned; it is never retried.
    fn mark_abandoned(&self, seq: u64, reason: String) -> BoxFuture<'_, Result<(), Error>>;

    /// Counts a failed publish attempt of a record.
    fn record_failure(&self, seq: u64) -> BoxFuture<'_, Result<(), Error>>;

    /// Every record still kept (for inspection and tests).
    fn records(&self) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>>;

    /// The identity under which this store's sequence numbers are unique.
    ///
    /// The broker drops a re-sent batch by the highest sequence number it
    /// has published for a producer, which is the engine's instance id plus
    /// this identity. A store whose sequence numbers start again (one in
    /// memory, after a restart) must never reuse an identity, or a restarted
    /// process under the same instance id would have its first records
    /// dropped as "already published". The default is new for every
    /// process, which is safe for a store whose numbering does not start
    /// again within a process (after a crash, a re-sent batch of a store
    /// that outlives its process may then be published twice); a store
    /// whose numbering can start again within a process returns an identity
    /// of its own (as [`MemoryOutbox`] does); a durable store whose sequence
    /// numbers never repeat returns a stable identity, so re-sends after a
    /// crash are dropped.
    fn producer_identity(&self) -> &str {
        &DEFAULT_IDENTITY
    }
}

/// The default [`OutboxStore::producer_identity`]: one per process, so the
/// sequence numbers of two processes never share a high-water mark.
static DEFAULT_IDENTITY: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| uuid::Uuid::new_v4().simple().to_string());
