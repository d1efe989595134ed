//! `head_action.lua`: an operator's skip, dead-letter or retry of a unit's head,
//! atomic against the owner.

use super::{Invocation, SCRIPTS, Status, call};
use crate::connection::Conn;
use crate::tracing;
use crate::unit::Unit;
use crate::wake;
use convoy_core::error::Error;
use convoy_core::names;

/// Skips (`op = "skip"`), dead-letters (`op = "dead_letter"`) or retries in place (`op = "retry"`) the head
/// of the unit's single category for its group.
#[derive(Debug)]
pub(crate) struct HeadAction<'a> {
    pub(crate) unit: &'a Unit,
    /// `skip`, `dead_letter` or `retry`.
    pub(crate) op: &'a str,
    /// Act on a unit that is not halted on its head, fencing its owner out.
    pub(crate) force: bool,
    pub(crate) operator: &'a str,
    /// Act only if the head is still this entry.
    pub(crate) expect_entry: Option<&'a str>,
    /// Act only if the unit's durable generation is still this one.
    pub(crate) expect_generation: Option<u64>,
    /// Now, in ms since the Unix epoch.
    pub(crate) now_ms: u64,
}

/// What [`HeadAction`] did, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeadActed {
    /// Done.
    Done {
        head: String,
        /// The backfill lane (else the primary one).
        backfill: bool,
        forced: bool,
        /// The lease token fenced out.
        fenced: Option<String>,
        /// The entry was deleted from the stream.
        deleted: bool,
        audit_id: String,
        was_pending: bool,
        dlq_id: Option<String>,
    },
    /// The unit was halted because a lane's key held another type, fixed
    /// since: the halt is cleared, nothing skipped.
    Unhalted { audit_id: String },
    /// Nothing to act on.
    Empty,
    /// The head is not the expected entry.
    Changed { head: String },
    /// The unit's durable generation is not the expected one.
    GenerationMoved { generation: u64 },
    /// A running unit, without force.
    NotHalted,
    /// Halted on another entry than the head, without force.
    HeadMoved { head: String, halt_entry: String },
    /// Dead-letter of a head whose entry was deleted.
    Deleted { head: String },
    /// A lane's key holds another type.
    NotAStream { stream: String, kind: String },
}

impl HeadAction<'_> {
    pub(crate) async fn run(&self, conn: &mut Conn) -> Result<HeadActed, Error> {
        let u = self.unit;
        let Some(lane) = u.lanes.first() else {
            return Err(Error::UnexpectedReply {
                script: "head_action",
                reply: "(not called: the unit has no category)".to_owned(),
            });
        };
        let mut inv = Invocation::new(&SCRIPTS.head_action);
        inv.key(&u.state)
            .key(&u.lease)
            .key(&lane.primary)
            .key(&lane.backfill_always)
            .key(&lane.groups)
            .key(names::audit(u.shard))
            .key(names::partition_dlq(u.shard, &lane.category, &u.key))
            .key(&lane.acked);
        inv.arg(&u.group)
            .arg(if self.force { "1" } else { "0" })
            .arg(self.operator)
            .arg(self.now_ms)
            .arg(&lane.category)
            .arg(&u.key)
            .arg(self.expect_entry.unwrap_or(""))
            .arg(self.op)
            .arg(
                self.expect_generation
                    .map(|g| g.to_string())
                    .unwrap_or_default(),
            );
        let doing = format!("{} script failed", self.op);
        let reply = call("head_action", &inv, conn, &doing).await?;
        let Status::Word(status) = &reply.status else {
            return Err(reply.unexpected());
        };
        if matches!(status.as_str(), "ok" | "unhalted") {
            // A halted owner waits for a wake-up (or its next poll).
            if let Err(e) =
                wake::hint(conn, [(lane.category.as_str(), u.key.as_str())], false).await
            {
                tracing::debug!(error = %convoy_core::error::chain(&e), "the head action is done, but the wake-up failed; the owner sees it at its next poll");
            }
        }
        let at = |i| reply.text(i);
        Ok(match status.as_str() {
            "ok" => {
                let fenced = at(3);
                HeadActed::Done {
                    head: at(0),
                    backfill: at(1) == "2",
                    forced: at(2) == "1",
                    fenced: (!fenced.is_empty()).then_some(fenced),
                    deleted: at(4) == "1",
                    audit_id: at(5),
                    was_pending: at(6) == "1",
                    dlq_id: reply.value(7).map(|_| at(7)),
                }
            }
            "unhalted" => HeadActed::Unhalted { audit_id: at(0) },
            "empty" => HeadActed::Empty,
            "changed" => HeadActed::Changed { head: at(0) },
            "generation_moved" => HeadActed::GenerationMoved {
                generation: at(0).parse().map_err(|_| reply.unexpected())?,
            },
            "not_halted" => HeadActed::NotHalted,
            "head_moved" => HeadActed::HeadMoved {
                head: at(0),
                halt_entry: at(1),
            },
            "deleted" => HeadActed::Deleted { head: at(0) },
            "not_a_stream" => HeadActed::NotAStream {
                stream: at(0),
                kind: at(1),
            },
            _ => return Err(reply.unexpected()),
        })
    }
}
