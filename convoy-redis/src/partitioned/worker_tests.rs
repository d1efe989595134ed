//! The worker driven without Redis: a scripted [`UnitIo`] answers its
//! reads (and every other call) and records each call with the time it
//! came, on tokio's paused clock; the entries read carry no fields (gone
//! from the stream), so no handler runs: each is reported and
//! acknowledged.

use std::collections::VecDeque;
use std::sync::Mutex;

use futures::future::BoxFuture;
use tokio::sync::{Semaphore, mpsc};

use super::super::Settings;
use super::super::membership::Liveness;
use super::super::unit_io::{AckThenRead, MIN_PRIMARY_BATCH, ReadAhead};
use super::*;
use crate::connection::{Client, Connection};
use convoy_core::broker::outage::Outage;
use convoy_core::broker::{ConsumerPlan, HealthState, Subscription};
use convoy_core::config::Config;
use convoy_core::envelope::Envelope;
use convoy_core::handler::{Context, Dispatch, Dispatched};
use convoy_core::key::KeyPolicy;
use convoy_core::metrics::HandlerMetrics;
use convoy_core::outbox::{MemoryOutbox, OutboxHandle};
use convoy_core::registry::{BrokerFacts, Registry};

/// One call of the worker's I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Claim,
    Read(Which),
    /// A read of new entries sent ahead ([`UnitIo::read_ahead`]), with how
    /// many entries it counts as held.
    ReadAhead(usize),
    /// That read run (a second after it was sent).
    ReadAheadRan,
    Ack,
    Fail,
    Reap,
    Rest,
    Halted,
    Release,
}

/// A unit's I/O that answers from a script: reads in order (a read past
/// the script stops the worker and finds nothing), halt checks in order
/// (then not halted), reaps in order (then kept).
#[derive(Default)]
struct Scripted {
    reads: Mutex<VecDeque<Result<ReadReply, Error>>>,
    halted: Mutex<VecDeque<bool>>,
    reaps: Mutex<VecDeque<Reaped>>,
    /// Acknowledgement outcomes in order (then acknowledged).
    acks: Mutex<VecDeque<Result<Acked, Arc<Error>>>>,
    calls: Arc<Mutex<Vec<(Call, tokio::time::Instant)>>>,
    /// How many entries each read asked for.
    counts: Arc<Mutex<Vec<usize>>>,
    stop: CancellationToken,
    /// Reads ahead, as on one Redis server (else it does not, as on a
    /// cluster).
    reads_ahead: bool,
    /// Called with each scripted read's reply as it is returned.
    after_read: Option<ReadHook>,
}

/// What [`Scripted`] calls with each read's reply.
type ReadHook = Box<dyn Fn(&Result<ReadReply, Error>) + Send + Sync>;

impl Scripted {
    fn record(&self, call: Call) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push((call, tokio::time::Instant::now()));
            // A worker going round without waiting (its clock paused)
            // is stopped, and its calls show it.
            if calls.len() > 500 {
                self.stop.cancel();
            }
        }
    }
}

impl UnitIo for Scripted {
    async fn claim(&self, _stream: &str) -> Result<Claimed, Error> {
        self.record(Call::Claim);
        Ok(Claimed::Done {
            count: 0,
            gone: Vec::new(),
        })
    }

    async fn read(
        &self,
        which: Which,
        _first_lane: usize,
        count: usize,
        _held: (At, usize, Option<&str>),
    ) -> Result<ReadReply, Error> {
        self.record(Call::Read(which));
        if let Ok(mut counts) = self.counts.lock() {
            counts.push(count);
        }
        let next = self.reads.lock().ok().and_then(|mut r| r.pop_front());
        let reply = next.unwrap_or_else(|| {
            self.stop.cancel();
            Ok(ReadReply::Empty)
        });
        if let Some(after) = &self.after_read {
            after(&reply);
        }
        reply
    }

