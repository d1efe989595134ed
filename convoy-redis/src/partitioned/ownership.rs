//! Ownership: the units this instance owns and their workers, the keys
//! held elsewhere, the leases it may hold without a worker (orphans), the
//! workers still finishing after a lapse; taking units (acquire), giving
//! them up (rebalancing, a lapse) and the fair share that decides how many.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::super::scripts::acquire::{self, Acquire, Acquired};
use super::super::scripts::release::{Held, Release, Released};
use super::super::unit::Unit;
use super::Shared;
use super::membership::Membership;
use super::worker;
use crate::tracing;
use convoy_core::error::{Error, chain};
use convoy_core::handler::Fence;
use convoy_core::key::Escaped;

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

/// Units each of `live` instances should own out of `partitions`.
pub(crate) fn fair_share(partitions: usize, live: usize) -> usize {
    partitions.div_ceil(live.max(1))
}

/// What a heartbeat does about the units this instance owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rebalance {
    /// Take this many more (the deficit to the fair share).
    Take(usize),
    /// Give this many up (the surplus over the fair share).
    GiveUp(usize),
    /// Keep what it owns.
    Keep,
}

/// The rebalancing for `owned` units out of `partitions` shared by `live`
/// instances. Units are given away only on a full count (`counted`): a
/// count from a shard that did not answer is a guess.
pub(super) fn rebalance(owned: usize, partitions: usize, live: usize, counted: bool) -> Rebalance {
    let target = fair_share(partitions, live);
    if owned < target {
        Rebalance::Take(target - owned)
    } else if owned > target && counted {
        Rebalance::GiveUp(owned - target)
    } else {
        Rebalance::Keep
    }
}

/// How many units to own once woken by `unknown` new partitions: the
/// partitions known (the last heartbeat's count, or more when units were
/// taken or seen held since: new partitions' wake-ups come before the
/// next count), plus the new ones, shared fairly.
pub(super) fn wake_target(
    counted: usize,
    units: usize,
    elsewhere: usize,
    unknown: usize,
    live: usize,
) -> usize {
    fair_share(counted.max(units + elsewhere) + unknown, live)
}

