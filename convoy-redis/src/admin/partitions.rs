//! The partitions report: every unit of a category, with totals.

use std::collections::HashSet;

use redis::Value;
use serde::Serialize;

use super::super::connection::read_by_slot;
use super::super::layout::recorded_key_field;
use super::status::{PartitionStatus, group_infos, ok_int, status, string_map};
use super::{Admin, AdminError};
use crate::connection::query_by_slot;
use crate::reply::text;
use convoy_core::error::Error;
use convoy_core::names;

/// Keys per pipeline when listing partitions.
pub(super) const CHUNK: usize = 200;

/// Members asked for per `SSCAN` of a shard's partition index.
const SCAN_COUNT: usize = 1000;

/// Sums over one category's units.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Live partition keys (the index, over every shard).
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
    /// The shard count Redis records for the category (the default when
    /// none is recorded yet).
    pub shards: u32,
    /// The partition key field Redis records for the category (`None`:
    /// none recorded, so no process used it partitioned yet).
    pub key_field: Option<String>,
    /// The registered consumer groups (handlers), sorted.
    pub groups: Vec<String>,
    /// One row per key and group, sorted by key then group.
    pub partitions: Vec<PartitionStatus>,
    /// Sums.
    pub totals: Totals,
}

impl Admin {
    /// Every live partition of `category` (the index of every shard) for
    /// every registered group: lease, lengths, pending, lag, halt; and
    /// totals. The index is read with `SSCAN`, every shard at once, and the
    /// status in pipelines of a few hundred keys (one per hash slot on a
    /// cluster): a few round trips per thousand partitions.
    pub async fn partitions(&self, category: &str) -> Result<CategoryReport, AdminError> {
        super::check_category(category)?;
        let shards = self.shards(category).await?;
        let groups = self.groups(category).await?;
        if groups.is_empty()
            && let err @ AdminError::UnknownCategory { .. } = self.no_handlers(category).await
        {
            return Err(err);
        }
        let keys_ = self.partition_keys(category, shards).await?;
        let scopes = self.scopes(&groups, category).await?;
        let mut rows = Vec::with_capacity(keys_.len() * groups.len());
        for chunk in keys_.chunks(CHUNK) {
            rows.extend(
                self.status_rows(category, shards, chunk, &groups, &scopes)
                    .await?,
            );
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
        let mut c = self.conn.clone();
        let key_field = recorded_key_field(&mut c, category).await?;
        Ok(CategoryReport {
            category: category.to_owned(),
            shards,
            key_field,
            groups,
            partitions: rows,
            totals,
        })
    }

    /// The live partition keys of `category` over its `shards` shards,
    /// sorted: `SSCAN` of each shard's index, one page of every shard per
    /// round trip (never `SMEMBERS`: an index can hold millions of keys).
    async fn partition_keys(&self, category: &str, shards: u32) -> Result<Vec<String>, AdminError> {
        let mut c = self.conn.clone();
        let mut keys_ = Vec::new();
        // (index, cursor) of every shard not scanned to the end yet.
        let mut scans: Vec<(String, String)> = (0..shards)
            .map(|s| (names::partition_index(s, category), "0".to_owned()))
            .collect();
        while !scans.is_empty() {
            let cmds = scans
                .iter()
                .map(|(index, cursor)| {
                    let mut cmd = redis::cmd("SSCAN");
                    cmd.arg(index).arg(cursor).arg("COUNT").arg(SCAN_COUNT);
                    (index.clone(), cmd)
                })
                .collect();
            let pages = query_by_slot(&mut c, cmds)
                .await
                .map_err(|e| Error::redis("failed to read the partition index", e))?;
            let mut more = Vec::new();
            for ((index, _), page) in scans.into_iter().zip(pages) {
                let (cursor, members) =
                    scan_page(&page).ok_or_else(|| AdminError::UnexpectedReply {
                        what: format!("SSCAN {index}"),
                        reply: format!("{page:?}"),
                    })?;
                keys_.extend(members);
                if cursor != "0" {
                    more.push((index, cursor));
                }
            }
            scans = more;
        }
        // SSCAN may return a member more than once.
        keys_.sort();
        keys_.dedup();
        Ok(keys_)
    }

    /// Per key both lanes' length and group info, per unit the lease and
    /// the state hash: one pipeline (per hash slot on a cluster).
    pub(super) async fn status_rows(
        &self,
        category: &str,
        shards: u32,
        keys_: &[String],
        groups: &[String],
        scopes: &[String],
    ) -> Result<Vec<PartitionStatus>, AdminError> {
        let mut cmds = Vec::with_capacity(keys_.len() * (4 + 2 * groups.len()));
        let mut shard_of = Vec::with_capacity(keys_.len());
        for k in keys_ {
            let shard = names::shard_of(k, shards);
            shard_of.push(shard);
            let primary = names::partition_stream(shard, category, k);
            let backfill = names::backfill_stream(shard, category, k, &self.backfill_suffix);
            // Every key of the partition is in its shard: they all route by
            // the primary stream's name.
            let mut add = |name: &str, args: &[&str]| {
                let mut cmd = redis::cmd(name);
                for a in args {
                    cmd.arg(*a);
                }
                cmds.push((primary.clone(), cmd));
            };
            add("XLEN", &[&primary]);
            add("XLEN", &[&backfill]);
            add("XINFO", &["GROUPS", &primary]);
            add("XINFO", &["GROUPS", &backfill]);
            for (g, scope) in groups.iter().zip(scopes) {
                let unit = self.unit(g, scope, category, k, shards);
                add("GET", &[&unit.lease]);
                add("HGETALL", &[&unit.state]);
            }
        }
        let values = read_by_slot(&mut self.conn.clone(), cmds)
            .await
            .map_err(|e| Error::redis("failed to read partition status", e))?;
        let mut it = values.into_iter();
        let mut next = || it.next().unwrap_or(Value::Nil);
        let mut rows = Vec::new();
        let mut incarnations = Vec::new();
        for (k, shard) in keys_.iter().zip(shard_of) {
            let len_p = ok_int(&next()).max(0) as u64;
            let len_b = ok_int(&next()).max(0) as u64;
            let info_p = group_infos(&next());
            let info_b = group_infos(&next());
            for g in groups {
                let lease = next();
                let unit = string_map(&next());
                incarnations.push(unit.get("inc").cloned());
                rows.push(status(
                    k,
                    shard,
                    g,
                    &lease,
                    &unit,
                    [(len_p, &info_p), (len_b, &info_b)],
                ));
            }
        }
        self.liveness(category, &mut rows, &incarnations).await?;
        let pauses = crate::pause::read(&mut self.conn.clone(), category)
            .await
            .map_err(|e| Error::redis("reading the pauses", e))?;
        if !pauses.is_empty() {
            for r in &mut rows {
                r.key_pause = pauses.iter().find(|p| p.holds(&r.group, &r.key)).cloned();
            }
        }
        Ok(rows)
    }
}

/// An `SSCAN` reply: the next cursor and the page's members.
fn scan_page(v: &Value) -> Option<(String, Vec<String>)> {
    let Value::Array(parts) = v else {
        return None;
    };
    let [cursor, Value::Array(members)] = parts.as_slice() else {
        return None;
    };
    Some((text(cursor)?, members.iter().filter_map(text).collect()))
}
