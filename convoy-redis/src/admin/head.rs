//! Skipping a halted unit's head, moving it to the key's dead letter
//! stream, or retrying it in place (one script, `head_action.lua`, atomic
//! against the owner).

use serde::Serialize;

use super::{Admin, AdminError, Lane};
use crate::scripts::head_action::{HeadActed, HeadAction};
use convoy_core::envelope::now_ms;
use convoy_core::names;

/// Skip, dead-letter or retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadOp {
    /// Acknowledge the head without running it.
    Skip,
    /// Copy the head to `{s}{category}:{key}:dlq`, then acknowledge it.
    DeadLetter,
    /// Clear the halt and the head's failure count: its owner runs the
    /// same head again, in place, so the key's order is kept (after the
    /// bug that halted it is fixed).
    Retry,
}

impl HeadOp {
    /// `skip`, `dead_letter` or `retry` (as in the audit stream).
    pub fn as_str(self) -> &'static str {
        match self {
            HeadOp::Skip => "skip",
            HeadOp::DeadLetter => "dead_letter",
            HeadOp::Retry => "retry",
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
    /// Act only if the unit's durable generation is still this one (the
    /// one the operator looked at): another owner or another operator's
    /// action since makes the confirmation stale. Checked in the action's
    /// script, atomically with the action.
    pub expect_generation: Option<u64>,
}

impl<'a> HeadRequest<'a> {
    /// An action on whatever the head is now (no `expect_entry`).
    pub fn new(
        category: &'a str,
        key: &'a str,
        group: &'a str,
        force: bool,
        operator: &'a str,
    ) -> Self {
        HeadRequest {
            category,
            key,
            group,
            force,
            operator,
            expect_entry: None,
            expect_generation: None,
        }
    }
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
    /// The dead letter's id in `{s}{category}:{key}:dlq`.
    pub dlq_id: Option<String>,
    /// The audit record's id (in the shard's `{s}convoy:audit`).
    pub audit_id: String,
}

impl Admin {
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
        let req = HeadRequest::new(category, key, group, force, operator);
        self.act_on_head(HeadOp::Skip, &req).await
    }

    /// Moves the unit's head to `{s}{category}:{key}:dlq` (with `dlq_group`,
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
        let req = HeadRequest::new(category, key, group, force, operator);
        self.act_on_head(HeadOp::DeadLetter, &req).await
    }

    /// Runs the unit's halted head again, in place: clears the halt and
    /// the head's failure count, acknowledging nothing, so the owner
    /// resumes with that same head (attempt 1) and the key's order is
    /// kept. For after the bug that halted it is fixed (a skip or a dead
    /// letter would lose or move the event). The same checks as
    /// [`Admin::skip`]; with `force` on a running partition the owner is
    /// fenced out and the next owner runs the head again.
    pub async fn retry(
        &self,
        category: &str,
        key: &str,
        group: &str,
        force: bool,
        operator: &str,
    ) -> Result<HeadOutcome, AdminError> {
        let req = HeadRequest::new(category, key, group, force, operator);
        self.act_on_head(HeadOp::Retry, &req).await
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
            expect_generation,
        } = *req;
        super::check_category(category)?;
        let scope = self.scope(group, category).await?;
        let shards = self.shards(category).await?;
        let unit = self.unit(group, &scope, category, key, shards);
        let mut c = self.conn.clone();
        let acted = HeadAction {
            unit: &unit,
            op: op.as_str(),
            force,
            operator,
            expect_entry,
            expect_generation,
            now_ms: now_ms(),
        }
        .run(&mut c)
        .await
        .map_err(|e| AdminError::from_script(op.as_str(), e))?;
        let primary = || names::partition_stream(unit.shard, category, key);
        let (category, key, group) = (category.to_owned(), key.to_owned(), group.to_owned());
        match acted {
            HeadActed::Done {
                head,
                backfill,
                forced,
                fenced,
                deleted,
                audit_id,
                was_pending,
                dlq_id,
            } => Ok(HeadOutcome {
                op,
                entry_id: head,
                lane: if backfill {
                    Lane::Backfill
                } else {
                    Lane::Primary
                },
                stream: if backfill {
                    names::backfill_stream(unit.shard, &category, &key, &self.backfill_suffix)
                } else {
                    primary()
                },
                was_pending,
                forced,
                fenced,
                deleted,
                dlq_id: (op == HeadOp::DeadLetter).then(|| dlq_id.unwrap_or_default()),
                audit_id,
            }),
            HeadActed::Unhalted { audit_id } => Ok(HeadOutcome {
                op,
                entry_id: String::new(),
                lane: Lane::Primary,
                stream: primary(),
                was_pending: false,
                forced: false,
                fenced: None,
                deleted: false,
                dlq_id: None,
                audit_id,
            }),
            HeadActed::NotAStream { stream, kind } => Err(AdminError::NotAStream {
                category,
                key,
                stream,
                kind,
            }),
            HeadActed::Empty => Err(AdminError::NothingToDo {
                category,
                key,
                group,
            }),
            HeadActed::Changed { head } => Err(AdminError::HeadChanged {
                category,
                key,
                group,
                expected: expect_entry.unwrap_or_default().to_owned(),
                head,
            }),
            HeadActed::GenerationMoved { generation } => Err(AdminError::GenerationMoved {
                category,
                key,
                group,
                expected: expect_generation.unwrap_or_default(),
                generation,
            }),
            HeadActed::NotHalted => Err(AdminError::NotHalted {
                category,
                key,
                group,
            }),
            HeadActed::HeadMoved { head, halt_entry } => Err(AdminError::HeadMoved {
                category,
                key,
                group,
                halt_entry,
                head,
            }),
            HeadActed::Deleted { head } => Err(AdminError::EntryDeleted {
                category,
                key,
                entry: head,
            }),
        }
    }
}
