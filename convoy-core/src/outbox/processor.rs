use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{OutboxRecord, OutboxStore};
use crate::broker::{Broker, KeyUse, Producer, Publication, PublishError};
use crate::config::PriorityLanesConfig;
use crate::envelope::Envelope;
use crate::error::{Error, chain};
use crate::future::BoxFuture;
use crate::key::Escaped;
use crate::key::check_key;
use crate::metrics;
use crate::tracing;

/// How many records one batch carries at most by default (a broker call
/// per shard the batch spans; `[outbox] batch`). A backlog goes out in
/// batches this large, so the fixed cost of a batch (a round trip, each
/// shard's dedup and epoch checks) is shared by many records; a light
/// load publishes each batch as it commits, whatever its size.
pub const BATCH: usize = 2048;

/// How many batches a pipelining drain keeps in flight while it prepares
/// the next: a batch's publish answers once its wake-ups are written,
/// which (on a Redis Cluster, where they follow the scripts) queue behind
/// the next batch's scripts, so the oldest of two is usually waiting only
/// for that.
const DEPTH: usize = 2;

/// How long a stopping relay keeps publishing what is pending.
const FINAL_DRAIN: Duration = Duration::from_secs(5);

/// Publishes outbox records in order, through the broker (which routes
/// them); every record's key is checked here first.
///
/// A record whose key is invalid at publish time is marked abandoned at once
/// and never retried, so it cannot wedge the records behind it. When the
/// broker fails, the records stay pending and are published, still in
/// order, once it is back.
pub struct OutboxProcessor {
    store: Arc<dyn OutboxStore>,
    broker: Arc<dyn Broker>,
    lanes: PriorityLanesConfig,
    producer: String,
    wake: Arc<Notify>,
    /// The elected publisher that took over in the broker (see
    /// [`Broker::take_over`]); a batch of another is preceded by its take
    /// over.
    taken_over: std::sync::Mutex<Option<Producer>>,
    /// The Rust field names of the message types the domain knows, by wire
    /// name (for the unkeyed-publication check).
    message_fields: BTreeMap<&'static str, &'static [&'static str]>,
    /// Records per batch at most.
    batch: usize,
}

impl std::fmt::Debug for OutboxProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxProcessor")
            .field("broker", &self.broker.name())
            .field("producer", &self.producer)
            .finish_non_exhaustive()
    }
}

impl OutboxProcessor {
    /// A processor publishing `store` to `broker` for the engine instance
    /// `instance_id` (the store's [`OutboxStore::producer`] for it names
    /// the set that drops re-sent records). `lanes` gives the backfill
    /// suffix, a reserved key value checked before publishing; routing
    /// itself is the broker's.
    pub fn new(
        store: Arc<dyn OutboxStore>,
        broker: Arc<dyn Broker>,
        lanes: PriorityLanesConfig,
        instance_id: &str,
        wake: Arc<Notify>,
    ) -> Self {
        let producer = store.producer(instance_id);
        OutboxProcessor {
            store,
            broker,
            lanes,
            producer,
            wake,
            taken_over: std::sync::Mutex::new(None),
            message_fields: BTreeMap::new(),
            batch: BATCH,
        }
    }

    /// Publishes batches of at most `records` records (at least 1;
    /// [`BATCH`] by default, `[outbox] batch` in the engine).
    pub fn batch_size(mut self, records: usize) -> Self {
        self.batch = records.max(1);
        self
    }

    /// The message types the domain knows (their Rust field names judge
    /// an unkeyed publication; a type not given here is judged by its
    /// payload's JSON field names).
    pub fn message_types(
        mut self,
        types: impl IntoIterator<Item = &'static crate::message::MessageDescriptor>,
    ) -> Self {
        self.message_fields = types.into_iter().map(|m| (m.type_name, m.fields)).collect();
        self
    }

    /// The producer name this processor publishes under.
    pub fn producer(&self) -> &str {
        &self.producer
    }

    /// Publishes one batch of pending records as the single publisher of
    /// its store (epoch 0); returns how many records were settled
    /// (published or abandoned).
    pub async fn process_batch(&self) -> Result<usize, Error> {
        self.process_batch_as(&self.single()).await
    }