/// Which `surplus` units to give up, of `units` (key, idle, already
/// moving): idle units first; a unit already moving is not picked again.
pub(super) fn surplus<'a, I>(units: I, surplus: usize) -> Vec<&'a str>
where
    I: Iterator<Item = (&'a str, bool, bool)> + Clone,
{
    let mut picked = Vec::new();
    for idle_first in [true, false] {
        for (key, idle, moving) in units.clone() {
            if picked.len() == surplus {
                return picked;
            }
            if !moving && idle == idle_first {
                picked.push(key);
            }
        }
    }
    picked
}

/// Sorts the orphans (leases maybe held without a worker): those whose
/// unit has a worker again are dropped (it holds the lease); those whose
/// earlier worker is still finishing wait (the second list); the others
/// are released now (the first).
pub(super) fn sort_orphans(
    orphans: impl IntoIterator<Item = String>,
    running: impl Fn(&str) -> bool,
    draining: impl Fn(&str) -> bool,
) -> (Vec<String>, Vec<String>) {
    orphans
        .into_iter()
        .filter(|k| !running(k))
        .partition(|k| !draining(k))
}

/// The units of one handler on this instance.
#[derive(Default)]
pub(super) struct Ownership {
    pub(super) units: HashMap<String, UnitHandle>,
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
    /// Units in `units` being moved away (stopped by the coordinator, not
    /// yet ended).
    moving: usize,
}

impl Ownership {
    /// Units this instance owns and keeps (not being moved away). O(1).
    pub(super) fn owned(&self) -> usize {
        self.units.len() - self.moving
    }

    /// Whether `key` is owned here or known to be held elsewhere.
    pub(super) fn knows(&self, key: &str) -> bool {
        self.units.contains_key(key) || self.elsewhere.contains_key(key)
    }

    /// Keys known held elsewhere.
    pub(super) fn elsewhere(&self) -> usize {
        self.elsewhere.len()
    }

    /// Forgets the keys seen held elsewhere longer than `ttl` ago.
    pub(super) fn forget_elsewhere(&mut self, ttl: Duration) {
        self.elsewhere.retain(|_, at| at.elapsed() < ttl);
    }

    /// `key` was released: it may be free.
    pub(super) fn released(&mut self, key: &str) {
        self.elsewhere.remove(key);
    }

    /// Wakes `key`'s worker; false when it has none.
    pub(super) fn wake(&self, key: &str) -> bool {
        match self.units.get(key) {
            Some(u) => {
                u.wake.notify_one();
                true
            }
            None => false,
        }
    }

    /// Wakes every worker (wake-ups may have been missed).
    pub(super) fn wake_all(&self) {
        for u in self.units.values() {
            u.wake.notify_one();
        }
    }

    pub(super) fn on_exit(&mut self, exit: WorkerExit) {
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

    /// Drops the handles of workers that ended without reporting (a
    /// panicked worker sends no exit). O(units): every few heartbeats,
    /// not on the wake-up path.
    pub(super) fn prune(&mut self) {
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

    /// Gives up every unit of `shards` (their liveness lapsed): each
    /// worker stops before its next event. Not awaited here: a handler in
    /// flight may take longer than the other shards' leases; the key is
    /// not taken again until its worker ended. Returns how many.
    pub(super) fn give_up(&mut self, s: &Shared, shards: &BTreeSet<u32>) -> usize {
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
                self.draining.insert(key.clone(), u.task);
            }
        }
        gone.len()
    }

    /// Stops `surplus` units to move them away: idle units first; a unit
    /// moves only after its worker finished the event in flight and
    /// released the lease.
    pub(super) fn shed(&mut self, n: usize) {
        let picked: Vec<String> = surplus(
            self.units
                .iter()
                .map(|(k, u)| (k.as_str(), u.idle.load(Ordering::Relaxed), u.moving)),
            n,
        )
        .into_iter()
        .map(str::to_owned)
        .collect();
        for key in picked {
            if let Some(u) = self.units.get_mut(&key) {
                u.stop.cancel();
                u.moving = true;
                self.moving += 1;
            }
        }
    }

    /// Graceful shutdown: each worker finishes its event, acks, releases.
    pub(super) async fn stop_all(&mut self) {
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
    }

    /// Releases the leases this instance may hold without a worker (see
    /// `orphans`), whatever their generation; keeps those it could not.
    pub(super) async fn release_orphans(&mut self, s: &Arc<Shared>) {
        if self.orphans.is_empty() {
            return;
        }
        // A key whose worker is still finishing stays an orphan until it
        // ended.
        let (keys, later) = sort_orphans(
            self.orphans.drain(),
            |k| self.units.contains_key(k),
            |k| self.draining.contains_key(k),
        );
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
    pub(super) async fn acquire(
        &mut self,
        s: &Arc<Shared>,
        membership: &mut Membership,
        candidates: Vec<String>,
        max: usize,
        shutdown: &CancellationToken,
    ) {
        if candidates.is_empty() || max == 0 {
            return;
        }
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
        if let Err(e) = membership.declare_alive(s, &mut conn, &shards).await {
            // Units are taken in the shards that answered.
            tracing::warn!(handler = s.group(), error = %chain(&e), "cannot take leases in some shards now");
        }
        by_shard.retain(|shard, _| membership.registered.contains(shard));
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
                wait: s.settings.wait_acks,
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
                tracing::debug!(handler = s.group(), key = ?Escaped(&key), generation = taken.generation, halted = taken.halted, "lease acquired");
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

    #[test]
    fn rebalance_takes_the_deficit_and_gives_up_the_surplus_only_on_a_full_count() {
        assert_eq!(rebalance(10, 100, 3, true), Rebalance::Take(24));
        assert_eq!(rebalance(10, 100, 3, false), Rebalance::Take(24));
        assert_eq!(rebalance(34, 100, 3, true), Rebalance::Keep);
        assert_eq!(rebalance(50, 100, 3, true), Rebalance::GiveUp(16));
        // A shard did not answer: its count is a guess, nothing given away.
        assert_eq!(rebalance(50, 100, 3, false), Rebalance::Keep);
        // No partitions counted yet (before the first full count).
        assert_eq!(rebalance(0, 0, 1, false), Rebalance::Keep);
    }

    #[test]
    fn a_wake_up_counts_the_partitions_known_and_the_new_ones() {
        // The heartbeat's count, plus the new ones.
        assert_eq!(wake_target(10, 3, 2, 2, 2), 6);
        // More seen since the count: those.
        assert_eq!(wake_target(4, 6, 4, 2, 2), 6);
        assert_eq!(wake_target(0, 0, 0, 1, 3), 1);
    }

    #[test]
    fn surplus_gives_up_idle_units_first_and_none_already_moving() {
        let units = [
            ("busy1", false, false),
            ("idle1", true, false),
            ("moving", true, true),
            ("busy2", false, false),
            ("idle2", true, false),
        ];
        let pick = |n| surplus(units.iter().copied(), n);
        assert_eq!(pick(1), vec!["idle1"]);
        assert_eq!(pick(2), vec!["idle1", "idle2"]);
        assert_eq!(pick(3), vec!["idle1", "idle2", "busy1"]);
        assert_eq!(pick(10), vec!["idle1", "idle2", "busy1", "busy2"]);
        assert!(pick(0).is_empty());
    }

    #[test]
    fn orphans_wait_for_a_draining_worker_and_go_with_a_running_one() {
        let orphans = ["free", "running", "draining"].map(String::from);
        let (now, later) = sort_orphans(orphans, |k| k == "running", |k| k == "draining");
        assert_eq!(now, vec!["free".to_owned()]);
        assert_eq!(later, vec!["draining".to_owned()]);
    }
}
