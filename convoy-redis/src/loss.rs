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
use std::time::{Duration, Instant};

use super::routing::Routed;
use crate::tracing;

/// How many of its last outbox seqs the publisher keeps per shard and
/// category, to name lost events.
const RECENT: usize = 1024;

/// How long after its last publish into a shard the publisher keeps
/// looking at the shard's count while it publishes nothing there: a loss
/// of its last events (the master killed just after them) shows only at
/// the next publish otherwise, and there may be none. A replica has
/// usually received a write within milliseconds; after this the engines'
/// heartbeats still see later losses of counts they read.
const RECHECK_FOR: Duration = Duration::from_secs(10);

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
    /// When this publisher last published into the shard (rechecked until
    /// [`RECHECK_FOR`] after).
    last_publish: Option<Instant>,
}

impl Mark {
    /// The shard's count was `now` (before this publisher's records, if it
    /// is publishing) and is `after` them: a `now` below the mark is a
    /// loss, reported with the seqs this publisher wrote last. The mark
    /// becomes `after`.
    fn saw(&mut self, shard: u32, category: &str, now: i64, after: i64) {
        if now < self.count {
            let lost = (self.count - now) as u64;
            let known = self.recent.len().min(lost as usize);
            let gone: Vec<u64> = self.recent.drain(self.recent.len() - known..).collect();
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
                    "Redis lost published events: shard {shard} of {category} counted {} publishes and now counts {now}, so the last {lost} events published there ({seqs}) are gone from Redis (its master failed over to a replica, or restarted, without them): those not handled before will never be; set [broker] wait_replicas = 1 to wait for a replica on every publish",
                    self.count
                ),
            );
        }
        self.count = after;
    }
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
        records: &[Routed<'_>],
        written: u64,
    ) {
        let mut all = self
            .shards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let marks = all.entry(shard).or_default();
        let now = Instant::now();
        for (key, after, added) in counts {
            let Some((_, category)) = key.split_once("convoy:published:") else {
                continue;
            };
            let mark = match marks.get_mut(category) {
                Some(m) => m,
                None => marks.entry(category.to_owned()).or_default(),
            };
            mark.saw(shard, category, after - added, *after);
            mark.last_publish = Some(now);
        }
        let new = records.len().saturating_sub(written as usize);
        // A category's mark is looked up once per run of its records (a
        // shard's records are mostly of one category).
        let runs = records[new..]
            .chunk_by(|a, b| a.publication.envelope.category == b.publication.envelope.category);
        for run in runs {
            let Some(mark) = marks.get_mut(run[0].publication.envelope.category.as_str()) else {
                continue;
            };
            for r in run.iter().filter(|r| r.partition.is_some()) {
                if mark.recent.len() == RECENT {
                    mark.recent.pop_front();
                }
                mark.recent.push_back(r.publication.seq);
            }
        }
    }

    /// The (shard, category) counts to look at again while nothing is
    /// published there: those published into within [`RECHECK_FOR`].
    pub(crate) fn to_recheck(&self) -> Vec<(u32, String)> {
        let all = self
            .shards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut out: Vec<(u32, String)> = all
            .iter()
            .flat_map(|(shard, marks)| {
                marks
                    .iter()
                    .filter(|(_, m)| m.last_publish.is_some_and(|t| t.elapsed() < RECHECK_FOR))
                    .map(|(category, _)| (*shard, category.clone()))
            })
            .collect();
        out.sort();
        out
    }

    /// A recheck read `count` for `shard`'s `category` (`None`: the key is
    /// gone, a count of 0). Reports a count below the mark. A mark that
    /// moved since the recheck was read (a publish meanwhile) is left to
    /// that publish.
    pub(crate) fn rechecked(
        &self,
        shard: u32,
        category: &str,
        count: Option<i64>,
        read_at: Instant,
    ) {
        let mut all = self
            .shards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(mark) = all.get_mut(&shard).and_then(|m| m.get_mut(category)) else {
            return;
        };
        if mark.last_publish.is_some_and(|t| t > read_at) {
            return;
        }
        let now = count.unwrap_or(0);
        mark.saw(shard, category, now, now);
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
    convoy_core::metrics::replication_lost(category, shard, what, seen_by, lost);
    tracing::error!(category, shard, lost, what, seen_by, "{message}");
}
