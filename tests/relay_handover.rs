//! A relay handover cannot publish a row twice, whatever the timing: the
//! three steps that produced duplicate stream entries, made deterministic.
//!
//! 1. The new leader (epoch 2) reads the pending rows R (it is then held
//!    up, as by a Redis outage, before it publishes them).
//! 2. The old leader (epoch 1), not yet aware it was replaced, publishes R
//!    and marks them published, then publishes its next batch R', whose
//!    first seq would trim R out of the broker's dedup set.
//! 3. The new leader publishes what it read.
//!
//! The new leader takes over in the broker (raises its epoch in every
//! shard) before it reads a row, so the old leader's batches are refused
//! by the epoch in step 2, and every row reaches its stream once.
//!
//! And the relay's loop with an election of the test's own (what any
//! shared outbox store provides): it publishes only under a term it holds.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use convoy_runtime::broker::Producer;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use convoy_runtime::broker::{Broker, Capabilities, ConsumerPlan, Publication, PublishError};
use convoy_runtime::config::PriorityLanesConfig;
use convoy_runtime::outbox::{
    Election, MemoryOutbox, OutboxProcessor, OutboxRecord, OutboxStats, OutboxStore, Term,
};
use convoy_runtime::testing::RedisServer;
use convoy_runtime::{BoxFuture, Envelope, Error};
use convoy_runtime::{CancellationToken, Priority};
use support::{Posted, names, publisher, test_config};
use tokio::sync::{Notify, Semaphore};

/// An outbox store over another: with `held`, its `pending` reads the
/// rows, then waits for the test to let it return them (a relay held up
/// between reading and publishing); with `election`, several processes
/// share it and elect its publisher.
struct Wrapped {
    inner: Arc<dyn OutboxStore>,
    held: Option<Held>,
    election: Option<Arc<dyn Election>>,
}

/// A relay held up: `read` fires when it has read the rows, `release`
/// lets it return them.
struct Held {
    read: Notify,
    release: Semaphore,
}