    /// The next scripted read, taken now, run (recorded) a second later,
    /// as a read held up on its way (its connection made again): only if
    /// the worker awaits it.
    fn read_ahead(&self, count: usize, held: (At, usize, String)) -> Option<ReadAhead> {
        if !self.reads_ahead {
            return None;
        }
        self.record(Call::ReadAhead(held.1));
        if let Ok(mut counts) = self.counts.lock() {
            counts.push(count);
        }
        let next = self.reads.lock().ok().and_then(|mut r| r.pop_front());
        let stop = self.stop.clone();
        let calls = self.calls.clone();
        Some(Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Ok(mut calls) = calls.lock() {
                calls.push((Call::ReadAheadRan, tokio::time::Instant::now()));
            }
            next.unwrap_or_else(|| {
                stop.cancel();
                Ok(ReadReply::Empty)
            })
        }))
    }

    async fn ack(&self, ack: AckOf<'_>) -> Result<Acked, Arc<Error>> {
        self.record(Call::Ack);
        let next = self.acks.lock().ok().and_then(|mut a| a.pop_front());
        next.unwrap_or(Ok(Acked::Acked(ack.ids.len() as u64)))
    }

    /// As on one Redis server: the read goes in the same round trip as the
    /// acknowledgement, and runs whatever came of it.
    async fn ack_then_read(&self, ack: AckOf<'_>, first_lane: usize, count: usize) -> AckThenRead {
        let acked = self.ack(ack).await;
        let read = self
            .read(Which::New, first_lane, count, (ack.at, 0, None))
            .await;
        (acked, Some(read))
    }

    async fn fail(
        &self,
        _entry: &str,
        _error: &str,
        _known: u32,
        _halt: Option<&str>,
    ) -> Result<Failed, Error> {
        self.record(Call::Fail);
        Ok(Failed::Recorded {
            failures: 1,
            halted: true,
        })
    }

    async fn reap(&self) -> Result<Reaped, Error> {
        self.record(Call::Reap);
        let next = self.reaps.lock().ok().and_then(|mut r| r.pop_front());
        Ok(next.unwrap_or(Reaped::Kept))
    }

    async fn rest(&self) -> Result<Rested, Error> {
        self.record(Call::Rest);
        Ok(Rested::Rested(1))
    }

    async fn halted(&self) -> Result<bool, Error> {
        self.record(Call::Halted);
        let next = self.halted.lock().ok().and_then(|mut h| h.pop_front());
        Ok(next.unwrap_or(false))
    }

    async fn release(&self) -> Result<Released, Error> {
        self.record(Call::Release);
        Ok(Released::Released)
    }

    async fn dead_letter_head(&self, _entry: &str, _generation: u64) -> Result<HeadActed, Error> {
        unreachable!("no handler runs, none is dead-lettered")
    }

    async fn record_gap(&self, _gap: GapOf<'_>) -> Result<(), Error> {
        unreachable!("no handler runs, no gap is recorded")
    }
}

/// A handler that is never called (the entries carry no fields).
struct NoHandler;

impl Dispatch for NoHandler {
    fn dispatch<'a>(
        &'a self,
        _envelope: &'a Envelope,
        _ctx: &'a Context,
    ) -> BoxFuture<'a, Result<Dispatched, HandlerError>> {
        unreachable!("entries without fields run no handler")
    }
}

/// What one test's worker shares, with `reap_idle` and this instance's
/// lease deadline well ahead, never connected (the scripted I/O answers
/// everything).
fn shared(reap_idle: Duration) -> Arc<Shared> {
    shared_on("redis://127.0.0.1:1/", reap_idle)
}

/// What one subscription `g` of category `c` (one shard, this instance
/// `e0` alive as `alive`) shares, connecting to the Redis at `url`.
pub(in crate::partitioned) fn shared_on(url: &str, reap_idle: Duration) -> Arc<Shared> {
    shared_configured(url, reap_idle, Config::default())
}

/// [`shared`], acknowledging every `max_unacked` handled entries.
fn shared_acking(max_unacked: usize) -> Arc<Shared> {
    let mut config = Config::default();
    config.server.partitioning.max_unacked = max_unacked;
    shared_configured("redis://127.0.0.1:1/", HOUR, config)
}

