//! The partitioned consumer of one handler on one engine instance.
//!
//! The [`Coordinator`] discovers units, takes and renews their leases,
//! shares them fairly with the other live instances, and runs one
//! [`worker`] per owned unit.

mod acks;
mod heartbeat;
mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use redis::Value;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::connection::{Conn, Connection, query_by_slot, query_each_slot};
use super::layout;
use super::loss;
use super::reply::text;
use super::scripts::Replicated;
use super::scripts::acquire::{self, Acquire, Acquired};
use super::scripts::release::{Held, Release, Released};
use super::unit::Unit;
use super::wake;
use crate::tracing;
use convoy_core::backoff::Backoff;
use convoy_core::broker::outage::Outage;
use convoy_core::broker::{ConsumerPlan, Subscription};
use convoy_core::config::{Config, RetryConfig};
use convoy_core::envelope::now_ms;
use convoy_core::error::{Error, chain};
use convoy_core::handler::Fence;
use convoy_core::key::Escaped;
use convoy_core::names::{self, CORRELATION_SCOPE};

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Monotonic milliseconds since the first call (keeps running while the
/// process is stopped, so a stalled owner sees its deadline passed).
pub(crate) fn mono_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

/// What every worker of one subscription shares.
/// What the partitioned consumer reads of the configuration, read once
/// when it starts.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// `[server.partitioning] lease_ttl_ms`.
    pub(crate) lease_ttl: Duration,
    /// Between two heartbeats; also how long a shard's command may take
    /// within one before the others go on.
    pub(crate) heartbeat: Duration,
    /// How often an idle worker polls at most.
    pub(crate) poll: Duration,
    /// A unit idle this long is released (reaped).
    pub(crate) reap_idle: Duration,
    /// Handled but unacknowledged events per unit, at least 1.
    pub(crate) max_unacked: usize,
    /// Live partitions of a category above which a warning is logged.
    pub(crate) partition_warning: u64,
    /// `[server.retry]`.
    pub(crate) retry: RetryConfig,
}

impl Settings {
    fn of(config: &Config) -> Settings {
        let p = &config.server.partitioning;
        Settings {
            lease_ttl: p.lease_ttl(),
            heartbeat: p.heartbeat_interval(),
            poll: p.poll_interval(),
            reap_idle: p.reap_idle(),
            max_unacked: p.max_unacked.max(1),
            partition_warning: p.partition_warning_threshold,
            retry: config.server.retry.clone(),
        }
    }
}

pub(crate) struct Shared {
    pub(crate) redis: Arc<Connection>,
    pub(crate) plan: Arc<ConsumerPlan>,
    /// The configuration this consumer reads, read once.
    pub(crate) settings: Settings,
    pub(crate) index: usize,
    pub(crate) owner: String,
    pub(crate) permits: Semaphore,
    pub(crate) exits: mpsc::UnboundedSender<WorkerExit>,
    /// The shard count of the subscription's categories (one count: a
    /// process manager's categories must have the same).
    pub(crate) shards: u32,
    /// This instance's liveness key for the group, per shard (by index).
    pub(crate) alive: Arc<[String]>,
    /// The value the liveness key of each shard holds: new every time this
    /// instance registers (at start) or its liveness lapsed in the shard,
    /// so leases taken in an earlier incarnation are dead for everyone even
    /// though the liveness key exists again.
    incarnations: Mutex<Vec<Arc<str>>>,
    /// The local lease deadline (monotonic ms) of the units of each shard:
    /// the time the last successful liveness renewal in the shard was sent,
    /// plus the TTL, minus a margin. No worker starts an event past it. Per
    /// shard, so a failover of one master (every shard it serves failing
    /// its heartbeat) stops only the units of those shards.
    deadlines: Box<[AtomicU64]>,
    /// Where workers queue their fenced acknowledgements.
    pub(crate) acks: mpsc::UnboundedSender<acks::AckRequest>,
    /// The handler's transient failures on this instance: an outage
    /// pauses it (see [`Outage`]).
    pub(crate) outage: Outage,
}

impl Shared {
    /// The current incarnation in `shard` (see the field).
    pub(crate) fn incarnation(&self, shard: u32) -> Arc<str> {
        let g = match self.incarnations.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        g.get(shard as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }

    /// Starts a new incarnation in `shards`.
    fn new_incarnation(&self, shards: impl IntoIterator<Item = u32>) {
        let inc: Arc<str> = Arc::from(uuid::Uuid::new_v4().simple().to_string());
        let mut g = match self.incarnations.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        for shard in shards {
            if let Some(slot) = g.get_mut(shard as usize) {
                *slot = inc.clone();
            }
        }
    }

    /// The local lease deadline of `shard`'s units (monotonic ms; 0 when
    /// none).
    pub(crate) fn deadline(&self, shard: u32) -> u64 {
        self.deadlines
            .get(shard as usize)
            .map_or(0, |d| d.load(Ordering::SeqCst))
    }

    /// Moves `shard`'s deadline to that of a renewal sent at `sent` (0:
    /// passed).
    fn set_deadline(&self, shard: u32, sent: Option<u64>) {
        if let Some(d) = self.deadlines.get(shard as usize) {
            d.store(
                sent.map_or(0, |at| self.deadline_from(at)),
                Ordering::SeqCst,
            );
        }
    }

    /// This instance's liveness key in `shard`.
    pub(crate) fn alive(&self, shard: u32) -> &str {
        self.alive.get(shard as usize).map_or("", String::as_str)
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
            self.shards,
        )
    }