impl OutboxStore for Wrapped {
    fn append(&self, envelopes: Vec<Envelope>) -> BoxFuture<'_, Result<(), Error>> {
        self.inner.append(envelopes)
    }
    fn pending(&self, limit: usize) -> BoxFuture<'_, Result<Vec<OutboxRecord>, Error>> {
        Box::pin(async move {
            let rows = self.inner.pending(limit).await?;
            if let Some(held) = &self.held {
                held.read.notify_one();
                let permit = held.release.acquire().await.expect("semaphore open");
                permit.forget();
            }
            Ok(rows)
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
    fn election(&self) -> Option<Arc<dyn Election>> {
        self.election.clone()
    }
}

/// How many entries of each event (`client#seq`) the partition stream of
/// `key` holds.
async fn entries(redis: &RedisServer, key: &str) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for e in support::pg::stream_of(&redis.url(), key).await {
        *seen.entry(e.id()).or_default() += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_relay_cannot_publish_rows_its_successor_read_even_when_the_successor_is_held_up()
 {
    let redis = RedisServer::start().expect("start redis-server");
    let domain = publisher(test_config(&redis.url()), "relays");
    let store = domain.outbox().clone();
    let lanes = domain.config().server.priority_lanes.clone();
    let held = Arc::new(Wrapped {
        inner: store.clone(),
        held: Some(Held {
            read: Notify::new(),
            release: Semaphore::new(0),
        }),
        election: None,
    });
    let old = OutboxProcessor::new(
        store.clone(),
        domain.broker().clone(),
        lanes.clone(),
        "old",
        Arc::new(Notify::new()),
    );
    let new = Arc::new(OutboxProcessor::new(
        held.clone(),
        domain.broker().clone(),
        lanes,
        "new",
        Arc::new(Notify::new()),
    ));
    // Both relays publish under the outbox's shared name; the old leader's
    // epoch 1 has been seen by the broker before the handover.
    let shared = |epoch| Producer {
        name: "outbox/shared".into(),
        epoch,
    };
    let raise = |events: Vec<Posted>| {
        let domain = &domain;
        async move {
            let mut uow = domain.unit_of_work();
            for e in events {
                uow.raise(e).expect("raise");
            }
            uow.commit().await.expect("commit");
        }
    };
    // Keys in several shards: the take-over must cover every one.
    let keys = ["a", "b", "c", "d", "e"];
    let shards: std::collections::BTreeSet<u32> = keys.iter().map(|k| names::shard(k)).collect();
    assert!(
        shards.len() >= 3,
        "the keys span several shards: {shards:?}"
    );
    let round = |n: u64| keys.iter().map(|k| Posted::new(k, n)).collect::<Vec<_>>();
    raise(round(0)).await;
    old.process_batch_as(&shared(1))
        .await
        .expect("the old leader publishes before the handover");

    // 1. The new leader reads R and is held up.
    raise((1..4).flat_map(round).collect()).await;
    let hold = held.held.as_ref().expect("held");
    let reading = hold.read.notified();
    let successor = {
        let new = new.clone();
        tokio::spawn(async move { new.process_batch_as(&shared(2)).await })
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .expect("the new leader read the pending rows");

    // 2. The old leader publishes R, then R' (whose first seq trims R out
    //    of the dedup set).
    let first = old.process_batch_as(&shared(1)).await;
    raise((4..6).flat_map(round).collect()).await;
    let second = old.process_batch_as(&shared(1)).await;

    // 3. The new leader publishes what it read, then what is left.
    hold.release.add_permits(1_000);
    successor
        .await
        .expect("join")
        .expect("the new leader publishes");
    new.drain_as(&shared(2))
        .await
        .expect("the new leader drains");

    for key in keys {
        let seen = entries(&redis, key).await;
        let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "rows published under two stream entries: {twice:?} (old leader's batches: {first:?}, {second:?})"
        );
        assert_eq!(
            seen.keys().cloned().collect::<Vec<_>>(),
            (0..6).map(|n| format!("{key}#{n}")).collect::<Vec<_>>(),
            "every row reached its stream"
        );
    }
    for r in [first, second] {
        assert!(
            matches!(r, Err(Error::PublisherReplaced { newer: 2, .. })),
            "the old leader is refused by the epoch once its successor took over: {r:?}"
        );
    }
    // The epoch of an elected relay is kept for good, so a predecessor is
    // refused however late it wakes (a single publisher's expires).
    let mut conn = redis.connection().await.expect("connect");
    for shard in names::shards() {
        let key = convoy_runtime::redis::keys::producer_epoch(shard, "outbox/shared");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert_eq!(ttl, -1, "{key} exists and does not expire");
    }
    for key in keys {
        // Each entry carries its identity: the outbox's name and the row's
        // seq, increasing along the key's stream.
        let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(names::stream("ledger", key))
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .expect("XRANGE");
        let origins: Vec<convoy_runtime::Origin> = entries
            .ids
            .iter()
            .map(|e| {
                let wire: String = e.get("origin").expect("an origin field");
                convoy_runtime::Origin::parse(&wire).expect("producer#seq")
            })
            .collect();
        assert!(
            origins.iter().all(|o| o.producer == "outbox/shared"),
            "{origins:?}"
        );
        assert!(
            origins.windows(2).all(|w| w[0].seq < w[1].seq),
            "{origins:?}"
        );
        let in_order: Vec<String> = support::pg::stream_of(&redis.url(), key)
            .await
            .iter()
            .map(Posted::id)
            .collect();
        assert_eq!(
            in_order,
            (0..6).map(|n| format!("{key}#{n}")).collect::<Vec<_>>(),
            "the stream holds the key's rows once each, in commit order"
        );
    }
}

/// Records what it is asked to publish, as (epoch, seqs).
#[derive(Default)]
struct Seen(Mutex<Vec<(u64, Vec<u64>)>>);

impl Seen {
    fn all(&self) -> Vec<(u64, Vec<u64>)> {
        self.0.lock().expect("seen").clone()
    }
}

struct Recording(Arc<Seen>);

impl Broker for Recording {
    fn name(&self) -> &str {
        "recording"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    fn publish<'a>(
        &'a self,
        producer: &'a Producer,
        batch: &'a [Publication],
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        let seqs = batch.iter().map(|p| p.seq).collect();
        self.0.0.lock().expect("seen").push((producer.epoch, seqs));
        Box::pin(async { Ok(()) })
    }

    fn run(
        self: Arc<Self>,
        _plan: Arc<ConsumerPlan>,
        _shutdown: CancellationToken,
    ) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }
}

/// Wins while `open`; a term ends when `lose` is notified.
#[derive(Default)]
struct Toy {
    open: AtomicBool,
    lose: Arc<Notify>,
    epoch: AtomicU64,
    campaigns: Mutex<Vec<u64>>,
}

impl Election for Toy {
    fn prepare(&self) -> BoxFuture<'_, Result<String, Error>> {
        Box::pin(async { Ok("toy".to_owned()) })
    }

    fn campaign(&self, newest_seen: u64) -> BoxFuture<'_, Result<Option<Term>, Error>> {
        self.campaigns.lock().expect("campaigns").push(newest_seen);
        if !self.open.load(Ordering::SeqCst) {
            return Box::pin(async { Ok(None) });
        }
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let lose = self.lose.clone();
        Box::pin(async move {
            Ok(Some(Term::new(epoch, move |lost, resign| async move {
                tokio::select! {
                    _ = resign.cancelled() => {}
                    _ = lose.notified() => lost.cancel(),
                }
            })))
        })
    }

    fn standby(&self) -> Duration {
        Duration::from_millis(10)
    }
}

