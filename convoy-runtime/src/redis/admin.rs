//! Operating partitions by hand: list them, inspect a halted head, skip it
//! or move it to the key's dead letter stream, list and replay dead
//! letters. The `convoy` command line is a thin layer over [`Admin`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), convoy_runtime::redis::admin::AdminError> {
//! use convoy_runtime::redis::admin::Admin;
//!
//! let admin = Admin::connect("redis://127.0.0.1:6379/").await?;
//! let report = admin.partitions("order").await?;
//! for p in report.partitions.iter().filter(|p| p.halted) {
//!     let group = &p.group;
//!     let head = admin.inspect("order", &p.key, group).await?;
//!     println!("{}: {:?}", p.key, head.head);
//!     // The head is poison: move it aside; the partition resumes with the
//!     // next event as soon as its owner is woken.
//!     admin.dead_letter("order", &p.key, group, false, "alice").await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Safety against running engines
//!
//! [`Admin::skip`] and [`Admin::dead_letter`] each run one Lua script (`head_action.lua`), so
//! they are atomic against the owner (whose every read, ack and failure
//! record is a script too). Without `force` they refuse unless the unit is
//! halted on exactly the head they would act on: the owner is then idle and
//! nothing is in flight. The script also writes a wake-up for the key (as a
//! publish does); the halted owner, woken, sees the halt cleared and resumes
//! with the next event, in order.
//!
//! With `force` on a running partition the script first **fences out** the
//! current owner: it bumps the unit's durable generation and deletes the
//! lease, so the owner's next fenced read, ack or failure record is refused
//! and it stops. With `[server.partitioning] max_unacked` above 1, the
//! first pending entry of a running partition may be one the owner already
//! handled and has not acknowledged yet; acting on it then skips nothing
//! that had not run, and the other handled-but-unacknowledged entries are
//! run again by the next owner (the usual at-least-once re-run). The event that owner has in flight at that moment may
//! still complete its side effects (possibly while the next owner starts on
//! the following event); it is never acknowledged by the old owner. The next
//! owner takes the unit at a newer generation and reclaims what is pending,
//! in order.
//!
//! Every action appends an audit record to [`AUDIT_STREAM`] (`op`,
//! `category`, `key`, `group`, `entry`, `operator`, `time`, `forced`,
//! `stream`, `fenced`, and `dlq_entry` for dead-letter and replay).
//!
//! # The head
//!
//! A unit's head, for one consumer group (handler), is the group's first
//! pending entry (primary lane, then backfill lane), or, when nothing is
//! pending, the first entry after the group's last-delivered id (primary,
//! then backfill). A halted unit's head is pending and equals the unit's
//! `halt_entry`.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::Serialize;

use super::reply::{Entry, entries, int, text};
use super::scripts::SCRIPTS;
use super::{RedisBroker, keys, now_ms};
use crate::config::redact_url;
use crate::envelope::Envelope;
use crate::error::Error;

/// The stream operator actions are recorded in.
pub const AUDIT_STREAM: &str = "convoy:audit";

/// Approximate cap of a category's wake stream (as the publisher uses).
const WAKE_MAXLEN: u64 = 100_000;

/// Keys per pipeline when listing partitions.
const CHUNK: usize = 200;

/// Why an [`Admin`] operation did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// Talking to Redis failed (see [`AdminError::is_unreachable`]).
    #[error(transparent)]
    Runtime(#[from] Error),

    /// Skip or dead-letter of a partition that is not halted, without force.
    #[error(
        "partition {category}:{key} is not halted for handler {group}; pass --force to act on a running partition (its owner is fenced out and the event it has in flight may still take effect)"
    )]
    NotHalted {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
    },

    /// The unit is halted, but on another entry than its current head.
    #[error(
        "partition {category}:{key} is halted for handler {group} on entry {halt_entry:?}, but its head is {head}; run `convoy inspect` again, or pass --force to act on the head anyway"
    )]
    HeadMoved {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
        /// The entry the unit halted on.
        halt_entry: String,
        /// The current head.
        head: String,
    },

    /// The head is not the entry the operator confirmed.
    #[error(
        "the head of partition {category}:{key} for handler {group} is now {head}, not {expected}; nothing was changed: run `convoy inspect` again and retry"
    )]
    HeadChanged {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
        /// The entry the caller expected.
        expected: String,
        /// The current head.
        head: String,
    },

    /// The partition has no entry for this group.
    #[error(
        "partition {category}:{key} has no event to act on for handler {group}; check the key with `convoy partitions {category}`"
    )]
    NothingToDo {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The consumer group (handler).
        group: String,
    },

    /// A lane's key holds something other than a stream.
    #[error(
        "partition {category}:{key}'s key {stream} holds a {kind}, not a stream; delete or rename that key, then run the command again to clear the halt"
    )]
    NotAStream {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The key that should be a stream.
        stream: String,
        /// What it holds (`TYPE`).
        kind: String,
    },

    /// Dead-letter of a head whose stream entry was deleted.
    #[error(
        "entry {entry} of partition {category}:{key} was deleted from the stream, so there is nothing to dead-letter; use `convoy skip` to acknowledge it"
    )]
    EntryDeleted {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The entry id.
        entry: String,
    },

    /// Replay of a dead letter that does not exist.
    #[error("no dead letter {id} in {stream}; list them with `convoy dlq {category} {key}`")]
    NoSuchDeadLetter {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The dead letter stream.
        stream: String,
        /// The id asked for.
        id: String,
    },

    /// Replay of a dead letter that is not an event of this partition.
    #[error(
        "dead letter {id} in {stream} {problem}; it cannot be replayed into partition {category}:{key}"
    )]
    NotReplayable {
        /// The category.
        category: String,
        /// The partition key.
        key: String,
        /// The dead letter stream.
        stream: String,
        /// The dead letter id.
        id: String,
        /// What is wrong with it.
        problem: String,
    },

    /// No consumer group is registered for the category.
    #[error(
        "no handler is registered for category {category} (the set convoy:groups:{category} is empty); start an engine with a sequential_by handler on it, or check the category name"
    )]
    NoHandlers {
        /// The category.
        category: String,
    },

    /// The named handler is not registered for the category.
    #[error(
        "handler {name} is not registered for category {category}; registered: {}",
        registered.join(", ")
    )]
    UnknownHandler {
        /// The category.
        category: String,
        /// The name given.
        name: String,
        /// The registered groups.
        registered: Vec<String>,
    },

    /// Several handlers could be meant.
    #[error(
        "category {category} has {} handlers ({}) and {} of them halted for key {key}; pass --handler with one of them",
        registered.len(),
        registered.join(", "),
        if halted.is_empty() { "none".to_owned() } else { halted.join(", ") }
    )]
    AmbiguousHandler {
        /// The category.
        category: String,
        /// The partition key (or `*` when none was given).
        key: String,
        /// The registered groups.
        registered: Vec<String>,
        /// The groups halted for the key.
        halted: Vec<String>,
    },

    /// Redis answered something this version does not understand.
    #[error("unexpected reply from redis to {what}: {reply}; is the server a Redis 7 or later?")]
    UnexpectedReply {
        /// The operation.
        what: String,
        /// The reply, rendered.
        reply: String,
    },
}

