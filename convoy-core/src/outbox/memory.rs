use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{OutboxRecord, OutboxStats, OutboxStatus, OutboxStore};
use crate::envelope::Envelope;
use crate::error::Error;
use crate::future::BoxFuture;

/// How many published records the memory outbox keeps for inspection.
const KEEP_PUBLISHED: usize = 10_000;

/// An in-memory outbox. Records live as long as the process: use it for the
/// inline broker, tests, and engines whose events can be re-derived.
#[derive(Debug)]
pub struct MemoryOutbox {
    inner: Mutex<Inner>,
    /// New for every outbox: its numbering starts at 1 each time.
    identity: String,
}

impl Default for MemoryOutbox {
    fn default() -> Self {
        MemoryOutbox {
            inner: Mutex::default(),
            identity: uuid::Uuid::new_v4().simple().to_string(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    next_seq: u64,
    records: BTreeMap<u64, OutboxRecord>,
    published: std::collections::VecDeque<u64>,
}

impl MemoryOutbox {
    /// An empty outbox.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        let mut g = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut g)
    }
}

impl OutboxStore for MemoryOutbox {
    fn producer(&self, instance_id: &str) -> String {
        format!("{instance_id}/{}", self.identity)
    }

    fn append(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), Error>> {
        self.with(|i| {
            for envelope in envelopes {
                i.next_seq += 1;
                let seq = i.next_seq;
                i.records.insert(
                    seq,
                    OutboxRecord {
                        seq,
                        envelope,
                        status: OutboxStatus::Pending,
                        attempts: 0,
                    },
                );
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn pending(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        let v = self.with(|i| {
            i.records
                .values()
                .filter(|r| r.status == OutboxStatus::Pending)
                .take(limit)
                .cloned()
                .collect()
        });
        Box::pin(async { Ok(v) })
    }

    fn pending_excluding<'a>(
        &'a self,
        limit: usize,
        in_flight: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<OutboxRecord>, Error>> {
        let v = self.with(|i| {
            i.records
                .values()
                .filter(|r| {
                    r.status == OutboxStatus::Pending && in_flight.binary_search(&r.seq).is_err()
                })
                .take(limit)
                .cloned()
                .collect()
        });
        Box::pin(async { Ok(v) })
    }

    fn mark_published<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<(), Error>> {
        self.with(|i| {
            for s in seqs {
                if let Some(r) = i.records.get_mut(s) {
                    r.status = OutboxStatus::Published;
                    i.published.push_back(*s);
                }
            }
            while i.published.len() > KEEP_PUBLISHED {
                if let Some(old) = i.published.pop_front() {
                    i.records.remove(&old);
                }
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn mark_abandoned(&self, seq: u64, reason: String) -> BoxFuture<'_, Result<(), Error>> {
        self.with(|i| {
            if let Some(r) = i.records.get_mut(&seq) {
                r.status = OutboxStatus::Abandoned { reason };
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn record_failure(&self, seq: u64) -> BoxFuture<'_, Result<(), Error>> {
        self.with(|i| {
            if let Some(r) = i.records.get_mut(&seq) {
                r.attempts += 1;
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn records(&self) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        let v = self.with(|i| i.records.values().cloned().collect());
        Box::pin(async { Ok(v) })
    }

    fn stats(&self) -> BoxFuture<'_, Result<OutboxStats, Error>> {
        let stats = self.with(|i| {
            let mut stats = OutboxStats::default();
            for r in i.records.values() {
                match r.status {
                    OutboxStatus::Pending => {
                        stats.pending += 1;
                        if stats.oldest_pending_ms.is_none() {
                            stats.oldest_pending_ms = Some(r.envelope.time_ms);
                        }
                    }
                    OutboxStatus::Abandoned { .. } => stats.abandoned += 1,
                    OutboxStatus::Published => {}
                }
            }
            stats
        });
        Box::pin(async { Ok(stats) })
    }

    fn abandoned(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        let v = self.with(|i| {
            i.records
                .values()
                .filter(|r| matches!(r.status, OutboxStatus::Abandoned { .. }))
                .take(limit)
                .cloned()
                .collect()
        });
        Box::pin(async { Ok(v) })
    }

    fn retry(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>> {
        let found = self.with(|i| match i.records.get_mut(&seq) {
            Some(r) if matches!(r.status, OutboxStatus::Abandoned { .. }) => {
                r.status = OutboxStatus::Pending;
                r.attempts = 0;
                true
            }
            _ => false,
        });
        Box::pin(async move { Ok(found) })
    }

    fn discard(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>> {
        let found = self.with(|i| {
            let abandoned = matches!(
                i.records.get(&seq).map(|r| &r.status),
                Some(OutboxStatus::Abandoned { .. })
            );
            if abandoned {
                i.records.remove(&seq);
            }
            abandoned
        });
        Box::pin(async move { Ok(found) })
    }
}