fn envelope(n: u64) -> Envelope {
    Envelope {
        id: format!("m{n}"),
        type_name: "T".into(),
        category: "c".into(),
        partition_key: Some("k".into()),
        time_ms: 0,
        priority: Priority::Normal,
        correlation_id: None,
        payload: "{}".into(),
        origin: None,
        replay: None,
    }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The relay with an election of the test's own: it publishes only while
/// it holds a term, under that term's epoch, stands by when the term is
/// lost, and campaigns again with the newest epoch it saw.
#[tokio::test]
async fn an_elected_relay_publishes_only_under_a_held_term_with_its_epoch_and_stands_by_after_losing_it()
 {
    let toy = Arc::new(Toy::default());
    let store = Arc::new(Wrapped {
        inner: Arc::new(MemoryOutbox::new()),
        held: None,
        election: Some(toy.clone()),
    });
    let seen = Arc::new(Seen::default());
    let wake = Arc::new(Notify::new());
    let processor = Arc::new(OutboxProcessor::new(
        store.clone(),
        Arc::new(Recording(seen.clone())),
        PriorityLanesConfig::default(),
        "i",
        wake.clone(),
    ));
    let shutdown = CancellationToken::new();
    let relay = tokio::spawn(processor.relay(shutdown.clone()));

    store.append(vec![envelope(0)]).await.expect("append");
    until("a few standby attempts", || {
        toy.campaigns.lock().expect("campaigns").len() >= 3
    })
    .await;
    assert!(seen.all().is_empty(), "a standby publishes nothing");

    toy.open.store(true, Ordering::SeqCst);
    until("the first term publishes", || !seen.all().is_empty()).await;
    assert!(
        seen.all().iter().all(|(epoch, _)| *epoch == 1),
        "{:?}",
        seen.all()
    );

    // The term is lost: nothing more is published until a new one.
    toy.open.store(false, Ordering::SeqCst);
    let before = toy.campaigns.lock().expect("campaigns").len();
    toy.lose.notify_one();
    until("campaigning again", || {
        toy.campaigns.lock().expect("campaigns").len() >= before + 3
    })
    .await;
    store.append(vec![envelope(1)]).await.expect("append");
    let records = store.records().await.expect("records");
    let second = records.last().expect("a record").seq;
    wake.notify_one();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let published: Vec<u64> = seen.all().into_iter().flat_map(|(_, s)| s).collect();
    assert!(
        !published.contains(&second),
        "published after the term was lost: {published:?}"
    );

    toy.open.store(true, Ordering::SeqCst);
    until("the second term publishes", || {
        seen.all().iter().any(|(_, s)| s.contains(&second))
    })
    .await;
    let last = seen.all().last().cloned().expect("a publish");
    assert_eq!(last.0, 2, "the second term's epoch");
    assert!(
        toy.campaigns
            .lock()
            .expect("campaigns")
            .iter()
            .all(|n| *n <= 1),
        "campaigns carry the newest epoch seen"
    );
    shutdown.cancel();
    relay.await.expect("the relay stops");
}