impl AdminError {
    /// Whether Redis could not be reached (connection refused or dropped, a
    /// timeout, the server loading): retrying later may work.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, AdminError::Runtime(e) if e.is_transient())
    }

    /// Whether the operation was refused by a safety check (nothing was
    /// changed).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            AdminError::NotHalted { .. }
                | AdminError::HeadMoved { .. }
                | AdminError::HeadChanged { .. }
                | AdminError::NothingToDo { .. }
                | AdminError::NotAStream { .. }
                | AdminError::EntryDeleted { .. }
        )
    }
}

/// Which lane of a partition an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// `{category}:{key}`.
    Primary,
    /// `{category}:{key}:{backfill}`.
    Backfill,
}

impl Lane {
    /// `primary` or `backfill`.
    pub fn as_str(self) -> &'static str {
        match self {
            Lane::Primary => "primary",
            Lane::Backfill => "backfill",
        }
    }
}

/// One unit: a partition key as one handler (consumer group) sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartitionStatus {
    /// The partition key.
    pub key: String,
    /// The consumer group (handler name).
    pub group: String,
    /// The instance holding the lease, if any.
    pub owner: Option<String>,
    /// Whether that instance is alive (its liveness key
    /// `convoy:alive:{group}:{owner}` exists); a lease of a dead owner is
    /// free for the taking.
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
    /// Entries delivered to the group and not yet acknowledged (both lanes).
    pub pending: u64,
    /// Entries not yet delivered to the group (both lanes); `None` when
    /// Redis cannot tell (entries deleted in the undelivered range).
    pub lag: Option<u64>,
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
}

/// Sums over one category's units.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Live partition keys (the index).
    pub partitions: usize,
    /// Units listed (keys × groups).
    pub units: usize,
    /// Units whose lease is held by a live owner.
    pub owned: usize,
    /// Halted units.
    pub halted: usize,
    /// Entries in primary lanes.
    pub length: u64,
    /// Entries in backfill lanes.
    pub backfill_length: u64,
    /// Pending entries over all units.
    pub pending: u64,
    /// Undelivered entries over all units whose lag is known.
    pub lag: u64,
    /// Units whose lag Redis could not tell.
    pub lag_unknown: usize,
}

/// Every unit of a category.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CategoryReport {
    /// The category.
    pub category: String,
    /// The registered consumer groups (handlers), sorted.
    pub groups: Vec<String>,
    /// One row per key and group, sorted by key then group.
    pub partitions: Vec<PartitionStatus>,
    /// Sums.
    pub totals: Totals,
}

/// A unit's head entry, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Head {
    /// The stream entry id.
    pub entry_id: String,
    /// The lane it is in.
    pub lane: Lane,
    /// The stream it is in.
    pub stream: String,
    /// Delivered to the group and not acknowledged.
    pub pending: bool,
    /// The consumer (fence token) it is pending for.
    pub consumer: Option<String>,
    /// How many times it was delivered (0 when not yet delivered).
    pub delivery_count: u64,
    /// Milliseconds since its last delivery.
    pub idle_ms: Option<u64>,
    /// The envelope, when the entry is one.
    pub envelope: Option<Envelope>,
    /// Why the entry could not be decoded (deleted, not an envelope).
    pub decode_error: Option<String>,
}

/// What [`Admin::inspect`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inspection {
    /// The unit's status (lease, halt, counts).
    pub status: PartitionStatus,
    /// The head, if the partition has one for this group.
    pub head: Option<Head>,
}

/// Skip or dead-letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadOp {
    /// Acknowledge the head without running it.
    Skip,
    /// Copy the head to `{category}:{key}:dlq`, then acknowledge it.
    DeadLetter,
}

impl HeadOp {
    /// `skip` or `dead_letter` (as in the audit stream).
    pub fn as_str(self) -> &'static str {
        match self {
            HeadOp::Skip => "skip",
            HeadOp::DeadLetter => "dead_letter",
        }
    }
}

/// An operator action on a unit's head.
#[derive(Debug, Clone, Copy)]
pub struct HeadRequest<'a> {
    /// The category.
    pub category: &'a str,
    /// The partition key.
    pub key: &'a str,
    /// The consumer group (handler).
    pub group: &'a str,
    /// Act on a running (not halted) partition, fencing its owner out.
    pub force: bool,
    /// Who did it (recorded in the audit stream and the dead letter).
    pub operator: &'a str,
    /// Act only if the head is still this entry (the one the operator
    /// looked at and confirmed).
    pub expect_entry: Option<&'a str>,
}

/// What a skip or dead-letter did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeadOutcome {
    /// Which operation.
    pub op: HeadOp,
    /// The entry acted on.
    pub entry_id: String,
    /// Its lane.
    pub lane: Lane,
    /// Its stream.
    pub stream: String,
    /// Whether it was pending (false: it was not delivered yet and the
    /// group was moved past it).
    pub was_pending: bool,
    /// Whether the partition was not halted on it (force was used).
    pub forced: bool,
    /// The lease token fenced out, when a running owner was.
    pub fenced: Option<String>,
    /// Whether the entry was deleted from the stream (only when the
    /// category has a single group; otherwise other groups still read it).
    pub deleted: bool,
    /// The dead letter's id in `{category}:{key}:dlq`.
    pub dlq_id: Option<String>,
    /// The audit record's id.
    pub audit_id: String,
}

/// One dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// Its id in the dead letter stream.
    pub dlq_id: String,
    /// The dead letter stream.
    pub stream: String,
    /// The group that gave up on it.
    pub group: Option<String>,
    /// The stream it came from.
    pub source: Option<String>,
    /// Its entry id there.
    pub entry: Option<String>,
    /// The error.
    pub error: Option<String>,
    /// When it was dead-lettered (ms since the Unix epoch).
    pub time_ms: Option<u64>,
    /// Who moved it (absent for automatic dead letters of ordinary handlers).
    pub operator: Option<String>,
    /// The envelope, when the entry is one.
    pub envelope: Option<Envelope>,
    /// Why the entry could not be decoded.
    pub decode_error: Option<String>,
}

/// What [`Admin::replay`] did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayOutcome {
    /// The dead letter replayed (now deleted).
    pub dlq_id: String,
    /// The new entry at the partition's tail.
    pub entry_id: String,
    /// The partition stream.
    pub stream: String,
    /// The audit record's id.
    pub audit_id: String,
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// Its id in [`AUDIT_STREAM`].
    pub id: String,
    /// Every field (`op`, `category`, `key`, `group`, `entry`, `operator`,
    /// `time`, `forced`, ...).
    pub fields: BTreeMap<String, String>,
}