    /// This processor as the single publisher of its store.
    pub(crate) fn single(&self) -> Producer {
        Producer {
            name: self.producer.clone(),
            epoch: 0,
        }
    }

    /// Publishes one batch of pending records as `producer` (a relay
    /// elected among replicas passes the store's shared name and its
    /// fencing epoch, see [`Producer::epoch`]); returns how many records
    /// were settled. A replaced publisher gets
    /// [`Error::PublisherReplaced`].
    ///
    /// An elected publisher (epoch above 0) first takes over in the broker,
    /// once per epoch, before it reads a single pending record: from then
    /// on its predecessor's batches are refused, so no record is published
    /// by both.
    pub async fn process_batch_as(&self, producer: &Producer) -> Result<usize, Error> {
        let Prepared { batch, settled, .. } = self.prepare(producer, &[]).await?;
        if batch.is_empty() {
            return Ok(settled);
        }
        let result = self.broker.publish(producer, &batch).await;
        self.settle(&batch, settled, result).await
    }

    /// Reads the next batch of pending records, leaving out `in_flight`
    /// (sorted seqs of a batch still being published), checks them and
    /// abandons those with an invalid key, leaves pending the records a
    /// writer published unkeyed where the category has a key (failing if
    /// nothing else is left). An empty batch with nothing settled: nothing
    /// is pending.
    async fn prepare(&self, producer: &Producer, in_flight: &[u64]) -> Result<Prepared, Error> {
        if producer.epoch > 0 && !self.has_taken_over(producer) {
            self.broker.take_over(producer).await?;
            *self
                .taken_over
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(producer.clone());
        }
        let records = if in_flight.is_empty() {
            self.store.pending(self.batch).await?
        } else {
            self.store.pending_excluding(self.batch, in_flight).await?
        };
        let all = records.len() < self.batch;
        let nothing = |settled| Prepared {
            batch: Vec::new(),
            settled,
            all,
        };
        if records.is_empty() {
            return Ok(nothing(0));
        }
        let mut batch: Vec<Publication> = Vec::with_capacity(records.len());
        let mut settled = 0;
        for r in records {
            if let Err(reason) = self.check(&r) {
                tracing::error!(seq = r.seq, id = %Escaped(&r.envelope.id), reason = %Escaped(&reason), "outbox record abandoned");
                self.store.mark_abandoned(r.seq, reason).await?;
                settled += 1;
                continue;
            }
            batch.push(Publication {
                seq: r.seq,
                envelope: r.envelope,
            });
        }
        if batch.is_empty() {
            return Ok(nothing(settled));
        }
        // A category the broker records as partitioned by a field is never
        // published without a key for an event that carries the field: a
        // writer raised it before the category's key was recorded (or
        // without knowing it). Such a record is routed by that field of
        // its payload, in its place in the batch (the key's order kept);
        // one whose payload holds no valid key there is abandoned with the
        // reason, for an operator to fix and retry (`convoy outbox`).
        // Checked once per category and shape in this process (unkeyed
        // shapes again every few seconds).
        let refused = self.refused_unkeyed(&batch).await?;
        if !refused.is_empty() {
            let mut kept = Vec::with_capacity(batch.len());
            let mut routed = 0usize;
            for mut p in batch {
                let field = refused.iter().find_map(|(c, e)| match e {
                    Error::KeyFieldMismatch { recorded, .. } if *c == p.envelope.category => {
                        Some(recorded.as_str())
                    }
                    _ => None,
                });
                let Some(field) = field.filter(|_| p.envelope.partition_key.is_none()) else {
                    kept.push(p);
                    continue;
                };
                match self.key_in_payload(&p.envelope.payload, field) {
                    Ok(key) => {
                        let mut envelope = Envelope::clone(&p.envelope);
                        envelope.partition_key = Some(key);
                        p.envelope = Arc::new(envelope);
                        routed += 1;
                        kept.push(p);
                    }
                    Err(reason) => {
                        let reason = format!(
                            "category {} is partitioned by `{field}` but this record was raised without a key, and {reason}: fix the row's payload and retry it",
                            Escaped(&p.envelope.category)
                        );
                        tracing::error!(seq = p.seq, id = %Escaped(&p.envelope.id), reason = %Escaped(&reason), "outbox record abandoned");
                        self.store.mark_abandoned(p.seq, reason).await?;
                        settled += 1;
                    }
                }
            }
            if routed > 0 {
                tracing::warn!(
                    records = routed,
                    "outbox records raised without a key, of categories partitioned by a field, routed by that field of their payload (a writer raised them before the category's key was recorded, or without knowing it: declare the key on the aggregate, #[aggregate(partition_key = ..)])"
                );
            }
            batch = kept;
            if batch.is_empty() {
                return Ok(nothing(settled));
            }
        }
        Ok(Prepared {
            batch,
            settled,
            all,
        })
    }