    /// Warn when a category has more live partitions.
    fn warning_threshold(&self) -> u64 {
        self.settings.partition_warning
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.settings.lease_ttl
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
    /// The coordinator asked it to stop and give the unit up (rebalancing).
    pub(crate) moving: bool,
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
    /// Workers of units given up when their shard's liveness lapsed, still
    /// finishing the event in flight: their keys are not taken again
    /// until they ended (no two workers of one key in this process), and
    /// the coordinator does not wait for them (the other shards' heartbeat
    /// goes on).
    draining: HashMap<String, JoinHandle<()>>,
    /// The shards this instance declared itself alive in (in the current
    /// incarnation): where it owns or tries to take units. Renewed every
    /// heartbeat, one key per shard.
    registered: BTreeSet<u32>,
    /// Where discovery reads the partition indexes next: a position (a
    /// category and a shard) and its SSCAN cursor (bounded work per
    /// heartbeat, however many partitions).
    scan: (u32, u64),
    /// Whether to run a full discovery: something may have freed units
    /// (start, another instance came or went, a reconnect). Cleared by a
    /// whole pass over the indexes that took nothing.
    rescan: bool,
    /// Units taken since the current pass over the indexes began.
    pass_taken: usize,
    /// Units in `units` being moved away (stopped by the coordinator, not
    /// yet ended).
    moving: usize,
    /// Heartbeats so far.
    heartbeats: u32,
    /// Full discovery goes on at least until then (leases of an instance
    /// that just went lapse with its liveness, maybe a little later).
    rescan_until: Option<Instant>,
    /// The live instances the last heartbeat saw.
    instances: Vec<String>,
    live: usize,
    partitions: usize,
    /// What the last heartbeat read of each (category, shard), by the
    /// category's place in the subscription.
    counts: HashMap<(usize, u32), Counts>,
    /// Whether the last heartbeat read every shard's counts: a count from
    /// a shard that did not answer is a guess, and an instance does not
    /// give units away on a guess (a failing shard's partitions counted
    /// as none would make it shed units of the healthy ones).
    counted: bool,
    /// Whether `convoy:paused:{group}:{owner}` may be set: the heartbeat
    /// deletes it once the handler is not paused (true at start, so a
    /// marker left by an earlier run under this instance id goes too).
    pause_marked: bool,
    warned: bool,
}

/// Heartbeats between two sweeps for workers that ended unreported.
const PRUNE_EVERY: u32 = 16;

/// The most index entries one heartbeat's discovery reads.
const SCAN_BUDGET: usize = 16_384;

/// How many index entries one SSCAN call asks for.
const SCAN_COUNT: usize = 1_024;

impl Coordinator {
    pub(crate) fn new(redis: Arc<Connection>, plan: Arc<ConsumerPlan>, index: usize) -> Self {
        let owner = plan.instance_id.clone();
        let (tx, rx) = mpsc::unbounded_channel();
        let sub = &plan.subscriptions[index];
        let shards = plan.config.broker.shards_of(sub.category);
        let alive: Arc<[String]> = (0..shards)
            .map(|s| names::alive(s, sub.name, &owner))
            .collect();
        // Handlers of one subscription running at once on this instance.
        let in_flight = plan.config.concurrency(plan.subscriptions[index].name);
        let outage = Outage::new(
            plan.subscriptions[index].name,
            &plan.config.server.retry,
            plan.health.clone(),
        );
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        Coordinator {
            shared: Arc::new(Shared {
                redis,
                settings: Settings::of(&plan.config),
                plan,
                index,
                owner,
                permits: Semaphore::new(in_flight),
                exits: tx,
                shards,
                alive,
                incarnations: Mutex::new(vec![Arc::from(""); shards as usize]),
                deadlines: (0..shards).map(|_| AtomicU64::new(0)).collect(),
                acks: acks_tx,
                outage,
            }),
            acks: Some(acks_rx),
            exits: rx,
            units: HashMap::new(),
            elsewhere: HashMap::new(),
            orphans: HashSet::new(),
            draining: HashMap::new(),
            registered: BTreeSet::new(),
            scan: (0, 0),
            rescan: true,
            pass_taken: 0,
            moving: 0,
            heartbeats: 0,
            rescan_until: None,
            instances: Vec::new(),
            pause_marked: true,
            live: 1,
            partitions: 0,
            counts: HashMap::new(),
            counted: false,
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
            tokio::spawn(acks::run(
                s.redis.clone(),
                s.group(),
                s.alive.clone(),
                Replicated::acknowledging(&s.plan.config.broker),
                rx,
            ));
        }
        let (wake_tx, mut wake_rx) = mpsc::channel(64);
        // One follower per category: their wake streams are in different
        // hash slots, which one blocking read cannot span on a cluster.
        let listeners: Vec<JoinHandle<()>> = s
            .categories()
            .iter()
            .map(|c| {
                tokio::spawn(wake::follow(
                    s.redis.clone(),
                    vec![(*c).to_owned()],
                    wake_tx.clone(),
                    shutdown.child_token(),
                ))
            })
            .collect();
        drop(wake_tx);
        let heartbeat = s.settings.heartbeat;
        let mut tick = tokio::time::interval(heartbeat);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tick.tick() => {
                    if self.cycle(&shutdown).await {
                        // Discovery has more to take: go on at once.
                        tick.reset_after(Duration::from_millis(5));
                    }
                }
                Some(exit) = self.exits.recv() => self.on_exit(exit),
                msg = wake_rx.recv() => match msg {
                    Some(Some(keys)) => self.on_wake(keys, &shutdown).await,
                    Some(None) => {
                        // Wake-ups may have been missed.
                        self.rescan_for(s.ttl());
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
        self.moving = 0;
        for (_, u) in self.units.drain() {
            let _ = u.task.await;
        }
        for (_, task) in self.draining.drain() {
            let _ = task.await;
        }
        for l in listeners {
            let _ = l.await;
        }
        tracing::info!(handler = group, category, "partitioned consumer stopped");
    }

    fn on_exit(&mut self, exit: WorkerExit) {
        if exit.maybe_held {
            self.orphans.insert(exit.key.clone());
        }
        // A worker given up on a lapse reports its end last: its event is
        // finished, so its key may be taken again.
        self.draining.remove(&exit.key);
        if self
            .units
            .get(&exit.key)
            .is_some_and(|u| u.token == exit.token)
            && let Some(u) = self.units.remove(&exit.key)
            && u.moving
        {
            self.moving -= 1;
        }
    }

    /// Registers the group for its categories (in every shard, and the
    /// categories' shard counts) and starts a new incarnation: this
    /// instance declares itself alive shard by shard, where it takes units
    /// ([`Coordinator::declare_alive`]).
    async fn register(&mut self) -> Result<(), Error> {
        let s = self.shared.clone();
        let mut conn = s.redis.shared().await?;
        for c in s.categories() {
            let configured = s.plan.config.broker.shards_of(c);
            if configured != s.shards {
                return Err(Error::Config {
                    file: s.plan.config.origin().to_owned(),
                    message: format!(
                        "{} reads categories {:?} with different shard counts ({c} has {configured}, {} has {}); the streams of one correlation value must share a hash slot: give them one count in [broker.category_shards]",
                        s.group(),
                        s.categories(),
                        s.category(),
                        s.shards
                    ),
                });
            }
            layout::check_shards(&mut conn, c, configured).await?;
        }
        query_by_slot(&mut conn, self.group_records())
            .await
            .map_err(|e| Error::redis("failed to register the consumer group", e))?;
        s.new_incarnation(0..s.shards);
        // The shards of the last incarnation get the new one at once, so
        // the leases taken before are dead for everyone now.
        let previous = std::mem::take(&mut self.registered);
        self.declare_alive(&mut conn, &previous).await
    }

    /// The commands that record the group for its categories in every
    /// shard (idempotent).
    fn group_records(&self) -> Vec<(String, redis::Cmd)> {
        let s = &self.shared;
        let mut cmds = Vec::new();
        for c in s.categories() {
            for shard in 0..s.shards {
                let set = names::groups(shard, c);
                let mut cmd = redis::cmd("SADD");
                cmd.arg(&set).arg(s.group());
                cmds.push((set, cmd));
            }
            let mut cmd = redis::cmd("SADD");
            cmd.arg(names::CATEGORIES).arg(*c);
            cmds.push((names::CATEGORIES.to_owned(), cmd));
        }
        if s.sub().scope == CORRELATION_SCOPE {
            // Tells operators' tools how this group names its units.
            let key = names::scope(s.group());
            let mut cmd = redis::cmd("SET");
            cmd.arg(&key).arg(CORRELATION_SCOPE);
            cmds.push((key, cmd));
        }
        cmds
    }

    /// Declares this instance alive, in each shard's current incarnation,
    /// in the `shards` it has not declared itself alive in yet (before it
    /// takes units there); the shards that answered get their deadline.
    async fn declare_alive(
        &mut self,
        conn: &mut Conn,
        shards: &BTreeSet<u32>,
    ) -> Result<(), Error> {
        let s = self.shared.clone();
        let new: Vec<u32> = shards.difference(&self.registered).copied().collect();
        if new.is_empty() {
            return Ok(());
        }
        let ttl = s.ttl().as_millis() as u64;
        let cmds = new
            .iter()
            .map(|shard| {
                let key = s.alive(*shard).to_owned();
                let mut cmd = redis::cmd("SET");
                cmd.arg(&key)
                    .arg(&*s.incarnation(*shard))
                    .arg("PX")
                    .arg(ttl);
                (key, cmd)
            })
            .collect();
        let sent = mono_ms();
        let mut failed = None;
        let within = s.settings.heartbeat;
        for (shard, r) in new.iter().zip(query_each_slot(conn, cmds, within).await) {
            match r {
                Ok(_) => {
                    s.set_deadline(*shard, Some(sent));
                    self.registered.insert(*shard);
                }
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => Err(Error::redis("failed to declare this instance alive", e)),
        }
    }

    /// Runs full discovery for at least `how_long`.
    fn rescan_for(&mut self, how_long: Duration) {
        self.rescan = true;
        self.rescan_until = Some(Instant::now() + how_long);
    }

    /// Drops the handles of workers that ended without reporting (a
    /// panicked worker sends no exit). O(units): every [`PRUNE_EVERY`]
    /// heartbeats, not on the wake-up path.
    fn prune(&mut self) {
        self.draining.retain(|_, task| !task.is_finished());
        let mut moved = 0;
        self.units.retain(|_, u| {
            let keep = !u.task.is_finished();
            if !keep && u.moving {
                moved += 1;
            }
            keep
        });
        self.moving -= moved;
    }

    async fn on_wake(&mut self, wakes: Vec<wake::Wake>, shutdown: &CancellationToken) {
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
        // The partitions known: the last heartbeat's count, or more when
        // units were taken or seen held since (new partitions' wake-ups
        // come before the next count), plus the new ones.
        let known = self.partitions.max(self.units.len() + self.elsewhere.len());
        let target = fair_share(known + unknown.len(), self.live);
        let owned = self.owned();
        if owned < target {
            self.acquire(unknown, target - owned, shutdown).await;
        }
    }

    /// Units this instance owns and keeps (not being moved away). O(1).
    fn owned(&self) -> usize {
        self.units.len() - self.moving
    }

    /// One heartbeat: renew liveness, count live instances, discover,
    /// rebalance.
    /// Returns whether to run again soon (not at the next tick): discovery
    /// is taking units and has more to find.
    async fn cycle(&mut self, shutdown: &CancellationToken) -> bool {
        self.heartbeats = self.heartbeats.wrapping_add(1);
        if self.heartbeats.is_multiple_of(PRUNE_EVERY) {
            self.prune();
        }
        let s = self.shared.clone();
        match self.heartbeat().await {
            Ok(lapsed) if lapsed.is_empty() => {}
            Ok(lapsed) => self.lapsed(lapsed).await,
            Err(e) => {
                tracing::warn!(handler = s.group(), error = %chain(&e), "heartbeat failed; workers stop at the local lease deadline unless a later one succeeds");
                return false;
            }
        }
        self.release_orphans().await;
        let ttl = s.ttl();
        self.elsewhere.retain(|_, at| at.elapsed() < ttl);
        let partitions = self.partitions;
        let threshold = s.warning_threshold();
        let over = partitions as u64 > threshold;
        if !over {
            self.warned = false;
        }
        if over && !self.warned {
            tracing::warn!(
                handler = s.group(),
                partitions,
                threshold,
                "the category has more live partitions than partition_warning_threshold; per-key streams are meant for a bounded set of keys"
            );
            self.warned = true;
        }
        let target = fair_share(partitions, self.live);
        let owned = self.owned();
        let mut again = false;
        if owned < target {
            // A full discovery after a change that may have freed units
            // (start, another instance came or went, a reconnect); else a
            // slow crawl of the indexes, a bounded step per heartbeat (the
            // deficit may be only rounding, with every unit held).
            let deficit = target - owned;
            let (want, budget, steps) = if self.rescan {
                (
                    deficit.saturating_mul(2).clamp(64, SCAN_BUDGET),
                    SCAN_BUDGET,
                    4,
                )
            } else {
                (deficit.saturating_mul(2).clamp(16, 256), SCAN_COUNT, 0)
            };
            match self.discover(want, budget, steps).await {
                Ok((mut candidates, wrapped)) => {
                    shuffle(&mut candidates, &s.owner);
                    self.acquire(candidates, deficit, shutdown).await;
                    let took = self.owned().saturating_sub(owned);
                    self.pass_taken += took;
                    if wrapped {
                        if self.pass_taken == 0
                            && self.rescan_until.is_none_or(|t| Instant::now() >= t)
                        {
                            self.rescan = false;
                        }
                        self.pass_taken = 0;
                    }
                    again = self.rescan && self.owned() < target;
                }
                Err(e) => {
                    tracing::warn!(handler = s.group(), error = %chain(&e), "discovery failed; retrying at the next heartbeat");
                }
            }
        } else if owned > target && self.counted {
            let mut surplus = owned - target;
            // Idle units first; a unit moves only after its worker finished
            // the event in flight and released the lease.
            for idle_first in [true, false] {
                for u in self.units.values_mut() {
                    if surplus == 0 {
                        break;
                    }
                    if !u.moving && u.idle.load(Ordering::Relaxed) == idle_first {
                        u.stop.cancel();
                        u.moving = true;
                        self.moving += 1;
                        surplus -= 1;
                    }
                }
            }
            tracing::debug!(handler = s.group(), owned, target, "released surplus units");
        }
        convoy_core::metrics::owned(s.group(), self.owned());
        again
    }

    /// Renews this instance's liveness in every shard it declared itself
    /// alive in (which keeps every lease it holds), registers it as live,
    /// counts live instances and the partitions (one `SCARD` per shard),
    /// and reads the lag counters: a fixed number of commands whatever the
    /// number of partitions. Each shard stands on its own: a shard that
    /// does not answer (its master failing over) renews nothing there and
    /// holds up no other. Returns the shards where this instance's
    /// liveness lapsed (its key was gone or held by another process).
    async fn heartbeat(&mut self) -> Result<BTreeSet<u32>, Error> {
        let s = self.shared.clone();
        let mut conn = s.redis.shared().await?;
        let now = now_ms();
        let sent = mono_ms();
        let ttl = s.ttl().as_millis() as u64;
        let set = names::instances(s.group());
        let mut pipe = heartbeat::Pipeline::default();
        for shard in &self.registered {
            pipe.renew(*shard, s.alive(*shard), &s.incarnation(*shard), ttl);
        }
        pipe.register(&set, &s.owner, now, ttl);
        let categories = s.categories();
        for (c, cat) in categories.iter().enumerate() {
            for shard in 0..s.shards {
                pipe.counts(
                    c,
                    shard,
                    names::partition_index(shard, cat),
                    names::published(shard, cat),
                    names::acked(shard, s.group(), cat),
                );
            }
        }
        // The handler's pause (an outage of its dependency) for the
        // operators' tools, expiring with the liveness; deleted once,
        // after the pause.
        let paused = names::paused(s.group(), &s.owner);
        match s.outage.paused_since_ms() {
            Some(since) => {
                let mut c = redis::cmd("SET");
                c.arg(&paused).arg(since).arg("PX").arg(ttl);
                pipe.also(paused, c);
                self.pause_marked = true;
            }
            None if self.pause_marked => {
                let mut c = redis::cmd("DEL");
                c.arg(&paused);
                pipe.also(paused, c);
                self.pause_marked = false;
            }
            None => {}
        }
        // A shard that does not answer within a heartbeat interval holds
        // up no other's renewal.
        let within = s.settings.heartbeat;
        let replies = pipe.send(&mut conn, within).await;
        // Each liveness key held this incarnation: renewed. Missing:
        // lapsed. Another value: another process renews it under the same
        // instance id (and this call just overwrote it). No answer: not
        // renewed; its units stop at the shard's deadline.
        let mut lapsed = BTreeSet::new();
        let mut failed: Vec<(u32, String)> = Vec::new();
        for (shard, reply) in replies.renewals() {
            let held = match reply {
                Ok(v) => text(v),
                Err(e) => {
                    failed.push((shard, e.to_string()));
                    continue;
                }
            };
            match held.as_deref() {
                Some(h) if h == &*s.incarnation(shard) => s.set_deadline(shard, Some(sent)),
                Some(other) => {
                    lapsed.insert(shard);
                    tracing::error!(handler = s.group(), owner = %s.owner, shard, other, "another process renews this instance's liveness: two engines run with the same instance id; give each engine its own instance_id");
                }
                None => {
                    lapsed.insert(shard);
                    if mono_ms() < s.deadline(shard) {
                        // The key should still be there: its TTL had not
                        // run out.
                        convoy_core::metrics::state_lost(s.group());
                        tracing::error!(handler = s.group(), owner = %s.owner, shard, "Redis lost convoy's state: this instance's liveness key vanished before its TTL ran out (Redis restarted without persistence, was flushed, or failed over to a replica that had not received it); events published before may be lost; fence generations still never repeat");
                    }
                }
            }
        }
        if !failed.is_empty() {
            let shards: Vec<u32> = failed.iter().map(|(shard, _)| *shard).collect();
            let error = &failed[0].1;
            tracing::warn!(
                handler = s.group(),
                ?shards,
                error,
                "heartbeat failed in these shards; their units stop at the local lease deadline unless a later heartbeat succeeds (the other shards' units go on)"
            );
        }
        match replies.instances() {
            Some(Ok(Value::Array(items))) => {
                let mut instances: Vec<String> = items.iter().filter_map(text).collect();
                instances.sort();
                if instances != self.instances {
                    // Another instance came (units may move to it) or went
                    // (its units are free once its liveness lapsed, about
                    // now).
                    self.rescan_for(s.ttl());
                    self.instances = instances;
                }
            }
            Some(Err(e)) => {
                tracing::warn!(handler = s.group(), error = %e, "cannot read the live instances; keeping the last count");
            }
            _ => {}
        }
        self.live = self.instances.len().max(1);
        // A unit is a key (a correlation value, for a process manager
        // spanning categories) present in any subscribed category's index;
        // for a process manager, the counts of its categories are added up
        // (a value in several is counted more than once): counting too many
        // only keeps instances looking for units, too few could leave one
        // unowned. A shard that did not answer counts as last seen.
        let threshold = s.warning_threshold();
        let mut partitions = 0usize;
        let mut counted = true;
        let mut totals = vec![(0u64, 0i64, 0i64); categories.len()];
        for (c, shard, seen) in replies.counts() {
            let last = self.counts.entry((c, shard)).or_default();
            match seen {
                Some(seen) => {
                    last.check_lost(&seen, s.group(), categories[c], shard);
                    *last = seen;
                }
                None => counted = false,
            }
            let t = &mut totals[c];
            t.0 += last.partitions;
            t.1 += last.published;
            t.2 += last.acked;
        }
        for (cat, (count, published, acked)) in categories.iter().zip(totals) {
            convoy_core::metrics::partitions(cat, count as usize, count > threshold);
            convoy_core::metrics::lag(s.group(), cat, published - acked);
            partitions += count as usize;
        }
        self.partitions = partitions;
        self.counted = counted;
        Ok(lapsed)
    }

    /// Up to `want` partition keys from the indexes that this instance
    /// neither owns nor knows to be held elsewhere, read with SSCAN from
    /// where the last call stopped (shard by shard, round and round): at
    /// most `budget` index entries, and one SSCAN call per shard and
    /// category times `rounds` (at least one call). Also returns whether
    /// the read came round to the first shard again (a pass ended).
    async fn discover(
        &mut self,
        want: usize,
        budget: usize,
        rounds: u32,
    ) -> Result<(Vec<String>, bool), Error> {
        let s = self.shared.clone();
        let mut conn = s.redis.shared().await?;
        let categories = s.categories();
        let positions = s.shards.saturating_mul(categories.len() as u32).max(1);
        let max_calls = positions.saturating_mul(rounds).max(1);
        let mut found = Vec::new();
        let mut seen = HashSet::new();
        let mut read = 0usize;
        let mut calls = 0u32;
        let mut wrapped = false;
        let mut failures = 0u32;
        let within = s.settings.heartbeat;
        while found.len() < want && read < budget && calls < max_calls {
            calls += 1;
            let (position, cursor) = self.scan;
            let category = categories[(position / s.shards) as usize % categories.len()];
            let index = names::partition_index(position % s.shards, category);
            let mut sscan = redis::cmd("SSCAN");
            sscan.arg(&index).arg(cursor).arg("COUNT").arg(SCAN_COUNT);
            let read_index = sscan.query_async::<(u64, Vec<Value>)>(&mut conn);
            let (next, members) = match tokio::time::timeout(within, read_index).await {
                Ok(Ok(r)) => r,
                failed => {
                    // A shard that does not answer is passed over (read
                    // again in the next pass), so the others are reached.
                    let error = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no reply within {within:?}"),
                    };
                    tracing::warn!(
                        handler = s.group(),
                        index,
                        error,
                        "cannot read a partition index now; going on with the next"
                    );
                    failures += 1;
                    if failures >= positions {
                        return Err(Error::redis(
                            "failed to read the partition indexes",
                            redis::RedisError::from(std::io::Error::other(error)),
                        ));
                    }
                    (0, Vec::new())
                }
            };
            read += members.len();
            // A member that is not UTF-8 (written by hand: keys are checked
            // when raised) cannot name a unit; it is passed over, not a
            // reason to stop scanning.
            let keys = members.iter().filter_map(text);
            for k in keys {
                if !self.units.contains_key(&k)
                    && !self.elsewhere.contains_key(&k)
                    && seen.insert(k.clone())
                {
                    found.push(k);
                }
            }
            self.scan = if next != 0 {
                (position, next)
            } else if position + 1 >= positions {
                wrapped = true;
                (0, 0)
            } else {
                (position + 1, 0)
            };
        }
        Ok((found, wrapped))
    }

    /// This instance's liveness key in `shards` expired before it was
    /// renewed (this instance was stalled or cut off past the TTL, or the
    /// shard's master failed over to a replica without it): other
    /// instances may own its units there now. Stop every worker of those
    /// shards before its next event (their keys are not taken again until
    /// they ended, see `draining`), and start a new incarnation there; the
    /// units of other shards go on.
    async fn lapsed(&mut self, shards: BTreeSet<u32>) {
        let s = self.shared.clone();
        tracing::warn!(handler = s.group(), owner = %s.owner, ?shards, "liveness lapsed: this instance was stalled or cut off past lease_ttl_ms (in these shards); giving up their units and starting over there");
        for shard in &shards {
            s.set_deadline(*shard, None);
        }
        let gone: Vec<String> = self
            .units
            .keys()
            .filter(|k| shards.contains(&s.unit(k).shard))
            .cloned()
            .collect();
        for key in &gone {
            if let Some(u) = self.units.remove(key) {
                u.stop.cancel();
                u.wake.notify_one();
                if u.moving {
                    self.moving -= 1;
                }
                // Not awaited here: a handler in flight may take longer
                // than the other shards' leases. The key is not taken
                // again until its worker ended.
                self.draining.insert(key.clone(), u.task);
            }
        }
        convoy_core::metrics::lost(s.group(), gone.len());
        convoy_core::metrics::owned(s.group(), self.owned());
        self.rescan_for(s.ttl());
        s.new_incarnation(shards.iter().copied());
        self.registered.retain(|shard| !shards.contains(shard));
        let declared = match s.redis.shared().await {
            Ok(mut conn) => {
                // The group's records too, in case Redis lost them.
                if let Err(e) = query_by_slot(&mut conn, self.group_records()).await {
                    tracing::warn!(handler = s.group(), error = %e, "cannot record the consumer group again; retrying when taking units");
                }
                self.declare_alive(&mut conn, &shards).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = declared {
            tracing::warn!(handler = s.group(), error = %chain(&e), "cannot declare this instance alive; retrying when taking units");
        }
    }

    /// Releases the leases this instance may hold without a worker (see
    /// `orphans`), whatever their generation; keeps those it could not.
    async fn release_orphans(&mut self) {
        if self.orphans.is_empty() {
            return;
        }
        let s = self.shared.clone();
        // A key whose worker is still finishing stays an orphan until it
        // ended.
        let (keys, later): (Vec<String>, Vec<String>) = self
            .orphans
            .drain()
            .filter(|k| !self.units.contains_key(k))
            .partition(|k| !self.draining.contains_key(k));
        self.orphans.extend(later);
        let Ok(conn) = s.redis.shared().await else {
            self.orphans.extend(keys);
            return;
        };
        // At once, each within a heartbeat interval: a shard that does not
        // answer holds up no other.
        let within = s.settings.heartbeat;
        let releases = keys.into_iter().map(|key| {
            let mut conn = conn.clone();
            let s = s.clone();
            async move {
                let unit = s.unit(&key);
                let release = Release {
                    unit: &unit,
                    held: Held::Owner(&s.owner),
                };
                let released = tokio::time::timeout(within, release.run(&mut conn)).await;
                (key, released)
            }
        });
        for (key, released) in futures::future::join_all(releases).await {
            match released {
                Ok(Ok(Released::Released)) => {
                    tracing::info!(handler = s.group(), key = ?Escaped(&key), "released a lease this instance held without a worker");
                }
                Ok(Ok(Released::NotHeld)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(handler = s.group(), key = ?Escaped(&key), error = %chain(&e), "releasing a lease held without a worker failed; retrying at the next heartbeat");
                    self.orphans.insert(key);
                }
                Err(_) => {
                    tracing::warn!(handler = s.group(), key = ?Escaped(&key), "releasing a lease held without a worker got no reply in time; retrying at the next heartbeat");
                    self.orphans.insert(key);
                }
            }
        }
    }

    /// Tries to take up to `max` of `candidates`; starts a worker for each
    /// unit taken. One script call per shard (a script touches one shard),
    /// after declaring this instance alive in the shards it had not.
    async fn acquire(&mut self, candidates: Vec<String>, max: usize, shutdown: &CancellationToken) {
        if candidates.is_empty() || max == 0 {
            return;
        }
        let s = self.shared.clone();
        let mut by_shard: BTreeMap<u32, Vec<Unit>> = BTreeMap::new();
        // A key whose earlier worker is still finishing is not taken yet.
        for k in candidates
            .iter()
            .filter(|k| !self.draining.contains_key(*k))
        {
            let u = s.unit(k);
            by_shard.entry(u.shard).or_default().push(u);
        }
        let mut conn = match s.redis.shared().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(handler = s.group(), error = %chain(&e), "cannot take leases now");
                return;
            }
        };
        let shards: BTreeSet<u32> = by_shard.keys().copied().collect();
        if let Err(e) = self.declare_alive(&mut conn, &shards).await {
            // Units are taken in the shards that answered.
            tracing::warn!(handler = s.group(), error = %chain(&e), "cannot take leases in some shards now");
        }
        by_shard.retain(|shard, _| self.registered.contains(shard));
        // Each shard's calls within a heartbeat interval: a shard that does
        // not answer holds up no other.
        let within = s.settings.heartbeat;
        let mut left = max;
        for (shard, units) in by_shard {
            if left == 0 {
                break;
            }
            // Who holds them: nothing is taken by this read.
            let all: Vec<&Unit> = units.iter().collect();
            let seen = match tokio::time::timeout(
                within,
                acquire::holders(&mut conn, &all, &s.owner),
            )
            .await
            {
                Ok(Ok(h)) => h,
                Ok(Err(e)) => {
                    tracing::warn!(handler = s.group(), shard, error = %chain(&e), "cannot take leases in this shard now");
                    continue;
                }
                Err(_) => {
                    tracing::warn!(
                        handler = s.group(),
                        shard,
                        "cannot take leases in this shard now: no reply in time"
                    );
                    continue;
                }
            };
            let incarnation = s.incarnation(shard);
            let taking = Acquire {
                group: s.group(),
                owner: &s.owner,
                incarnation: &incarnation,
                alive: s.alive(shard),
                max: left,
                units: &units,
                holders: &seen,
                wait: Replicated::acknowledging(&s.plan.config.broker),
            };
            let taken = match tokio::time::timeout(within, taking.run(&mut conn)).await {
                Ok(r) => r,
                Err(_) => Err(Error::redis(
                    "taking leases failed",
                    redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no reply within {within:?}"),
                    )),
                )),
            };
            let results = match taken {
                Ok(Acquired::Units(results)) => results,
                Ok(Acquired::NotAlive) => {
                    // This instance's liveness lapsed: the next heartbeat
                    // finds that out and starts over in a new incarnation.
                    tracing::warn!(
                        handler = s.group(),
                        "not taking leases: this instance's liveness lapsed"
                    );
                    return;
                }
                Err(e) => {
                    // The call may have run: any of the shard's candidates
                    // may now be leased to this instance with no worker.
                    tracing::warn!(handler = s.group(), error = %chain(&e), "taking leases failed; releasing what it may have taken at the next heartbeat");
                    self.orphans.extend(
                        units
                            .into_iter()
                            .map(|u| u.key)
                            .filter(|k| !self.units.contains_key(k)),
                    );
                    continue;
                }
            };
            for (unit, result) in units.into_iter().zip(results) {
                let Some(taken) = result else {
                    self.elsewhere.insert(unit.key, Instant::now());
                    continue;
                };
                left = left.saturating_sub(1);
                let key = unit.key.clone();
                tracing::info!(handler = s.group(), key = ?Escaped(&key), generation = taken.generation, halted = taken.halted, "lease acquired");
                convoy_core::metrics::acquired(s.group(), 1);
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
                if self.units.insert(key, handle).is_some_and(|old| old.moving) {
                    self.moving -= 1;
                }
            }
        }
    }
}

/// What one heartbeat read of a category's shard.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    /// Live partitions in the shard's index.
    partitions: u64,
    /// Partitioned events ever published to the shard.
    published: i64,
    /// Of those, the ones this handler finished.
    acked: i64,
}

