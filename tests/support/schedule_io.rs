//! What the randomized fault-schedule tests (`fault_schedules.rs`,
//! `cluster_fault_schedules.rs`) do alike around a schedule: the handler's
//! recorded work, the engines' configuration, raising the events spread
//! over the fault phase, draining, reading back what the handlers recorded,
//! the timeline on the record server's clock, and the evidence of a
//! failure.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use convoy_runtime::testing::{Recorder, RedisServer, Window};
use convoy_runtime::{Config, Context, Domain, Event, HandlerError};
use serde::de::DeserializeOwned;

use super::record::Record;
use super::schedule_run::{Ran, report_tail};
use crate::faults::Rng;

/// What a schedule publishes and how its handler works; drawn from the
/// seed.
#[derive(Debug, Clone)]
pub struct Workload {
    pub keys: usize,
    pub per_key: u64,
    pub reap_idle_ms: u64,
    pub fail_percent: u64,
    /// The handler's work, ms, from .. to.
    pub work_ms: (u64, u64),
    /// Percent of units of work that raise a burst of events at once.
    pub burst_percent: u64,
}

impl Workload {
    /// Drawn from `r`, with from `per_key.0` to `per_key.1` events a key.
    pub fn draw(r: &mut Rng, per_key: (u64, u64)) -> Self {
        Workload {
            keys: r.range(8, 16) as usize,
            per_key: r.range(per_key.0, per_key.1),
            reap_idle_ms: *r.pick(&[300, 1000, 3_600_000]),
            fail_percent: *r.pick(&[0, 2, 5]),
            work_ms: *r.pick(&[(1, 8), (1, 8), (5, 30)]),
            burst_percent: *r.pick(&[0, 5, 15]),
        }
    }

    /// The keys: `k00`, `k01`, …
    pub fn key_names(&self) -> Vec<String> {
        (0..self.keys).map(|k| format!("k{k:02}")).collect()
    }

    /// How a schedule of `seed` spreads the events of `keys` over `phase`.
    pub fn spread<'a>(&self, seed: u64, keys: &'a [String], phase: Duration) -> Spread<'a> {
        Spread::new(seed, keys, self.per_key, self.burst_percent, phase)
    }

    /// For a report.
    pub fn describe(&self) -> String {
        format!(
            "{} keys x {} events, {}% bursts, work {:?} ms, reap_idle_ms {}, {}% first attempts fail",
            self.keys,
            self.per_key,
            self.burst_percent,
            self.work_ms,
            self.reap_idle_ms,
            self.fail_percent
        )
    }
}

/// What a schedule's handler does with an attempt: records enter and exit
/// of every event in the record server, labelled
/// `{instance}/p{process}@{generation}`, and works a few ms in between.
/// Fails the first attempt of a few events (before entering) to exercise
/// retries.
pub struct Attempts {
    pub record: Record,
    /// `{instance}/p{process}`.
    pub instance: String,
    pub seed: u64,
    pub fail_percent: u64,
    /// The handler's work, ms, from .. to.
    pub work_ms: (u64, u64),
    /// Whether the schedule may take the handlers' dependency down (see
    /// `Record::dependency_down`): every key fails transiently meanwhile.
    pub dependency: bool,
}

impl Attempts {
    /// The work of `load` in a schedule of `seed`, recorded in `record`
    /// as `instance` (`{instance}/p{process}`).
    pub fn new(
        record: Record,
        instance: String,
        seed: u64,
        load: &Workload,
        dependency: bool,
    ) -> Self {
        Attempts {
            record,
            instance,
            seed,
            fail_percent: load.fail_percent,
            work_ms: load.work_ms,
            dependency,
        }
    }