    /// The categories of `batch`'s unkeyed publications that the broker
    /// records as partitioned by a field those events carry, with the
    /// refusal. A type this domain knows is judged by its Rust fields (a
    /// serde rename cannot hide the field); another by its payload's.
    async fn refused_unkeyed(&self, batch: &[Publication]) -> Result<Vec<(String, Error)>, Error> {
        // One shape per (category, type) of the batch's unkeyed records:
        // compared by name, so a record costs no allocation; an unknown
        // type's payload is parsed once.
        let mut shapes: Vec<(&str, &str, &str)> = Vec::new();
        for p in batch.iter().filter(|p| p.envelope.partition_key.is_none()) {
            let e = &p.envelope;
            if !shapes
                .iter()
                .any(|(c, t, _)| *c == e.category && *t == e.type_name)
            {
                shapes.push((&e.category, &e.type_name, &e.payload));
            }
        }
        let mut refused: Vec<(String, Error)> = Vec::new();
        for (category, type_name, payload) in shapes {
            if refused.iter().any(|(c, _)| c == category) {
                continue;
            }
            let parsed;
            let fields: Vec<&str> = match self.message_fields.get(type_name) {
                Some(f) => f.to_vec(),
                None => {
                    parsed = payload_fields(payload);
                    parsed.iter().map(String::as_str).collect()
                }
            };
            match self
                .broker
                .check_category(category, KeyUse::Unkeyed(&fields))
                .await
            {
                Ok(()) => {}
                Err(e @ Error::KeyFieldMismatch { .. }) => refused.push((category.to_owned(), e)),
                Err(e) => return Err(e),
            }
        }
        Ok(refused)
    }

    /// Settles what went out of `batch` by its publish's `result`; returns
    /// how many records were settled, `settled` (abandoned) included, or
    /// the publish's error.
    async fn settle(
        &self,
        batch: &[Publication],
        settled: usize,
        result: Result<(), PublishError>,
    ) -> Result<usize, Error> {
        if result
            .as_ref()
            .is_err_and(|e| !matches!(e.error, Error::PublishedOutOfTurn))
        {
            // Redis may have lost the take-over (a restart from an
            // everysec AOF, a failover): take over again before the next
            // read.
            *self
                .taken_over
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
        match result {
            Ok(()) => {
                let seqs: Vec<u64> = batch.iter().map(|p| p.seq).collect();
                self.store.mark_published(&seqs).await?;
                metrics::outbox_published(seqs.len());
                Ok(settled + seqs.len())
            }
            Err(e) => {
                // The batch's first `published`, and whatever else the
                // broker wrote (other shards than the one that failed):
                // settled, so only the failed part is sent again.
                let mut seqs: Vec<u64> = batch[..e.published.min(batch.len())]
                    .iter()
                    .map(|p| p.seq)
                    .collect();
                seqs.extend(e.also_written.iter().copied());
                seqs.sort_unstable();
                seqs.dedup();
                self.store.mark_published(&seqs).await?;
                metrics::outbox_published(seqs.len());
                if !matches!(e.error, Error::PublishedOutOfTurn) {
                    metrics::outbox_publish_failed();
                }
                let first_unwritten = batch.iter().find(|p| seqs.binary_search(&p.seq).is_err());
                if let Some(p) = first_unwritten
                    && !matches!(
                        e.error,
                        Error::PublisherReplaced { .. } | Error::PublishedOutOfTurn
                    )
                {
                    self.store.record_failure(p.seq).await?;
                }
                Err(e.error)
            }
        }
    }

    fn has_taken_over(&self, producer: &Producer) -> bool {
        self.taken_over
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            == Some(producer)
    }

    /// The partition key in `field` of a JSON payload (a string, or an
    /// integer as its digits), checked as a raise checks it; why not.
    fn key_in_payload(&self, payload: &str, field: &str) -> Result<String, String> {
        let map: serde_json::Map<String, serde_json::Value> = serde_json::from_str(payload)
            .map_err(|e| format!("its payload is not a JSON object ({e})"))?;
        let key = match map.get(field) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
            Some(other) => {
                return Err(format!(
                    "its payload's `{field}` is not a key (a string or an integer): {other}"
                ));
            }
            None => return Err(format!("its payload has no `{field}`")),
        };
        check_key(Some(&key), &self.lanes.backfill_suffix).map_err(|rule| {
            format!("its payload's `{field}` {key:?} is not a valid key: {rule}")
        })?;
        Ok(key)
    }

