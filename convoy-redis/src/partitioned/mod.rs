//! The partitioned consumer of one handler on one engine instance.
//!
//! The [`Coordinator`] discovers units, takes and renews their leases,
//! shares them fairly with the other live instances, and runs one
//! [`worker`] per owned unit. It is a thin loop over its parts:
//!
//! - [`membership`]: registration, liveness keys and incarnations, the
//!   local lease deadlines, the heartbeat (its pipeline typed in
//!   [`heartbeat`], the registration's in [`registration`]);
//! - [`discovery`]: finding partitions in the indexes, in bounded steps;
//! - [`ownership`]: the units owned, held elsewhere, orphaned or draining;
//!   taking and giving them up; the fair share;
//! - [`worker`]: one owned unit, driven by its phase machine ([`phase`]),
//!   its I/O behind [`unit_io::UnitIo`], its acknowledgements committed
//!   in groups by [`acks`].
//!
//! What they read of the configuration is one [`Settings`] snapshot, read
//! when the consumer starts.

mod acks;
mod discovery;
mod heartbeat;
mod membership;
mod ownership;
mod phase;
mod registration;
mod unit_io;
mod worker;

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::connection::Connection;
use super::pause::{self, Pauses};
use super::scripts::Replicated;
use super::unit::Unit;
use super::wake;
use convoy_core::backoff::Backoff;
use convoy_core::broker::outage::Outage;
use convoy_core::broker::{ConsumerPlan, Subscription};
use convoy_core::config::{Config, PoisonPolicy, PriorityLanesConfig, RetryConfig};
use convoy_core::error::{Error, chain};
use convoy_core::names;

use crate::tracing;
use discovery::{Discovery, Step, shuffle};
use membership::{Liveness, Membership};
use ownership::{Ownership, Rebalance, rebalance, wake_target};
pub(crate) use ownership::{UnitHandle, WorkerExit};

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Monotonic milliseconds since the first call (keeps running while the
/// process is stopped, so a stalled owner sees its deadline passed).
pub(crate) fn mono_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}

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
    /// `[server.retry]`, with the handler's own values over it.
    pub(crate) retry: RetryConfig,
    /// `[server.priority_lanes]`: how a unit's lanes are named.
    pub(crate) priority_lanes: PriorityLanesConfig,
    /// The shard count of the subscription's first category.
    pub(crate) shards: u32,
    /// The shard count of each of the subscription's categories, in order.
    pub(crate) category_shards: Vec<u32>,
    /// Handlers of the subscription running at once on this instance.
    pub(crate) in_flight: usize,
    /// What a lease-taking or acknowledging call waits for (`[broker]
    /// wait_acks`).
    pub(crate) wait_acks: Option<Replicated>,
    /// Whether the handler's poisoned heads go to the key's dead letters
    /// (`on_poison = "dead_letter"`, or `[handlers."name"] on_poison`)
    /// rather than halting the key. Process managers always halt.
    pub(crate) dead_letter_poison: bool,
    /// Where the configuration came from (for errors).
    pub(crate) config_origin: String,
}

impl Settings {
    fn of(config: &Config, sub: &Subscription) -> Settings {
        let p = &config.server.partitioning;
        let dead_letter_poison = !sub.process_manager
            && match config.on_poison(sub.name) {
                Some(p) => p == PoisonPolicy::DeadLetter,
                None => sub.dead_letter_poison,
            };
        Settings {
            lease_ttl: p.lease_ttl(),
            heartbeat: p.heartbeat_interval(),
            poll: p.poll_interval(),
            reap_idle: p.reap_idle(),
            max_unacked: p.max_unacked.max(1),
            partition_warning: p.partition_warning_threshold,
            retry: config.retry_for(sub.name),
            priority_lanes: config.server.priority_lanes.clone(),
            shards: config.broker.shards_of(sub.category),
            category_shards: sub
                .categories
                .iter()
                .map(|c| config.broker.shards_of(c))
                .collect(),
            in_flight: config.concurrency(sub.name),
            wait_acks: Replicated::acknowledging(&config.broker),
            dead_letter_poison,
            config_origin: config.origin().to_owned(),
        }
    }
}

/// What every worker of one subscription shares.
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
    /// This instance's liveness keys, incarnations and local lease
    /// deadlines, per shard (see [`Liveness`]).
    pub(crate) liveness: Liveness,
    /// Where workers commit their fenced acknowledgements, in groups.
    pub(crate) acks: acks::Lanes,
    /// The handler's transient failures on this instance: an outage
    /// pauses it (see [`Outage`]).
    pub(crate) outage: Outage,
    /// Operators' pauses of the handler's keys and key prefixes, as this
    /// instance last read them (see [`crate::pause`]).
    pub(crate) pauses: Pauses,
}

