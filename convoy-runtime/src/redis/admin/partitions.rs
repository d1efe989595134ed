//! The partitions report: every unit of a category, with totals.

use std::collections::HashSet;

use redis::Value;
use serde::Serialize;

use super::status::{PartitionStatus, group_infos, lane_counts, ok_int, status, string_map};
use super::{Admin, AdminError};
use crate::error::Error;
use crate::names;

/// Keys per pipeline when listing partitions.
const CHUNK: usize = 200;

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
    /// Lag (entries not finished, see [`PartitionStatus::lag`]) over all
    /// units whose lag is known; per group, what `convoy_lag` shows.
    pub lag: u64,
    /// Units whose lag Redis could not tell.
    pub lag_unknown: usize,
    /// Entries waiting behind halted heads, over all halted units.
    pub behind_halts: u64,
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

impl Admin {
    /// Every live partition of `category` (the index) for every registered
    /// group: lease, lengths, pending, lag, halt; and totals. A few
    /// pipelined round trips, whatever the number of partitions.
    pub async fn partitions(&self, category: &str) -> Result<CategoryReport, AdminError> {
        super::check_category(category)?;
        let mut c = self.conn.clone();
        let (mut keys_, mut groups): (Vec<String>, Vec<String>) = redis::pipe()
            .cmd("SMEMBERS")
            .arg(names::partition_index(category))
            .cmd("SMEMBERS")
            .arg(names::groups(category))
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
        let mut counted_len = HashSet::new();
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
            totals.behind_halts += r.behind_halt.unwrap_or(0);
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
            let primary = names::partition_stream(category, k);
            let backfill = names::backfill_stream(category, k, &self.backfill_suffix);
            pipe.cmd("XLEN").arg(&primary);
            pipe.cmd("XLEN").arg(&backfill);
            pipe.cmd("XINFO").arg("GROUPS").arg(&primary);
            pipe.cmd("XINFO").arg("GROUPS").arg(&backfill);
            for (g, scope) in groups.iter().zip(&scopes) {
                let unit = self.unit(g, scope, category, k);
                pipe.cmd("GET").arg(&unit.lease);
                pipe.cmd("HGETALL").arg(&unit.state);
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
                let undelivered = match (lag_p, lag_b) {
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
                    undelivered,
                ));
            }
        }
        self.liveness(category, &mut rows, &incarnations).await?;
        Ok(rows)
    }
}
