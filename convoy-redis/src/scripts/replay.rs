//! `replay.lua`: an operator's replay of a dead letter at the tail of its
//! partition.

use super::{Invocation, SCRIPTS, Status, call};
use crate::connection::Conn;
use crate::tracing;
use crate::wake;
use convoy_core::error::Error;
use convoy_core::names;

/// Puts dead letter `dlq_id` of `{s}{category}:{key}:dlq` back at the tail
/// of `{s}{category}:{key}`, in the key's shard `s`, for the handlers named
/// (see `replay.lua`).
#[derive(Debug)]
pub(crate) struct Replay<'a> {
    pub(crate) category: &'a str,
    pub(crate) key: &'a str,
    /// The key's shard.
    pub(crate) shard: u32,
    pub(crate) dlq_id: &'a str,
    pub(crate) operator: &'a str,
    /// The handlers (consumer groups) it goes to; empty: the one that
    /// dead-lettered it.
    pub(crate) to: &'a [String],
    /// Now, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
}

/// What [`Replay`] did, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Replayed {
    /// Replayed as `entry_id` to handlers `to`.
    Done {
        entry_id: String,
        audit_id: String,
        to: Vec<String>,
    },
    /// The dead letter names no handler, and none was given.
    NoGroup,
    /// A handler given is not registered for the category.
    UnknownGroup { group: String },
    /// No such dead letter.
    Missing,
    /// The dead letter holds no envelope fields.
    Empty,
    /// Its envelope names another key.
    WrongKey { key: String },
}

impl Replay<'_> {
    pub(crate) async fn run(&self, conn: &mut Conn) -> Result<Replayed, Error> {
        let s = self.shard;
        let mut inv = Invocation::new(&SCRIPTS.replay);
        inv.key(names::partition_dlq(s, self.category, self.key))
            .key(names::partition_stream(s, self.category, self.key))
            .key(names::partition_index(s, self.category))
            .key(names::audit(s))
            .key(names::published(s, self.category))
            .key(names::groups(s, self.category))
            .arg(self.dlq_id)
            .arg(self.key)
            .arg(self.operator)
            .arg(self.now_ms)
            .arg(self.category)
            .arg(self.to.join("\n"));
        let reply = call("replay", &inv, conn, "replay script failed").await?;
        let Status::Word(status) = &reply.status else {
            return Err(reply.unexpected());
        };
        Ok(match status.as_str() {
            "ok" => {
                if let Err(e) = wake::hint(conn, [(self.category, self.key)], false).await {
                    tracing::debug!(error = %convoy_core::error::chain(&e), "replayed, but the wake-up failed; the owner finds the entry at its next poll");
                }
                Replayed::Done {
                    entry_id: reply.text(0),
                    audit_id: reply.text(1),
                    to: reply.text(3).split('\n').map(str::to_owned).collect(),
                }
            }
            "missing" => Replayed::Missing,
            "empty" => Replayed::Empty,
            "no_group" => Replayed::NoGroup,
            "unknown_group" => Replayed::UnknownGroup {
                group: reply.text(0),
            },
            "wrong_key" => Replayed::WrongKey { key: reply.text(0) },
            _ => return Err(reply.unexpected()),
        })
    }
}

/// Puts dead letter `dlq_id` back at the head of its partition for `unit`'s
/// group: before every entry the group has not finished (see
/// `replay_head.lua`).
#[derive(Debug)]
pub(crate) struct ReplayHead<'a> {
    pub(crate) unit: &'a crate::unit::Unit,
    pub(crate) category: &'a str,
    pub(crate) dlq_id: &'a str,
    pub(crate) operator: &'a str,
    /// Act on a partition with events in flight, fencing its owner out.
    pub(crate) force: bool,
    /// Act only if the group's first unfinished entry of the primary lane
    /// is this one (`Some("")`: none).
    pub(crate) expect_head: Option<&'a str>,
    /// Act only if the unit's durable generation is this one.
    pub(crate) expect_generation: Option<u64>,
    /// Now, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
}

/// What [`ReplayHead`] did, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReplayedHead {
    /// Replayed as `entry_id`, before `moved` entries copied after it.
    Done {
        entry_id: String,
        audit_id: String,
        moved: u64,
    },
    /// Not replayed: why, in words for the operator.
    Refused(String),
    /// No such dead letter.
    Missing,
    /// The first unfinished entry is not the expected one (`""`: none).
    Changed { head: String },
    /// The unit's durable generation is not the expected one.
    GenerationMoved { generation: u64 },
}

impl ReplayHead<'_> {
    pub(crate) async fn run(&self, conn: &mut Conn) -> Result<ReplayedHead, Error> {
        let unit = self.unit;
        let s = unit.shard;
        let key = unit.key.as_str();
        let mut inv = Invocation::new(&SCRIPTS.replay_head);
        inv.key(names::partition_dlq(s, self.category, key))
            .key(names::partition_stream(s, self.category, key))
            .key(names::partition_index(s, self.category))
            .key(names::audit(s))
            .key(names::published(s, self.category))
            .key(names::groups(s, self.category))
            .key(&*unit.state)
            .key(&*unit.lease)
            .arg(self.dlq_id)
            .arg(key)
            .arg(self.operator)
            .arg(self.now_ms)
            .arg(self.category)
            .arg(&*unit.group)
            .arg(if self.force { "1" } else { "0" })
            .arg(match self.expect_head {
                None => "",
                Some("") => "none",
                Some(entry) => entry,
            })
            .arg(
                self.expect_generation
                    .map(|g| g.to_string())
                    .unwrap_or_default(),
            );
        let reply = call("replay_head", &inv, conn, "replay script failed").await?;
        let Status::Word(status) = &reply.status else {
            return Err(reply.unexpected());
        };
        Ok(match status.as_str() {
            "ok" => {
                if let Err(e) = wake::hint(conn, [(self.category, key)], false).await {
                    tracing::debug!(error = %convoy_core::error::chain(&e), "replayed, but the wake-up failed; the owner finds the entry at its next poll");
                }
                ReplayedHead::Done {
                    entry_id: reply.text(0),
                    audit_id: reply.text(1),
                    moved: reply.int(2).max(0) as u64,
                }
            }
            "missing" => ReplayedHead::Missing,
            "changed" => ReplayedHead::Changed {
                head: reply.text(0),
            },
            "generation_moved" => ReplayedHead::GenerationMoved {
                generation: reply.text(0).parse().map_err(|_| reply.unexpected())?,
            },
            "empty" => ReplayedHead::Refused("holds no event fields".into()),
            "wrong_key" => ReplayedHead::Refused(format!("is an event of key {:?}", reply.text(0))),
            "wrong_group" => ReplayedHead::Refused(format!(
                "was dead-lettered by handler {:?}: replay it at the head for that handler (--handler)",
                reply.text(0)
            )),
            "other_lane" => ReplayedHead::Refused(format!(
                "came from {:?}, not the partition's primary lane: replay it at the tail",
                reply.text(0)
            )),
            "read_elsewhere" => ReplayedHead::Refused(format!(
                "cannot go to the head: handler {:?} already read the events it would go before (they would reach it twice); replay it at the tail",
                reply.text(0)
            )),
            "running" => ReplayedHead::Refused(format!(
                "cannot go to the head: the partition has event {} in flight and is not halted on it; pass --force to fence its owner out first",
                reply.text(0)
            )),
            _ => return Err(reply.unexpected()),
        })
    }
}
