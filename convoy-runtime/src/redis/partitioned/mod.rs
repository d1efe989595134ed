//! The partitioned consumer of one handler on one engine instance.
//!
//! The [`Coordinator`] discovers units, takes and renews their leases,
//! shares them fairly with the other live instances, and runs one
//! [`worker`] per owned unit.

mod acks;
mod worker;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::connection::Connection;
use super::reply::{int, text};
use super::scripts::acquire::{self, Acquire, Acquired};
use super::scripts::release::{Held, Release, Released};
use super::unit::Unit;
use super::wake;
use crate::backoff::Backoff;
use crate::broker::{ConsumerPlan, Subscription};
use crate::envelope::now_ms;
use crate::error::{Error, chain};
use crate::handler::Fence;
use crate::key::Escaped;
use crate::names::{self, CORRELATION_SCOPE};

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Monotonic milliseconds since the first call (keeps running while the
/// process is stopped, so a stalled owner sees its deadline passed).
pub(crate) fn mono_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

/// What every worker of one subscription shares.
pub(crate) struct Shared {
    pub(crate) redis: Arc<Connection>,
    pub(crate) plan: Arc<ConsumerPlan>,
    pub(crate) index: usize,
    pub(crate) owner: String,
    pub(crate) permits: Semaphore,
    pub(crate) exits: mpsc::UnboundedSender<WorkerExit>,
    /// This instance's liveness key for the group.
    pub(crate) alive: String,
    /// The value the liveness key holds: new every time this instance
    /// registers (at start and after its liveness lapsed), so leases taken
    /// in an earlier incarnation are dead for everyone even though the
    /// liveness key exists again.
    incarnation: Mutex<Arc<str>>,
    /// The local lease deadline (monotonic ms) shared by every unit: the
    /// time the last successful liveness renewal was sent, plus the TTL,
    /// minus a margin. No worker starts an event past it.
    pub(crate) deadline: AtomicU64,
    /// Where workers queue their fenced acknowledgements.
    pub(crate) acks: mpsc::UnboundedSender<acks::AckRequest>,
}

impl Shared {
    /// The current incarnation (see the field).
    pub(crate) fn incarnation(&self) -> Arc<str> {
        match self.incarnation.lock() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set_incarnation(&self, inc: Arc<str>) {
        match self.incarnation.lock() {
            Ok(mut g) => *g = inc,
            Err(poisoned) => *poisoned.into_inner() = inc,
        }
    }

    pub(crate) fn sub(&self) -> &Subscription {
        &self.plan.subscriptions[self.index]
    }

    pub(crate) fn group(&self) -> &'static str {
        self.sub().name
    }

    /// The first category (for logs and metrics).
    pub(crate) fn category(&self) -> &'static str {
        self.sub().category
    }

    /// Every category a unit spans.
    pub(crate) fn categories(&self) -> &[&'static str] {
        &self.sub().categories
    }

    /// The unit `key` of this subscription, with its names.
    pub(crate) fn unit(&self, key: &str) -> Unit {
        let lanes = &self.plan.config.server.priority_lanes;
        Unit::new(
            self.group(),
            self.sub().scope,
            key,
            self.categories().iter().copied(),
            &lanes.backfill_suffix,
            lanes.enabled,
        )
    }

    /// Warn when a category has more live partitions.
    fn warning_threshold(&self) -> u64 {
        self.plan
            .config
            .server
            .partitioning
            .partition_warning_threshold
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.plan.config.server.partitioning.lease_ttl()
    }

    /// The local deadline of a lease renewed (or taken) at `sent` ms: the
    /// TTL minus a safety margin.
    pub(crate) fn deadline_from(&self, sent: u64) -> u64 {
        let ttl = self.ttl().as_millis() as u64;
        let margin = (ttl / 10).max(50).min(ttl / 2);
        sent + ttl - margin
    }
}

/// A worker's end, as it reports it to the coordinator.
pub(crate) struct WorkerExit {
    pub(crate) key: String,
    pub(crate) token: String,
    /// The lease may still be held with this token (its release failed).
    pub(crate) maybe_held: bool,
}

/// A running unit worker, as the coordinator sees it.
pub(crate) struct UnitHandle {
    pub(crate) token: String,
    pub(crate) wake: Arc<Notify>,
    pub(crate) stop: CancellationToken,
    pub(crate) idle: Arc<AtomicBool>,
    pub(crate) task: JoinHandle<()>,
}

