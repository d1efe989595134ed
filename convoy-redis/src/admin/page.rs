//! Bounded reads for a page an operator keeps open (`convoy serve`): the
//! registered categories and their counters, the live instances of a
//! handler, one page of a category's partition keys by `SSCAN` cursor,
//! the status of a given set of keys and when their oldest pending entry
//! was published, a key's latest entries and the latest dead letters.
//! Each costs a number of Redis commands fixed by its arguments (the shard
//! count, the page size), never by the number of partitions.

use std::fmt;
use std::str::FromStr;

use redis::Value;
use serde::Serialize;

use super::super::connection::{query_by_slot, read_by_slot};
use super::super::layout::recorded_key_field;
use super::{Admin, AdminError, DeadLetter, Lane, PartitionStatus};
use crate::reply::{entries, int, text};
use convoy_core::envelope::Envelope;
use convoy_core::error::Error;
use convoy_core::names;

/// Where a walk over a category's partition indexes stands: a shard, the
/// `SSCAN` cursor in that shard's index, and how many keys of that call's
/// reply an earlier page already showed (a page never holds more keys
/// than asked: the rest of a reply is read again, and skipped, by the
/// next page). Written `shard.cursor` or `shard.cursor.skip` (`0.0` is the
/// start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ScanCursor {
    /// The shard whose index is read next.
    pub shard: u32,
    /// The `SSCAN` cursor in it (`0`: from its start).
    pub cursor: u64,
    /// Keys of the reply at this cursor shown already.
    pub skip: usize,
}

impl fmt::Display for ScanCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.shard, self.cursor)?;
        if self.skip > 0 {
            write!(f, ".{}", self.skip)?;
        }
        Ok(())
    }
}

impl FromStr for ScanCursor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not a cursor (shard.cursor or shard.cursor.skip)");
        let mut parts = s.split('.');
        let (Some(shard), Some(cursor), skip, None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(ScanCursor {
            shard: shard.parse().map_err(|_| bad())?,
            cursor: cursor.parse().map_err(|_| bad())?,
            skip: match skip {
                Some(n) => n.parse().map_err(|_| bad())?,
                None => 0,
            },
        })
    }
}

/// One page of partition keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyPage {
    /// The keys found, in index order (a key may show on two pages when
    /// the index is rehashed meanwhile, as `SSCAN` allows).
    pub keys: Vec<String>,
    /// Where the next page starts; `None` once every shard was read.
    pub next: Option<ScanCursor>,
    /// `SSCAN` calls made.
    pub calls: usize,
}

/// A category's registration and counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CategorySummary {
    /// The category.
    pub category: String,
    /// Its recorded shard count (the default when none is recorded).
    pub shards: u32,
    /// Its recorded partition key field.
    pub key_field: Option<String>,
    /// Live partition keys (`SCARD` of every shard's index).
    pub partitions: u64,
    /// Per registered handler (sorted): its lag, the sum over shards of
    /// events published minus events it finished (what `convoy_lag`
    /// shows).
    pub lag: Vec<(String, i64)>,
}

/// An engine instance running a handler.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instance {
    /// The instance id.
    pub id: String,
    /// The handler (consumer group).
    pub group: String,
    /// When its registration runs out unless renewed (ms since the Unix
    /// epoch); renewed every heartbeat.
    pub expires_ms: u64,
    /// Whether it is alive now (the registration has not run out).
    pub alive: bool,
    /// Its incarnation, as its liveness key in the first shard that has
    /// one holds it.
    pub incarnation: Option<String>,
}

/// One entry of a partition, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecentEntry {
    /// The stream entry id.
    pub entry_id: String,
    /// The lane it is in.
    pub lane: Lane,
    /// The envelope, when the entry is one.
    pub envelope: Option<Envelope>,
    /// Why the entry could not be decoded.
    pub decode_error: Option<String>,
}

