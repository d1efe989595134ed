//! A unit's status as the operators' tools read it: lease and liveness of
//! its owner, lengths, pending, lag and halt (shared by the partitions
//! report and the inspection of one unit).

use std::collections::BTreeMap;

use redis::Value;
use serde::Serialize;

use super::{Admin, AdminError};
use crate::connection::query_by_slot;
use crate::reply::{int, text};
use convoy_core::error::Error;
use convoy_core::names;

/// One unit: a partition key as one handler (consumer group) sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionStatus {
    /// The partition key.
    pub key: String,
    /// The key's shard: every Redis key of the unit starts with `{shard}`.
    pub shard: u32,
    /// The consumer group (handler name).
    pub group: String,
    /// The instance holding the lease, if any.
    pub owner: Option<String>,
    /// Whether that instance is alive in the key's shard (its liveness key
    /// there, `{shard}convoy:alive:{group}:{owner}`, exists and holds the
    /// incarnation the unit was taken in): the lease scripts check that
    /// key, and a lease of a dead owner is free for the taking.
    pub owner_alive: bool,
    /// The generation of the held lease (from its token `{owner}:{gen}`).
    pub generation: Option<u64>,
    /// The unit's durable generation counter (the last generation issued;
    /// an operator's forced action bumps it too).
    pub durable_generation: u64,
    /// Milliseconds left on the lease: on the owner's liveness key, which
    /// the owner renews every heartbeat.
    pub lease_ms_left: Option<u64>,
    /// Entries in the primary lane.
    pub length: u64,
    /// Entries in the backfill lane.
    pub backfill_length: u64,
    /// Entries delivered to the group's owner and not yet acknowledged
    /// (both lanes): the event in flight, the rest of the batch it was read
    /// in, or a halted head and the entries read with it.
    pub pending: u64,
    /// Entries not yet delivered to the group (both lanes); `None` when
    /// Redis cannot tell (entries deleted in the undelivered range).
    pub undelivered: Option<u64>,
    /// Entries the handler has not finished: `pending + undelivered`, what
    /// is left to handle (an entry counts as finished once acknowledged,
    /// skipped or dead-lettered). The `convoy_lag` gauge of the handler
    /// and category is the sum of this over the category's partitions.
    /// `None` when `undelivered` is unknown.
    pub lag: Option<u64>,
    /// For a halted unit: the entries waiting behind its head (`lag - 1`,
    /// read ahead or not); they run, in order, once the head is skipped or
    /// dead-lettered. `None` when not halted or the lag is unknown.
    pub behind_halt: Option<u64>,
    /// When the owner's handler paused, in ms since the Unix epoch: an
    /// outage of its dependency (as many keys failing with transient
    /// errors at once as `outage_threshold`), during which the owner
    /// starts no event but one probe and keeps its leases. `None` when it
    /// is not paused or the owner is not alive.
    pub paused_since_ms: Option<u64>,
    /// Whether the unit is halted.
    pub halted: bool,
    /// Why (`max_retries exceeded`).
    pub halt_reason: Option<String>,
    /// The head's last error when it halted.
    pub halt_error: Option<String>,
    /// When it halted (ms since the Unix epoch).
    pub halt_since_ms: Option<u64>,
    /// The entry it halted on.
    pub halt_entry: Option<String>,
    /// Failures of the current head so far.
    pub attempts: u64,
    /// The last handler error recorded for the unit.
    pub last_error: Option<String>,
    /// The last gap recorded for the key (`on_poison = "dead_letter"`
    /// moved a poisoned head to the key's dead letters), until an operator
    /// acknowledges it (`convoy gaps --ack`).
    pub gap: Option<GapRecord>,
    /// Gaps recorded for the key since it was first owned.
    pub gaps: u64,
    /// An operator's pause that holds the key for this handler (`convoy
    /// pause`): its owner starts no new event of the key until it is
    /// resumed.
    pub key_pause: Option<crate::pause::KeyPause>,
}

/// A gap recorded beside a unit: the head that `on_poison =
/// "dead_letter"` moved to the key's dead letters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GapRecord {
    /// The skipped entry.
    pub entry_id: String,
    /// The skipped event's message id.
    pub message_id: String,
    /// Its last error.
    pub reason: String,
    /// When it was moved (ms since the Unix epoch).
    pub time_ms: u64,
    /// Its id in the key's dead letter stream.
    pub dead_letter_id: String,
}

