//! Brokers: where the outbox publishes and from which handlers consume.
//!
//! - [`InlineBroker`]: in-process, strict submission order, no services;
//!   it advertises [`Capabilities::SERIAL_DELIVERY`], so `sequential_by` is
//!   an accepted no-op there.
//! - `RedisBroker` (in `convoy_runtime::redis`): Redis Streams with partition
//!   streams, leases and fences; it advertises
//!   [`Capabilities::STREAM_PARTITIONING`].
//!
//! # Writing a broker
//!
//! Implement [`Broker`]: [`configure`](Broker::configure) receives the
//! domain's configuration once (a broker with physical names of its own,
//! such as shards, takes them from it), [`publish`](Broker::publish)
//! receives batches of [`Publication`]s from the outbox processor, in
//! order, to route and write, and
//! [`run`](Broker::run) consumes for every [`Subscription`] of the
//! [`ConsumerPlan`] it is given, calling [`ConsumerPlan::invoke`] for each
//! event (which runs the handler, records metrics and commits the events
//! the handler raised). A broker never sees the domain, the engine or a
//! unit of work.

mod inline;
#[doc(hidden)]
pub mod outage;
mod plan;

pub use inline::{DeadLetter, InlineBroker};
#[doc(hidden)]
pub use plan::HealthState;
pub use plan::{Attempt, ConsumerPlan, Subscription};

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::envelope::{Envelope, Origin};
use crate::error::Error;
use crate::future::BoxFuture;
use crate::raise::RaisedKey;
use crate::tracing;

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

/// One event to publish. The broker routes it: the envelope's category,
/// partition key and priority say where it goes, and the physical names
/// (shards, streams) are the broker's own. It goes out with its
/// [`origin`](Publication::origin), the producer's record `seq`, whatever
/// the envelope's own `origin` field holds.
#[derive(Debug, Clone)]
pub struct Publication {
    /// The outbox sequence number (increasing per producer).
    pub seq: u64,
    /// The event as raised (its key, when it has one, already checked
    /// against the key rules), shared with the outbox record it was read
    /// from rather than copied.
    pub envelope: Arc<Envelope>,
}

impl Publication {
    /// Where the event comes from: `producer`'s record [`seq`](Self::seq).
    pub fn origin(&self, producer: &Producer) -> Origin {
        Origin {
            producer: producer.name.clone(),
            seq: self.seq,
        }
    }

    /// The envelope as a consumer reads it back: with its
    /// [`origin`](Self::origin).
    pub fn delivered(&self, producer: &Producer) -> Envelope {
        Envelope {
            origin: Some(self.origin(producer)),
            ..Envelope::clone(&self.envelope)
        }
    }
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

/// How this process uses a category's partition key, as checked against
/// what the broker records for the category ([`Broker::check_category`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyUse<'a> {
    /// Partitioned by this field (declared on the aggregate or by a
    /// handler's `sequential_by`): recorded if nothing is, else compared.
    Field(&'a str),
    /// Without a key, for messages with these fields: refused when the
    /// recorded key field is among them (such a message belongs in a
    /// partition stream; one without the field legitimately lives in the
    /// category's own stream).
    Unkeyed(&'a [&'a str]),
}

impl KeyUse<'_> {
    /// How this use differs from `recorded` (the field a broker recorded,
    /// if any), as text for an error; `None` when they agree.
    pub fn mismatch(self, recorded: Option<&str>) -> Option<String> {
        match (self, recorded) {
            (KeyUse::Field(f), Some(r)) if f != r => Some(format!("by `{f}`")),
            (KeyUse::Unkeyed(fields), Some(r)) if fields.contains(&r) => Some(format!(
                "without a key, for events that carry the field `{r}`"
            )),
            _ => None,
        }
    }
}

/// The check of raised events' categories against what the broker records
/// ([`Broker::check_category`]), made before a commit. Cheap to clone: one
/// per domain, shared by its units of work.
#[derive(Clone)]
#[doc(hidden)]
pub struct RaisedCheck {
    broker: Arc<dyn Broker>,
    /// When the broker last could not answer (ms since the Unix epoch; 0:
    /// never).
    failed_at: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for RaisedCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaisedCheck").finish_non_exhaustive()
    }
}

impl RaisedCheck {
    /// The check against `broker`.
    #[doc(hidden)]
    pub fn new(broker: Arc<dyn Broker>) -> Self {
        RaisedCheck {
            broker,
            failed_at: Arc::default(),
        }
    }

