use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

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

/// Records not published yet (pending or abandoned), by seq, apart from
/// the last published ones: a read of pending records walks no published
/// one, and a record is moved by its box, not copied whole.
#[derive(Debug, Default)]
struct Inner {
    next_seq: u64,
    unpublished: BTreeMap<u64, Box<OutboxRecord>>,
    /// The last [`KEEP_PUBLISHED`] records published, in the order they were.
    published: VecDeque<Box<OutboxRecord>>,
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
                i.unpublished.insert(
                    seq,
                    Box::new(OutboxRecord {
                        seq,
                        envelope: Arc::new(envelope),
                        status: OutboxStatus::Pending,
                        attempts: 0,
                    }),
                );
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn pending(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        self.pending_excluding(limit, &[])
    }

    fn pending_excluding<'a>(
        &'a self,
        limit: usize,
        in_flight: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<OutboxRecord>, Error>> {
        let v = self.with(|i| {
            // `in_flight` is sorted: walked beside the records, in step.
            let mut skip = in_flight.iter().peekable();
            i.unpublished
                .values()
                .filter(|r| {
                    while skip.next_if(|s| **s < r.seq).is_some() {}
                    r.status == OutboxStatus::Pending && skip.peek() != Some(&&r.seq)
                })
                .take(limit)
                .map(|r| OutboxRecord::clone(r))
                .collect()
        });
        Box::pin(async { Ok(v) })
    }

    fn mark_published<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<(), Error>> {
        self.with(|i| {
            for s in seqs {
                if let Some(mut r) = i.unpublished.remove(s) {
                    r.status = OutboxStatus::Published;
                    if i.published.len() == KEEP_PUBLISHED {
                        i.published.pop_front();
                    }
                    i.published.push_back(r);
                }
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn mark_abandoned(&self, seq: u64, reason: String) -> BoxFuture<'_, Result<(), Error>> {
        self.with(|i| {
            if let Some(r) = i.unpublished.get_mut(&seq) {
                r.status = OutboxStatus::Abandoned { reason };
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn record_failure(&self, seq: u64) -> BoxFuture<'_, Result<(), Error>> {
        self.with(|i| {
            if let Some(r) = i.unpublished.get_mut(&seq) {
                r.attempts += 1;
            }
        });
        Box::pin(async { Ok(()) })
    }

    fn records(&self) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        let v = self.with(|i| {
            let mut all: Vec<OutboxRecord> = i
                .published
                .iter()
                .chain(i.unpublished.values())
                .map(|r| OutboxRecord::clone(r))
                .collect();
            all.sort_by_key(|r| r.seq);
            all
        });
        Box::pin(async { Ok(v) })
    }

    fn stats(&self) -> BoxFuture<'_, Result<OutboxStats, Error>> {
        let stats = self.with(|i| {
            let mut stats = OutboxStats::default();
            for r in i.unpublished.values() {
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
            i.unpublished
                .values()
                .filter(|r| matches!(r.status, OutboxStatus::Abandoned { .. }))
                .take(limit)
                .map(|r| OutboxRecord::clone(r))
                .collect()
        });
        Box::pin(async { Ok(v) })
    }

    fn retry(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>> {
        let found = self.with(|i| match i.unpublished.get_mut(&seq) {
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
                i.unpublished.get(&seq).map(|r| &r.status),
                Some(OutboxStatus::Abandoned { .. })
            );
            if abandoned {
                i.unpublished.remove(&seq);
            }
            abandoned
        });
        Box::pin(async move { Ok(found) })
    }
}

#[cfg(test)]
mod tests {
    use super::{KEEP_PUBLISHED, MemoryOutbox};
    use crate::outbox::processor::tests::envelopes;
    use crate::outbox::{OutboxStatus, OutboxStore};

    fn seqs(records: &[crate::outbox::OutboxRecord]) -> Vec<u64> {
        records.iter().map(|r| r.seq).collect()
    }

    /// A read of pending records skips those in flight and the abandoned
    /// ones, in seq order, up to its limit; published records are kept
    /// (the last [`KEEP_PUBLISHED`]) for inspection but never read again.
    #[tokio::test]
    async fn pending_records_are_read_in_order_without_those_in_flight_or_published() {
        let outbox = MemoryOutbox::new();
        outbox.append(envelopes(10)).await.expect("append");
        outbox.mark_published(&[1, 2]).await.expect("published");
        outbox
            .mark_abandoned(5, "bad".into())
            .await
            .expect("abandoned");
        assert_eq!(seqs(&outbox.pending(4).await.expect("read")), [3, 4, 6, 7]);
        assert_eq!(
            seqs(
                &outbox
                    .pending_excluding(4, &[3, 4, 7, 11])
                    .await
                    .expect("read")
            ),
            [6, 8, 9, 10]
        );
        let all = outbox.records().await.expect("records");
        assert_eq!(seqs(&all), (1..=10).collect::<Vec<_>>());
        assert_eq!(all[0].status, OutboxStatus::Published);
        assert!(matches!(all[4].status, OutboxStatus::Abandoned { .. }));
        assert_eq!(outbox.stats().await.expect("stats").pending, 7);
        // A published record is never abandoned nor counted again, and a
        // seq marked twice is kept once.
        outbox
            .mark_abandoned(1, "late".into())
            .await
            .expect("abandoned");
        outbox.record_failure(2).await.expect("failure");
        outbox
            .mark_published(&[1, 2])
            .await
            .expect("published again");
        let all = outbox.records().await.expect("records");
        assert_eq!(seqs(&all), (1..=10).collect::<Vec<_>>());
        assert_eq!(all[0].status, OutboxStatus::Published);
        assert_eq!(all[1].attempts, 0);
        assert!(!outbox.retry(1).await.expect("retry"), "nothing to retry");

        let more = KEEP_PUBLISHED + 5;
        outbox.append(envelopes(more)).await.expect("append");
        let every: Vec<u64> = (3..=(10 + more as u64)).filter(|s| *s != 5).collect();
        outbox.mark_published(&every).await.expect("published");
        let kept = outbox.records().await.expect("records");
        assert_eq!(
            kept.len(),
            KEEP_PUBLISHED + 1,
            "the abandoned one and the last published"
        );
        assert_eq!(kept[0].seq, 5);
        assert_eq!(kept[1].seq, every[every.len() - KEEP_PUBLISHED]);
        assert!(outbox.pending(10).await.expect("read").is_empty());
    }
}
