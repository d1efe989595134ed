//! The audit streams: who did what. An action on a partition is recorded in
//! its shard's `{s}convoy:audit` (in the action's script), an outbox action
//! in [`AUDIT_STREAM`]; [`Admin::audit`] merges them.

use std::collections::BTreeMap;

use redis::Value;
use serde::Serialize;

use super::{Admin, AdminError};
use crate::connection::query_by_slot;
use crate::reply::{entries, int};
use convoy_core::error::Error;
use convoy_core::names::{self, AUDIT_STREAM};

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// Its id in its stream.
    pub id: String,
    /// The audit stream it is in: a shard's `{s}convoy:audit`, or
    /// [`AUDIT_STREAM`].
    pub stream: String,
    /// Every field (`op`, `category`, `key`, `group`, `entry`, `operator`,
    /// `time`, `forced`, ...).
    pub fields: BTreeMap<String, String>,
}

impl AuditRecord {
    /// When the action was done (its `time` field, else its id's time), and
    /// its id's sequence: the order of records across streams.
    fn order(&self) -> (u64, u64, u64) {
        let (ms, seq) = self.id.split_once('-').unwrap_or((&self.id, "0"));
        let (ms, seq) = (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0));
        let time = self
            .fields
            .get("time")
            .and_then(|t| t.parse().ok())
            .unwrap_or(ms);
        (time, ms, seq)
    }
}

/// Records [`Admin::key_audit`] reads per call.
const KEY_AUDIT_CHUNK: usize = 500;

/// What [`Admin::key_audit`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyAudit {
    /// The key's records, newest first.
    pub records: Vec<AuditRecord>,
    /// How many records of the key's shard's audit stream were read.
    pub searched: usize,
    /// Whether the whole stream was read (else older records of the key
    /// may exist beyond the `searched` newest).
    pub complete: bool,
}

impl AuditRecord {
    fn from_entry(stream: &str, e: crate::reply::Entry) -> AuditRecord {
        AuditRecord {
            id: e.id,
            stream: stream.to_owned(),
            fields: e
                .fields
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect(),
        }
    }
}

impl Admin {
    /// The latest `count` audit records of one partition key: its shard's
    /// audit stream (where every action on the key's units is recorded)
    /// read backwards, 500 records a call, at most `search`
    /// records in all, keeping those of `category` and `key`. Bounded work
    /// however long the stream.
    pub async fn key_audit(
        &self,
        category: &str,
        key: &str,
        count: usize,
        search: usize,
    ) -> Result<KeyAudit, AdminError> {
        super::check_category(category)?;
        let shards = self.shards(category).await?;
        let stream = names::audit(names::shard_of(key, shards));
        let mut c = self.conn.clone();
        let mut out = KeyAudit {
            records: Vec::new(),
            searched: 0,
            complete: false,
        };
        let mut end = "+".to_owned();
        while out.records.len() < count && out.searched < search {
            let chunk = KEY_AUDIT_CHUNK.min(search - out.searched);
            let v: Value = redis::cmd("XREVRANGE")
                .arg(&stream)
                .arg(&end)
                .arg("-")
                .arg("COUNT")
                .arg(chunk)
                .query_async(&mut c)
                .await
                .map_err(|e| Error::redis(format!("failed to read {stream}"), e))?;
            let got = entries(v);
            let n = got.len();
            out.searched += n;
            if let Some(last) = got.last() {
                end = format!("({}", last.id);
            }
            out.records.extend(
                got.into_iter()
                    .map(|e| AuditRecord::from_entry(&stream, e))
                    .filter(|r| {
                        r.fields.get("category").map(String::as_str) == Some(category)
                            && r.fields.get("key").map(String::as_str) == Some(key)
                    }),
            );
            if n < chunk {
                out.complete = true;
                break;
            }
        }
        out.records.truncate(count);
        Ok(out)
    }

    /// The latest `count` audit records of every audit stream, oldest
    /// first (ordered by their `time`). The shards' streams read are those
    /// of the largest shard count recorded for a category an engine
    /// registered (`convoy:categories`), and at least the default's.
    pub async fn audit(&self, count: usize) -> Result<Vec<AuditRecord>, AdminError> {
        let shards = self.most_shards().await?;
        let cmds = std::iter::once(AUDIT_STREAM.to_owned())
            .chain((0..shards).map(names::audit))
            .map(|stream| {
                let mut cmd = redis::cmd("XREVRANGE");
                cmd.arg(&stream).arg("+").arg("-").arg("COUNT").arg(count);
                (stream, cmd)
            })
            .collect::<Vec<_>>();
        let streams: Vec<String> = cmds.iter().map(|(s, _)| s.clone()).collect();
        let mut c = self.conn.clone();
        let replies = query_by_slot(&mut c, cmds)
            .await
            .map_err(|e| Error::redis("failed to read the audit streams", e))?;
        let mut out: Vec<AuditRecord> = streams
            .iter()
            .zip(replies)
            .flat_map(|(stream, v)| {
                entries(v)
                    .into_iter()
                    .map(move |e| AuditRecord::from_entry(stream, e))
            })
            .collect();
        out.sort_by_key(|r| std::cmp::Reverse(r.order()));
        out.truncate(count);
        out.reverse();
        Ok(out)
    }

    /// The largest shard count recorded for a category in
    /// `convoy:categories`, and at least the default.
    async fn most_shards(&self) -> Result<u32, AdminError> {
        let mut c = self.conn.clone();
        let categories: Vec<String> = redis::cmd("SMEMBERS")
            .arg(names::CATEGORIES)
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the registered categories", e))?;
        if categories.is_empty() {
            return Ok(names::DEFAULT_SHARDS);
        }
        let cmds = categories
            .iter()
            .map(|category| {
                let key = names::shards(category);
                let mut cmd = redis::cmd("GET");
                cmd.arg(&key);
                (key, cmd)
            })
            .collect();
        let counts: Vec<Value> = query_by_slot(&mut c, cmds)
            .await
            .map_err(|e| Error::redis("failed to read the categories' shard counts", e))?;
        Ok(counts
            .iter()
            .filter_map(int)
            .filter_map(|n| u32::try_from(n).ok())
            .fold(names::DEFAULT_SHARDS, u32::max)
            .min(names::MAX_SHARDS))
    }
}