/// [`shared_on`], with `config`.
fn shared_configured(url: &str, reap_idle: Duration, config: Config) -> Arc<Shared> {
    let none = BrokerFacts {
        name: "test",
        stream_partitioning: true,
        serial_delivery: false,
    };
    let registry = Registry::build([], [], [], none).expect("an empty registry");
    let sub = Subscription {
        handler: Arc::new(NoHandler),
        name: "g",
        category: "c",
        categories: vec!["c"],
        scope: "c",
        key_field: Some("k"),
        reads_partitions: true,
        reads_base: false,
        unkeyed: Vec::new(),
        dead_letter_poison: false,
        process_manager: false,
        classify: None,
        metrics: HandlerMetrics::new("g"),
    };
    let health = Arc::new(HealthState::default());
    let plan = Arc::new(ConsumerPlan::new(
        vec![sub],
        Arc::new(registry),
        config.clone(),
        "e0".to_owned(),
        Arc::new(KeyPolicy::default()),
        OutboxHandle::new(Arc::new(MemoryOutbox::new())),
        health.clone(),
    ));
    let mut settings = Settings::of(&config, &plan.subscriptions[0]);
    settings.reap_idle = reap_idle;
    let client = redis::Client::open(url).expect("a URL");
    let (exits, _) = mpsc::unbounded_channel();
    let liveness = Liveness::new(Arc::from(vec!["alive".to_owned()]), 3_600_000);
    liveness.new_incarnation([0]);
    liveness.set_deadline(0, Some(mono_ms()));
    let outage = Outage::new("g", &settings.retry, health);
    Arc::new(Shared {
        redis: Arc::new(Connection::new(Client::Single(client), url)),
        plan,
        settings,
        index: 0,
        owner: "e0".to_owned(),
        permits: Semaphore::new(1),
        exits,
        shards: 1,
        liveness,
        acks: super::super::acks::Lanes::new(1),
        outage,
        pauses: crate::pause::Pauses::new("g"),
    })
}

/// `n` entries gone from the stream (no fields), of the primary lane.
fn entries(n: usize) -> Result<ReadReply, Error> {
    let batch = (0..n)
        .map(|i| Entry {
            id: format!("{i}-0"),
            fields: None,
        })
        .collect();
    Ok(ReadReply::Entries(
        At {
            lane: 0,
            backfill: false,
        },
        batch,
    ))
}

fn empty() -> Result<ReadReply, Error> {
    Ok(ReadReply::Empty)
}

fn failed() -> Result<ReadReply, Error> {
    Err(Error::redis(
        "the read's reply was lost",
        redis::RedisError::from(std::io::Error::other("connection reset")),
    ))
}

/// What a read finds when a replaced owner read one entry after losing
/// the lease, and another it read is gone from the stream.
fn reclaimed() -> Result<ReadReply, Error> {
    Ok(ReadReply::Reclaimed {
        stream: "c:k1".to_owned(),
        moved: 1,
        missing: vec!["9-0".to_owned()],
    })
}

/// A worker of one single-stream unit on the scripted I/O; returns its
/// exit and the calls, each with the time since the worker started.
async fn drive(
    reap_idle: Duration,
    halted: bool,
    reads: Vec<Result<ReadReply, Error>>,
    halts: Vec<bool>,
    reaps: Vec<Reaped>,
) -> (Exit, Vec<(Call, Duration)>, Worker<Scripted>) {
    drive_woken(reap_idle, halted, reads, halts, reaps, None).await
}

/// [`drive`], the unit woken (a publish) `wake_at` after the start.
async fn drive_woken(
    reap_idle: Duration,
    halted: bool,
    reads: Vec<Result<ReadReply, Error>>,
    halts: Vec<bool>,
    reaps: Vec<Reaped>,
    wake_at: Option<Duration>,
) -> (Exit, Vec<(Call, Duration)>, Worker<Scripted>) {
    drive_on(shared(reap_idle), halted, reads, halts, reaps, wake_at).await
}