impl Admin {
    /// Fills in whether each unit's owner is alive and how long its
    /// liveness lasts: the owner's liveness key in the unit's shard (one
    /// pipeline per hash slot over the distinct shards and owners). An
    /// owner is alive for a unit while that key holds the incarnation the
    /// unit was taken in (`incarnations`, one per row; `None`: not known).
    pub(super) async fn liveness(
        &self,
        category: &str,
        rows: &mut [PartitionStatus],
        incarnations: &[Option<String>],
    ) -> Result<(), AdminError> {
        let mut owners: Vec<(u32, String, String)> = rows
            .iter()
            .filter_map(|r| Some((r.shard, r.group.clone(), r.owner.clone()?)))
            .collect();
        owners.sort();
        owners.dedup();
        if owners.is_empty() {
            return Ok(());
        }
        let mut cmds = Vec::with_capacity(2 * owners.len());
        for (s, g, o) in &owners {
            let alive = names::alive(*s, g, o);
            for name in ["PTTL", "GET"] {
                let mut cmd = redis::cmd(name);
                cmd.arg(&alive);
                cmds.push((alive.clone(), cmd));
            }
        }
        // Whether each owner's handler is paused (an outage of its
        // dependency): one key per handler and owner, whatever the shard.
        let mut handlers: Vec<(String, String)> = owners
            .iter()
            .map(|(_, g, o)| (g.clone(), o.clone()))
            .collect();
        handlers.sort();
        handlers.dedup();
        for (g, o) in &handlers {
            let key = names::paused(g, o);
            let mut cmd = redis::cmd("GET");
            cmd.arg(&key);
            cmds.push((key, cmd));
        }
        let mut c = self.conn.clone();
        let replies = query_by_slot(&mut c, cmds).await.map_err(|e| {
            Error::redis(
                format!("failed to read the liveness of {category}'s owners"),
                e,
            )
        })?;
        let (alive_replies, paused_replies) = replies.split_at(2 * owners.len());
        let paused: BTreeMap<(String, String), u64> = handlers
            .into_iter()
            .zip(paused_replies)
            .filter_map(|(h, v)| Some((h, u64::try_from(int(v)?).ok()?)))
            .collect();
        let left: BTreeMap<(u32, String, String), (i64, Option<String>)> = owners
            .into_iter()
            .zip(alive_replies.chunks(2))
            .map(|(owner, r)| {
                let ttl = r.first().and_then(int).unwrap_or(-2);
                (owner, (ttl, r.get(1).and_then(text)))
            })
            .collect();
        for (r, inc) in rows.iter_mut().zip(incarnations) {
            let Some(owner) = &r.owner else { continue };
            let Some((ttl, live)) = left.get(&(r.shard, r.group.clone(), owner.clone())) else {
                continue;
            };
            if inc.is_some() && live != inc {
                // Alive again, but in a later incarnation: this lease is dead.
                continue;
            }
            // -2: no such key (the owner is gone); -1: no expiry (alive).
            match *ttl {
                ms if ms >= 0 => {
                    r.owner_alive = true;
                    r.lease_ms_left = Some(ms as u64);
                }
                -1 => r.owner_alive = true,
                _ => {}
            }
            if r.owner_alive {
                r.paused_since_ms = paused.get(&(r.group.clone(), owner.clone())).copied();
            }
        }
        Ok(())
    }
}

/// One group's line of XINFO GROUPS.
#[derive(Debug, Clone)]
pub(super) struct GroupInfo {
    pub(super) name: String,
    pub(super) pending: u64,
    pub(super) last_delivered: String,
    pub(super) lag: Option<u64>,
}

pub(super) fn ok_int(v: &Value) -> i64 {
    int(v).unwrap_or(0)
}

/// Field/value pairs of a reply (a flat array in RESP2, a map in RESP3).
fn pairs(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Array(flat) => flat
            .chunks(2)
            .filter_map(|c| Some((text(c.first()?)?, c.get(1)?.clone())))
            .collect(),
        Value::Map(kv) => kv
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, v.clone())))
            .collect(),
        _ => Vec::new(),
    }
}