    /// One attempt at the `seq`-th event of `key`.
    pub async fn handle(&self, key: &str, seq: u64, ctx: &Context) -> Result<(), HandlerError> {
        // The window starts when the engine dispatched the attempt (read
        // before its last lease check), not at this line: a process stopped
        // between the two runs this line only after it is resumed, and that
        // is the event it already had in flight, not a new one.
        let invoked = ctx.dispatched_at();
        let id = event_id(key, seq);
        let mut rng = Rng::new(self.seed ^ hash(&id));
        if self.dependency && self.record.dependency_down().await {
            // The schedule's dependency outage: every key fails
            // transiently, none may halt, the handler pauses and resumes.
            return Err(HandlerError::transient(std::io::Error::other(format!(
                "dependency down while handling {id}"
            ))));
        }
        if ctx.attempt() == 1 && rng.chance(self.fail_percent) {
            return Err(HandlerError::msg(format!("transient failure of {id}")));
        }
        let generation = ctx.fence().map_or(0, |f| f.generation);
        let label = format!("{}@{generation}", self.instance);
        let entered = self
            .record
            .enter(key, &id, &label, invoked)
            .await
            .map_err(HandlerError::msg)?;
        tokio::time::sleep(rng.ms(self.work_ms.0, self.work_ms.1)).await;
        // Read before the exit call: a stop between here and the exit's
        // script leaves the work's end where it was.
        let worked = SystemTime::now();
        self.record
            .exit(entered, worked)
            .await
            .map_err(HandlerError::msg)
    }
}

/// FNV-1a: an event's own stream of random numbers.
pub fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The engines' and the publisher's configuration: short leases, fast
/// polls, many quick retries.
pub fn config(
    url: &str,
    lease_ttl_ms: u64,
    heartbeat_s: f64,
    reap_idle_ms: u64,
    max_unacked: usize,
) -> Config {
    let mut c = Config::default();
    c.broker.url = url.to_owned();
    let p = &mut c.server.partitioning;
    p.lease_ttl_ms = lease_ttl_ms;
    p.heartbeat_interval_seconds = Some(heartbeat_s);
    p.poll_interval_seconds = 0.05;
    p.reap_idle_ms = reap_idle_ms;
    p.max_unacked = max_unacked;
    c.server.retry.max_retries = 50;
    c.server.retry.initial_backoff_ms = 10;
    c.server.retry.max_backoff_ms = 100;
    // Small publish batches: a burst goes out as several batches, one in
    // flight behind another (the pipelined publish under every fault).
    c.outbox.batch = 8;
    c
}

/// What a schedule publishes: `per_key` events for each key, in per-key
/// order, interleaved across keys; mostly one to three per unit of work,
/// `burst_percent` of them a burst of 10 to 40 (so keys get a backlog:
/// batched reads, and acknowledgements of several events).
pub struct Spread<'a> {
    pub seed: u64,
    pub keys: &'a [String],
    pub per_key: u64,
    pub burst_percent: u64,
    /// The events are spread over this long.
    pub phase: Duration,
    /// Events of each key committed at once before the spread ones (a
    /// backlog: the key's first events, one unit of work per key), so
    /// its owner reads whole batches of new entries.
    pub backlog: u64,
}

impl<'a> Spread<'a> {
    pub fn new(seed: u64, keys: &'a [String], per_key: u64, burst: u64, phase: Duration) -> Self {
        Spread {
            seed,
            keys,
            per_key,
            burst_percent: burst,
            phase,
            backlog: 0,
        }
    }

    /// The same spread after a backlog of `per_key` events per key.
    pub fn after_backlog(self, per_key: u64) -> Self {
        Spread {
            backlog: per_key,
            ..self
        }
    }
}

/// The id a schedule records for the `seq`-th event of `key`.
pub fn event_id(key: &str, seq: u64) -> String {
    format!("{key}#{seq}")
}