    /// Checks each `(category, key field or none, message fields)` of
    /// raised events, once each. A mismatch fails; a broker that cannot
    /// answer within [`RAISED_CHECK`] in all does not (the relay checks
    /// again before it publishes), and then commits skip the check for
    /// [`RAISED_CHECK_PAUSE`], so raising and committing never wait long
    /// on a broker that is down.
    #[doc(hidden)]
    pub async fn check(&self, raised: Vec<RaisedKey>) -> Result<(), Error> {
        use std::sync::atomic::Ordering;
        let since = self.failed_at.load(Ordering::Relaxed);
        let pause = RAISED_CHECK_PAUSE.as_millis() as u64;
        if since != 0 && crate::envelope::now_ms().saturating_sub(since) < pause {
            return Ok(());
        }
        let checks = async {
            for (category, field, fields) in raised {
                let used = field.map_or(KeyUse::Unkeyed(fields), KeyUse::Field);
                self.broker.check_category(category, used).await?;
            }
            Ok::<(), Error>(())
        };
        let failed = match tokio::time::timeout(RAISED_CHECK, checks).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e @ Error::KeyFieldMismatch { .. })) => return Err(e),
            Ok(Err(e)) => crate::error::chain(&e),
            Err(_) => format!("no answer within {RAISED_CHECK:?}"),
        };
        self.failed_at
            .store(crate::envelope::now_ms(), Ordering::Relaxed);
        tracing::debug!(error = %failed, "partition keys not checked at commit; the relay checks them before publishing");
        Ok(())
    }
}

/// How long commits skip the check after the broker could not answer.
const RAISED_CHECK_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a commit waits, in all, for the broker's answers about its
/// categories' keys.
const RAISED_CHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// A failed publish: how many publications of the batch went out, in order,
/// before `error`, and which later ones went out too.
#[derive(Debug)]
pub struct PublishError {
    /// Publications that were written: the batch's first `published`.
    pub published: usize,
    /// The seqs of later publications that were written too: a broker that
    /// writes parts of a batch independently (the Redis broker, shard by
    /// shard) names the parts that went out, so only the failed part is
    /// sent again and one shard's failover holds up no other. A key's
    /// publications are always in one part, so their order is kept.
    pub also_written: Vec<u64>,
    /// What stopped the rest.
    pub error: Error,
}

impl PublishError {
    /// Nothing of the batch was written.
    pub fn nothing(error: Error) -> Self {
        PublishError {
            published: 0,
            also_written: Vec::new(),
            error,
        }
    }
}

/// A message broker.
pub trait Broker: Send + Sync + 'static {
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

    /// Binds the broker to the domain's configuration; `Domain::init` calls
    /// it once, before anything is published or consumed, whether the
    /// broker was named in the configuration or given to the builder. A
    /// broker that routes by the configuration (the Redis broker: shard
    /// counts and priority lanes) keeps what it needs; one already bound to
    /// a different configuration returns [`Error::Config`]. Default: nothing
    /// to keep.
    fn configure(&self, config: &Config) -> Result<(), Error> {
        let _ = config;
        Ok(())
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

    /// Checks, once per category and process, that this process uses
    /// `category`'s partition key as every other process does (the Redis
    /// broker records the field the first time and compares after), so a
    /// writer that would publish a partitioned category unkeyed or by
    /// another field is refused with [`Error::KeyFieldMismatch`] before
    /// anything is published. Default: nothing to check (an in-process
    /// broker has one process).
    fn check_category<'a>(
        &'a self,
        category: &'a str,
        key: KeyUse<'a>,
    ) -> BoxFuture<'a, Result<(), Error>> {
        let _ = (category, key);
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

    /// Whether the outbox processor may hand this broker a batch while the
    /// producer's previous one is still in flight
    /// ([`Broker::publish_behind`]), overlapping one batch's round trip
    /// with the next one's preparation. Default: no.
    fn pipelines_publishes(&self) -> bool {
        false
    }

    /// [`Broker::publish`] of a batch handed over while the producer's
    /// previous batches may still be in flight: `floor` is the producer's
    /// oldest record not settled yet (theirs included), below which every
    /// seq was settled. A broker that says it pipelines
    /// ([`Broker::pipelines_publishes`]) writes nothing of this batch where
    /// an earlier batch still in flight did not run first (it fails there
    /// with [`Error::PublishedOutOfTurn`]), so no record goes out ahead of
    /// an earlier one of its key. Default: [`Broker::publish`], which
    /// takes the batch's first record for the floor: a broker (or a
    /// wrapper of one) that says it pipelines must implement this one,
    /// honouring `floor`, or a batch in flight could be published twice.
    fn publish_behind<'a>(
        &'a self,
        producer: &'a Producer,
        batch: &'a [Publication],
        floor: u64,
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        let _ = floor;
        self.publish(producer, batch)
    }

    /// Called by an outbox processor while it has nothing to publish (about
    /// once a second): a broker that replicates asynchronously looks again
    /// at what it published last and reports what a failover lost since,
    /// which the next publish would otherwise tell only if there is one.
    /// Never fails: what it cannot read, it looks at next time.
    fn recheck_published(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// For a broker that delivers in this process (the inline broker):
    /// delivers everything published so far to `plan`'s handlers, events
    /// they raise meanwhile included once published, and returns how many
    /// it delivered. `None` for a broker that delivers through a server
    /// (what `Engine::run_until_idle` needs).
    fn deliver_published<'a>(&'a self, plan: &'a ConsumerPlan) -> Option<BoxFuture<'a, usize>> {
        let _ = plan;
        None
    }

    /// Consumes for every subscription of `plan` until `shutdown` fires, then
    /// finishes the events in flight and returns.
    fn run(
        self: Arc<Self>,
        plan: Arc<ConsumerPlan>,
        shutdown: CancellationToken,
    ) -> BoxFuture<'static, Result<(), Error>>;
}