/// Operator access to the partitions of a Redis broker.
#[derive(Clone)]
pub struct Admin {
    conn: ConnectionManager,
    backfill_suffix: String,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("backfill_suffix", &self.backfill_suffix)
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// Over an existing connection.
    pub fn new(conn: ConnectionManager) -> Self {
        Admin {
            conn,
            backfill_suffix: "backfill".to_owned(),
        }
    }

    /// Connects to a `redis://` or `rediss://` URL; fails fast (one retry,
    /// a 3 s connection timeout) when Redis cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, AdminError> {
        let client = redis::Client::open(url).map_err(|e| Error::Config {
            file: "<code>".into(),
            message: format!("{:?} is not a usable Redis URL: {e}", redact_url(url)),
        })?;
        Self::connect_client(client, url).await
    }

    /// Connects to a `rediss://` URL whose server certificate is signed by
    /// the CA in `ca_pem` (PEM).
    pub async fn connect_with_ca(url: &str, ca_pem: Vec<u8>) -> Result<Self, AdminError> {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca_pem),
        };
        let client = redis::Client::build_with_tls(url, certs).map_err(|e| Error::Config {
            file: "<code>".into(),
            message: format!(
                "{:?} with a CA certificate is not usable: {e}",
                redact_url(url)
            ),
        })?;
        Self::connect_client(client, url).await
    }

    async fn connect_client(client: redis::Client, url: &str) -> Result<Self, AdminError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(3)))
            .set_response_timeout(Some(Duration::from_secs(10)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| Error::redis(format!("cannot connect to {}", redact_url(url)), e))?;
        Ok(Self::new(conn))
    }

    /// Over a broker's shared connection.
    pub async fn from_broker(broker: &RedisBroker) -> Result<Self, AdminError> {
        Ok(Self::new(broker.conn().await?))
    }

    /// The backfill lane suffix (`[server.priority_lanes] backfill_suffix`,
    /// default `backfill`).
    pub fn backfill_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.backfill_suffix = suffix.into();
        self
    }

    fn backfill(&self, category: &str, key: &str) -> String {
        keys::backfill_stream(category, key, &self.backfill_suffix)
    }

    /// The consumer groups (handlers) registered for a category's
    /// partitions, sorted.
    pub async fn groups(&self, category: &str) -> Result<Vec<String>, AdminError> {
        let mut c = self.conn.clone();
        let mut groups: Vec<String> = redis::cmd("SMEMBERS")
            .arg(keys::groups(category))
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the registered handlers", e))?;
        groups.sort();
        Ok(groups)
    }

    /// Picks the consumer group an operation on `key` is meant for.
    ///
    /// With `handler`, it must name a registered group, exactly or as the
    /// last `::` segments (`ClientLedger` for `my_app::ClientLedger`).
    /// Without, the category must have one registered group, or exactly one
    /// halted for `key`.
    pub async fn resolve_group(
        &self,
        category: &str,
        key: Option<&str>,
        handler: Option<&str>,
    ) -> Result<String, AdminError> {
        let registered = self.groups(category).await?;
        if let Some(name) = handler {
            if registered.iter().any(|g| g == name) {
                return Ok(name.to_owned());
            }
            let suffix = format!("::{name}");
            let matching: Vec<&String> =
                registered.iter().filter(|g| g.ends_with(&suffix)).collect();
            if let [one] = matching.as_slice() {
                return Ok((*one).clone());
            }
            if registered.is_empty() {
                return Err(AdminError::NoHandlers {
                    category: category.to_owned(),
                });
            }
            return Err(AdminError::UnknownHandler {
                category: category.to_owned(),
                name: name.to_owned(),
                registered,
            });
        }
        match registered.len() {
            0 => Err(AdminError::NoHandlers {
                category: category.to_owned(),
            }),
            1 => Ok(registered[0].clone()),
            _ => {
                let mut halted = Vec::new();
                if let Some(key) = key {
                    let scopes = self.scopes(&registered, category).await?;
                    let mut pipe = redis::pipe();
                    for (g, scope) in registered.iter().zip(&scopes) {
                        pipe.cmd("HGET")
                            .arg(keys::unit(g, scope, key))
                            .arg("halted");
                    }
                    let mut c = self.conn.clone();
                    let flags: Vec<Option<String>> = pipe
                        .query_async(&mut c)
                        .await
                        .map_err(|e| Error::redis("failed to read halt flags", e))?;
                    halted = registered
                        .iter()
                        .zip(flags)
                        .filter(|(_, f)| f.as_deref() == Some("1"))
                        .map(|(g, _)| g.clone())
                        .collect();
                    if let [one] = halted.as_slice() {
                        return Ok(one.clone());
                    }
                }
                Err(AdminError::AmbiguousHandler {
                    category: category.to_owned(),
                    key: key.unwrap_or("*").to_owned(),
                    registered,
                    halted,
                })
            }
        }
    }

    /// Every live partition of `category` (the index) for every registered
    /// group: lease, lengths, pending, lag, halt; and totals. A few
    /// pipelined round trips, whatever the number of partitions.
    pub async fn partitions(&self, category: &str) -> Result<CategoryReport, AdminError> {
        let mut c = self.conn.clone();
        let (mut keys_, mut groups): (Vec<String>, Vec<String>) = redis::pipe()
            .cmd("SMEMBERS")
            .arg(keys::partition_index(category))
            .cmd("SMEMBERS")
            .arg(keys::groups(category))
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the partition index", e))?;
        keys_.sort();
        groups.sort();
        let mut rows = Vec::with_capacity(keys_.len() * groups.len());
        for chunk in keys_.chunks(CHUNK) {
            rows.extend(self.status_rows(category, chunk, &groups).await?);
        }
        let mut totals = Totals {
            partitions: keys_.len(),
            ..Totals::default()
        };
        let mut counted_len = std::collections::HashSet::new();
        for r in &rows {
            totals.units += 1;
            totals.owned += usize::from(r.owner_alive);
            totals.halted += usize::from(r.halted);
            if counted_len.insert(r.key.as_str()) {
                totals.length += r.length;
                totals.backfill_length += r.backfill_length;
            }
            totals.pending += r.pending;
            match r.lag {
                Some(l) => totals.lag += l,
                None => totals.lag_unknown += 1,
            }
        }
        Ok(CategoryReport {
            category: category.to_owned(),
            groups,
            partitions: rows,
            totals,
        })
    }

    /// One pipeline: per key both lanes' length and group info, per unit
    /// the lease and the state hash.
    async fn status_rows(
        &self,
        category: &str,
        keys_: &[String],
        groups: &[String],
    ) -> Result<Vec<PartitionStatus>, AdminError> {
        let scopes = self.scopes(groups, category).await?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for k in keys_ {
            let primary = keys::partition_stream(category, k);
            let backfill = self.backfill(category, k);
            pipe.cmd("XLEN").arg(&primary);
            pipe.cmd("XLEN").arg(&backfill);
            pipe.cmd("XINFO").arg("GROUPS").arg(&primary);
            pipe.cmd("XINFO").arg("GROUPS").arg(&backfill);
            for (g, scope) in groups.iter().zip(&scopes) {
                let lease = keys::lease(g, scope, k);
                pipe.cmd("GET").arg(&lease);
                pipe.cmd("HGETALL").arg(keys::unit(g, scope, k));
            }
        }
        let mut c = self.conn.clone();
        let values: Vec<Value> = pipe
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read partition status", e))?;
        let mut it = values.into_iter();
        let mut next = || it.next().unwrap_or(Value::Nil);
        let mut rows = Vec::new();
        let mut incarnations = Vec::new();
        for k in keys_ {
            let len_p = ok_int(&next()).max(0) as u64;
            let len_b = ok_int(&next()).max(0) as u64;
            let info_p = group_infos(&next());
            let info_b = group_infos(&next());
            for g in groups {
                let lease = next();
                let unit = string_map(&next());
                let (pending_p, lag_p) = lane_counts(&info_p, g, len_p);
                let (pending_b, lag_b) = lane_counts(&info_b, g, len_b);
                let lag = match (lag_p, lag_b) {
                    (Some(a), Some(b)) => Some(a + b),
                    _ => None,
                };
                incarnations.push(unit.get("inc").cloned());
                rows.push(status(
                    k,
                    g,
                    &lease,
                    &unit,
                    (len_p, len_b),
                    pending_p + pending_b,
                    lag,
                ));
            }
        }
        self.liveness(category, &mut rows, &incarnations).await?;
        Ok(rows)
    }

    /// Fills in whether each unit's owner is alive and how long its
    /// liveness lasts (one pipeline over the distinct owners). An owner is
    /// alive for a unit while its liveness key holds the incarnation the
    /// unit was taken in (`incarnations`, one per row; `None`: not known).
    async fn liveness(
        &self,
        category: &str,
        rows: &mut [PartitionStatus],
        incarnations: &[Option<String>],
    ) -> Result<(), AdminError> {
        let mut owners: Vec<(String, String)> = rows
            .iter()
            .filter_map(|r| Some((r.group.clone(), r.owner.clone()?)))
            .collect();
        owners.sort();
        owners.dedup();
        if owners.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (g, o) in &owners {
            pipe.cmd("PTTL").arg(keys::alive(g, o));
            pipe.cmd("GET").arg(keys::alive(g, o));
        }
        let mut c = self.conn.clone();
        let replies: Vec<(i64, Option<String>)> = pipe.query_async(&mut c).await.map_err(|e| {
            Error::redis(
                format!("failed to read the liveness of {category}'s owners"),
                e,
            )
        })?;
        let left: BTreeMap<(String, String), (i64, Option<String>)> =
            owners.into_iter().zip(replies).collect();
        for (r, inc) in rows.iter_mut().zip(incarnations) {
            let Some(owner) = &r.owner else { continue };
            let Some((ttl, live)) = left.get(&(r.group.clone(), owner.clone())) else {
                continue;
            };
            if inc.is_some() && live != inc {
                // Alive again, but in a later incarnation: this lease is dead.
                continue;
            }
            // -2: no such key (the owner is gone); -1: no expiry (alive).
            match Some(ttl) {
                Some(ms) if *ms >= 0 => {
                    r.owner_alive = true;
                    r.lease_ms_left = Some(*ms as u64);
                }
                Some(-1) => r.owner_alive = true,
                _ => {}
            }
        }
        Ok(())
    }

    /// How each group names its units: `*` for a sequential process
    /// manager (a correlation value spanning categories), else the category.
    async fn scopes(&self, groups: &[String], category: &str) -> Result<Vec<String>, AdminError> {
        if groups.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for g in groups {
            pipe.cmd("GET").arg(keys::scope(g));
        }
        let mut c = self.conn.clone();
        let found: Vec<Option<String>> = pipe
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read unit scopes", e))?;
        Ok(found
            .into_iter()
            .map(|s| s.unwrap_or_else(|| category.to_owned()))
            .collect())
    }

    async fn scope(&self, group: &str, category: &str) -> Result<String, AdminError> {
        let mut v = self.scopes(&[group.to_owned()], category).await?;
        Ok(v.pop().unwrap_or_else(|| category.to_owned()))
    }

    /// The unit's status and its head entry, decoded (see the module docs
    /// for what the head is).
    pub async fn inspect(
        &self,
        category: &str,
        key: &str,
        group: &str,
    ) -> Result<Inspection, AdminError> {
        let primary = keys::partition_stream(category, key);
        let backfill = self.backfill(category, key);
        let scope = self.scope(group, category).await?;
        let lease = keys::lease(group, &scope, key);
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for s in [&primary, &backfill] {
            pipe.cmd("XLEN").arg(s);
            pipe.cmd("XINFO").arg("GROUPS").arg(s);
            pipe.cmd("XPENDING")
                .arg(s)
                .arg(group)
                .arg("-")
                .arg("+")
                .arg(1);
        }
        pipe.cmd("GET").arg(&lease);
        pipe.cmd("HGETALL").arg(keys::unit(group, &scope, key));
        let mut c = self.conn.clone();
        let v: Vec<Value> = pipe
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the partition", e))?;
        let get = |i: usize| v.get(i).cloned().unwrap_or(Value::Nil);
        let lens = [ok_int(&get(0)).max(0) as u64, ok_int(&get(3)).max(0) as u64];
        let infos = [group_infos(&get(1)), group_infos(&get(4))];
        let pendings = [first_pending(&get(2)), first_pending(&get(5))];
        let unit = string_map(&get(7));
        let (pending_p, lag_p) = lane_counts(&infos[0], group, lens[0]);
        let (pending_b, lag_b) = lane_counts(&infos[1], group, lens[1]);
        let lag = match (lag_p, lag_b) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        let mut rows = [status(
            key,
            group,
            &get(6),
            &unit,
            (lens[0], lens[1]),
            pending_p + pending_b,
            lag,
        )];
        self.liveness(category, &mut rows, &[unit.get("inc").cloned()])
            .await?;
        let [status] = rows;
        let lanes = [(Lane::Primary, &primary), (Lane::Backfill, &backfill)];

        // The first pending entry, else the first not yet delivered.
        let mut head = None;
        for (i, (lane, stream)) in lanes.iter().enumerate() {
            if let Some(p) = &pendings[i] {
                let found = self.range(stream, &p.id, &p.id, Some(1)).await?;
                let entry = found.into_iter().next();
                head = Some(make_head(*lane, stream, &p.id, Some(p), entry.as_ref()));
                break;
            }
        }
        if head.is_none() {
            for (i, (lane, stream)) in lanes.iter().enumerate() {
                if lens[i] == 0 {
                    continue;
                }
                let start = match infos[i].iter().find(|g| g.name == group) {
                    Some(g) => format!("({}", g.last_delivered),
                    None => "-".to_owned(),
                };
                if let Some(e) = self
                    .range(stream, &start, "+", Some(1))
                    .await?
                    .into_iter()
                    .next()
                {
                    head = Some(make_head(*lane, stream, &e.id, None, Some(&e)));
                    break;
                }
            }
        }
        Ok(Inspection { status, head })
    }

    async fn range(
        &self,
        stream: &str,
        start: &str,
        end: &str,
        count: Option<usize>,
    ) -> Result<Vec<Entry>, AdminError> {
        let mut c = self.conn.clone();
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(stream).arg(start).arg(end);
        if let Some(n) = count {
            cmd.arg("COUNT").arg(n);
        }
        let v: Value = cmd
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis(format!("failed to read {stream}"), e))?;
        Ok(entries(&v))
    }

    /// Acknowledges the unit's head without running it, so the partition
    /// resumes with its next event. Refuses unless the unit is halted on its
    /// head, or `force` (see the module docs for what forcing a running
    /// partition does).
    pub async fn skip(
        &self,
        category: &str,
        key: &str,
        group: &str,
        force: bool,
        operator: &str,
    ) -> Result<HeadOutcome, AdminError> {
        self.act_on_head(
            HeadOp::Skip,
            &HeadRequest {
                category,
                key,
                group,
                force,
                operator,
                expect_entry: None,
            },
        )
        .await
    }

    /// Moves the unit's head to `{category}:{key}:dlq` (with `dlq_group`,
    /// `dlq_source`, `dlq_entry`, `dlq_error`, `dlq_time`, `dlq_operator`)
    /// and acknowledges it, so the partition resumes with its next event.
    /// The same checks as [`Admin::skip`].
    pub async fn dead_letter(
        &self,
        category: &str,
        key: &str,
        group: &str,
        force: bool,
        operator: &str,
    ) -> Result<HeadOutcome, AdminError> {
        self.act_on_head(
            HeadOp::DeadLetter,
            &HeadRequest {
                category,
                key,
                group,
                force,
                operator,
                expect_entry: None,
            },
        )
        .await
    }

    /// Skip or dead-letter, optionally only if the head is still the entry
    /// the operator confirmed ([`HeadRequest::expect_entry`]).
    pub async fn act_on_head(
        &self,
        op: HeadOp,
        req: &HeadRequest<'_>,
    ) -> Result<HeadOutcome, AdminError> {
        let HeadRequest {
            category,
            key,
            group,
            force,
            operator,
            expect_entry,
        } = *req;
        let primary = keys::partition_stream(category, key);
        let backfill = self.backfill(category, key);
        let scope = self.scope(group, category).await?;
        let mut inv = SCRIPTS.head_action.prepare_invoke();
        inv.key(keys::unit(group, &scope, key))
            .key(keys::lease(group, &scope, key))
            .key(&primary)
            .key(&backfill)
            .key(keys::groups(category))
            .key(AUDIT_STREAM)
            .key(keys::partition_dlq(category, key))
            .key(keys::wake_stream(category));
        inv.arg(group)
            .arg(if force { "1" } else { "0" })
            .arg(operator)
            .arg(now_ms())
            .arg(category)
            .arg(key)
            .arg(expect_entry.unwrap_or(""))
            .arg(WAKE_MAXLEN)
            .arg(op.as_str());
        let mut c = self.conn.clone();
        let v: Value = inv
            .invoke_async(&mut c)
            .await
            .map_err(|e| Error::redis(format!("{} script failed", op.as_str()), e))?;
        let items = match &v {
            Value::Array(items) => items.iter().map(text).collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        let at = |i: usize| items.get(i).cloned().flatten().unwrap_or_default();
        let unit = || (category.to_owned(), key.to_owned(), group.to_owned());
        match at(0).as_str() {
            "ok" => {
                let lane = if at(2) == "2" {
                    Lane::Backfill
                } else {
                    Lane::Primary
                };
                let fenced = at(4);
                Ok(HeadOutcome {
                    op,
                    entry_id: at(1),
                    lane,
                    stream: if lane == Lane::Backfill {
                        backfill
                    } else {
                        primary
                    },
                    was_pending: at(7) == "1",
                    forced: at(3) == "1",
                    fenced: (!fenced.is_empty()).then_some(fenced),
                    deleted: at(5) == "1",
                    dlq_id: (op == HeadOp::DeadLetter).then(|| at(8)),
                    audit_id: at(6),
                })
            }
            "not_a_stream" => {
                let (category, key, _) = unit();
                Err(AdminError::NotAStream {
                    category,
                    key,
                    stream: at(1),
                    kind: at(2),
                })
            }
            "unhalted" => Ok(HeadOutcome {
                op,
                entry_id: String::new(),
                lane: Lane::Primary,
                stream: primary,
                was_pending: false,
                forced: false,
                fenced: None,
                deleted: false,
                dlq_id: None,
                audit_id: at(1),
            }),
            "empty" => {
                let (category, key, group) = unit();
                Err(AdminError::NothingToDo {
                    category,
                    key,
                    group,
                })
            }
            "changed" => {
                let (category, key, group) = unit();
                Err(AdminError::HeadChanged {
                    category,
                    key,
                    group,
                    expected: expect_entry.unwrap_or_default().to_owned(),
                    head: at(1),
                })
            }
            "not_halted" => {
                let (category, key, group) = unit();
                Err(AdminError::NotHalted {
                    category,
                    key,
                    group,
                })
            }
            "head_moved" => {
                let (category, key, group) = unit();
                Err(AdminError::HeadMoved {
                    category,
                    key,
                    group,
                    halt_entry: at(2),
                    head: at(1),
                })
            }
            "deleted" => Err(AdminError::EntryDeleted {
                category: category.to_owned(),
                key: key.to_owned(),
                entry: at(1),
            }),
            _ => Err(AdminError::UnexpectedReply {
                what: op.as_str().to_owned(),
                reply: format!("{v:?}"),
            }),
        }
    }

    /// Dead letters of a category: `{category}:{key}:dlq` (moved by an
    /// operator) with a key, else `{category}:dlq` (ordinary handlers'),
    /// oldest first.
    pub async fn dlq(
        &self,
        category: &str,
        key: Option<&str>,
    ) -> Result<Vec<DeadLetter>, AdminError> {
        let stream = match key {
            Some(k) => keys::partition_dlq(category, k),
            None => keys::category_dlq(category),
        };
        let found = self.range(&stream, "-", "+", None).await?;
        Ok(found.iter().map(|e| dead_letter(&stream, e)).collect())
    }

    /// Puts a dead letter of `{category}:{key}:dlq` back at the tail of
    /// the partition's primary lane (the original envelope, message id
    /// included, without the `dlq_*` fields, as a new entry after
    /// everything already there), records the key in the index, wakes the
    /// owners and deletes the dead letter, in one script. Every handler of
    /// the category receives the event again.
    pub async fn replay(
        &self,
        category: &str,
        key: &str,
        dlq_id: &str,
        operator: &str,
    ) -> Result<ReplayOutcome, AdminError> {
        let dlq = keys::partition_dlq(category, key);
        let stream = keys::partition_stream(category, key);
        let mut inv = SCRIPTS.replay.prepare_invoke();
        inv.key(&dlq)
            .key(&stream)
            .key(keys::partition_index(category))
            .key(keys::wake_stream(category))
            .key(AUDIT_STREAM)
            .arg(dlq_id)
            .arg(key)
            .arg(operator)
            .arg(now_ms())
            .arg(category)
            .arg(WAKE_MAXLEN);
        let mut c = self.conn.clone();
        let v: Value = inv
            .invoke_async(&mut c)
            .await
            .map_err(|e| Error::redis("replay script failed", e))?;
        let items = match &v {
            Value::Array(items) => items.iter().map(text).collect::<Vec<_>>(),
            _ => Vec::new(),
        };
        let at = |i: usize| items.get(i).cloned().flatten().unwrap_or_default();
        let not = |problem: String| AdminError::NotReplayable {
            category: category.to_owned(),
            key: key.to_owned(),
            stream: dlq.clone(),
            id: dlq_id.to_owned(),
            problem,
        };
        match at(0).as_str() {
            "ok" => Ok(ReplayOutcome {
                dlq_id: dlq_id.to_owned(),
                entry_id: at(1),
                stream,
                audit_id: at(2),
            }),
            "missing" => Err(AdminError::NoSuchDeadLetter {
                category: category.to_owned(),
                key: key.to_owned(),
                stream: dlq.clone(),
                id: dlq_id.to_owned(),
            }),
            "empty" => Err(not("holds no event fields".to_owned())),
            "wrong_key" => Err(not(format!("is an event of key {:?}", at(1)))),
            _ => Err(AdminError::UnexpectedReply {
                what: "replay".to_owned(),
                reply: format!("{v:?}"),
            }),
        }
    }

    /// The latest `count` audit records, oldest first.
    pub async fn audit(&self, count: usize) -> Result<Vec<AuditRecord>, AdminError> {
        let mut c = self.conn.clone();
        let v: Value = redis::cmd("XREVRANGE")
            .arg(AUDIT_STREAM)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the audit stream", e))?;
        let mut out: Vec<AuditRecord> = entries(&v)
            .into_iter()
            .map(|e| AuditRecord {
                id: e.id,
                fields: e
                    .fields
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                    .collect(),
            })
            .collect();
        out.reverse();
        Ok(out)
    }
}