/// Raises `spread`'s events, committing each unit of work; returns the ids
/// ([`event_id`]) of what `commit` returned Ok for, per key, in publish
/// order. An event is built from its serde shape `{"client_id": key,
/// "seq": seq}`, which every schedule's event type has.
pub async fn publish_spread<E: Event + DeserializeOwned>(
    domain: &Domain,
    spread: &Spread<'_>,
) -> BTreeMap<String, Vec<String>> {
    let event = |key: &str, seq: u64| -> E {
        serde_json::from_value(serde_json::json!({ "client_id": key, "seq": seq }))
            .expect("a schedule's event is {client_id, seq}")
    };
    let mut rng = Rng::new(spread.seed).fork(3);
    let mut committed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for key in spread.keys.iter().filter(|_| spread.backlog > 0) {
        let mut uow = domain.unit_of_work();
        for seq in 0..spread.backlog {
            uow.raise(event(key, seq)).expect("raise");
        }
        if uow.commit().await.is_ok() {
            committed
                .entry(key.clone())
                .or_default()
                .extend((0..spread.backlog).map(|seq| event_id(key, seq)));
        }
    }
    let per_key = spread.backlog + spread.per_key;
    let mut left: Vec<(String, u64)> = spread
        .keys
        .iter()
        .map(|k| (k.clone(), spread.backlog))
        .collect();
    let total = spread.keys.len() as u64 * spread.per_key;
    let mut raised = 0u64;
    let start = Instant::now();
    while raised < total {
        let mut uow = domain.unit_of_work();
        let mut batch = Vec::new();
        let n = if rng.chance(spread.burst_percent) {
            rng.range(10, 40)
        } else {
            rng.range(1, 3)
        };
        for _ in 0..n {
            let open: Vec<usize> = (0..left.len()).filter(|&i| left[i].1 < per_key).collect();
            if open.is_empty() {
                break;
            }
            let i = *rng.pick(&open);
            let (key, seq) = (left[i].0.clone(), left[i].1);
            left[i].1 += 1;
            uow.raise(event(&key, seq)).expect("raise");
            batch.push((key, seq));
        }
        raised += batch.len() as u64;
        if uow.commit().await.is_ok() {
            for (key, seq) in batch {
                committed
                    .entry(key.clone())
                    .or_default()
                    .push(event_id(&key, seq));
            }
        }
        let due = spread.phase.mul_f64(raised as f64 / total as f64);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    committed
}

/// Every key's processing windows (committed keys and any other key
/// seen), each key's in start order: a stalled owner's in-flight event
/// writes its enter record only after it is resumed.
pub async fn windows(
    recorder: &Recorder,
    committed: &BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<Window>> {
    let mut keys: Vec<String> = committed.keys().cloned().collect();
    if let Ok(seen) = recorder.seen_all().await {
        keys.extend(seen.into_keys());
    }
    keys.sort();
    keys.dedup();
    let mut out = BTreeMap::new();
    for key in keys {
        let mut w = recorder
            .windows_of(&key)
            .await
            .expect("record server windows");
        w.sort_by_key(|w| w.start_us);
        out.insert(key, w);
    }
    out
}

/// How many committed events were handled to completion (entered and
/// exited) at least once.
pub fn completed(
    committed: &BTreeMap<String, Vec<String>>,
    windows: &BTreeMap<String, Vec<Window>>,
) -> usize {
    committed
        .iter()
        .map(|(k, ids)| {
            let ws = windows.get(k).map(Vec::as_slice).unwrap_or_default();
            ids.iter()
                .filter(|id| ws.iter().any(|w| &w.event == *id && w.end_us != u64::MAX))
                .count()
        })
        .sum()
}

/// Drains after healing: until the publisher's outbox is empty and every
/// committed event completed, at most `limit`, or until nothing completed
/// for `stuck`; then waits a little for late re-runs (a stalled owner's, a
/// redelivery). Whether it drained, and when it started.
pub async fn drain(
    publisher: &Domain,
    recorder: &Recorder,
    committed: &BTreeMap<String, Vec<String>>,
    limit: Duration,
    stuck: Duration,
) -> (bool, Instant) {
    let events: usize = committed.values().map(Vec::len).sum();
    let drain_start = Instant::now();
    let mut last = (0usize, Instant::now());
    let mut drained = false;
    while drain_start.elapsed() < limit && last.1.elapsed() < stuck {
        let pending = publisher.outbox().pending(1).await.map_or(1, |p| p.len());
        let done = completed(committed, &windows(recorder, committed).await);
        if pending == 0 && done == events {
            drained = true;
            break;
        }
        if done > last.0 {
            last = (done, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Late re-runs (a stalled owner's, a redelivery) still show up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (drained, drain_start)
}

/// The timeline's line on a [`drain`].
pub fn drain_note(drained: bool, drain_start: Instant) -> String {
    format!(
        "drain {} after {:.1} s",
        if drained { "complete" } else { "gave up" },
        drain_start.elapsed().as_secs_f64()
    )
}

/// What the publisher's outbox still holds.
pub async fn outbox_left(publisher: &Domain) -> usize {
    publisher
        .outbox()
        .pending(10_000)
        .await
        .map_or(0, |p| p.len())
}

/// The timeline of a schedule, on the record server's clock (several fault
/// threads may write to it).
#[derive(Clone)]
pub struct Notes {
    lines: Arc<Mutex<Vec<(u64, String)>>>,
    pub start_us: u64,
}

impl Notes {
    /// A timeline whose t = 0 is now on `clock`.
    pub fn start(clock: &mut redis::Connection) -> Self {
        Notes {
            lines: Arc::default(),
            start_us: record_time(clock),
        }
    }

    pub fn push(&self, clock: &mut redis::Connection, what: String) {
        let t = record_time(clock);
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((t, what));
    }

    pub fn text(&self) -> String {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner()).clone();
        lines.sort_by_key(|(t, _)| *t);
        let secs = self.start_us / 1_000_000;
        let mut out = vec![format!(
            "t=0 is {} µs of the record clock (unix) = {:02}:{:02}:{:02}.{:06} UTC, as in the engine logs",
            self.start_us,
            secs / 3600 % 24,
            secs / 60 % 60,
            secs % 60,
            self.start_us % 1_000_000
        )];
        for (t, what) in lines {
            let rel = t.saturating_sub(self.start_us);
            out.push(format!("{:>7.3}s {what}", rel as f64 / 1e6));
        }
        out.join("\n")
    }
}

/// µs of the record server's clock (the clock of the windows).
pub fn record_time(clock: &mut redis::Connection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME")
        .query(clock)
        .expect("TIME on the record server");
    s * 1_000_000 + us
}

/// A connection to the record server for its clock.
pub fn record_clock(record: &RedisServer) -> redis::Connection {
    let clock = record
        .client()
        .expect("record client")
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("record connection");
    clock
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("record connection timeout");
    clock
}

/// The consumer group of the schedule's handler.
pub fn handler_group(domain: &Domain) -> &'static str {
    domain
        .registry()
        .handlers()
        .iter()
        .find(|d| d.name.ends_with("::FaultRecording"))
        .map_or("?", |d| d.name)
}

/// What convoy left in Redis (through `conn`, if there is one) for each of
/// `keys` of `category`, headed by `header(key)`, and the key's windows
/// (times from `start_us`).
#[allow(clippy::too_many_arguments)]
pub async fn key_evidence<C>(
    conn: Option<C>,
    group: &str,
    category: &str,
    keys: &[String],
    windows: &BTreeMap<String, Vec<Window>>,
    start_us: u64,
    header: impl Fn(&str) -> String,
) -> String
where
    C: redis::aio::ConnectionLike + Clone + Send,
{
    let mut out = String::new();
    for key in keys {
        out.push_str(&header(key));
        if let Some(mut c) = conn.clone() {
            let stream = super::names::stream(category, key);
            let unit = super::names::unit(group, category, key);
            let lease = super::names::lease(group, category, key);
            let cmds: Vec<Vec<&str>> = vec![
                vec!["GET", &lease],
                vec!["HGETALL", &unit],
                vec!["XLEN", &stream],
                vec!["XPENDING", &stream, group],
                vec!["XPENDING", &stream, group, "-", "+", "10"],
                vec!["XINFO", "GROUPS", &stream],
                vec!["XRANGE", &stream, "-", "+", "COUNT", "5"],
            ];
            for args in cmds {
                let mut cmd = redis::cmd(args[0]);
                for a in &args[1..] {
                    cmd.arg(*a);
                }
                let v: Result<redis::Value, _> = cmd.query_async(&mut c).await;
                out.push_str(&format!("{}\n  -> {v:?}\n", args.join(" ")));
            }
        }
        for w in windows.get(key).map(Vec::as_slice).unwrap_or_default() {
            let at = |us: u64| format!("{:.6}s", us.saturating_sub(start_us) as f64 / 1e6);
            out.push_str(&format!(
                "  window {} {} [{} .. {}]\n",
                w.instance,
                w.event,
                at(w.start_us),
                if w.end_us == u64::MAX {
                    "never exited".to_owned()
                } else {
                    at(w.end_us)
                }
            ));
        }
    }
    out
}

/// The end of a failed Redis schedule's report (its log directory holds
/// the evidence).
pub fn evidence_tail(ran: &Ran, replay: &str) -> String {
    report_tail(ran, "see the log directory", "logs and evidence", replay)
}

/// A failed Redis schedule's line in the final panic.
pub fn failure_line(ran: &Ran, max_unacked: usize, replay: &str) -> String {
    format!(
        "  seed {} (max_unacked {max_unacked}): {}\n    replay: {replay}",
        ran.seed,
        ran.violations.first().map_or("", String::as_str),
    )
}