impl Shared {
    /// The current incarnation in `shard` (see [`Liveness`]).
    pub(crate) fn incarnation(&self, shard: u32) -> Arc<str> {
        self.liveness.incarnation(shard)
    }

    /// The local lease deadline of `shard`'s units (monotonic ms; 0 when
    /// none).
    pub(crate) fn deadline(&self, shard: u32) -> u64 {
        self.liveness.deadline(shard)
    }

    /// This instance's liveness key in `shard`.
    pub(crate) fn alive(&self, shard: u32) -> &str {
        self.liveness.alive(shard)
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
        let lanes = &self.settings.priority_lanes;
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

    pub(crate) fn ttl(&self) -> Duration {
        self.settings.lease_ttl
    }

    /// Reads the operators' pauses of the handler's categories again; on
    /// an error the pauses known stay, and the next reading tries again.
    pub(crate) async fn read_pauses(&self) {
        let mut all = Vec::new();
        for c in self.categories() {
            let read = match self.redis.shared().await {
                Ok(mut conn) => pause::read(&mut conn, c)
                    .await
                    .map_err(|e| Error::redis("reading the pauses", e)),
                Err(e) => Err(e),
            };
            match read {
                Ok(p) => all.extend(p),
                Err(e) => {
                    tracing::warn!(handler = self.group(), category = *c, error = %chain(&e), "cannot read the operators' pauses; the ones known stay until the next reading");
                    return;
                }
            }
        }
        self.pauses.update(all);
    }
}

/// Discovers, leases and shares the units of one handler: a thin loop over
/// its membership, discovery and ownership.
pub(crate) struct Coordinator {
    shared: Arc<Shared>,
    exits: mpsc::UnboundedReceiver<WorkerExit>,
    membership: Membership,
    discovery: Discovery,
    ownership: Ownership,
    /// Heartbeats so far.
    heartbeats: u32,
    /// The units owned at the last periodic summary (leases taken and
    /// released are DEBUG lines, one per partition; the summary is INFO).
    reported: usize,
}

/// Heartbeats between two sweeps for workers that ended unreported.
const PRUNE_EVERY: u32 = 16;

impl Coordinator {
    pub(crate) fn new(redis: Arc<Connection>, plan: Arc<ConsumerPlan>, index: usize) -> Self {
        let owner = plan.instance_id.clone();
        let (tx, rx) = mpsc::unbounded_channel();
        let sub = &plan.subscriptions[index];
        let settings = Settings::of(&plan.config, sub);
        let shards = settings.shards;
        let alive: Arc<[String]> = (0..shards)
            .map(|s| names::alive(s, sub.name, &owner))
            .collect();
        let outage = Outage::new(sub.name, &settings.retry, plan.health.clone());
        let pauses = Pauses::new(sub.name);
        let acks = acks::Lanes::new(if redis.is_cluster() { shards } else { 1 });
        Coordinator {
            shared: Arc::new(Shared {
                redis,
                liveness: Liveness::new(alive, settings.lease_ttl.as_millis() as u64),
                // Handlers of one subscription running at once on this
                // instance.
                permits: Semaphore::new(settings.in_flight),
                settings,
                plan,
                index,
                owner,
                exits: tx,
                shards,
                acks,
                outage,
                pauses,
            }),
            exits: rx,
            membership: Membership::default(),
            discovery: Discovery::default(),
            ownership: Ownership::default(),
            heartbeats: 0,
            reported: 0,
        }
    }

    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let s = self.shared.clone();
        let group = s.group();
        let category = s.category();
        tracing::info!(handler = group, categories = ?s.categories(), owner = %s.owner, "partitioned consumer starting");
        let mut backoff = Backoff::reconnect();
        loop {
            match self.membership.register(&s).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(handler = group, error = %chain(&e), "cannot register the consumer group; retrying");
                    if !backoff.wait_or_stop(&shutdown).await {
                        return;
                    }
                }
            }
        }
        s.read_pauses().await;
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
                Some(exit) = self.exits.recv() => self.ownership.on_exit(exit),
                msg = wake_rx.recv() => match msg {
                    Some(Some(keys)) => self.on_wake(keys, &shutdown).await,
                    Some(None) => {
                        // Wake-ups may have been missed.
                        self.discovery.rescan_for(s.ttl());
                        self.ownership.wake_all();
                        s.read_pauses().await;
                    }
                    None => {}
                },
            }
        }
        // Graceful shutdown: each worker finishes its event, acks, releases.
        self.ownership.stop_all().await;
        for l in listeners {
            let _ = l.await;
        }
        tracing::info!(handler = group, category, "partitioned consumer stopped");
    }

    /// This instance's liveness key in `shards` expired before it was
    /// renewed (this instance was stalled or cut off past the TTL, or the
    /// shard's master failed over to a replica without it): other
    /// instances may own its units there now. Stop every worker of those
    /// shards before its next event (their keys are not taken again until
    /// they ended, see [`Ownership`]), and start a new incarnation there;
    /// the units of other shards go on.
    async fn lapsed(&mut self, shards: BTreeSet<u32>) {
        let s = self.shared.clone();
        tracing::warn!(handler = s.group(), owner = %s.owner, ?shards, "liveness lapsed: this instance was stalled or cut off past lease_ttl_ms (in these shards); giving up their units and starting over there");
        self.membership.lapse(&s, &shards);
        let gone = self.ownership.give_up(&s, &shards);
        convoy_core::metrics::lost(s.group(), gone);
        convoy_core::metrics::owned(s.group(), self.ownership.owned());
        self.discovery.rescan_for(s.ttl());
        self.membership.start_over(&s, &shards).await;
    }

    async fn on_wake(&mut self, wakes: Vec<wake::Wake>, shutdown: &CancellationToken) {
        let mut unknown = Vec::new();
        let mut seen = HashSet::new();
        if wakes.iter().any(|w| w.pauses) {
            self.shared.read_pauses().await;
        }
        for w in wakes.into_iter().filter(|w| !w.pauses) {
            if w.released {
                self.ownership.released(&w.key);
            }
            if !seen.insert(w.key.clone()) {
                continue;
            }
            if !self.ownership.wake(&w.key) && !self.ownership.knows(&w.key) {
                unknown.push(w.key);
            }
        }
        if unknown.is_empty() {
            return;
        }
        let target = wake_target(
            self.membership.partitions,
            self.ownership.units.len(),
            self.ownership.elsewhere(),
            unknown.len(),
            self.membership.live,
        );
        let owned = self.ownership.owned();
        if owned < target {
            let s = self.shared.clone();
            self.ownership
                .acquire(&s, &mut self.membership, unknown, target - owned, shutdown)
                .await;
        }
    }

    /// One heartbeat: renew liveness, count live instances, discover,
    /// rebalance.
    /// Returns whether to run again soon (not at the next tick): discovery
    /// is taking units and has more to find.
    async fn cycle(&mut self, shutdown: &CancellationToken) -> bool {
        self.heartbeats = self.heartbeats.wrapping_add(1);
        if self.heartbeats.is_multiple_of(PRUNE_EVERY) {
            let owned = self.ownership.owned();
            if owned != self.reported {
                tracing::info!(
                    handler = self.shared.group(),
                    owned,
                    before = self.reported,
                    "this instance owns {owned} partitions of the handler (was {}); each lease taken or released is a DEBUG line",
                    self.reported
                );
                self.reported = owned;
            }
            self.ownership.prune();
            // A pause whose wake-up was lost is read here at the latest.
            self.shared.read_pauses().await;
        }
        let s = self.shared.clone();
        match self.membership.heartbeat(&s).await {
            Ok(beat) => {
                if beat.instances_changed {
                    // Another instance came (units may move to it) or went
                    // (its units are free once its liveness lapsed, about
                    // now).
                    self.discovery.rescan_for(s.ttl());
                }
                if !beat.lapsed.is_empty() {
                    self.lapsed(beat.lapsed).await;
                }
            }
            Err(e) => {
                tracing::warn!(handler = s.group(), error = %chain(&e), "heartbeat failed; workers stop at the local lease deadline unless a later one succeeds");
                return false;
            }
        }
        self.ownership.release_orphans(&s).await;
        self.ownership.forget_elsewhere(s.ttl());
        self.membership.warn_partitions(&s);
        let owned = self.ownership.owned();
        let m = &self.membership;
        let mut again = false;
        match rebalance(owned, m.partitions, m.live, m.counted) {
            Rebalance::Take(deficit) => {
                let step = Step::for_deficit(deficit, self.discovery.rescanning());
                let ownership = &self.ownership;
                match self
                    .discovery
                    .discover(&s, step, |k| ownership.knows(k))
                    .await
                {
                    Ok((mut candidates, wrapped)) => {
                        shuffle(&mut candidates, &s.owner);
                        self.ownership
                            .acquire(&s, &mut self.membership, candidates, deficit, shutdown)
                            .await;
                        let now = self.ownership.owned();
                        self.discovery.taken(now.saturating_sub(owned), wrapped);
                        again = self.discovery.rescanning() && now < owned + deficit;
                    }
                    Err(e) => {
                        tracing::warn!(handler = s.group(), error = %chain(&e), "discovery failed; retrying at the next heartbeat");
                    }
                }
            }
            Rebalance::GiveUp(surplus) => {
                self.ownership.shed(surplus);
                tracing::debug!(
                    handler = s.group(),
                    owned,
                    target = owned - surplus,
                    "released surplus units"
                );
            }
            Rebalance::Keep => {}
        }
        convoy_core::metrics::owned(s.group(), self.ownership.owned());
        again
    }
}