pub(super) fn string_map(v: &Value) -> BTreeMap<String, String> {
    pairs(v)
        .into_iter()
        .filter_map(|(k, v)| Some((k, text(&v)?)))
        .collect()
}

pub(super) fn group_infos(v: &Value) -> Vec<GroupInfo> {
    let Value::Array(groups) = v else {
        return Vec::new();
    };
    groups
        .iter()
        .map(|g| {
            let f: BTreeMap<String, Value> = pairs(g).into_iter().collect();
            GroupInfo {
                name: f.get("name").and_then(text).unwrap_or_default(),
                pending: f.get("pending").and_then(int).unwrap_or(0).max(0) as u64,
                last_delivered: f
                    .get("last-delivered-id")
                    .and_then(text)
                    .unwrap_or_else(|| "0-0".to_owned()),
                lag: f.get("lag").and_then(int).map(|l| l.max(0) as u64),
            }
        })
        .collect()
}

/// One lane of a unit as read: its length and its groups' lines of XINFO
/// GROUPS.
pub(super) type LaneInfo<'a> = (u64, &'a [GroupInfo]);

/// Pending and undelivered entries of `group` on one lane of `len`
/// entries. A stream the group has not read yet gets the group at id 0 on
/// the first read, so all of it is undelivered.
fn lane_counts(infos: &[GroupInfo], group: &str, len: u64) -> (u64, Option<u64>) {
    match infos.iter().find(|g| g.name == group) {
        Some(g) => (g.pending, g.lag),
        None => (0, Some(len)),
    }
}

fn non_empty(m: &BTreeMap<String, String>, k: &str) -> Option<String> {
    m.get(k).filter(|v| !v.is_empty()).cloned()
}

/// The status of `group`'s unit `key` in `shard` from its lease token, its
/// state hash and its lanes (primary, backfill).
pub(super) fn status(
    key: &str,
    shard: u32,
    group: &str,
    lease: &Value,
    unit: &BTreeMap<String, String>,
    [(length, primary), (backfill_length, backfill)]: [LaneInfo<'_>; 2],
) -> PartitionStatus {
    let (pending_p, lag_p) = lane_counts(primary, group, length);
    let (pending_b, lag_b) = lane_counts(backfill, group, backfill_length);
    let pending = pending_p + pending_b;
    let undelivered = lag_p.zip(lag_b).map(|(a, b)| a + b);
    let token = text(lease);
    let (owner, generation) = match token.as_deref().and_then(|t| t.rsplit_once(':')) {
        Some((o, g)) => (Some(o.to_owned()), g.parse().ok()),
        None => (token.clone(), None),
    };
    let halted = unit.get("halted").map(String::as_str) == Some("1");
    let num = |k: &str| unit.get(k).and_then(|v| v.parse::<u64>().ok());
    let lag = undelivered.map(|u| u + pending);
    PartitionStatus {
        key: key.to_owned(),
        shard,
        group: group.to_owned(),
        owner,
        owner_alive: false,
        generation,
        durable_generation: num("gen").unwrap_or(0),
        lease_ms_left: None,
        paused_since_ms: None,
        length,
        backfill_length,
        pending,
        undelivered,
        lag,
        behind_halt: lag.filter(|_| halted).map(|l| l.saturating_sub(1)),
        halted,
        halt_reason: halted.then(|| non_empty(unit, "halt_reason")).flatten(),
        halt_error: halted.then(|| non_empty(unit, "halt_error")).flatten(),
        halt_since_ms: halted.then(|| num("halt_since")).flatten(),
        halt_entry: halted.then(|| non_empty(unit, "halt_entry")).flatten(),
        attempts: num("attempts").unwrap_or(0),
        last_error: non_empty(unit, "last_error"),
        gap: non_empty(unit, "gap_entry").map(|entry_id| GapRecord {
            entry_id,
            message_id: non_empty(unit, "gap_message").unwrap_or_default(),
            reason: non_empty(unit, "gap_reason").unwrap_or_default(),
            time_ms: num("gap_time").unwrap_or(0),
            dead_letter_id: non_empty(unit, "gap_dlq").unwrap_or_default(),
        }),
        gaps: num("gaps").unwrap_or(0),
        key_pause: None,
    }
}
