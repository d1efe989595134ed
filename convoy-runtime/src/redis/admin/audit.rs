//! The audit stream: who did what.

use std::collections::BTreeMap;

use redis::Value;
use serde::Serialize;

use super::{Admin, AdminError};
use crate::error::Error;
use crate::names::AUDIT_STREAM;
use crate::redis::reply::entries;

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditRecord {
    /// Its id in [`AUDIT_STREAM`].
    pub id: String,
    /// Every field (`op`, `category`, `key`, `group`, `entry`, `operator`,
    /// `time`, `forced`, ...).
    pub fields: BTreeMap<String, String>,
}

impl Admin {
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