/// [`drive`] with no reap or halt, the acknowledgements' outcomes
/// scripted; returns the calls.
async fn drive_acks(
    reads: Vec<Result<ReadReply, Error>>,
    acks: Vec<Result<Acked, Arc<Error>>>,
) -> Vec<(Call, Duration)> {
    let stop = CancellationToken::new();
    let io = Scripted {
        reads: Mutex::new(reads.into()),
        acks: Mutex::new(acks.into()),
        stop,
        ..Scripted::default()
    };
    drive_io(shared(HOUR), io, false, None).await.1
}

/// [`drive_woken`], on what `s` shares.
async fn drive_on(
    s: Arc<Shared>,
    halted: bool,
    reads: Vec<Result<ReadReply, Error>>,
    halts: Vec<bool>,
    reaps: Vec<Reaped>,
    wake_at: Option<Duration>,
) -> (Exit, Vec<(Call, Duration)>, Worker<Scripted>) {
    let stop = CancellationToken::new();
    let io = Scripted {
        reads: Mutex::new(reads.into()),
        halted: Mutex::new(halts.into()),
        reaps: Mutex::new(reaps.into()),
        stop,
        ..Scripted::default()
    };
    drive_io(s, io, halted, wake_at).await
}

/// A worker of one single-stream unit on `io` (stopped with `io.stop`),
/// woken `wake_at` after the start.
async fn drive_io(
    s: Arc<Shared>,
    io: Scripted,
    halted: bool,
    wake_at: Option<Duration>,
) -> (Exit, Vec<(Call, Duration)>, Worker<Scripted>) {
    let unit = Arc::new(s.unit("k1"));
    assert_eq!(unit.lanes.len(), 1, "one lane, no backfill");
    let stop = io.stop.clone();
    let calls = io.calls.clone();
    let fence = Fence {
        owner: "e0".to_owned(),
        generation: 7,
    };
    let mut w = Worker::new(s, io, unit, fence, halted, None, stop);
    let start = tokio::time::Instant::now();
    if let Some(at) = wake_at {
        let wake = w.wake.clone();
        tokio::spawn(async move {
            tokio::time::sleep(at).await;
            wake.notify_one();
        });
    }
    let exit = match w.reclaim().await {
        Ok(()) => w.consume().await,
        Err(exit) => exit,
    };
    let calls = calls
        .lock()
        .map(|c| c.iter().map(|(call, at)| (*call, *at - start)).collect())
        .unwrap_or_default();
    (exit, calls, w)
}

const HOUR: Duration = Duration::from_secs(3600);
const PENDING: Call = Call::Read(Which::Pending);
const NEW: Call = Call::Read(Which::New);