    fn check(&self, r: &OutboxRecord) -> Result<(), String> {
        match r.partition_key() {
            Some(k) => check_key(Some(k), &self.lanes.backfill_suffix)
                .map_err(|rule| format!("invalid partition key {k:?}: {rule}")),
            None => Ok(()),
        }
    }

    /// Publishes everything pending now; stops at the first broker error.
    pub async fn drain(&self) -> Result<usize, Error> {
        self.drain_as(&self.single()).await
    }

    /// Publishes everything pending now as `producer`; stops at the first
    /// broker error.
    ///
    /// With a broker that pipelines publishes, the next batch is read,
    /// checked and handed over while up to two earlier ones are in
    /// flight (their records left out of the read), so a batch's round
    /// trip and Redis's work on it overlap the preparation of the next.
    /// The broker writes nothing of a batch where the one before it did
    /// not run first; when a batch fails, those behind it are settled for
    /// what they wrote and the pipeline stops, and the rest goes out again
    /// in order.
    pub async fn drain_as(&self, producer: &Producer) -> Result<usize, Error> {
        self.drain_with(producer, false).await
    }

    /// [`drain_as`](Self::drain_as); with `coalesce`, for a publisher that
    /// reads again within a millisecond anyway (the relay while busy), a
    /// read that finds less than a batch took everything pending, and ends
    /// the drain once that batch is published. Reading again at once would
    /// find only what committed during that round trip, a record or two,
    /// each such batch paying the store's read and settle and a publish of
    /// its own (with a transactional outbox, work on the writers'
    /// database); the next read takes what commits meanwhile as one batch.
    pub(crate) async fn drain_with(
        &self,
        producer: &Producer,
        coalesce: bool,
    ) -> Result<usize, Error> {
        let mut n = 0;
        if !self.broker.pipelines_publishes() {
            loop {
                let k = self.process_batch_as(producer).await?;
                if k == 0 {
                    return Ok(n);
                }
                n += k;
            }
        }
        let mut in_flight: VecDeque<Flight<'_>> = VecDeque::with_capacity(DEPTH + 1);
        loop {
            // The batches in flight keep moving while the next is read:
            // they may hold what the read waits for (the connection one is
            // setting up, say).
            let prepared = if in_flight.is_empty() {
                self.prepare(producer, &[]).await
            } else {
                let mut seqs: Vec<u64> = in_flight
                    .iter()
                    .flat_map(|f| f.seqs.iter().copied())
                    .collect();
                seqs.sort_unstable();
                alongside(&mut in_flight, self.prepare(producer, &seqs)).await
            };
            let prepared = match prepared {
                Ok(p) => p,
                Err(e) => {
                    // What they wrote is settled; the read's error is told.
                    for f in in_flight.drain(..) {
                        let _ = f.finish(self).await;
                    }
                    return Err(e);
                }
            };
            n += prepared.settled;
            if prepared.batch.is_empty() {
                if in_flight.is_empty() {
                    if prepared.settled == 0 {
                        return Ok(n);
                    }
                    continue;
                }
                // Nothing more while batches were in flight: settle them,
                // then read again from the oldest pending record.
                n += self.finish_all(&mut in_flight).await?;
                continue;
            }
            // A batch is never handed over behind one that failed: a failed
            // call is no longer in flight, so the broker would not hold
            // this one behind it, and its records would land ahead of the
            // failed one's. The batches in flight are settled first; this
            // one stays pending and is read again.
            if in_flight.iter().any(Flight::failed) {
                n += self.finish_all(&mut in_flight).await?;
                continue;
            }
            // Every seq below the oldest record in flight or in this batch
            // was settled (the read leaves out only what is in flight).
            let floor = in_flight
                .iter()
                .map(Flight::first)
                .fold(prepared.batch[0].seq, u64::min);
            in_flight.push_back(Flight::launch(self, producer, prepared.batch, floor).await);
            if coalesce && prepared.all {
                // The read took everything pending (see `drain_with`); a
                // batch refused out of turn is read again at once.
                let launched: usize = in_flight.iter().map(|f| f.seqs.len()).sum();
                let settled = self.finish_all(&mut in_flight).await?;
                n += settled;
                if settled >= launched {
                    return Ok(n);
                }
                continue;
            }
            if in_flight.len() > DEPTH {
                n += self.finish_oldest(&mut in_flight).await?;
            }
        }
    }

