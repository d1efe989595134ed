//! Brokers: where the outbox publishes and from which handlers consume.
//!
//! - [`InlineBroker`]: in-process, strict submission order, no services;
//!   it advertises [`Capabilities::SERIAL_DELIVERY`], so `sequential_by` is
//!   an accepted no-op there.
//! - `RedisBroker` (in [`crate::redis`]): Redis Streams with partition
//!   streams, leases and fences; it advertises
//!   [`Capabilities::STREAM_PARTITIONING`].
//!
//! # Writing a broker
//!
//! Implement [`Broker`]: [`publish`](Broker::publish) receives batches of
//! already routed [`Publication`]s from the outbox processor, in order, and
//! [`run`](Broker::run) consumes for every [`Subscription`] of the
//! [`ConsumerPlan`] it is given, calling [`ConsumerPlan::invoke`] for each
//! event (which runs the handler, records metrics and commits the events
//! the handler raised). A broker never sees the domain, the engine or a
//! unit of work.

mod inline;
mod plan;

pub use inline::{DeadLetter, InlineBroker};
pub(crate) use plan::HealthState;
pub use plan::{ConsumerPlan, Subscription};

use std::any::Any;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::envelope::Envelope;
use crate::error::Error;
use crate::future::BoxFuture;

/// What a broker can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities(u32);

impl Capabilities {
    /// Nothing beyond plain publish/subscribe.
    pub const NONE: Capabilities = Capabilities(0);
    /// The broker routes each partitioned event to its own partition stream
    /// and consumes each partition under an ownership lease.
    pub const STREAM_PARTITIONING: Capabilities = Capabilities(1);
    /// The broker delivers one event at a time, in submission order, to
    /// every handler of the domain: no two events are ever handled at once,
    /// so `sequential_by` holds without partitions (the inline broker).
    pub const SERIAL_DELIVERY: Capabilities = Capabilities(2);

    /// Whether every capability in `other` is present.
    pub const fn contains(self, other: Capabilities) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets together.
    pub const fn union(self, other: Capabilities) -> Capabilities {
        Capabilities(self.0 | other.0)
    }
}

/// One event to publish, already routed.
#[derive(Debug, Clone)]
pub struct Publication {
    /// The outbox sequence number (increasing per producer).
    pub seq: u64,
    /// The stream to append to.
    pub stream: String,
    /// The applied partition key, to add to the category's index.
    pub partition: Option<String>,
    /// The event.
    pub envelope: Envelope,
}

/// Who publishes a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Producer {
    /// The name under which the broker recognises a re-sent publication
    /// (the same outbox record sent again after a lost reply or a crash).
    /// Unique per outbox whose sequence numbers never repeat: one process's
    /// memory outbox, or one PostgreSQL outbox table shared by replicas.
    pub name: String,
    /// The publisher's fencing epoch: it grows every time another process
    /// takes over publishing for `name`. A broker refuses a batch whose
    /// epoch is below the newest it has seen, so a replaced publisher that
    /// was stalled cannot publish after its successor. `0` for an outbox
    /// with a single publisher.
    pub epoch: u64,
}

/// A failed publish: how many publications of the batch went out, in order,
/// before `error`.
#[derive(Debug)]
pub struct PublishError {
    /// Publications that were written.
    pub published: usize,
    /// What stopped the rest.
    pub error: Error,
}

/// A message broker.
pub trait Broker: Any + Send + Sync + 'static {
    /// A short name for messages (`inline`, `redis`).
    fn name(&self) -> &str;

    /// What the broker can do.
    fn capabilities(&self) -> Capabilities;

    /// Where process-manager instances live with this broker (`None`: in
    /// memory).
    fn state_store(&self) -> Option<Arc<dyn crate::process_manager::StateStore>> {
        None
    }

    /// How the broker is shown in logs (the Redis broker: its URL with the
    /// password hidden). Default: [`Broker::name`].
    fn describe(&self) -> String {
        self.name().to_owned()
    }

    /// Checks that the broker can be reached now (for
    /// `EngineHandle::health`). Default: always reachable (an in-process
    /// broker).
    fn ping(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }

    /// Takes over publishing for `producer.name` at `producer.epoch`
    /// everywhere the broker would check it (the Redis broker: every shard)
    /// *before* the new publisher reads a single pending record, so from
    /// then on a replaced publisher's batches are refused by the epoch, not
    /// by timing: a row the predecessor had read but not yet published can
    /// never be published by both. Fails with
    /// [`Error::PublisherReplaced`] when a newer epoch already took over.
    /// Default: nothing to do (an in-process broker has one publisher).
    fn take_over<'a>(&'a self, producer: &'a Producer) -> BoxFuture<'a, Result<(), Error>> {
        let _ = producer;
        Box::pin(async { Ok(()) })
    }

    /// Publishes a batch in order. `producer` identifies the outbox so a
    /// broker can drop a re-sent publication it already wrote (by its
    /// `seq`), and fences a replaced publisher by its epoch. A batch starts
    /// at the producer's oldest pending record: every seq below its first
    /// was settled and is never sent again.
    fn publish<'a>(
        &'a self,
        producer: &'a Producer,
        batch: &'a [Publication],
    ) -> BoxFuture<'a, Result<(), PublishError>>;

    /// Consumes for every subscription of `plan` until `shutdown` fires, then
    /// finishes the events in flight and returns.
    fn run(
        self: Arc<Self>,
        plan: Arc<ConsumerPlan>,
        shutdown: CancellationToken,
    ) -> BoxFuture<'static, Result<(), Error>>;
}
