//! Dead letters: listing them, and replaying one into its partition, at
//! its tail (`replay.lua`) or at its head for one handler
//! (`replay_head.lua`), to the handler that dead-lettered it unless others
//! are named.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Admin, AdminError};
use crate::reply::Entry;
use crate::scripts::replay::{Replay, ReplayHead, Replayed, ReplayedHead};
use convoy_core::envelope::{Envelope, now_ms};
use convoy_core::names;

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
    /// The audit record's id (in the shard's `{s}convoy:audit`).
    pub audit_id: String,
    /// The handlers (consumer groups) that run the replayed event; every
    /// other handler of the category acknowledges it unread.
    pub handlers: Vec<String>,
}

impl Admin {
    /// Dead letters of a category: `{s}{category}:{key}:dlq` (moved by an
    /// operator) with a key, else `{s}{category}:dlq` (ordinary
    /// handlers'), oldest first (see [`Admin::dlq_stream`]).
    pub async fn dlq(
        &self,
        category: &str,
        key: Option<&str>,
    ) -> Result<Vec<DeadLetter>, AdminError> {
        let stream = self.dlq_stream(category, key).await?;
        let found = self.range(&stream, "-", "+", None).await?;
        Ok(found.iter().map(|e| dead_letter(&stream, e)).collect())
    }

    /// Puts a dead letter of `{s}{category}:{key}:dlq` back at the tail of
    /// the partition's primary lane, **for the handler that dead-lettered
    /// it** (its `dlq_group`) alone: the other handlers of the category,
    /// which handled the event already, acknowledge the copy without running
    /// it. The copy is the original envelope, message id and origin
    /// included, without the `dlq_*` fields, as a new entry after
    /// everything already there; the key is recorded in the index and the
    /// dead letter deleted, in one script; then the owners are woken.
    /// Audited, naming the handler it reaches.
    pub async fn replay(
        &self,
        category: &str,
        key: &str,
        dlq_id: &str,
        operator: &str,
    ) -> Result<ReplayOutcome, AdminError> {
        self.replay_to(category, key, dlq_id, &[], operator).await
    }

    /// [`replay`](Self::replay) to the handlers named in `handlers`
    /// (consumer groups registered for the category; empty: the one that
    /// dead-lettered it). Replaying to a handler that already applied the
    /// event runs it there again: only a handler whose effects are
    /// exactly-once by the event's origin (`AppliedEvents`) recognises it.
    pub async fn replay_to(
        &self,
        category: &str,
        key: &str,
        dlq_id: &str,
        handlers: &[String],
        operator: &str,
    ) -> Result<ReplayOutcome, AdminError> {
        super::check_category(category)?;
        let shard = names::shard_of(key, self.shards(category).await?);
        let mut c = self.conn.clone();
        let replayed = Replay {
            category,
            key,
            shard,
            dlq_id,
            operator,
            to: handlers,
            now_ms: now_ms(),
        }
        .run(&mut c)
        .await
        .map_err(|e| AdminError::from_script("replay", e))?;
        let stream = names::partition_dlq(shard, category, key);
        let not = |problem: String| AdminError::NotReplayable {
            category: category.to_owned(),
            key: key.to_owned(),
            stream: stream.clone(),
            id: dlq_id.to_owned(),
            problem,
        };
        match replayed {
            Replayed::Done {
                entry_id,
                audit_id,
                to,
            } => Ok(ReplayOutcome {
                dlq_id: dlq_id.to_owned(),
                entry_id,
                stream: names::partition_stream(shard, category, key),
                audit_id,
                handlers: to,
            }),
            Replayed::Missing => Err(AdminError::NoSuchDeadLetter {
                category: category.to_owned(),
                key: key.to_owned(),
                stream: stream.clone(),
                id: dlq_id.to_owned(),
            }),
            Replayed::Empty => Err(not("holds no event fields".to_owned())),
            Replayed::WrongKey { key: other } => Err(not(format!("is an event of key {other:?}"))),
            Replayed::NoGroup => Err(not(
                "names no handler (dlq_group): name the handlers to replay it to".to_owned(),
            )),
            Replayed::UnknownGroup { group } => Err(not(format!(
                "cannot go to handler {group:?}: no such handler is registered for the category"
            ))),
        }
    }
}