    /// Settles the batches in flight, oldest first (see
    /// [`OutboxProcessor::finish_oldest`]).
    async fn finish_all(&self, in_flight: &mut VecDeque<Flight<'_>>) -> Result<usize, Error> {
        let mut n = 0;
        while !in_flight.is_empty() {
            n += self.finish_oldest(in_flight).await?;
        }
        Ok(n)
    }

    /// Waits for the oldest batch in flight and settles what it wrote. When
    /// it failed, the batches behind it ran only where it did: they are
    /// settled for what they wrote, and the drain goes on from the oldest
    /// pending record (after a refusal out of turn) or stops with the
    /// error.
    async fn finish_oldest(&self, in_flight: &mut VecDeque<Flight<'_>>) -> Result<usize, Error> {
        let Some(oldest) = in_flight.pop_front() else {
            return Ok(0);
        };
        let done = oldest.finish(self).await;
        if done.is_ok() {
            return done;
        }
        let mut n = 0;
        for f in in_flight.drain(..) {
            n += f.finish(self).await.unwrap_or(0);
        }
        Ok(n + finished(done)?)
    }

    /// Exports the store's backlog, oldest pending age and abandoned count
    /// as metrics.
    pub async fn export_stats(&self) -> Result<(), Error> {
        let stats = self.store.stats().await?;
        metrics::outbox_stats(stats.pending, stats.oldest_pending_ms, stats.abandoned);
        Ok(())
    }

    /// Publishes as the single publisher of its store until `shutdown`
    /// fires, waking when records are added and backing off while the
    /// broker is unreachable; then publishes what is pending once more
    /// (for up to 5 s) and returns. (The engine runs the relay instead,
    /// which elects one publisher when the store is shared.)
    pub async fn run(&self, shutdown: CancellationToken) {
        super::relay::publish(self, &self.single(), None, &shutdown).await;
    }

    /// Runs the relay of this processor's store until `shutdown` fires: as
    /// the store's single publisher, or, for a store shared by several
    /// processes (one with an [`Election`](super::Election)), as a
    /// candidate that publishes while it leads. What the engine runs.
    pub async fn relay(self: Arc<Self>, shutdown: CancellationToken) {
        super::relay::run(self, shutdown).await
    }

    /// The store this processor publishes.
    pub(crate) fn store(&self) -> &Arc<dyn OutboxStore> {
        &self.store
    }

    /// What wakes this processor when records are committed in this process.
    pub(crate) fn wake(&self) -> &Arc<Notify> {
        &self.wake
    }

    /// Nothing was left to publish: lets the broker look again at what it
    /// published last (see [`Broker::recheck_published`]).
    pub(crate) async fn recheck_published(&self) {
        self.broker.recheck_published().await;
    }

