//! Membership: this instance's registration with the group, its liveness
//! keys (one per shard) and their incarnations, the local lease deadlines
//! they give, and the heartbeat that renews them, counts the live
//! instances and reads each shard's counts.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::Value;

use super::super::connection::Conn;
use super::super::layout;
use super::super::reply::text;
use super::heartbeat::{self, Counts};
use super::registration::{Declaration, Records};
use super::{Shared, mono_ms};
use crate::tracing;
use convoy_core::envelope::now_ms;
use convoy_core::error::{Error, chain};
use convoy_core::names::{self, CORRELATION_SCOPE};

/// This instance's liveness in each shard, as the workers read it: its
/// key, the incarnation it holds, and the local lease deadline it gives.
pub(crate) struct Liveness {
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
    /// The lease TTL in ms.
    ttl_ms: u64,
}

impl Liveness {
    pub(super) fn new(alive: Arc<[String]>, ttl_ms: u64) -> Self {
        let shards = alive.len();
        Liveness {
            alive,
            incarnations: Mutex::new(vec![Arc::from(""); shards]),
            deadlines: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            ttl_ms,
        }
    }

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
    pub(super) fn new_incarnation(&self, shards: impl IntoIterator<Item = u32>) {
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
    pub(super) fn set_deadline(&self, shard: u32, sent: Option<u64>) {
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

    /// The local deadline of a lease renewed (or taken) at `sent` ms: the
    /// TTL minus a safety margin.
    fn deadline_from(&self, sent: u64) -> u64 {
        deadline_from(sent, self.ttl_ms)
    }
}

/// The local deadline of a lease renewed at `sent` ms with a TTL of
/// `ttl` ms: a tenth of the TTL earlier, at least 50 ms, at most half.
fn deadline_from(sent: u64, ttl: u64) -> u64 {
    let margin = (ttl / 10).max(50).min(ttl / 2);
    sent + ttl - margin
}

/// What one heartbeat found.
#[derive(Debug, Default)]
pub(super) struct Beat {
    /// The shards where this instance's liveness lapsed (its key was gone
    /// or held by another process).
    pub(super) lapsed: BTreeSet<u32>,
    /// Another instance came (units may move to it) or went (its units are
    /// free once its liveness lapsed, about now).
    pub(super) instances_changed: bool,
}

/// This instance's membership of the group, as the coordinator keeps it.
#[derive(Debug)]
pub(super) struct Membership {
    /// The shards this instance declared itself alive in (in the current
    /// incarnation): where it owns or tries to take units. Renewed every
    /// heartbeat, one key per shard.
    pub(super) registered: BTreeSet<u32>,
    /// The live instances the last heartbeat saw.
    instances: Vec<String>,
    /// How many: at least this one.
    pub(super) live: usize,
    /// The live partitions the last heartbeat counted.
    pub(super) partitions: usize,
    /// What the last heartbeat read of each (category, shard), by the
    /// category's place in the subscription.
    counts: HashMap<(usize, u32), Counts>,
    /// Whether the last heartbeat read every shard's counts: a count from
    /// a shard that did not answer is a guess, and an instance does not
    /// give units away on a guess (a failing shard's partitions counted
    /// as none would make it shed units of the healthy ones).
    pub(super) counted: bool,
    /// Whether `convoy:paused:{group}:{owner}` may be set: the heartbeat
    /// deletes it once the handler is not paused (true at start, so a
    /// marker left by an earlier run under this instance id goes too).
    pause_marked: bool,
    /// The partition warning was logged (and the count is still over).
    warned: bool,
}

impl Default for Membership {
    fn default() -> Self {
        Membership {
            registered: BTreeSet::new(),
            instances: Vec::new(),
            live: 1,
            partitions: 0,
            counts: HashMap::new(),
            counted: false,
            pause_marked: true,
            warned: false,
        }
    }
}

impl Membership {
    /// Registers the group for its categories (in every shard, and the
    /// categories' shard counts) and starts a new incarnation: this
    /// instance declares itself alive shard by shard, where it takes units
    /// ([`Membership::declare_alive`]).
    pub(super) async fn register(&mut self, s: &Shared) -> Result<(), Error> {
        let mut conn = s.redis.shared().await?;
        for (c, configured) in s.categories().iter().zip(&s.settings.category_shards) {
            let configured = *configured;
            if configured != s.shards {
                return Err(Error::Config {
                    file: s.settings.config_origin.clone(),
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
        Self::records(s)
            .send(&mut conn)
            .await
            .map_err(|e| Error::redis("failed to register the consumer group", e))?;
        s.liveness.new_incarnation(0..s.shards);
        // The shards of the last incarnation get the new one at once, so
        // the leases taken before are dead for everyone now.
        let previous = std::mem::take(&mut self.registered);
        self.declare_alive(s, &mut conn, &previous).await
    }

    /// The commands that record the group for its categories in every
    /// shard (idempotent).
    fn records(s: &Shared) -> Records {
        let mut records = Records::default();
        for c in s.categories() {
            for shard in 0..s.shards {
                records.group(names::groups(shard, c), s.group());
            }
            records.category(names::CATEGORIES, c);
        }
        if s.sub().scope == CORRELATION_SCOPE {
            // Tells operators' tools how this group names its units.
            records.scope(names::scope(s.group()), CORRELATION_SCOPE);
        }
        records
    }

    /// Declares this instance alive, in each shard's current incarnation,
    /// in the `shards` it has not declared itself alive in yet (before it
    /// takes units there); the shards that answered get their deadline.
    pub(super) async fn declare_alive(
        &mut self,
        s: &Shared,
        conn: &mut Conn,
        shards: &BTreeSet<u32>,
    ) -> Result<(), Error> {
        let ttl = s.ttl().as_millis() as u64;
        let mut declaration = Declaration::default();
        for shard in shards.difference(&self.registered) {
            declaration.alive(
                *shard,
                s.alive(*shard),
                &s.liveness.incarnation(*shard),
                ttl,
            );
        }
        if declaration.is_empty() {
            return Ok(());
        }
        let sent = mono_ms();
        let mut failed = None;
        let within = s.settings.heartbeat;
        for (shard, r) in declaration.send(conn, within).await.shards() {
            match r {
                Ok(_) => {
                    s.liveness.set_deadline(shard, Some(sent));
                    self.registered.insert(shard);
                }
                Err(e) => failed = Some(e),
            }
        }
        match failed {
            None => Ok(()),
            Some(e) => Err(Error::redis("failed to declare this instance alive", e)),
        }
    }

    /// This instance's liveness in `shards` expired before it was renewed:
    /// their deadlines pass at once, so no worker there starts another
    /// event.
    pub(super) fn lapse(&self, s: &Shared, shards: &BTreeSet<u32>) {
        for shard in shards {
            s.liveness.set_deadline(*shard, None);
        }
    }

    /// Starts over in `shards` after a lapse (once their workers were told
    /// to stop): a new incarnation there, the group's records again (in
    /// case Redis lost them), and this instance declared alive again.
    pub(super) async fn start_over(&mut self, s: &Shared, shards: &BTreeSet<u32>) {
        s.liveness.new_incarnation(shards.iter().copied());
        self.registered.retain(|shard| !shards.contains(shard));
        let declared = match s.redis.shared().await {
            Ok(mut conn) => {
                // The group's records too, in case Redis lost them.
                if let Err(e) = Self::records(s).send(&mut conn).await {
                    tracing::warn!(handler = s.group(), error = %e, "cannot record the consumer group again; retrying when taking units");
                }
                self.declare_alive(s, &mut conn, shards).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = declared {
            tracing::warn!(handler = s.group(), error = %chain(&e), "cannot declare this instance alive; retrying when taking units");
        }
    }

    /// Renews this instance's liveness in every shard it declared itself
    /// alive in (which keeps every lease it holds), registers it as live,
    /// counts live instances and the partitions (one `SCARD` per shard),
    /// and reads the lag counters: a fixed number of commands whatever the
    /// number of partitions. Each shard stands on its own: a shard that
    /// does not answer (its master failing over) renews nothing there and
    /// holds up no other. Returns the shards where this instance's
    /// liveness lapsed (its key was gone or held by another process), and
    /// whether the live instances changed.
    pub(super) async fn heartbeat(&mut self, s: &Shared) -> Result<Beat, Error> {
        let mut conn = s.redis.shared().await?;
        let now = now_ms();
        let sent = mono_ms();
        let ttl = s.ttl().as_millis() as u64;
        let set = names::instances(s.group());
        let mut pipe = heartbeat::Pipeline::default();
        for shard in &self.registered {
            pipe.renew(
                *shard,
                s.alive(*shard),
                &s.liveness.incarnation(*shard),
                ttl,
            );
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
        let mut beat = Beat::default();
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
                Some(h) if h == &*s.liveness.incarnation(shard) => {
                    s.liveness.set_deadline(shard, Some(sent))
                }
                Some(other) => {
                    beat.lapsed.insert(shard);
                    tracing::error!(handler = s.group(), owner = %s.owner, shard, other, "another process renews this instance's liveness: two engines run with the same instance id; give each engine its own instance_id");
                }
                None => {
                    beat.lapsed.insert(shard);
                    if mono_ms() < s.liveness.deadline(shard) {
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
                    beat.instances_changed = true;
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
        let threshold = s.settings.partition_warning;
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
        Ok(beat)
    }

    /// Warns once when the category has more live partitions than
    /// `partition_warning_threshold` (again after it went below).
    pub(super) fn warn_partitions(&mut self, s: &Shared) {
        let partitions = self.partitions;
        let threshold = s.settings.partition_warning;
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_deadline_is_the_ttl_less_a_margin() {
        // A tenth of the TTL...
        assert_eq!(deadline_from(1_000, 10_000), 10_000);
        // ...at least 50 ms...
        assert_eq!(deadline_from(0, 300), 250);
        // ...at most half the TTL.
        assert_eq!(deadline_from(0, 60), 30);
    }

    #[test]
    fn liveness_keeps_incarnations_and_deadlines_per_shard() {
        let l = Liveness::new(Arc::from(vec!["a0".to_owned(), "a1".to_owned()]), 10_000);
        assert_eq!(l.alive(1), "a1");
        assert_eq!(l.alive(5), "");
        assert_eq!(&*l.incarnation(0), "");
        l.new_incarnation([1]);
        assert_eq!(&*l.incarnation(0), "");
        let first = l.incarnation(1);
        assert!(!first.is_empty());
        l.new_incarnation([0, 1]);
        assert_eq!(l.incarnation(0), l.incarnation(1));
        assert_ne!(l.incarnation(1), first);
        assert_eq!(l.deadline(0), 0);
        l.set_deadline(0, Some(1_000));
        assert_eq!(l.deadline(0), 10_000);
        assert_eq!(l.deadline(1), 0);
        l.set_deadline(0, None);
        assert_eq!(l.deadline(0), 0);
    }
}
