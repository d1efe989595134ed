//! Telling when Redis lost writes convoy had made. Redis replicates
//! asynchronously: a master that fails over to a replica (or restarts)
//! without its last writes loses them, and with `wait_replicas = 0` that
//! can be published events or acknowledgements. The shard counters convoy
//! keeps (`{s}convoy:published:{category}`, `{s}convoy:acked:{group}:
//! {category}`) only ever grow, so a value below one seen before is a
//! loss, and its size is the difference. Two observers compare:
//!
//! - the publisher, at each publish into a shard, with the value its last
//!   publish there left ([`PublishMarks`]): it knows the outbox seqs it
//!   wrote last, so it names them;
//! - every engine, at each heartbeat, with the last reading (see the
//!   partitioned consumer's `Counts`): it sees losses of publishes made by
//!   any process, and of acknowledgements.
//!
//! Each loss is an ERROR naming the category, the shard and the range, and
//! `convoy_replication_lost_total{category, shard, what, seen_by}`: every
//! observer counts what it saw, so read the metric as the largest over
//! `seen_by`.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::broker::Publication;

/// How many of its last outbox seqs the publisher keeps per shard and
/// category, to name lost events.
const RECENT: usize = 1024;

/// The publisher's marks: per shard and category, the count its last
/// publish left and the seqs it wrote last.
#[derive(Debug, Default)]
pub(crate) struct PublishMarks {
    shards: Mutex<HashMap<u32, HashMap<String, Mark>>>,
}

#[derive(Debug, Default)]
struct Mark {
    count: i64,
    recent: VecDeque<u64>,
}

impl PublishMarks {
    /// After a publish into `shard`: `counts` are the script's (count key,
    /// value after, added), `records` the shard's records of the batch, of
    /// which the last `written` were new (a re-sent batch's first ones
    /// were published before). Reports a count found below the last one
    /// seen.
    pub(crate) fn published(
        &self,
        shard: u32,
        counts: &[(String, i64, i64)],
        records: &[&Publication],
        written: u64,
    ) {
        let mut all = self
            .shards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let marks = all.entry(shard).or_default();
        for (key, after, added) in counts {
            let Some((_, category)) = key.split_once("convoy:published:") else {
                continue;
            };
            let before = after - added;
            let mark = match marks.get_mut(category) {
                Some(m) => m,
                None => marks.entry(category.to_owned()).or_default(),
            };
            if before < mark.count {
                let lost = (mark.count - before) as u64;
                let known = mark.recent.len().min(lost as usize);
                let gone: Vec<u64> = mark.recent.drain(mark.recent.len() - known..).collect();
                let seqs = match (gone.first(), gone.last()) {
                    (Some(first), Some(last)) if known as u64 == lost => {
                        format!("this publisher's outbox seqs {first}..={last} among them")
                    }
                    (Some(first), Some(last)) => format!(
                        "this publisher's outbox seqs {first}..={last} among them, and {} more it no longer knows",
                        lost - known as u64
                    ),
                    _ => "none of them known to this publisher".to_owned(),
                };
                reported(
                    category,
                    shard,
                    "published",
                    lost,
                    "publisher",
                    &format!(
                        "Redis lost published events: shard {shard} of {category} counted {} publishes and now counts {before}, so the last {lost} events published there ({seqs}) are gone (its master failed over to a replica, or restarted, without them) and will never be handled; set [broker] wait_replicas = 1 to wait for a replica on every publish",
                        mark.count
                    ),
                );
            }
            mark.count = *after;
        }
        let new = records.len().saturating_sub(written as usize);
        for p in records[new..].iter().filter(|p| p.partition.is_some()) {
            if let Some(mark) = marks.get_mut(p.envelope.category.as_str()) {
                if mark.recent.len() == RECENT {
                    mark.recent.pop_front();
                }
                mark.recent.push_back(p.seq);
            }
        }
    }
}

/// Reports a loss: the ERROR `message`, and the metric.
pub(crate) fn reported(
    category: &str,
    shard: u32,
    what: &'static str,
    lost: u64,
    seen_by: &str,
    message: &str,
) {
    crate::metrics::replication_lost(category, shard, what, seen_by, lost);
    tracing::error!(category, shard, lost, what, seen_by, "{message}");
}