/// A replay of a dead letter at the head of its partition (see
/// [`Admin::replay_head`]).
#[derive(Debug, Clone, Copy)]
pub struct HeadReplay<'a> {
    /// The category.
    pub category: &'a str,
    /// The partition key.
    pub key: &'a str,
    /// The dead letter's id in the key's dead letter stream.
    pub dlq_id: &'a str,
    /// The handler (consumer group) whose head it goes to; `None`: the one
    /// that dead-lettered it (its `dlq_group`).
    pub group: Option<&'a str>,
    /// Who did it (recorded in the audit stream).
    pub operator: &'a str,
    /// Go ahead on a partition with an event in flight (not halted on it),
    /// fencing its owner out first.
    pub force: bool,
    /// Act only if the handler's first unfinished entry of the partition
    /// (the one the letter goes before) is still this one; `Some("")`:
    /// only if there is none. What the operator looked at and confirmed.
    pub expect_head: Option<&'a str>,
    /// Act only if the unit's durable generation is still this one.
    pub expect_generation: Option<u64>,
}

impl Admin {
    /// Puts dead letter `dlq_id` back at the **head** of its partition for
    /// `group` (the handler that dead-lettered it when `None`): before every
    /// event that handler has not finished, so the key's order is restored
    /// after a mistaken dead-letter (a replay at the tail goes after them).
    /// Refused, changing nothing, when another handler of the category
    /// already read those events, or when the partition has an event in
    /// flight and is not halted on it (without `force`, which fences the
    /// owner out first). Audited; a gap recorded for this dead letter is
    /// cleared.
    pub async fn replay_at_head(
        &self,
        category: &str,
        key: &str,
        dlq_id: &str,
        group: Option<&str>,
        operator: &str,
        force: bool,
    ) -> Result<ReplayOutcome, AdminError> {
        self.replay_head(&HeadReplay {
            category,
            key,
            dlq_id,
            group,
            operator,
            force,
            expect_head: None,
            expect_generation: None,
        })
        .await
    }

    /// [`replay_at_head`](Self::replay_at_head), also fenced on what the
    /// operator confirmed ([`HeadReplay::expect_head`],
    /// [`HeadReplay::expect_generation`]), checked in the replay's script,
    /// atomically with it.
    pub async fn replay_head(&self, req: &HeadReplay<'_>) -> Result<ReplayOutcome, AdminError> {
        let (category, key, dlq_id, operator) = (req.category, req.key, req.dlq_id, req.operator);
        super::check_category(category)?;
        let shards = self.shards(category).await?;
        let shard = names::shard_of(key, shards);
        let stream = names::partition_dlq(shard, category, key);
        let missing = || AdminError::NoSuchDeadLetter {
            category: category.to_owned(),
            key: key.to_owned(),
            stream: stream.clone(),
            id: dlq_id.to_owned(),
        };
        let group = match req.group {
            Some(g) => g.to_owned(),
            None => self
                .dlq(category, Some(key))
                .await?
                .into_iter()
                .find(|l| l.dlq_id == dlq_id)
                .ok_or_else(missing)?
                .group
                .ok_or_else(|| AdminError::NotReplayable {
                    category: category.to_owned(),
                    key: key.to_owned(),
                    stream: stream.clone(),
                    id: dlq_id.to_owned(),
                    problem: "names no handler (dlq_group): pass --handler".to_owned(),
                })?,
        };
        let scope = self.scope(&group, category).await?;
        let unit = self.unit(&group, &scope, category, key, shards);
        let mut c = self.conn.clone();
        let replayed = ReplayHead {
            unit: &unit,
            category,
            dlq_id,
            operator,
            force: req.force,
            expect_head: req.expect_head,
            expect_generation: req.expect_generation,
            now_ms: now_ms(),
        }
        .run(&mut c)
        .await
        .map_err(|e| AdminError::from_script("replay", e))?;
        match replayed {
            ReplayedHead::Done {
                entry_id, audit_id, ..
            } => Ok(ReplayOutcome {
                dlq_id: dlq_id.to_owned(),
                entry_id,
                stream: names::partition_stream(shard, category, key),
                audit_id,
                handlers: vec![group],
            }),
            ReplayedHead::Missing => Err(missing()),
            ReplayedHead::Changed { head } => Err(AdminError::HeadChanged {
                category: category.to_owned(),
                key: key.to_owned(),
                group,
                expected: req.expect_head.unwrap_or_default().to_owned(),
                head,
            }),
            ReplayedHead::GenerationMoved { generation } => Err(AdminError::GenerationMoved {
                category: category.to_owned(),
                key: key.to_owned(),
                group,
                expected: req.expect_generation.unwrap_or_default(),
                generation,
            }),
            ReplayedHead::Refused(problem) => Err(AdminError::NotReplayable {
                category: category.to_owned(),
                key: key.to_owned(),
                stream: stream.clone(),
                id: dlq_id.to_owned(),
                problem,
            }),
        }
    }
}

pub(super) fn dead_letter(stream: &str, e: &Entry) -> DeadLetter {
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
