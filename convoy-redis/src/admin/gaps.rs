//! The gaps `on_poison = "dead_letter"` recorded: listing them, and an
//! operator acknowledging one (audited) once it was reconciled.

use super::{Admin, AdminError, PartitionStatus};
use convoy_core::envelope::now_ms;
use convoy_core::names;

impl Admin {
    /// The partitions of `category` (of `key` only, when given) with a gap
    /// recorded, for every handler: the skipped entry, message id, reason,
    /// time and dead letter id ([`PartitionStatus::gap`]).
    pub async fn gaps(
        &self,
        category: &str,
        key: Option<&str>,
    ) -> Result<Vec<PartitionStatus>, AdminError> {
        let report = self.partitions(category).await?;
        Ok(report
            .partitions
            .into_iter()
            .filter(|p| p.gap.is_some() && key.is_none_or(|k| p.key == k))
            .collect())
    }

    /// Acknowledges the gap recorded for `key` of `category` under `group`
    /// (the operator reconciled it): the record is cleared, the dead letter
    /// stays, and an audit record (`gap_ack`, with the skipped entry) is
    /// written. Returns the entry of the gap cleared; `None` when no gap was
    /// recorded.
    pub async fn ack_gap(
        &self,
        category: &str,
        key: &str,
        group: &str,
        operator: &str,
    ) -> Result<Option<String>, AdminError> {
        super::check_category(category)?;
        let scope = self.scope(group, category).await?;
        let shards = self.shards(category).await?;
        let unit = self.unit(group, &scope, category, key, shards);
        let mut c = self.conn.clone();
        let entry: Option<String> = redis::cmd("HGET")
            .arg(&*unit.state)
            .arg("gap_entry")
            .query_async(&mut c)
            .await
            .map_err(|e| convoy_core::error::Error::redis("reading the gap record", e))?;
        let Some(entry) = entry else {
            return Ok(None);
        };
        let time = now_ms().to_string();
        let _: () = redis::pipe()
            .cmd("HDEL")
            .arg(&*unit.state)
            .arg(&[
                "gap_entry",
                "gap_message",
                "gap_reason",
                "gap_time",
                "gap_dlq",
            ])
            .ignore()
            .cmd("XADD")
            .arg(names::audit(unit.shard))
            .arg("*")
            .arg(&[
                ("op", "gap_ack"),
                ("category", category),
                ("key", key),
                ("group", group),
                ("entry", entry.as_str()),
                ("operator", operator),
                ("time", time.as_str()),
                ("forced", "0"),
            ])
            .ignore()
            .query_async(&mut c)
            .await
            .map_err(|e| convoy_core::error::Error::redis("clearing the gap record", e))?;
        Ok(Some(entry))
    }
}
