//! The processor's pipelined drain, against a broker that answers each
//! publish after a few scheduler turns (a round trip) and can fail one
//! call: the next batch is handed over while the previous one is in
//! flight, and a failed batch loses, duplicates and reorders nothing.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::broker::{Capabilities, ConsumerPlan};
use crate::envelope::Envelope;
use crate::outbox::MemoryOutbox;

/// A broker that pipelines: each publish takes a few scheduler turns; the
/// call numbered `fail` (from 0) fails, the call numbered `refuse` is
/// refused as out of turn although the one before it ran (its commands
/// left first), and a call handed over while another was in flight runs
/// only if that one ran (as the Redis broker's script refuses a call sent
/// behind one that did not run).
#[derive(Default)]
struct Piped {
    /// Each call's seqs and floor, in the order handed over.
    calls: Mutex<Vec<(Vec<u64>, u64)>>,
    /// Per call: whether it ran (`None` while in flight).
    ran: Mutex<Vec<Option<bool>>>,
    /// Seqs written, in the order written.
    written: Mutex<Vec<u64>>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    fail: Mutex<Option<usize>>,
    refuse: Option<usize>,
    /// Given a permit by each publish when it is polled again after its
    /// first poll (as a publish that sets up the connection a read then
    /// needs).
    opens: Option<Arc<tokio::sync::Semaphore>>,
    /// Records committed to this store while the first publish is in
    /// flight (as writers commit during a relay's round trip).
    arrivals: Option<(Arc<MemoryOutbox>, usize)>,
}

impl Piped {
    fn outcome(&self, number: usize, ran: bool) {
        self.ran.lock().unwrap_or_else(|e| e.into_inner())[number] = Some(ran);
    }
}

impl Broker for Piped {
    fn name(&self) -> &str {
        "piped"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }
    fn publish<'a>(
        &'a self,
        producer: &'a Producer,
        batch: &'a [Publication],
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        self.publish_behind(producer, batch, batch.first().map_or(0, |p| p.seq))
    }
    fn pipelines_publishes(&self) -> bool {
        true
    }
    fn publish_behind<'a>(
        &'a self,
        _producer: &'a Producer,
        batch: &'a [Publication],
        floor: u64,
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        let number = {
            let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
            calls.push((batch.iter().map(|p| p.seq).collect(), floor));
            self.ran
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(None);
            calls.len() - 1
        };
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let behind = (now > 1).then(|| number - 1);
        Box::pin(async move {
            tokio::task::yield_now().await;
            if let Some((store, n)) = &self.arrivals
                && number == 0
            {
                store.append(envelopes(*n)).await.expect("append");
            }
            if let Some(gate) = &self.opens {
                gate.add_permits(1);
            }
            for _ in 0..2 {
                tokio::task::yield_now().await;
            }
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            if *self.fail.lock().unwrap_or_else(|e| e.into_inner()) == Some(number) {
                self.outcome(number, false);
                return Err(PublishError::nothing(Error::Shutdown));
            }
            let before_ran = behind.is_none_or(|b| {
                self.ran.lock().unwrap_or_else(|e| e.into_inner())[b] == Some(true)
            });
            if self.refuse == Some(number) || !before_ran {
                self.outcome(number, false);
                return Err(PublishError::nothing(Error::PublishedOutOfTurn));
            }
            self.outcome(number, true);
            self.written
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(batch.iter().map(|p| p.seq));
            Ok(())
        })
    }
    fn run(
        self: Arc<Self>,
        _plan: Arc<ConsumerPlan>,
        _shutdown: CancellationToken,
    ) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }
}

/// `n` events over 8 keys.
pub(crate) fn envelopes(n: usize) -> Vec<Envelope> {
    (0..n)
        .map(|i| Envelope {
            id: format!("e{i}"),
            type_name: "Ticked".into(),
            category: "tick".into(),
            partition_key: Some(format!("k{}", i % 8)),
            time_ms: 0,
            priority: crate::envelope::Priority::Normal,
            correlation_id: None,
            payload: "{}".into(),
            origin: None,
            replay: None,
        })
        .collect()
}

/// A processor of a memory outbox holding `n` records over 8 keys,
/// publishing to `broker`.
async fn processor(broker: Arc<Piped>, n: usize) -> (OutboxProcessor, Arc<MemoryOutbox>) {
    let store = Arc::new(MemoryOutbox::new());
    store.append(envelopes(n)).await.expect("append");
    let p = OutboxProcessor::new(
        store.clone(),
        broker,
        PriorityLanesConfig::default(),
        "e0",
        Arc::new(Notify::new()),
    );
    (p, store)
}

/// Asserts that `broker` wrote `n` records, each once, in seq order.
fn written_once_in_order(broker: &Piped, n: usize) {
    let written = broker.written.lock().map(|w| w.clone()).unwrap_or_default();
    assert_eq!(written.len(), n);
    assert!(
        written.windows(2).all(|w| w[0] < w[1]),
        "in order, once each"
    );
}