/// Escapes `*`, `?`, `[`, `]` and `\` for an `SSCAN MATCH` pattern.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Admin {
    /// The shard count Redis records for `category` (the default when
    /// none is recorded yet).
    pub async fn shard_count(&self, category: &str) -> Result<u32, AdminError> {
        super::check_category(category)?;
        self.shards(category).await
    }

    /// The categories engines registered (`convoy:categories`), sorted.
    pub async fn categories(&self) -> Result<Vec<String>, AdminError> {
        let mut c = self.conn.clone();
        let mut v: Vec<String> = redis::cmd("SMEMBERS")
            .arg(names::CATEGORIES)
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the registered categories", e))?;
        v.sort();
        Ok(v)
    }

    /// A category's shard count, key field, partition count and lag per
    /// handler: `3 × shards × handlers` commands at most, one pipeline per
    /// hash slot.
    pub async fn category_summary(&self, category: &str) -> Result<CategorySummary, AdminError> {
        super::check_category(category)?;
        let shards = self.shards(category).await?;
        let groups = self.groups(category).await?;
        let mut cmds = Vec::new();
        for s in 0..shards {
            let index = names::partition_index(s, category);
            let mut cmd = redis::cmd("SCARD");
            cmd.arg(&index);
            cmds.push((index, cmd));
            let published = names::published(s, category);
            let mut cmd = redis::cmd("GET");
            cmd.arg(&published);
            cmds.push((published, cmd));
            for g in &groups {
                let acked = names::acked(s, g, category);
                let mut cmd = redis::cmd("GET");
                cmd.arg(&acked);
                cmds.push((acked, cmd));
            }
        }
        let mut c = self.conn.clone();
        let replies = read_by_slot(&mut c, cmds)
            .await
            .map_err(|e| Error::redis(format!("failed to read {category}'s counters"), e))?;
        let mut partitions = 0u64;
        let mut published = 0i64;
        let mut acked = vec![0i64; groups.len()];
        let mut it = replies.iter();
        for _ in 0..shards {
            partitions += it.next().and_then(int).unwrap_or(0).max(0) as u64;
            published += it.next().and_then(int).unwrap_or(0);
            for a in acked.iter_mut() {
                *a += it.next().and_then(int).unwrap_or(0);
            }
        }
        let key_field = recorded_key_field(&mut c, category).await?;
        Ok(CategorySummary {
            category: category.to_owned(),
            shards,
            key_field,
            partitions,
            lag: groups
                .into_iter()
                .zip(acked)
                .map(|(g, a)| (g, published - a))
                .collect(),
        })
    }

    /// The instances registered for `group` (`convoy:instances:{group}`,
    /// one entry per instance), with whether each is alive and its
    /// incarnation (from its liveness keys in the first `shards` shards).
    pub async fn instances(&self, group: &str, shards: u32) -> Result<Vec<Instance>, AdminError> {
        let mut c = self.conn.clone();
        let set = names::instances(group);
        let v: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&set)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis(format!("failed to read {set}"), e))?;
        let now = convoy_core::envelope::now_ms();
        let mut out = Vec::with_capacity(v.len());
        for (id, score) in v {
            let cmds = (0..shards)
                .map(|s| {
                    let key = names::alive(s, group, &id);
                    let mut cmd = redis::cmd("GET");
                    cmd.arg(&key);
                    (key, cmd)
                })
                .collect();
            let found = query_by_slot(&mut c, cmds)
                .await
                .map_err(|e| Error::redis("failed to read an instance's liveness", e))?;
            let expires_ms = score.max(0.0) as u64;
            out.push(Instance {
                incarnation: found.iter().find_map(text),
                id,
                group: group.to_owned(),
                expires_ms,
                alive: expires_ms > now,
            });
        }
        Ok(out)
    }

    /// Up to about `want` partition keys of `category` starting with
    /// `prefix` (every key without), from `from` on: `SSCAN ... MATCH
    /// prefix* COUNT count` shard by shard, at most `max_calls` calls. A
    /// page may hold fewer keys than asked (or none) and still have a
    /// next cursor: the calls ran out before enough keys matched.
    pub async fn partition_keys_page(
        &self,
        category: &str,
        from: ScanCursor,
        prefix: &str,
        want: usize,
        count: usize,
        max_calls: usize,
    ) -> Result<KeyPage, AdminError> {
        super::check_category(category)?;
        let shards = self.shards(category).await?;
        let pattern = format!("{}*", glob_escape(prefix));
        let mut c = self.conn.clone();
        let mut at = from;
        let mut keys = Vec::new();
        let mut calls = 0;
        while at.shard < shards && keys.len() < want && calls < max_calls.max(1) {
            calls += 1;
            let index = names::partition_index(at.shard, category);
            let mut cmd = redis::cmd("SSCAN");
            cmd.arg(&index).arg(at.cursor);
            if !prefix.is_empty() {
                cmd.arg("MATCH").arg(&pattern);
            }
            cmd.arg("COUNT").arg(count.max(1));
            let mut page = query_by_slot(&mut c, vec![(index.clone(), cmd)])
                .await
                .map_err(|e| Error::redis("failed to read the partition index", e))?;
            let page = page.pop().unwrap_or(Value::Nil);
            let (cursor, members) =
                scan_reply(&page).ok_or_else(|| AdminError::UnexpectedReply {
                    what: format!("SSCAN {index}"),
                    reply: format!("{page:?}"),
                })?;
            let fresh = members.len().saturating_sub(at.skip);
            let room = want - keys.len();
            if fresh > room {
                // The page is full within this reply: the next page reads
                // the same call again and skips what this one showed.
                keys.extend(members.into_iter().skip(at.skip).take(room));
                at.skip += room;
                break;
            }
            keys.extend(members.into_iter().skip(at.skip));
            at = if cursor == 0 {
                ScanCursor {
                    shard: at.shard + 1,
                    cursor: 0,
                    skip: 0,
                }
            } else {
                ScanCursor {
                    shard: at.shard,
                    cursor,
                    skip: 0,
                }
            };
        }
        Ok(KeyPage {
            keys,
            next: (at.shard < shards).then_some(at),
            calls,
        })
    }

    /// The status of `keys` of `category` for every registered handler,
    /// as [`Admin::partitions`] reads it (rows sorted by key, then
    /// handler): one pipeline per few hundred keys (per hash slot on a
    /// cluster), plus one for the owners' liveness.
    pub async fn partition_statuses(
        &self,
        category: &str,
        keys: &[String],
    ) -> Result<Vec<PartitionStatus>, AdminError> {
        super::check_category(category)?;
        let shards = self.shards(category).await?;
        let groups = self.groups(category).await?;
        let scopes = self.scopes(&groups, category).await?;
        let mut keys = keys.to_vec();
        keys.sort();
        keys.dedup();
        let mut rows = Vec::with_capacity(keys.len() * groups.len());
        for chunk in keys.chunks(super::partitions::CHUNK) {
            rows.extend(
                self.status_rows(category, shards, chunk, &groups, &scopes)
                    .await?,
            );
        }
        Ok(rows)
    }
}

