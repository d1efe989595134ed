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
}