#[tokio::test]
async fn the_next_batch_is_handed_over_while_the_previous_one_is_in_flight() {
    let broker = Arc::new(Piped::default());
    let (p, store) = processor(broker.clone(), 2 * BATCH + 100).await;
    assert_eq!(p.drain().await.expect("drained"), 2 * BATCH + 100);
    // Up to DEPTH in flight while the next is read, then that one too.
    assert_eq!(
        broker.most_in_flight.load(Ordering::SeqCst),
        super::DEPTH + 1
    );
    let calls = broker.calls.lock().map(|c| c.clone()).unwrap_or_default();
    let floors: Vec<u64> = calls.iter().map(|(_, floor)| *floor).collect();
    let firsts: Vec<u64> = calls.iter().map(|(seqs, _)| seqs[0]).collect();
    // A batch handed over behind another keeps the other's records in the
    // broker's dedup (the floor is the oldest record in flight).
    assert_eq!(firsts.len(), 3, "{firsts:?}");
    assert_eq!(floors[0], firsts[0]);
    assert_eq!(floors[1], firsts[0]);
    assert_eq!(floors[2], firsts[0], "the first is still in flight");
    written_once_in_order(&broker, 2 * BATCH + 100);
    assert_eq!(store.stats().await.expect("stats").pending, 0);
}

/// A processor of a memory outbox holding 100 records, whose broker
/// commits 5 more while its first publish is in flight.
async fn with_arrivals() -> (OutboxProcessor, Arc<MemoryOutbox>, Arc<Piped>) {
    let store = Arc::new(MemoryOutbox::new());
    store.append(envelopes(100)).await.expect("append");
    let broker = Arc::new(Piped {
        arrivals: Some((store.clone(), 5)),
        ..Piped::default()
    });
    let p = OutboxProcessor::new(
        store.clone(),
        broker.clone(),
        PriorityLanesConfig::default(),
        "e0",
        Arc::new(Notify::new()),
    );
    (p, store, broker)
}

/// A coalescing drain (the relay while busy, reading again within a
/// millisecond): a read that found less than a batch took everything
/// pending, and the drain publishes it and ends. What commits during that
/// publish waits for the next drain, which takes it as one batch, rather
/// than going out a record or two at a time, each batch paying a read, a
/// publish and a settle of its own.
#[tokio::test]
async fn a_read_of_less_than_a_batch_ends_the_drain_and_the_next_takes_what_came_meanwhile() {
    let (p, store, broker) = with_arrivals().await;
    let producer = p.single();
    assert_eq!(p.drain_with(&producer, true).await.expect("drained"), 100);
    assert_eq!(
        store.stats().await.expect("stats").pending,
        5,
        "what committed during the publish waits for the next drain"
    );
    assert_eq!(p.drain_with(&producer, true).await.expect("drained"), 5);
    let sizes: Vec<usize> = broker
        .calls
        .lock()
        .map(|c| c.iter().map(|(seqs, _)| seqs.len()).collect())
        .unwrap_or_default();
    assert_eq!(sizes, vec![100, 5], "one batch per drain");
    written_once_in_order(&broker, 105);
}

/// Without coalescing (a publisher that nothing may wake soon: a store
/// whose commits do not notify, a stopping relay's last publish), a drain
/// reads until a read finds nothing, so what commits while it publishes
/// goes out in the same drain.
#[tokio::test]
async fn a_drain_that_does_not_coalesce_takes_what_commits_meanwhile() {
    let (p, store, broker) = with_arrivals().await;
    assert_eq!(p.drain().await.expect("drained"), 105);
    assert_eq!(store.stats().await.expect("stats").pending, 0);
    written_once_in_order(&broker, 105);
}

#[tokio::test]
async fn a_failed_batch_stops_the_pipeline_and_everything_goes_out_again_in_order() {
    let broker = Arc::new(Piped::default());
    *broker.fail.lock().unwrap_or_else(|e| e.into_inner()) = Some(0);
    let (p, store) = processor(broker.clone(), 2 * BATCH + 100).await;
    let e = p.drain().await.expect_err("the first batch failed");
    assert!(
        matches!(e, Error::Shutdown),
        "the failed batch's error: {e}"
    );
    assert_eq!(
        broker.calls.lock().map(|c| c.len()).unwrap_or_default(),
        super::DEPTH + 1,
        "the batches behind it were handed over, then the drain stopped"
    );
    assert!(broker.written.lock().map(|w| w.is_empty()).unwrap_or(false));
    let stats = store.stats().await.expect("stats");
    assert_eq!(stats.pending, (2 * BATCH + 100) as u64, "nothing settled");
    // The next drain publishes everything, in order, once.
    *broker.fail.lock().unwrap_or_else(|e| e.into_inner()) = None;
    assert_eq!(p.drain().await.expect("drained"), 2 * BATCH + 100);
    written_once_in_order(&broker, 2 * BATCH + 100);
}

