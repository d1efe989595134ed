//! Shared test domain for the Redis integration tests: a `ledger` category
//! partitioned by `client_id`, a handler that records what it saw through
//! the testing kit's [`Recorder`], and helpers to publish and wait.
#![allow(dead_code, missing_docs, unreachable_pub)]

pub mod names;
pub mod pg;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use convoy_runtime::testing::{Recorder, RedisServer, Window};
use convoy_runtime::{
    Aggregate, Config, Context, Domain, EngineHandle, Event, HandlerError, Priority, event_handler,
};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "ledger")]
pub struct Ledger;

/// One posting for a client; `seq` counts per client from 0.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Ledger)]
pub struct Posted {
    pub client_id: String,
    pub seq: u64,
    /// The handler fails on this event every time.
    pub poison: bool,
}

impl Posted {
    pub fn new(client: &str, seq: u64) -> Self {
        Posted {
            client_id: client.to_owned(),
            seq,
            poison: false,
        }
    }

    pub fn id(&self) -> String {
        format!("{}#{}", self.client_id, self.seq)
    }
}

/// A ledger event without the key field: goes to the base `ledger` stream.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Ledger)]
pub struct Audited {
    pub note: String,
}

/// Records every event it handles, with its instance id, in Redis.
pub struct Recording {
    pub recorder: Recorder,
    pub instance: String,
    pub work: Duration,
    /// Keys whose events take `slow_work` instead (to hold a key in flight).
    pub slow_keys: HashSet<String>,
    pub slow_work: Duration,
    /// Also records into a per-instance namespace (to tell instances apart).
    pub per_instance: Option<Recorder>,
}

impl Recording {
    pub fn new(recorder: Recorder, instance: &str, work: Duration) -> Self {
        Recording {
            recorder,
            instance: instance.to_owned(),
            work,
            slow_keys: HashSet::new(),
            slow_work: work,
            per_instance: None,
        }
    }
}

#[event_handler(part_of = Ledger, sequential_by = "client_id")]
impl Recording {
    #[handle]
    async fn posted(&self, e: Posted, ctx: &Context) -> Result<(), HandlerError> {
        if e.poison {
            return Err(HandlerError::msg(format!("poison event {}", e.id())));
        }
        assert_eq!(ctx.partition_key(), Some(e.client_id.as_str()));
        let guard = self
            .recorder
            .enter(&e.client_id, &e.id(), &self.instance)
            .await?;
        let mine = match &self.per_instance {
            Some(r) => {
                let generation = ctx.fence().map(|f| f.generation).unwrap_or(0);
                let label = format!("{}@{generation}", self.instance);
                // The window starts at the engine's dispatch: a process
                // stopped after it runs this line only once resumed.
                Some(
                    r.enter_dispatched(&e.client_id, &e.id(), &label, ctx.dispatched_at())
                        .await?,
                )
            }
            None => None,
        };
        let work = if self.slow_keys.contains(&e.client_id) {
            self.slow_work
        } else {
            self.work
        };
        tokio::time::sleep(work).await;
        guard.exit().await?;
        if let Some(m) = mine {
            m.exit().await?;
        }
        Ok(())
    }
}

/// An ordinary (unpartitioned) handler on the same category, for events
/// that carry no key.
pub struct AuditLog {
    pub recorder: Recorder,
    pub instance: String,
}

#[event_handler(part_of = Ledger)]
impl AuditLog {
    #[handle]
    async fn audited(&self, e: Audited) -> Result<(), HandlerError> {
        let guard = self
            .recorder
            .enter("audit", &e.note, &self.instance)
            .await?;
        guard.exit().await?;
        Ok(())
    }
}

/// Fast timings for tests.
pub fn test_config(url: &str) -> Config {
    let mut c = Config::default();
    c.broker.url = url.to_owned();
    c.server.partitioning.lease_ttl_ms = 2000;
    c.server.partitioning.heartbeat_interval_seconds = Some(0.3);
    c.server.retry.max_retries = 2;
    c.server.retry.initial_backoff_ms = 20;
    c.server.retry.max_backoff_ms = 100;
    c
}

pub fn domain(config: Config, instance: &str, handler: Recording) -> Domain {
    let audit = AuditLog {
        recorder: handler.recorder.clone(),
        instance: instance.to_owned(),
    };
    Domain::builder()
        .config(config)
        .instance_id(instance)
        .handler(handler)
        .handler(audit)
        .init()
        .expect("domain init")
}

/// A domain that only publishes (no handlers of its own run).
pub fn publisher(config: Config, instance: &str) -> Domain {
    Domain::builder()
        .config(config)
        .instance_id(instance)
        .init()
        .expect("publisher init")
}

/// Interleaved events: `per_key` events for each of `keys` keys, round robin.
pub fn interleaved(keys: usize, per_key: u64) -> Vec<Posted> {
    let mut v = Vec::new();
    for seq in 0..per_key {
        for k in 0..keys {
            v.push(Posted::new(&format!("c{k}"), seq));
        }
    }
    v
}