/// The reads among `calls`.
fn reads(calls: &[(Call, Duration)]) -> Vec<(Call, Duration)> {
    calls
        .iter()
        .copied()
        .filter(|(c, _)| matches!(c, Call::Read(_)))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_consumer_of_many_units_reads_fewer_entries_at_a_time() {
    // A consumer of a few units: a hundred per read.
    let (_, _, w) = drive(HOUR, false, vec![empty(), empty()], Vec::new(), Vec::new()).await;
    let counts = w.io.counts.lock().map(|c| c.clone()).unwrap_or_default();
    assert!(!counts.is_empty());
    assert!(counts.iter().all(|&n| n == PRIMARY_BATCH), "{counts:?}");
    // Of 1,024 units: 16 at a time, and a batch of 16 is a full one (the
    // worker reads on at once rather than wait as if drained).
    let s = shared(HOUR);
    for _ in 0..1024 {
        s.plan.health.unit_started();
    }
    let (_, calls, w) = drive_on(
        s,
        false,
        vec![empty(), entries(MIN_PRIMARY_BATCH)],
        Vec::new(),
        Vec::new(),
        None,
    )
    .await;
    let counts = w.io.counts.lock().map(|c| c.clone()).unwrap_or_default();
    assert!(counts.iter().all(|&n| n == MIN_PRIMARY_BATCH), "{counts:?}");
    let zero = Duration::ZERO;
    assert_eq!(
        reads(&calls),
        vec![(PENDING, zero), (NEW, zero), (NEW, zero)]
    );
}

#[test]
fn the_read_batch_keeps_the_consumers_read_ahead_bounded() {
    assert_eq!(primary_batch(0, 1), PRIMARY_BATCH);
    assert_eq!(primary_batch(32, 1), PRIMARY_BATCH);
    assert_eq!(primary_batch(64, 1), 50);
    assert_eq!(primary_batch(128, 1), 25);
    assert_eq!(primary_batch(256, 1), MIN_PRIMARY_BATCH);
    assert_eq!(primary_batch(1024, 1), MIN_PRIMARY_BATCH);
    assert_eq!(primary_batch(100_000, 1), MIN_PRIMARY_BATCH);
    // Never below max_unacked (up to a full batch): one acknowledgement
    // per read batch stays so.
    assert_eq!(primary_batch(1024, 40), 40);
    assert_eq!(primary_batch(1024, 500), PRIMARY_BATCH);
    assert_eq!(primary_batch(1, 500), PRIMARY_BATCH);
}

#[tokio::test(start_paused = true)]
async fn a_short_batch_waits_for_a_wake_up_without_another_read() {
    let (exit, calls, _) = drive(
        HOUR,
        false,
        vec![empty(), entries(3)],
        Vec::new(),
        Vec::new(),
    )
    .await;
    assert_eq!(exit, Exit::Release);
    let zero = Duration::ZERO;
    // Drained: the next read comes only with the wait's timer (the rest
    // time; no wake-up here), not at once.
    assert_eq!(
        reads(&calls),
        vec![(PENDING, zero), (NEW, zero), (NEW, REST_AFTER)]
    );
    // A full batch reads on at once.
    let (_, calls, _) = drive(
        HOUR,
        false,
        vec![empty(), entries(PRIMARY_BATCH)],
        Vec::new(),
        Vec::new(),
    )
    .await;
    assert_eq!(
        reads(&calls),
        vec![(PENDING, zero), (NEW, zero), (NEW, zero)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_drained_unit_reads_at_once_when_woken() {
    let woken = Duration::from_secs(2);
    let (_, calls, _) = drive_woken(
        HOUR,
        false,
        vec![empty(), entries(3)],
        Vec::new(),
        Vec::new(),
        Some(woken),
    )
    .await;
    let zero = Duration::ZERO;
    assert_eq!(
        reads(&calls),
        vec![(PENDING, zero), (NEW, zero), (NEW, woken)]
    );
}

#[tokio::test(start_paused = true)]
async fn after_a_failed_read_the_pending_entries_are_read_before_anything_new() {
    let (_, calls, _) = drive(
        HOUR,
        false,
        vec![empty(), failed(), entries(2), empty()],
        Vec::new(),
        Vec::new(),
    )
    .await;
    let kinds: Vec<Call> = reads(&calls).into_iter().map(|(c, _)| c).collect();
    assert_eq!(kinds, vec![PENDING, NEW, PENDING, PENDING, NEW]);
    // After a back-off.
    let r = reads(&calls);
    assert!(r[2].1 > r[1].1, "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn a_halted_unit_waits_rechecks_and_once_unhalted_reads_its_pending_entries() {
    let (_, calls, w) = drive(HOUR, true, Vec::new(), vec![true, false], Vec::new()).await;
    let heartbeat = w.s.settings.heartbeat;
    assert_eq!(
        calls,
        vec![
            (Call::Claim, Duration::ZERO),
            (Call::Halted, heartbeat),
            (Call::Halted, heartbeat * 2),
            (PENDING, heartbeat * 2),
        ]
    );
    assert!(!w.halted.load(Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn a_rested_unit_waits_without_a_read_until_the_reap_time() {
    let (exit, calls, _) = drive(
        Duration::from_secs(25),
        false,
        vec![empty(), empty(), empty(), empty()],
        Vec::new(),
        vec![Reaped::Retired],
    )
    .await;
    assert_eq!(exit, Exit::Retired);
    let s = Duration::from_secs;
    assert_eq!(
        calls,
        vec![
            (Call::Claim, s(0)),
            (PENDING, s(0)),
            (NEW, s(0)),
            // The rest time: a read, then the rest.
            (NEW, s(10)),
            (Call::Rest, s(10)),
            // Rested: no read until the reap time, then the reap.
            (NEW, s(25)),
            (Call::Reap, s(25)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_unit_whose_reap_keeps_it_reads_again_and_waits_the_reap_time_anew() {
    let (_, calls, _) = drive(
        Duration::from_secs(5),
        false,
        vec![empty(), empty(), empty(), empty()],
        Vec::new(),
        vec![Reaped::Kept, Reaped::Retired],
    )
    .await;
    let s = Duration::from_secs;
    assert_eq!(
        calls,
        vec![
            (Call::Claim, s(0)),
            (PENDING, s(0)),
            (NEW, s(0)),
            (NEW, s(5)),
            (Call::Reap, s(5)),
            (NEW, s(5)),
            // Kept: its idle time starts over.
            (NEW, s(10)),
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn entries_gone_from_the_stream_are_acknowledged_one_by_one() {
    let (exit, calls, _) = drive(
        HOUR,
        false,
        vec![entries(2), empty()],
        Vec::new(),
        Vec::new(),
    )
    .await;
    assert_eq!(exit, Exit::Release);
    let acks = calls.iter().filter(|(c, _)| *c == Call::Ack).count();
    assert_eq!(acks, 2, "one ack per entry (max_unacked = 1): {calls:?}");
    assert!(
        !calls
            .iter()
            .any(|(c, _)| matches!(c, Call::Fail | Call::Release))
    );
}

/// With few units, a full batch of new entries acknowledged at its end
/// sends the next read before its first entry is handled, counting the
/// whole batch as held (pending, not acknowledged); the batch's
/// acknowledgement goes at once, the read sent ahead being held up or
/// not, and the next read of new entries is the one sent ahead. A short
/// batch sends none (the unit is likely drained), nor does a batch
/// acknowledged in parts, nor a consumer of many units.
#[tokio::test(start_paused = true)]
async fn a_full_batch_of_new_entries_reads_the_next_one_ahead() {
    let n = PRIMARY_BATCH;
    let run = |s: Arc<Shared>| async move {
        let io = Scripted {
            reads: Mutex::new(vec![empty(), entries(n), entries(3)].into()),
            reads_ahead: true,
            ..Scripted::default()
        };
        drive_io(s, io, false, None)
            .await
            .1
            .into_iter()
            .map(|(c, _)| c)
            .collect::<Vec<_>>()
    };
    let calls = run(shared_acking(n)).await;
    let ahead = calls
        .iter()
        .position(|c| matches!(c, Call::ReadAhead(_)))
        .expect("a read sent ahead");
    // Sent right after the full batch's read, holding the whole batch.
    assert_eq!(calls[ahead - 1], NEW, "{calls:?}");
    assert_eq!(calls[ahead], Call::ReadAhead(n), "{calls:?}");
    // The batch acknowledged in one call at once (whenever the read ran,
    // its check knows what it held), then the read awaited; the 3 read
    // ahead (short) acknowledged before the unit waits.
    assert_eq!(
        calls[ahead + 1..ahead + 3],
        [Call::Ack, Call::ReadAheadRan],
        "{calls:?}"
    );
    assert_eq!(calls.iter().filter(|c| **c == Call::Ack).count(), 2);
    // The read sent ahead stands for a read of new entries: one before it,
    // one after the wait (past the script).
    assert_eq!(calls.iter().filter(|c| **c == NEW).count(), 2, "{calls:?}");
    assert_eq!(
        calls
            .iter()
            .filter(|c| matches!(c, Call::ReadAhead(_)))
            .count(),
        1,
        "a short batch reads nothing ahead: {calls:?}"
    );
    // Acknowledged after each entry (max_unacked = 1): nothing read ahead.
    let calls = run(shared(HOUR)).await;
    assert!(
        !calls.iter().any(|c| matches!(c, Call::ReadAhead(_))),
        "{calls:?}"
    );
    // A consumer of many units reads nothing ahead.
    let s = shared_acking(n);
    for _ in 0..=READ_AHEAD_UNITS {
        s.plan.health.unit_started();
    }
    let calls = run(s).await;
    assert!(
        !calls.iter().any(|c| matches!(c, Call::ReadAhead(_))),
        "{calls:?}"
    );
}

/// The acknowledgement sent in front of a read fails: it is sent again, and
/// the read that went with it is not trusted for its entries (a new read
/// finds them pending and unseen); but one that sends the worker to its
/// pending entries first holds whatever came of the acknowledgement, and is
/// used (what a replaced owner left missing is reported from it, and only
/// there).
#[tokio::test(start_paused = true)]
async fn after_a_failed_acknowledgement_in_front_of_a_read_only_a_read_of_pending_entries_is_used()
{
    let lost = || {
        Err(Arc::new(Error::redis(
            "the acknowledgement's reply was lost",
            redis::RedisError::from(std::io::Error::other("connection reset")),
        )))
    };
    // A full batch (a short one is acknowledged before the worker waits):
    // max_unacked = 1, so every entry but the last is acknowledged on its
    // own, and the last in front of the next read.
    let n = PRIMARY_BATCH;
    let acks = || {
        let mut acks: Vec<_> = (1..n).map(|_| Ok(Acked::Acked(1))).collect();
        acks.push(lost());
        acks
    };
    // The calls from the acknowledgement in front of the read on.
    let after = |calls: Vec<(Call, Duration)>| -> Vec<Call> {
        calls
            .into_iter()
            .map(|(c, _)| c)
            .skip(3 + (n - 1))
            .collect()
    };
    // The read that went with the failed acknowledgement delivered an
    // entry: a new read.
    let calls = drive_acks(vec![empty(), entries(n), entries(1)], acks()).await;
    assert_eq!(after(calls)[..4], [Call::Ack, NEW, Call::Ack, NEW]);
    // It found entries moved back from a replaced owner: the pending entries
    // next, no new read.
    let calls = drive_acks(vec![empty(), entries(n), reclaimed()], acks()).await;
    assert_eq!(after(calls)[..4], [Call::Ack, NEW, Call::Ack, PENDING]);
    // It found entries a lost reply delivered pending and unseen: the same.
    let unseen = Ok(ReadReply::Unseen);
    let calls = drive_acks(vec![empty(), entries(n), unseen], acks()).await;
    assert_eq!(after(calls)[..4], [Call::Ack, NEW, Call::Ack, PENDING]);
}

/// The entries counted as missing on this thread's recorder since the
/// last call (a snapshot drains the counters).
fn missing_counted(snapshotter: &metrics_util::debugging::Snapshotter) -> u64 {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == convoy_core::metrics::MISSING_ENTRIES)
        .map(|(.., value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum()
}

/// What a replaced owner left missing is reported when the read that
/// found it went with an acknowledgement that was refused (the worker
/// exits) or failed, not only when the acknowledgement was done.
#[tokio::test(start_paused = true)]
async fn missing_entries_a_read_found_are_reported_whatever_came_of_the_acknowledgement_in_front() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The test's runtime runs on this thread.
    let _local = metrics::set_default_local_recorder(&recorder);
    let n = PRIMARY_BATCH;
    let ok = || (1..n).map(|_| Ok(Acked::Acked(1))).collect::<Vec<_>>();
    let reads = || vec![empty(), entries(n), reclaimed()];
    let mut refused = ok();
    refused.push(Ok(Acked::Refused(Refusal::FencedOut)));
    let calls = drive_acks(reads(), refused).await;
    assert_eq!(calls.last().map(|(c, _)| *c), Some(NEW), "exits after it");
    // The batch's own entries are gone from the stream too (no fields).
    let batch = n as u64;
    assert_eq!(missing_counted(&snapshotter), batch + 1, "refused");
    let mut lost = ok();
    lost.push(Err(Arc::new(Error::redis(
        "the acknowledgement's reply was lost",
        redis::RedisError::from(std::io::Error::other("connection reset")),
    ))));
    drive_acks(reads(), lost).await;
    assert_eq!(missing_counted(&snapshotter), batch + 1, "failed");
}

/// A read sent ahead that the worker gives up before using it (the
/// batch's acknowledgement is refused: the worker exits) still reports
/// what its check found gone from the stream, once it answers: that read
/// acknowledged those entries, and nothing else would ever report them.
#[tokio::test(start_paused = true)]
async fn a_read_sent_ahead_and_given_up_still_reports_the_entries_it_found_missing() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // The test's runtime runs on this thread.
    let _local = metrics::set_default_local_recorder(&recorder);
    let n = PRIMARY_BATCH;
    let io = Scripted {
        reads: Mutex::new(vec![empty(), entries(n), reclaimed()].into()),
        acks: Mutex::new(vec![Ok(Acked::Refused(Refusal::FencedOut))].into()),
        reads_ahead: true,
        ..Scripted::default()
    };
    let (exit, calls, worker) = drive_io(shared_acking(n), io, false, None).await;
    assert_eq!(exit, Exit::Lost(Refusal::FencedOut), "{calls:?}");
    assert!(
        calls.iter().any(|(c, _)| *c == Call::ReadAhead(n)),
        "{calls:?}"
    );
    assert!(
        !calls.iter().any(|(c, _)| *c == Call::ReadAheadRan),
        "not used: {calls:?}"
    );
    // The batch's own entries are gone from the stream (no fields).
    assert_eq!(missing_counted(&snapshotter), n as u64);
    drop(worker);
    // The read answers a second after it was sent.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(missing_counted(&snapshotter), 1, "the one it found");
}

/// A paused handler's probe, admitted at once, whose lease deadline passes
/// before it is dispatched is given back: another key may probe. (Kept,
/// the handler would wait for a probe that never runs.)
#[tokio::test(start_paused = true)]
async fn a_probe_given_up_at_the_lease_deadline_lets_another_key_probe() {
    use convoy_core::broker::outage::Admission;
    let mut config = Config::default();
    config.server.retry.initial_backoff_ms = 1;
    config.server.retry.outage_threshold = 1;
    let s = shared_configured("redis://127.0.0.1:1/", HOUR, config);
    s.outage.failed("k9", false, "the dependency is down");
    // The first probe is due a millisecond after the pause (the outage's
    // clock is the system's, not tokio's paused one).
    std::thread::sleep(Duration::from_millis(20));
    let envelope = Envelope {
        id: "m1".into(),
        type_name: "T".into(),
        category: "c".into(),
        partition_key: Some("k1".into()),
        time_ms: 1,
        priority: convoy_core::envelope::Priority::Normal,
        correlation_id: None,
        payload: "{}".into(),
        origin: None,
        replay: None,
    };
    let entry = Entry {
        id: "1-0".into(),
        fields: Some(
            envelope
                .to_fields()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.into_bytes()))
                .collect(),
        ),
    };
    let at = At {
        lane: 0,
        backfill: false,
    };
    let expire = s.clone();
    let io = Scripted {
        reads: Mutex::new(vec![empty(), Ok(ReadReply::Entries(at, vec![entry]))].into()),
        // The lease runs out while the entry read is handled.
        after_read: Some(Box::new(move |reply| {
            if matches!(reply, Ok(ReadReply::Entries(..))) {
                expire.liveness.set_deadline(0, None);
            }
        })),
        ..Scripted::default()
    };
    let (exit, calls, _) = drive_io(s.clone(), io, false, None).await;
    assert_eq!(exit, Exit::Expired, "{calls:?}");
    assert_eq!(
        s.outage.try_admit(),
        Some(Admission::Probe),
        "the probe given back"
    );
}
