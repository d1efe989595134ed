//! Retrying or discarding an abandoned outbox record, recorded in the audit
//! stream like every other operator action.
//!
//! The outbox is not in Redis (a `PgOutbox` is a PostgreSQL table), so the
//! change and its audit record cannot be one atomic step: the change is
//! made first, then the record appended; if that append fails the error
//! says the change was made ([`AdminError::NotAudited`]). Redis is reached
//! when the [`Admin`] connects, before anything is changed.

use serde::Serialize;

use super::{Admin, AdminError};
use convoy_core::envelope::now_ms;
use convoy_core::error::Error;
use convoy_core::names::AUDIT_STREAM;
use convoy_core::outbox::{OutboxRecord, OutboxStatus, OutboxStore};

/// Retry or discard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboxOp {
    /// Make the abandoned record pending again: the relay publishes it
    /// (after the records of its key published while it was abandoned), or
    /// abandons it again if its key is still invalid.
    Retry,
    /// Delete the abandoned record: it is never published.
    Discard,
}

impl OutboxOp {
    /// `outbox_retry` or `outbox_discard` (as in the audit stream).
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxOp::Retry => "outbox_retry",
            OutboxOp::Discard => "outbox_discard",
        }
    }
}

/// What an outbox action did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutboxOutcome {
    /// Retry or discard.
    pub op: OutboxOp,
    /// The outbox's name (a `PgOutbox`'s qualified table).
    pub outbox: String,
    /// The record's sequence number (a `PgOutbox` row's id).
    pub id: u64,
    /// Why it had been abandoned.
    pub reason: String,
    /// The audit record's id.
    pub audit_id: String,
}

/// An abandoned record and its reason, or why the record is not one an
/// operator can act on.
fn abandoned(
    outbox: &str,
    seq: u64,
    found: Option<OutboxRecord>,
) -> Result<(OutboxRecord, String), AdminError> {
    let state = match found {
        Some(record) => match &record.status {
            OutboxStatus::Abandoned { reason } => {
                let reason = reason.clone();
                return Ok((record, reason));
            }
            OutboxStatus::Pending => "it is pending: the relay publishes it",
            OutboxStatus::Published => "it was published",
        },
        None => "there is no such row (published and deleted, discarded, or never written)",
    };
    Err(AdminError::NotAbandoned {
        outbox: outbox.to_owned(),
        id: seq,
        state: state.to_owned(),
    })
}

impl Admin {
    /// Retries or discards the abandoned record `seq` of `store` (named
    /// `outbox` in messages and the audit record), then appends an audit
    /// record: `op` (`outbox_retry`, `outbox_discard`), `category`, `key`,
    /// `group` (empty), `entry` (the record's id), `operator`, `time`,
    /// `forced` (`0`), `stream` (empty), `outbox`, `message_id`, `type`,
    /// `reason`, `attempts`.
    ///
    /// Refuses ([`AdminError::NotAbandoned`]) a record that is not
    /// abandoned, also when another operator acted on it first.
    pub async fn outbox_action(
        &self,
        op: OutboxOp,
        store: &dyn OutboxStore,
        outbox: &str,
        seq: u64,
        operator: &str,
    ) -> Result<OutboxOutcome, AdminError> {
        let (record, reason) = abandoned(outbox, seq, store.record(seq).await?)?;
        let done = match op {
            OutboxOp::Retry => store.retry(seq).await?,
            OutboxOp::Discard => store.discard(seq).await?,
        };
        if !done {
            // Acted on (or published) between the look and the change.
            abandoned(outbox, seq, store.record(seq).await?)?;
            return Err(AdminError::NotAbandoned {
                outbox: outbox.to_owned(),
                id: seq,
                state: "another operator acted on it first".to_owned(),
            });
        }
        let e = &record.envelope;
        let fields: [(&str, String); 14] = [
            ("op", op.as_str().to_owned()),
            ("category", e.category.clone()),
            ("key", e.partition_key.clone().unwrap_or_default()),
            ("group", String::new()),
            ("entry", seq.to_string()),
            ("operator", operator.to_owned()),
            ("time", now_ms().to_string()),
            ("forced", "0".to_owned()),
            ("stream", String::new()),
            ("outbox", outbox.to_owned()),
            ("message_id", e.id.clone()),
            ("type", e.type_name.clone()),
            ("reason", reason.clone()),
            ("attempts", record.attempts.to_string()),
        ];
        let mut cmd = redis::cmd("XADD");
        cmd.arg(AUDIT_STREAM).arg("*");
        for (k, v) in &fields {
            cmd.arg(*k).arg(v);
        }
        let mut c = self.conn.clone();
        let audit_id: String =
            cmd.query_async(&mut c)
                .await
                .map_err(|source| AdminError::NotAudited {
                    done: format!(
                        "outbox row {seq} of {outbox} was {}",
                        match op {
                            OutboxOp::Retry => "made pending again",
                            OutboxOp::Discard => "discarded",
                        }
                    ),
                    source: Error::redis("failed to append to the audit stream", source),
                })?;
        Ok(OutboxOutcome {
            op,
            outbox: outbox.to_owned(),
            id: seq,
            reason,
            audit_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_abandoned_record_can_be_acted_on() {
        let record = |status| OutboxRecord {
            seq: 7,
            envelope: std::sync::Arc::new(convoy_core::envelope::Envelope {
                id: "m".into(),
                type_name: "T".into(),
                category: "c".into(),
                partition_key: Some("k".into()),
                time_ms: 0,
                priority: convoy_core::envelope::Priority::Normal,
                correlation_id: None,
                payload: "{}".into(),
                origin: None,
                replay: None,
            }),
            status,
            attempts: 0,
        };
        let ok = record(OutboxStatus::Abandoned {
            reason: "bad key".into(),
        });
        let (r, reason) = abandoned("t", 7, Some(ok)).expect("abandoned");
        assert_eq!((r.seq, reason.as_str()), (7, "bad key"));
        for (found, says) in [
            (Some(record(OutboxStatus::Pending)), "pending"),
            (Some(record(OutboxStatus::Published)), "published"),
            (None, "no such row"),
        ] {
            let e = abandoned("t", 7, found).expect_err("refused");
            assert!(e.is_refusal(), "{e}");
            assert!(e.to_string().contains(says), "{e}");
            assert!(e.to_string().contains("convoy outbox"), "{e}");
        }
    }
}