/// What was published, per key, as the recorder's ids.
pub fn published(events: &[Posted]) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in events {
        m.entry(e.client_id.clone()).or_default().push(e.id());
    }
    m
}

/// Raises and commits events, then publishes the outbox.
pub async fn publish(domain: &Domain, events: &[Posted], priority: Priority) {
    let mut uow = domain.unit_of_work();
    for e in events {
        uow.raise_with_priority(e.clone(), priority).expect("raise");
    }
    uow.commit().await.expect("commit");
    publish_outbox(domain).await;
}

/// Publishes everything in the outbox now.
pub async fn publish_outbox(domain: &Domain) {
    relay(domain).drain().await.expect("publish");
}

/// Commits `events` (without publishing them).
pub async fn commit(domain: &Domain, events: &[Posted]) {
    let mut uow = domain.unit_of_work();
    for e in events {
        uow.raise_with_priority(e.clone(), Priority::Normal)
            .expect("raise");
    }
    uow.commit().await.expect("commit");
}

/// An outbox processor for `domain`'s outbox, as the engine's relay runs.
pub fn relay(domain: &Domain) -> convoy_runtime::outbox::OutboxProcessor {
    convoy_runtime::outbox::OutboxProcessor::new(
        domain.outbox().clone(),
        domain.broker().clone(),
        domain.config().server.priority_lanes.clone(),
        domain.instance_id(),
        Arc::new(tokio::sync::Notify::new()),
    )
}

/// Commits `events`, then publishes the outbox again until it went out, as
/// the engine's relay does: the time that took.
pub async fn publish_until_out(p: &Domain, events: &[Posted]) -> Duration {
    commit(p, events).await;
    let processor = relay(p);
    let started = Instant::now();
    while let Err(e) = processor.drain().await {
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "publishing never resumed: {e} ({e:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

/// Waits until `f` returns true, polling; panics with `what` on timeout.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether every published id was seen.
pub async fn all_seen(recorder: &Recorder, published: &BTreeMap<String, Vec<String>>) -> bool {
    let Ok(seen) = recorder.seen_all().await else {
        return false;
    };
    published.iter().all(|(k, ids)| {
        let s = seen.get(k);
        ids.iter().all(|id| s.is_some_and(|s| s.contains(id)))
    })
}

/// Total number of seen events across keys (0 while Redis is unreachable).
/// `server`'s clock (`TIME`), in µs since the epoch: the instant a test
/// stops an engine, on the clock the recorder's windows are read against
/// (the same host's).
pub async fn redis_time_us(server: &RedisServer) -> u64 {
    let mut c = server.connection().await.expect("conn");
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut c).await.expect("time");
    s * 1_000_000 + us
}

pub async fn seen_count(recorder: &Recorder) -> usize {
    match recorder.seen_all().await {
        Ok(seen) => seen.values().map(Vec::len).sum(),
        Err(_) => 0,
    }
}

/// An engine named `instance` on `url` whose [`Recording`] handler records
/// into `recorder` and does no work.
pub fn spawn_recording(url: &str, recorder: &Recorder, instance: &str) -> EngineHandle {
    spawn_recording_with(test_config(url), recorder, instance)
}

/// [`spawn_recording`] with `config`.
pub fn spawn_recording_with(config: Config, recorder: &Recorder, instance: &str) -> EngineHandle {
    domain(
        config,
        instance,
        Recording::new(recorder.clone(), instance, Duration::ZERO),
    )
    .engine()
    .spawn()
}

/// A child engine's [`Recording`] handler, from its environment: its
/// instance (`CONVOY_INSTANCE`) and a handler working `CONVOY_WORK_MS` that
/// records into namespace `CONVOY_NS` on `record_url` (markers kept for
/// `marker_ttl`), and also into `{ns}-{instance}`.
pub fn child_recording(record_url: &str, marker_ttl: Duration) -> (String, Recording) {
    let instance = std::env::var("CONVOY_INSTANCE").expect("CONVOY_INSTANCE");
    let ns = std::env::var("CONVOY_NS").expect("CONVOY_NS");
    let work: u64 = std::env::var("CONVOY_WORK_MS")
        .expect("work")
        .parse()
        .expect("ms");
    let rec = Recorder::new(record_url, ns.clone())
        .expect("recorder")
        .marker_ttl(marker_ttl);
    let mine = Recorder::new(record_url, format!("{ns}-{instance}")).expect("recorder");
    let mut handler = Recording::new(rec, &instance, Duration::from_millis(work));
    handler.per_instance = Some(mine);
    (instance, handler)
}

/// This test binary again, to run `child_engine` as `instance`, recording
/// into `ns`, working `work_ms` per event (see [`child_recording`]).
pub fn child_command(ns: &str, instance: &str, work_ms: u64) -> std::process::Command {
    let mut cmd = convoy_runtime::testing::current_test_command("child_engine").expect("command");
    cmd.env("CONVOY_INSTANCE", instance)
        .env("CONVOY_NS", ns)
        .env("CONVOY_WORK_MS", work_ms.to_string());
    cmd
}

/// The consumer group (handler name) of [`Recording`].
pub fn recording_group(url: &str) -> &'static str {
    publisher(test_config(url), "probe")
        .registry()
        .handlers()
        .iter()
        .find(|h| h.name.ends_with("::Recording"))
        .map(|h| h.name)
        .expect("Recording is registered")
}