/// One group's line of XINFO GROUPS.
#[derive(Debug, Clone)]
struct GroupInfo {
    name: String,
    pending: u64,
    last_delivered: String,
    lag: Option<u64>,
}

/// A pending entry summary (XPENDING - + 1).
#[derive(Debug, Clone)]
struct Pending {
    id: String,
    consumer: String,
    idle_ms: u64,
    deliveries: u64,
}

fn ok_int(v: &Value) -> i64 {
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

fn string_map(v: &Value) -> BTreeMap<String, String> {
    pairs(v)
        .into_iter()
        .filter_map(|(k, v)| Some((k, text(&v)?)))
        .collect()
}

fn group_infos(v: &Value) -> Vec<GroupInfo> {
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

/// Pending and lag of `group` on one lane of `len` entries. A stream the
/// group has not read yet gets the group at id 0 on the first read, so all
/// of it is lag.
fn lane_counts(infos: &[GroupInfo], group: &str, len: u64) -> (u64, Option<u64>) {
    match infos.iter().find(|g| g.name == group) {
        Some(g) => (g.pending, g.lag),
        None => (0, Some(len)),
    }
}

fn first_pending(v: &Value) -> Option<Pending> {
    let Value::Array(items) = v else {
        return None;
    };
    let Value::Array(p) = items.first()? else {
        return None;
    };
    Some(Pending {
        id: text(p.first()?)?,
        consumer: p.get(1).and_then(text).unwrap_or_default(),
        idle_ms: p.get(2).and_then(int).unwrap_or(0).max(0) as u64,
        deliveries: p.get(3).and_then(int).unwrap_or(0).max(0) as u64,
    })
}

fn non_empty(m: &BTreeMap<String, String>, k: &str) -> Option<String> {
    m.get(k).filter(|v| !v.is_empty()).cloned()
}

fn status(
    key: &str,
    group: &str,
    lease: &Value,
    unit: &BTreeMap<String, String>,
    (length, backfill_length): (u64, u64),
    pending: u64,
    lag: Option<u64>,
) -> PartitionStatus {
    let token = text(lease);
    let (owner, generation) = match token.as_deref().and_then(|t| t.rsplit_once(':')) {
        Some((o, g)) => (Some(o.to_owned()), g.parse().ok()),
        None => (token.clone(), None),
    };
    let halted = unit.get("halted").map(String::as_str) == Some("1");
    let num = |k: &str| unit.get(k).and_then(|v| v.parse::<u64>().ok());
    PartitionStatus {
        key: key.to_owned(),
        group: group.to_owned(),
        owner,
        owner_alive: false,
        generation,
        durable_generation: num("gen").unwrap_or(0),
        lease_ms_left: None,
        length,
        backfill_length,
        pending,
        lag,
        halted,
        halt_reason: halted.then(|| non_empty(unit, "halt_reason")).flatten(),
        halt_error: halted.then(|| non_empty(unit, "halt_error")).flatten(),
        halt_since_ms: halted.then(|| num("halt_since")).flatten(),
        halt_entry: halted.then(|| non_empty(unit, "halt_entry")).flatten(),
        attempts: num("attempts").unwrap_or(0),
        last_error: non_empty(unit, "last_error"),
    }
}

fn make_head(
    lane: Lane,
    stream: &str,
    id: &str,
    pending: Option<&Pending>,
    entry: Option<&Entry>,
) -> Head {
    let (envelope, decode_error) = match entry {
        None => (
            None,
            Some("the entry was deleted from the stream".to_owned()),
        ),
        Some(e) => match e.envelope(stream) {
            Ok(env) => (Some(env), None),
            Err(err) => (None, Some(err.to_string())),
        },
    };
    Head {
        entry_id: id.to_owned(),
        lane,
        stream: stream.to_owned(),
        pending: pending.is_some(),
        consumer: pending.map(|p| p.consumer.clone()),
        delivery_count: pending.map_or(0, |p| p.deliveries),
        idle_ms: pending.map(|p| p.idle_ms),
        envelope,
        decode_error,
    }
}

fn dead_letter(stream: &str, e: &Entry) -> DeadLetter {
    let f: BTreeMap<&str, String> = e
        .fields
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    let envelope_fields = e
        .fields
        .iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with("dlq_"))
        .map(|(k, v)| (k.as_str(), v.as_slice()));
    let (envelope, decode_error) = match Envelope::from_fields(stream, &e.id, envelope_fields) {
        Ok(env) => (Some(env), None),
        Err(err) => (None, Some(err.to_string())),
    };
    let get = |k: &str| f.get(k).filter(|v| !v.is_empty()).cloned();
    DeadLetter {
        dlq_id: e.id.clone(),
        stream: stream.to_owned(),
        group: get("dlq_group"),
        source: get("dlq_source"),
        entry: get("dlq_entry"),
        error: get("dlq_error"),
        time_ms: get("dlq_time").and_then(|t| t.parse().ok()),
        operator: get("dlq_operator"),
        envelope,
        decode_error,
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    //! The scripts and the listing against a real `redis-server`, with the
    //! owner's state written by hand.

    use redis::AsyncCommands;

    use super::*;
    use crate::envelope::Priority;
    use crate::testing::RedisServer;

    const G: &str = "app::Ledger";

    fn envelope(seq: u32) -> Envelope {
        Envelope {
            id: format!("m{seq}"),
            type_name: "Posted".into(),
            category: "cat".into(),
            partition_key: Some("k".into()),
            time_ms: 1_700_000_000_000 + u64::from(seq),
            priority: Priority::Normal,
            correlation_id: None,
            payload: format!("{{\"seq\":{seq}}}"),
        }
    }

    async fn publish(c: &mut redis::aio::MultiplexedConnection, stream: &str, seq: u32) -> String {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(stream).arg("*");
        for (k, v) in envelope(seq).to_fields() {
            cmd.arg(k).arg(v);
        }
        cmd.query_async(c).await.expect("xadd")
    }

    /// Three entries of `cat:k`, all delivered to `owner:1` of group G,
    /// which holds the lease at generation 1.
    async fn running(server: &RedisServer) -> (redis::aio::MultiplexedConnection, Vec<String>) {
        let mut c = server.connection().await.expect("conn");
        let mut ids = Vec::new();
        for seq in 0..3 {
            ids.push(publish(&mut c, "cat:k", seq).await);
        }
        let _: () = redis::pipe()
            .cmd("SADD")
            .arg("convoy:groups:cat")
            .arg(G)
            .ignore()
            .cmd("SADD")
            .arg("cat:__partitions__")
            .arg("k")
            .ignore()
            .cmd("XGROUP")
            .arg("CREATE")
            .arg("cat:k")
            .arg(G)
            .arg("0")
            .ignore()
            .cmd("XREADGROUP")
            .arg("GROUP")
            .arg(G)
            .arg("owner:1")
            .arg("COUNT")
            .arg(10)
            .arg("STREAMS")
            .arg("cat:k")
            .arg(">")
            .ignore()
            .cmd("SET")
            .arg(keys::lease(G, "cat", "k"))
            .arg("owner:1")
            .ignore()
            .cmd("SET")
            .arg(keys::alive(G, "owner"))
            .arg(1)
            .arg("PX")
            .arg(60_000)
            .ignore()
            .cmd("HSET")
            .arg(keys::unit(G, "cat", "k"))
            .arg("gen")
            .arg(1)
            .ignore()
            .query_async(&mut c)
            .await
            .expect("setup");
        (c, ids)
    }

    async fn halt_on(c: &mut redis::aio::MultiplexedConnection, entry: &str) {
        let _: () = c
            .hset_multiple(
                keys::unit(G, "cat", "k"),
                &[
                    ("halted", "1"),
                    ("halt_reason", "max_retries exceeded"),
                    ("halt_error", "boom"),
                    ("halt_since", "1700000000000"),
                    ("halt_entry", entry),
                    ("head", entry),
                    ("attempts", "3"),
                    ("last_error", "boom"),
                ],
            )
            .await
            .expect("hset");
    }

    #[tokio::test]
    async fn skip_dead_letter_and_replay_check_fence_and_audit() {
        let server = RedisServer::start().expect("redis-server");
        let (mut c, ids) = running(&server).await;
        let admin = Admin::connect(&server.url()).await.expect("admin");

        // A running partition is refused without force.
        let e = admin
            .skip("cat", "k", G, false, "op")
            .await
            .expect_err("running");
        assert!(matches!(e, AdminError::NotHalted { .. }), "{e}");
        assert!(e.to_string().contains("--force"), "{e}");
        assert!(e.is_refusal());

        // Halted on another entry than the head: refused.
        halt_on(&mut c, &ids[1]).await;
        let e = admin
            .skip("cat", "k", G, false, "op")
            .await
            .expect_err("moved");
        assert!(matches!(e, AdminError::HeadMoved { .. }), "{e}");

        halt_on(&mut c, &ids[0]).await;
        let report = admin.partitions("cat").await.expect("partitions");
        assert_eq!(report.groups, vec![G.to_owned()]);
        let p = &report.partitions[0];
        assert_eq!(p.owner.as_deref(), Some("owner"));
        assert!(p.owner_alive);
        assert_eq!(p.generation, Some(1));
        assert_eq!(p.durable_generation, 1);
        assert!(p.lease_ms_left.is_some_and(|ms| ms > 50_000), "{p:?}");
        assert_eq!((p.length, p.pending, p.lag), (3, 3, Some(0)));
        assert!(p.halted);
        assert_eq!(p.halt_reason.as_deref(), Some("max_retries exceeded"));
        assert_eq!(p.halt_entry.as_deref(), Some(ids[0].as_str()));
        assert_eq!(report.totals.halted, 1);
        assert_eq!(report.totals.owned, 1);

        let i = admin.inspect("cat", "k", G).await.expect("inspect");
        let head = i.head.expect("head");
        assert_eq!(head.entry_id, ids[0]);
        assert!(head.pending);
        assert_eq!(head.delivery_count, 1);
        assert_eq!(head.consumer.as_deref(), Some("owner:1"));
        assert_eq!(head.envelope.expect("envelope").payload, "{\"seq\":0}");
        assert_eq!(i.status.attempts, 3);
        assert_eq!(i.status.last_error.as_deref(), Some("boom"));

        // The operator confirmed another entry: refused, nothing changed.
        let req = HeadRequest {
            category: "cat",
            key: "k",
            group: G,
            force: false,
            operator: "op",
            expect_entry: Some(&ids[1]),
        };
        let e = admin
            .act_on_head(HeadOp::Skip, &req)
            .await
            .expect_err("changed");
        assert!(matches!(e, AdminError::HeadChanged { .. }), "{e}");

        let req = HeadRequest {
            expect_entry: Some(&ids[0]),
            ..req
        };
        let out = admin.act_on_head(HeadOp::Skip, &req).await.expect("skip");
        assert_eq!(out.entry_id, ids[0]);
        assert!(!out.forced && out.was_pending && out.deleted);
        assert_eq!(out.fenced, None);
        let unit: BTreeMap<String, String> =
            c.hgetall(keys::unit(G, "cat", "k")).await.expect("unit");
        for gone in ["halted", "halt_entry", "halt_error", "head", "attempts"] {
            assert!(!unit.contains_key(gone), "{gone} in {unit:?}");
        }
        assert_eq!(unit["gen"], "1", "no fencing when halted");
        let len: u64 = c.xlen("cat:k").await.expect("xlen");
        assert_eq!(len, 2);
        let lease: Option<String> = c.get(keys::lease(G, "cat", "k")).await.expect("get");
        assert_eq!(
            lease.as_deref(),
            Some("owner:1"),
            "the owner keeps its lease"
        );

        // Running again: force fences the owner out.
        let e = admin
            .skip("cat", "k", G, false, "op")
            .await
            .expect_err("running");
        assert!(matches!(e, AdminError::NotHalted { .. }), "{e}");
        let out = admin
            .skip("cat", "k", G, true, "op")
            .await
            .expect("forced skip");
        assert_eq!(out.entry_id, ids[1]);
        assert!(out.forced);
        assert_eq!(out.fenced.as_deref(), Some("owner:1"));
        let lease: Option<String> = c.get(keys::lease(G, "cat", "k")).await.expect("get");
        assert_eq!(lease, None);
        let generation: String = c.hget(keys::unit(G, "cat", "k"), "gen").await.expect("gen");
        assert_eq!(generation, "2");

        // Dead-letter the last one (no lease now: nothing to fence).
        let out = admin
            .dead_letter("cat", "k", G, true, "alice")
            .await
            .expect("dead letter");
        assert_eq!(out.entry_id, ids[2]);
        assert_eq!(out.fenced, None);
        let dlq_id = out.dlq_id.expect("dlq id");
        let letters = admin.dlq("cat", Some("k")).await.expect("dlq");
        assert_eq!(letters.len(), 1);
        let l = &letters[0];
        assert_eq!(l.dlq_id, dlq_id);
        assert_eq!(l.group.as_deref(), Some(G));
        assert_eq!(l.entry.as_deref(), Some(ids[2].as_str()));
        assert_eq!(l.operator.as_deref(), Some("alice"));
        assert_eq!(l.source.as_deref(), Some("cat:k"));
        assert_eq!(l.envelope.as_ref().expect("envelope"), &envelope(2));
        let e = admin
            .skip("cat", "k", G, true, "op")
            .await
            .expect_err("empty");
        assert!(matches!(e, AdminError::NothingToDo { .. }), "{e}");

        // Replay: back at the tail, index and wake-up written, letter gone.
        let _: () = c.srem("cat:__partitions__", "k").await.expect("srem");
        let r = admin
            .replay("cat", "k", &dlq_id, "bob")
            .await
            .expect("replay");
        let tail: Vec<Entry> = entries(
            &redis::cmd("XRANGE")
                .arg("cat:k")
                .arg("-")
                .arg("+")
                .query_async::<Value>(&mut c)
                .await
                .expect("xrange"),
        );
        assert_eq!(tail.len(), 1);
        assert_eq!(tail[0].id, r.entry_id);
        assert_eq!(tail[0].envelope("cat:k").expect("envelope"), envelope(2));
        assert!(
            tail[0]
                .fields
                .iter()
                .flatten()
                .all(|(k, _)| !k.starts_with("dlq_"))
        );
        let member: bool = c
            .sismember("cat:__partitions__", "k")
            .await
            .expect("sismember");
        assert!(member);
        let wake: u64 = c.xlen("cat:__wake__").await.expect("xlen");
        assert_eq!(wake, 4, "every action wakes the key's owner");
        assert!(admin.dlq("cat", Some("k")).await.expect("dlq").is_empty());
        let e = admin
            .replay("cat", "k", &dlq_id, "bob")
            .await
            .expect_err("gone");
        assert!(matches!(e, AdminError::NoSuchDeadLetter { .. }), "{e}");

        let audit = admin.audit(10).await.expect("audit");
        let ops: Vec<(&str, &str, &str)> = audit
            .iter()
            .map(|a| {
                (
                    a.fields["op"].as_str(),
                    a.fields["operator"].as_str(),
                    a.fields["forced"].as_str(),
                )
            })
            .collect();
        assert_eq!(
            ops,
            vec![
                ("skip", "op", "0"),
                ("skip", "op", "1"),
                ("dead_letter", "alice", "1"),
                ("replay", "bob", "0"),
            ]
        );
        assert_eq!(audit[0].fields["entry"], ids[0]);
        assert_eq!(audit[1].fields["fenced"], "owner:1");
        assert_eq!(audit[2].fields["dlq_entry"], dlq_id);
        assert_eq!(audit[3].fields["entry"], r.entry_id);
    }

    #[tokio::test]
    async fn undelivered_heads_and_several_groups() {
        let server = RedisServer::start().expect("redis-server");
        let mut c = server.connection().await.expect("conn");
        let a = publish(&mut c, "cat:k", 0).await;
        let b = publish(&mut c, "cat:k", 1).await;
        let _: () = c
            .sadd("convoy:groups:cat", &["app::A", "app::B"])
            .await
            .expect("sadd");
        let admin = Admin::connect(&server.url()).await.expect("admin");

        // Nothing delivered yet: the head is the first entry.
        let i = admin.inspect("cat", "k", "app::A").await.expect("inspect");
        let head = i.head.expect("head");
        assert_eq!((head.entry_id.as_str(), head.pending), (a.as_str(), false));
        assert_eq!(head.delivery_count, 0);
        assert_eq!(i.status.lag, Some(2));

        let out = admin
            .skip("cat", "k", "app::A", true, "op")
            .await
            .expect("skip");
        assert_eq!(out.entry_id, a);
        assert!(!out.was_pending);
        assert!(!out.deleted, "another group still reads it");
        let len: u64 = c.xlen("cat:k").await.expect("xlen");
        assert_eq!(len, 2);
        let i = admin.inspect("cat", "k", "app::A").await.expect("inspect");
        assert_eq!(i.head.expect("head").entry_id, b, "A moved past the first");
        let i = admin.inspect("cat", "k", "app::B").await.expect("inspect");
        assert_eq!(i.head.expect("head").entry_id, a, "B still has it");

        // Handler resolution.
        let e = admin
            .resolve_group("cat", Some("k"), None)
            .await
            .expect_err("two groups");
        assert!(matches!(e, AdminError::AmbiguousHandler { .. }), "{e}");
        assert!(e.to_string().contains("app::A, app::B"), "{e}");
        let _: () = c
            .hset(keys::unit("app::B", "cat", "k"), "halted", "1")
            .await
            .expect("hset");
        assert_eq!(
            admin
                .resolve_group("cat", Some("k"), None)
                .await
                .expect("halted one"),
            "app::B"
        );
        assert_eq!(
            admin
                .resolve_group("cat", None, Some("A"))
                .await
                .expect("suffix"),
            "app::A"
        );
        let e = admin
            .resolve_group("cat", None, Some("C"))
            .await
            .expect_err("unknown");
        assert!(matches!(e, AdminError::UnknownHandler { .. }), "{e}");
        let e = admin
            .resolve_group("other", None, None)
            .await
            .expect_err("none");
        assert!(matches!(e, AdminError::NoHandlers { .. }), "{e}");
    }

    #[tokio::test]
    async fn unreachable_redis_is_reported_as_such() {
        let port = crate::testing::free_port().expect("port");
        let e = Admin::connect(&format!("redis://user:secret@127.0.0.1:{port}/"))
            .await
            .expect_err("nothing listens");
        assert!(e.is_unreachable(), "{e:?}");
        let text = crate::error::chain(&e);
        assert!(text.contains("cannot connect"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}
