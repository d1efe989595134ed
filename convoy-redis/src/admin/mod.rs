//! Operating partitions by hand: list them, inspect a halted head, skip it
//! or move it to the key's dead letter stream, list and replay dead
//! letters; retry or discard an abandoned outbox record. The `convoy`
//! command line is a thin layer over [`Admin`].
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
//! Every action appends an audit record (`op`, `category`, `key`, `group`,
//! `entry`, `operator`, `time`, `forced`, `stream`, `fenced`, and
//! `dlq_entry` for dead-letter and replay; an outbox action adds `outbox`,
//! `message_id`, `type`, `reason` and `attempts`, with the record's id as
//! `entry`): an action on a partition to its shard's audit stream
//! `{s}convoy:audit`, in the same script as the action; an outbox action
//! to [`AUDIT_STREAM`]. [`Admin::audit`] reads them all.
//!
//! # Shards
//!
//! Every key of a partition starts with its shard's hash tag `{s}`, `s`
//! being `shard_of(key, S)` for the category's shard count `S` (see
//! [`keys`](super::keys)). The tools use the count an engine or publisher
//! recorded in Redis (`convoy:shards:{category}`), never a configured one,
//! and the default when none is recorded. Every command on one unit stays
//! in its key's shard; commands over many keys (the partitions report) are
//! sent as one pipeline per hash slot on a Redis Cluster.
//!
//! # The head
//!
//! A unit's head, for one consumer group (handler), is the group's first
//! pending entry (primary lane, then backfill lane), or, when nothing is
//! pending, the first entry after the group's last-delivered id (primary,
//! then backfill). A halted unit's head is pending and equals the unit's
//! `halt_entry`.
//!
//! # Layout
//!
//! One file per operation: `partitions.rs` (the report of
//! [`Admin::partitions`]), `inspect.rs` ([`Admin::inspect`]), `head.rs`
//! ([`Admin::skip`], [`Admin::dead_letter`]), `dlq.rs` ([`Admin::dlq`],
//! [`Admin::replay`]), `audit.rs` ([`Admin::audit`]), `outbox.rs`
//! ([`Admin::outbox_action`]: retry or discard an abandoned outbox record);
//! `status.rs` reads a
//! unit's status for the first two, `error.rs` holds [`AdminError`].

mod audit;
mod dlq;
mod error;
mod gaps;
mod head;
mod inspect;
mod outbox;
mod page;
mod partitions;
mod pauses;
mod status;
mod time;

pub use crate::pause::{KeyPause, PauseTarget};
pub use audit::{AuditRecord, KeyAudit};
pub use dlq::{DeadLetter, HeadReplay, ReplayOutcome};
pub use error::AdminError;
pub use head::{HeadOp, HeadOutcome, HeadRequest};
pub use inspect::{Head, Inspection};
pub use outbox::{OutboxOp, OutboxOutcome};
pub use page::{CategorySummary, Instance, KeyPage, RecentEntry, ScanCursor};
pub use partitions::{CategoryReport, Totals};
pub use pauses::PauseOutcome;
pub use status::{GapRecord, PartitionStatus};
pub use time::utc;

/// The stream operator actions are recorded in.
pub use convoy_core::names::AUDIT_STREAM;

use std::time::Duration;

use redis::Value;
use redis::aio::ConnectionManager;
use serde::Serialize;

use super::broker::RedisBroker;
use super::connection::{Client, Conn, Connection, query_by_slot};
use super::layout::recorded_shards;
use super::reply::{Entry, entries, text};
use super::unit::Unit;
use convoy_core::error::Error;
use convoy_core::names;

/// Which lane of a partition an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Lane {
    /// `{s}{category}:{key}`.
    Primary,
    /// `{s}{category}:{key}:{backfill}`.
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

