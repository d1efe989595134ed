use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{OutboxRecord, OutboxStore};
use crate::backoff::Backoff;
use crate::broker::{Broker, Publication};
use crate::config::PriorityLanesConfig;
use crate::error::{Error, chain};
use crate::key::Escaped;
use crate::key::check_key;
use crate::routing::route;

/// How many records one publish call carries.
const BATCH: usize = 512;

/// Publishes outbox records in order: the one routing choke point.
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
    /// `producer` (with the store's [`OutboxStore::producer_identity`], it
    /// names the high-water mark that drops re-sent batches).
    pub fn new(
        store: Arc<dyn OutboxStore>,
        broker: Arc<dyn Broker>,
        lanes: PriorityLanesConfig,
        producer: String,
        wake: Arc<Notify>,
    ) -> Self {
        let producer = format!("{producer}/{}", store.producer_identity());
        OutboxProcessor {
            store,
            broker,
            lanes,
            producer,
            wake,
        }
    }

    /// Publishes one batch of pending records; returns how many records were
    /// settled (published or abandoned).
    pub async fn process_batch(&self) -> Result<usize, Error> {
        let records = self.store.pending(BATCH).await?;
        if records.is_empty() {
            return Ok(0);
        }
        let caps = self.broker.capabilities();
        let mut batch: Vec<Publication> = Vec::with_capacity(records.len());
        let mut settled = 0;
        for r in &records {
            if let Err(reason) = self.check(r) {
                tracing::error!(seq = r.seq, id = %Escaped(&r.envelope.id), reason = %Escaped(&reason), "outbox record abandoned");
                self.store.mark_abandoned(r.seq, reason).await?;
                settled += 1;
                continue;
            }
            let to = route(
                &r.envelope.category,
                r.partition_key(),
                r.envelope.priority,
                caps,
                &self.lanes,
            );
            batch.push(Publication {
                seq: r.seq,
                stream: to.stream,
                partition: to.partition,
                envelope: r.envelope.clone(),
            });
        }
        match self.broker.publish(&self.producer, &batch).await {
            Ok(()) => {
                let seqs: Vec<u64> = batch.iter().map(|p| p.seq).collect();
                self.store.mark_published(&seqs).await?;
                Ok(settled + seqs.len())
            }
            Err(e) => {
                let seqs: Vec<u64> = batch[..e.published.min(batch.len())]
                    .iter()
                    .map(|p| p.seq)
                    .collect();
                self.store.mark_published(&seqs).await?;
                if let Some(p) = batch.get(e.published) {
                    self.store.record_failure(p.seq).await?;
                }
                Err(e.error)
            }
        }
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
        let mut n = 0;
        loop {
            let k = self.process_batch().await?;
            if k == 0 {
                return Ok(n);
            }
            n += k;
        }
    }

    /// Publishes until `shutdown` fires, waking when records are added and
    /// backing off while the broker is unreachable.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut backoff = Backoff::reconnect();
        loop {
            let notified = self.wake.notified();
            match self.drain().await {
                Ok(_) => {
                    backoff.reset();
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = notified => {}
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %chain(&e), "outbox publish failed; records stay pending");
                    if !backoff.wait_or_stop(&shutdown).await {
                        return;
                    }
                }
            }
        }
    }
}