    /// The last publish of a stopping relay: what is pending, for up to 5 s,
    /// including what commits meanwhile (until a read finds nothing).
    pub(crate) async fn final_drain(&self, producer: &Producer) {
        match tokio::time::timeout(FINAL_DRAIN, self.drain_as(producer)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %chain(&e), "outbox records stay pending at shutdown")
            }
            Err(_) => tracing::warn!("outbox records stay pending at shutdown (timed out)"),
        }
    }
}

/// A finished batch's settled records; an error other than that of a
/// batch that only followed a failed one is returned (the drain stops
/// there), which settles nothing more.
fn finished(done: Result<usize, Error>) -> Result<usize, Error> {
    match done {
        Ok(k) => Ok(k),
        Err(Error::PublishedOutOfTurn) => Ok(0),
        Err(e) => Err(e),
    }
}

/// A batch read and checked, ready to publish.
struct Prepared {
    batch: Vec<Publication>,
    /// Records settled while preparing it (abandoned).
    settled: usize,
    /// Whether the read found fewer records than a batch holds: every
    /// record pending when it ran (and not in flight) is in this batch or
    /// was settled.
    all: bool,
}

/// A batch handed to the broker whose publish has not finished.
struct Flight<'a> {
    publish: BoxFuture<'a, (Vec<Publication>, Result<(), PublishError>)>,
    /// Its result, when it finished on its first poll.
    ready: Option<(Vec<Publication>, Result<(), PublishError>)>,
    /// Its records' seqs, sorted (left out of the next read).
    seqs: Vec<u64>,
}

impl<'a> Flight<'a> {
    /// Hands `batch` to the broker and polls the publish once, so its
    /// calls are on their way before the next batch is prepared.
    async fn launch(
        processor: &'a OutboxProcessor,
        producer: &'a Producer,
        batch: Vec<Publication>,
        floor: u64,
    ) -> Flight<'a> {
        let mut seqs: Vec<u64> = batch.iter().map(|p| p.seq).collect();
        seqs.sort_unstable();
        let broker = &processor.broker;
        let mut publish: BoxFuture<'a, _> = Box::pin(async move {
            let result = broker.publish_behind(producer, &batch, floor).await;
            (batch, result)
        });
        let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(publish.as_mut().poll(cx)));
        let ready = match polled.await {
            std::task::Poll::Ready(out) => Some(out),
            std::task::Poll::Pending => None,
        };
        Flight {
            publish,
            ready,
            seqs,
        }
    }

    /// Whether its publish finished with an error.
    fn failed(&self) -> bool {
        matches!(self.ready, Some((_, Err(_))))
    }

    /// Its oldest record.
    fn first(&self) -> u64 {
        self.seqs.first().copied().unwrap_or(u64::MAX)
    }

    /// Waits for the publish and settles what it wrote.
    async fn finish(self, processor: &OutboxProcessor) -> Result<usize, Error> {
        let (batch, result) = match self.ready {
            Some(out) => out,
            None => self.publish.await,
        };
        processor.settle(&batch, 0, result).await
    }
}

/// Runs `work` to its end while keeping the publishes `in_flight` moving
/// (each one's result kept for [`Flight::finish`]).
async fn alongside<T>(in_flight: &mut VecDeque<Flight<'_>>, work: impl Future<Output = T>) -> T {
    tokio::pin!(work);
    std::future::poll_fn(|cx| {
        for f in in_flight.iter_mut().filter(|f| f.ready.is_none()) {
            if let std::task::Poll::Ready(out) = f.publish.as_mut().poll(cx) {
                f.ready = Some(out);
            }
        }
        work.as_mut().poll(cx)
    })
    .await
}

/// The top-level field names of a JSON object payload (none for another
/// shape).
fn payload_fields(payload: &str) -> Vec<String> {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(payload) {
        Ok(map) => {
            let mut v: Vec<String> = map.into_iter().map(|(k, _)| k).collect();
            v.sort_unstable();
            v
        }
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
#[path = "processor_tests.rs"]
pub(crate) mod tests;