/// Discovers, leases and shares the units of one handler.
pub(crate) struct Coordinator {
    shared: Arc<Shared>,
    exits: mpsc::UnboundedReceiver<WorkerExit>,
    acks: Option<mpsc::UnboundedReceiver<acks::AckRequest>>,
    units: HashMap<String, UnitHandle>,
    /// Keys found held by another live instance, and when: not probed
    /// again for a lease TTL (unless released meanwhile).
    elsewhere: HashMap<String, Instant>,
    /// Keys whose lease this instance may hold without a worker (a
    /// release failed, or the reply to a lease-taking call was lost):
    /// released (if still this owner's) at the next heartbeat, so no lease
    /// of a live instance is left without a worker.
    orphans: HashSet<String>,
    live: usize,
    partitions: usize,
    warned: bool,
}

impl Coordinator {
    pub(crate) fn new(redis: Arc<Connection>, plan: Arc<ConsumerPlan>, index: usize) -> Self {
        let owner = plan.instance_id.clone();
        let (tx, rx) = mpsc::unbounded_channel();
        let alive = names::alive(plan.subscriptions[index].name, &owner);
        // Handlers of one subscription running at once on this instance.
        let in_flight = plan.config.concurrency(plan.subscriptions[index].name);
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        Coordinator {
            shared: Arc::new(Shared {
                redis,
                plan,
                index,
                owner,
                permits: Semaphore::new(in_flight),
                exits: tx,
                alive,
                incarnation: Mutex::new(Arc::from("")),
                deadline: AtomicU64::new(0),
                acks: acks_tx,
            }),
            acks: Some(acks_rx),
            exits: rx,
            units: HashMap::new(),
            elsewhere: HashMap::new(),
            orphans: HashSet::new(),
            live: 1,
            partitions: 0,
            warned: false,
        }
    }

    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let s = self.shared.clone();
        let group = s.group();
        let category = s.category();
        tracing::info!(handler = group, categories = ?s.categories(), owner = %s.owner, "partitioned consumer starting");
        let mut backoff = Backoff::reconnect();
        loop {
            match self.register().await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(handler = group, error = %chain(&e), "cannot register the consumer group; retrying");
                    if !backoff.wait_or_stop(&shutdown).await {
                        return;
                    }
                }
            }
        }
        if let Some(rx) = self.acks.take() {
            tokio::spawn(acks::run(s.redis.clone(), s.group(), s.alive.clone(), rx));
        }
        let (wake_tx, mut wake_rx) = mpsc::channel(64);
        let listener = tokio::spawn(wake::follow(
            s.redis.clone(),
            s.categories().iter().map(|c| (*c).to_owned()).collect(),
            wake_tx,
            shutdown.child_token(),
        ));
        let heartbeat = s.plan.config.server.partitioning.heartbeat_interval();
        let mut tick = tokio::time::interval(heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => self.cycle(&shutdown).await,
                Some(exit) = self.exits.recv() => self.on_exit(exit),
                msg = wake_rx.recv() => match msg {
                    Some(Some(keys)) => self.on_wake(keys, &shutdown).await,
                    Some(None) => {
                        for u in self.units.values() {
                            u.wake.notify_one();
                        }
                    }
                    None => {}
                },
            }
        }
        // Graceful shutdown: each worker finishes its event, acks, releases.
        for u in self.units.values() {
            u.stop.cancel();
        }
        for (_, u) in self.units.drain() {
            let _ = u.task.await;
        }
        let _ = listener.await;
        tracing::info!(handler = group, category, "partitioned consumer stopped");
    }

    fn on_exit(&mut self, exit: WorkerExit) {
        if exit.maybe_held {
            self.orphans.insert(exit.key.clone());
        }
        if self
            .units
            .get(&exit.key)
            .is_some_and(|u| u.token == exit.token)
        {
            self.units.remove(&exit.key);
        }
    }

    /// Registers the group for the category and declares this instance
    /// alive, in a new incarnation.
    async fn register(&self) -> Result<(), Error> {
        let s = &self.shared;
        let mut conn = s.redis.shared().await?;
        let sent = mono_ms();
        let inc: Arc<str> = Arc::from(uuid::Uuid::new_v4().simple().to_string());
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&s.alive)
            .arg(&*inc)
            .arg("PX")
            .arg(s.ttl().as_millis() as u64)
            .ignore();
        for c in s.categories() {
            pipe.cmd("SADD")
                .arg(names::groups(c))
                .arg(s.group())
                .ignore();
        }
        if s.sub().scope == CORRELATION_SCOPE {
            // Tells operators' tools how this group names its units.
            pipe.cmd("SET")
                .arg(names::scope(s.group()))
                .arg(CORRELATION_SCOPE)
                .ignore();
        }
        let _: () = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("failed to register the consumer group", e))?;
        s.set_incarnation(inc);
        s.deadline.store(s.deadline_from(sent), Ordering::SeqCst);
        Ok(())
    }

    fn prune(&mut self) {
        self.units.retain(|_, u| !u.task.is_finished());
    }

    async fn on_wake(&mut self, wakes: Vec<wake::Wake>, shutdown: &CancellationToken) {
        self.prune();
        let mut unknown = Vec::new();
        let mut seen = HashSet::new();
        for w in wakes {
            if w.released {
                self.elsewhere.remove(&w.key);
            }
            if !seen.insert(w.key.clone()) {
                continue;
            }
            if let Some(u) = self.units.get(&w.key) {
                u.wake.notify_one();
            } else if !self.elsewhere.contains_key(&w.key) {
                unknown.push(w.key);
            }
        }
        if unknown.is_empty() {
            return;
        }
        let target = fair_share(self.partitions + unknown.len(), self.live);
        let owned = self.owned();
        if owned < target {
            self.acquire(unknown, target - owned, shutdown).await;
        }
    }

    fn owned(&self) -> usize {
        self.units
            .values()
            .filter(|u| !u.stop.is_cancelled())
            .count()
    }

    /// One heartbeat: renew liveness, count live instances, discover,
    /// rebalance.
    async fn cycle(&mut self, shutdown: &CancellationToken) {
        self.prune();
        let s = self.shared.clone();
        let (renewed, members) = match self.heartbeat().await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(handler = s.group(), error = %chain(&e), "heartbeat failed; workers stop at the local lease deadline unless a later one succeeds");
                return;
            }
        };
        if !renewed {
            self.lapsed().await;
            return;
        }
        self.release_orphans().await;
        let ttl = s.ttl();
        self.elsewhere.retain(|_, at| at.elapsed() < ttl);
        self.partitions = members.len();
        let threshold = s.warning_threshold();
        let over = members.len() as u64 > threshold;
        if !over {
            self.warned = false;
        }
        if over && !self.warned {
            tracing::warn!(
                handler = s.group(),
                partitions = members.len(),
                threshold,
                "the category has more live partitions than partition_warning_threshold; per-key streams are meant for a bounded set of keys"
            );
            self.warned = true;
        }
        let target = fair_share(members.len(), self.live);
        let owned = self.owned();
        if owned < target {
            let mut candidates: Vec<String> = members
                .into_iter()
                .filter(|k| !self.units.contains_key(k) && !self.elsewhere.contains_key(k))
                .collect();
            shuffle(&mut candidates, &s.owner);
            // Try a sample bounded by the deficit: in a steady state the
            // deficit is at most one unit (rounding), so this stays cheap
            // however many partitions there are; after a crash, free units
            // are everywhere and a sample finds them.
            let deficit = target - owned;
            candidates.truncate((deficit * 2).max(64));
            self.acquire(candidates, deficit, shutdown).await;
        } else if owned > target {
            let mut surplus = owned - target;
            // Idle units first; a unit moves only after its worker finished
            // the event in flight and released the lease.
            for idle_first in [true, false] {
                for u in self.units.values() {
                    if surplus == 0 {
                        break;
                    }
                    if !u.stop.is_cancelled() && u.idle.load(Ordering::Relaxed) == idle_first {
                        u.stop.cancel();
                        surplus -= 1;
                    }
                }
            }
            tracing::debug!(handler = s.group(), owned, target, "released surplus units");
        }
        crate::metrics::owned(s.group(), self.owned());
    }

    /// Renews this instance's liveness (which keeps every lease it holds),
    /// registers it as live, counts live instances and reads the partition
    /// index: one round trip whatever the number of partitions. Returns
    /// whether the liveness key was still there to renew.
    async fn heartbeat(&mut self) -> Result<(bool, Vec<String>), Error> {
        let s = self.shared.clone();
        let mut conn = s.redis.shared().await?;
        let now = now_ms();
        let sent = mono_ms();
        let set = names::instances(s.group());
        let categories = s.categories();
        let mut pipe = redis::pipe();
        let inc = s.incarnation();
        pipe.cmd("SET")
            .arg(&s.alive)
            .arg(&*inc)
            .arg("XX")
            .arg("PX")
            .arg(s.ttl().as_millis() as u64)
            .arg("GET")
            .cmd("ZADD")
            .arg(&set)
            .arg(now + s.ttl().as_millis() as u64)
            .arg(&s.owner)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&set)
            .arg("-inf")
            .arg(now)
            .ignore()
            .cmd("ZCARD")
            .arg(&set);
        for c in categories {
            pipe.cmd("SMEMBERS")
                .arg(names::partition_index(c))
                .cmd("GET")
                .arg(names::published(c))
                .cmd("GET")
                .arg(names::acked(s.group(), c));
        }
        let replies: Vec<Value> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| Error::redis("heartbeat failed", e))?;
        // The liveness key held this incarnation: renewed. Missing: lapsed.
        // Another value: another process renews it under the same instance
        // id (and this call just overwrote it).
        let held = replies.first().and_then(text);
        let renewed = held.as_deref() == Some(&*inc);
        if let Some(other) = held.as_deref().filter(|h| *h != &*inc) {
            tracing::error!(handler = s.group(), owner = %s.owner, other, "another process renews this instance's liveness: two engines run with the same instance id; give each engine its own instance_id");
        } else if held.is_none() && mono_ms() < s.deadline.load(Ordering::SeqCst) {
            // The key should still be there: its TTL had not run out.
            crate::metrics::state_lost(s.group());
            tracing::error!(handler = s.group(), owner = %s.owner, "Redis lost convoy's state: this instance's liveness key vanished before its TTL ran out (Redis restarted without persistence, was flushed, or failed over to a replica that had not received it); events published before may be lost; fence generations still never repeat");
        }
        let live = replies.get(1).and_then(int).unwrap_or(1);
        self.live = live.max(1) as usize;
        // A unit is a key (a correlation value, for a process manager
        // spanning categories) present in any subscribed category's index.
        let threshold = s.warning_threshold();
        let mut members: Vec<String> = Vec::new();
        let mut seen = HashSet::new();
        for (i, c) in categories.iter().enumerate() {
            let base = 2 + i * 3;
            let keys_here: Vec<String> = match replies.get(base) {
                Some(Value::Array(items)) | Some(Value::Set(items)) => {
                    items.iter().filter_map(text).collect()
                }
                _ => Vec::new(),
            };
            crate::metrics::partitions(c, keys_here.len(), keys_here.len() as u64 > threshold);
            let published = replies.get(base + 1).and_then(int).unwrap_or(0);
            let acked = replies.get(base + 2).and_then(int).unwrap_or(0);
            crate::metrics::lag(s.group(), c, published - acked);
            for k in keys_here {
                if seen.insert(k.clone()) {
                    members.push(k);
                }
            }
        }
        if renewed {
            s.deadline.store(s.deadline_from(sent), Ordering::SeqCst);
        }
        Ok((renewed, members))
    }

    /// The liveness key expired before it was renewed (this instance was
    /// stalled or cut off past the TTL): other instances may own its units
    /// now. Stop every worker before its next event, wait for them, declare
    /// this instance alive again and start over.
    async fn lapsed(&mut self) {
        let s = self.shared.clone();
        tracing::warn!(handler = s.group(), owner = %s.owner, "liveness lapsed: this instance was stalled or cut off past lease_ttl_ms; giving up every unit and starting over");
        s.deadline.store(0, Ordering::SeqCst);
        for u in self.units.values() {
            u.stop.cancel();
            u.wake.notify_one();
        }
        crate::metrics::lost(s.group(), self.units.len());
        for (_, u) in self.units.drain() {
            let _ = u.task.await;
        }
        crate::metrics::owned(s.group(), 0);
        if let Err(e) = self.register().await {
            tracing::warn!(handler = s.group(), error = %chain(&e), "cannot declare this instance alive; retrying at the next heartbeat");
        }
    }

    /// Releases the leases this instance may hold without a worker (see
    /// `orphans`), whatever their generation; keeps those it could not.
    async fn release_orphans(&mut self) {
        if self.orphans.is_empty() {
            return;
        }
        let s = self.shared.clone();
        let keys: Vec<String> = self
            .orphans
            .drain()
            .filter(|k| !self.units.contains_key(k))
            .collect();
        let Ok(mut conn) = s.redis.shared().await else {
            self.orphans.extend(keys);
            return;
        };
        for key in keys {
            let unit = s.unit(&key);
            let released = Release {
                unit: &unit,
                held: Held::Owner(&s.owner),
            }
            .run(&mut conn)
            .await;
            match released {
                Ok(Released::Released) => {
                    tracing::info!(handler = s.group(), key = ?Escaped(&key), "released a lease this instance held without a worker");
                }
                Ok(Released::NotHeld) => {}
                Err(e) => {
                    tracing::warn!(handler = s.group(), key = ?Escaped(&key), error = %chain(&e), "releasing a lease held without a worker failed; retrying at the next heartbeat");
                    self.orphans.insert(key);
                }
            }
        }
    }

    /// Tries to take up to `max` of `candidates`; starts a worker for each
    /// unit taken.
    async fn acquire(&mut self, candidates: Vec<String>, max: usize, shutdown: &CancellationToken) {
        if candidates.is_empty() || max == 0 {
            return;
        }
        let s = self.shared.clone();
        let units: Vec<Unit> = candidates.iter().map(|k| s.unit(k)).collect();
        let mut conn = match s.redis.shared().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(handler = s.group(), error = %chain(&e), "cannot take leases now");
                return;
            }
        };
        // Who holds them: nothing is taken by this read.
        let holders = match acquire::holders(&mut conn, &units, &s.owner).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(handler = s.group(), error = %chain(&e), "cannot take leases now");
                return;
            }
        };
        let incarnation = s.incarnation();
        let taken = Acquire {
            group: s.group(),
            owner: &s.owner,
            incarnation: &incarnation,
            alive: &s.alive,
            max,
            units: &units,
            holders: &holders,
        }
        .run(&mut conn)
        .await;
        let results = match taken {
            Ok(Acquired::Units(results)) => results,
            Ok(Acquired::NotAlive) => {
                // This instance's liveness lapsed: the next heartbeat finds
                // that out and starts over in a new incarnation.
                tracing::warn!(
                    handler = s.group(),
                    "not taking leases: this instance's liveness lapsed"
                );
                return;
            }
            Err(e) => {
                // The call may have run: any of the candidates may now be
                // leased to this instance with no worker behind it.
                tracing::warn!(handler = s.group(), error = %chain(&e), "taking leases failed; releasing what it may have taken at the next heartbeat");
                self.orphans.extend(
                    candidates
                        .into_iter()
                        .filter(|k| !self.units.contains_key(k)),
                );
                return;
            }
        };
        for (unit, result) in units.into_iter().zip(results) {
            let Some(taken) = result else {
                self.elsewhere.insert(unit.key, Instant::now());
                continue;
            };
            let key = unit.key.clone();
            tracing::info!(handler = s.group(), key = ?Escaped(&key), generation = taken.generation, halted = taken.halted, "lease acquired");
            crate::metrics::acquired(s.group(), 1);
            let handle = worker::spawn(
                s.clone(),
                unit,
                Fence {
                    owner: s.owner.clone(),
                    generation: taken.generation,
                },
                taken.halted,
                taken.head,
                shutdown.child_token(),
            );
            self.units.insert(key, handle);
        }
    }
}

/// Units each of `live` instances should own out of `partitions`.
pub(crate) fn fair_share(partitions: usize, live: usize) -> usize {
    partitions.div_ceil(live.max(1))
}

/// A cheap deterministic shuffle, different per instance, so instances
/// competing for free units mostly try different ones first.
fn shuffle(v: &mut [String], seed: &str) {
    let mut x: u64 = seed.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) ^ now_ms();
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_share_rounds_up() {
        assert_eq!(fair_share(100, 3), 34);
        assert_eq!(fair_share(100, 1), 100);
        assert_eq!(fair_share(0, 2), 0);
        assert_eq!(fair_share(5, 0), 5);
    }
}