impl Admin {
    /// The latest `count` entries of each lane of `key`'s partition,
    /// newest first (primary lane, then backfill): two `XREVRANGE`s.
    pub async fn recent_entries(
        &self,
        category: &str,
        key: &str,
        count: usize,
    ) -> Result<Vec<RecentEntry>, AdminError> {
        super::check_category(category)?;
        let shard = names::shard_of(key, self.shards(category).await?);
        let lanes = [
            (Lane::Primary, names::partition_stream(shard, category, key)),
            (
                Lane::Backfill,
                names::backfill_stream(shard, category, key, &self.backfill_suffix),
            ),
        ];
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (_, stream) in &lanes {
            pipe.cmd("XREVRANGE")
                .arg(stream)
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(count);
        }
        let mut c = self.conn.clone();
        let v: Vec<Value> = pipe
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis("failed to read the partition's entries", e))?;
        let mut out = Vec::new();
        for ((lane, stream), reply) in lanes.iter().zip(v) {
            for e in entries(reply) {
                let (envelope, decode_error) = match e.envelope(stream) {
                    Ok(env) => (Some(env), None),
                    Err(err) => (None, Some(err.to_string())),
                };
                out.push(RecentEntry {
                    entry_id: e.id,
                    lane: *lane,
                    envelope,
                    decode_error,
                });
            }
        }
        Ok(out)
    }

    /// The latest `count` dead letters of `key` (the key's
    /// `{s}{category}:{key}:dlq`) or of the category's ordinary handlers
    /// (`{s}{category}:dlq`) without one, newest first: one `XREVRANGE`
    /// (where [`Admin::dlq`] reads the whole stream).
    pub async fn latest_dead_letters(
        &self,
        category: &str,
        key: Option<&str>,
        count: usize,
    ) -> Result<Vec<DeadLetter>, AdminError> {
        let stream = self.dlq_stream(category, key).await?;
        let mut c = self.conn.clone();
        let v: Value = redis::cmd("XREVRANGE")
            .arg(&stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(count)
            .query_async(&mut c)
            .await
            .map_err(|e| Error::redis(format!("failed to read {stream}"), e))?;
        Ok(entries(v)
            .iter()
            .map(|e| super::dlq::dead_letter(&stream, e))
            .collect())
    }

    /// When the oldest entry pending for each unit `(key, group)` of
    /// `category` was published (ms since the Unix epoch, from its entry
    /// id), `None` when nothing is pending: one `XPENDING - + 1` per lane
    /// and unit, one pipeline per hash slot.
    pub async fn oldest_pending(
        &self,
        category: &str,
        units: &[(String, String)],
    ) -> Result<Vec<Option<u64>>, AdminError> {
        super::check_category(category)?;
        if units.is_empty() {
            return Ok(Vec::new());
        }
        let shards = self.shards(category).await?;
        let mut cmds = Vec::with_capacity(2 * units.len());
        for (key, group) in units {
            let shard = names::shard_of(key, shards);
            let primary = names::partition_stream(shard, category, key);
            let backfill = names::backfill_stream(shard, category, key, &self.backfill_suffix);
            for s in [&primary, &backfill] {
                let mut cmd = redis::cmd("XPENDING");
                cmd.arg(s).arg(group).arg("-").arg("+").arg(1);
                cmds.push((primary.clone(), cmd));
            }
        }
        let mut c = self.conn.clone();
        let v = read_by_slot(&mut c, cmds)
            .await
            .map_err(|e| Error::redis("failed to read pending entries", e))?;
        Ok(v.chunks(2)
            .map(|lanes| lanes.iter().filter_map(first_pending_ms).min())
            .collect())
    }
}