#[tokio::test]
async fn a_batch_refused_as_out_of_turn_is_sent_again_at_once() {
    // The second call is refused although the first ran: the drain goes
    // on, and everything goes out once, in order.
    let broker = Arc::new(Piped {
        refuse: Some(1),
        ..Piped::default()
    });
    let (p, store) = processor(broker.clone(), 2 * BATCH + 100).await;
    assert_eq!(p.drain().await.expect("drained"), 2 * BATCH + 100);
    written_once_in_order(&broker, 2 * BATCH + 100);
    assert_eq!(store.stats().await.expect("stats").pending, 0);
    let failures: u32 = store
        .records()
        .await
        .expect("records")
        .iter()
        .map(|r| r.attempts)
        .sum();
    assert_eq!(failures, 0, "an out-of-turn refusal is not a failure");
}

/// A memory outbox whose read of the next batch (while one is in flight)
/// waits for a permit, given by the publish in flight ([`Piped::opens`]),
/// or takes `yields` scheduler turns (longer than a publish).
struct Gated {
    inner: MemoryOutbox,
    gate: Option<Arc<tokio::sync::Semaphore>>,
    yields: usize,
}

impl OutboxStore for Gated {
    fn append(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), Error>> {
        self.inner.append(envelopes)
    }
    fn pending(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        self.inner.pending(limit)
    }
    fn pending_excluding<'a>(
        &'a self,
        limit: usize,
        in_flight: &'a [u64],
    ) -> BoxFuture<'a, Result<Vec<OutboxRecord>, Error>> {
        Box::pin(async move {
            if let Some(gate) = &self.gate
                && let Ok(permit) = gate.acquire().await
            {
                permit.forget();
            }
            for _ in 0..self.yields {
                tokio::task::yield_now().await;
            }
            self.inner.pending_excluding(limit, in_flight).await
        })
    }
    fn mark_published<'a>(&'a self, seqs: &'a [u64]) -> BoxFuture<'a, Result<(), Error>> {
        self.inner.mark_published(seqs)
    }
    fn mark_abandoned(&self, seq: u64, reason: String) -> BoxFuture<'_, Result<(), Error>> {
        self.inner.mark_abandoned(seq, reason)
    }
    fn record_failure(&self, seq: u64) -> BoxFuture<'_, Result<(), Error>> {
        self.inner.record_failure(seq)
    }
    fn records(&self) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        self.inner.records()
    }
    fn stats(&self) -> BoxFuture<'_, Result<super::super::OutboxStats, Error>> {
        self.inner.stats()
    }
    fn abandoned(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        self.inner.abandoned(limit)
    }
    fn retry(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>> {
        self.inner.retry(seq)
    }
    fn discard(&self, seq: u64) -> BoxFuture<'_, Result<bool, Error>> {
        self.inner.discard(seq)
    }
}

#[tokio::test]
async fn the_batch_in_flight_keeps_moving_while_the_next_is_read() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let store = Arc::new(Gated {
        inner: MemoryOutbox::new(),
        gate: Some(gate.clone()),
        yields: 0,
    });
    store.append(envelopes(3 * BATCH)).await.expect("append");
    let p = OutboxProcessor::new(
        store,
        Arc::new(Piped {
            opens: Some(gate),
            ..Piped::default()
        }),
        PriorityLanesConfig::default(),
        "e0",
        Arc::new(Notify::new()),
    );
    let drained = tokio::time::timeout(std::time::Duration::from_secs(10), p.drain())
        .await
        .expect("the drain finishes: the read waits on the batch in flight");
    assert_eq!(drained.expect("drained"), 3 * BATCH);
}

#[tokio::test]
async fn no_batch_is_handed_over_behind_one_that_already_failed() {
    // The second call fails while the third batch is read (the reads are
    // slower than a publish): the third is not handed over, since no call
    // in flight would hold it behind the failed one.
    let broker = Arc::new(Piped::default());
    *broker.fail.lock().unwrap_or_else(|e| e.into_inner()) = Some(1);
    let store = Arc::new(Gated {
        inner: MemoryOutbox::new(),
        gate: None,
        yields: 10,
    });
    let n = 4 * BATCH;
    store.append(envelopes(n)).await.expect("append");
    let p = OutboxProcessor::new(
        store,
        broker.clone(),
        PriorityLanesConfig::default(),
        "e0",
        Arc::new(Notify::new()),
    );
    let e = p.drain().await.expect_err("the second batch failed");
    assert!(matches!(e, Error::Shutdown), "its error: {e}");
    *broker.fail.lock().unwrap_or_else(|e| e.into_inner()) = None;
    assert_eq!(p.drain().await.expect("drained"), n - BATCH);
    written_once_in_order(&broker, n);
}