/// Installs a debugging metrics recorder, the only one of the test binary
/// (call it once, first), and returns what reads its figures.
pub fn install_debugging_recorder() -> metrics_util::debugging::Snapshotter {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    snapshotter
}

/// What a stalled owner's in-flight event left in the records once it was
/// resumed: see [`set_aside_stalled_in_flight`].
#[derive(Debug, Default)]
pub struct LateInFlight {
    /// Per late record: the start of the overlap line it wrote on entry,
    /// and the end of the line written when another instance entered the
    /// key while its marker was up.
    lines: Vec<(String, String)>,
}

impl LateInFlight {
    /// `violations` without the lines the late records explain.
    pub fn other_overlaps(&self, violations: Vec<String>) -> Vec<String> {
        violations
            .into_iter()
            .filter(|v| {
                !self.lines.iter().any(|(entered, under)| {
                    v.starts_with(entered.as_str()) || v.ends_with(under.as_str())
                })
            })
            .collect()
    }
}

/// What `shared` saw ([`Recorder::seen_all`]) after checking what a
/// stalled owner did with its keys, with its one allowed late record left
/// out.
///
/// `stalled` lists each key with the label (`instance@generation`) the
/// owner held it at when it was stopped at `stopped_at_us` (µs since the
/// epoch, of the host's clock or of a Redis on the same host); in `shared`
/// the owner records as `instance`, and `per_instance` is its own recorder
/// ([`child_recording`]'s `{ns}-{instance}`, whose windows start at the
/// engine's dispatch).
///
/// At that generation the owner must have started no event after the
/// stop: its fenced read was refused or its local deadline had passed. It
/// may still finish the one event it had dispatched before the stop
/// (effects outside the fenced acknowledgement are the handler's to
/// fence). Stopped between that dispatch and the handler's first line, it
/// reaches `shared` only once resumed, after its successor re-ran that
/// event and went on. That late record ([`late_record`]), and only it, is
/// left out (the successor's run stays in), for the owner's last
/// dispatched event if it ran that event once in all. The overlap lines it
/// explains are returned with what was seen.
pub async fn seen_without_stalled_in_flight(
    shared: &Recorder,
    per_instance: &Recorder,
    stalled: &[(&str, &str)],
    instance: &str,
    stopped_at_us: u64,
) -> (BTreeMap<String, Vec<String>>, LateInFlight) {
    let mut seen = shared.seen_all().await.expect("seen");
    let mut late = LateInFlight::default();
    for &(key, label) in stalled {
        let windows = per_instance.windows_of(key).await.expect("windows");
        let mine: Vec<_> = windows.iter().filter(|w| w.instance == label).collect();
        for w in &mine {
            assert!(
                w.start_us < stopped_at_us,
                "stalled owner {label} started {} after it was stopped",
                w.event
            );
        }
        let Some(event) = mine.iter().max_by_key(|w| w.start_us).map(|w| &w.event) else {
            continue;
        };
        // Run by the owner once in all (at no other generation either).
        if windows.iter().filter(|w| &w.event == event).count() != 1 {
            continue;
        }
        let Some(list) = seen.get_mut(key) else {
            continue;
        };
        // `shared`'s windows of the key, in the order of its seen list (one
        // script appends to both).
        let entered = shared.windows_of(key).await.expect("windows");
        assert_eq!(
            entered.len(),
            list.len(),
            "one window per record of {key} in the shared recorder"
        );
        if let Some(i) = late_record(&entered, event, instance, stopped_at_us) {
            list.remove(i);
            late.lines.push((
                format!("instance {instance} entered event {event} for key {key} "),
                format!(" for key {key} while instance {instance} was in event {event}"),
            ));
        }
    }
    (seen, late)
}

/// Where, in `entered` (one key's windows in the shared recorder, in the
/// order they were entered), the late record of `event` by a stalled
/// `instance` is: its only entry of `event` at or after `stopped_at_us`,
/// with an earlier entry of `event` before it (its successor's: the
/// caller has checked that the owner ran the event once in all).
pub fn late_record(
    entered: &[Window],
    event: &str,
    instance: &str,
    stopped_at_us: u64,
) -> Option<usize> {
    let at: Vec<usize> = (0..entered.len())
        .filter(|&i| entered[i].event == event)
        .collect();
    let late: Vec<usize> = at
        .iter()
        .copied()
        .filter(|&i| entered[i].instance == instance && entered[i].start_us >= stopped_at_us)
        .collect();
    match late[..] {
        [i] if at.first().is_some_and(|&first| first < i) => Some(i),
        _ => None,
    }
}