/// The time in the id of the first entry of an `XPENDING - + 1` reply.
fn first_pending_ms(v: &Value) -> Option<u64> {
    let Value::Array(items) = v else {
        return None;
    };
    let Value::Array(p) = items.first()? else {
        return None;
    };
    let id = text(p.first()?)?;
    id.split_once('-')?.0.parse().ok()
}

/// An `SSCAN` reply: the next cursor and the page's members.
fn scan_reply(v: &Value) -> Option<(u64, Vec<String>)> {
    let Value::Array(parts) = v else {
        return None;
    };
    let [cursor, Value::Array(members)] = parts.as_slice() else {
        return None;
    };
    let cursor = text(cursor)?.parse().ok()?;
    Some((cursor, members.iter().filter_map(text).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_patterns_are_escaped() {
        let c = ScanCursor {
            shard: 3,
            cursor: 917,
            skip: 0,
        };
        assert_eq!(c.to_string(), "3.917");
        assert_eq!("3.917".parse::<ScanCursor>(), Ok(c));
        let mid = ScanCursor { skip: 50, ..c };
        assert_eq!(mid.to_string(), "3.917.50");
        assert_eq!("3.917.50".parse::<ScanCursor>(), Ok(mid));
        assert!("3.917.50.1".parse::<ScanCursor>().is_err());
        assert!("3".parse::<ScanCursor>().is_err());
        assert!("x.1".parse::<ScanCursor>().is_err());
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