impl Counts {
    /// The published and finished counts only grow: seeing one go back
    /// means the shard's master lost writes it had acknowledged (a failover
    /// to a replica, or a restart, without them). Reported as an ERROR
    /// naming the shard and the range, and counted in
    /// `convoy_replication_lost_total`. A first reading (all zero before)
    /// compares with nothing.
    fn check_lost(&self, now: &Counts, group: &'static str, category: &str, shard: u32) {
        if *self == Counts::default() {
            return;
        }
        if now.published < self.published {
            let lost = (self.published - now.published) as u64;
            loss::reported(
                category,
                shard,
                "published",
                lost,
                group,
                &format!(
                    "Redis lost published events: shard {shard} of {category} counted {} publishes and now counts {}, so the last {lost} events published there are gone from Redis (its master failed over to a replica, or restarted, without them): those not handled before will never be; the publisher's own ERROR names their outbox seqs; set [broker] wait_replicas = 1 to wait for a replica on every publish",
                    self.published, now.published
                ),
            );
        }
        if now.acked < self.acked {
            let lost = (self.acked - now.acked) as u64;
            loss::reported(
                category,
                shard,
                "acked",
                lost,
                group,
                &format!(
                    "Redis lost acknowledgements: shard {shard} of {category} counted {} events finished by {group} and now counts {}, so up to {lost} events may run again, after later events of their key (its master failed over to a replica, or restarted, without them); make external effects exactly-once by the event's origin (AppliedEvents), or set [broker] wait_acks = true with wait_replicas = 1",
                    self.acked, now.acked
                ),
            );
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