/// Operator access to the partitions of a Redis broker.
#[derive(Clone)]
pub struct Admin {
    conn: Conn,
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
        Self::over(Conn::Shared(conn))
    }

    fn over(conn: Conn) -> Self {
        Admin {
            conn,
            backfill_suffix: "backfill".to_owned(),
        }
    }

    /// Connects to a `redis://` or `rediss://` URL, or to a cluster by a
    /// `redis+cluster://h1:p1,h2:p2/` URL; fails fast when Redis cannot be
    /// reached.
    pub async fn connect(url: &str) -> Result<Self, AdminError> {
        Self::connect_client(Client::open(url, None, "")?, url).await
    }

    /// Connects to a `rediss://` URL whose server certificate is signed by
    /// the CA in `ca_pem` (PEM).
    pub async fn connect_with_ca(url: &str, ca_pem: Vec<u8>) -> Result<Self, AdminError> {
        Self::connect_client(Client::open(url, Some(ca_pem), "")?, url).await
    }

    async fn connect_client(client: Client, url: &str) -> Result<Self, AdminError> {
        let conn = Connection::new(client, url)
            .with_response_timeout(Duration::from_secs(10))
            .shared()
            .await?;
        Ok(Self::over(conn))
    }

    /// Over a broker's shared connection.
    pub async fn from_broker(broker: &RedisBroker) -> Result<Self, AdminError> {
        Ok(Self::over(broker.connection().shared().await?))
    }

    /// The backfill lane suffix (`[server.priority_lanes] backfill_suffix`,
    /// default `backfill`).
    pub fn backfill_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.backfill_suffix = suffix.into();
        self
    }

    /// The unit `key` of `group` in `category` (of `shards` shards), named
    /// under `scope`.
    fn unit(&self, group: &str, scope: &str, category: &str, key: &str, shards: u32) -> Unit {
        Unit::new(
            group,
            scope,
            key,
            [category],
            &self.backfill_suffix,
            true,
            shards,
        )
    }

    /// The shard count Redis recorded for `category`, or the default
    /// ([`DEFAULT_SHARDS`](super::keys)) when none is recorded yet.
    async fn shards(&self, category: &str) -> Result<u32, AdminError> {
        let mut c = self.conn.clone();
        Ok(recorded_shards(&mut c, category)
            .await?
            .unwrap_or(names::DEFAULT_SHARDS))
    }

    /// The consumer groups (handlers) registered for a category's
    /// partitions, sorted (every shard holds a copy of the set: shard 0's
    /// is read).
    pub async fn groups(&self, category: &str) -> Result<Vec<String>, AdminError> {
        check_category(category)?;
        let mut c = self.conn.clone();
        let mut groups: Vec<String> = redis::cmd("SMEMBERS")
            .arg(names::groups(0, category))
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the registered handlers", e))?;
        groups.sort();
        Ok(groups)
    }

    /// The name of a dead letter stream: the key's `{s}{category}:{key}:dlq`
    /// (heads an operator moved aside) with a key, else the category's
    /// `{s}{category}:dlq` (ordinary handlers'), in the shard the
    /// category's recorded shard count puts it.
    pub async fn dlq_stream(
        &self,
        category: &str,
        key: Option<&str>,
    ) -> Result<String, AdminError> {
        check_category(category)?;
        let shards = self.shards(category).await?;
        Ok(match key {
            Some(k) => names::partition_dlq(names::shard_of(k, shards), category, k),
            None => names::category_dlq(category, shards),
        })
    }

    /// Why a category has no handler: it is unknown here (a typo), or no
    /// engine of a `sequential_by` handler ran on it yet.
    pub(crate) async fn no_handlers(&self, category: &str) -> AdminError {
        match self.categories().await {
            Ok(known) if !known.iter().any(|c| c == category) => AdminError::UnknownCategory {
                category: category.to_owned(),
                known,
            },
            _ => AdminError::NoHandlers {
                category: category.to_owned(),
            },
        }
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
                return Err(self.no_handlers(category).await);
            }
            return Err(AdminError::UnknownHandler {
                category: category.to_owned(),
                name: name.to_owned(),
                registered,
            });
        }
        match registered.len() {
            0 => Err(self.no_handlers(category).await),
            1 => Ok(registered[0].clone()),
            _ => {
                let mut halted = Vec::new();
                if let Some(key) = key {
                    let scopes = self.scopes(&registered, category).await?;
                    let shards = self.shards(category).await?;
                    // Every group's unit of the key is in the key's shard:
                    // one hash slot.
                    let mut pipe = redis::pipe();
                    for (g, scope) in registered.iter().zip(&scopes) {
                        pipe.cmd("HGET")
                            .arg(self.unit(g, scope, category, key, shards).state)
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

    /// How each group names its units: `*` for a sequential process
    /// manager (a correlation value spanning categories), else the category.
    async fn scopes(&self, groups: &[String], category: &str) -> Result<Vec<String>, AdminError> {
        if groups.is_empty() {
            return Ok(Vec::new());
        }
        // Each group's scope key is in a slot of its own on a cluster.
        let cmds = groups
            .iter()
            .map(|g| {
                let key = names::scope(g);
                let mut cmd = redis::cmd("GET");
                cmd.arg(&key);
                (key, cmd)
            })
            .collect();
        let mut c = self.conn.clone();
        let found = query_by_slot(&mut c, cmds)
            .await
            .map_err(|e| Error::redis("failed to read unit scopes", e))?;
        Ok(found
            .iter()
            .map(|s| text(s).unwrap_or_else(|| category.to_owned()))
            .collect())
    }

    async fn scope(&self, group: &str, category: &str) -> Result<String, AdminError> {
        let mut v = self.scopes(&[group.to_owned()], category).await?;
        Ok(v.pop().unwrap_or_else(|| category.to_owned()))
    }

    /// Entries of `stream` from `start` to `end`.
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
        Ok(entries(v))
    }
}

/// Refuses a name that cannot be a category (see
/// [`check_category`](convoy_core::key::check_category)), before any key is
/// derived from it.
fn check_category(category: &str) -> Result<(), AdminError> {
    convoy_core::key::check_category(category).map_err(|rule| AdminError::BadCategory {
        category: category.to_owned(),
        rule,
    })
}
