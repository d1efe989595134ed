//! The publisher's pace, driven by a store whose answers are scripted: a
//! busy publisher reaches idle only by settling and a last look.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use super::super::{MemoryOutbox, OutboxRecord, OutboxStats};
use super::*;
use crate::envelope::Envelope;

/// A memory outbox whose `publisher_busy` and `publisher_idle` answer from
/// scripts (true once a script runs out).
#[derive(Default)]
struct Scripted {
    inner: MemoryOutbox,
    busy: Mutex<VecDeque<bool>>,
    idle: Mutex<VecDeque<bool>>,
}

impl Scripted {
    fn new(busy: &[bool], idle: &[bool]) -> Self {
        Scripted {
            inner: MemoryOutbox::new(),
            busy: Mutex::new(busy.iter().copied().collect()),
            idle: Mutex::new(idle.iter().copied().collect()),
        }
    }
}

fn next_of(script: &Mutex<VecDeque<bool>>) -> bool {
    script
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .pop_front()
        .unwrap_or(true)
}

impl OutboxStore for Scripted {
    fn append(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), Error>> {
        self.inner.append(envelopes)
    }
    fn pending(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        self.inner.pending(limit)
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
    fn stats(&self) -> BoxFuture<'_, Result<OutboxStats, Error>> {
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
    fn publisher_busy(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { next_of(&self.busy) })
    }
    fn publisher_idle(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { next_of(&self.idle) })
    }
}

const POLL: Duration = Duration::from_secs(1);

/// The paces after reads of `published` records each, with their waits,
/// from idle.
async fn run(store: &dyn OutboxStore, reads: &[usize]) -> Vec<(Pace, Duration)> {
    run_from(Pace::Idle, store, reads).await
}

/// The paces after reads of `published` records each, from `pace`.
async fn run_from(
    mut pace: Pace,
    store: &dyn OutboxStore,
    reads: &[usize],
) -> Vec<(Pace, Duration)> {
    let mut out = Vec::new();
    for &published in reads {
        let (next, wait) = pace.next(published, store).await;
        pace = next;
        out.push((next, wait));
    }
    out
}

#[tokio::test]
async fn a_store_whose_commits_always_notify_keeps_the_publisher_idle() {
    let store = MemoryOutbox::new();
    let paces = run(&store, &[5, 0, 3]).await;
    assert_eq!(paces, [(Pace::Idle, POLL); 3]);
}

#[tokio::test]
async fn a_busy_publisher_goes_idle_only_after_settling_and_a_last_look() {
    // Busy taken; three empty reads; settling refused once, then granted.
    let store = Scripted::new(&[true, true, true], &[false, true]);
    let paces = run(&store, &[5, 0, 0, 0, 0, 0]).await;
    assert_eq!(
        paces,
        [
            (Pace::Busy { empty: 0 }, BUSY_POLL),
            (Pace::Busy { empty: 1 }, BUSY_POLL),
            (Pace::Busy { empty: 2 }, BUSY_POLL),
            (Pace::Settling { tries: 1 }, BUSY_POLL),
            (Pace::LastLook, Duration::ZERO),
            (Pace::Idle, POLL),
        ]
    );
}

#[tokio::test]
async fn a_busy_publisher_that_loses_busy_settles_before_it_waits() {
    // Busy, then the store cannot keep it (its session ended): commits
    // that skipped their notification may be under way.
    let store = Scripted::new(&[true, false], &[true]);
    let paces = run(&store, &[5, 2, 0]).await;
    assert_eq!(
        paces,
        [
            (Pace::Busy { empty: 0 }, BUSY_POLL),
            (Pace::LastLook, Duration::ZERO),
            (Pace::Idle, POLL),
        ]
    );
}

#[tokio::test]
async fn records_arriving_while_settling_make_the_publisher_busy_again() {
    let store = Scripted::new(&[true, true, true, true], &[false]);
    let paces = run(&store, &[5, 0, 0, 0, 4]).await;
    assert_eq!(paces[3], (Pace::Settling { tries: 1 }, BUSY_POLL));
    assert_eq!(paces[4], (Pace::Busy { empty: 0 }, BUSY_POLL));
}

#[tokio::test]
async fn settling_reads_less_often_the_longer_it_is_refused() {
    let store = Scripted::new(&[true], &[false; 8]);
    let paces = run(&store, &[5, 0, 0, 0, 0, 0, 0, 0, 0, 0]).await;
    let waits: Vec<u64> = paces[3..]
        .iter()
        .map(|(_, wait)| wait.as_millis() as u64)
        .collect();
    assert_eq!(waits, [1, 2, 4, 8, 16, 32, 32]);
    assert_eq!(paces[9].0, Pace::Settling { tries: 7 });
}

/// A term starts settling: the former leader may have left commits that
/// skipped their notification, so the new one waits only once they are
/// over (here: refused once).
#[tokio::test]
async fn a_new_term_settles_before_it_waits_for_notifications() {
    let store = Scripted::new(&[], &[false, true]);
    let paces = run_from(Pace::START, &store, &[0, 0, 0]).await;
    assert_eq!(
        paces,
        [
            (Pace::Settling { tries: 1 }, BUSY_POLL),
            (Pace::LastLook, Duration::ZERO),
            (Pace::Idle, POLL),
        ]
    );
}

/// A read that takes long keeps a busy publisher's mark alive meanwhile
/// (the store's session would otherwise lapse); an idle one's read does
/// not touch it.
#[tokio::test(start_paused = true)]
async fn a_long_read_of_a_busy_publisher_keeps_it_busy() {
    let store = Scripted::new(&[true; 10], &[]);
    let kept = |store: &Scripted| 10 - store.busy.lock().map_or(0, |s| s.len());
    let read = || tokio::time::sleep(KEEP_BUSY_EVERY * 4 + KEEP_BUSY_EVERY / 2);
    keeping_busy(Pace::Busy { empty: 0 }, &store, read()).await;
    assert_eq!(kept(&store), 4);
    keeping_busy(Pace::Idle, &store, read()).await;
    assert_eq!(kept(&store), 4);
}

/// A busy mark lost during a long read is not taken again before the read
/// ends (the relay may have stalled and been replaced).
#[tokio::test(start_paused = true)]
async fn a_busy_mark_lost_during_a_read_is_not_taken_again_in_it() {
    let store = Scripted::new(&[true, false, true, true, true, true], &[]);
    let left = |store: &Scripted| store.busy.lock().map_or(0, |s| s.len());
    keeping_busy(
        Pace::Busy { empty: 0 },
        &store,
        tokio::time::sleep(KEEP_BUSY_EVERY * 5 + KEEP_BUSY_EVERY / 2),
    )
    .await;
    assert_eq!(left(&store), 4, "asked twice: kept, then lost");
}
